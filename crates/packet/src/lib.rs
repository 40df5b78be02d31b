//! lagtrace-packet: see ../shared/DESIGN.md. Not built yet.
pub mod annotate;
pub mod capture;
