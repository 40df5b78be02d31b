// SPDX-License-Identifier: GPL-2.0
// Where the watched processes' threads are while on a CPU: a CPU-clock sampling event on
// every CPU runs this program (in the interrupted thread's context) `hz` times a second; a
// sample of a watched process keeps its kernel stack (when it was in the kernel) and its
// user stack, counted in the kernel by (process, kernel stack, user stack). Like bcc's
// `profile`, but only the watched processes' samples are kept.
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

#define STACK_DEPTH 24
#define EEXIST 17

struct key {
	__u32 tgid;
	__s32 kstack; // < 0: the sample was in user mode (no kernel stack)
	__s32 ustack; // < 0: no user stack (a kernel thread)
	__u32 pad;
};

// The processes watched (tgid → 1).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, __u8);
} WATCH SEC(".maps");

// 16384 buckets x 192 B: 3 MiB. A stack map keeps one stack per bucket: a second stack
// that hashes to a taken bucket is refused (-EEXIST). With a few dozen distinct stacks that
// happens in one window in twenty, and every sample of that stack would lose it; so the
// refused stack goes to SPILL (same hash, a smaller table: the bucket is free unless a third
// stack collides there too), its id marked with SPILL_BIT. Only a stack both refuse is lost
// (counted in MISSED[0]).
struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 16384);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, STACK_DEPTH * sizeof(__u64));
} STACKS SEC(".maps");

#define SPILL_BIT (1 << 24)

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 4096);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, STACK_DEPTH * sizeof(__u64));
} SPILL SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct key);
	__type(value, __u64);
} COUNTS SEC(".maps");

// [0]: samples that lost a stack (a stack-id collision, or the stack map full): counted,
// without that stack; [1]: samples not counted (the count map full).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} MISSED SEC(".maps");

static __always_inline void missed(__u32 i)
{
	__u64 *m = bpf_map_lookup_elem(&MISSED, &i);
	if (m)
		__sync_fetch_and_add(m, 1);
}

// The id of the interrupted thread's stack (`flags`: kernel or user), spilled when STACKS
// refuses it; < 0 when there is none (-EFAULT: no user stack) or both refuse it (-EEXIST).
static __always_inline __s32 stack_id(struct bpf_perf_event_data *ctx, __u64 flags)
{
	__s32 id = bpf_get_stackid(ctx, &STACKS, flags);
	if (id != -EEXIST)
		return id;
	id = bpf_get_stackid(ctx, &SPILL, flags);
	return id < 0 ? id : id | SPILL_BIT;
}

SEC("perf_event")
int oncpu_sample(struct bpf_perf_event_data *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!tgid || !bpf_map_lookup_elem(&WATCH, &tgid))
		return 0;
	struct key k = {};
	k.tgid = tgid;
	k.kstack = stack_id(ctx, 0);
	k.ustack = stack_id(ctx, BPF_F_USER_STACK);
	if (k.kstack == -EEXIST || k.ustack == -EEXIST)
		missed(0);
	__u64 *n = bpf_map_lookup_elem(&COUNTS, &k);
	if (n) {
		__sync_fetch_and_add(n, 1);
		return 0;
	}
	__u64 one = 1;
	if (bpf_map_update_elem(&COUNTS, &k, &one, BPF_NOEXIST)) {
		n = bpf_map_lookup_elem(&COUNTS, &k);
		if (n)
			__sync_fetch_and_add(n, 1);
		else
			missed(1);
	}
	return 0;
}
