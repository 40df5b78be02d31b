// SPDX-License-Identifier: GPL-2.0
// The socket-call recorder of `lagtrace sockets --record`. It keeps only the calls of the
// traced processes (TGIDS: a hash of thread-group ids, extended on fork), reads what strace
// shows of user memory (option values, addresses) and sends one event per completed call
// to user space through a ring buffer. Nothing stops the traced program.
//
// Two sets of hooks for the same calls (socket, bind, listen, connect, accept, accept4,
// setsockopt, getsockopt, close and the descriptor duplicators dup, dup2, dup3, fcntl
// F_DUPFD), the loader (src/record/bpf.rs) attaches one:
// - fexit on the syscalls' own entry points (`__x64_sys_*`, BPF trampolines): one program
//   per call sees its arguments and its result, and only calls of these functions pay.
// - the `syscalls:sys_enter_*`/`sys_exit_*` tracepoints (kernels without trampolines):
//   enabling any of them puts every syscall of every task on the tracing slow path;
// - (asked for only) one program on the raw `sys_exit` tracepoint, by syscall number.
// Forks and exits come from the classic `sched` tracepoints. No CO-RE and no kernel
// headers: the record layouts are checked against tracefs by the loader.
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

#define DATA_MAX 128

enum { EV_CALL = 1, EV_FORK = 2, EV_EXIT = 3 };

// x86_64 syscall numbers of the calls (the event's `nr`, whichever hook saw it).
enum {
	NR_CLOSE = 3,
	NR_DUP = 32,
	NR_DUP2 = 33,
	NR_SOCKET = 41,
	NR_CONNECT = 42,
	NR_ACCEPT = 43,
	NR_BIND = 49,
	NR_LISTEN = 50,
	NR_SETSOCKOPT = 54,
	NR_GETSOCKOPT = 55,
	NR_FCNTL = 72,
	NR_ACCEPT4 = 288,
	NR_DUP3 = 292,
};

// One completed call (EV_CALL), a new task of a traced process, or a traced process gone.
// Mirrored by `RawEvent` in src/record/bpf.rs.
struct event {
	__u64 time_ns;
	__u32 kind;
	__u32 tgid;
	__u32 tid;
	__u32 nr;     // EV_CALL: syscall number; EV_FORK: the new task's id
	__s64 ret;    // EV_CALL: return value
	__u64 args[6];
	__u32 len;    // bytes of data read (0: unreadable or nothing to read)
	__u32 len2;   // getsockopt/accept: the length the kernel wrote back
	__u8 data[DATA_MAX];
};

// A call entered, waiting for its exit (tracepoint hooks; per thread, the entry stays for
// the thread's next call, so the hot path neither allocates nor frees map elements).
struct pending {
	__u64 args[6];
	__u32 nr;
	__u32 len;
	__u32 active; // entered, exit not seen yet
	__u32 pad;
	__u8 data[DATA_MAX];
};

// The maps; the loader creates them from its own table (src/record/bpf.rs MAPS).
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

static __always_inline struct event *new_event(__u32 kind, __u64 id, __u32 nr, __s64 ret)
{
	struct event *e = bpf_ringbuf_reserve(&EVENTS, sizeof(*e), 0);
	if (!e) {
		lost(0);
		return 0;
	}
	e->time_ns = bpf_ktime_get_ns();
	e->kind = kind;
	e->tgid = id >> 32;
	e->tid = (__u32)id;
	e->nr = nr;
	e->ret = ret;
	e->len = 0;
	e->len2 = 0;
	return e;
}

// What the kernel wrote back to user memory (accept's address, getsockopt's value):
// `lenp` holds the length's address, `buf` the buffer's.
static __always_inline void read_back(struct event *e, __u64 buf, __u64 lenp)
{
	__u32 n = 0;
	if (lenp && buf && bpf_probe_read_user(&n, sizeof(n), (const void *)lenp) == 0) {
		e->len2 = n;
		__u32 len = clamp(n);
		if (len > 0 && bpf_probe_read_user(e->data, len, (const void *)buf) == 0)
			e->len = len;
	}
}

