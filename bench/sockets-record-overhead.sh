#!/usr/bin/env bash
# Overhead of `lagtrace sockets --record` on a load generator: wrk's requests/s alone, under
# --record (BPF), under the ptrace fallback (--recorder ptrace) and under
# `strace -f -e trace=setsockopt`, run alternately against a local nginx (Debian's, our own
# config on loopback, stopped by a trap); ratio of medians, with the calls each --record run
# recorded. Target: --record >= 95% of alone with CONN_CLOSE=1, >= 98% keep-alive.
#
# usage: bench/sockets-record-overhead.sh [ROUNDS] [DURATION]   (as root; default 3 rounds, 5s)
# CONN_CLOSE=1 adds `-H "Connection: close"`: a new connection per request, so every request
# makes socket/setsockopt/connect/getsockopt/close calls — the recorder's worst case, where
# keep-alive wrk (the default) makes them only while it opens its connections.
# RECORDER=fentry|tracepoint|bpf passes `--recorder` to the --record runs (default: auto).
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
[ "${CONN_CLOSE:-0}" = 1 ] && WRK=(wrk -t2 -c50 -d"$DUR" -H "Connection: close" "$URL")
echo "load: ${WRK[*]}"

rps() { awk '/^Requests\/sec:/ {print $2}' "$1"; }
reqs() { awk '/requests in/ {print $1}' "$1"; }
ratio() { echo "$1 / $2" | bc -l; }
declare -a A R P S
for i in $(seq 1 "$ROUNDS"); do
    "${WRK[@]}" > "$DIR/a.out"
    "$LAGTRACE" sockets --record ${RECORDER:+--recorder "$RECORDER"} -o "$DIR/trace.txt" -- "${WRK[@]}" > "$DIR/r.out" 2> "$DIR/r.sum"
    "$LAGTRACE" sockets --record --recorder ptrace -o /dev/null -- "${WRK[@]}" > "$DIR/p.out" 2>/dev/null
    strace -f -qq -o /dev/null -e trace=setsockopt "${WRK[@]}" > "$DIR/s.out"
    a=$(rps "$DIR/a.out"); r=$(rps "$DIR/r.out"); p=$(rps "$DIR/p.out"); s=$(rps "$DIR/s.out")
    A+=("$a"); R+=("$r"); P+=("$p"); S+=("$s")
    # The recorded calls next to the ratio: a recorder that sampled would fall short of one
    # setsockopt(TCP_NODELAY) per wrk connection (= per request with CONN_CLOSE=1).
    mech=$(sed -n 's/^--- lagtrace sockets --record (\([a-z]*\)).*/\1/p' "$DIR/r.sum")
    hooks=$(sed -n 's/^  hooks: \([a-z]*\).*/\1/p' "$DIR/r.sum")
    [ -n "$hooks" ] && mech="$mech on $hooks"
    lost=$(sed -n 's/^  LOST: \([0-9]*\).*/\1/p' "$DIR/r.sum")
    printf 'round %d: wrk alone %8.0f req/s | --record (%s) %8.0f (%.3f; %d setsockopt, %d calls, %s lost, wrk made %d requests) | --recorder ptrace %8.0f (%.3f) | strace -f %8.0f (%.3f)\n' \
        "$i" "$a" "$mech" "$r" "$(ratio "$r" "$a")" "$(grep -c 'setsockopt(' "$DIR/trace.txt")" \
        "$(wc -l < "$DIR/trace.txt")" "${lost:-0}" "$(reqs "$DIR/r.out")" \
        "$p" "$(ratio "$p" "$a")" "$s" "$(ratio "$s" "$a")"
done
med() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
ma=$(med "${A[@]}"); mr=$(med "${R[@]}"); mp=$(med "${P[@]}"); ms=$(med "${S[@]}")
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs"
printf 'medians: wrk alone %.0f req/s; --record %.0f; --recorder ptrace %.0f; strace -f -e trace=setsockopt %.0f\n' "$ma" "$mr" "$mp" "$ms"
printf 'ratio of medians: --record %.1f%% of wrk alone (target: >= 95%% with CONN_CLOSE=1, >= 98%% keep-alive); --recorder ptrace %.1f%%; strace %.1f%%\n' \
    "$(echo "100 * $mr / $ma" | bc -l)" "$(echo "100 * $mp / $ma" | bc -l)" "$(echo "100 * $ms / $ma" | bc -l)"
