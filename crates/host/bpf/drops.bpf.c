// SPDX-License-Identifier: GPL-2.0
// Drops by (network namespace, device, reason) from the skb:kfree_skb tracepoint, counted
// in the kernel; only the watched namespace's when `watch_netns` is set. No CO-RE: the
// loader (src/bpf.rs) reads the few struct offsets from the running kernel's BTF
// (src/btf.rs) and the record's layout from the tracepoint's format file, and passes them
// in the CONF map; every kernel read goes through bpf_probe_read_kernel.
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

// Written once by the loader before attaching (the layout of src/bpf.rs's Conf).
struct conf {
	__u32 watch_netns; // the watched namespace's inode (0: every namespace)
	__u32 skbaddr;     // in the tracepoint's record
	__u32 reason;      // in the tracepoint's record (4 bytes)
	__u32 skb_dev;     // sk_buff.dev
	__u32 skb_refdst;  // sk_buff._skb_refdst
	__u32 skb_sk;      // sk_buff.sk
	__u32 dst_dev;     // dst_entry.dev
	__u32 dev_net;     // net_device.nd_net.net
	__u32 net_inum;    // net.ns.inum
	__u32 dev_ifindex; // net_device.ifindex
	__u32 sk_net;      // sock.__sk_common.skc_net.net
	__u32 pad;
};

struct drop_key {
	__u32 netns;
	__u32 ifindex;
	__u32 reason;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct conf);
} CONF SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct drop_key);
	__type(value, __u64);
} DROPS SEC(".maps");

// Drops the map had no room for (a lower bound then).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} MISSED SEC(".maps");

static __always_inline __u64 rd64(const void *base, __u32 off)
{
	__u64 v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), (const char *)base + off);
	return v;
}

static __always_inline __u32 rd32(const void *base, __u32 off)
{
	__u32 v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), (const char *)base + off);
	return v;
}

// The namespace inode of a `struct net *`.
static __always_inline __u32 net_inum(const struct conf *c, __u64 net)
{
	return net ? rd32((const void *)net, c->net_inum) : 0;
}

SEC("tracepoint/skb/kfree_skb")
int kfree_skb(void *ctx)
{
	__u32 zero = 0;
	const struct conf *c = bpf_map_lookup_elem(&CONF, &zero);
	if (!c)
		return 0;
	const void *skb = (const void *)rd64(ctx, c->skbaddr);
	if (!skb)
		return 0;
	struct drop_key key = {};
	// The device it was received on or is leaving by; before the output device is set
	// (the output netfilter hook), the route's device.
	const void *dev = (const void *)rd64(skb, c->skb_dev);
	if (!dev) {
		__u64 dst = rd64(skb, c->skb_refdst) & ~1UL;
		if (dst)
			dev = (const void *)rd64((const void *)dst, c->dst_dev);
	}
	if (dev)
		key.netns = net_inum(c, rd64(dev, c->dev_net));
	if (!key.netns) {
		const void *sk = (const void *)rd64(skb, c->skb_sk);
		if (sk)
			key.netns = net_inum(c, rd64(sk, c->sk_net));
	}
	if (c->watch_netns && key.netns != c->watch_netns)
		return 0;
	key.ifindex = dev ? rd32(dev, c->dev_ifindex) : 0;
	key.reason = rd32(ctx, c->reason);
	__u64 *n = bpf_map_lookup_elem(&DROPS, &key);
	if (n) {
		__sync_fetch_and_add(n, 1);
		return 0;
	}
	__u64 one = 1;
	if (bpf_map_update_elem(&DROPS, &key, &one, BPF_NOEXIST)) {
		n = bpf_map_lookup_elem(&DROPS, &key);
		if (n) {
			__sync_fetch_and_add(n, 1);
		} else {
			__u64 *m = bpf_map_lookup_elem(&MISSED, &zero);
			if (m)
				__sync_fetch_and_add(m, 1);
		}
	}
	return 0;
}
