// SPDX-License-Identifier: GPL-2.0
// The socket-call recorder of `lagtrace sockets --record`: on the syscall tracepoints of
// socket, bind, listen, connect, accept, accept4, setsockopt, getsockopt, close and the
// descriptor duplicators (dup, dup2, dup3, fcntl F_DUPFD) it keeps
// only the calls of the traced processes (TGIDS: a hash of thread-group ids, extended on
// fork), reads what strace shows of user memory (option values, addresses) and sends one
// event per completed call to user space through a ring buffer. Nothing stops the traced
// program. Built by build.rs (clang -target bpf, CO-RE), loaded by src/record/bpf.rs (aya).
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

#define DATA_MAX 128

enum { EV_CALL = 1, EV_FORK = 2, EV_EXIT = 3, EV_THREAD = 4 };

// One completed call (EV_CALL), a new process or thread of a traced one, or a traced
// process gone. Mirrored by `RawEvent` in src/record/bpf.rs.
struct event {
	__u64 time_ns;
	__u32 kind;
	__u32 tgid;
	__u32 tid;
	__u32 nr;     // EV_CALL: syscall number; EV_FORK/EV_THREAD: the new tgid/tid
	__s64 ret;    // EV_CALL: return value; EV_EXIT: exit code
	__u64 args[6];
	__u32 len;    // bytes of data read (0: unreadable or nothing to read)
	__u32 len2;   // getsockopt/accept: the length the kernel wrote back
	__u8 data[DATA_MAX];
};

// A call entered, waiting for its exit (per thread; the entry stays for the thread's next
// call, so the hot path neither allocates nor frees map elements).
struct pending {
	__u64 args[6];
	__u32 nr;
	__u32 len;
	__u32 active; // entered, exit not seen yet
	__u32 pad;
	__u8 data[DATA_MAX];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u8);
} TGIDS SEC(".maps");

// [0]: the thread id whose next child process is traced (-- CMD), 0 when none;
// [1]: whether to report close(fd >= 3).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u32);
} CONFIG SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct pending);
} PENDING SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pending);
} SCRATCH SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20);
} EVENTS SEC(".maps");

// [0]: events the ring buffer had no room for; [1]: calls whose entry found no room in
// PENDING (lost too).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} LOST SEC(".maps");

// Wake the reader only when a batch has piled up: a wake-up per event would put a context
// switch on every recorded call. The reader also polls with a short timeout.
#define WAKE_AT (512 << 10)

static __always_inline void submit(void *e)
{
	__u64 flags = bpf_ringbuf_query(&EVENTS, BPF_RB_AVAIL_DATA) >= WAKE_AT ? BPF_RB_FORCE_WAKEUP
									    : BPF_RB_NO_WAKEUP;
	bpf_ringbuf_submit(e, flags);
}

static __always_inline void lost(__u32 i)
{
	__u64 *n = bpf_map_lookup_elem(&LOST, &i);
	if (n)
		__sync_fetch_and_add(n, 1);
}

static __always_inline int traced(__u32 tgid)
{
	return bpf_map_lookup_elem(&TGIDS, &tgid) != 0;
}

static __always_inline __u32 clamp(__u64 len)
{
	return len > DATA_MAX ? DATA_MAX : (__u32)len;
}

// The call's `nargs` arguments (the rest 0). Only those: a syscall tracepoint's record ends
// after its own arguments, and attaching a program that reads past it fails (EACCES). One
// load per argument: a loop would walk a pointer into ctx, which the verifier refuses.
static __always_inline void copy_args(__u64 *a, struct trace_event_raw_sys_enter *ctx, int nargs)
{
	a[0] = nargs > 0 ? ctx->args[0] : 0;
	a[1] = nargs > 1 ? ctx->args[1] : 0;
	a[2] = nargs > 2 ? ctx->args[2] : 0;
	a[3] = nargs > 3 ? ctx->args[3] : 0;
	a[4] = nargs > 4 ? ctx->args[4] : 0;
	a[5] = nargs > 5 ? ctx->args[5] : 0;
}

