#!/usr/bin/env bash
# `lagtrace diagnose --passive` over a long busy window keeps its memory bounded (issue 18).
#
# Usage: bench/passive-rss.sh [SECONDS...]     (as root; default: 10 60)
#
# For each window length: a lab (namespace, veth, real nginx; removed at exit), wrk
# keep-alive load against its stock nginx for the whole window (bounded: SECONDS), and
# `lagtrace diagnose --passive --netns NS --port 80 -d SECONDS+2` under /usr/bin/time -v.
# Prints wrk's req/s, the requests passive mode counted, the packets the kernel dropped from
# its capture, and lagtrace's peak RSS: the RSS of the long window should match the short
# one's (the streaming analyzer keeps histograms, the slowest timings and a fixed sample,
# not the packets or every transaction).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
LAGTRACE=${LAGTRACE:-${CARGO_TARGET_DIR:-$ROOT/target}/release/lagtrace}
CONNS=${CONNS:-16}
LAB=prss$$
WORK=$(mktemp -d /tmp/lagtrace-bench-passive.XXXXXX)
cleanup() {
    "$LAGTRACE" lab down --name "$LAB" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

[ -x "$LAGTRACE" ] || { echo "build first: cargo build --release ($LAGTRACE)" >&2; exit 2; }
command -v wrk >/dev/null || { echo "wrk is needed (apt-get install wrk)" >&2; exit 2; }

"$LAGTRACE" lab up --name "$LAB" >"$WORK/lab.txt"
NS=$(sed -n 's/.*namespace \([^,]*\),.*/\1/p' "$WORK/lab.txt" | head -1)
URL=$(awk '/ good /{print $2}' "$WORK/lab.txt")

printf '%8s %10s %10s %10s %10s %12s\n' window wrk_req/s wrk_reqs passive dropped peak_rss_kB
for secs in "${@:-10 60}"; do
    for s in $secs; do
        /usr/bin/time -v -o "$WORK/time.txt" "$LAGTRACE" diagnose --passive --netns "$NS" \
            --port 80 -d "$((s + 2))s" --json -q >"$WORK/out.json" 2>/dev/null &
        PID=$!
        sleep 1
        wrk -t2 -c "$CONNS" -d "${s}s" "$URL" >"$WORK/wrk.txt"
        wait "$PID" || true
        rps=$(awk '/Requests\/sec/{print $2}' "$WORK/wrk.txt")
        reqs=$(awk '/requests in/{print $1}' "$WORK/wrk.txt")
        seen=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["layers"]["app"]["data"]["cn"]["requests"], j["layers"]["packets"]["data"]["dropped"])' "$WORK/out.json")
        rss=$(awk -F: '/Maximum resident/{gsub(/ /,"",$2); print $2}' "$WORK/time.txt")
        printf '%7ss %10s %10s %10s %10s %12s\n' "$s" "$rps" "$reqs" ${seen} "$rss"
    done
done
