//! `/proc/net/sockstat`: sockets in use and the pages their buffers hold, with `tcp_mem`.

use lagtrace_model::host::SockStat;

/// Parses `/proc/net/sockstat` text (`TCP: inuse 5 orphan 0 tw 2 alloc 7 mem 1`, ...).
pub fn parse(text: &str) -> SockStat {
    let mut s = SockStat::default();
    for line in text.lines() {
        let Some((proto, rest)) = line.split_once(':') else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        for kv in f.chunks(2) {
            let [k, v] = kv else { continue };
            let Ok(v) = v.parse::<u64>() else { continue };
            match (proto, *k) {
                ("TCP", "inuse") => s.tcp_inuse = v,
                ("TCP", "orphan") => s.tcp_orphan = v,
                ("TCP", "tw") => s.tcp_tw = v,
                ("TCP", "alloc") => s.tcp_alloc = v,
                ("TCP", "mem") => s.tcp_mem_pages = v,
                ("UDP", "inuse") => s.udp_inuse = v,
                ("UDP", "mem") => s.udp_mem_pages = v,
                _ => {}
            }
        }
    }
    s
}

/// The reading thread's namespace's sockstat, with `net.ipv4.tcp_mem`.
pub fn read() -> std::io::Result<SockStat> {
    let mut s = parse(&std::fs::read_to_string("/proc/thread-self/net/sockstat")?);
    s.tcp_mem_limits = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_mem")
        .ok()
        .and_then(|t| {
            let v: Vec<u64> = t
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            Some([*v.first()?, *v.get(1)?, *v.get(2)?])
        });
    Ok(s)
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_the_kernel_format() {
        let s = super::parse(
            "sockets: used 120\nTCP: inuse 5 orphan 1 tw 2 alloc 7 mem 3\nUDP: inuse 4 mem 9\n",
        );
        assert_eq!(
            (s.tcp_inuse, s.tcp_orphan, s.tcp_tw, s.tcp_alloc),
            (5, 1, 2, 7)
        );
        assert_eq!((s.tcp_mem_pages, s.udp_inuse, s.udp_mem_pages), (3, 4, 9));
    }
}
