//! TCP flag bits as on the wire (byte 13 of the header), shared by the capture analysis and
//! the probes.

/// TCP flag bits.
pub mod flags {
    /// FIN
    pub const FIN: u8 = 0x01;
    /// SYN
    pub const SYN: u8 = 0x02;
    /// RST
    pub const RST: u8 = 0x04;
    /// PSH
    pub const PSH: u8 = 0x08;
    /// ACK
    pub const ACK: u8 = 0x10;
    /// URG
    pub const URG: u8 = 0x20;
    /// ECE
    pub const ECE: u8 = 0x40;
    /// CWR
    pub const CWR: u8 = 0x80;
}

/// hping3-style flag letters (`SA`, `RA`, ...): S, R, F, P, A, U in that order.
pub fn flag_letters(bits: u8) -> String {
    let mut s = String::new();
    for (bit, c) in [
        (flags::SYN, 'S'),
        (flags::RST, 'R'),
        (flags::FIN, 'F'),
        (flags::PSH, 'P'),
        (flags::ACK, 'A'),
        (flags::URG, 'U'),
    ] {
        if bits & bit != 0 {
            s.push(c);
        }
    }
    s
}

/// Wireshark-style flag names (`SYN,ACK`, `PSH,ACK`, ...): SYN, FIN, RST, PSH, ACK, URG, ECE,
/// CWR in that order.
pub fn flag_names(bits: u8) -> String {
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
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| *n)
        .collect();
    v.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_wireshark_order() {
        assert_eq!(flag_names(flags::SYN | flags::ACK), "SYN,ACK");
        assert_eq!(flag_names(flags::ACK | flags::PSH), "PSH,ACK");
        assert_eq!(flag_names(0), "");
    }

    #[test]
    fn letters_in_hping3_order() {
        assert_eq!(flag_letters(flags::SYN | flags::ACK), "SA");
        assert_eq!(flag_letters(flags::RST | flags::ACK), "RA");
        assert_eq!(flag_letters(0xff), "SRFPAU");
        assert_eq!(flag_letters(0), "");
    }
}