// Entry: keep the arguments, and args[lenarg] bytes of user memory at args[ptr] (-1: none).
static __always_inline int enter(struct trace_event_raw_sys_enter *ctx, int nargs, int ptr,
				 int lenarg)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id, zero = 0;
	if (!traced(tgid))
		return 0;
	struct pending *p = bpf_map_lookup_elem(&PENDING, &tid);
	if (!p) {
		// The thread's first call: an entry from the zeroed scratch value.
		struct pending *z = bpf_map_lookup_elem(&SCRATCH, &zero);
		if (!z || bpf_map_update_elem(&PENDING, &tid, z, BPF_ANY)) {
			lost(1);
			return 0;
		}
		p = bpf_map_lookup_elem(&PENDING, &tid);
		if (!p)
			return 0;
	}
	p->nr = (__u32)ctx->id;
	p->len = 0;
	copy_args(p->args, ctx, nargs);
	if (ptr >= 0 && ptr < 6 && lenarg >= 0 && lenarg < 6) {
		__u32 len = clamp(p->args[lenarg]);
		const void *src = (const void *)p->args[ptr];
		if (len > 0 && src && bpf_probe_read_user(p->data, len, src) == 0)
			p->len = len;
	}
	p->active = 1;
	return 0;
}

// Exit: one event with the entry's arguments and data, the result, and for accept and
// getsockopt what the kernel wrote back (`ptr`: the buffer, `lenp`: its length's address).
static __always_inline int leave(struct trace_event_raw_sys_exit *ctx, int ptr, int lenp)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	if (!traced(tgid))
		return 0;
	struct pending *p = bpf_map_lookup_elem(&PENDING, &tid);
	if (!p || !p->active)
		return 0; // entered before we attached
	p->active = 0;
	struct event *e = bpf_ringbuf_reserve(&EVENTS, sizeof(*e), 0);
	if (!e) {
		lost(0);
		return 0;
	}
	e->time_ns = bpf_ktime_get_ns();
	e->kind = EV_CALL;
	e->tgid = tgid;
	e->tid = tid;
	e->nr = p->nr;
	e->ret = ctx->ret;
	e->len2 = 0;
	__builtin_memcpy(e->args, p->args, sizeof(e->args));
	__builtin_memcpy(e->data, p->data, DATA_MAX);
	e->len = p->len;
	if (ptr >= 0 && ptr < 6 && lenp >= 0 && lenp < 6 && ctx->ret >= 0) {
		__u32 n = 0;
		const void *lp = (const void *)p->args[lenp];
		const void *src = (const void *)p->args[ptr];
		e->len = 0;
		if (lp && src && bpf_probe_read_user(&n, sizeof(n), lp) == 0) {
			e->len2 = n;
			__u32 len = clamp(n);
			if (len > 0 && bpf_probe_read_user(e->data, len, src) == 0)
				e->len = len;
		}
	}
	submit(e);
	return 0;
}

