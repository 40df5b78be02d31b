#!/usr/bin/env bash
# `lagtrace diagnose` captures and analyses its whole c=N run in bounded memory (issue 28
# item 4): the peak RSS of a long run should match a short one's.
#
# Usage: bench/diagnose-rss.sh [SECONDS...]     (as root; default: 10 60)
#
# A lab (namespace, veth, real nginx; removed at exit) and, for each budget in turn (the
# list twice, alternating, so a drift of the machine shows), `lagtrace diagnose -d SECONDS`
# against its stock nginx under /usr/bin/time -v. Prints the c=N run's requests, the packets
# captured and the kernel dropped, the kept records joined to their transactions, and peak
# RSS; then each budget's RSS over the first's. The live analyzer keeps histograms, the
# transactions the load's kept records need and a fixed sample, not the packets; only the
# first 200 000 packets go to the example flow's temporary file.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
LAGTRACE=${LAGTRACE:-${CARGO_TARGET_DIR:-$ROOT/target}/release/lagtrace}
LAB=drss$$
WORK=$(mktemp -d /tmp/lagtrace-bench-drss.XXXXXX)
cleanup() {
    "$LAGTRACE" lab down --name "$LAB" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

[ -x "$LAGTRACE" ] || { echo "build first: cargo build --release ($LAGTRACE)" >&2; exit 2; }

"$LAGTRACE" lab up --name "$LAB" >"$WORK/lab.txt"
URL=$(awk '/ good /{print $2}' "$WORK/lab.txt")
BUDGETS=("${@:-10 60}")
read -r -a BUDGETS <<<"${BUDGETS[*]}"

printf '%6s %10s %10s %8s %12s %12s\n' budget requests packets dropped joined peak_rss_kB
declare -A RSS
for round in 1 2; do
    for s in "${BUDGETS[@]}"; do
        /usr/bin/time -v -o "$WORK/time.txt" "$LAGTRACE" diagnose "$URL" -d "${s}s" --json -q \
            >"$WORK/out.json" 2>/dev/null || true
        read -r reqs pkts dropped joined < <(python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
p = j["layers"]["packets"]["data"]
cn = j["layers"]["app"]["data"]["cn"]
joins = p.get("joins") or [{}]
print(cn["requests"], p["packets"], p["dropped"],
      "%s/%s" % (joins[-1].get("matched", 0), len(joins[-1].get("requests", []))))
' "$WORK/out.json")
        rss=$(awk -F: '/Maximum resident/{gsub(/ /,"",$2); print $2}' "$WORK/time.txt")
        printf '%5ss %10s %10s %8s %12s %12s\n' "$s" "$reqs" "$pkts" "$dropped" "$joined" "$rss"
        RSS[$s]="${RSS[$s]:-} $rss"
    done
done
first=${BUDGETS[0]}
for s in "${BUDGETS[@]}"; do
    python3 -c '
import sys
a = [int(x) for x in sys.argv[2].split()]
b = [int(x) for x in sys.argv[3].split()]
print("peak RSS %ss / %ss: %.2f (max over rounds)" % (sys.argv[1], sys.argv[4], max(a) / max(b)))
' "$s" "${RSS[$s]}" "${RSS[$first]}" "$first"
done
