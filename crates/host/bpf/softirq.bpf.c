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
	__u64 now, dev, net;
	__u32 inum = 0;
	// Only inside a receive softirq: the packets it takes one after the other.
	if (!a || !a->start || a->vec != NET_RX)
		return 0;
	now = bpf_ktime_get_ns();
	end_packet(a, now);
	c = bpf_map_lookup_elem(&CONF, &zero);
	if (!c)
		return 0;
	dev = ctx[0] ? rd64(ctx[0], c->skb_dev) : 0;
	if (dev && dev == a->last_dev) {
		a->pkt_watched = a->last_watched;
	} else {
		net = dev ? rd64(dev, c->dev_net) : 0;
		if (net)
			bpf_probe_read_kernel(&inum, sizeof(inum), (const char *)net + c->net_inum);
		a->pkt_watched = inum && inum == c->watch_netns;
		a->last_dev = dev;
		a->last_watched = a->pkt_watched;
	}
	if (a->pkt_watched)
		a->ns_packets += 1;
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
	if (!a || !a->start || a->vec != NET_RX || !a->pkt_ts)
		return 0;
	end_packet(a, bpf_ktime_get_ns());
	return 0;
}
