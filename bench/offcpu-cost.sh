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
NAME=offcpu
# shellcheck source=bench/tracer-bench-setup.sh
. "$(dirname "$0")/tracer-bench-setup.sh"
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
