#!/usr/bin/env bash
# lagtrace analyze vs tshark -q -z conv,tcp on a >= 1 M-packet capture, run alternately.
#
# Usage: bench/analyze-vs-tshark.sh [CAPTURE]      (as root, to capture when no file given)
#        FLOOR=12 bench/analyze-vs-tshark.sh      (exit 1 when the CPU ratio is below FLOOR:
#                                                  the speed guard .ci/run runs)
#
# Without CAPTURE it makes one from real traffic on this machine only: a private nginx on
# 127.0.0.1 (temporary config, stopped at exit), wrk keep-alive load (bounded: a few seconds
# per round), tcpdump -i lo on that port, until the file holds >= MIN_PACKETS packets.
# Then each tool runs ROUNDS times, alternating, under /usr/bin/time -v; the script prints the
# median wall time of each, the ratio, lagtrace's packets/s, and both peak RSS figures.
#
# Targets (issue #4): ratio >= 20, >= 2 M packets/s, bounded memory.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
MIN_PACKETS=${MIN_PACKETS:-1000000}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LAGTRACE=${LAGTRACE:-${CARGO_TARGET_DIR:-$ROOT/target}/release/lagtrace}
FLOOR=${FLOOR:-}
WORK=$(mktemp -d /tmp/lagtrace-bench-analyze.XXXXXX)
NGINX_PID=""
TCPDUMP_PID=""
cleanup() {
    [ -n "$TCPDUMP_PID" ] && kill "$TCPDUMP_PID" 2>/dev/null || true
    [ -n "$NGINX_PID" ] && kill "$NGINX_PID" 2>/dev/null || true
    wait 2>/dev/null || true
    [ -z "${KEEP:-}" ] && rm -rf "$WORK"
}
trap cleanup EXIT

if [ ! -x "$LAGTRACE" ]; then
    (cd "$ROOT" && cargo build --release -p lagtrace >&2)
fi

count() { capinfos -M -c "$1" 2>/dev/null | awk -F: '/Number of packets/ {gsub(/ /,"",$2); print $2}'; }

FILE=${1:-}
if [ -z "$FILE" ]; then
    PORT=$((20000 + $$ % 10000))
    mkdir -p "$WORK/nginx/logs" "$WORK/html"
    head -c 2000 /dev/zero | tr '\0' 'x' > "$WORK/html/index.html"
    cat > "$WORK/nginx/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/logs/error.log;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $WORK/nginx/body;
    proxy_temp_path $WORK/nginx/proxy;
    fastcgi_temp_path $WORK/nginx/fastcgi;
    uwsgi_temp_path $WORK/nginx/uwsgi;
    scgi_temp_path $WORK/nginx/scgi;
    keepalive_requests 1000000;
    server { listen 127.0.0.1:$PORT; root $WORK/html; }
}
EOF
    nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" &
    NGINX_PID=$!
    for _ in $(seq 50); do
        curl -s -o /dev/null "http://127.0.0.1:$PORT/" && break
        sleep 0.1
    done
    FILE=$WORK/lo.pcap
    part=0
    while :; do
        part=$((part + 1))
        tcpdump -i lo -nn -s 200 -B 65536 -w "$WORK/part$part.pcap" "tcp port $PORT" 2>"$WORK/tcpdump.err" &
        TCPDUMP_PID=$!
        for _ in $(seq 50); do grep -q listening "$WORK/tcpdump.err" 2>/dev/null && break; sleep 0.1; done
        wrk -t 1 -c 20 -d 4s --timeout 2 "http://127.0.0.1:$PORT/" > "$WORK/wrk$part.txt"
        sleep 0.3
        kill -INT "$TCPDUMP_PID"; wait "$TCPDUMP_PID" 2>/dev/null || true
        TCPDUMP_PID=""
        # Concatenate the rounds: each round has its own wrk connections.
        if [ "$part" = 1 ]; then cp "$WORK/part1.pcap" "$FILE"; else mergecap -a -F pcap -w "$WORK/m.pcap" "$FILE" "$WORK/part$part.pcap" && mv "$WORK/m.pcap" "$FILE"; fi
        rm -f "$WORK/part$part.pcap"
        n=$(count "$FILE")
        echo "capture round $part: $n packets" >&2
        [ "$n" -ge "$MIN_PACKETS" ] && break
        [ "$part" -ge 20 ] && { echo "could not capture $MIN_PACKETS packets" >&2; exit 2; }
    done
    kill "$NGINX_PID" 2>/dev/null || true; wait "$NGINX_PID" 2>/dev/null || true; NGINX_PID=""
