//! lagtrace-load: see ../shared/DESIGN.md. Not built yet.
