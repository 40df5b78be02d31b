//! The netfilter rules a TCP packet to the server's port walks on its way in, from
//! `nft -j list ruleset` in the reading thread's namespace.
//!
//! The walk covers the base chains hooked at `prerouting` then `input` of the `ip` and
//! `inet` families (`ip6` and `inet` for IPv6), any type (filter, nat, route; a nat chain
//! sees only a connection's first packet), by ascending priority (ties by name: the kernel
//! orders them by registration, which the listing does not show); dormant tables are
//! skipped. A rule's matches are decided for "a TCP packet to the port": the
//! destination port (`tcp dport`, `th dport`, `meta l4proto`, `ip protocol`,
//! `ip6 nexthdr`, `meta nfproto`, `meta protocol`, other transport protocols' headers).
//! Anything else (addresses, interfaces, conntrack state, marks, `tcp flags`, iptables-nft's
//! opaque `xt` matches, `limit`) may match: such a rule with a verdict that ends the walk
//! ends it as `unknown`; one without (counter, log) is counted and passed. A jump that may
//! be taken walks its chain (counted: the worst case), where nothing can be decided.
//! A return that may be taken leaves the rest of its chain undecided the same way.
//! `accept` ends one base chain (the packet goes on to the next); a decided drop or reject
//! (or a `policy drop`) ends the packet: the base chains after it are not listed. NAT statements (`dnat`,
//! `redirect`, ...) end their chain with `accept`, as the kernel does.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lagtrace_model::diagnosis::evidence::Layer;
use lagtrace_model::host::{ChainWalk, Netfilter};
use lagtrace_model::{Capability, Privilege};
use serde_json::Value;

/// Where the rules come from.
const SOURCE: &str = "nft -j list ruleset";
/// `nft` is killed when it has not answered by then (20 000 rules take about 0.6 s).
const TIMEOUT: Duration = Duration::from_secs(5);
/// The kernel's jump stack (`NFT_JUMP_STACK_SIZE`).
const MAX_DEPTH: usize = 16;
/// Rules one packet's walk may evaluate before the walk gives up (jumps fanning out).
const MAX_WALKED: u64 = 1_000_000;
const UNKNOWN: &str = "unknown";
/// What nft says when the caller lacks CAP_NET_ADMIN.
const REFUSED: [&str; 3] = [
    "Operation not permitted",
    "Permission denied",
    "must be root",
];

/// Reads the ruleset with `nft -j list ruleset` and walks it for a TCP packet to `port`.
///
/// `nft` runs in the calling thread's network namespace and is killed after 5 s. Without
/// `nft` or CAP_NET_ADMIN the layer is unavailable; another failure is an error.
pub fn read(port: Option<u16>, ipv6: bool) -> Layer<Netfilter> {
    match list_ruleset().map(|json| walk(&json, port, ipv6)) {
        Ok(Ok(n)) => Layer::ran(n),
        Ok(Err(e)) => Layer::error(format!("netfilter rules: `{SOURCE}`: {e}")),
        Err(layer) => layer,
    }
}

/// The walk, from `nft -j list ruleset`'s output (pure: unit-testable).
pub fn walk(json: &str, port: Option<u16>, ipv6: bool) -> Result<Netfilter, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
    let rs = Ruleset::parse(&v)?;
    let families: [&str; 2] = if ipv6 {
        ["ip6", "inet"]
    } else {
        ["ip", "inet"]
    };
    let mut bases: Vec<_> = rs
        .chains
        .iter()
        .filter(|((f, t, _), _)| families.contains(f) && !rs.dormant.contains(&(*f, *t)))
        .filter_map(|(k, c)| {
            let rank = match c.hook? {
                "prerouting" => 0u8,
                "input" => 1,
                _ => return None,
            };
            Some((rank, c.prio, *k))
        })
        .collect();
    bases.sort_unstable();
    let mut walks = Vec::with_capacity(bases.len());
    for (_, prio, key @ (family, table, chain)) in bases {
        let rules = rs.reachable(key);
        let (walked, verdict, decided_by) = match port {
            None => (rules, UNKNOWN.to_string(), None),
            Some(port) => {
                let mut w = Walker {
                    rs: &rs,
                    family,
                    table,
                    port,
                    ipv6,
                    walked: 0,
                };
                match w.chain(chain, true, 0) {
                    Flow::Return => (w.walked, format!("policy {}", rs.chains[&key].policy), None),
                    Flow::End(v, h) => (w.walked, v.to_string(), h),
                }
            }
        };
        let ends = matches!(verdict.as_str(), "drop" | "reject" | "policy drop");
        walks.push(ChainWalk {
            family: family.into(),
            table: table.into(),
            chain: chain.into(),
            hook: rs.chains[&key].hook.unwrap_or_default().into(),
            priority: prio,
            rules,
            walked,
            verdict,
            decided_by,
        });
        if ends {
            break;
        }
    }
    Ok(Netfilter {
        rules: rs.total,
        port,
        walks,
        source: SOURCE.into(),
    })
}

