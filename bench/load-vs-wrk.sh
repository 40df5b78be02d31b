#!/usr/bin/env bash
# lagtrace load vs wrk against the lab's real nginx, alternating in one run.
#   sudo bench/load-vs-wrk.sh [ROUNDS] [SECONDS] [LONG_SECONDS]
# Prints, per -t/-c configuration: req/s and CPU seconds per request (user+sys from
# /usr/bin/time) for both, and the ratios; then p50/p99 on the latency server (tcp_nodelay
# off, the 40 ms stall) for both; then max RSS at -c 1000.
# Targets: req/s >= 1.0x wrk, CPU/request <= wrk's, latency p50/p99 within 5%,
# RSS <= 64 MB at -c 1000. On a 2-core machine nginx and the load generator share the CPUs.
set -euo pipefail
ROUNDS=${1:-3}
SECS=${2:-5}
LONG=${3:-30}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${LAGTRACE:-${CARGO_TARGET_DIR:-$ROOT/target}/release/lagtrace}
[ "$(id -u)" = 0 ] || { echo "load-vs-wrk: needs root (the lab creates a network namespace)" >&2; exit 2; }
command -v wrk >/dev/null || { echo "load-vs-wrk: wrk not installed" >&2; exit 2; }
[ -x "$BIN" ] || (cd "$ROOT" && cargo build --release -p lagtrace)
NAME=benchload$$
TMP=$(mktemp -d)
cleanup() { "$BIN" lab down --name "$NAME" >/dev/null 2>&1 || true; rm -rf "$TMP"; }
trap cleanup EXIT INT TERM
"$BIN" lab up --name "$NAME" --json > "$TMP/lab.json"
ADDR=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["server_addr"])' "$TMP/lab.json")
GOOD="http://$ADDR:80/"
SLOW="http://$ADDR:8080/"
LOGS=/run/lagtrace/labs/$NAME
truncate_logs() { local l; for l in "$LOGS"/nginx-*/access.log; do : > "$l"; done; }

# run TOOL OUTFILE ARGS... : runs under /usr/bin/time; CPU (user+sys) and max RSS to OUTFILE.time
run() {
    local tool=$1 out=$2; shift 2
    if [ "$tool" = wrk ]; then
        /usr/bin/time -f "%U %S %M" -o "$out.time" wrk "$@" > "$out"
    else
        /usr/bin/time -f "%U %S %M" -o "$out.time" "$BIN" load --json "$@" > "$out"
    fi
    truncate_logs
}

summ() { # TOOL FILE -> "requests seconds cpu rss"
    python3 - "$@" <<'PY'
import json, re, sys
tool, f = sys.argv[1], sys.argv[2]
u, s, m = open(f + ".time").read().split()[-3:]
cpu = float(u) + float(s)
if tool == "wrk":
    t = open(f).read()
    n = int(re.search(r"(\d+) requests in", t).group(1))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
    secs = n / rps
else:
    d = json.load(open(f))
    n, secs = d["requests"], d["duration_us"] / 1e6
print(n, secs, cpu, m)
PY
}

pct() { # TOOL FILE -> "p50_us p99_us"
    python3 - "$@" <<'PY'
import json, re, sys
tool, f = sys.argv[1], sys.argv[2]
if tool == "wrk":
    t = open(f).read()
    def us(v):
        for suf, k in (("us", 1), ("ms", 1e3), ("s", 1e6)):
            if v.endswith(suf): return float(v[:-len(suf)]) * k
    g = lambda p: us(re.search(r"^\s+%s%%\s+(\S+)" % p, t, re.M).group(1))
    print(g("50"), g("99"))
else:
    d = json.load(open(f))["latency"]
    print(d["p50_us"], d["p99_us"])
PY
}

