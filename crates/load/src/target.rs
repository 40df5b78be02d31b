//! The target: URL parsing, name resolution, and the request bytes sent on every connection.

use std::net::{SocketAddr, ToSocketAddrs};

use crate::error::{Context, Result, bail};

/// A parsed `http://` or `https://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `true` for https.
    pub tls: bool,
    /// Host as written in the URL (brackets removed from IPv6 literals).
    pub host: String,
    /// Port (explicit or the scheme's default).
    pub port: u16,
    /// Path and query, starting with `/`.
    pub path: String,
}

impl Target {
    /// Parses `http[s]://host[:port][/path][?query]`.
    pub fn parse(url: &str) -> Result<Target> {
        let (tls, rest) = if let Some(r) = strip_prefix_ci(url, "http://") {
            (false, r)
        } else if let Some(r) = strip_prefix_ci(url, "https://") {
            (true, r)
        } else if let Some(i) = url.find("://") {
            bail!(
                "unknown scheme {:?} in URL {url:?} (expected http:// or https://)",
                &url[..i]
            );
        } else {
            bail!("malformed URL {url:?} (expected http://host[:port]/path or https://...)");
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let authority = &rest[..end];
        let mut path = rest[end..].split('#').next().unwrap_or("").to_string();
        if path.is_empty() || path.starts_with('?') {
            path.insert(0, '/');
        }
        if authority.contains('@') {
            bail!("malformed URL {url:?}: user information is not supported");
        }
        let default_port = if tls { 443 } else { 80 };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let close = v6
                .find(']')
                .with_context(|| format!("malformed URL {url:?}: unclosed '[' in host"))?;
            let host = &v6[..close];
            let after = &v6[close + 1..];
            let port = match after.strip_prefix(':') {
                Some(p) => parse_port(p, url)?,
                None if after.is_empty() => default_port,
                None => bail!("malformed URL {url:?}: unexpected text after ']'"),
            };
            (host.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), parse_port(p, url)?),
                None => (authority.to_string(), default_port),
            }
        };
        if host.is_empty() {
            bail!("malformed URL {url:?}: no host");
        }
        if host.chars().any(|c| c.is_whitespace() || c.is_control()) {
            bail!("malformed URL {url:?}: invalid character in host");
        }
        if path.chars().any(|c| c.is_whitespace() || c.is_control()) {
            bail!("malformed URL {url:?}: spaces or control characters in path");
        }
        Ok(Target {
            tls,
            host,
            port,
            path,
        })
    }

    /// The value of the `Host` header: the host, with the port when it is not the default.
    pub fn host_header(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let default = if self.tls { 443 } else { 80 };
        if self.port == default {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }

    /// The same target as a URL with the other scheme, the port always written (an https
    /// URL on 443 is http://host:443/ when the server speaks plain HTTP there).
    pub fn other_scheme_url(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let scheme = if self.tls { "http" } else { "https" };
        format!("{scheme}://{host}:{}{}", self.port, self.path)
    }

    /// Resolves the host; the first address is used for every connection.
    pub fn resolve(&self) -> Result<SocketAddr> {
        (self.host.as_str(), self.port)
            .to_socket_addrs()
            .with_context(|| format!("cannot resolve host {:?}", self.host))?
            .next()
            .with_context(|| format!("cannot resolve host {:?}: no addresses", self.host))
    }
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    if s.len() >= prefix.len() && s[..prefix.len()].eq_ignore_ascii_case(prefix) {
        Some(&s[prefix.len()..])
    } else {
        None
    }
}

fn parse_port(p: &str, url: &str) -> Result<u16> {
    match p.parse::<u16>() {
        Ok(0) | Err(_) => bail!("malformed URL {url:?}: invalid port {p:?}"),
        Ok(n) => Ok(n),
    }
}