/// Runs `nft`, killed after [`TIMEOUT`]; its stdout, or the layer saying why not.
fn list_ruleset<T>() -> Result<String, Layer<T>> {
    let mut child = spawn_nft().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Layer::unavailable(
            "netfilter rules: the `nft` command is not installed (Debian: nftables); \
             the rule walk is not measured",
        ),
        _ => Layer::error(format!("netfilter rules: running `{SOURCE}`: {e}")),
    })?;
    let (Some(mut out), Some(mut err)) = (child.stdout.take(), child.stderr.take()) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(Layer::error("netfilter rules: nft's output was not piped"));
    };
    // Read both pipes while waiting: 20 000 rules are 4 MB of JSON, more than a pipe holds.
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        out.read_to_string(&mut s).map(|_| s)
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            waited => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Layer::error(match waited {
                    Err(e) => format!("netfilter rules: waiting for nft: {e}"),
                    Ok(_) => format!(
                        "netfilter rules: `{SOURCE}` did not finish in {} s (killed)",
                        TIMEOUT.as_secs()
                    ),
                }));
            }
        }
    };
    let stderr = err.join().unwrap_or_default();
    if !status.success() {
        if REFUSED.iter().any(|m| stderr.contains(m)) {
            let p = Privilege::new(
                Capability::NetAdmin,
                format!("netfilter rules: `{SOURCE}`"),
                " (run as root); the rule walk is not measured",
            );
            return Err(Layer::unavailable(p.to_string()));
        }
        let first = stderr.lines().map(str::trim).find(|l| !l.is_empty());
        return Err(Layer::error(format!(
            "netfilter rules: `{SOURCE}` failed ({status}): {}",
            first.unwrap_or("no message")
        )));
    }
    let read = out
        .join()
        .unwrap_or_else(|_| Err(std::io::ErrorKind::Other.into()));
    read.map_err(|e| Layer::error(format!("netfilter rules: reading nft's output: {e}")))
}

/// `nft` from `PATH`, else from the sbin directories (not on a user's `PATH` everywhere).
fn spawn_nft() -> std::io::Result<std::process::Child> {
    let mut last = std::io::Error::from(std::io::ErrorKind::NotFound);
    for prog in ["nft", "/usr/sbin/nft", "/sbin/nft"] {
        match Command::new(prog)
            .args(["-j", "list", "ruleset"])
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
        {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => last = e,
            r => return r,
        }
    }
    Err(last)
}

/// Family, table, name.
type Key<'a> = (&'a str, &'a str, &'a str);

/// A chain: its hook and priority when a base chain, its rules in order.
struct Chain<'a> {
    hook: Option<&'a str>,
    prio: i64,
    policy: &'a str,
    rules: Vec<(u64, &'a [Value])>,
}

/// The parts of the ruleset the walk reads.
#[derive(Default)]
struct Ruleset<'a> {
    chains: HashMap<Key<'a>, Chain<'a>>,
    /// Named sets' and maps' elements.
    sets: HashMap<Key<'a>, &'a [Value]>,
    /// Tables whose chains are not registered (`flags dormant`).
    dormant: HashSet<(&'a str, &'a str)>,
    total: u64,
}

fn field<'a>(o: &'a Value, k: &str, what: &str) -> Result<&'a str, String> {
    o.get(k)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("a {what} without a string `{k}`"))
}

/// The only key of a one-key object (how nft writes expressions and statements).
fn tagged(v: &Value) -> Option<(&str, &Value)> {
    v.as_object()?.iter().next().map(|(k, v)| (k.as_str(), v))
}

impl<'a> Ruleset<'a> {
    fn parse(v: &'a Value) -> Result<Self, String> {
        let items = v
            .get("nftables")
            .and_then(Value::as_array)
            .ok_or("no top-level `nftables` array")?;
        let mut rs = Ruleset::default();
        for item in items {
            let Some((kind, o)) = tagged(item) else {
                return Err("an `nftables` item that is not an object".into());
            };
            if !matches!(kind, "table" | "chain" | "set" | "map" | "rule") {
                continue;
            }
            let family = field(o, "family", kind)?;
            let table = field(o, if kind == "table" { "name" } else { "table" }, kind)?;
            match kind {
                "table" => {
                    // nft 1.0.6 writes a dormant table's flags as "off"; later ones ["dormant"].
                    let flags = o.get("flags");
                    let dormant = |f: &Value| matches!(f.as_str(), Some("dormant" | "off"));
                    if flags.is_some_and(|f| {
                        dormant(f) || f.as_array().is_some_and(|a| a.iter().any(dormant))
                    }) {
                        rs.dormant.insert((family, table));
                    }
                }
                "chain" => {
                    let name = field(o, "name", kind)?;
                    let hook = o.get("hook").and_then(Value::as_str);
                    let prio = match hook {
                        None => 0,
                        Some(_) => priority(o.get("prio")).ok_or_else(|| {
                            format!("base chain {family} {table} {name}: no priority")
                        })?,
                    };
                    let policy = o.get("policy").and_then(Value::as_str).unwrap_or("accept");
                    rs.chains.insert(
                        (family, table, name),
                        Chain {
                            hook,
                            prio,
                            policy,
                            rules: Vec::new(),
                        },
                    );
                }
                "set" | "map" => {
                    let elems = o
                        .get("elem")
                        .and_then(Value::as_array)
                        .map_or(&[][..], Vec::as_slice);
                    rs.sets
                        .insert((family, table, field(o, "name", kind)?), elems);
                }
                _ => {
                    let chain = field(o, "chain", kind)?;
                    let handle = o
                        .get("handle")
                        .and_then(Value::as_u64)
                        .ok_or("a rule without a handle")?;
                    let expr = o
                        .get("expr")
                        .and_then(Value::as_array)
                        .ok_or("a rule without `expr`")?;
                    let c = rs.chains.get_mut(&(family, table, chain)).ok_or_else(|| {
                        format!("rule {handle} in an undeclared chain {family} {table} {chain}")
                    })?;
                    c.rules.push((handle, expr.as_slice()));
                    rs.total += 1;
                }
            }
        }
        Ok(rs)
    }

    /// Rules in the chain and every chain reachable from it by jump or goto, each once.
    fn reachable(&self, (family, table, chain): Key<'a>) -> u64 {
        let mut seen = HashSet::new();
        let mut todo = vec![chain];
        let mut n = 0;
        while let Some(name) = todo.pop() {
            let Some(c) = self
                .chains
                .get(&(family, table, name))
                .filter(|_| seen.insert(name))
            else {
                continue;
            };
            n += c.rules.len() as u64;
            for e in c.rules.iter().flat_map(|(_, expr)| expr.iter()) {
                let data = match tagged(e) {
                    Some(("vmap", m)) => m.get("data").map(|d| self.entries(family, table, d)),
                    _ => None,
                };
                let vs = data.into_iter().flatten().filter_map(|p| p.get(1));
                todo.extend(vs.chain([e]).filter_map(verdict).filter_map(|v| match v {
                    Verdict::Jump(t) | Verdict::Goto(t) => Some(t),
                    _ => None,
                }));
            }
        }
        n
    }

