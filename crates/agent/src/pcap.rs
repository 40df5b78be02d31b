//! Shifting the timestamps of a classic pcap (the capture the agent writes), so that the
//! agent's capture lands on the client's clock.

/// Adds `shift_ns` to every record's timestamp of a classic pcap (µs or ns magic, either
/// byte order). `Err` when the bytes are not a classic pcap or a record is cut short.
pub fn shift(pcap: &mut [u8], shift_ns: i64) -> Result<(), String> {
    if pcap.len() < 24 {
        return Err("not a pcap: shorter than its header".into());
    }
    let magic = [pcap[0], pcap[1], pcap[2], pcap[3]];
    let (le, per_sec): (bool, i64) = match magic {
        [0xd4, 0xc3, 0xb2, 0xa1] => (true, 1_000_000),
        [0xa1, 0xb2, 0xc3, 0xd4] => (false, 1_000_000),
        [0x4d, 0x3c, 0xb2, 0xa1] => (true, 1_000_000_000),
        [0xa1, 0xb2, 0x3c, 0x4d] => (false, 1_000_000_000),
        _ => return Err("not a classic pcap (unknown magic)".into()),
    };
    let get = |b: &[u8]| {
        let a = [b[0], b[1], b[2], b[3]];
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let put = |v: u32| if le { v.to_le_bytes() } else { v.to_be_bytes() };
    let unit_ns = 1_000_000_000 / per_sec;
    let mut at = 24usize;
    while at < pcap.len() {
        let h = pcap
            .get(at..at + 16)
            .ok_or("pcap: a record header is cut short")?;
        let (sec, frac, incl) = (get(&h[0..4]), get(&h[4..8]), get(&h[8..12]) as usize);
        let t = i64::from(sec) * 1_000_000_000 + i64::from(frac) * unit_ns + shift_ns;
        let t = t.max(0);
        let (s, f) = (t / 1_000_000_000, (t % 1_000_000_000) / unit_ns);
        let s = u32::try_from(s).map_err(|_| "pcap: a timestamp out of range")?;
        pcap[at..at + 4].copy_from_slice(&put(s));
        pcap[at + 4..at + 8].copy_from_slice(&put(f as u32));
        at = at
            .checked_add(16 + incl)
            .filter(|e| *e <= pcap.len())
            .ok_or("pcap: a record is cut short")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_record(magic: [u8; 4], sec: u32, frac: u32) -> Vec<u8> {
        let mut v = magic.to_vec();
        v.extend_from_slice(&[0; 20]);
        v.extend_from_slice(&sec.to_le_bytes());
        v.extend_from_slice(&frac.to_le_bytes());
        v.extend_from_slice(&2u32.to_le_bytes());
        v.extend_from_slice(&2u32.to_le_bytes());
        v.extend_from_slice(&[0xaa, 0xbb]);
        v
    }

    #[test]
    fn records_move_by_the_shift_across_second_boundaries() {
        let mut p = one_record([0x4d, 0x3c, 0xb2, 0xa1], 100, 999_000_000);
        shift(&mut p, 2_500_000).unwrap();
        assert_eq!(&p[24..28], &101u32.to_le_bytes());
        assert_eq!(&p[28..32], &1_500_000u32.to_le_bytes());
        shift(&mut p, -2_500_000).unwrap();
        assert_eq!(
            &p[24..32],
            &one_record([0x4d, 0x3c, 0xb2, 0xa1], 100, 999_000_000)[24..32]
        );
        let mut us = one_record([0xd4, 0xc3, 0xb2, 0xa1], 7, 10);
        shift(&mut us, 1_000).unwrap();
        assert_eq!(&us[28..32], &11u32.to_le_bytes());
        let mut cut = one_record([0xd4, 0xc3, 0xb2, 0xa1], 7, 10);
        cut.pop();
        assert!(shift(&mut cut, 1).is_err());
        assert!(shift(&mut [0u8; 30], 1).is_err());
    }
}
