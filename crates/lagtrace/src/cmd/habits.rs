//! The peers' flags: one table ([`PEER_FLAGS`]) of the flags of hping3, traceroute, mtr, wrk,
//! tcpdump and tshark a user is likely to type, each `Same` here (clap declares it), `Map`ped
//! to lagtrace's own flag, `Ignore`d (no effect here, said once), or `Refuse`d with one line
//! naming what to use. [`parse`] applies the table only where clap does not know a flag, so a
//! value is never mistaken for a flag. `docs/peer-flags.md` is rendered from the table.

use std::ffi::OsString;

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// What a peer's flag is here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Here {
    /// Declared by lagtrace with the same meaning.
    Same,
    /// Replaced by these arguments (the flag's value, if it takes one, follows them).
    Map(&'static [&'static str]),
    /// Accepted and without effect: the reason (a note says it).
    Ignore(&'static str),
    /// Refused before any work: what to use instead.
    Refuse(&'static str),
}

/// One flag of a peer tool and what it is in the lagtrace command that replaces the tool.
#[derive(Debug, Clone, Copy)]
pub struct PeerFlag {
    pub peer: &'static str,
    pub command: &'static str,
    /// The flag's spellings in the peer (short and long).
    pub flags: &'static [&'static str],
    /// An example value, when the flag takes one.
    pub value: Option<&'static str>,
    /// What it does in the peer.
    pub meaning: &'static str,
    pub here: Here,
}

const fn f(
    peer: &'static str,
    command: &'static str,
    flags: &'static [&'static str],
    value: Option<&'static str>,
    meaning: &'static str,
    here: Here,
) -> PeerFlag {
    PeerFlag {
        peer,
        command,
        flags,
        value,
        meaning,
        here,
    }
}

use Here::{Ignore, Map, Refuse, Same};

const NO_SPOOF: &str = "probes leave from this host's own address and source ports (that is how \
                        replies are matched)";
const PING_KINDS: &str = "probes are TCP SYNs (-S, the default), UDP (-2), ICMP echo (-1) or \
                          timed connects (--connect)";
const ROUTE_KINDS: &str = "choose the probe with -T (TCP SYN, the default), --udp or -I (ICMP)";
const NO_ROTATE: &str = "one file per run: bound it with -c or --duration and run again";
const PAYLOAD: &str = "write the packets with -w and print a stream's payload with `lagtrace \
                       analyze FILE --follow N`";
const LIVE: &str = "capture with `lagtrace capture -i IFACE -f FILTER -w FILE`, then `lagtrace \
                    analyze FILE`";

