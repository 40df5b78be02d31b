//! lagtrace-sockets: see ../shared/DESIGN.md. Not built yet.
