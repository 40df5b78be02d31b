//! lagtrace-lab: see ../shared/DESIGN.md. Not built yet.