/// Every peer flag lagtrace answers for, by peer and command.
#[rustfmt::skip] // a table: one entry a line reads best
pub const PEER_FLAGS: &[PeerFlag] = &[
    // hping3 → ping
    f("hping3", "ping", &["-S", "--syn"], None, "TCP SYN probes", Same),
    f("hping3", "ping", &["-p"], Some("80"), "destination port", Same),
    f("hping3", "ping", &["--destport"], Some("80"), "destination port", Map(&["--port"])),
    f("hping3", "ping", &["-c", "--count"], Some("3"), "number of probes", Same),
    f("hping3", "ping", &["-i", "--interval"], Some("u10000"), "interval (uN: µs)", Same),
    f("hping3", "ping", &["-1", "--icmp"], None, "ICMP echo probes", Same),
    f("hping3", "ping", &["-2", "--udp"], None, "UDP probes", Same),
    f("hping3", "ping", &["-t"], Some("64"), "TTL of the probes", Map(&["--ttl"])),
    f("hping3", "ping", &["--ttl"], Some("64"), "TTL of the probes", Same),
    f("hping3", "ping", &["-n", "--numeric"], None, "numeric output",
      Ignore("addresses are never resolved here")),
    f("hping3", "ping", &["-V", "--verbose"], None, "verbose replies",
      Ignore("every reply is printed with its time; --json has every field of every probe")),
    f("hping3", "ping", &["-q", "--quiet"], None, "only the summary",
      Refuse("there is no quiet mode: --json prints the statistics for a script to read")),
    f("hping3", "ping", &["--fast"], None, "10 probes a second", Map(&["-i", "100ms"])),
    f("hping3", "ping", &["--faster", "--flood"], None, "send as fast as possible",
      Refuse("ping has no flood mode (hping3 --flood): pace probes with -i (e.g. -i u1000), \
              or load the server with `lagtrace load`")),
    f("hping3", "ping", &["-a", "--spoof"], Some("10.0.0.9"), "spoofed source address",
      Refuse(NO_SPOOF)),
    f("hping3", "ping", &["--rand-source", "--rand-dest"], None, "random addresses",
      Refuse(NO_SPOOF)),
    f("hping3", "ping", &["-s", "--baseport"], Some("2000"), "base source port",
      Refuse(NO_SPOOF)),
    f("hping3", "ping", &["-k", "--keep"], None, "keep the source port", Refuse(NO_SPOOF)),
    f("hping3", "ping", &["-M", "--setseq", "-L", "--setack"], Some("1"),
      "TCP sequence/ack number", Refuse(NO_SPOOF)),
    f("hping3", "ping", &["-d", "--data"], Some("100"), "payload size",
      Refuse("the payload is fixed (none for TCP probes, 12 bytes for UDP and ICMP); to time \
              requests with a body use `lagtrace load --body`")),
    f("hping3", "ping", &["-I", "--interface"], Some("eth0"), "interface",
      Refuse("the route to the target picks the interface; to probe from a namespace run \
              `ip netns exec NAME lagtrace ping`")),
    f("hping3", "ping", &["-A", "--ack", "-F", "--fin", "-R", "--rst", "-P", "--push", "-U",
                          "--urg", "-X", "--xmas", "-Y", "--ymas"], None, "other TCP flags",
      Refuse(PING_KINDS)),
    f("hping3", "ping", &["-w", "--win"], Some("512"), "TCP window of the probes",
      Refuse(PING_KINDS)),
    f("hping3", "ping", &["-8", "--scan"], Some("1-1000"), "port scan",
      Refuse("port scans are out of scope: ping one port with -p")),
    f("hping3", "ping", &["-T", "--traceroute"], None, "traceroute mode",
      Refuse("use `lagtrace route` (TCP SYN probes, all TTLs at once)")),
    // traceroute → route
    f("traceroute", "route", &["-T", "--tcp"], None, "TCP SYN probes", Same),
    f("traceroute", "route", &["-I", "--icmp"], None, "ICMP echo probes", Same),
    f("traceroute", "route", &["-U"], None, "UDP probes", Map(&["--udp"])),
    f("traceroute", "route", &["--udp"], None, "UDP probes", Same),
    f("traceroute", "route", &["-p", "--port"], Some("80"), "destination port", Same),
    f("traceroute", "route", &["-q", "--queries"], Some("3"), "probes per hop", Same),
    f("traceroute", "route", &["-m", "--max-hops"], Some("30"), "maximum TTL", Same),
    f("traceroute", "route", &["-n"], None, "numeric output", Same),
    f("traceroute", "route", &["-w"], Some("2"), "wait for replies", Same),
    f("traceroute", "route", &["--wait"], Some("2"), "wait for replies", Map(&["--timeout"])),
    f("traceroute", "route", &["-N", "--sim-queries"], Some("16"), "probes in flight",
      Ignore("every TTL of a round is probed at once")),
    f("traceroute", "route", &["-z", "--sendwait"], Some("0.1"), "pause between probes",
      Refuse("the probes of a round leave at once; --interval paces rounds with --report N")),
    f("traceroute", "route", &["-f", "--first"], Some("3"), "first TTL",
      Refuse("every round probes from TTL 1; read the hops you need from the table")),
    f("traceroute", "route", &["-A", "--as-path-lookups"], None, "AS path lookups",
      Refuse("no AS lookups: route sends nothing but its probes")),
    f("traceroute", "route", &["-e", "--extensions"], None, "ICMP extensions (MPLS)",
      Refuse("ICMP extensions (MPLS labels) are not decoded")),
    f("traceroute", "route", &["-s", "--source"], Some("10.0.0.1"), "source address",
      Refuse("probes leave from the source address of the route to the target")),
    f("traceroute", "route", &["-i", "--interface"], Some("eth0"), "interface (traceroute) or \
      interval (mtr)",
      Refuse("mtr's interval between rounds is --interval here; the interface is the one the \
              route to the target uses")),
    f("traceroute", "route", &["-M", "--module"], Some("tcp"), "probe method", Refuse(ROUTE_KINDS)),
    f("traceroute", "route", &["-4", "-6"], None, "address family",
      Refuse("give the target as an IPv4 or IPv6 address: its family decides")),
    f("traceroute", "route", &["-F", "--dont-fragment", "--mtu"], None, "path MTU discovery",
      Refuse("probes are small and not fragmented; the path MTU is not probed")),
    f("traceroute", "route", &["-t", "--tos"], Some("16"), "type of service",
      Refuse("the probes' TOS is not settable")),
    f("traceroute", "route", &["--sport"], Some("4000"), "source port",
      Refuse("route picks the probes' ports itself (one flow for every probe, Paris-style)")),
    // mtr → route
    f("mtr", "route", &["-r"], None, "report mode", Same),
    f("mtr", "route", &["-c", "--count"], Some("10"), "report rounds", Same),
    f("mtr", "route", &["--report-cycles"], Some("10"), "report rounds", Map(&["--count"])),
    f("mtr", "route", &["--no-dns"], None, "numeric output",
      Ignore("addresses are never resolved here")),
    f("mtr", "route", &["-b", "--show-ips"], None, "show addresses",
      Ignore("hops are always shown by address")),
    f("mtr", "route", &["--report-wide"], None, "untruncated report",
      Ignore("the report never truncates a hop")),
    f("mtr", "route", &["-u"], None, "UDP probes", Map(&["--udp"])),
    f("mtr", "route", &["-P"], Some("443"), "destination port", Map(&["--port"])),
    f("mtr", "route", &["--interval"], Some("1s"), "time between rounds", Same),
    f("mtr", "route", &["--max-ttl"], Some("30"), "maximum TTL", Map(&["--max-hops"])),
    f("mtr", "route", &["--first-ttl"], Some("3"), "first TTL",
      Refuse("every round probes from TTL 1; read the hops you need from the table")),
    f("mtr", "route", &["-j"], None, "JSON output", Map(&["--json"])),
    f("mtr", "route", &["--json"], None, "JSON output", Same),
    f("mtr", "route", &["-l", "--raw", "-x", "--xml", "-C", "--csv", "--split"], None,
      "machine-readable output", Refuse("--json prints the report as JSON")),
    f("mtr", "route", &["--curses", "-g", "--gtk", "--displaymode"], None,
      "interactive display",
      Refuse("no interactive display: --report N prints the table after N rounds")),
    f("mtr", "route", &["--aslookup", "-y", "--ipinfo"], None, "AS / IP info lookups",
      Refuse("no AS lookups: route sends nothing but its probes")),
    f("mtr", "route", &["--psize", "-B", "--bitpattern"], Some("100"), "probe size / payload",
      Refuse("the probe size is fixed (headers, and 12 bytes for UDP and ICMP)")),
    f("mtr", "route", &["-Q"], Some("16"), "type of service",
      Refuse("the probes' TOS is not settable")),
    f("mtr", "route", &["--mpls"], None, "MPLS labels",
      Refuse("ICMP extensions (MPLS labels) are not decoded")),
    f("mtr", "route", &["-a", "--address"], Some("10.0.0.1"), "source address",
      Refuse("probes leave from the source address of the route to the target")),
    f("mtr", "route", &["-o", "--order"], Some("LSD"), "report columns",
      Refuse("the columns are fixed; --json has every statistic")),
    f("mtr", "route", &["-Z"], Some("10"), "probe timeout", Map(&["--timeout"])),
    f("mtr", "route", &["-G", "--gracetime"], Some("5"), "wait for late replies",
      Map(&["--timeout"])),
    // wrk, wrk2 → load
    f("wrk", "load", &["-t", "--threads"], Some("2"), "threads", Same),
    f("wrk", "load", &["-c", "--connections"], Some("10"), "connections", Same),
    f("wrk", "load", &["-d", "--duration"], Some("1s"), "duration", Same),
    f("wrk", "load", &["-H", "--header"], Some("Accept: */*"), "request header", Same),
    f("wrk", "load", &["--latency"], None, "latency distribution", Same),
    f("wrk", "load", &["--timeout"], Some("2s"), "request timeout", Same),
    f("wrk", "load", &["-s", "--script"], Some("post.lua"), "Lua script",
      Refuse("Lua scripts (wrk -s) are not supported: lagtrace load sends one request, set \
              with -m/--method, -H/--header and --body/--body-file")),
    f("wrk", "load", &["-v"], None, "print the version", Map(&["--version"])),
    f("wrk2", "load", &["-R", "--rate"], Some("100"), "constant throughput", Same),
    f("wrk2", "load", &["-L"], None, "latency distribution", Map(&["--latency"])),
    f("wrk2", "load", &["-U", "--u_latency"], None, "uncorrected latency",
      Map(&["--uncorrected"])),
    f("wrk2", "load", &["-D", "--dist"], Some("exp"), "arrival distribution",
      Refuse("requests are sent at a constant rate (-R), each timed from its intended start")),
    f("wrk2", "load", &["-B", "--batch_latency"], None, "latency of batches",
      Refuse("latency is measured per request")),
    f("wrk2", "load", &["-P"], None, "print every latency",
      Refuse("--records FILE writes the slowest requests' timings and a weighted sample of \
              the others; --hdr-log FILE every latency")),
    // tcpdump → capture
    f("tcpdump", "capture", &["-i", "--interface"], Some("lo"), "interface", Same),
    f("tcpdump", "capture", &["-w"], Some("out.pcap"), "write a file", Same),
    f("tcpdump", "capture", &["-c"], Some("10"), "packet count", Same),
    f("tcpdump", "capture", &["-s"], Some("96"), "snap length", Same),
    f("tcpdump", "capture", &["--snapshot-length"], Some("96"), "snap length",
      Map(&["--snaplen"])),
    f("tcpdump", "capture", &["-B"], Some("4096"), "buffer in KiB", Same),
    f("tcpdump", "capture", &["--buffer-size"], Some("4096"), "buffer in KiB", Map(&["-B"])),
    f("tcpdump", "capture", &["-n", "-nn"], None, "numeric output", Same),
    f("tcpdump", "capture", &["-r"], Some("case.pcap"), "read a file",
      Refuse("capture reads the wire; to read a capture file (tcpdump -r FILE) run \
              `lagtrace analyze FILE`")),
    f("tcpdump", "capture", &["-v", "-vv", "-vvv"], None, "verbose decode",
      Refuse("capture prints one line a packet: write them with -w and read them with \
              `lagtrace analyze -v FILE`")),
    f("tcpdump", "capture", &["-A", "-X", "-XX", "-x", "-xx"], None, "print payloads",
      Refuse(PAYLOAD)),
    f("tcpdump", "capture", &["-e"], None, "link-level headers",
      Refuse("link-level headers are not printed; -w keeps them in the file")),
    f("tcpdump", "capture", &["-D", "--list-interfaces"], None, "list interfaces",
      Refuse("`ip -br link` lists them; -i any captures on all")),
    f("tcpdump", "capture", &["-G", "-C", "-W"], Some("60"), "file rotation", Refuse(NO_ROTATE)),
    f("tcpdump", "capture", &["-p", "--no-promiscuous-mode"], None, "no promiscuous mode",
      Ignore("the interface is put in promiscuous mode only with --promisc")),
    f("tcpdump", "capture", &["-U", "--packet-buffered"], None, "write each packet at once",
      Ignore("the file is written through a buffer and complete when the capture stops")),
    f("tcpdump", "capture", &["-Q", "--direction"], Some("in"), "direction",
      Refuse("no direction option: add `src host X` or `dst host X` to the filter")),
    f("tcpdump", "capture", &["-F"], Some("filter.txt"), "filter from a file",
      Refuse("give the filter with -f or after the options: -f \"$(cat FILE)\"")),
    f("tcpdump", "capture", &["-y", "--linktype"], Some("EN10MB"), "link type",
      Refuse("the interface's own link type is captured")),
    f("tcpdump", "capture", &["-I", "--monitor-mode"], None, "monitor mode",
      Refuse("no Wi-Fi monitor mode")),
    // tshark → analyze
    f("tshark", "analyze", &["-r"], None, "read the file that follows", Same),
    f("tshark", "analyze", &["-n"], None, "numeric output", Same),
    f("tshark", "analyze", &["-q"], None, "no per-packet lines",
      Ignore("analyze prints its report, never a line a packet")),
    f("tshark", "analyze", &["-2"], None, "two-pass analysis",
      Ignore("the analysis always sees the whole file")),
    f("tshark", "analyze", &["-V"], None, "packet details",
      Refuse("no per-packet tree: -v lists every finding, --stream N --flow draws a stream, \
              --follow N prints its payload")),
    f("tshark", "analyze", &["-z"], Some("conv,tcp"), "statistics",
      Refuse("analyze prints its statistics (streams, transactions, findings) by default; \
              --json has them all")),
    f("tshark", "analyze", &["-Y", "-R"], Some("tcp.port==80"), "display filter",
      Refuse("no display filters: filter when capturing (`lagtrace capture -f 'tcp port 80'`) \
              or pick one stream with --stream N")),
    f("tshark", "analyze", &["-T", "-e", "-E"], Some("json"), "output format / fields",
      Refuse("--json prints everything as JSON (pick fields with jq)")),
    f("tshark", "analyze", &["-x"], None, "hex dump", Refuse("--follow N prints stream N's payload")),
    f("tshark", "analyze", &["-c"], Some("100"), "packet count",
      Refuse("the whole file is analysed; cut it first with `editcap -r IN OUT 1-100`")),
    f("tshark", "analyze", &["-w"], Some("out.pcap"), "write a file",
      Refuse("--annotate OUT.pcapng writes the capture back with the findings as comments")),
    f("tshark", "analyze", &["-i", "-f"], Some("eth0"), "live capture", Refuse(LIVE)),
    f("tshark", "analyze", &["-o"], Some("tcp.analyze_sequence_numbers:TRUE"), "preference",
      Refuse("no preferences: the TCP analysis is always on")),
];

