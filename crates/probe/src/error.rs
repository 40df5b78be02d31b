//! The probe crate's error type: each variant's text is the whole message on one line
//! (which target, which operation); a missing CAP_NET_RAW is a typed [`Error::Privilege`].

use std::io;
use std::net::IpAddr;

use lagtrace_model::Privilege;

/// Why probing could not run. Timeouts, resets and unreachable replies are samples, not
/// errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Raw sockets need CAP_NET_RAW.
    #[error(transparent)]
    Privilege(#[from] Privilege),
    /// Invalid options (port 0, TTL 0, too many probes).
    #[error("{0}")]
    Usage(String),
    /// The target could not be parsed or resolved to one unicast host.
    #[error("{0}")]
    Target(String),
    /// No route to the target.
    #[error("no route to {dst}: {err}")]
    NoRoute {
        /// The target address.
        dst: IpAddr,
        /// The system's error.
        err: io::Error,
    },
    /// A socket operation failed; `what` names it and the target.
    #[error("{what}: {err}")]
    Io {
        /// The operation, e.g. `probing 10.0.0.2:80`.
        what: String,
        /// The system's error.
        err: io::Error,
    },
}

impl Error {
    /// An I/O error with what was being done.
    pub(crate) fn io(what: impl Into<String>, err: io::Error) -> Self {
        Error::Io {
            what: what.into(),
            err,
        }
    }

    /// Opening the raw sockets failed: refused (EPERM/EACCES from `socket()`, which only
    /// a missing CAP_NET_RAW causes there) is [`Error::Privilege`].
    pub(crate) fn raw_open(err: io::Error) -> Self {
        if err.kind() == io::ErrorKind::PermissionDenied {
            return Error::Privilege(Privilege::new(
                lagtrace_model::Capability::NetRaw,
                "opening raw sockets",
                " (run as root or `setcap cap_net_raw+ep`)",
            ));
        }
        Error::io("opening raw sockets", err)
    }
}

/// This crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