#define ENTER(name, nargs, ptr, lenarg)                                            \
	SEC("tracepoint/syscalls/sys_enter_" #name)                                \
	int enter_##name(struct trace_event_raw_sys_enter *ctx)                    \
	{                                                                          \
		return enter(ctx, nargs, ptr, lenarg);                             \
	}
#define LEAVE(name, ptr, lenp)                                                     \
	SEC("tracepoint/syscalls/sys_exit_" #name)                                 \
	int exit_##name(struct trace_event_raw_sys_exit *ctx)                      \
	{                                                                          \
		return leave(ctx, ptr, lenp);                                      \
	}

ENTER(socket, 3, -1, -1)
LEAVE(socket, -1, -1)
ENTER(bind, 3, 1, 2)
LEAVE(bind, -1, -1)
ENTER(listen, 2, -1, -1)
LEAVE(listen, -1, -1)
ENTER(connect, 3, 1, 2)
LEAVE(connect, -1, -1)
ENTER(accept, 3, -1, -1)
LEAVE(accept, 1, 2)
ENTER(accept4, 4, -1, -1)
LEAVE(accept4, 1, 2)
ENTER(setsockopt, 5, 3, 4)
LEAVE(setsockopt, -1, -1)
ENTER(getsockopt, 5, -1, -1)
LEAVE(getsockopt, 3, 4)
// A socket's other descriptors (user space keeps only the duplicates of known sockets).
ENTER(dup, 1, -1, -1)
LEAVE(dup, -1, -1)
ENTER(dup2, 2, -1, -1)
LEAVE(dup2, -1, -1)
ENTER(dup3, 3, -1, -1)
LEAVE(dup3, -1, -1)
LEAVE(fcntl, -1, -1)

// fcntl: only F_DUPFD and F_DUPFD_CLOEXEC (programs call F_GETFL/F_SETFL per connection).
SEC("tracepoint/syscalls/sys_enter_fcntl")
int enter_fcntl(struct trace_event_raw_sys_enter *ctx)
{
	__u64 cmd = ctx->args[1];
	if (cmd != 0 && cmd != 1030)
		return 0;
	return enter(ctx, 3, -1, -1);
}

// close(fd >= 3): reported at entry (the descriptor is released whatever close returns).
SEC("tracepoint/syscalls/sys_enter_close")
int enter_close(struct trace_event_raw_sys_enter *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, one = 1;
	if (ctx->args[0] < 3 || !traced(tgid))
		return 0;
	__u32 *on = bpf_map_lookup_elem(&CONFIG, &one);
	if (!on || !*on)
		return 0;
	struct event *e = bpf_ringbuf_reserve(&EVENTS, sizeof(*e), 0);
	if (!e) {
		lost(0);
		return 0;
	}
	e->time_ns = bpf_ktime_get_ns();
	e->kind = EV_CALL;
	e->tgid = tgid;
	e->tid = (__u32)id;
	e->nr = (__u32)ctx->id;
	e->ret = 0;
	e->len = 0;
	e->len2 = 0;
	copy_args(e->args, ctx, 1);
	submit(e);
	return 0;
}

static __always_inline void notify(__u32 kind, __u32 tgid, __u32 tid, __u32 other, __s64 ret)
{
	struct event *e = bpf_ringbuf_reserve(&EVENTS, sizeof(*e), 0);
	if (!e) {
		lost(0);
		return;
	}
	e->time_ns = bpf_ktime_get_ns();
	e->kind = kind;
	e->tgid = tgid;
	e->tid = tid;
	e->nr = other;
	e->ret = ret;
	e->len = 0;
	e->len2 = 0;
	submit(e);
}

// A new task: a child process of a traced one (or of the launcher thread) is traced too.
SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 ptgid = parent->tgid, ppid = parent->pid, ctgid = child->tgid, ctid = child->pid;
	__u32 zero = 0;
	__u8 yes = 1;
	if (traced(ptgid)) {
		if (ctgid == ptgid) {
			notify(EV_THREAD, ptgid, ppid, ctid, 0);
			return 0;
		}
	} else {
		__u32 *launcher = bpf_map_lookup_elem(&CONFIG, &zero);
		if (!launcher || !*launcher || *launcher != ppid || ctgid == ptgid)
			return 0;
	}
	bpf_map_update_elem(&TGIDS, &ctgid, &yes, BPF_ANY);
	notify(EV_FORK, ptgid, ppid, ctgid, 0);
	return 0;
}

// A traced task ends: its pending call is dropped; when the whole process is gone it
// leaves TGIDS (its pid may be reused) and user space hears of it.
SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *task, bool group_dead)
{
	__u32 tgid = task->tgid, tid = task->pid;
	if (!traced(tgid))
		return 0;
	bpf_map_delete_elem(&PENDING, &tid);
	if (!group_dead)
		return 0;
	bpf_map_delete_elem(&TGIDS, &tgid);
	notify(EV_EXIT, tgid, tid, 0, task->signal->group_exit_code);
	return 0;
}
