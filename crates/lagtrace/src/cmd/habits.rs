//! The peers' flags: those whose meaning is the same here are accepted where they are
//! declared; the ones lagtrace does not do are declared hidden with one of these parsers,
//! which refuse them at parse time (before any work) with one line saying what to use.

/// wrk's `-s script.lua`.
pub fn refuse_lua(_: &str) -> Result<String, String> {
    Err(
        "Lua scripts (wrk -s) are not supported: lagtrace load sends one request, set with \
         -m/--method, -H/--header and --body/--body-file"
            .into(),
    )
}

/// tcpdump's `-r FILE` given to `capture`.
pub fn refuse_read(_: &str) -> Result<String, String> {
    Err(
        "capture reads the wire; to read a capture file (tcpdump -r FILE) run \
         `lagtrace analyze FILE`"
            .into(),
    )
}

/// hping3's `--flood`.
pub fn refuse_flood(_: &str) -> Result<bool, String> {
    Err(
        "ping has no flood mode (hping3 --flood): pace probes with -i (e.g. -i u1000), or \
         load the server with `lagtrace load`"
            .into(),
    )
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
    use std::time::Duration;

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