fi

PACKETS=$(count "$FILE")
SIZE=$(stat -c %s "$FILE")
echo "file: $FILE  packets: $PACKETS  size: $((SIZE / 1000000)) MB"

run() { # label cmd... -> "wall_s rss_kb cpu_s"
    local t="$WORK/time.$1"; shift
    /usr/bin/time -v -o "$t" "$@" > /dev/null 2>"$WORK/stderr" || { rc=$?; [ $rc -le 1 ] || { cat "$WORK/stderr" >&2; exit $rc; }; }
    local wall rss
    wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$t" | awk -F: '{ if (NF==3) print $1*3600+$2*60+$3; else print $1*60+$2 }')
    rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$t")
    cpu=$(awk -F': ' '/User time/ {u=$2} /System time/ {s=$2} END {print u+s}' "$t")
    echo "$wall $rss $cpu"
}

LT=(); TS=(); LTC=(); TSC=(); LT_RSS=0; TS_RSS=0
for i in $(seq "$ROUNDS"); do
    read -r w r c < <(run lagtrace "$LAGTRACE" analyze "$FILE")
    LT+=("$w"); LTC+=("$c"); [ "$r" -gt "$LT_RSS" ] && LT_RSS=$r
    read -r w2 r2 c2 < <(run tshark tshark -r "$FILE" -q -z conv,tcp)
    TS+=("$w2"); TSC+=("$c2"); [ "$r2" -gt "$TS_RSS" ] && TS_RSS=$r2
    echo "round $i: lagtrace ${w}s wall ${c}s cpu ${r} kB | tshark ${w2}s wall ${c2}s cpu ${r2} kB"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
LM=$(median "${LT[@]}"); TM=$(median "${TS[@]}")
LC=$(median "${LTC[@]}"); TC=$(median "${TSC[@]}")
# This machine is shared: wall time includes waiting for a core, CPU time (user+sys) does not.
awk -v l="$LM" -v t="$TM" -v lc="$LC" -v tc="$TC" -v n="$PACKETS" -v lr="$LT_RSS" -v tr="$TS_RSS" 'BEGIN {
    if (l <= 0) l = 0.005; if (lc <= 0) lc = 0.005;  # /usr/bin/time resolution is 10 ms
    printf "median wall: lagtrace %.2f s, tshark %.2f s -> ratio %.1fx\n", l, t, t / l;
    printf "median cpu:  lagtrace %.2f s, tshark %.2f s -> ratio %.1fx (target >= 20x)\n", lc, tc, tc / lc;
    printf "lagtrace: %.2f M packets/s per CPU second, %.2f M packets/s wall (target >= 2); tshark: %.3f M packets/s\n", n / lc / 1e6, n / l / 1e6, n / tc / 1e6;
    printf "peak RSS: lagtrace %.1f MB, tshark %.1f MB\n", lr / 1024, tr / 1024;
}'

if [ -n "$FLOOR" ]; then
    if awk -v lc="$LC" -v tc="$TC" -v f="$FLOOR" 'BEGIN { if (lc <= 0) lc = 0.005; exit !(tc / lc >= f) }'; then
        echo "speed guard: CPU ratio at or above the floor ${FLOOR}x"
    else
        echo "speed guard: FAILED — lagtrace analyze is below ${FLOOR}x tshark's speed (CPU time, median of $ROUNDS)" >&2
        exit 1
    fi
fi

# Memory grows with live connections, not with file size: the same traffic three times over
# (concatenated; new connections each time) must not triple lagtrace's peak RSS.
if [ -z "${SKIP_MEMORY:-}" ]; then
    mergecap -a -F pcap -w "$WORK/x3.pcap" "$FILE" "$FILE" "$FILE"
    read -r w3 r3 c3 < <(run lagtrace "$LAGTRACE" analyze "$WORK/x3.pcap")
    awk -v a="$LT_RSS" -v b="$r3" -v s="$(stat -c %s "$WORK/x3.pcap")" 'BEGIN {
        printf "memory: peak RSS %.1f MB on the file, %.1f MB on 3x it (%d MB) -> x%.2f\n", a / 1024, b / 1024, s / 1e6, b / a }'
    rm -f "$WORK/x3.pcap"
fi
