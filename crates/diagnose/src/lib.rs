//! lagtrace-diagnose: see ../shared/DESIGN.md. Not built yet.
