// SPDX-License-Identifier: GPL-2.0
// Where the watched processes' threads wait: every time one of their threads leaves a CPU
// (sched:sched_switch, which runs in the leaving thread's context) its kernel stack and
// state are noted; when the thread next gets a CPU the block ends. Each block is summed in
// the kernel by (process, kernel stack, state), and one as long as `min_ns` or longer is
// also sent to user space (ring buffer) with its times, for the per-request split. Who
// woke a blocked thread (sched:sched_waking, which runs in the waker's context) is noted
// with its block: a thread woken by another process's write — an upstream's answer on a
// Unix or loopback socket, a pipe — names that process. No CO-RE: the records' layouts come
// from the tracepoints' format files through CONF.
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

#define STACK_DEPTH 24

// Written once by the loader before attaching (the layout of src/offcpu.rs's conf).
struct conf {
	__u32 prev_pid;   // offsets in the tracepoint's record
	__u32 prev_state;
	__u32 next_pid;
	__u32 waking_pid; // sched:sched_waking's pid (0: that program is not attached)
	__u64 min_ns;     // blocks at least this long go to the ring buffer
};

// A thread that left a CPU, until it gets one again.
struct start {
	__u64 ts;
	__s32 kstack;
	__u32 state;
	__u32 tgid;
	__u32 waker;      // the process whose thread woke it (0: none seen)
	__u64 woken;      // when it was first woken (0: not seen; a preempted thread is not)
};

struct total_key {
	__u32 tgid;
	__s32 kstack;
	__u32 state;
	__u32 pad;
};

struct total {
	__u64 ns;
	__u64 count;
};

// One block, as user space reads it from the ring buffer.
struct block {
	__u32 tid;
	__u32 tgid;
	__u64 start;
	__u64 end;
	__s32 kstack;
	__u32 state;
	__u32 waker;
	__u32 pad;
	__u64 woken;      // when it became runnable again (0: not seen): the rest is a wait for a CPU
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct conf);
} CONF SEC(".maps");

// The processes watched (tgid → 1).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, __u8);
} WATCH SEC(".maps");

// LRU: an entry whose thread never runs again (it exited and no switch-in ends its
// block) is evicted rather than filling the map.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct start);
} START SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 4096);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, STACK_DEPTH * sizeof(__u64));
} STACKS SEC(".maps");

// A stack map keeps one stack per bucket and refuses (-EEXIST) a second stack hashing to a
// taken one: that stack goes here instead (same hash, a smaller table whose bucket is free
// unless a third stack collided there too), its id marked with SPILL_BIT.
#define EEXIST 17
#define SPILL_BIT (1 << 24)

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 1024);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, STACK_DEPTH * sizeof(__u64));
} SPILL SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, struct total_key);
	__type(value, struct total);
} TOTALS SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} EVENTS SEC(".maps");

// [0]: blocks the ring buffer had no room for; [1]: blocks no map had room for (a thread
// that could not be noted, a total not summed).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} MISSED SEC(".maps");

static __always_inline __u32 rd32(const void *base, __u32 off)
{
	__u32 v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), (const char *)base + off);
	return v;
}

static __always_inline void missed(__u32 i)
{
	__u64 *m = bpf_map_lookup_elem(&MISSED, &i);
	if (m)
		__sync_fetch_and_add(m, 1);
}

// The id of the switching-out thread's kernel stack, spilled when STACKS refuses it.
static __always_inline __s32 kstack_id(void *ctx)
{
	__s32 id = bpf_get_stackid(ctx, &STACKS, 0);
	if (id != -EEXIST)
		return id;
	id = bpf_get_stackid(ctx, &SPILL, 0);
	return id < 0 ? id : id | SPILL_BIT;
}

SEC("tracepoint/sched/sched_switch")
int sched_switch(void *ctx)
{
	__u32 zero = 0;
	const struct conf *c = bpf_map_lookup_elem(&CONF, &zero);
	if (!c)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	__u32 prev = rd32(ctx, c->prev_pid);
	if (prev && bpf_map_lookup_elem(&WATCH, &tgid)) {
		// The low byte: 0 runnable (preempted), 1 S, 2 D, 0x80 I (TASK_REPORT_IDLE);
		// 0x10 X / 0x20 Z: the thread is exiting and will not run again (its tid may
		// be reused by another thread, whose first run must not end a block of this one).
		__u32 state = rd32(ctx, c->prev_state);
		if (state & 0x30) {
			bpf_map_delete_elem(&START, &prev);
		} else {
			struct start s = {};
			s.ts = now;
			s.kstack = kstack_id(ctx);
			s.state = state;
			s.tgid = tgid;
			if (bpf_map_update_elem(&START, &prev, &s, BPF_ANY))
				missed(1);
		}
	}
	__u32 next = rd32(ctx, c->next_pid);
	struct start *s = bpf_map_lookup_elem(&START, &next);
	if (!s)
		return 0;
	__u64 dur = now - s->ts;
	struct total_key k = {};
	k.tgid = s->tgid;
	k.kstack = s->kstack;
	k.state = s->state;
	struct total *t = bpf_map_lookup_elem(&TOTALS, &k);
	if (t) {
		__sync_fetch_and_add(&t->ns, dur);
		__sync_fetch_and_add(&t->count, 1);
	} else {
		struct total one = {dur, 1};
		if (bpf_map_update_elem(&TOTALS, &k, &one, BPF_NOEXIST)) {
			t = bpf_map_lookup_elem(&TOTALS, &k);
			if (t) {
				__sync_fetch_and_add(&t->ns, dur);
				__sync_fetch_and_add(&t->count, 1);
			} else {
				missed(1);
			}
		}
	}
	if (dur >= c->min_ns) {
		struct block *b = bpf_ringbuf_reserve(&EVENTS, sizeof(*b), 0);
		if (b) {
			b->tid = next;
			b->tgid = s->tgid;
			b->start = s->ts;
			b->end = now;
			b->kstack = s->kstack;
			b->state = s->state;
			b->waker = s->waker;
			b->pad = 0;
			b->woken = s->woken;
			bpf_ringbuf_submit(b, 0);
		} else {
			missed(0);
		}
	}
	bpf_map_delete_elem(&START, &next);
	return 0;
}

// A watched thread that is off its CPU is being woken: note who wakes it — the current
// process, as this tracepoint runs in the waker's context (in an interrupt, whatever ran
// there: user space names a waker only where one process woke most of a wait).
SEC("tracepoint/sched/sched_waking")
int sched_waking(void *ctx)
{
	__u32 zero = 0;
	const struct conf *c = bpf_map_lookup_elem(&CONF, &zero);
	if (!c || !c->waking_pid)
		return 0;
	__u32 pid = rd32(ctx, c->waking_pid);
	struct start *s = bpf_map_lookup_elem(&START, &pid);
	if (s) {
		s->waker = bpf_get_current_pid_tgid() >> 32;
		// The first wake-up: the thread is runnable from then on, later ones are no-ops.
		if (!s->woken)
			s->woken = bpf_ktime_get_ns();
	}
	return 0;
}
