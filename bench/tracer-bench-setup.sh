# Sourced by bench/offcpu-cost.sh, bench/oncpu-cost.sh and bench/softirq-cost.sh (not run on its own): checks the
# tools, starts a local nginx (one worker) on a free port, and starts wrk -c8 against it for
# the whole paired run, bounded; the trap stops both, restores kernel.bpf_stats_enabled and
# removes the files. Needs RUNS, WIN and NAME set; sets ROOT, LAGTRACE, DIR, WORKER, URL, WRK.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LAGTRACE=${LAGTRACE:-${CARGO_TARGET_DIR:-$ROOT/target}/release/lagtrace}
[ -x "$LAGTRACE" ] || { echo "build first: cargo build --release -p lagtrace" >&2; exit 2; }
for t in nginx wrk farm-bench python3; do command -v $t >/dev/null || { echo "missing $t" >&2; exit 2; }; done

DIR=$(mktemp -d "/tmp/lt-bench-$NAME.XXXXXX")
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

# wrk's requests/s over one window (after the paired run, for the rate with and without).
rate() { wrk -t1 -c8 -d"${WIN}s" "$URL" 2>/dev/null | awk '/Requests\/sec/ {print $2}'; }
