//! Connection tracking (`nf_conntrack`) in the reading thread's namespace: the table's fill
//! (`net.netfilter.nf_conntrack_count` against `nf_conntrack_max`) and the per-CPU
//! statistics `conntrack -S` prints (`/proc/net/stat/nf_conntrack`, one row per CPU in hex),
//! summed over the CPUs, at each end of the window. A namespace with no table (the module
//! not loaded) reads as `None`: nothing to say, not an error. Of the statistics only the
//! losses are kept: this kernel (6.x) no longer counts `insert`, `found`, `new` or `delete`
//! (always 0), so the table's fill is read from `nf_conntrack_count` instead.

use std::collections::BTreeMap;

use lagtrace_model::host::Conntrack;

/// One reading.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reading {
    /// Entries (`nf_conntrack_count`), where readable.
    pub count: Option<u64>,
    /// The table's size (`nf_conntrack_max`), where readable.
    pub max: Option<u64>,
    /// The statistics by name, summed over the CPUs (`entries`, a level, is its first row).
    pub stats: BTreeMap<String, u64>,
}

/// Parses `/proc/net/stat/nf_conntrack`: a header of names, then one row of hex numbers per
/// CPU. Rows that do not parse are skipped.
pub fn parse_stat(text: &str) -> BTreeMap<String, u64> {
    let mut lines = text.lines();
    let Some(head) = lines.next() else {
        return BTreeMap::new();
    };
    let names: Vec<&str> = head.split_whitespace().collect();
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for (row, line) in lines.enumerate() {
        let vals: Option<Vec<u64>> = line
            .split_whitespace()
            .map(|v| u64::from_str_radix(v, 16).ok())
            .collect();
        let Some(vals) = vals.filter(|v| v.len() == names.len()) else {
            continue;
        };
        for (n, v) in names.iter().zip(vals) {
            // `entries` is the table's count, the same on every row.
            if *n == "entries" && row > 0 {
                continue;
            }
            *out.entry((*n).to_string()).or_default() += v;
        }
    }
    out
}

fn sysctl(name: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/sys/net/netfilter/{name}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The reading thread's namespace's conntrack, or `None` when it has no table.
pub fn read() -> std::io::Result<Option<Reading>> {
    let text = match std::fs::read_to_string("/proc/thread-self/net/stat/nf_conntrack") {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(Some(Reading {
        count: sysctl("nf_conntrack_count"),
        max: sysctl("nf_conntrack_max"),
        stats: parse_stat(&text),
    }))
}

/// The window between two readings.
pub fn delta(a: &Reading, b: &Reading) -> Conntrack {
    let d = |n: &str| {
        b.stats
            .get(n)
            .copied()
            .unwrap_or(0)
            .saturating_sub(a.stats.get(n).copied().unwrap_or(0))
    };
    Conntrack {
        count: b.count.or_else(|| b.stats.get("entries").copied()),
        max: b.max,
        peak: a.count.max(b.count),
        drop: d("drop"),
        early_drop: d("early_drop"),
        insert_failed: d("insert_failed"),
        invalid: d("invalid"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two CPUs, as `/proc/net/stat/nf_conntrack` prints them (a table that filled: drops
    /// and early drops on both).
    const STAT: &str = "entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart\n\
        00040000  00000000 00000000 00000000 00000003 00000000 00000000 00000000 00000100 00000001 0000000a 00000002 00000000  00000000 00000000 00000000 00000000\n\
        00040000  00000000 00000000 00000000 00000001 00000000 00000000 00000000 00000200 00000000 00000005 00000001 00000000  00000000 00000000 00000000 00000000\n";

    #[test]
    fn sums_the_cpus_rows_in_hex_and_keeps_entries_once() {
        let s = parse_stat(STAT);
        assert_eq!(s["entries"], 0x40000);
        assert_eq!(s["insert"], 0x300);
        assert_eq!(s["drop"], 15);
        assert_eq!(s["early_drop"], 3);
        assert_eq!(s["insert_failed"], 1);
        assert_eq!(s["invalid"], 4);
    }

    #[test]
    fn a_short_or_foreign_row_is_skipped() {
        let s = parse_stat("entries drop\n00000002 00000001\nzz 1\n00000002\n");
        assert_eq!(s["drop"], 1);
        assert_eq!(s["entries"], 2);
        assert!(parse_stat("").is_empty());
    }

    #[test]
    fn the_window_counts_what_moved_and_keeps_the_levels() {
        let a = Reading {
            count: Some(262_000),
            max: Some(262_144),
            stats: parse_stat(
                "entries insert drop early_drop insert_failed invalid\n0 10 1 0 0 0\n",
            ),
        };
        let b = Reading {
            count: Some(262_144),
            max: Some(262_144),
            stats: parse_stat(
                "entries insert drop early_drop insert_failed invalid\n0 30 9 4 2 1\n",
            ),
        };
        let c = delta(&a, &b);
        assert_eq!(c.count, Some(262_144));
        assert_eq!(c.peak, Some(262_144));
        assert_eq!(
            (c.drop, c.early_drop, c.insert_failed, c.invalid),
            (8, 4, 2, 1)
        );
    }

    /// This namespace's own reading, where the module is loaded: the levels are numbers.
    #[test]
    fn reads_this_namespace() {
        match read() {
            Ok(Some(r)) => assert!(r.stats.contains_key("drop"), "{r:?}"),
            Ok(None) => {}
            Err(e) => panic!("{e}"),
        }
    }
}
