#!/usr/bin/env bash
# A newcomer's first hour, as a script (issue 34): the README's lab, the case's fix, a cut
# capture, a server in another namespace, the peers' habits, a wrong URL, the manual pages.
# Each step checks what a user would read and prints `ok:` or `FAIL:`; the exit status is the
# number of failures (0: the walk holds). Needs root (the lab builds a namespace and nginx).
#
#   LAGTRACE=target/release/lagtrace support/newcomer-walk.sh
#
# Everything it starts is removed on exit, also when a step fails or it is interrupted.
set -uo pipefail
# The binary, resolved before the cd (a relative LAGTRACE is the caller's).
LT="${LAGTRACE:-}"
[[ -n "$LT" ]] && LT=$(realpath -m "$LT")
cd "$(dirname "$0")/.."
LT="${LT:-$(realpath -m "${CARGO_TARGET_DIR:-target}/release/lagtrace")}"
[[ -x "$LT" ]] || { echo "newcomer-walk: no lagtrace binary at $LT (build it, or set LAGTRACE)" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "newcomer-walk: needs root (the lab builds a namespace)" >&2; exit 2; }

name="walk$$"
tmp=$(mktemp -d)
held=""
cleanup() {
  [[ -n "$held" ]] && kill "$held" 2>/dev/null
  "$LT" lab down --name "$name" >/dev/null 2>&1
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fails=0
ok() { echo "ok: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
# check DESCRIPTION COMMAND...: the command (a test) must succeed.
check() {
  local what=$1
  shift
  if "$@"; then ok "$what"; else fail "$what"; fi
}

# 1. The lab, and `lab fix` applying exactly the fix diagnose names.
"$LT" lab up --name "$name" --json >"$tmp/lab.json" 2>"$tmp/lab.err" || { cat "$tmp/lab.err"; fail "lab up"; exit "$fails"; }
addr=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["server_addr"])' "$tmp/lab.json")
conf=$(python3 -c 'import json,sys; print([s["config"] for s in json.load(open(sys.argv[1]))["servers"] if s["role"] == "latency"][0])' "$tmp/lab.json")
cp "$conf" "$tmp/before.conf"

# 2. diagnose the latency server: the Nagle verdict, and fix lines a user can paste.
"$LT" diagnose "http://$addr:8080/" -d 4s --json >"$tmp/diag.json" 2>"$tmp/diag.err"
python3 - "$tmp/diag.json" >"$tmp/fixes.txt" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print(d["verdict"]["cause"])
for f in d["verdict"].get("fix", []):
    print(f["change"])
EOF
check "diagnose names nagle-delayed-ack on the latency server" grep -qx nagle-delayed-ack "$tmp/fixes.txt"
check "every fix line is pasteable (no <placeholder>)" bash -c "! grep -q '<' '$tmp/fixes.txt'"
real_route() { grep -F "ip route replace $addr/32 " "$tmp/fixes.txt" | grep -q "quickack 1$"; }
check "the client fix names the real route (ip route replace $addr/32 ... quickack 1)" real_route

"$LT" lab fix --name "$name" >"$tmp/fix.out" 2>&1
changed=$(diff "$tmp/before.conf" "$conf" | grep -c '^[<>]')
check "lab fix changes exactly one line" test "$changed" = 2
check "the line is tcp_nodelay off; -> tcp_nodelay on;" bash -c "diff '$tmp/before.conf' '$conf' | grep -q '^< *tcp_nodelay off;' && diff '$tmp/before.conf' '$conf' | grep -q '^> *tcp_nodelay on;'"
check "lab fix prints the line it changed" grep -q "tcp_nodelay on;" "$tmp/fix.out"

# 3. nginx in the lab's namespace, asked for by name from this one, with a connection open.
pid=$(python3 -c 'import json,sys; print([s["pid"] for s in json.load(open(sys.argv[1]))["servers"] if s["role"] == "latency"][0])' "$tmp/lab.json")
python3 -c 'import socket,sys,time; s=socket.create_connection((sys.argv[1], 8080)); time.sleep(20)' "$addr" &
held=$!
sleep 0.5
"$LT" sockets --process nginx >"$tmp/sockets.txt" 2>&1
check "sockets --process nginx finds the lab's nginx (pid $pid) in its namespace" grep -q "nginx($pid," "$tmp/sockets.txt"
check "sockets shows the open connection's Recv-Q/Send-Q and notsent" grep -q "queues: Recv-Q .* notsent" "$tmp/sockets.txt"
kill "$held" 2>/dev/null
held=""
"$LT" lab down --name "$name" >/dev/null 2>&1

# 4. A capture cut mid-record is never a confident all-clear.
head -c 5000 testdata/case/nagle-delayed-ack.pcap >"$tmp/cut.pcap"
"$LT" diagnose --pcap "$tmp/cut.pcap" --port 8080 --json >"$tmp/cut.json" 2>/dev/null
verdict=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["verdict"]["cause"], d["verdict"]["confidence"])' "$tmp/cut.json" 2>/dev/null || echo "no verdict")
not_confidently_healthy() { [[ "$verdict" != "no verdict" && "$verdict" != "healthy medium" && "$verdict" != "healthy high" ]]; }
check "a truncated capture gets a verdict, not healthy above low confidence ($verdict)" not_confidently_healthy

# 5. The peers' flags: one line that says what to use, or the flag mapped with a note.
out=$("$LT" analyze -z conv,tcp testdata/case/healthy.pcap 2>&1); rc=$?
one_line_refusal() { [[ $rc == 2 && $(wc -l <<<"$out") == 1 ]] && grep -q -- '--json' <<<"$out"; }
check "tshark's -z is refused in one line, exit 2" one_line_refusal
plain=$("$LT" analyze testdata/case/healthy.pcap 2>/dev/null)
peer=$("$LT" analyze -q -r testdata/case/healthy.pcap 2>"$tmp/note.txt")
same_with_a_note() { [[ "$plain" == "$peer" ]] && grep -q 'note: analyze -q' "$tmp/note.txt"; }
check "tshark's -q -r prints what analyze prints, with one note" same_with_a_note
out=$("$LT" load -t2 -c10 -d1s oops http://127.0.0.1:9/ 2>&1)
check "a stray word before load's URL is named, not the URL" grep -q "'oops' was read as it" <<<"$out"

# 6. A URL without its scheme gets the URL it meant.
out=$("$LT" diagnose 127.0.0.1:8080 2>&1)
check "diagnose HOST:PORT says did you mean http://HOST:PORT/" grep -q "did you mean http://127.0.0.1:8080/" <<<"$out"

# 7. The manual pages: one per command, none for clap's help.
mkdir "$tmp/man"
pages() { "$LT" man --dir "$tmp/man" && [[ -f "$tmp/man/lagtrace-load-merge.1" ]] && ! ls "$tmp/man" | grep -q help; }
check "man --dir writes a page per command and no help pages" pages
check "man load merge is a page" bash -c "'$LT' man load merge | grep -q 'lagtrace-load-merge'"

echo "newcomer-walk: $fails failed"
exit "$fails"
