//! lagtrace-probe: see ../shared/DESIGN.md. Not built yet.
