#!/bin/sh
# Records the golden captures in this directory from real kernel traffic, inside a network
# namespace made for the purpose (loopback only, MTU 1500 so segments look like Ethernet's).
# Needs root. Usage: testdata/golden/record.sh path/to/lagtrace
# Then regenerate the expected JSON: LAGTRACE_BLESS=1 cargo test --release -p lagtrace-packet --test golden
set -eu
LT=$(realpath "$1")
cd "$(dirname "$0")"
NS=lt-golden-rec-$$
ip netns add "$NS"
trap 'ip netns del "$NS"' EXIT
ip -n "$NS" link set lo mtu 1500 up
# MSS-sized packets (no TSO/GSO super-segments), so drops hit single segments.
ip netns exec "$NS" ethtool -K lo tso off gso off gro off >/dev/null 2>&1 || true
inns() { ip netns exec "$NS" "$@"; }

# record NAME PORT SERVER_ARGS -- CLIENT_COMMAND...
record() {
    name=$1 port=$2 sargs=$3; shift 3
    $LT serve --netns "$NS" --listen 127.0.0.1:$port $sargs >/dev/null 2>&1 &
    srv=$!
    $LT capture --netns "$NS" -i lo -s 200 -w "$name.pcap" tcp port $port >/dev/null 2>&1 &
    cap=$!
    sleep 1
    inns "$@" >/dev/null 2>&1 || true
    sleep 0.5
    kill -INT $cap; wait $cap || true
    kill $srv; wait $srv 2>/dev/null || true
    ls -l "$name.pcap"
}

record nagle-split 8081 "--nodelay off --split-writes" $LT load -c 1 -t 1 -n 20 http://127.0.0.1:8081/
record think-time 8082 "--think 15" $LT load -c 2 -t 1 -n 20 http://127.0.0.1:8082/
record cork 8083 "--cork" $LT load -c 1 -t 1 -n 4 http://127.0.0.1:8083/
# Loss at the receiving side's input (the capture on lo has seen the packet by then): 3% of
# the server's data segments, and every second SYN (syn-retransmit).
inns nft -f - <<'NFT'
table inet golden {
    chain in {
        type filter hook input priority 0;
        tcp sport 8084 meta length > 100 numgen random mod 33 == 0 drop
        tcp dport 8084 tcp flags & (syn|ack) == syn numgen inc mod 2 == 0 drop
    }
}
NFT
record loss 8084 "--body-size 20000" $LT load -c 3 -t 1 -n 40 http://127.0.0.1:8084/
inns nft delete table inet golden
# A reader with a small receive buffer that first does not read (zero-window), then reads
# slowly (window-full).
record slow-reader 8085 "--body-size 300000" python3 -c '
import socket, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.connect(("127.0.0.1", 8085))
s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
time.sleep(0.4)
got = 0
while got < 300000:
    b = s.recv(4096)
    if not b: break
    got += len(b)
    time.sleep(0.01)
s.close()
'
