#!/usr/bin/env bash
# Cost of the on-CPU sampler (issue 26: <= 2 % of one core on the diagnose window): while wrk
# keeps a local nginx worker busy, `lagtrace host --pid WORKER -d WINDOW` runs with the
# sampler (the default, 199 Hz on every CPU) and with --no-profile, alternately (farm-bench
# pairs them), and prints lagtrace's own CPU for each — the difference is what reading the
# sampler's maps and naming its frames (kallsyms, the binaries' ELF symbols) costs. Then,
# with kernel.bpf_stats_enabled=1, the sampler's run time in the kernel (it runs on every
# sample of every CPU, in the interrupted task's time: not in lagtrace's CPU) and wrk's
# requests/s with the sampler attached against without, over the same window.
#
# usage: bench/oncpu-cost.sh [RUNS] [WINDOW_S]   (as root; default 5 runs, 3 s)
set -euo pipefail
RUNS=${1:-5}
WIN=${2:-3}
NAME=oncpu
# shellcheck source=bench/tracer-bench-setup.sh
. "$(dirname "$0")/tracer-bench-setup.sh"
echo "== lagtrace host --pid $WORKER (nginx worker under wrk -c8), ${WIN}s window: with the sampler (A) vs --no-profile (B)"
farm-bench -n "$RUNS" --timeout $(( LOAD_S + 30 )) \
    --vs "$LAGTRACE host --pid $WORKER -d ${WIN}s --json --no-profile" \
    -- "$LAGTRACE" host --pid "$WORKER" -d "${WIN}s" --json | tee "$DIR/fb.txt"
kill "$WRK" 2>/dev/null || true
wait "$WRK" 2>/dev/null || true
WRK=""

echo
echo "== the sampler in the kernel (kernel.bpf_stats_enabled=1), and wrk's rate with and without it"
echo 1 > /proc/sys/kernel/bpf_stats_enabled
for round in 1 2 3; do
    # The same lagtrace window both times (the off-CPU tracer too): only the sampler differs.
    "$LAGTRACE" host --pid "$WORKER" -d "$((WIN + 1))s" --json --no-profile > "$DIR/b.json" &
    H=$!
    sleep 0.5
    alone=$(rate)
    wait "$H"
    "$LAGTRACE" host --pid "$WORKER" -d "$((WIN + 1))s" --json > "$DIR/h.json" &
    H=$!
    sleep 0.5
    sampled=$(rate)
    wait "$H"
    python3 - "$DIR/h.json" "$DIR/b.json" "$alone" "$sampled" "$round" <<'PY'
import json, sys
def rep(p):
    d = json.load(open(p))
    return d.get("data", d)
r, b = rep(sys.argv[1]), rep(sys.argv[2])
o = r["oncpu"].get("data") or {}
w = r["window_us"]
cpu, cpu_b = r["cost"]["cpu_us"], b["cost"]["cpu_us"]
bpf, runs = o.get("bpf_run_us"), o.get("bpf_runs")
alone, sampled = float(sys.argv[3]), float(sys.argv[4])
top = ", ".join(f'{m["module"]} {m["share"] * 100:.0f}%' for m in o.get("modules", [])[:3])
print(f"round {sys.argv[5]}: {o.get('samples')} samples ({top}); lagtrace window CPU {cpu} us "
      f"vs {cpu_b} us without ({(cpu - cpu_b) / w * 100:+.2f}% of a core); sampler in the kernel "
      f"{bpf} us over {runs} runs ({(bpf or 0) / w * 100:.2f}% of a core, "
      f"{(bpf or 0) * 1000 / max(runs or 1, 1):.0f} ns a run); "
      f"wrk {sampled:.0f} req/s sampled vs {alone:.0f} without = {sampled / alone:.3f}")
PY
done
