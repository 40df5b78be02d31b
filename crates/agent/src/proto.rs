//! The wire types: JSON bodies of the agent's HTTP endpoints, and their parsing.
//!
//! Endpoints (all need `Authorization: Bearer TOKEN`):
//! - `POST /v1/session` `{"port": P, "window_ms": W}`: opens a window on the listener on P
//!   (the one port the agent serves): capture of the caller's connections, host layer, and
//!   the watch of the server's own connections to its upstreams (`"no_hops": true`: none);
//!   `"addr"`: the address the caller connects to, when several listeners share the port.
//! - `GET /v1/session/ID/sockets`: the port owner's sockets and options now.
//! - `POST /v1/session/ID/finish`: waits for the window's end, returns the host layer and the
//!   capture's summary.
//! - `GET /v1/session/ID/pcap`: the capture (classic pcap), then the session is closed.
//! - `GET /v1/clock`: the agent's receive and send times, for the offset estimate.

use serde::{Deserialize, Serialize};

use lagtrace_model::diagnosis::evidence::{Layer, PacketEvidence};
use lagtrace_model::host::HostReport;

/// The largest request body accepted (bytes).
pub const MAX_BODY: usize = 4096;

/// `POST /v1/session`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// The listening port whose owner is inspected.
    pub port: u16,
    /// The window's length in milliseconds.
    pub window_ms: u64,
    /// Do not follow the server's own connections (`diagnose --no-hops`). Sent only when
    /// set, so an agent older than the field still accepts the request.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_hops: bool,
    /// The address the caller connects to: which listener on the port is the server when
    /// several are (the one that serves this address; the caller's own address decides when
    /// none does, e.g. behind NAT). Sent only when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<std::net::IpAddr>,
}

/// Reply to `POST /v1/session`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionOpened {
    /// The session's id (random, bound to the caller's address).
    pub session: String,
    /// Where the capture runs, or why it does not.
    pub capture: Result<String, String>,
    /// The window granted (ms).
    pub window_ms: u64,
}

/// Reply to `POST /v1/session/ID/finish`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionFinished {
    /// Layer 5 over the window.
    pub host: Layer<HostReport>,
    /// The capture's summary, or the packet layer saying why there is none.
    pub capture: Result<CaptureSummary, Layer<PacketEvidence>>,
    /// The hops behind the server over the window: the connections its processes opened,
    /// captured and analysed on the agent's host (none from an agent older than hops).
    #[serde(default)]
    pub hops: Vec<lagtrace_model::diagnosis::evidence::HopEvidence>,
}

/// What the capture holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaptureSummary {
    /// Interface and host.
    pub point: String,
    /// Packets captured.
    pub packets: u64,
    /// Packets the kernel dropped from the capture.
    pub dropped: u64,
    /// Size of the pcap (bytes).
    pub bytes: u64,
}

/// Reply to `GET /v1/clock`: the agent's wall clock (ns since the epoch) when the request
/// arrived and when the reply left.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ClockReply {
    /// t2: request received.
    pub recv_unix_ns: i64,
    /// t3: reply sent.
    pub send_unix_ns: i64,
}

/// Every error reply: `{"error": "..."}`, one line, nothing else.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorReply {
    /// What was wrong with the request.
    pub error: String,
}

/// A request the agent refuses, with the HTTP status it answers.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub status: u16,
    /// One line.
    pub message: String,
}

impl ApiError {
    /// A new error.
    pub fn new(status: u16, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

/// Parses a `POST /v1/session` body: JSON, at most [`MAX_BODY`] bytes, a port ≥ 1 and a
/// window between 100 ms and `max_window_ms`. Never panics on any input.
pub fn parse_session_request(body: &[u8], max_window_ms: u64) -> Result<SessionRequest, ApiError> {
    if body.len() > MAX_BODY {
        return Err(ApiError::new(413, "request too large"));
    }
    let r: SessionRequest = serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            400,
            format!("bad request: expected {{\"port\": N, \"window_ms\": N}} ({e})"),
        )
    })?;
    if r.port == 0 {
        return Err(ApiError::new(400, "bad request: port must be 1-65535"));
    }
    if r.window_ms < 100 || r.window_ms > max_window_ms {
        return Err(ApiError::new(
            400,
            format!("bad request: window_ms must be 100-{max_window_ms}"),
        ));
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_requests_parse_and_bad_ones_say_why() {
        let ok = parse_session_request(br#"{"port":8080,"window_ms":5000}"#, 60_000).unwrap();
        assert_eq!((ok.port, ok.window_ms, ok.no_hops), (8080, 5000, false));
        let off = br#"{"port":8080,"window_ms":5000,"no_hops":true}"#;
        assert!(parse_session_request(off, 60_000).unwrap().no_hops);
        // Sent only when set: what an agent older than the field accepts.
        let body = serde_json::to_string(&SessionRequest {
            port: 1,
            window_ms: 500,
            no_hops: false,
            addr: None,
        })
        .unwrap();
        assert_eq!(body, r#"{"port":1,"window_ms":500}"#);
        for (body, status) in [
            (&b"garbage\x00\xff"[..], 400),
            (br#"{"port":0,"window_ms":5000}"#, 400),
            (br#"{"port":80,"window_ms":50}"#, 400),
            (br#"{"port":80,"window_ms":600001}"#, 400),
            (br#"{"port":80,"window_ms":500,"pid":1}"#, 400),
            (br#"{"port":70000,"window_ms":500}"#, 400),
        ] {
            let e = parse_session_request(body, 60_000).unwrap_err();
            assert_eq!(e.status, status, "{}", String::from_utf8_lossy(body));
        }
        let big = vec![b' '; MAX_BODY + 1];
        assert_eq!(parse_session_request(&big, 60_000).unwrap_err().status, 413);
    }
}