/// The entry for `flag` given to `command`.
pub fn lookup(command: &str, flag: &str) -> Option<&'static PeerFlag> {
    PEER_FLAGS
        .iter()
        .find(|p| p.command == command && p.flags.contains(&flag))
}

/// The line a refused or ignored flag gets.
fn line(p: &PeerFlag, flag: &str, why: &str) -> String {
    format!("{} {flag} ({}'s {}): {why}", p.command, p.peer, p.meaning)
}

/// Parsing with the table: the arguments clap does not know are looked up; a mapped one is
/// replaced and parsing retried, an ignored one removed (with a note), a refused one ends
/// parsing with its line. Anything else is clap's own error.
pub enum Parsed<T> {
    Ok(T, Vec<String>),
    Refused(String),
    Clap(clap::Error),
}

pub fn parse<T: clap::Parser>(mut args: Vec<OsString>) -> Parsed<T> {
    let mut notes = Vec::new();
    for _ in 0..=args.len() {
        let err = match T::try_parse_from(&args) {
            Ok(t) => return Parsed::Ok(t, notes),
            Err(e) => e,
        };
        let bad = match (err.kind(), err.get(ContextKind::InvalidArg)) {
            (ErrorKind::UnknownArgument, Some(ContextValue::String(s))) => {
                s.split('=').next().unwrap_or(s).to_string()
            }
            _ => return Parsed::Clap(err),
        };
        let Some((at, command)) = subcommand(&args) else {
            return Parsed::Clap(err);
        };
        let Some(p) = lookup(&command, &bad) else {
            return Parsed::Clap(err);
        };
        let (to, why): (&[&str], String) = match p.here {
            Here::Same => return Parsed::Clap(err),
            Here::Refuse(why) => return Parsed::Refused(line(p, &bad, why)),
            Here::Ignore(why) => (&[], line(p, &bad, why)),
            Here::Map(to) => (
                to,
                format!(
                    "{} {bad} ({}'s {}) is {} here",
                    p.command,
                    p.peer,
                    p.meaning,
                    to.join(" ")
                ),
            ),
        };
        if !replace(&mut args, at, &bad, p.value.is_some(), to) {
            return Parsed::Clap(err);
        }
        notes.push(why);
    }
    Parsed::Refused("too many peer flags to rewrite".into())
}

