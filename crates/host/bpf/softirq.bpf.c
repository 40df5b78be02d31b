// SPDX-License-Identifier: GPL-2.0
// The kernel's own packet processing: the time each CPU spends in the network softirqs
// (NET_TX = 2, NET_RX = 3), from softirq_entry to softirq_exit. The kernel counts softirq
// time in /proc/stat only per scheduler tick unless it was built with IRQ_TIME_ACCOUNTING;
// this is exact. Softirqs do not nest on one CPU, so one start per CPU suffices.
//
// Which namespace the time was spent for: within a receive softirq the backlog (loopback,
// veth) and most drivers hand the packets to the stack one at a time (netif_receive_skb
// fires as each one enters it) and each is carried through IP, netfilter's hooks and TCP
// before the next: the time from one packet's entry to the next one's, or to the end of its
// NAPI poll (napi_poll), is that packet's. A packet received on a device of the watched
// namespace counts for it. Two known limits: a driver that batches GRO lists hands a whole
// batch over before IP sees any of it (the batch's time lands on its last packet), and a
// packet's device is the one it arrived on (macvlan or VLAN devices moved into a namespace
// count for the lower device's).
//
// The wait before it: a packet handed to the stack through a CPU's backlog queue
// (netif_rx: loopback, veth, tun, and RPS steering it to another CPU) waits there until
// that CPU's receive softirq takes it; behind a flood the queue is long. The watched
// namespace's TCP packets are timed from netif_rx to netif_receive_skb (the flood's
// UDP is not: a map update per packet at a flood's rate would cost more than it tells).
// A packet a driver's NAPI poll hands over directly has no queue this can see (its wait
// is in the device's ring): nothing is timed for it. The loader attaches netif_rx only once
// a CPU is busy in the receive softirq (src/softirq.rs): a queue needs a busy CPU, and on
// an idle machine the program would cost a run per packet for nothing.
//
// At high packet rates the loader runs the programs in phases (attached for a share of each
// half second, src/softirq.rs) and scales the sums to the window: a softirq or a queued
// packet that straddles a detach is recognised by its age and not counted.
//
// Raw tracepoints: no perf record is built for each event (the three fire on every softirq
// and every packet of the machine). No CO-RE: the kernel structs' offsets come from its BTF
// through CONF.
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

#define NET_TX 2
#define NET_RX 3

// Written once by the loader before attaching (the layout of src/softirq.rs's conf).
struct conf {
	__u32 skb_dev;      // sk_buff.dev
	__u32 dev_net;      // net_device.nd_net.net
	__u32 net_inum;     // net.ns.inum
	__u32 watch_netns;  // the watched namespace's inode
	__u32 skb_protocol; // sk_buff.protocol (big-endian ethertype)
	__u32 skb_data;     // sk_buff.data (the network header once the link layer is pulled)
};

// One CPU's sums (the layout src/softirq.rs reads).
struct acc {
	__u64 rx_ns;
	__u64 rx_runs;
	__u64 tx_ns;
	__u64 tx_runs;
	__u64 start;       // when the running network softirq started, 0 when none runs
	__u64 vec;         // which one
	__u64 ns_ns;       // receive time of the watched namespace's packets
	__u64 ns_packets;  // the watched namespace's packets
	__u64 pkt_ts;      // when the packet being processed entered the stack, 0: none
	__u64 pkt_watched; // whether it is the watched namespace's
	__u64 last_dev;    // the device of the last packet, and whether it is the watched
	__u64 last_watched; // namespace's (packets come in runs from one device)
	__u64 q_ns;        // the watched namespace's TCP packets' waits in a backlog queue
	__u64 q_packets;   // and how many were timed
	__u64 q_max_ns;    // the longest
	__u64 q_last_dev;  // netif_rx's own device cache (it runs on the sending CPU,
	__u64 q_last_watched; // outside the receive softirq)
};

// Backlog waits by size, in µs: 0–3 one each, then four buckets per power of two
// (src/softirq.rs's `wait_bucket` inverts it).
#define QBUCKETS 128 // a power of two: the index is masked for the verifier
struct qhist {
	__u64 n[QBUCKETS];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct conf);
} CONF SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct acc);
} ACC SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct qhist);
} QHIST SEC(".maps");