    /// The elements of a set expression: anonymous (`{"set": [...]}`, a bare list, one
    /// value) or named (`"@name"`, looked up in the same table).
    fn entries(&self, family: &'a str, table: &'a str, v: &'a Value) -> &'a [Value] {
        match v {
            Value::String(s) if s.starts_with('@') => self
                .sets
                .get(&(family, table, &s[1..]))
                .copied()
                .unwrap_or_default(),
            Value::Array(a) => a,
            v => match v.get("set") {
                Some(Value::Array(a)) => a,
                Some(one) => std::slice::from_ref(one),
                None => std::slice::from_ref(v),
            },
        }
    }
}

/// A chain's priority: a number, or a standard name (`filter`, `dstnat + 10`, ...).
fn priority(v: Option<&Value>) -> Option<i64> {
    let s = match v? {
        Value::Number(n) => return n.as_i64(),
        Value::String(s) => s.trim(),
        _ => return None,
    };
    if let Ok(n) = s.parse() {
        return Some(n);
    }
    let (name, offset) = match s.find(['+', '-']) {
        Some(i) => {
            let n: i64 = s[i + 1..].trim().parse().ok()?;
            (s[..i].trim(), if s.as_bytes()[i] == b'-' { -n } else { n })
        }
        None => (s, 0),
    };
    let base = match name {
        "raw" => -300,
        "mangle" => -150,
        "dstnat" => -100,
        "filter" => 0,
        "security" => 50,
        "srcnat" => 100,
        _ => return None,
    };
    Some(base + offset)
}

/// Whether a condition holds for the packet (ordered: `min` is "and").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Truth {
    False,
    Maybe,
    True,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict<'a> {
    Accept,
    Drop,
    Reject,
    /// Handed to user space (`queue`, `NFQUEUE`, `TPROXY`): it decides.
    Queue,
    Continue,
    Return,
    Jump(&'a str),
    Goto(&'a str),
}

fn verdict(v: &Value) -> Option<Verdict<'_>> {
    let (k, body) = tagged(v)?;
    let target = || body.get("target").and_then(Value::as_str);
    Some(match k {
        "accept" => Verdict::Accept,
        "drop" => Verdict::Drop,
        "reject" => Verdict::Reject,
        "queue" => Verdict::Queue,
        "continue" => Verdict::Continue,
        "return" => Verdict::Return,
        "jump" => Verdict::Jump(target()?),
        "goto" => Verdict::Goto(target()?),
        _ => return None,
    })
}

/// How a chain ended: returned to its caller (or fell off its end), or a verdict.
enum Flow {
    Return,
    End(&'static str, Option<u64>),
}

/// The packet's value for a field the walk decides, with its symbolic names.
enum Field {
    Known(u64, &'static [&'static str]),
    /// A header the packet does not have (nft adds the dependency: the rule cannot match).
    Absent,
    Unknown,
}

/// One base chain's walk for a TCP packet to `port`.
struct Walker<'r, 'a> {
    rs: &'r Ruleset<'a>,
    family: &'a str,
    table: &'a str,
    port: u16,
    ipv6: bool,
    walked: u64,
}

impl<'a> Walker<'_, 'a> {
    /// Walks `name`; `certain` is false in a chain the packet may not be in.
    fn chain(&mut self, name: &str, mut certain: bool, depth: usize) -> Flow {
        let Some(c) = self.rs.chains.get(&(self.family, self.table, name)) else {
            return Flow::End(UNKNOWN, None);
        };
        for &(handle, expr) in &c.rules {
            self.walked += 1;
            if self.walked > MAX_WALKED {
                return Flow::End(UNKNOWN, Some(handle));
            }
            let (truth, verdicts) = self.rule(expr);
            if truth == Truth::False {
                continue;
            }
            // The rule surely matches if the packet is in this chain at all.
            let sure = truth == Truth::True;
            let unknown = Flow::End(UNKNOWN, Some(handle));
            let one = match verdicts.as_slice() {
                [] => continue,
                [one] => *one,
                many => {
                    // An undecidable verdict map: its jumps may be taken, anything else may end.
                    for v in many {
                        match *v {
                            Verdict::Continue => {}
                            Verdict::Jump(t) if depth < MAX_DEPTH => {
                                if let end @ Flow::End(..) = self.chain(t, false, depth + 1) {
                                    return end;
                                }
                            }
                            _ => return unknown,
                        }
                    }
                    continue;
                }
            };
            match one {
                Verdict::Continue => {}
                Verdict::Accept if sure && certain => return Flow::End("accept", Some(handle)),
                Verdict::Drop if sure && certain => return Flow::End("drop", Some(handle)),
                Verdict::Reject if sure && certain => return Flow::End("reject", Some(handle)),
                Verdict::Jump(t) if depth < MAX_DEPTH => {
                    if let end @ Flow::End(..) = self.chain(t, sure && certain, depth + 1) {
                        return end;
                    }
                }
                Verdict::Goto(t) if sure && depth < MAX_DEPTH => {
                    return self.chain(t, certain, depth + 1);
                }
                Verdict::Return if sure => return Flow::Return,
                // A return that may be taken in a jumped-to chain: the rest of it may not run.
                Verdict::Return if depth > 0 => certain = false,
                _ => return unknown,
            }
        }
        Flow::Return
    }

