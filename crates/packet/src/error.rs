//! The one error type of this crate. Each variant's text carries its whole context (which
//! file, which interface, which operation) on one line, so `{}` is the full message.

use std::io;
use std::path::PathBuf;

use lagtrace_model::Privilege;

/// What could not be done, and why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A capability is missing: capturing needs CAP_NET_RAW, entering a namespace
    /// CAP_SYS_ADMIN.
    #[error(transparent)]
    Privilege(#[from] Privilege),
    /// An I/O operation failed; `what` names the operation and the file.
    #[error("{what}: {err}")]
    Io {
        /// The operation, e.g. `open /tmp/x.pcap`.
        what: String,
        /// The system's error.
        err: io::Error,
    },
    /// Reading or writing a stream failed; the enclosing [`Error::Read`] or
    /// [`Error::Annotate`] names the file.
    #[error(transparent)]
    Stream(#[from] io::Error),
    /// The input is not a pcap/pcapng file, or its header is damaged.
    #[error("{0}")]
    Format(String),
    /// Reading the capture file `path` failed.
    #[error("read {}: {err}", path.display())]
    Read {
        /// The capture file.
        path: PathBuf,
        /// Why.
        err: Box<Error>,
    },
    /// Annotating `input` into `output` failed.
    #[error("annotating {} into {}: {err}", input.display(), output.display())]
    Annotate {
        /// The capture read.
        input: PathBuf,
        /// The pcapng written.
        output: PathBuf,
        /// Why.
        err: Box<Error>,
    },
    /// No interface of that name (in that namespace).
    #[error("no interface named {iface}{} ({msg})", netns.as_ref().map(|p| format!(" in network namespace {}", p.display())).unwrap_or_default())]
    NoInterface {
        /// The interface asked for.
        iface: String,
        /// The namespace it was looked up in, when not the current one.
        netns: Option<PathBuf>,
        /// libpcap's message.
        msg: String,
    },
    /// The capture's namespace could not be opened or entered.
    #[error(transparent)]
    Netns(lagtrace_netns::Error),
    /// The `--netns` path does not exist.
    #[error("network namespace {} does not exist", .0.display())]
    NoNamespace(PathBuf),
    /// libpcap refused an operation; `what` names it (and the interface).
    #[error("{what}: {msg}")]
    Capture {
        /// The operation, e.g. `reading packets on eth0`.
        what: String,
        /// libpcap's (or the system's) message.
        msg: String,
    },
    /// The capture thread ended without a result.
    #[error("{0}")]
    Thread(&'static str),
    /// Invalid options (a snaplen of 0, the output being the input).
    #[error("{0}")]
    Usage(String),
}

impl Error {
    /// An I/O error with what was being done.
    pub(crate) fn io(what: impl Into<String>, err: io::Error) -> Self {
        Error::Io {
            what: what.into(),
            err,
        }
    }

    /// A libpcap error with what was being done.
    pub(crate) fn capture(what: impl Into<String>, msg: impl ToString) -> Self {
        Error::Capture {
            what: what.into(),
            msg: msg.to_string(),
        }
    }

    /// The missing capability, when that is why it failed (also inside [`Error::Read`]).
    pub fn privilege(&self) -> Option<&Privilege> {
        match self {
            Error::Privilege(p) => Some(p),
            Error::Netns(e) => e.privilege(),
            Error::Read { err, .. } | Error::Annotate { err, .. } => err.privilege(),
            _ => None,
        }
    }
}

/// This crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
