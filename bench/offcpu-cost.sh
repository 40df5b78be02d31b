#!/usr/bin/env bash
# Cost of the off-CPU tracer (issue 26: <= 2 % of one core on the diagnose window): while wrk
# keeps a local nginx worker busy, `lagtrace host --pid WORKER -d WINDOW` runs with the
# tracer and with --no-offcpu, alternately (farm-bench pairs them), and prints lagtrace's
# own CPU for each and the difference as a share of one core over the window. Then one run
# with kernel.bpf_stats_enabled=1 prints the tracer's run time in the kernel (it runs on
# every context switch of the machine, in the switching task's time: not in lagtrace's CPU)
# and wrk's requests/s with and without the tracer attached.
#
# usage: bench/offcpu-cost.sh [RUNS] [WINDOW_S]   (as root; default 5 runs, 3 s)
set -euo pipefail
RUNS=${1:-5}
WIN=${2:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LAGTRACE=${LAGTRACE:-${CARGO_TARGET_DIR:-$ROOT/target}/release/lagtrace}
[ -x "$LAGTRACE" ] || { echo "build first: cargo build --release -p lagtrace" >&2; exit 2; }
for t in nginx wrk farm-bench python3; do command -v $t >/dev/null || { echo "missing $t" >&2; exit 2; }; done

DIR=$(mktemp -d /tmp/lt-bench-offcpu.XXXXXX)
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
WRK=""
STATS=$(cat /proc/sys/kernel/bpf_stats_enabled)
cleanup() {
    [ -n "$WRK" ] && kill "$WRK" 2>/dev/null || true
    echo "$STATS" > /proc/sys/kernel/bpf_stats_enabled
    if [ -f "$DIR/nginx.pid" ]; then kill "$(cat "$DIR/nginx.pid")" 2>/dev/null || true; sleep 0.3; fi
    rm -rf "$DIR"
}
trap cleanup EXIT INT TERM
nginx -c "$DIR/nginx.conf" -p "$DIR" -g 'daemon on;'
sleep 0.3
WORKER=$(pgrep -P "$(cat "$DIR/nginx.pid")" | head -1)
URL="http://127.0.0.1:$PORT/"

# Bounded load for the whole paired run: (runs + warm-up) x 2 commands x (window + 1 s).
LOAD_S=$(( (RUNS + 1) * 2 * (WIN + 1) + 10 ))
wrk -t1 -c8 -d${LOAD_S}s "$URL" >/dev/null 2>&1 &
WRK=$!
sleep 1
echo "== lagtrace host --pid $WORKER (nginx worker under wrk -c8), ${WIN}s window: with the tracer (A) vs --no-offcpu (B)"
farm-bench -n "$RUNS" --timeout $(( LOAD_S + 30 )) \
    --vs "$LAGTRACE host --pid $WORKER -d ${WIN}s --json --no-offcpu" \
    -- "$LAGTRACE" host --pid "$WORKER" -d "${WIN}s" --json | tee "$DIR/fb.txt"
kill "$WRK" 2>/dev/null || true
wait "$WRK" 2>/dev/null || true
WRK=""

echo
echo "== the tracer in the kernel (kernel.bpf_stats_enabled=1), and wrk's rate with and without it"
echo 1 > /proc/sys/kernel/bpf_stats_enabled
rate() { wrk -t1 -c8 -d"${WIN}s" "$URL" 2>/dev/null | awk '/Requests\/sec/ {print $2}'; }
for round in 1 2 3; do
    alone=$(rate)
    "$LAGTRACE" host --pid "$WORKER" -d "$((WIN + 1))s" --json > "$DIR/h.json" &
    H=$!
    sleep 0.5
    traced=$(rate)
    wait "$H"
    python3 - "$DIR/h.json" "$alone" "$traced" "$round" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
r = d.get("data", d)
o = r["offcpu"].get("data") or {}
w = r["window_us"]
cpu = r["cost"]["cpu_us"]
bpf = o.get("bpf_run_us")
runs = o.get("bpf_runs")
alone, traced = float(sys.argv[2]), float(sys.argv[3])
print(f"round {sys.argv[4]}: lagtrace window CPU {cpu} us ({cpu / w * 100:.2f}% of a core); "
      f"tracer in the kernel {bpf} us over {runs} runs "
      f"({(bpf or 0) / w * 100:.2f}% of a core, {(bpf or 0) * 1000 / max(runs or 1, 1):.0f} ns a run); "
      f"wrk {traced:.0f} req/s traced vs {alone:.0f} alone = {traced / alone:.3f}")
PY
done
