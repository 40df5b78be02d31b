//! The client side: `lagtrace diagnose --agent` talks to the agent through [`AgentClient`],
//! which implements diagnose's [`RemoteServer`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use lagtrace_diagnose::evidence::{Layer, SocketEvidence};
use lagtrace_diagnose::remote::{RemoteCapture, RemoteLayers, RemoteServer, RemoteWindow};

use crate::auth::Token;
use crate::clock::{ClockOffset, Exchange};
use crate::proto::{ClockReply, ErrorReply, SessionFinished, SessionOpened, SessionRequest};

/// Why a call to the agent failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No TCP connection or no TLS session (wrong fingerprint included).
    #[error("cannot reach the agent at {addr}: {why}")]
    Connect {
        /// The agent's address.
        addr: SocketAddr,
        /// Why.
        why: String,
    },
    /// The agent answered with an error.
    #[error("the agent refused: {status} {message}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// Its error line.
        message: String,
    },
    /// The reply could not be read.
    #[error("the agent's reply: {0}")]
    Reply(String),
}

/// Replies larger than this are refused (the pcap: 200 000 packets of 160 bytes and more).
const MAX_REPLY: usize = 128 << 20;
/// Clock exchanges per estimate.
const EXCHANGES: usize = 8;

/// A connection setting to one agent.
#[derive(Debug, Clone)]
pub struct AgentClient {
    addr: SocketAddr,
    token: Token,
    tls: Arc<rustls::ClientConfig>,
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

impl AgentClient {
    /// A client of the agent at `addr` whose certificate has the SHA-256 `fingerprint`.
    pub fn new(addr: SocketAddr, fingerprint: [u8; 32], token: Token) -> Result<Self, String> {
        Ok(AgentClient {
            addr,
            token,
            tls: crate::tls::client_config(fingerprint)?,
        })
    }

    fn runtime(&self) -> Result<tokio::runtime::Runtime, ClientError> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ClientError::Connect {
                addr: self.addr,
                why: e.to_string(),
            })
    }

    async fn connect(&self) -> Result<Sender, ClientError> {
        let err = |why: String| ClientError::Connect {
            addr: self.addr,
            why,
        };
        let tcp = tokio::time::timeout(
            Duration::from_secs(3),
            tokio::net::TcpStream::connect(self.addr),
        )
        .await
        .map_err(|_| err("connect timed out".into()))?
        .map_err(|e| err(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        let name = rustls::pki_types::ServerName::try_from(crate::tls::SERVER_NAME)
            .map_err(|e| err(e.to_string()))?;
        let tls = tokio::time::timeout(
            Duration::from_secs(5),
            tokio_rustls::TlsConnector::from(self.tls.clone()).connect(name, tcp),
        )
        .await
        .map_err(|_| err("TLS handshake timed out".into()))?
        .map_err(|e| err(format!("TLS: {e}")))?;
        let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| err(e.to_string()))?;
        tokio::spawn(conn);
        Ok(send)
    }

    async fn call(
        &self,
        send: &mut Sender,
        method: hyper::Method,
        path: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Bytes, ClientError> {
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, crate::tls::SERVER_NAME)
            .header(
                hyper::header::AUTHORIZATION,
                format!("Bearer {}", self.token.as_str()),
            )
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| ClientError::Reply(e.to_string()))?;
        let resp = tokio::time::timeout(timeout, async {
            let resp = send
                .send_request(req)
                .await
                .map_err(|e| ClientError::Reply(e.to_string()))?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), MAX_REPLY)
                .collect()
                .await
                .map_err(|e| ClientError::Reply(e.to_string()))?
                .to_bytes();
            Ok::<_, ClientError>((status, body))
        })
        .await
        .map_err(|_| ClientError::Reply(format!("no reply within {timeout:?}")))??;
        let (status, body) = resp;
        if status.is_success() {
            Ok(body)
        } else {
            let message = serde_json::from_slice::<ErrorReply>(&body)
                .map(|e| e.error)
                .unwrap_or_else(|_| String::from_utf8_lossy(&body).chars().take(200).collect());
            Err(ClientError::Refused {
                status: status.as_u16(),
                message,
            })
        }
    }

    /// One request on a new connection; the reply's body.
    pub fn request(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Bytes, ClientError> {
        let rt = self.runtime()?;
        rt.block_on(async {
            let mut s = self.connect().await?;
            self.call(&mut s, method, path, body, timeout).await
        })
    }

    fn json<T: serde::de::DeserializeOwned>(b: &Bytes) -> Result<T, ClientError> {
        serde_json::from_slice(b).map_err(|e| ClientError::Reply(e.to_string()))
    }

    /// The agent's clock offset: [`EXCHANGES`] exchanges on one connection, the one with the
    /// smallest round trip kept.
    pub fn clock_offset(&self) -> Result<ClockOffset, ClientError> {
        let rt = self.runtime()?;
        rt.block_on(async {
            let mut s = self.connect().await?;
            let mut xs = Vec::with_capacity(EXCHANGES);
            for _ in 0..EXCHANGES {
                let t1 = now_ns();
                let b = self
                    .call(
                        &mut s,
                        hyper::Method::GET,
                        "/v1/clock",
                        None,
                        Duration::from_secs(5),
                    )
                    .await?;
                let t4 = now_ns();
                let r: ClockReply = Self::json(&b)?;
                xs.push(Exchange {
                    t1,
                    t2: r.recv_unix_ns,
                    t3: r.send_unix_ns,
                    t4,
                });
            }
            crate::clock::estimate(&xs)
                .ok_or_else(|| ClientError::Reply("no clock exchange".into()))
        })
    }
}

