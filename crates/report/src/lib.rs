//! lagtrace-report: see ../shared/DESIGN.md. Not built yet.
