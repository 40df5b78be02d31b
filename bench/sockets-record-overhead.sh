#!/usr/bin/env bash
# Overhead of `lagtrace sockets --record` on a load generator: wrk's requests/s alone, under
# --record, and under `strace -f -e trace=setsockopt`, run alternately against a local nginx
# (Debian's, our own config on loopback, stopped by a trap). Target: --record >= 95% of alone.
#
# usage: bench/sockets-record-overhead.sh [ROUNDS] [DURATION]   (as root; default 3 rounds, 5s)
set -euo pipefail
ROUNDS=${1:-3}
DUR=${2:-5s}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LAGTRACE=${LAGTRACE:-$ROOT/target/release/lagtrace}
[ -x "$LAGTRACE" ] || { echo "build first: cargo build --release -p lagtrace" >&2; exit 2; }
for t in nginx wrk strace; do command -v $t >/dev/null || { echo "missing $t" >&2; exit 2; }; done

DIR=$(mktemp -d /tmp/lt-bench-sockets.XXXXXX)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$DIR/logs"
cat > "$DIR/nginx.conf" <<CONF
worker_processes 1;
pid $DIR/nginx.pid;
error_log $DIR/logs/error.log;
events { worker_connections 1024; }
http {
    access_log off;
    server { listen 127.0.0.1:$PORT; root /var/www/html; index index.nginx-debian.html; }
}
CONF
cleanup() {
    if [ -f "$DIR/nginx.pid" ]; then kill "$(cat "$DIR/nginx.pid")" 2>/dev/null || true; sleep 0.3; fi
    rm -rf "$DIR"
}
trap cleanup EXIT INT TERM
nginx -c "$DIR/nginx.conf" -p "$DIR" -g 'daemon on;'
sleep 0.3
URL="http://127.0.0.1:$PORT/"
WRK=(wrk -t2 -c50 -d"$DUR" "$URL")

rps() { awk '/^Requests\/sec:/ {print $2}'; }
declare -a A R N S
for i in $(seq 1 "$ROUNDS"); do
    a=$("${WRK[@]}" | rps)
    r=$("$LAGTRACE" sockets --record -o "$DIR/trace.txt" -- "${WRK[@]}" 2>/dev/null | rps)
    n=$("$LAGTRACE" sockets --record --no-close -o /dev/null -- "${WRK[@]}" 2>/dev/null | rps)
    s=$(strace -f -qq -o /dev/null -e trace=setsockopt "${WRK[@]}" | rps)
    A+=("$a"); R+=("$r"); N+=("$n"); S+=("$s")
    printf 'round %d: wrk alone %8.0f req/s | --record %8.0f (%.3f) | --record --no-close %8.0f (%.3f) | strace -f %8.0f (%.3f)\n' \
        "$i" "$a" "$r" "$(echo "$r / $a" | bc -l)" "$n" "$(echo "$n / $a" | bc -l)" "$s" "$(echo "$s / $a" | bc -l)"
done
med() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
# Paired ratios (each run against the wrk-alone run of its own round) cancel the drift of a
# shared machine better than a ratio of medians; both are printed.
declare -a RR RN RS
for i in "${!A[@]}"; do
    RR+=("$(echo "${R[$i]} / ${A[$i]}" | bc -l)")
    RN+=("$(echo "${N[$i]} / ${A[$i]}" | bc -l)")
    RS+=("$(echo "${S[$i]} / ${A[$i]}" | bc -l)")
done
ma=$(med "${A[@]}"); mr=$(med "${R[@]}"); mn=$(med "${N[@]}"); ms=$(med "${S[@]}")
echo "calls recorded in the last --record run: $(wc -l < "$DIR/trace.txt"); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
printf 'medians: wrk alone %.0f req/s; --record %.0f; --record --no-close %.0f; strace -f -e trace=setsockopt %.0f\n' "$ma" "$mr" "$mn" "$ms"
printf 'median of paired ratios: --record %.1f%% of wrk alone (target >= 95%%); --record --no-close %.1f%%; strace %.1f%%\n' \
    "$(echo "100 * $(med "${RR[@]}")" | bc -l)" "$(echo "100 * $(med "${RN[@]}")" | bc -l)" "$(echo "100 * $(med "${RS[@]}")" | bc -l)"
