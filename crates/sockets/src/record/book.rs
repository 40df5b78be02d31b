//! What both recorders share: a completed call as either saw it ([`Call`]), decoded into
//! strace-like lines and the per-socket bookkeeping (which descriptor is which socket,
//! what options it set) that ends in a [`Recording`].

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use super::{
    OptionCount, OptionSet, RecordOptions, RecordedSocket, Recording, SyscallEvent, family_name,
    level_name, nr, option_name, proto_name, sockaddr_text, type_name, value_text,
};

/// One completed call (or a close, seen at its entry), whatever saw it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Call {
    /// Thread that made it.
    pub tid: u32,
    /// Its process.
    pub tgid: u32,
    /// Microseconds since the recording started.
    pub time_us: u64,
    /// The x86_64 system call number.
    pub nr: u64,
    /// Its six arguments.
    pub args: [u64; 6],
    /// Its result; `None` for a close reported at entry.
    pub ret: Option<i64>,
    /// User memory read at entry: the option value of setsockopt, the address of bind and
    /// connect (`None`: unreadable).
    pub entry: Option<Vec<u8>>,
    /// What the kernel wrote back (accept's address, getsockopt's value): the length it
    /// wrote and the bytes, when readable.
    pub back: Option<(u32, Option<Vec<u8>>)>,
}

