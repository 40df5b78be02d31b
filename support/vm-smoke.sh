#!/usr/bin/env bash
# The BPF parts on a stock distribution kernel (issue 30), in one VM run (support/vm-run.sh):
# - the socket-call recorder on each hook kind: exactly N setsockopt calls of a loop recorded
#   with --recorder fentry, tracepoint and raw, and `auto` must pick fentry there;
# - the host layer with --pid: its BPF programs (drops, off-CPU, on-CPU, softirq) and the
#   scheduler sampling load and report `ok`;
# - the drop counter (kfree_skb's reason) equals an nft rule's counter for 500 UDP packets
#   the rule drops at input.
# Prints one line per check and exits non-zero when one fails.
#
# usage: support/vm-smoke.sh [LAGTRACE] [N]   (as root; default target/release/lagtrace, 2000)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-${CARGO_TARGET_DIR:-$ROOT/target}/release/lagtrace}
N=${2:-2000}
[[ -x $BIN ]] || { echo "vm-smoke: no lagtrace binary at $BIN (build it first)" >&2; exit 2; }
DIR=$(mktemp -d /var/tmp/lagtrace-vm-smoke.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
cp "$BIN" "$DIR/lagtrace"
cat > "$DIR/smoke.sh" <<EOF
#!/bin/sh
L=$DIR/lagtrace
O=$DIR
uname -r > \$O/kernel
export PATH=\$PATH:/usr/sbin:/sbin
# The guest loads no module by itself: nft and the listeners' sock_diag need these.
for m in nf_tables inet_diag tcp_diag udp_diag; do modprobe \$m; done
for r in fentry tracepoint raw auto; do
  \$L sockets --record --recorder \$r --json -- python3 -c 'import socket
for i in range($N):
    s = socket.socket(); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1); s.close()' \
    > \$O/rec-\$r.json 2> \$O/rec-\$r.err
  echo \$? > \$O/rec-\$r.rc
done
sleep 60 & P=\$!
\$L host --pid \$P -d 2s --json > \$O/host.json 2> \$O/host.err
echo \$? > \$O/host.rc
kill \$P
# The drop counter against an nft rule's: UDP to port 9 dropped at input, counted by both.
nft add table inet ltsmoke
nft add chain inet ltsmoke in '{ type filter hook input priority 0; }'
nft add rule inet ltsmoke in udp dport 9 counter drop
\$L host -d 8s --json > \$O/drops.json 2> \$O/drops.err &
H=\$!
sleep 4
python3 -c 'import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(500):
    s.sendto(b"x", ("127.0.0.1", 9))'
wait \$H
echo \$? > \$O/drops.rc
nft -j list chain inet ltsmoke in > \$O/nft.json
nft delete table inet ltsmoke
EOF
chmod +x "$DIR/smoke.sh"
start=$(date +%s)
set +e
bash "$ROOT/support/vm-run.sh" --dir "$DIR" -- /bin/sh "$DIR/smoke.sh"
vrc=$?
set -e
echo "vm-smoke: kernel $(cat "$DIR/kernel" 2>/dev/null || echo '?'), VM run $(($(date +%s) - start)) s (exit $vrc)"
python3 - "$DIR" "$N" <<'PY'
import json, sys, os
d, n = sys.argv[1], int(sys.argv[2])
bad = 0
def check(ok, what):
    global bad
    print(("ok   " if ok else "FAIL ") + what)
    bad += not ok
for r in ["fentry", "tracepoint", "raw", "auto"]:
    try:
        rc = int(open(f"{d}/rec-{r}.rc").read())
        calls = sum(1 for l in open(f"{d}/rec-{r}.err") if "setsockopt(" in l)
        hooks = json.load(open(f"{d}/rec-{r}.json")).get("hooks")
    except (OSError, ValueError) as e:
        check(False, f"recorder {r}: no result ({e})")
        continue
    want = "fentry" if r == "auto" else r
    check(rc == 0 and calls == n and hooks == want,
          f"recorder {r}: exit {rc}, {calls} of {n} setsockopt calls, hooks {hooks} (want {want})")
try:
    h = json.load(open(f"{d}/host.json"))
    for k in ["drops", "offcpu", "oncpu", "softirq", "threads", "listeners"]:
        s = h.get(k, {}).get("status")
        check(s == "ok", f"host --pid: {k} {s} {h.get(k, {}).get('reason') or ''}".rstrip())
except (OSError, ValueError) as e:
    check(False, f"host --pid: no report ({e})")
try:
    nft = json.load(open(f"{d}/nft.json"))
    counted = [x["counter"]["packets"] for r in nft["nftables"] if "rule" in r
               for x in r["rule"]["expr"] if "counter" in x]
    dr = json.load(open(f"{d}/drops.json"))["drops"]
    seen = sum(r["count"] for r in (dr.get("data") or {}).get("reasons", [])
               if "NETFILTER" in r["reason"])
    check(dr.get("status") == "ok" and counted and seen == counted[0],
          f"drops: {seen} NETFILTER_DROP counted by lagtrace host, nft's rule counter "
          f"{counted[0] if counted else '?'} (drops layer {dr.get('status')})")
except (OSError, ValueError, KeyError) as e:
    check(False, f"drops vs nft: no result ({e})")
sys.exit(1 if bad else 0)
PY
