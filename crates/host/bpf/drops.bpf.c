// SPDX-License-Identifier: GPL-2.0
// Drops by (network namespace, device, reason) from the skb:kfree_skb tracepoint, counted
// in the kernel; only the watched namespace's when `watch_netns` is set. Built by build.rs
// (clang -target bpf, CO-RE against the kernel's BTF), loaded by src/bpf.rs (aya).
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "GPL";

// Set by the loader: the watched namespace's inode (0: every namespace).
volatile const __u32 watch_netns = 0;

struct drop_key {
	__u32 netns;
	__u32 ifindex;
	__u32 reason;
	__u32 pad;
};

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

static __always_inline __u32 dev_netns(struct net_device *dev)
{
	return dev ? BPF_CORE_READ(dev, nd_net.net, ns.inum) : 0;
}

SEC("tracepoint/skb/kfree_skb")
int kfree_skb(struct trace_event_raw_kfree_skb *ctx)
{
	struct sk_buff *skb = (struct sk_buff *)BPF_CORE_READ(ctx, skbaddr);
	struct drop_key key = {};
	// The device it was received on or is leaving by; before the output device is set
	// (the output netfilter hook), the route's device.
	struct net_device *dev = BPF_CORE_READ(skb, dev);
	if (!dev) {
		unsigned long refdst = BPF_CORE_READ(skb, _skb_refdst);
		struct dst_entry *dst = (struct dst_entry *)(refdst & ~1UL);
		if (dst)
			dev = BPF_CORE_READ(dst, dev);
	}
	key.netns = dev_netns(dev);
	if (!key.netns) {
		struct sock *sk = BPF_CORE_READ(skb, sk);
		if (sk)
			key.netns = BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum);
	}
	if (watch_netns && key.netns != watch_netns)
		return 0;
	key.ifindex = dev ? BPF_CORE_READ(dev, ifindex) : 0;
	key.reason = BPF_CORE_READ(ctx, reason);
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
			__u32 zero = 0;
			__u64 *m = bpf_map_lookup_elem(&MISSED, &zero);
			if (m)
				__sync_fetch_and_add(m, 1);
		}
	}
	return 0;
}