/// Builds the request bytes once: request line, `Host`, the user's headers, the body.
/// A user `Host` header replaces the URL's; `Content-Length` is added for a body unless the
/// user gave one.
pub fn build_request(
    target: &Target,
    method: &str,
    headers: &[String],
    body: Option<&[u8]>,
) -> Result<Vec<u8>> {
    if method.is_empty()
        || !method
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        bail!("invalid HTTP method {method:?}");
    }
    let mut parsed = Vec::new();
    for h in headers {
        let (name, value) = h
            .split_once(':')
            .with_context(|| format!("invalid header {h:?} (expected \"Name: value\")"))?;
        let name = name.trim();
        if name.is_empty() || name.bytes().any(|b| b <= b' ' || b >= 0x7f) {
            bail!("invalid header name in {h:?}");
        }
        if value.contains(['\r', '\n']) {
            bail!("invalid header value in {h:?}");
        }
        parsed.push((name.to_string(), value.trim().to_string()));
    }
    let has = |n: &str| parsed.iter().any(|(k, _)| k.eq_ignore_ascii_case(n));
    // A Content-Length that is not the body's length makes every request wait for bytes
    // that never come (or sends extra bytes the server reads as a request): refuse it.
    let len = body.map_or(0, <[u8]>::len);
    for (k, v) in &parsed {
        if k.eq_ignore_ascii_case("content-length") && v.parse::<usize>().ok() != Some(len) {
            bail!("header {k}: {v} does not match the body ({len} bytes)");
        }
    }
    let mut req = format!("{method} {} HTTP/1.1\r\n", target.path);
    if !has("host") {
        req.push_str(&format!("Host: {}\r\n", target.host_header()));
    }
    for (k, v) in &parsed {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body
        && !has("content-length")
        && !has("transfer-encoding")
    {
        req.push_str(&format!("Content-Length: {}\r\n", b.len()));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    if let Some(b) = body {
        bytes.extend_from_slice(b);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let t = Target::parse("http://127.0.0.1:8080/a?b=1").unwrap();
        assert_eq!(
            (t.tls, t.host.as_str(), t.port, t.path.as_str()),
            (false, "127.0.0.1", 8080, "/a?b=1")
        );
        let t = Target::parse("HTTPS://localhost").unwrap();
        assert_eq!((t.tls, t.port, t.path.as_str()), (true, 443, "/"));
        let t = Target::parse("http://[::1]:81?x").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("::1", 81, "/?x")
        );
        assert_eq!(t.host_header(), "[::1]:81");
        assert!(
            Target::parse("ftp://x/")
                .unwrap_err()
                .to_string()
                .contains("unknown scheme")
        );
        assert!(Target::parse("localhost:80").is_err());
        assert!(Target::parse("http://:80/").is_err());
        assert!(Target::parse("http://h:99999/").is_err());
        assert!(Target::parse("http://h:0/").is_err());
        assert!(Target::parse("http://u@h/").is_err());
    }

    #[test]
    fn builds_requests() {
        let t = Target::parse("http://h:8080/p").unwrap();
        let r = build_request(&t, "POST", &["X-A: 1".into()], Some(b"hi")).unwrap();
        assert_eq!(
            String::from_utf8(r).unwrap(),
            "POST /p HTTP/1.1\r\nHost: h:8080\r\nX-A: 1\r\nContent-Length: 2\r\n\r\nhi"
        );
        let r = build_request(&t, "GET", &["host: other".into()], None).unwrap();
        assert_eq!(
            String::from_utf8(r).unwrap(),
            "GET /p HTTP/1.1\r\nhost: other\r\n\r\n"
        );
        assert!(build_request(&t, "GET", &["nocolon".into()], None).is_err());
        let r = build_request(&t, "POST", &["content-length: 2".into()], Some(b"hi")).unwrap();
        assert!(r.ends_with(b"content-length: 2\r\n\r\nhi"));
        let e = build_request(&t, "POST", &["Content-Length: 99".into()], Some(b"hi"));
        assert!(
            e.unwrap_err()
                .to_string()
                .contains("does not match the body (2 bytes)")
        );
        assert!(build_request(&t, "GET", &["Content-Length: 5".into()], None).is_err());
        assert!(build_request(&t, "GET", &["Content-Length: 0".into()], None).is_ok());
        assert!(build_request(&t, "G T", &[], None).is_err());
    }
}