/// What a syscall logs: the call's name, its arguments as text, the socket it concerns.
type Exited = (&'static str, String, Option<usize>);

/// The sockets and calls seen so far.
pub(crate) struct Book {
    opts: RecordOptions,
    fds: HashMap<(u32, i32), usize>,
    sockets: Vec<RecordedSocket>,
    events: Vec<SyscallEvent>,
}

impl Book {
    pub fn new(opts: RecordOptions) -> Book {
        Book {
            opts,
            fds: HashMap::new(),
            sockets: Vec::new(),
            events: Vec::new(),
        }
    }

    /// Whether `fd` of `tgid` is a socket we know (a close of anything else is not logged).
    pub fn is_socket(&self, tgid: u32, fd: i32) -> bool {
        self.fds.contains_key(&(tgid, fd))
    }

    fn new_socket(&mut self, pid: u32, fd: i32, origin: &str) -> usize {
        let id = self.sockets.len();
        self.sockets.push(RecordedSocket {
            id,
            pid,
            fd,
            origin: origin.into(),
            family: None,
            kind: None,
            tcp: false,
            bound: None,
            peer: None,
            options: vec![],
            closed: false,
            listener: None,
        });
        self.fds.insert((pid, fd), id);
        id
    }

    fn socket_for(&mut self, pid: u32, fd: i32) -> usize {
        match self.fds.get(&(pid, fd)) {
            Some(&id) => id,
            None => self.new_socket(pid, fd, "inherited"),
        }
    }

    /// Decodes and logs one call.
    pub fn on_call(&mut self, c: &Call) {
        let a = c.args;
        let fd0 = a[0] as i32;
        let Some(ret) = c.ret else {
            if c.nr == nr::CLOSE {
                // Logged at entry: the descriptor is released whatever close returns.
                if let Some(id) = self.release(c.tgid, fd0) {
                    self.log(c, "close", format!("{fd0}"), 0, false, Some(id));
                }
            }
            return;
        };
        let ok = ret >= 0;
        let (call, args, socket) = match c.nr {
            nr::SOCKET => self.exit_socket(c.tgid, &a, ret),
            nr::ACCEPT | nr::ACCEPT4 => self.exit_accept(c, ret),
            nr::BIND | nr::CONNECT => {
                let (t, _) = c
                    .entry
                    .as_deref()
                    .map(sockaddr_text)
                    .unwrap_or_else(|| (format!("{:#x}", a[1]), None));
                let id = self.socket_for(c.tgid, fd0);
                let s = &mut self.sockets[id];
                // a non-blocking connect returns EINPROGRESS: still the peer
                if c.nr == nr::BIND && ok {
                    s.bound = Some(t.clone());
                } else if c.nr == nr::CONNECT && (ok || ret == -115) {
                    s.peer = Some(t.clone());
                }
                let call = if c.nr == nr::BIND { "bind" } else { "connect" };
                (call, format!("{fd0}, {t}, {}", a[2] as u32), Some(id))
            }
            nr::LISTEN => {
                let id = self.socket_for(c.tgid, fd0);
                ("listen", format!("{fd0}, {}", a[1] as i32), Some(id))
            }
            nr::SETSOCKOPT => self.exit_setsockopt(c, ok),
            nr::GETSOCKOPT => self.exit_getsockopt(c, ret),
            nr::DUP | nr::DUP2 | nr::DUP3 | nr::FCNTL => match self.exit_dup(c, ret) {
                Some(logged) => logged,
                None => return,
            },
            _ => return,
        };
        self.log(c, call, args, ret, true, socket);
    }

    /// Descriptor `fd` of `tgid` is gone: the socket it named, closed when no other
    /// descriptor (a dup) names it.
    fn release(&mut self, tgid: u32, fd: i32) -> Option<usize> {
        let id = self.fds.remove(&(tgid, fd))?;
        if !self.fds.values().any(|&v| v == id) {
            self.sockets[id].closed = true;
        }
        Some(id)
    }

    /// dup(2)/dup2/dup3/fcntl(F_DUPFD): another descriptor for a known socket (not logged
    /// for anything else).
    fn exit_dup(&mut self, c: &Call, ret: i64) -> Option<Exited> {
        let a = c.args;
        let fd0 = a[0] as i32;
        let id = *self.fds.get(&(c.tgid, fd0))?;
        let (call, args) = match c.nr {
            nr::DUP => ("dup", format!("{fd0}")),
            nr::DUP2 => ("dup2", format!("{fd0}, {}", a[1] as i32)),
            nr::DUP3 => (
                "dup3",
                format!("{fd0}, {}, {:#x}", a[1] as i32, a[2] as i32),
            ),
            _ => {
                let cmd = if a[1] == 1030 {
                    "F_DUPFD_CLOEXEC"
                } else {
                    "F_DUPFD"
                };
                ("fcntl", format!("{fd0}, {cmd}, {}", a[2] as i32))
            }
        };
        if ret >= 0 && ret as i32 != fd0 {
            // dup2/dup3 onto an open descriptor closed what it named first.
            self.release(c.tgid, ret as i32);
            self.fds.insert((c.tgid, ret as i32), id);
        }
        Some((call, args, Some(id)))
    }

    /// setsockopt(2): the value as the program passed it.
    fn exit_setsockopt(&mut self, c: &Call, ok: bool) -> Exited {
        let a = c.args;
        let (level, opt, len) = (a[1] as i32 as i64, a[2] as i32 as i64, a[4] as u32);
        let v = c
            .entry
            .as_deref()
            .map(|b| value_text(level, opt, b))
            .unwrap_or_else(|| format!("{:#x}", a[3]));
        let (ln, on) = (level_name(level), option_name(level, opt));
        let args = format!("{}, {ln}, {on}, {v}, {len}", a[0] as i32);
        let raw = v.trim_start_matches('[').trim_end_matches(']').to_string();
        let id = self.socket_for(c.tgid, a[0] as i32);
        self.sockets[id].options.push(OptionSet {
            level: ln,
            option: on,
            value: raw,
            ok,
        });
        ("setsockopt", args, Some(id))
    }

    /// socket(2) returned: a new socket with its family and type.
    fn exit_socket(&mut self, tgid: u32, a: &[u64; 6], ret: i64) -> Exited {
        let args = format!(
            "{}, {}, {}",
            family_name(a[0]),
            type_name(a[1]),
            proto_name(a[2])
        );
        let sock = (ret >= 0).then(|| {
            let id = self.new_socket(tgid, ret as i32, "socket");
            let s = &mut self.sockets[id];
            s.family = Some(family_name(a[0]));
            s.kind = Some(type_name(a[1] & 0xf));
            s.tcp = (a[0] == 2 || a[0] == 10) && a[1] & 0xf == 1;
            id
        });
        ("socket", args, sock)
    }

    /// accept(2)/accept4(2) returned: a new socket with the peer's address, its family and
    /// TCP-ness from the listener (or from the peer address when the listener is unknown).
    fn exit_accept(&mut self, c: &Call, ret: i64) -> Exited {
        let a = c.args;
        let fd0 = a[0] as i32;
        let ok = ret >= 0;
        let peer = match &c.back {
            Some((_, Some(b))) if ok && a[1] != 0 => Some(sockaddr_text(b).0),
            _ => None,
        };
        let args = format!(
            "{fd0}, {}, {}",
            peer.clone().unwrap_or_else(|| if a[1] == 0 {
                "NULL".into()
            } else {
                format!("{:#x}", a[1])
            }),
            if a[2] == 0 {
                "NULL".into()
            } else {
                "[..]".to_string()
            }
        );
        let call = if c.nr == nr::ACCEPT {
            "accept"
        } else {
            "accept4"
        };
        let listener = self.fds.get(&(c.tgid, fd0)).copied();
        let sock = ok.then(|| {
            let id = self.new_socket(c.tgid, ret as i32, "accept");
            let (fam, tcp) = match listener.map(|l| &self.sockets[l]) {
                Some(l) => (l.family.clone(), l.tcp),
                None => {
                    let fam = peer.as_deref().map(|t| {
                        t.trim_start_matches('{')
                            .split(',')
                            .next()
                            .unwrap_or("")
                            .to_string()
                    });
                    let tcp = matches!(fam.as_deref(), Some("AF_INET" | "AF_INET6"));
                    (fam, tcp)
                }
            };
            let s = &mut self.sockets[id];
            s.family = fam;
            s.kind = Some("SOCK_STREAM".into());
            s.tcp = tcp;
            s.peer = peer.clone();
            s.listener = listener;
            id
        });
        (call, args, sock)
    }

    /// getsockopt(2) returned: the value read back, decoded.
    fn exit_getsockopt(&mut self, c: &Call, ret: i64) -> Exited {
        let a = c.args;
        let fd0 = a[0] as i32;
        let (level, opt) = (a[1] as i32 as i64, a[2] as i32 as i64);
        let len = c.back.as_ref().map(|(l, _)| *l);
        let v = match &c.back {
            Some((_, Some(b))) if ret >= 0 => value_text(level, opt, b),
            _ => format!("{:#x}", a[3]),
        };
        let id = self.fds.get(&(c.tgid, fd0)).copied();
        let args = format!(
            "{fd0}, {}, {}, {v}, [{}]",
            level_name(level),
            option_name(level, opt),
            len.map(|l| l.to_string()).unwrap_or_else(|| "?".into())
        );
        ("getsockopt", args, id)
    }

    fn log(
        &mut self,
        c: &Call,
        call: &str,
        args: String,
        ret: i64,
        ret_known: bool,
        socket: Option<usize>,
    ) {
        let ev = SyscallEvent {
            tid: c.tid,
            pid: c.tgid,
            time_us: c.time_us,
            call: call.into(),
            args,
            ret,
            ret_known,
            socket,
        };
        if let Some(w) = self.opts.live.as_mut() {
            // The trace is best effort: a closed pipe must not stop the recording.
            let _ = writeln!(w, "{}", ev.line());
        }
        self.events.push(ev);
    }

    /// A new process: it starts with a copy of its parent's descriptor table.
    pub fn on_fork(&mut self, ptgid: u32, ctgid: u32) {
        if ctgid == ptgid {
            return;
        }
        let copies: Vec<((u32, i32), usize)> = self
            .fds
            .iter()
            .filter(|((p, _), _)| *p == ptgid)
            .map(|((_, fd), id)| ((ctgid, *fd), *id))
            .collect();
        self.fds.extend(copies);
    }

    /// The recording, with the per-option summary.
    pub fn finish(mut self, command: Vec<String>) -> Recording {
        if let Some(w) = self.opts.live.as_mut() {
            let _ = w.flush();
        }
        // Keyed by reference: a socket may have set options hundreds of thousands of times.
        let mut counts: BTreeMap<(&str, &str, &str), usize> = BTreeMap::new();
        for s in &self.sockets {
            let mut seen = std::collections::HashSet::new();
            for o in s.options.iter().filter(|o| o.ok) {
                let k = (o.level.as_str(), o.option.as_str(), o.value.as_str());
                if seen.insert(k) {
                    *counts.entry(k).or_default() += 1;
                }
            }
        }
        let option_summary: Vec<OptionCount> = counts
            .into_iter()
            .map(|((level, option, value), sockets)| OptionCount {
                level: level.into(),
                option: option.into(),
                value: value.into(),
                sockets,
            })
            .collect();
        let tcp: Vec<&RecordedSocket> = self.sockets.iter().filter(|s| s.tcp).collect();
        // An accepted socket inherits most options set on its listener (the kernel clones
        // the listener: Nagle/cork flags, buffers, keepalive); counted as set if the
        // listener set it at all (the order is in `events`). Not the ACK mode: a new
        // socket starts with fresh delayed-ACK state, so TCP_QUICKACK is never inherited.
        let set =
            |s: &RecordedSocket, name: &str| s.options.iter().any(|o| o.option == name && o.ok);
        let never = |name: &str| -> Vec<usize> {
            tcp.iter()
                .filter(|s| {
                    !set(s, name)
                        && (name == "TCP_QUICKACK"
                            || !s.listener.is_some_and(|l| set(&self.sockets[l], name)))
                })
                .map(|s| s.id)
                .collect()
        };
        Recording {
            command,
            never_nodelay: never("TCP_NODELAY"),
            never_quickack: never("TCP_QUICKACK"),
            tcp_sockets: tcp.len(),
            option_summary,
            events: self.events,
            sockets: self.sockets,
            exit_code: None,
            signal: None,
            tasks: 0,
            mechanism: String::new(),
            hooks: None,
            fallback: None,
            attached: Vec::new(),
            lost_events: 0,
        }
    }
}