// ---- fexit on __x64_sys_* -----------------------------------------------------------------

// The syscall's arguments from its saved registers (struct pt_regs: di, si, dx, r10, r8,
// r9; the layout of the x86_64 ABI, as in <asm/ptrace.h>).
static __always_inline void sys_args(__u64 *a, __u64 regs)
{
	__u64 r[15] = {};
	bpf_probe_read_kernel(r, sizeof(r), (const void *)regs);
	a[0] = r[14];
	a[1] = r[13];
	a[2] = r[12];
	a[3] = r[7];
	a[4] = r[9];
	a[5] = r[8];
}

// One completed call: its arguments, result, and user memory: `len` bytes at args[ptr]
// (`len` from args[lenarg]) as the program passed them, or (lenp >= 0) what the kernel
// wrote back to args[ptr] with its length at args[lenp].
static __always_inline int done(__u64 regs, __s64 ret, __u32 nr, int ptr, int lenarg, int lenp)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!traced(id >> 32))
		return 0;
	__u64 a[6];
	sys_args(a, regs);
	if (nr == NR_FCNTL && a[1] != 0 && a[1] != 1030)
		return 0; // only F_DUPFD and F_DUPFD_CLOEXEC
	struct event *e = new_event(EV_CALL, id, nr, ret);
	if (!e)
		return 0;
	__builtin_memcpy(e->args, a, sizeof(a));
	if (ptr >= 0 && ptr < 6 && lenp >= 0 && lenp < 6) {
		if (ret >= 0)
			read_back(e, a[ptr], a[lenp]);
	} else if (ptr >= 0 && ptr < 6 && lenarg >= 0 && lenarg < 6) {
		__u32 len = clamp(a[lenarg]);
		if (len > 0 && a[ptr] && bpf_probe_read_user(e->data, len, (const void *)a[ptr]) == 0)
			e->len = len;
	}
	submit(e);
	return 0;
}

#define FEXIT(name, nr, ptr, lenarg, lenp)                                         \
	SEC("fexit/__x64_sys_" #name)                                              \
	int fx_##name(__u64 *ctx)                                                  \
	{                                                                          \
		return done(ctx[0], (__s64)ctx[1], nr, ptr, lenarg, lenp);         \
	}

FEXIT(socket, NR_SOCKET, -1, -1, -1)
FEXIT(bind, NR_BIND, 1, 2, -1)
FEXIT(listen, NR_LISTEN, -1, -1, -1)
FEXIT(connect, NR_CONNECT, 1, 2, -1)
FEXIT(accept, NR_ACCEPT, 1, -1, 2)
FEXIT(accept4, NR_ACCEPT4, 1, -1, 2)
FEXIT(setsockopt, NR_SETSOCKOPT, 3, 4, -1)
FEXIT(getsockopt, NR_GETSOCKOPT, 3, -1, 4)
FEXIT(dup, NR_DUP, -1, -1, -1)
FEXIT(dup2, NR_DUP2, -1, -1, -1)
FEXIT(dup3, NR_DUP3, -1, -1, -1)
FEXIT(fcntl, NR_FCNTL, -1, -1, -1)

static __always_inline int closing(__u64 fd)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 one = 1;
	if (fd < 3 || !traced(id >> 32))
		return 0;
	__u32 *on = bpf_map_lookup_elem(&CONFIG, &one);
	if (!on || !*on)
		return 0;
	struct event *e = new_event(EV_CALL, id, NR_CLOSE, 0);
	if (!e)
		return 0;
	__builtin_memset(e->args, 0, sizeof(e->args));
	e->args[0] = fd;
	submit(e);
	return 0;
}

