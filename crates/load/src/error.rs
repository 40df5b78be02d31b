//! Why a load run could not start (bad URL or options, unresolvable host, nothing
//! listening, TLS failure). Timeouts, resets and error statuses during the run are counted
//! in the report, not raised. The text is the whole chain on one line (`what: why`).

use std::fmt::Display;

/// A load run could not start or its output could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Invalid options or URL; the text says which and why.
    #[error("{0}")]
    Usage(String),
    /// `what` failed because of `err` (which address, which file, which step).
    #[error("{what}: {err}")]
    Failed {
        /// The step, e.g. `cannot connect to example.com:80 (10.0.0.2:80)`.
        what: String,
        /// Why.
        err: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// A failure that carries its own words.
    #[error("{0}")]
    Other(String),
}

/// This crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `anyhow`-style context on fallible steps, producing typed errors.
pub(crate) trait Context<T> {
    /// Wraps the error with `what` (a `None` becomes [`Error::Other`]`(what)`).
    fn context<C: Display>(self, what: C) -> Result<T>;
    /// Like [`Context::context`], building `what` only on failure.
    fn with_context<C: Display, F: FnOnce() -> C>(self, what: F) -> Result<T>;
}

impl<T, E: std::error::Error + Send + Sync + 'static> Context<T> for std::result::Result<T, E> {
    fn context<C: Display>(self, what: C) -> Result<T> {
        self.map_err(|e| Error::Failed {
            what: what.to_string(),
            err: Box::new(e),
        })
    }
    fn with_context<C: Display, F: FnOnce() -> C>(self, what: F) -> Result<T> {
        self.map_err(|e| Error::Failed {
            what: what().to_string(),
            err: Box::new(e),
        })
    }
}

impl<T> Context<T> for Option<T> {
    fn context<C: Display>(self, what: C) -> Result<T> {
        self.ok_or_else(|| Error::Other(what.to_string()))
    }
    fn with_context<C: Display, F: FnOnce() -> C>(self, what: F) -> Result<T> {
        self.ok_or_else(|| Error::Other(what().to_string()))
    }
}

/// Returns `Err(Error::Usage(format!(...)))`.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::error::Error::Usage(format!($($arg)*)))
    };
}
pub(crate) use bail;