// The packets being timed: a slot per sk_buff address hash, holding the address and when
// it entered a backlog queue. A packet whose slot is taken goes untimed (64 slots, each freed
// as its packet leaves the queue: a few µs, a flood's queue a few hundred): an array write
// per packet where a hash map's update cost as much again as the rest of the timer. A slot
// whose packet never left (merged by GRO, dropped with the queue full) is free again after
// STALE_NS.
// A softirq start older than this is one whose exit was not seen (the programs detached
// between the two): no softirq runs 100 ms.
#define STALE_START_NS 100000000ULL

#define QSLOTS 64
#define STALE_NS 100000000ULL
struct qslot {
	__u64 skb;
	__u64 ts;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, QSLOTS);
	__type(key, __u32);
	__type(value, struct qslot);
} QSLOT SEC(".maps");

static __always_inline struct qslot *slot_of(__u64 skb)
{
	__u32 i = (__u32)((skb >> 8) ^ (skb >> 14)) & (QSLOTS - 1);
	return bpf_map_lookup_elem(&QSLOT, &i);
}

static __always_inline __u64 rd64(__u64 base, __u32 off)
{
	__u64 v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), (const char *)base + off);
	return v;
}

// The packet in process ends at `now`: its time goes to the watched namespace's if it was
// one of its packets.
static __always_inline void end_packet(struct acc *a, __u64 now)
{
	if (a->pkt_ts && a->pkt_watched)
		a->ns_ns += now - a->pkt_ts;
	a->pkt_ts = 0;
}

// Whether `dev` is in the watched namespace.
static __always_inline int dev_watched(struct conf *c, __u64 dev)
{
	__u64 net = dev ? rd64(dev, c->dev_net) : 0;
	__u32 inum = 0;
	if (net)
		bpf_probe_read_kernel(&inum, sizeof(inum), (const char *)net + c->net_inum);
	return inum && inum == c->watch_netns;
}

static __always_inline __u32 log2_u64(__u64 v)
{
	__u32 r = 0;
	if (v >> 32) { v >>= 32; r += 32; }
	if (v >> 16) { v >>= 16; r += 16; }
	if (v >> 8) { v >>= 8; r += 8; }
	if (v >> 4) { v >>= 4; r += 4; }
	if (v >> 2) { v >>= 2; r += 2; }
	if (v >> 1) { r += 1; }
	return r;
}

static __always_inline __u32 wait_bucket(__u64 us)
{
	__u32 msb, idx;
	if (us < 4)
		return (__u32)us;
	msb = log2_u64(us);
	idx = 4 + (msb - 2) * 4 + (__u32)((us >> (msb - 2)) & 3);
	return idx < QBUCKETS ? idx : QBUCKETS - 1;
}

// The packet `skb` entered the stack: the end of its wait in a backlog queue, when it was
// timed into one.
static __always_inline void end_wait(struct acc *a, __u64 skb, __u64 now)
{
	__u32 zero = 0;
	struct qslot *q = slot_of(skb);
	struct qhist *h;
	__u64 d;
	__u32 b;
	if (!q || q->skb != skb)
		return;
	d = now > q->ts ? now - q->ts : 0;
	q->skb = 0;
	// Timed before the programs were last detached (the loader runs them in phases at high
	// packet rates) and its address reused since: no wait of its own.
	if (d > STALE_NS)
		return;
	a->q_ns += d;
	a->q_packets += 1;
	if (d > a->q_max_ns)
		a->q_max_ns = d;
	h = bpf_map_lookup_elem(&QHIST, &zero);
	if (!h)
		return;
	b = wait_bucket(d / 1000);
	// Opaque to the compiler, so that the mask the verifier needs is not optimised away.
	asm volatile("" : "+r"(b));
	h->n[b & (QBUCKETS - 1)] += 1;
}