/// A line for clap errors whose own words mislead: a second positional word is read as a
/// subcommand ("the subcommand 'http://…' cannot be used with --threads …" blames the URL
/// when the stray word is the one before it).
pub fn explain(err: &clap::Error, args: &[OsString], top: &clap::Command) -> Option<String> {
    let Some(ContextValue::String(word)) = err.get(ContextKind::InvalidSubcommand) else {
        return None;
    };
    let (at, name) = subcommand(args)?;
    let cmd = top.find_subcommand(&name)?;
    if cmd.find_subcommand(word).is_some() {
        return None;
    }
    let wanted = cmd
        .get_positionals()
        .map(|a| a.get_id().as_str().to_uppercase())
        .collect::<Vec<_>>()
        .join(" ");
    // The positional words before `word`: the first of them took the place it wanted.
    let mut words = Vec::new();
    let mut i = at + 1;
    while i < args.len() {
        let a = args[i].to_string_lossy().into_owned();
        if a == *word {
            break;
        }
        if let Some(flag) = a.strip_prefix("--") {
            let takes = cmd
                .get_arguments()
                .find(|x| x.get_long() == Some(flag))
                .is_some_and(|x| x.get_action().takes_values());
            i += if takes { 2 } else { 1 };
            continue;
        }
        if let Some(short) = a.strip_prefix('-').filter(|s| s.len() == 1) {
            let c = short.chars().next();
            let takes = cmd
                .get_arguments()
                .find(|x| x.get_short() == c)
                .is_some_and(|x| x.get_action().takes_values());
            i += if takes { 2 } else { 1 };
            continue;
        }
        if !a.starts_with('-') {
            words.push(a);
        }
        i += 1;
    }
    Some(match words.first() {
        Some(first) => format!(
            "{name} takes one {wanted}: '{first}' was read as it, and '{word}' is one word too \
             many (remove '{first}'?)"
        ),
        None => format!("{name} takes one {wanted}: '{word}' is one word too many"),
    })
}

