#!/usr/bin/env bash
# Cost of the softirq timer (issue 27: the host layer <= 2 % of one core): while wrk keeps a
# local nginx busy over loopback, `lagtrace host -d WINDOW` runs with the timer and with
# --no-softirq, alternately (farm-bench pairs them), and prints lagtrace's own CPU for each.
# The timer's three BPF programs run in the kernel, in softirq context, on every network
# softirq and every received packet of the machine: not in lagtrace's CPU. So one round
# more with kernel.bpf_stats_enabled=1 prints their run time per call and as a share of a
# core (bpftool), and wrk's requests/s with and without the timer attached.
#
# usage: bench/softirq-cost.sh [RUNS] [WINDOW_S]   (as root; default 5 runs, 3 s)
set -euo pipefail
RUNS=${1:-5}
WIN=${2:-3}
NAME=softirq
command -v bpftool >/dev/null || { echo "missing bpftool" >&2; exit 2; }
# The tools, a local nginx on a free port, wrk -c8 bounded to the paired run, the trap.
. "$(dirname "$0")/tracer-bench-setup.sh"
sleep 1
echo "== lagtrace host -d ${WIN}s (nginx under wrk -c8 over loopback): with the timer (A) vs --no-softirq (B)"
farm-bench -n "$RUNS" --timeout $(( LOAD_S + 30 )) \
    --vs "$LAGTRACE host -d ${WIN}s --json --no-offcpu --no-softirq" \
    -- "$LAGTRACE" host -d "${WIN}s" --json --no-offcpu
kill "$WRK" 2>/dev/null || true
wait "$WRK" 2>/dev/null || true
WRK=""

echo
echo "== the timer in the kernel (kernel.bpf_stats_enabled=1), and wrk's rate with and without it"
echo 1 > /proc/sys/kernel/bpf_stats_enabled
rate() { wrk -t1 -c8 -d"${WIN}s" "$URL" 2>/dev/null | awk '/Requests\/sec/ {print $2}'; }
for round in 1 2 3; do
    alone=$(rate)
    "$LAGTRACE" host -d "$((WIN + 2))s" --json --no-offcpu > "$DIR/h.json" &
    H=$!
    sleep 0.5
    traced=$(rate)
    bpftool -j prog show name lt_softirq > "$DIR/progs.json" 2>/dev/null || echo "[]" > "$DIR/progs.json"
    wait "$H"
    python3 - "$DIR/h.json" "$DIR/progs.json" "$alone" "$traced" "$round" "$WIN" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
r = r.get("data", r)
progs = json.load(open(sys.argv[2]))
if isinstance(progs, dict):
    progs = [progs]
ns = sum(p.get("run_time_ns", 0) for p in progs)
runs = sum(p.get("run_cnt", 0) for p in progs)
k = (r.get("softirq") or {}).get("data") or {}
alone, traced, win = float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[6])
per = ns / runs if runs else 0
print(f"round {sys.argv[5]}: {len(progs)} programs ran {runs} times, {ns / 1e6:.1f} ms "
      f"({per:.0f} ns a call; {ns / 1e9 / (win + 0.5) * 100:.2f}% of a core over the "
      f"{win + 0.5:.1f} s before the reading); packets {k.get('rx_packets')}, "
      f"{(k.get('rx_ns_per_packet') or 0) / 1000:.1f} us each in NET_RX; "
      f"wrk {alone:.0f} req/s alone, {traced:.0f} traced ({(traced / alone - 1) * 100:+.1f}%)")
PY
done
