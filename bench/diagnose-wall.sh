#!/usr/bin/env bash
# Wall time of a default `lagtrace diagnose` on the lab's reference case (target: <= 15 s),
# alternated in one run with the peer method it replaces: the case study's hand-run
# sequence (hping3 -S, wrk at c=1 and c=32 with tcpdump in the server's namespace, tshark,
# ss, grep of the config) with the same load budget. Prints both and the ratio.
# Needs root. Usage: bench/diagnose-wall.sh [ROUNDS]   (lagtrace built with --release)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${LAGTRACE:-target/release/lagtrace}
ROUNDS=${1:-3}
NAME=bdw$$
for t in wrk hping3 tcpdump tshark ss; do command -v $t >/dev/null || { echo "missing $t" >&2; exit 2; }; done
cleanup() { "$BIN" lab down --name "$NAME" >/dev/null 2>&1 || true; rm -rf "$TMP"; }
TMP=$(mktemp -d); trap cleanup EXIT INT TERM
"$BIN" lab up --name "$NAME" --json > "$TMP/lab.json"
read -r ADDR NS CONF < <(python3 -c '
import json,sys
d=json.load(open(sys.argv[1])); d=d.get("lab", d)
lat=[s for s in d["servers"] if s["role"]=="latency"][0]
print(d["server_addr"], d["netns"], lat.get("config") or "")' "$TMP/lab.json")
URL=http://$ADDR:8080/

now() { date +%s.%N; }
lagtrace_run() {
  "$BIN" diagnose "$URL" -q --json > "$TMP/d.json" || true
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["verdict"]["cause"])' "$TMP/d.json"
}
peer_run() {
  hping3 -S -p 8080 -c 5 -i u60000 "$ADDR" >/dev/null 2>&1 || true
  wrk -t1 -c1 -d2s --latency "$URL" >/dev/null
  ip netns exec "$NS" tcpdump -i any -s 256 -w "$TMP/p.pcap" tcp port 8080 >/dev/null 2>&1 &
  local dump=$!
  sleep 0.3
  wrk -t2 -c32 -d5s --latency "$URL" >/dev/null &
  local w=$!
  sleep 1.2; ip netns exec "$NS" ss -tinp state established "( sport = :8080 )" >/dev/null
  wait $w; kill -INT $dump; wait $dump 2>/dev/null || true
  tshark -r "$TMP/p.pcap" -q -z conv,tcp >/dev/null 2>&1
  tshark -r "$TMP/p.pcap" -Y 'tcp.analysis.ack_rtt > 0.03' -T fields -e frame.number 2>/dev/null | wc -l
  [ -n "$CONF" ] && grep -n tcp_nodelay "$CONF" >/dev/null
}

declare -a L P
for i in $(seq 1 "$ROUNDS"); do
  t0=$(now); v=$(lagtrace_run); t1=$(now)
  L+=("$(echo "$t1 - $t0" | bc)")
  t0=$(now); n=$(peer_run); t1=$(now)
  P+=("$(echo "$t1 - $t0" | bc)")
  printf 'round %d: lagtrace diagnose %.1f s (verdict %s) | peer method %.1f s (%s frames with ACK RTT > 30 ms, no verdict)\n' \
    "$i" "${L[-1]}" "$v" "${P[-1]}" "$n"
done
med() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
ml=$(med "${L[@]}"); mp=$(med "${P[@]}")
printf 'median wall time: lagtrace diagnose %.1f s, peer method %.1f s, ratio %.2f (target: diagnose <= 15 s)\n' \
  "$ml" "$mp" "$(echo "$ml / $mp" | bc -l)"
