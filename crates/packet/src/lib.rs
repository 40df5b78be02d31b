//! lagtrace-packet: see ../shared/DESIGN.md. Not built yet.
