//! `/proc/net/netstat` and `/proc/net/snmp` (what `nstat` reads): pairs of lines, a header
//! `Group: Name1 Name2 ...` and a row `Group: v1 v2 ...`, in the namespace of the reading
//! thread (`/proc/thread-self/net/...`: `/proc/self/net` would show the main thread's).

use std::collections::BTreeMap;

use lagtrace_model::host::CounterDelta;

/// `Group.Name` → value.
pub type Counters = BTreeMap<String, i64>;

/// Counters that are levels, not event counts: a change is not "something happened".
const GAUGES: [&str; 4] = [
    "Tcp.CurrEstab",
    "Tcp.MaxConn",
    "Ip.Forwarding",
    "Ip.DefaultTTL",
];

/// Parses one netstat/snmp file. Lines that do not pair up are skipped.
pub fn parse(text: &str, out: &mut Counters) {
    let mut lines = text.lines();
    while let (Some(head), Some(vals)) = (lines.next(), lines.next()) {
        let (Some((g1, names)), Some((g2, values))) = (head.split_once(':'), vals.split_once(':'))
        else {
            continue;
        };
        if g1 != g2 {
            continue;
        }
        for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
            if let Ok(v) = v.parse::<i64>() {
                out.insert(format!("{g1}.{n}"), v);
            }
        }
    }
}

/// The reading thread's namespace's counters (netstat, snmp).
pub fn read() -> std::io::Result<Counters> {
    let mut c = Counters::new();
    for f in ["netstat", "snmp"] {
        let text = std::fs::read_to_string(format!("/proc/thread-self/net/{f}"))?;
        parse(&text, &mut c);
    }
    Ok(c)
}

/// The event counters that moved between two readings, by name.
pub fn deltas(before: &Counters, after: &Counters) -> Vec<CounterDelta> {
    after
        .iter()
        .filter(|(n, _)| !GAUGES.contains(&n.as_str()))
        .filter_map(|(name, &a)| {
            let b = *before.get(name)?;
            (a != b).then(|| CounterDelta {
                name: name.clone(),
                before: b,
                after: a,
                delta: a - b,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NETSTAT: &str = "TcpExt: SyncookiesSent ListenOverflows ListenDrops\n\
                           TcpExt: 0 3 4\n\
                           IpExt: InNoRoutes InOctets\n\
                           IpExt: 0 1200\n";

    #[test]
    fn pairs_header_and_value_lines_by_group() {
        let mut c = Counters::new();
        parse(NETSTAT, &mut c);
        parse("Tcp: RtoAlgorithm MaxConn CurrEstab\nTcp: 1 -1 2\n", &mut c);
        assert_eq!(c["TcpExt.ListenOverflows"], 3);
        assert_eq!(c["IpExt.InOctets"], 1200);
        assert_eq!(c["Tcp.MaxConn"], -1);
        let mut after = c.clone();
        *after.get_mut("TcpExt.ListenOverflows").unwrap() += 5;
        *after.get_mut("Tcp.CurrEstab").unwrap() += 1;
        let d = deltas(&c, &after);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(
            (d[0].name.as_str(), d[0].delta),
            ("TcpExt.ListenOverflows", 5)
        );
    }

    #[test]
    fn reads_this_namespace() {
        let c = read().unwrap();
        assert!(c.contains_key("TcpExt.ListenOverflows") && c.contains_key("Tcp.RetransSegs"));
    }
}
