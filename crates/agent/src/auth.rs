//! The shared token and the rate limit.

use std::time::Instant;

use subtle::ConstantTimeEq;

/// Where the token comes from when no file is named.
pub const TOKEN_ENV: &str = "LAGTRACE_AGENT_TOKEN";
/// The shortest token accepted (bytes): a guessable token is no authentication.
pub const MIN_TOKEN: usize = 16;

/// The shared secret of agent and client.
#[derive(Clone)]
pub struct Token(Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// The token from `file` (its first line), else from `$LAGTRACE_AGENT_TOKEN`; never from
    /// a command-line flag, which `ps` shows to every user.
    pub fn load(file: Option<&std::path::Path>) -> Result<Token, String> {
        let raw = match file {
            Some(p) => std::fs::read_to_string(p)
                .map_err(|e| format!("token file {}: {e}", p.display()))?,
            None => std::env::var(TOKEN_ENV).map_err(|_| {
                format!("no token: name a file with --token-file or set {TOKEN_ENV}")
            })?,
        };
        Token::new(raw.lines().next().unwrap_or("").trim())
    }

    /// A token from its text (at least [`MIN_TOKEN`] bytes, no spaces).
    pub fn new(text: &str) -> Result<Token, String> {
        if text.len() < MIN_TOKEN || text.chars().any(char::is_whitespace) {
            return Err(format!(
                "the token must be at least {MIN_TOKEN} characters without spaces"
            ));
        }
        Ok(Token(text.as_bytes().to_vec()))
    }

    /// The token as sent in `Authorization: Bearer ...`.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or("")
    }

    /// Whether `presented` is the token, in time independent of where they differ.
    pub fn matches(&self, presented: &[u8]) -> bool {
        // Digests first: equal lengths, so the comparison's time does not leak the length.
        let a = ring::digest::digest(&ring::digest::SHA256, &self.0);
        let b = ring::digest::digest(&ring::digest::SHA256, presented);
        bool::from(a.as_ref().ct_eq(b.as_ref()))
    }
}

/// A token bucket: `burst` requests at once, refilled at `per_sec`.
#[derive(Debug)]
pub struct Bucket {
    tokens: f64,
    burst: f64,
    per_sec: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket.
    pub fn new(burst: u32, per_sec: f64) -> Bucket {
        Bucket {
            tokens: f64::from(burst),
            burst: f64::from(burst),
            per_sec,
            at: Instant::now(),
        }
    }

    /// Takes one token at `now`; false when the bucket is empty.
    pub fn take(&mut self, now: Instant) -> bool {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + dt * self.per_sec).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn tokens_match_only_themselves_and_short_ones_are_refused() {
        let t = Token::new("0123456789abcdef-secret").unwrap();
        assert!(t.matches(b"0123456789abcdef-secret"));
        assert!(!t.matches(b"0123456789abcdef-secreT"));
        assert!(!t.matches(b""));
        assert!(Token::new("short").is_err());
        assert!(Token::new("with a space in the middle").is_err());
        assert_eq!(format!("{t:?}"), "Token(..)");
    }

    #[test]
    fn the_bucket_allows_a_burst_then_its_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(3, 10.0);
        assert!((0..3).all(|_| b.take(t0)));
        assert!(!b.take(t0));
        assert!(b.take(t0 + Duration::from_millis(110)));
        assert!(!b.take(t0 + Duration::from_millis(110)));
    }
}
