//! Tracepoints by name: their id and record layout from tracefs, mounted at
//! /sys/kernel/tracing when no tracefs is mounted (needs CAP_SYS_ADMIN).

use std::io;
use std::path::{Path, PathBuf};

const TRACEFS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The directory of tracepoint `group/name` (`events/group/name` in tracefs).
pub fn event_dir(group: &str, name: &str) -> io::Result<PathBuf> {
    let rel = format!("events/{group}/{name}");
    for dir in TRACEFS {
        let p = Path::new(dir).join(&rel);
        if p.exists() {
            return Ok(p);
        }
    }
    if !TRACEFS.iter().any(|d| Path::new(d).join("events").exists()) {
        let target = c"/sys/kernel/tracing";
        // SAFETY: mount(2) with valid NUL-terminated strings and no data.
        let rc = unsafe {
            libc::mount(
                c"tracefs".as_ptr(),
                target.as_ptr(),
                c"tracefs".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    let p = Path::new(TRACEFS[0]).join(&rel);
    if p.exists() {
        Ok(p)
    } else {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no {group}:{name} tracepoint in tracefs"),
        ))
    }
}

/// The id of tracepoint `group/name` (perf's `config` for it).
pub fn id(group: &str, name: &str) -> io::Result<u64> {
    let p = event_dir(group, name)?.join("id");
    std::fs::read_to_string(&p)?.trim().parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: not a number", p.display()),
        )
    })
}

/// A tracepoint's `format` file: its id and fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Format {
    /// Its id (perf's `config`).
    pub id: u64,
    /// (name, offset, size) of each field.
    pub fields: Vec<(String, usize, usize)>,
}

impl Format {
    /// Parses a `format` file.
    pub fn parse(text: &str) -> Option<Format> {
        let id = text
            .lines()
            .find_map(|l| l.strip_prefix("ID:"))?
            .trim()
            .parse()
            .ok()?;
        let fields = text
            .lines()
            .filter_map(|l| {
                let l = l.trim().strip_prefix("field:")?;
                let mut parts = l.split(';');
                let decl = parts.next()?.trim();
                let name = decl.rsplit([' ', '*']).next()?;
                let name = name.split('[').next()?.to_string();
                let num = |key: &str| -> Option<usize> {
                    l.split(';')
                        .find_map(|p| p.trim().strip_prefix(key))?
                        .trim()
                        .parse()
                        .ok()
                };
                Some((name, num("offset:")?, num("size:")?))
            })
            .collect();
        Some(Format { id, fields })
    }

    /// Reads the format of tracepoint `group/name`.
    pub fn of(group: &str, name: &str) -> io::Result<Format> {
        let p = event_dir(group, name)?.join("format");
        let text = std::fs::read_to_string(&p)?;
        Format::parse(&text).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: unexpected format", p.display()),
            )
        })
    }

    /// The offset and size of field `name`.
    pub fn field(&self, name: &str) -> Option<(usize, usize)> {
        self.fields
            .iter()
            .find(|f| f.0 == name)
            .map(|&(_, off, size)| (off, size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_format() {
        let text = "name: sched_process_fork\nID: 366\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:__data_loc char[] parent_comm;\toffset:8;\tsize:4;\tsigned:0;\n\
\tfield:pid_t child_pid;\toffset:20;\tsize:4;\tsigned:1;\n\
\tfield:char comm[16];\toffset:24;\tsize:16;\tsigned:0;\n\nprint fmt: \"x\"\n";
        let f = Format::parse(text).unwrap();
        assert_eq!(f.id, 366);
        assert_eq!(f.field("child_pid"), Some((20, 4)));
        assert_eq!(f.field("parent_comm"), Some((8, 4)));
        assert_eq!(f.field("comm"), Some((24, 16)));
        assert_eq!(f.field("common_type"), Some((0, 2)));
        assert_eq!(f.field("nope"), None);
    }
}
