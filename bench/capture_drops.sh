#!/usr/bin/env bash
# Capture under a packet flood: `lagtrace capture -w` vs `tcpdump -w`, alternately, on the
# same veth into a namespace this script creates (traffic never leaves the machine).
# Same snaplen (262144), same kernel buffer (16 MiB), both in libpcap's block mode (the
# default of each; compare immediate mode with LAGTRACE_ARGS=--immediate
# TCPDUMP_ARGS="--immediate-mode -s 262144"). Each round
# floods UDP with hping3 for FLOOD_S seconds, then stops the capture with SIGINT and reads
# the tcpdump-style counters both print. Needs root. Usage: bench/capture_drops.sh [ROUNDS]
set -euo pipefail
ROUNDS=${1:-3}
FLOOD_S=${FLOOD_S:-3}
BIN=${LAGTRACE:-target/release/lagtrace}
[ -x "$BIN" ] || { echo "build first: cargo build --release -p lagtrace" >&2; exit 2; }
NS=lagtrace-capbench-$$
H=lcbh$$; N=lcbn$$
H=${H:0:15}; N=${N:0:15}
OUT=$(mktemp -d)
cleanup() {
  ip link del "$H" 2>/dev/null || true
  ip netns del "$NS" 2>/dev/null || true
  rm -rf "$OUT"
}
trap cleanup EXIT
ip netns add "$NS"
ip link add "$H" type veth peer name "$N" netns "$NS"
ip addr add 10.231.$(( $$ % 250 )).1/30 dev "$H"; ip link set "$H" up
ip -n "$NS" addr add 10.231.$(( $$ % 250 )).2/30 dev "$N"; ip -n "$NS" link set "$N" up
DST=10.231.$(( $$ % 250 )).2
sleep 0.3

# Prints "captured received dropped" of one capture tool over one flood.
round() {
  local tool=$1 err=$OUT/err pid
  case $tool in
    lagtrace) "$BIN" capture -i "$H" -B 16 ${LAGTRACE_ARGS:-} -w "$OUT/f" udp 2>"$err" & pid=$! ;;
    tcpdump) tcpdump -i "$H" -B 16384 ${TCPDUMP_ARGS:--s 262144} -w "$OUT/f" udp 2>"$err" & pid=$! ;;
  esac
  sleep 0.5
  timeout "$FLOOD_S" hping3 --flood --udp -p 9 -d 18 "$DST" >/dev/null 2>&1 || true
  sleep 0.3
  kill -INT "$pid"; wait "$pid" || true
  local c r d
  c=$(awk '/packets captured/{print $1}' "$err")
  r=$(awk '/packets received by filter/{print $1}' "$err")
  d=$(awk '/packets dropped by kernel/{print $1}' "$err")
  echo "$c $r $d"
}

echo "lagtrace args: -B 16 ${LAGTRACE_ARGS:-}; tcpdump args: -B 16384 ${TCPDUMP_ARGS:--s 262144}"
echo "lost-at-stop = received - captured - dropped (in the kernel ring when the tool stopped)"
printf '%-8s %5s %10s %10s %10s %8s %12s\n' tool round captured received dropped drop% lost-at-stop
declare -A C R D
for i in $(seq 1 "$ROUNDS"); do
  for tool in lagtrace tcpdump; do
    read -r c r d < <(round "$tool")
    C[$tool]=$(( ${C[$tool]:-0} + c )); R[$tool]=$(( ${R[$tool]:-0} + r )); D[$tool]=$(( ${D[$tool]:-0} + d ))
    printf '%-8s %5d %10d %10d %10d %7.2f%% %12d\n' "$tool" "$i" "$c" "$r" "$d" \
      "$(echo "scale=4; 100*$d/($r+($r==0))" | bc)" $(( r - c - d ))
  done
done
echo "totals over $ROUNDS rounds of ${FLOOD_S}s floods:"
for tool in lagtrace tcpdump; do
  printf '%-8s captured %d, dropped %d (%.2f%% of received)\n' "$tool" "${C[$tool]}" "${D[$tool]}" \
    "$(echo "scale=4; 100*${D[$tool]}/(${R[$tool]}+(${R[$tool]}==0))" | bc)"
done
printf 'ratio lagtrace/tcpdump: captured %.3f\n' "$(echo "scale=4; ${C[lagtrace]}/(${C[tcpdump]}+(${C[tcpdump]}==0))" | bc)"
