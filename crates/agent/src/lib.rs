//! `lagtrace agent`: the server-side layers (sockets, host, capture) of one listening port,
//! served over TLS to an authenticated `lagtrace diagnose --agent`, and the client that
//! uses them.
//!
//! Security is part of the protocol: TLS 1.2/1.3 (rustls) with the agent's self-signed
//! certificate pinned by its SHA-256 fingerprint on the client; a shared token (from a
//! file or the environment, never a flag) compared in constant time; one port's owner only;
//! time- and size-bounded sessions; a token-bucket rate limit; errors as one JSON line that
//! discloses nothing to an unauthenticated peer. After start the agent keeps only the
//! capabilities its layers need ([`caps`]).

#![deny(missing_docs)]

#[cfg(feature = "net")]
pub mod auth;
#[cfg(feature = "net")]
pub mod caps;
#[cfg(feature = "net")]
pub mod client;
pub mod clock;
pub mod pcap;
pub mod proto;
#[cfg(feature = "net")]
pub mod seccomp;
#[cfg(feature = "net")]
pub mod server;
#[cfg(feature = "net")]
pub mod tls;

#[cfg(feature = "net")]
pub use client::{AgentClient, ClientError};
#[cfg(feature = "net")]
pub use server::{AgentConfig, serve};