/// The position and name of the subcommand: the first argument that is not an option.
fn subcommand(args: &[OsString]) -> Option<(usize, String)> {
    args.iter()
        .enumerate()
        .skip(1)
        .find(|(_, a)| !a.to_string_lossy().starts_with('-'))
        .map(|(i, a)| (i, a.to_string_lossy().into_owned()))
}

/// Replaces the first `flag` after the subcommand (`-x V`, `-xV`, `--flag V`, `--flag=V`)
/// by `to`, keeping its value after `to`; with `to` empty the value goes too. False when the
/// flag is not found as one argument (e.g. inside a cluster of short flags).
fn replace(args: &mut Vec<OsString>, at: usize, flag: &str, has_value: bool, to: &[&str]) -> bool {
    let long = flag.starts_with("--");
    for i in at + 1..args.len() {
        let a = args[i].to_string_lossy().into_owned();
        if a == "--" {
            return false;
        }
        let attached = if a == flag {
            None
        } else if long && a.starts_with(&format!("{flag}=")) {
            Some(a[flag.len() + 1..].to_string())
        } else if !long && has_value && a.len() > flag.len() && a.starts_with(flag) {
            Some(a[flag.len()..].to_string())
        } else {
            continue;
        };
        let mut with: Vec<OsString> = to.iter().map(OsString::from).collect();
        let mut end = i + 1;
        match attached {
            Some(v) if !to.is_empty() => with.push(v.into()),
            None if has_value && i + 1 < args.len() => {
                if !to.is_empty() {
                    with.push(args[i + 1].clone());
                }
                end = i + 2;
            }
            _ => {}
        }
        args.splice(i..end, with);
        return true;
    }
    false
}