// netif_rx(struct sk_buff *skb): a packet queued to a CPU's backlog. The watched
// namespace's TCP packets are timed from here.
SEC("raw_tracepoint/netif_rx")
int netif_rx(__u64 *ctx)
{
	__u32 zero = 0;
	struct acc *a = bpf_map_lookup_elem(&ACC, &zero);
	struct conf *c = bpf_map_lookup_elem(&CONF, &zero);
	__u64 skb = ctx[0], dev, data, now;
	struct qslot *q;
	__u16 proto = 0;
	__u8 l4 = 0;
	if (!a || !c || !skb)
		return 0;
	dev = rd64(skb, c->skb_dev);
	if (!dev)
		return 0;
	if (dev != a->q_last_dev) {
		a->q_last_dev = dev;
		a->q_last_watched = dev_watched(c, dev);
	}
	if (!a->q_last_watched)
		return 0;
	bpf_probe_read_kernel(&proto, sizeof(proto), (const char *)skb + c->skb_protocol);
	data = rd64(skb, c->skb_data);
	if (!data)
		return 0;
	if (proto == __builtin_bswap16(0x0800))
		bpf_probe_read_kernel(&l4, 1, (const char *)data + 9);
	else if (proto == __builtin_bswap16(0x86DD))
		bpf_probe_read_kernel(&l4, 1, (const char *)data + 6);
	if (l4 != 6)
		return 0;
	now = bpf_ktime_get_ns();
	q = slot_of(skb);
	if (!q || (q->skb && now - q->ts < STALE_NS))
		return 0;
	q->ts = now;
	q->skb = skb;
	return 0;
}

// softirq_entry(unsigned int vec_nr)
SEC("raw_tracepoint/softirq_entry")
int softirq_entry(__u64 *ctx)
{
	__u32 zero = 0;
	__u32 vec = (__u32)ctx[0];
	struct acc *a;
	if (vec != NET_RX && vec != NET_TX)
		return 0;
	a = bpf_map_lookup_elem(&ACC, &zero);
	if (!a)
		return 0;
	a->start = bpf_ktime_get_ns();
	a->vec = vec;
	a->pkt_ts = 0;
	return 0;
}

// softirq_exit(unsigned int vec_nr)
SEC("raw_tracepoint/softirq_exit")
int softirq_exit(__u64 *ctx)
{
	__u32 zero = 0;
	__u32 vec = (__u32)ctx[0];
	struct acc *a;
	__u64 now, d;
	if (vec != NET_RX && vec != NET_TX)
		return 0;
	a = bpf_map_lookup_elem(&ACC, &zero);
	if (!a || !a->start || a->vec != vec)
		return 0;
	now = bpf_ktime_get_ns();
	d = now - a->start;
	a->start = 0;
	if (d > STALE_START_NS) {
		a->pkt_ts = 0;
		return 0;
	}
	end_packet(a, now);
	if (vec == NET_RX) {
		a->rx_ns += d;
		a->rx_runs += 1;
	} else {
		a->tx_ns += d;
		a->tx_runs += 1;
	}
	return 0;
}

// netif_receive_skb(struct sk_buff *skb)
SEC("raw_tracepoint/netif_receive_skb")
int netif_receive_skb(__u64 *ctx)
{
	__u32 zero = 0;
	struct acc *a = bpf_map_lookup_elem(&ACC, &zero);
	struct conf *c;
	__u64 now, dev;
	// Only inside a receive softirq: the packets it takes one after the other.
	if (!a || !a->start || a->vec != NET_RX)
		return 0;
	now = bpf_ktime_get_ns();
	if (now - a->start > STALE_START_NS)
		return 0;
	end_packet(a, now);
	c = bpf_map_lookup_elem(&CONF, &zero);
	if (!c)
		return 0;
	dev = ctx[0] ? rd64(ctx[0], c->skb_dev) : 0;
	if (dev && dev == a->last_dev) {
		a->pkt_watched = a->last_watched;
	} else {
		a->pkt_watched = dev_watched(c, dev);
		a->last_dev = dev;
		a->last_watched = a->pkt_watched;
	}
	if (a->pkt_watched) {
		a->ns_packets += 1;
		end_wait(a, ctx[0], now);
	}
	a->pkt_ts = now;
	return 0;
}

// napi_poll(struct napi_struct *napi, int work, int budget): a poll ended; the packet in
// process ends with it (the next poll's driver work is not its time).
SEC("raw_tracepoint/napi_poll")
int napi_poll(__u64 *ctx)
{
	__u32 zero = 0;
	struct acc *a = bpf_map_lookup_elem(&ACC, &zero);
	__u64 now;
	if (!a || !a->start || a->vec != NET_RX || !a->pkt_ts)
		return 0;
	now = bpf_ktime_get_ns();
	if (now - a->start > STALE_START_NS)
		return 0;
	end_packet(a, now);
	return 0;
}