echo "lagtrace load vs wrk — nginx in lab $NAME ($GOOD, $SLOW), $ROUNDS rounds x ${SECS}s each"
echo "machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for cfg in "1 50" "2 100"; do
    set -- $cfg; T=$1; C=$2
    declare -A N=([wrk]=0 [lt]=0) S=([wrk]=0 [lt]=0) CPU=([wrk]=0 [lt]=0)
    for r in $(seq "$ROUNDS"); do
        for tool in wrk lt; do
            f=$TMP/$tool-$T-$C-$r
            if [ $tool = wrk ]; then run wrk "$f" -t"$T" -c"$C" -d"${SECS}s" --timeout 2s "$GOOD"
            else run lt "$f" -t"$T" -c"$C" -d"${SECS}s" --timeout 2s "$GOOD"; fi
            read -r n s c _ < <(summ "$([ $tool = wrk ] && echo wrk || echo lt)" "$f")
            printf "  -t%s -c%-4s round %s %-8s %8.0f req/s  %6.2f us CPU/request\n" "$T" "$C" "$r" \
                "$([ $tool = wrk ] && echo wrk || echo lagtrace)" "$(echo "$n / $s" | bc -l)" "$(echo "$c * 1000000 / $n" | bc -l)"
            N[$tool]=$(echo "${N[$tool]} + $n" | bc -l); S[$tool]=$(echo "${S[$tool]} + $s" | bc -l)
            CPU[$tool]=$(echo "${CPU[$tool]} + $c" | bc -l)
        done
    done
    wr=$(echo "${N[wrk]} / ${S[wrk]}" | bc -l); lr=$(echo "${N[lt]} / ${S[lt]}" | bc -l)
    wc=$(echo "${CPU[wrk]} * 1000000 / ${N[wrk]}" | bc -l); lc=$(echo "${CPU[lt]} * 1000000 / ${N[lt]}" | bc -l)
    printf -- "-t%s -c%s: wrk %.0f req/s %.2f us CPU/req | lagtrace %.0f req/s %.2f us CPU/req | req/s ratio %.3f (>= 1.0) | CPU/req ratio %.3f (<= 1.0)\n" \
        "$T" "$C" "$wr" "$wc" "$lr" "$lc" "$(echo "$lr / $wr" | bc -l)" "$(echo "$lc / $wc" | bc -l)"
done

echo "latency server (tcp_nodelay off), -t2 -c100 -d${SECS}s:"
W50=0; W99=0; L50=0; L99=0; ALL=""
for r in $(seq "$ROUNDS"); do
    run wrk "$TMP/wl-$r" -t2 -c100 -d"${SECS}s" --timeout 2s --latency "$SLOW"
    read -r a b < <(pct wrk "$TMP/wl-$r")
    run lt "$TMP/ll-$r" -t2 -c100 -d"${SECS}s" --timeout 2s "$SLOW"
    read -r c d < <(pct lt "$TMP/ll-$r")
    printf "  round %s: wrk p50 %.0f us p99 %.0f us | lagtrace p50 %.0f us p99 %.0f us\n" "$r" "$a" "$b" "$c" "$d"
    ALL="$ALL $a $b $c $d"
    W50=$(echo "$W50 + $a" | bc -l); W99=$(echo "$W99 + $b" | bc -l)
    L50=$(echo "$L50 + $c" | bc -l); L99=$(echo "$L99 + $d" | bc -l)
done
printf "latency: p50 ratio %.3f, p99 ratio %.3f (lagtrace/wrk of the round means, target within 0.95..1.05)\n" \
    "$(echo "$L50 / $W50" | bc -l)" "$(echo "$L99 / $W99" | bc -l)"
python3 - $ALL <<'PY'
import statistics as st, sys
v = list(map(float, sys.argv[1:])); q = [v[i::4] for i in range(4)]
m = [st.median(x) for x in q]
print("latency: p50 ratio %.3f, p99 ratio %.3f (lagtrace/wrk of the round medians: one stalled round on a shared machine does not dominate)" % (m[2] / m[0], m[3] / m[1]))
PY

echo "memory at -c 1000 (-t2, ${SECS}s, good server):"
run wrk "$TMP/wm" -t2 -c1000 -d"${SECS}s" --timeout 2s "$GOOD"
run lt "$TMP/lm" -t2 -c1000 -d"${SECS}s" --timeout 2s "$GOOD"
read -r _ _ _ wm < <(summ wrk "$TMP/wm")
read -r ln _ _ lm < <(summ lt "$TMP/lm")
printf "  wrk max RSS %.1f MB | lagtrace max RSS %.1f MB (target <= 64 MB), %s requests, errors %s\n" \
    "$(echo "$wm / 1024" | bc -l)" "$(echo "$lm / 1024" | bc -l)" "$ln" \
    "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["errors"])' "$TMP/lm")"

echo "memory growth: lagtrace -t2 -c1000 for ${LONG}s vs ${SECS}s (max RSS must not grow with requests):"
run lt "$TMP/lm2" -t2 -c1000 -d"${LONG}s" --timeout 2s "$GOOD"
read -r ln2 _ _ lm2 < <(summ lt "$TMP/lm2")
printf "  %ss: %.1f MB after %s requests | %ss: %.1f MB after %s requests\n" \
    "$SECS" "$(echo "$lm / 1024" | bc -l)" "$ln" "$LONG" "$(echo "$lm2 / 1024" | bc -l)" "$ln2"