/// The table as Markdown (docs/peer-flags.md, checked by a test).
#[cfg(test)]
fn markdown() -> String {
    let mut out = String::from(
        "# The peers' flags in lagtrace\n\n\
         Generated from `crates/lagtrace/src/cmd/habits.rs` (`LAGTRACE_BLESS=1 cargo test -p \
         lagtrace peer_flags` rewrites it). Every flag here is answered: **same** (declared with \
         the same meaning), **is** another flag here, **ignored** (no effect here; a note says \
         so), or **refused** before any work with one line saying what to use.\n",
    );
    let mut last = "";
    for p in PEER_FLAGS {
        if p.peer != last {
            out.push_str(&format!(
                "\n## {} → `lagtrace {}`\n\n| flag | in {} | here |\n|---|---|---|\n",
                p.peer, p.command, p.peer
            ));
            last = p.peer;
        }
        let flags = p
            .flags
            .iter()
            .map(|f| match p.value {
                Some(v) => format!("`{f} {v}`"),
                None => format!("`{f}`"),
            })
            .collect::<Vec<_>>()
            .join(", ");
        let here = match p.here {
            Here::Same => "same".to_string(),
            Here::Map(to) => format!("is `{}`", to.join(" ")),
            Here::Ignore(why) => format!("ignored: {why}"),
            Here::Refuse(why) => format!("refused: {why}"),
        };
        out.push_str(&format!(
            "| {flags} | {} | {} |\n",
            p.meaning,
            here.replace('|', "\\|")
        ));
    }
    out
}

