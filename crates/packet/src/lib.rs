//! lagtrace-packet: capture files to TCP streams, transactions and latency findings.
//!
//! - [`reader`]: a streaming pcap/pcapng reader that borrows each frame from one buffer.
//! - [`wire`]: borrow-only link/IP/TCP header decoding (checksums are never checked).
//! - [`analysis`]: the streaming [`Analyzer`] (connection tracking as Wireshark's
//!   `tcp.stream`, transactions, findings) and its serde [`Analysis`].
//!
//! `diagnose` calls [`analyze_file`] on a finished capture, or feeds an [`Analyzer`] frame by
//! frame from a live capture and calls [`Analyzer::finish`].

pub mod analysis;
pub mod annotate;
pub mod capture;
mod error;
pub mod reader;
pub mod wire;

use std::path::Path;

pub use analysis::{
    Analysis, AnalyzeOptions, Analyzer, Finding, FindingKind, KindSummary, PacketRecord,
    StreamSummary, SynOptions, Transaction, TransactionStats,
};
pub use error::{Error, Result};
pub use reader::{CaptureReader, Frame, ReadEvent};

/// Reads a pcap or pcapng file and analyzes every TCP stream in it.
///
/// Errors only when the file cannot be opened or is not a capture file at all; damage
/// inside the file ends up in [`Analysis::warnings`].
pub fn analyze_file(path: &Path, opts: &AnalyzeOptions) -> Result<Analysis> {
    analyze_file_prefix(path, opts, u64::MAX)
}

/// Like [`analyze_file`] over the file's first `frames` frames only.
pub fn analyze_file_prefix(path: &Path, opts: &AnalyzeOptions, frames: u64) -> Result<Analysis> {
    let file =
        std::fs::File::open(path).map_err(|e| Error::io(format!("open {}", path.display()), e))?;
    analyze_frames(file, opts, frames).map_err(|e| Error::Read {
        path: path.to_path_buf(),
        err: Box::new(e),
    })
}

/// Like [`analyze_file`] over any reader.
pub fn analyze_reader<R: std::io::Read>(src: R, opts: &AnalyzeOptions) -> Result<Analysis> {
    analyze_frames(src, opts, u64::MAX)
}

/// The analysis of the first `frames` frames of a capture read from `src`.
fn analyze_frames<R: std::io::Read>(
    src: R,
    opts: &AnalyzeOptions,
    frames: u64,
) -> Result<Analysis> {
    let mut reader = CaptureReader::new(src)?;
    let mut an = Analyzer::new(opts.clone());
    let mut n = 0;
    while n < frames
        && let Some(ev) = reader.next()
    {
        match ev {
            ReadEvent::Frame(f) => {
                an.push_frame(&f);
                n += 1;
            }
            ReadEvent::Warning(w) => an.warn(w),
        }
    }
    Ok(an.finish())
}
