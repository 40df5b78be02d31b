//! Text helpers for renderers of an analysis.

use crate::wire::flags;

/// Wireshark-style flag string (`ACK,PSH`, ...).
pub fn flags_str(f: u8) -> String {
    let names = [
        (flags::SYN, "SYN"),
        (flags::FIN, "FIN"),
        (flags::RST, "RST"),
        (flags::PSH, "PSH"),
        (flags::ACK, "ACK"),
        (flags::URG, "URG"),
        (flags::ECE, "ECE"),
        (flags::CWR, "CWR"),
    ];
    let v: Vec<&str> = names
        .iter()
        .filter(|(b, _)| f & b != 0)
        .map(|(_, n)| *n)
        .collect();
    v.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_wireshark_order() {
        assert_eq!(flags_str(flags::SYN | flags::ACK), "SYN,ACK");
        assert_eq!(flags_str(flags::ACK | flags::PSH), "PSH,ACK");
        assert_eq!(flags_str(0), "");
    }
}
