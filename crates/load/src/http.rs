//! Incremental HTTP/1.1 response parser: httparse for the head, then the body is skipped
//! without copying (Content-Length, chunked, or until the server closes).

/// Largest response head accepted.
const MAX_HEAD: usize = 64 * 1024;

/// Why a response could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// The head is not HTTP (garbage) or too large.
    BadHead(String),
    /// A chunk-size line is not hexadecimal.
    BadChunk,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    Size { value: u64, digits: u32, ext: bool },
    Data(u64),
    DataEnd,
    Trailer { line: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Head,
    Length(u64),
    Chunked(Chunk),
    UntilClose,
}

/// A completed response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    /// Status code.
    pub status: u16,
    /// The server asked to close (`Connection: close`, HTTP/1.0, or body delimited by close).
    pub close: bool,
    /// Bytes of `data` consumed by this response (the rest is not part of it).
    pub consumed: usize,
}

/// Parser state of one connection; reset for each response.
#[derive(Debug)]
pub struct ResponseParser {
    phase: Phase,
    head: Vec<u8>,
    status: u16,
    close: bool,
    head_request: bool,
}

impl ResponseParser {
    /// A parser for responses to requests with `method`.
    pub fn new(method: &str) -> Self {
        ResponseParser {
            phase: Phase::Head,
            head: Vec::new(),
            status: 0,
            close: false,
            head_request: method.eq_ignore_ascii_case("HEAD"),
        }
    }

    /// Forgets any partial response (new connection or new request).
    pub fn reset(&mut self) {
        self.phase = Phase::Head;
        self.head.clear();
        self.status = 0;
        self.close = false;
    }

    /// `true` when no byte of the current response has been seen.
    pub fn idle(&self) -> bool {
        self.phase == Phase::Head && self.head.is_empty()
    }

    /// `true` when the body runs until the server closes: EOF completes the response.
    pub fn until_close(&self) -> bool {
        self.phase == Phase::UntilClose
    }

    /// Status of the response whose body is being read (0 while in the head).
    pub fn status(&self) -> u16 {
        self.status
    }