    /// A rule's condition and the verdicts it may give.
    fn rule(&self, expr: &'a [Value]) -> (Truth, Vec<Verdict<'a>>) {
        let mut cond = Truth::True;
        let mut out = Vec::new();
        for e in expr {
            let Some((k, body)) = tagged(e) else {
                cond = cond.min(Truth::Maybe);
                continue;
            };
            match k {
                "match" => cond = cond.min(self.matches(body)),
                "limit" | "quota" | "ct count" => cond = cond.min(Truth::Maybe),
                // iptables-nft's extensions: opaque in JSON.
                "xt" => match (
                    body.get("type").and_then(Value::as_str),
                    body.get("name").and_then(Value::as_str),
                ) {
                    (Some("target"), Some("REJECT")) => out.push(Verdict::Reject),
                    (
                        Some("target"),
                        Some("DNAT" | "SNAT" | "REDIRECT" | "MASQUERADE" | "NETMAP"),
                    ) => {
                        out.push(Verdict::Accept);
                    }
                    (Some("target"), Some("NFQUEUE" | "TPROXY" | "SYNPROXY")) => {
                        out.push(Verdict::Queue)
                    }
                    (Some("target"), _) => {}
                    _ => cond = cond.min(Truth::Maybe),
                },
                "dnat" | "snat" | "masquerade" | "redirect" => out.push(Verdict::Accept),
                "vmap" => {
                    let Some(key) = body.get("key") else { continue };
                    let data = body
                        .get("data")
                        .map_or(&[][..], |d| self.rs.entries(self.family, self.table, d));
                    let hit = match self.field(key) {
                        Field::Absent => Some(None),
                        Field::Unknown => None,
                        Field::Known(x, names) => lookup(data, x, names),
                    };
                    match hit {
                        Some(Some(v)) => out.extend(verdict(v)),
                        Some(None) => cond = Truth::False,
                        None => {
                            cond = cond.min(Truth::Maybe);
                            out.extend(data.iter().filter_map(|p| p.get(1)).filter_map(verdict));
                        }
                    }
                }
                _ => out.extend(verdict(e)),
            }
            if cond == Truth::False {
                break;
            }
        }
        (cond, out)
    }

    /// A `match` expression's truth for the packet.
    fn matches(&self, m: &'a Value) -> Truth {
        let (Some(left), Some(right)) = (m.get("left"), m.get("right")) else {
            return Truth::Maybe;
        };
        let (x, names) = match self.field(left) {
            Field::Known(x, names) => (x, names),
            Field::Absent => return Truth::False,
            Field::Unknown => return Truth::Maybe,
        };
        let op = m.get("op").and_then(Value::as_str).unwrap_or("==");
        let decided = match op {
            "==" | "in" | "!=" => {
                let set = self.rs.entries(self.family, self.table, right);
                contains(set, x, names).map(|c| c == (op != "!="))
            }
            "<" | ">" | "<=" | ">=" => number(right).map(|r| match op {
                "<" => x < r,
                ">" => x > r,
                "<=" => x <= r,
                _ => x >= r,
            }),
            _ => None,
        };
        decided.map_or(Truth::Maybe, |d| if d { Truth::True } else { Truth::False })
    }

    /// The packet's value for an expression on a match's or a map's left side.
    fn field(&self, left: &Value) -> Field {
        let (v6, port) = (self.ipv6, u64::from(self.port));
        match tagged(left) {
            Some(("payload", p)) => {
                let proto = p
                    .get("protocol")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                match (
                    proto,
                    p.get("field").and_then(Value::as_str).unwrap_or_default(),
                ) {
                    ("tcp" | "th", "dport") => Field::Known(port, &[]),
                    ("ip", _) if v6 => Field::Absent,
                    ("ip6", _) if !v6 => Field::Absent,
                    ("ip", "protocol") | ("ip6", "nexthdr") => Field::Known(6, &["tcp"]),
                    (
                        "udp" | "udplite" | "sctp" | "dccp" | "icmp" | "icmpv6" | "igmp" | "esp"
                        | "ah" | "comp",
                        _,
                    ) => Field::Absent,
                    _ => Field::Unknown,
                }
            }
            Some(("meta", m)) => match m.get("key").and_then(Value::as_str) {
                Some("l4proto") => Field::Known(6, &["tcp"]),
                Some("nfproto") if v6 => Field::Known(10, &["ipv6"]),
                Some("nfproto") => Field::Known(2, &["ipv4"]),
                Some("protocol") if v6 => Field::Known(0x86dd, &["ip6"]),
                Some("protocol") => Field::Known(0x0800, &["ip"]),
                _ => Field::Unknown,
            },
            _ => Field::Unknown,
        }
    }
}

/// A number, or a string holding one.
fn number(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_str()?.parse().ok())
}

/// Whether `x` (named `names`) is one of the set's elements; `None` when an element cannot
/// be read and none matched.
fn contains(set: &[Value], x: u64, names: &[&str]) -> Option<bool> {
    let mut undecided = false;
    for e in set {
        match element(e, x, names) {
            Some(true) => return Some(true),
            Some(false) => {}
            None => undecided = true,
        }
    }
    (!undecided).then_some(false)
}

fn element(e: &Value, x: u64, names: &[&str]) -> Option<bool> {
    if let Some(n) = number(e) {
        return Some(n == x);
    }
    match e {
        // A symbol of a symbolic field (`tcp`, `ipv4`): ours or another's. A port's service
        // name cannot be told.
        Value::String(s) if !names.is_empty() => Some(names.contains(&s.as_str())),
        Value::Object(o) => match (o.get("range"), o.get("elem")) {
            (Some(Value::Array(r)), _) => match r.as_slice() {
                [lo, hi] => Some((number(lo)?..=number(hi)?).contains(&x)),
                _ => None,
            },
            (_, Some(el)) => element(el.get("val")?, x, names),
            _ => None,
        },
        _ => None,
    }
}