impl RemoteServer for AgentClient {
    fn label(&self) -> String {
        format!("agent {}", self.addr)
    }

    fn open(
        &self,
        server: std::net::SocketAddr,
        window: Duration,
        hops: bool,
    ) -> Result<Box<dyn RemoteWindow>, String> {
        let offset = self.clock_offset().map_err(|e| e.to_string())?;
        let body = serde_json::to_vec(&SessionRequest {
            port: server.port(),
            window_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
            no_hops: !hops,
            addr: Some(server.ip()),
        })
        .map_err(|e| e.to_string())?;
        let b = self
            .request(
                hyper::Method::POST,
                "/v1/session",
                Some(body),
                Duration::from_secs(10),
            )
            .map_err(|e| e.to_string())?;
        let opened: SessionOpened = Self::json(&b).map_err(|e| e.to_string())?;
        Ok(Box::new(Window {
            client: self.clone(),
            id: opened.session,
            window,
            offset,
        }))
    }
}

/// An open session on the agent.
struct Window {
    client: AgentClient,
    id: String,
    window: Duration,
    offset: ClockOffset,
}

impl Window {
    fn note(&self) -> String {
        format!(
            "from {} (server-side; clock offset {} applied)",
            self.client.label(),
            self.offset
        )
    }

    fn finish_inner(&self) -> Result<(SessionFinished, Option<Vec<u8>>), ClientError> {
        let c = &self.client;
        let b = c.request(
            hyper::Method::POST,
            &format!("/v1/session/{}/finish", self.id),
            None,
            self.window + Duration::from_secs(30),
        )?;
        let f: SessionFinished = AgentClient::json(&b)?;
        let pcap = match &f.capture {
            Ok(_) => Some(
                c.request(
                    hyper::Method::GET,
                    &format!("/v1/session/{}/pcap", self.id),
                    None,
                    Duration::from_secs(60),
                )?
                .to_vec(),
            ),
            Err(_) => None,
        };
        Ok((f, pcap))
    }
}

impl RemoteWindow for Window {
    fn sockets(&self) -> Layer<SocketEvidence> {
        let r = self.client.request(
            hyper::Method::GET,
            &format!("/v1/session/{}/sockets", self.id),
            None,
            Duration::from_secs(20),
        );
        match r.and_then(|b| AgentClient::json(&b)) {
            Ok(l) => l,
            Err(e) => Layer::error(e.to_string()),
        }
    }

    fn finish(&self) -> RemoteLayers {
        let note = self.note();
        let (f, pcap) = match self.finish_inner() {
            Ok(x) => x,
            Err(e) => {
                let why = e.to_string();
                return RemoteLayers {
                    host: Layer::error(why.clone()),
                    capture: Err(Layer::error(why)),
                    note,
                    hops: Vec::new(),
                };
            }
        };
        let capture = match (f.capture, pcap) {
            (Ok(sum), Some(mut bytes)) => {
                match crate::pcap::shift(&mut bytes, -self.offset.offset_ns) {
                    Ok(()) => Ok(RemoteCapture {
                        pcap: bytes,
                        point: sum.point,
                        dropped: sum.dropped,
                    }),
                    Err(e) => Err(Layer::error(format!("the agent's capture: {e}"))),
                }
            }
            (Err(l), _) => Err(l),
            (Ok(_), None) => Err(Layer::error("the agent sent no capture")),
        };
        // The host's timelines onto this clock, like the capture: the rules place them
        // against the load's records.
        let mut host = f.host;
        if let Some(h) = host.data.as_mut() {
            h.shift_us(-self.offset.offset_ns / 1000);
        }
        RemoteLayers {
            host,
            capture,
            note,
            hops: f.hops,
        }
    }
}