    /// Feeds bytes; returns `Some(Done)` when the response is complete.
    pub fn feed(&mut self, mut data: &[u8]) -> Result<Option<Done>, ParseError> {
        let total = data.len();
        loop {
            match self.phase {
                Phase::Head => {
                    let used = match self.parse_head(data)? {
                        Some(used) => used,
                        None => return Ok(None),
                    };
                    data = &data[used..];
                    if let Some(done) = self.finish_if_empty(total - data.len()) {
                        return Ok(Some(done));
                    }
                }
                Phase::Length(rem) => {
                    let n = (data.len() as u64).min(rem);
                    data = &data[n as usize..];
                    if rem == n {
                        return Ok(Some(self.done(total - data.len())));
                    }
                    self.phase = Phase::Length(rem - n);
                    return Ok(None);
                }
                Phase::UntilClose => return Ok(None),
                Phase::Chunked(state) => {
                    let (state, used, finished) = chunk_step(state, data)?;
                    data = &data[used..];
                    self.phase = Phase::Chunked(state);
                    if finished {
                        return Ok(Some(self.done(total - data.len())));
                    }
                    if data.is_empty() {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// The server closed: completes an until-close body.
    pub fn eof(&mut self) -> Option<Done> {
        if self.phase == Phase::UntilClose {
            Some(self.done(0))
        } else {
            None
        }
    }

    fn done(&mut self, consumed: usize) -> Done {
        let d = Done {
            status: self.status,
            close: self.close,
            consumed,
        };
        self.reset();
        d
    }

    /// Parses the head from `data` (plus anything stashed); returns bytes of `data` used.
    fn parse_head(&mut self, data: &[u8]) -> Result<Option<usize>, ParseError> {
        let stashed = self.head.len();
        let buf: &[u8] = if stashed == 0 {
            data
        } else {
            self.head.extend_from_slice(data);
            &self.head
        };
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut headers);
        let n = match resp.parse(buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => {
                if stashed == 0 {
                    self.head.extend_from_slice(data);
                }
                if self.head.len() > MAX_HEAD {
                    return Err(ParseError::BadHead(
                        "response head larger than 64 KiB".into(),
                    ));
                }
                return Ok(None);
            }
            Err(e) => return Err(ParseError::BadHead(e.to_string())),
        };
        let status = resp.code.unwrap_or(0);
        let mut close = resp.version == Some(0);
        let mut length = None;
        let mut chunked = false;
        for h in resp.headers.iter() {
            if h.name.eq_ignore_ascii_case("content-length") {
                let v = std::str::from_utf8(h.value)
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok());
                match v {
                    Some(v) => length = Some(v),
                    None => return Err(ParseError::BadHead("invalid Content-Length".into())),
                }
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = contains_token(h.value, b"chunked");
            } else if h.name.eq_ignore_ascii_case("connection") {
                if contains_token(h.value, b"close") {
                    close = true;
                } else if contains_token(h.value, b"keep-alive") {
                    close = false;
                }
            }
        }
        let used = n - stashed;
        self.head.clear();
        if (100..200).contains(&status) && status != 101 {
            // Interim response (100 Continue): the real one follows.
            return Ok(Some(used));
        }
        self.status = status;
        self.close = close;
        self.phase = if self.head_request
            || status == 204
            || status == 304
            || (100..200).contains(&status)
        {
            Phase::Length(0)
        } else if chunked {
            Phase::Chunked(Chunk::Size {
                value: 0,
                digits: 0,
                ext: false,
            })
        } else if let Some(len) = length {
            Phase::Length(len)
        } else {
            self.close = true;
            Phase::UntilClose
        };
        Ok(Some(used))
    }

    fn finish_if_empty(&mut self, consumed: usize) -> Option<Done> {
        if self.phase == Phase::Length(0) {
            Some(self.done(consumed))
        } else {
            None
        }
    }
}

fn contains_token(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

/// Advances the chunked-body state over `data`: (new state, bytes used, body finished).
fn chunk_step(mut state: Chunk, data: &[u8]) -> Result<(Chunk, usize, bool), ParseError> {
    let mut i = 0;
    while i < data.len() {
        match state {
            Chunk::Data(rem) => {
                let n = ((data.len() - i) as u64).min(rem);
                i += n as usize;
                state = if rem == n {
                    Chunk::DataEnd
                } else {
                    Chunk::Data(rem - n)
                };
                continue;
            }
            Chunk::DataEnd => {
                if data[i] == b'\n' {
                    state = Chunk::Size {
                        value: 0,
                        digits: 0,
                        ext: false,
                    };
                }
            }
            Chunk::Size { value, digits, ext } => {
                let b = data[i];
                if b == b'\n' {
                    if digits == 0 {
                        return Err(ParseError::BadChunk);
                    }
                    state = if value == 0 {
                        Chunk::Trailer { line: 0 }
                    } else {
                        Chunk::Data(value)
                    };
                } else if ext || b == b'\r' {
                } else if b == b';' || b == b' ' || b == b'\t' {
                    state = Chunk::Size {
                        value,
                        digits,
                        ext: true,
                    };
                } else {
                    let d = (b as char).to_digit(16).ok_or(ParseError::BadChunk)?;
                    if digits >= 15 {
                        return Err(ParseError::BadChunk);
                    }
                    state = Chunk::Size {
                        value: value * 16 + u64::from(d),
                        digits: digits + 1,
                        ext,
                    };
                }
            }
            Chunk::Trailer { line } => match data[i] {
                b'\n' if line == 0 => return Ok((state, i + 1, true)),
                b'\n' => state = Chunk::Trailer { line: 0 },
                b'\r' => {}
                _ => state = Chunk::Trailer { line: line + 1 },
            },
        }
        i += 1;
    }
    Ok((state, i, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_split(p: &mut ResponseParser, data: &[u8], step: usize) -> Option<Done> {
        let mut off = 0;
        while off < data.len() {
            let end = (off + step).min(data.len());
            if let Some(mut d) = p.feed(&data[off..end]).unwrap() {
                d.consumed += off;
                return Some(d);
            }
            off = end;
        }
        None
    }

    #[test]
    fn content_length_any_split() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloXX";
        for step in 1..r.len() {
            let mut p = ResponseParser::new("GET");
            let d = feed_split(&mut p, r, step).unwrap();
            assert_eq!(
                (d.status, d.close, d.consumed),
                (200, false, r.len() - 2),
                "step {step}"
            );
            assert!(p.idle());
        }
    }

    #[test]
    fn chunked_any_split() {
        let r = b"HTTP/1.1 404 NF\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5;x=y\r\nhello\r\nA\r\n0123456789\r\n0\r\nT: 1\r\n\r\n";
        for step in 1..r.len() {
            let mut p = ResponseParser::new("GET");
            let d = feed_split(&mut p, r, step).unwrap();
            assert_eq!(
                (d.status, d.close, d.consumed),
                (404, true, r.len()),
                "step {step}"
            );
        }
    }

    #[test]
    fn until_close_head_and_errors() {
        let mut p = ResponseParser::new("GET");
        assert_eq!(p.feed(b"HTTP/1.0 200 OK\r\n\r\nbody").unwrap(), None);
        assert!(p.until_close());
        assert!(p.eof().unwrap().close);
        let mut p = ResponseParser::new("HEAD");
        let d = p
            .feed(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(d.status, 200);
        let mut p = ResponseParser::new("GET");
        let d = p
            .feed(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(d.status, 204);
        let mut p = ResponseParser::new("GET");
        assert!(p.feed(b"garbage garbage\r\n\r\n").is_err());
        let mut p = ResponseParser::new("GET");
        assert!(
            p.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
                .is_err()
        );
    }
}
