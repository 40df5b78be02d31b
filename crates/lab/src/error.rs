//! The lab's error type. Its text is the whole chain on one line (`outer: inner: cause`),
//! the same lines the lab printed before it had a type; a missing capability is a typed
//! [`Error::Privilege`] the caller can match.

use std::fmt::Display;
use std::io;

use lagtrace_model::Privilege;

/// What could not be done, and why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The process lacks CAP_NET_ADMIN / CAP_SYS_ADMIN.
    #[error(transparent)]
    Privilege(#[from] Privilege),
    /// An I/O operation failed; `what` names the operation, file or address.
    #[error("{what}: {err}")]
    Io {
        /// The operation, e.g. `creating /run/lagtrace/x`.
        what: String,
        /// The system's error.
        err: io::Error,
    },
    /// A state file could not be parsed.
    #[error("{what}: {err}")]
    State {
        /// Which file.
        what: String,
        /// serde's error.
        err: serde_json::Error,
    },
    /// A step failed (a command's stderr, a server that did not answer, a bad name).
    #[error("{0}")]
    Failed(String),
    /// `what` failed because of `err`.
    #[error("{what}: {err}")]
    Context {
        /// The step, e.g. `starting the built-in latency server`.
        what: String,
        /// Why.
        err: Box<Error>,
    },
}

impl Error {
    /// The missing capability, when that is (at the bottom of the chain) why it failed.
    pub fn privilege(&self) -> Option<&Privilege> {
        match self {
            Error::Privilege(p) => Some(p),
            Error::Context { err, .. } => err.privilege(),
            _ => None,
        }
    }
}

/// This crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `anyhow`-style context on the lab's fallible steps, producing typed errors.
pub(crate) trait Context<T> {
    /// Wraps the error (or a `None`) with `what`.
    fn context<C: Display>(self, what: C) -> Result<T>;
    /// Like [`Context::context`], building `what` only on failure.
    fn with_context<C: Display, F: FnOnce() -> C>(self, what: F) -> Result<T>;
}

impl<T> Context<T> for Result<T> {
    fn context<C: Display>(self, what: C) -> Result<T> {
        self.map_err(|e| Error::Context {
            what: what.to_string(),
            err: Box::new(e),
        })
    }
    fn with_context<C: Display, F: FnOnce() -> C>(self, what: F) -> Result<T> {
        self.map_err(|e| Error::Context {
            what: what().to_string(),
            err: Box::new(e),
        })
    }
}

impl<T> Context<T> for std::result::Result<T, io::Error> {
    fn context<C: Display>(self, what: C) -> Result<T> {
        self.map_err(|err| Error::Io {
            what: what.to_string(),
            err,
        })
    }
    fn with_context<C: Display, F: FnOnce() -> C>(self, what: F) -> Result<T> {
        self.map_err(|err| Error::Io {
            what: what().to_string(),
            err,
        })
    }
}

impl<T> Context<T> for std::result::Result<T, serde_json::Error> {
    fn context<C: Display>(self, what: C) -> Result<T> {
        self.map_err(|err| Error::State {
            what: what.to_string(),
            err,
        })
    }
    fn with_context<C: Display, F: FnOnce() -> C>(self, what: F) -> Result<T> {
        self.map_err(|err| Error::State {
            what: what().to_string(),
            err,
        })
    }
}

impl<T> Context<T> for std::result::Result<T, std::num::TryFromIntError> {
    fn context<C: Display>(self, what: C) -> Result<T> {
        self.map_err(|e| Error::Failed(format!("{what}: {e}")))
    }
    fn with_context<C: Display, F: FnOnce() -> C>(self, what: F) -> Result<T> {
        self.map_err(|e| Error::Failed(format!("{}: {e}", what())))
    }
}

impl<T> Context<T> for Option<T> {
    fn context<C: Display>(self, what: C) -> Result<T> {
        self.ok_or_else(|| Error::Failed(what.to_string()))
    }
    fn with_context<C: Display, F: FnOnce() -> C>(self, what: F) -> Result<T> {
        self.ok_or_else(|| Error::Failed(what().to_string()))
    }
}

/// Returns `Err(Error::Failed(format!(...)))`.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::error::Error::Failed(format!($($arg)*)))
    };
}
pub(crate) use bail;
