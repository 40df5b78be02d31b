//! Why a diagnosis could not start. Everything the layers measure, failures and missing
//! privileges included, is data in the [`crate::Diagnosis`], not an error.

/// A diagnosis could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The URL is not `http(s)://host[:port]/...`, or its host does not resolve.
    #[error("{0}")]
    Target(String),
    /// The port in the URL is not 1-65535.
    #[error(transparent)]
    Port(#[from] lagtrace_probe::Error),
    /// Invalid options (concurrency 0, a duration out of range).
    #[error("{0}")]
    Usage(String),
}

/// This crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