// close(fd >= 3): reported at entry (the descriptor is released whatever close returns).
SEC("fentry/__x64_sys_close")
int fe_close(__u64 *ctx)
{
	__u64 a[6];
	if (!traced(bpf_get_current_pid_tgid() >> 32))
		return 0;
	sys_args(a, ctx[0]);
	return closing(a[0]);
}

// ---- the raw sys_exit tracepoint ------------------------------------------------------------

// One program on every syscall's exit (raw tracepoint: no perf record is built), keeping
// the recorded calls by number: the arguments are still in the saved registers, the
// result is the tracepoint's. close is reported here too (its descriptor number is all
// that is needed). Enabling it still puts every task's syscalls on the slow path.
SEC("raw_tracepoint/sys_exit")
int raw_exit(__u64 *ctx)
{
	__u64 regs = ctx[0], nr = 0;
	__s64 ret = (__s64)ctx[1];
	if (!traced(bpf_get_current_pid_tgid() >> 32))
		return 0;
	bpf_probe_read_kernel(&nr, sizeof(nr), (const void *)(regs + 120)); // orig_ax
	switch (nr) {
	case NR_SOCKET:
		return done(regs, ret, NR_SOCKET, -1, -1, -1);
	case NR_BIND:
		return done(regs, ret, NR_BIND, 1, 2, -1);
	case NR_LISTEN:
		return done(regs, ret, NR_LISTEN, -1, -1, -1);
	case NR_CONNECT:
		return done(regs, ret, NR_CONNECT, 1, 2, -1);
	case NR_ACCEPT:
		return done(regs, ret, NR_ACCEPT, 1, -1, 2);
	case NR_ACCEPT4:
		return done(regs, ret, NR_ACCEPT4, 1, -1, 2);
	case NR_SETSOCKOPT:
		return done(regs, ret, NR_SETSOCKOPT, 3, 4, -1);
	case NR_GETSOCKOPT:
		return done(regs, ret, NR_GETSOCKOPT, 3, -1, 4);
	case NR_DUP:
		return done(regs, ret, NR_DUP, -1, -1, -1);
	case NR_DUP2:
		return done(regs, ret, NR_DUP2, -1, -1, -1);
	case NR_DUP3:
		return done(regs, ret, NR_DUP3, -1, -1, -1);
	case NR_FCNTL:
		return done(regs, ret, NR_FCNTL, -1, -1, -1);
	case NR_CLOSE: {
		__u64 a[6];
		sys_args(a, regs);
		return closing(a[0]);
	}
	}
	return 0;
}

// ---- syscalls:sys_enter_* / sys_exit_* tracepoints ------------------------------------------

// The records of the syscall tracepoints (after the 8-byte common header).
struct sys_enter_ctx {
	__u64 common;
	__s64 id;
	__u64 args[6];
};

struct sys_exit_ctx {
	__u64 common;
	__s64 id;
	__s64 ret;
};

// The call's `nargs` arguments (the rest 0). Only those: a syscall tracepoint's record ends
// after its own arguments, and attaching a program that reads past it fails (EACCES). One
// load per argument: a loop would walk a pointer into ctx, which the verifier refuses.
static __always_inline void copy_args(__u64 *a, struct sys_enter_ctx *ctx, int nargs)
{
	a[0] = nargs > 0 ? ctx->args[0] : 0;
	a[1] = nargs > 1 ? ctx->args[1] : 0;
	a[2] = nargs > 2 ? ctx->args[2] : 0;
	a[3] = nargs > 3 ? ctx->args[3] : 0;
	a[4] = nargs > 4 ? ctx->args[4] : 0;
	a[5] = nargs > 5 ? ctx->args[5] : 0;
}