/// A verdict map's verdict for `x`: `Some(None)` when no key is `x`, `None` when a key
/// cannot be read and none matched.
fn lookup<'a>(entries: &'a [Value], x: u64, names: &[&str]) -> Option<Option<&'a Value>> {
    let mut undecided = false;
    for pair in entries {
        match (pair.get(0).map(|k| element(k, x, names)), pair.get(1)) {
            (Some(Some(true)), Some(v)) => return Some(Some(v)),
            (Some(Some(false)), _) => {}
            _ => undecided = true,
        }
    }
    (!undecided).then_some(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recorded: `nft -j list ruleset` (nftables 1.0.6) in a fresh namespace.
    const EMPTY: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}]}"#;

    /// Recorded from: `ip nat` (dstnat: tcp dport 8080 redirect to :80), `ip raw` (raw:
    /// ip saddr 192.0.2.1 counter), `inet fw` (set web { 80, 443, 8000-8100 }, map svc
    /// { 22 : jump ssh, 5432 : drop }; input, policy drop: jump common, udp dport 53 accept,
    /// tcp dport @web accept, tcp dport vmap @svc, tcp dport vmap { 9000 : accept, 9001 :
    /// goto ssh }, ip6 nexthdr tcp tcp dport 7000 accept, ip saddr 10.0.0.1 drop; common: tcp
    /// dport 3 drop, counter; ssh: tcp dport 22 counter, ip saddr 10.0.0.0/8 accept; pre
    /// (mangle): tcp dport 1 drop), `ip6 f6` (input, priority 10: tcp dport 7000 drop), and a
    /// dormant `ip off` (input, policy drop).
    const MIXED: &str = r#"{"nftables": [
{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
{"table": {"family": "ip", "name": "nat", "handle": 1}},
{"chain": {"family": "ip", "table": "nat", "name": "PREROUTING", "handle": 1, "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}},
{"rule": {"family": "ip", "table": "nat", "chain": "PREROUTING", "handle": 2, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 8080}}, {"redirect": {"port": 80}}]}},
{"table": {"family": "ip", "name": "raw", "handle": 2}},
{"chain": {"family": "ip", "table": "raw", "name": "PREROUTING", "handle": 1, "type": "filter", "hook": "prerouting", "prio": -300, "policy": "accept"}},
{"rule": {"family": "ip", "table": "raw", "chain": "PREROUTING", "handle": 2, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "192.0.2.1"}}, {"counter": {"packets": 0, "bytes": 0}}]}},
{"table": {"family": "inet", "name": "fw", "handle": 3}},
{"set": {"family": "inet", "name": "web", "table": "fw", "type": "inet_service", "handle": 5, "flags": ["interval"], "elem": [80, 443, {"range": [8000, 8100]}]}},
{"map": {"family": "inet", "name": "svc", "table": "fw", "type": "inet_service", "handle": 6, "map": "verdict", "elem": [[22, {"jump": {"target": "ssh"}}], [5432, {"drop": null}]]}},
{"chain": {"family": "inet", "table": "fw", "name": "input", "handle": 1, "type": "filter", "hook": "input", "prio": 0, "policy": "drop"}},
{"chain": {"family": "inet", "table": "fw", "name": "common", "handle": 2}},
{"chain": {"family": "inet", "table": "fw", "name": "ssh", "handle": 3}},
{"chain": {"family": "inet", "table": "fw", "name": "pre", "handle": 4, "type": "filter", "hook": "prerouting", "prio": -150, "policy": "accept"}},
{"rule": {"family": "inet", "table": "fw", "chain": "input", "handle": 7, "expr": [{"jump": {"target": "common"}}]}},
{"rule": {"family": "inet", "table": "fw", "chain": "input", "handle": 8, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "udp", "field": "dport"}}, "right": 53}}, {"accept": null}]}},
{"rule": {"family": "inet", "table": "fw", "chain": "input", "handle": 9, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": "@web"}}, {"accept": null}]}},
{"rule": {"family": "inet", "table": "fw", "chain": "input", "handle": 10, "expr": [{"vmap": {"key": {"payload": {"protocol": "tcp", "field": "dport"}}, "data": "@svc"}}]}},
{"rule": {"family": "inet", "table": "fw", "chain": "input", "handle": 12, "expr": [{"vmap": {"key": {"payload": {"protocol": "tcp", "field": "dport"}}, "data": {"set": [[9000, {"accept": null}], [9001, {"goto": {"target": "ssh"}}]]}}}]}},
{"rule": {"family": "inet", "table": "fw", "chain": "input", "handle": 13, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip6", "field": "nexthdr"}}, "right": "tcp"}}, {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 7000}}, {"accept": null}]}},
{"rule": {"family": "inet", "table": "fw", "chain": "input", "handle": 14, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "10.0.0.1"}}, {"drop": null}]}},
{"rule": {"family": "inet", "table": "fw", "chain": "common", "handle": 15, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 3}}, {"drop": null}]}},
{"rule": {"family": "inet", "table": "fw", "chain": "common", "handle": 16, "expr": [{"counter": {"packets": 0, "bytes": 0}}]}},
{"rule": {"family": "inet", "table": "fw", "chain": "ssh", "handle": 17, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 22}}, {"counter": {"packets": 0, "bytes": 0}}]}},
{"rule": {"family": "inet", "table": "fw", "chain": "ssh", "handle": 18, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": {"prefix": {"addr": "10.0.0.0", "len": 8}}}}, {"accept": null}]}},
{"rule": {"family": "inet", "table": "fw", "chain": "pre", "handle": 19, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 1}}, {"drop": null}]}},
{"table": {"family": "ip6", "name": "f6", "handle": 4}},
{"chain": {"family": "ip6", "table": "f6", "name": "in", "handle": 1, "type": "filter", "hook": "input", "prio": 10, "policy": "accept"}},
{"rule": {"family": "ip6", "table": "f6", "chain": "in", "handle": 2, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 7000}}, {"drop": null}]}},
{"table": {"family": "ip", "name": "off", "handle": 5, "flags": "off"}},
{"chain": {"family": "ip", "table": "off", "name": "in", "handle": 1, "type": "filter", "hook": "input", "prio": 0, "policy": "drop"}}
]}"#;

    /// Recorded after `iptables -A INPUT`: `-p tcp --dport 1234 -j ACCEPT`, `-p tcp -m
    /// multiport --dports 80,443,8000:8100 -j ACCEPT`, `-m conntrack --ctstate
    /// ESTABLISHED,RELATED -j ACCEPT`, `-s 10.0.0.1 -j DROP`, `-p tcp --dport 22 -j REJECT
    /// --reject-with tcp-reset`, `-p udp --dport 53 -j ACCEPT`, `-p tcp --dport 1000:2000 -j
    /// LOG`, `-j mychain` (`-p tcp --sport 5 -j RETURN`), `-i lo -j ACCEPT`, `-p tcp --syn -j
    /// DROP`, `-P INPUT DROP`; `iptables -t nat -A PREROUTING -p tcp --dport 8080 -j REDIRECT
    /// --to-ports 80`; `ip6tables -A INPUT -p tcp --dport 1234 -j ACCEPT`.
    const IPTABLES: &str = r#"{"nftables": [
{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
{"table": {"family": "ip", "name": "filter", "handle": 1}},
{"chain": {"family": "ip", "table": "filter", "name": "INPUT", "handle": 1, "type": "filter", "hook": "input", "prio": 0, "policy": "drop"}},
{"chain": {"family": "ip", "table": "filter", "name": "mychain", "handle": 9}},
{"rule": {"family": "ip", "table": "filter", "chain": "INPUT", "handle": 2, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 1234}}, {"counter": {"packets": 0, "bytes": 0}}, {"accept": null}]}},
{"rule": {"family": "ip", "table": "filter", "chain": "INPUT", "handle": 3, "expr": [{"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}}, {"xt": {"type": "match", "name": "multiport"}}, {"counter": {"packets": 0, "bytes": 0}}, {"accept": null}]}},
{"rule": {"family": "ip", "table": "filter", "chain": "INPUT", "handle": 4, "expr": [{"xt": {"type": "match", "name": "conntrack"}}, {"counter": {"packets": 0, "bytes": 0}}, {"accept": null}]}},
{"rule": {"family": "ip", "table": "filter", "chain": "INPUT", "handle": 5, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "10.0.0.1"}}, {"counter": {"packets": 0, "bytes": 0}}, {"drop": null}]}},
{"rule": {"family": "ip", "table": "filter", "chain": "INPUT", "handle": 6, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 22}}, {"counter": {"packets": 0, "bytes": 0}}, {"xt": {"type": "target", "name": "REJECT"}}]}},
{"rule": {"family": "ip", "table": "filter", "chain": "INPUT", "handle": 7, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "udp", "field": "dport"}}, "right": 53}}, {"counter": {"packets": 0, "bytes": 0}}, {"accept": null}]}},
{"rule": {"family": "ip", "table": "filter", "chain": "INPUT", "handle": 8, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": {"range": [1000, 2000]}}}, {"counter": {"packets": 0, "bytes": 0}}, {"xt": {"type": "target", "name": "LOG"}}]}},
{"rule": {"family": "ip", "table": "filter", "chain": "INPUT", "handle": 11, "expr": [{"counter": {"packets": 0, "bytes": 0}}, {"jump": {"target": "mychain"}}]}},
{"rule": {"family": "ip", "table": "filter", "chain": "INPUT", "handle": 12, "expr": [{"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "lo"}}, {"counter": {"packets": 0, "bytes": 0}}, {"accept": null}]}},
{"rule": {"family": "ip", "table": "filter", "chain": "INPUT", "handle": 13, "expr": [{"match": {"op": "==", "left": {"&": [{"payload": {"protocol": "tcp", "field": "flags"}}, ["fin", "syn", "rst", "ack"]]}, "right": "syn"}}, {"counter": {"packets": 0, "bytes": 0}}, {"drop": null}]}},
{"rule": {"family": "ip", "table": "filter", "chain": "mychain", "handle": 10, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "sport"}}, "right": 5}}, {"counter": {"packets": 0, "bytes": 0}}, {"return": null}]}},
{"table": {"family": "ip", "name": "nat", "handle": 2}},
{"chain": {"family": "ip", "table": "nat", "name": "PREROUTING", "handle": 1, "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}},
{"rule": {"family": "ip", "table": "nat", "chain": "PREROUTING", "handle": 2, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 8080}}, {"counter": {"packets": 0, "bytes": 0}}, {"xt": {"type": "target", "name": "REDIRECT"}}]}},
{"table": {"family": "ip6", "name": "filter", "handle": 3}},
{"chain": {"family": "ip6", "table": "filter", "name": "INPUT", "handle": 1, "type": "filter", "hook": "input", "prio": 0, "policy": "accept"}},
{"rule": {"family": "ip6", "table": "filter", "chain": "INPUT", "handle": 2, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 1234}}, {"counter": {"packets": 0, "bytes": 0}}, {"accept": null}]}}
]}"#;

    /// Each walk as `family table chain hook priority: walked of rules, verdict [by handle]`.
    fn summary(json: &str, port: Option<u16>, ipv6: bool) -> Vec<String> {
        let n = walk(json, port, ipv6).unwrap();
        let by = |w: &ChainWalk| w.decided_by.map_or(String::new(), |h| format!(" by {h}"));
        n.walks
            .iter()
            .map(|w| {
                let (f, t, c, h) = (&w.family, &w.table, &w.chain, &w.hook);
                format!(
                    "{f} {t} {c} {h} {}: {} of {}, {}{}",
                    w.priority,
                    w.walked,
                    w.rules,
                    w.verdict,
                    by(w)
                )
            })
            .collect()
    }

    /// An `inet t` table whose input chain (policy accept) holds one rule per `expr` array,
    /// handles from 2, shaped as nft 1.0.6 writes it.
    fn input_chain(exprs: impl IntoIterator<Item = String>) -> String {
        let mut items = vec![
            r#"{"metainfo": {"version": "1.0.6", "json_schema_version": 1}}"#.to_string(),
            r#"{"table": {"family": "inet", "name": "t", "handle": 1}}"#.into(),
            r#"{"chain": {"family": "inet", "table": "t", "name": "input", "handle": 1, "type": "filter", "hook": "input", "prio": 0, "policy": "accept"}}"#.into(),
        ];
        items.extend(
            exprs
                .into_iter()
                .zip(2..)
                .map(|(e, h)| rule("input", h, &e)),
        );
        format!(r#"{{"nftables": [{}]}}"#, items.join(",\n"))
    }

    /// `json` (from [`input_chain`]) with a chain `sub` in table `t`, handles from 100.
    fn with_sub(json: &str, exprs: &[String]) -> String {
        let chain = r#"{"chain": {"family": "inet", "table": "t", "name": "sub", "handle": 9}}"#;
        let rules = exprs.iter().zip(100..).map(|(e, h)| rule("sub", h, e));
        let items: Vec<String> = std::iter::once(chain.to_string()).chain(rules).collect();
        format!("{},\n{}]}}", json.trim_end_matches("]}"), items.join(",\n"))
    }

    fn rule(chain: &str, handle: u64, expr: &str) -> String {
        format!(
            r#"{{"rule": {{"family": "inet", "table": "t", "chain": "{chain}", "handle": {handle}, "expr": {expr}}}}}"#
        )
    }

    /// `tcp dport RIGHT accept`.
    fn accept_dport(right: &str) -> String {
        format!(
            r#"[{{"match": {{"op": "==", "left": {{"payload": {{"protocol": "tcp", "field": "dport"}}}}, "right": {right}}}}}, {{"accept": null}}]"#
        )
    }

    #[test]
    fn an_empty_ruleset_has_no_walk_and_garbage_is_an_error() {
        let n = walk(EMPTY, Some(80), false).unwrap();
        assert_eq!((n.rules, n.walks.len(), n.source.as_str()), (0, 0, SOURCE));
        for bad in ["", "[]", r#"{"nftables": 3}"#, r#"{"nftables": [7]}"#] {
            assert!(walk(bad, Some(80), false).is_err(), "{bad}");
        }
        let orphan = r#"{"nftables": [{"rule": {"family": "ip", "table": "t", "chain": "c", "handle": 2, "expr": []}}]}"#;
        assert!(
            walk(orphan, Some(80), false)
                .unwrap_err()
                .contains("undeclared chain")
        );
    }

    #[test]
    fn a_linear_chain_is_walked_rule_by_rule_and_a_set_is_one_rule() {
        let ports: Vec<u16> = (0..2000).map(|i| 10_000 + 2 * i).collect();
        let linear = input_chain(ports.iter().map(|p| accept_dport(&p.to_string())));
        assert_eq!(
            summary(&linear, Some(80), false),
            ["inet t input input 0: 2000 of 2000, policy accept"]
        );
        let list: Vec<String> = ports.iter().map(u16::to_string).collect();
        let set = input_chain([accept_dport(&format!(
            r#"{{"set": [{}]}}"#,
            list.join(", ")
        ))]);
        assert_eq!(
            summary(&set, Some(80), false),
            ["inet t input input 0: 1 of 1, policy accept"]
        );
        assert_eq!(
            summary(&set, Some(13_998), false),
            ["inet t input input 0: 1 of 1, accept by 2"]
        );
    }

    #[test]
    fn an_accept_first_rule_decides_before_the_others() {
        let rules = std::iter::once(accept_dport("443"))
            .chain((0..20_000).map(|i| accept_dport(&(20_000 + i).to_string())));
        let n = walk(&input_chain(rules), Some(443), false).unwrap();
        assert_eq!(n.rules, 20_001);
        assert_eq!(
            summary(&input_chain([accept_dport("443")]), Some(443), false),
            ["inet t input input 0: 1 of 1, accept by 2"]
        );
        assert_eq!((n.walks[0].walked, n.walks[0].decided_by), (1, Some(2)));
    }

    #[test]
    fn a_return_or_a_jump_that_may_be_taken_leaves_the_rest_undecided() {
        let (jump, mark_return) = (
            r#"[{"jump": {"target": "sub"}}]"#.to_string(),
            r#"[{"match": {"op": "==", "left": {"meta": {"key": "mark"}}, "right": 1}}, {"return": null}]"#,
        );
        let maybe_jump = r#"[{"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "eth0"}}, {"jump": {"target": "sub"}}]"#;
        let sub = [mark_return.to_string(), accept_dport("80")];
        let surely = with_sub(&input_chain([jump, accept_dport("443")]), &sub);
        assert_eq!(
            summary(&surely, Some(80), false),
            ["inet t input input 0: 3 of 4, unknown by 101"]
        );
        assert_eq!(
            summary(&surely, Some(443), false),
            ["inet t input input 0: 4 of 4, accept by 3"]
        );
        let maybe = with_sub(
            &input_chain([maybe_jump.to_string()]),
            &[accept_dport("80")],
        );
        assert_eq!(
            summary(&maybe, Some(80), false),
            ["inet t input input 0: 2 of 2, unknown by 100"]
        );
        assert_eq!(
            summary(&maybe, Some(22), false),
            ["inet t input input 0: 2 of 2, policy accept"]
        );
    }

    #[test]
    fn prerouting_then_input_by_priority_with_sets_maps_and_jumps() {
        let pre = [
            "ip raw PREROUTING prerouting -300: 1 of 1, policy accept",
            "inet fw pre prerouting -150: 1 of 1, policy accept",
            "ip nat PREROUTING prerouting -100: 1 of 1, policy accept",
        ];
        let with = |input: &str| {
            pre.iter()
                .map(|s| s.to_string())
                .chain([input.to_string()])
                .collect::<Vec<_>>()
        };
        // jump common (2 rules), udp, then the named set.
        assert_eq!(
            summary(MIXED, Some(80), false),
            with("inet fw input input 0: 5 of 11, accept by 9")
        );
        assert_eq!(walk(MIXED, Some(80), false).unwrap().rules, 15);
        // The named map jumps to ssh, whose source-address rule may accept.
        assert_eq!(
            summary(MIXED, Some(22), false),
            with("inet fw input input 0: 8 of 11, unknown by 18")
        );
        assert_eq!(
            summary(MIXED, Some(5432), false),
            with("inet fw input input 0: 6 of 11, drop by 10")
        );
        // The anonymous map's goto.
        assert_eq!(
            summary(MIXED, Some(9001), false),
            with("inet fw input input 0: 9 of 11, unknown by 18")
        );
        // The ip6 rule cannot match over IPv4; the source address may.
        assert_eq!(
            summary(MIXED, Some(6000), false),
            with("inet fw input input 0: 9 of 11, unknown by 14")
        );
        assert_eq!(
            summary(MIXED, Some(3), false),
            with("inet fw input input 0: 2 of 11, drop by 15")
        );
        // The NAT chain's redirect ends it: accept.
        assert_eq!(
            summary(MIXED, Some(8080), false)[2],
            "ip nat PREROUTING prerouting -100: 1 of 1, accept by 2"
        );
        // A drop in prerouting: nothing after it runs.
        assert_eq!(
            summary(MIXED, Some(1), false),
            [pre[0], "inet fw pre prerouting -150: 1 of 1, drop by 19"]
        );
        // No port: the worst case, undecided.
        assert_eq!(
            summary(MIXED, None, false)[3],
            "inet fw input input 0: 11 of 11, unknown"
        );
    }

    #[test]
    fn ipv6_skips_ip_tables_and_an_accept_goes_on_to_the_next_chain() {
        assert_eq!(
            summary(MIXED, Some(7000), true),
            [
                "inet fw pre prerouting -150: 1 of 1, policy accept",
                "inet fw input input 0: 8 of 11, accept by 13",
                "ip6 f6 in input 10: 1 of 1, drop by 2",
            ]
        );
        // Over IPv6 the `ip saddr` rule cannot match: the policy decides.
        assert_eq!(
            summary(MIXED, Some(6000), true)[1],
            "inet fw input input 0: 9 of 11, policy drop"
        );
    }

    #[test]
    fn iptables_nft_rules() {
        // Plain --dport is native; multiport and conntrack are opaque `xt` matches.
        assert_eq!(
            summary(IPTABLES, Some(8080), false),
            [
                "ip nat PREROUTING prerouting -100: 1 of 1, accept by 2",
                "ip filter INPUT input 0: 2 of 11, unknown by 3",
            ]
        );
        assert_eq!(
            summary(IPTABLES, Some(1234), false)[1],
            "ip filter INPUT input 0: 1 of 11, accept by 2"
        );
        assert_eq!(
            summary(IPTABLES, Some(22), true),
            ["ip6 filter INPUT input 0: 1 of 1, policy accept"]
        );
        assert_eq!(walk(IPTABLES, Some(22), false).unwrap().rules, 13);
    }

    #[test]
    fn priorities_by_name() {
        let p = |s: &str| priority(Some(&Value::String(s.into())));
        assert_eq!(
            [
                p("raw"),
                p("dstnat"),
                p("filter + 10"),
                p("mangle-5"),
                p("-7")
            ],
            [Some(-300), Some(-100), Some(10), Some(-155), Some(-7)]
        );
        assert_eq!(
            (p("bogus"), priority(Some(&Value::Bool(true)))),
            (None, None)
        );
        let named = MIXED.replace(r#""prio": -300"#, r#""prio": "srcnat""#);
        assert_eq!(
            summary(&named, Some(80), false)[2],
            "ip raw PREROUTING prerouting 100: 1 of 1, policy accept"
        );
    }

    /// A network namespace of the test's own, deleted on drop.
    struct Netns(String);

    impl Drop for Netns {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }

    #[test]
    #[ignore = "needs root"]
    fn reads_a_namespace_ruleset() {
        use std::io::Write;
        let ns = Netns(format!("lagtrace-nfwalk-{}", std::process::id()));
        let added = Command::new("ip").args(["netns", "add", &ns.0]).status();
        assert!(added.is_ok_and(|s| s.success()), "ip netns add {}", ns.0);
        let mut nft = Command::new("ip")
            .args(["netns", "exec", &ns.0, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let rules = "table inet t {\n chain input {\n  type filter hook input priority filter; policy drop;\n  \
                     tcp dport 22 accept\n  tcp dport { 80, 443 } accept\n }\n}\n";
        nft.stdin
            .take()
            .unwrap()
            .write_all(rules.as_bytes())
            .unwrap();
        assert!(nft.wait().unwrap().success());
        let layer = lagtrace_netns::NetNs::Named(ns.0.clone())
            .run(|| read(Some(443), false))
            .unwrap();
        let n = layer.get().unwrap_or_else(|| panic!("{:?}", layer.reason));
        assert_eq!(n.rules, 2);
        let w = &n.walks[..];
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!((w[0].walked, w[0].verdict.as_str()), (2, "accept"));
        let closed = lagtrace_netns::NetNs::Named(ns.0.clone())
            .run(|| read(Some(8080), false))
            .unwrap();
        assert_eq!(
            closed.get().map(|n| n.walks[0].verdict.as_str()),
            Some("policy drop")
        );
    }
}
