//! A simulated network for the engines' unit tests: virtual clock, scripted behaviour.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::net::IpAddr;

use crate::net::{Network, Received};
use crate::ping::PingOptions;
use crate::wire::{Body, Flow, IcmpError, Proto, Quoted, Reply};

/// How the simulated network answers.
#[derive(Debug, Clone)]
pub enum Behaviour {
    /// The target answers every probe after `rtt_us`, except every `drop_every`-th (1-based,
    /// 0 = none) counting from the second probe.
    Target {
        rtt_us: u64,
        rst: bool,
        drop_every: u32,
    },
    /// Nothing answers.
    Silent,
    /// Routers (None = silent) then the target; hop n answers after n × 100 µs.
    Path { routers: Vec<Option<IpAddr>> },
}

pub struct SimNet {
    pub flow: Flow,
    pub now: u64,
    pub sent: Vec<(u8, Vec<u8>)>,
    /// Virtual time each send takes (0: sends are instantaneous).
    pub send_cost_ns: u64,
    behaviour: Behaviour,
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    replies: Vec<Reply>,
}

impl SimNet {
    pub fn new(o: &PingOptions, behaviour: Behaviour) -> SimNet {
        Self::with_flow(
            Flow {
                proto: match o.mode {
                    crate::ping::PingMode::Udp => Proto::Udp,
                    crate::ping::PingMode::Icmp => Proto::Icmp,
                    _ => Proto::Tcp,
                },
                src: "10.9.0.1".parse().unwrap(),
                dst: o.target.ip(),
                sport: 40000,
                dport: o.target.port(),
                seq_base: 0xdead_0000,
            },
            behaviour,
        )
    }

    pub fn with_flow(flow: Flow, behaviour: Behaviour) -> SimNet {
        SimNet {
            flow,
            now: 1_000_000_000,
            sent: Vec::new(),
            send_cost_ns: 0,
            behaviour,
            queue: BinaryHeap::new(),
            replies: Vec::new(),
        }
    }

    fn push(&mut self, at: u64, r: Reply) {
        self.replies.push(r);
        self.queue
            .push(Reverse((at, (self.replies.len() - 1) as u64)));
    }

    fn target_reply(&self, probe: &[u8]) -> Body {
        let f = &self.flow;
        match f.proto {
            Proto::Tcp => Body::Tcp {
                sport: f.dport,
                dport: f.sport,
                seq: 7,
                ack: u32::from_be_bytes([probe[4], probe[5], probe[6], probe[7]]).wrapping_add(1),
                flags: match &self.behaviour {
                    Behaviour::Target { rst: true, .. } => 0x14,
                    _ => 0x12,
                },
                window: 64240,
            },
            Proto::Icmp => Body::EchoReply {
                id: u16::from_be_bytes([probe[4], probe[5]]),
                seq: u16::from_be_bytes([probe[6], probe[7]]),
            },
            Proto::Udp => self.error(IcmpError::PortUnreachable, probe),
        }
    }

    fn error(&self, kind: IcmpError, probe: &[u8]) -> Body {
        Body::Error {
            kind,
            code: if kind == IcmpError::PortUnreachable {
                3
            } else {
                0
            },
            quoted: Quoted {
                ip_proto: self.flow.proto.ip_proto(false),
                src: self.flow.src,
                dst: self.flow.dst,
                head: probe[..8].try_into().unwrap(),
            },
        }
    }

    fn reply(&self, from: IpAddr, body: Body) -> Reply {
        Reply {
            from,
            to: self.flow.src,
            ttl: 64,
            ip_id: 0,
            df: true,
            len: 44,
            body,
        }
    }
}

impl Network for SimNet {
    fn send(&mut self, ttl: u8, probe: &[u8]) -> io::Result<u64> {
        let n = self.sent.len() as u32;
        self.sent.push((ttl, probe.to_vec()));
        let t = self.now;
        self.now += self.send_cost_ns;
        match self.behaviour.clone() {
            Behaviour::Silent => {}
            Behaviour::Target {
                rtt_us, drop_every, ..
            } => {
                if drop_every == 0 || !(n + 1).is_multiple_of(drop_every) || n == 0 {
                    let r = self.reply(self.flow.dst, self.target_reply(probe));
                    self.push(t + rtt_us * 1000, r);
                }
            }
            Behaviour::Path { routers } => {
                let hop = usize::from(ttl);
                let at = t + hop as u64 * 100_000;
                if hop <= routers.len() {
                    if let Some(addr) = routers[hop - 1] {
                        let r = self.reply(addr, self.error(IcmpError::TimeExceeded, probe));
                        self.push(at, r);
                    }
                } else {
                    let r = self.reply(self.flow.dst, self.target_reply(probe));
                    self.push(t + (routers.len() as u64 + 1) * 100_000, r);
                }
            }
        }
        Ok(t)
    }

    fn recv(&mut self, deadline_ns: u64) -> io::Result<Option<Received>> {
        if let Some(Reverse((at, i))) = self.queue.peek().copied()
            && at <= deadline_ns.max(self.now)
        {
            self.queue.pop();
            self.now = self.now.max(at);
            return Ok(Some(Received {
                at_ns: at,
                reply: self.replies[i as usize].clone(),
                kernel_ts: true,
            }));
        }
        self.now = self.now.max(deadline_ns);
        Ok(None)
    }

    fn now_ns(&self) -> u64 {
        self.now
    }
}