// Entry: keep the arguments, and args[lenarg] bytes of user memory at args[ptr] (-1: none).
static __always_inline int enter(struct sys_enter_ctx *ctx, int nargs, int ptr, int lenarg)
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
static __always_inline int leave(struct sys_exit_ctx *ctx, int ptr, int lenp)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	if (!traced(id >> 32))
		return 0;
	struct pending *p = bpf_map_lookup_elem(&PENDING, &tid);
	if (!p || !p->active)
		return 0; // entered before we attached
	p->active = 0;
	struct event *e = new_event(EV_CALL, id, p->nr, ctx->ret);
	if (!e)
		return 0;
	__builtin_memcpy(e->args, p->args, sizeof(e->args));
	__builtin_memcpy(e->data, p->data, DATA_MAX);
	e->len = p->len;
	if (ptr >= 0 && ptr < 6 && lenp >= 0 && lenp < 6 && ctx->ret >= 0) {
		e->len = 0;
		read_back(e, p->args[ptr], p->args[lenp]);
	}
	submit(e);
	return 0;
}

#define ENTER(name, nargs, ptr, lenarg)                                            \
	SEC("tracepoint/syscalls/sys_enter_" #name)                                \
	int enter_##name(struct sys_enter_ctx *ctx)                                \
	{                                                                          \
		return enter(ctx, nargs, ptr, lenarg);                             \
	}
#define LEAVE(name, ptr, lenp)                                                     \
	SEC("tracepoint/syscalls/sys_exit_" #name)                                 \
	int exit_##name(struct sys_exit_ctx *ctx)                                  \
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
int enter_fcntl(struct sys_enter_ctx *ctx)
{
	__u64 cmd = ctx->args[1];
	if (cmd != 0 && cmd != 1030)
		return 0;
	return enter(ctx, 3, -1, -1);
}

SEC("tracepoint/syscalls/sys_enter_close")
int enter_close(struct sys_enter_ctx *ctx)
{
	return closing(ctx->args[0]);
}

// ---- forks and exits: classic sched tracepoints --------------------------------------------

static __always_inline void notify(__u32 kind, __u64 id, __u32 other)
{
	struct event *e = new_event(kind, id, other, 0);
	if (e)
		submit(e);
}

// A new task (process or thread: the record does not say) of a traced process, or the
// launcher thread's child: traced too. A thread's id in TGIDS is harmless (its calls carry
// its process's id) and leaves with it.
static __always_inline int forked(__u32 child)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 zero = 0;
	__u8 yes = 1;
	if (!traced(id >> 32)) {
		__u32 *launcher = bpf_map_lookup_elem(&CONFIG, &zero);
		if (!launcher || !*launcher || *launcher != (__u32)id)
			return 0;
	}
	bpf_map_update_elem(&TGIDS, &child, &yes, BPF_ANY);
	notify(EV_FORK, id, child);
	return 0;
}

// child_pid where the record has it: after two __data_loc comms (6.x) or after two
// char[16] comms (older kernels). The loader attaches the one its format file shows.
SEC("tracepoint/sched/sched_process_fork/20")
int on_fork(void *ctx)
{
	return forked(*(__s32 *)(ctx + 20));
}

SEC("tracepoint/sched/sched_process_fork/44")
int on_fork_44(void *ctx)
{
	return forked(*(__s32 *)(ctx + 44));
}

// A traced task ends: its pending call and thread entry are dropped; when the whole
// process is gone it leaves TGIDS (its pid may be reused) and user space hears of it.
static __always_inline int exited(int group_dead)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	if (!traced(tgid))
		return 0;
	bpf_map_delete_elem(&PENDING, &tid);
	if (tid != tgid)
		bpf_map_delete_elem(&TGIDS, &tid);
	if (!group_dead)
		return 0;
	bpf_map_delete_elem(&TGIDS, &tgid);
	notify(EV_EXIT, id, 0);
	return 0;
}

// group_dead at 32 (after comm[16], pid, prio; 6.x); older records have none: the leader's
// exit stands for the process's (user space also checks /proc).
SEC("tracepoint/sched/sched_process_exit/32")
int on_exit(void *ctx)
{
	return exited(*(__u8 *)(ctx + 32));
}

SEC("tracepoint/sched/sched_process_exit/none")
int on_exit_old(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	return exited((__u32)id == id >> 32);
}