/// hping3's interval `uN` (N microseconds), else what `parse` accepts.
pub fn hping_interval(
    s: &str,
    parse: fn(&str) -> Result<std::time::Duration, String>,
) -> Result<std::time::Duration, String> {
    match s.strip_prefix('u') {
        Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
            parse(&format!("{n}us"))
        }
        _ => parse(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::collections::HashSet;
    use std::time::Duration;

    fn os<S: AsRef<str>>(args: &[S]) -> Vec<OsString> {
        args.iter().map(|a| OsString::from(a.as_ref())).collect()
    }

    /// Every flag of the table, given as a user would (`lagtrace CMD FLAG [VALUE] TARGET`):
    /// a `Same` flag parses as it is; every other is unknown to clap (or its entry would
    /// never be used) and is then refused in one line naming it, or parses exactly as the
    /// arguments with the flag replaced (`Map`) or removed (`Ignore`), with one note.
    #[test]
    fn every_peer_flag_is_same_mapped_ignored_or_refused() {
        let target: fn(&str) -> &'static [&'static str] = |c| match c {
            "ping" | "route" => &["127.0.0.1"],
            "load" => &["http://127.0.0.1:1/"],
            "analyze" => &["case.pcap"],
            _ => &[],
        };
        let mut seen = HashSet::new();
        let mut n = 0;
        for p in PEER_FLAGS {
            for flag in p.flags {
                assert!(
                    seen.insert((p.command, *flag)),
                    "{} {flag} twice",
                    p.command
                );
                let value: Vec<&str> = p.value.into_iter().collect();
                let line = |mid: &[&str]| -> Vec<String> {
                    let mut a = vec!["lagtrace", p.command];
                    a.extend(mid);
                    // wrk2's flags are given with its rate (--uncorrected needs it).
                    if p.peer == "wrk2" && p.flags != ["-R", "--rate"] {
                        a.extend(["--rate", "100"]);
                    }
                    a.extend(target(p.command));
                    a.into_iter().map(String::from).collect()
                };
                let args = line(&[&[*flag][..], &value].concat());
                let raw = crate::Cli::try_parse_from(os(&args));
                if p.here == Here::Same {
                    assert!(
                        raw.is_ok(),
                        "{args:?}: {:?}",
                        raw.err().map(|e| e.to_string())
                    );
                    n += 1;
                    continue;
                }
                let e = raw.expect_err("declared by clap: the table's entry is never used");
                assert_eq!(e.kind(), ErrorKind::UnknownArgument, "{args:?}: {e}");
                let named = if flag.starts_with("--") {
                    flag
                } else {
                    &flag[..2]
                };
                match (p.here, parse::<crate::Cli>(os(&args))) {
                    (Here::Refuse(why), Parsed::Refused(l)) => {
                        assert!(!l.contains('\n') && l.contains(why), "{args:?}: {l}");
                        assert!(l.starts_with(&format!("{} {named} ", p.command)), "{l}");
                    }
                    (Here::Ignore(_), Parsed::Ok(cli, notes)) => {
                        let want = crate::Cli::try_parse_from(os(&line(&[]))).expect("plain");
                        assert_eq!(format!("{cli:?}"), format!("{want:?}"), "{args:?}");
                        assert_eq!(notes.len(), 1, "{args:?}");
                    }
                    (Here::Map(to), Parsed::Ok(cli, notes)) => {
                        let mapped = line(&[to, &value].concat());
                        let want = crate::Cli::try_parse_from(os(&mapped)).expect("mapped");
                        assert_eq!(format!("{cli:?}"), format!("{want:?}"), "{args:?}");
                        assert_eq!(notes.len(), 1, "{args:?}");
                    }
                    (Here::Map(to), Parsed::Clap(e)) if to == ["--version"] => {
                        assert_eq!(e.kind(), ErrorKind::DisplayVersion, "{args:?}");
                    }
                    (h, Parsed::Refused(l)) => panic!("{args:?}: {h:?} but refused: {l}"),
                    (h, Parsed::Clap(e)) => panic!("{args:?}: {h:?} but clap says {e}"),
                    (h, Parsed::Ok(..)) => panic!("{args:?}: {h:?} but accepted"),
                }
                n += 1;
            }
        }
        assert!(n >= 150, "{n} flags");
    }

    /// A value is never taken for a peer's flag: only what clap does not know is looked up.
    #[test]
    fn values_that_look_like_peer_flags_stay_values() {
        let a = os(&[
            "lagtrace",
            "load",
            "-H",
            "X-Flag: -L",
            "http://127.0.0.1:1/",
        ]);
        let Parsed::Ok(cli, notes) = parse::<crate::Cli>(a.clone()) else {
            panic!("not parsed")
        };
        assert!(notes.is_empty());
        let want = crate::Cli::try_parse_from(a).unwrap();
        assert_eq!(format!("{cli:?}"), format!("{want:?}"));
        // Attached values move with the flag: `-t64` → `--ttl 64`, `--destport=81`.
        let a = os(&["lagtrace", "ping", "-t64", "--destport=81", "127.0.0.1"]);
        let Parsed::Ok(cli, notes) = parse::<crate::Cli>(a) else {
            panic!("not parsed")
        };
        let want = crate::Cli::try_parse_from(os(&[
            "lagtrace",
            "ping",
            "--ttl",
            "64",
            "--port",
            "81",
            "127.0.0.1",
        ]))
        .unwrap();
        assert_eq!(format!("{cli:?}"), format!("{want:?}"));
        assert_eq!(notes.len(), 2);
    }

    /// docs/peer-flags.md is the table (LAGTRACE_BLESS=1 rewrites it).
    #[test]
    fn peer_flags_md_is_the_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/peer-flags.md");
        if std::env::var_os("LAGTRACE_BLESS").is_some() {
            std::fs::write(path, markdown()).unwrap();
        }
        let on_disk = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            on_disk == markdown(),
            "{path} is not the table: run LAGTRACE_BLESS=1 cargo test -p lagtrace peer_flags"
        );
    }

    /// A stray word before the URL is named, not the URL.
    #[test]
    fn a_second_word_names_the_first() {
        let a = os(&[
            "lagtrace",
            "load",
            "-t2",
            "-c10",
            "-d1s",
            "oops",
            "http://h/",
        ]);
        let Parsed::Clap(e) = parse::<crate::Cli>(a.clone()) else {
            panic!("parsed")
        };
        let l = explain(&e, &a, &<crate::Cli as clap::CommandFactory>::command()).unwrap();
        assert!(
            l.contains("'oops' was read as it") && l.contains("one URL"),
            "{l}"
        );
    }

    fn plain(s: &str) -> Result<Duration, String> {
        crate::cmd::ping::parse_duration(s)
    }

    #[test]
    fn hping3_intervals_are_microseconds() {
        assert_eq!(
            hping_interval("u10000", plain),
            Ok(Duration::from_millis(10))
        );
        assert_eq!(hping_interval("1", plain), Ok(Duration::from_secs(1)));
        assert_eq!(hping_interval("10ms", plain), Ok(Duration::from_millis(10)));
        assert!(hping_interval("u", plain).is_err());
        assert!(hping_interval("ux", plain).is_err());
    }
}
