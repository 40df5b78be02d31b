//! Running code inside a Linux network namespace.
//!
//! A network namespace is a per-thread attribute, so the safe way to use one from a
//! multi-threaded program is a dedicated thread that calls `setns(2)` and then does its
//! work: sockets opened there stay bound to that namespace after the thread ends.
//! Needs CAP_SYS_ADMIN (root) to enter a namespace other than the current one.
#![deny(missing_docs)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use lagtrace_model::{Capability, Privilege};

/// Why a namespace could not be entered.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The namespace file cannot be opened (no such namespace, or no access to it).
    #[error("network namespace {}: {err}", path.display())]
    Open {
        /// The namespace file.
        path: PathBuf,
        /// Why.
        err: io::Error,
    },
    /// `setns` was refused: entering another namespace needs CAP_SYS_ADMIN.
    #[error(transparent)]
    Privilege(Privilege),
    /// `setns` failed otherwise (not a network namespace file, …).
    #[error("entering network namespace {}: {err}", path.display())]
    Enter {
        /// The namespace file.
        path: PathBuf,
        /// Why.
        err: io::Error,
    },
}

impl Error {
    /// The missing capability, when that is why it failed.
    pub fn privilege(&self) -> Option<&Privilege> {
        match self {
            Error::Privilege(p) => Some(p),
            _ => None,
        }
    }

    fn enter(path: &Path, err: io::Error) -> Self {
        if err.kind() == io::ErrorKind::PermissionDenied {
            Error::Privilege(Privilege::new(
                Capability::SysAdmin,
                format!("entering network namespace {}", path.display()),
                format!(" (run as root): {err}"),
            ))
        } else {
            Error::Enter {
                path: path.to_path_buf(),
                err,
            }
        }
    }
}

/// For callers whose own errors are `io::Error`: the kind is kept (`PermissionDenied` for a
/// missing privilege), the message is this error's.
impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        let kind = match &e {
            Error::Open { err, .. } | Error::Enter { err, .. } => err.kind(),
            Error::Privilege(_) => io::ErrorKind::PermissionDenied,
        };
        io::Error::new(kind, e)
    }
}

/// Where `ip netns add NAME` puts the namespace's bind mount.
pub const NETNS_RUN_DIR: &str = "/run/netns";

/// A network namespace to run in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetNs {
    /// The caller's own namespace: no `setns` at all.
    Current,
    /// A named namespace under /run/netns (as made by `ip netns add`).
    Named(String),
    /// The namespace of a running process (`/proc/PID/ns/net`).
    Pid(u32),
    /// Any namespace file.
    Path(PathBuf),
}

impl NetNs {
    /// `Current` for `None`, `Named` otherwise: the usual mapping of a `--netns` flag.
    pub fn from_flag(name: Option<&str>) -> NetNs {
        match name {
            None => NetNs::Current,
            Some(n) => NetNs::Named(n.to_string()),
        }
    }

    /// The namespace file, or `None` for `Current`.
    pub fn path(&self) -> Option<PathBuf> {
        match self {
            NetNs::Current => None,
            NetNs::Named(n) => Some(Path::new(NETNS_RUN_DIR).join(n)),
            NetNs::Pid(p) => Some(PathBuf::from(format!("/proc/{p}/ns/net"))),
            NetNs::Path(p) => Some(p.clone()),
        }
    }

    /// Whether the namespace exists (always true for `Current`).
    pub fn exists(&self) -> bool {
        self.path().is_none_or(|p| p.exists())
    }

    /// Runs `f` on a thread that has entered this namespace, and returns its result.
    ///
    /// Errors only if the namespace cannot be opened or entered; `f`'s own outcome is in `T`.
    pub fn run<T, F>(&self, f: F) -> Result<T, Error>
    where
        T: Send,
        F: FnOnce() -> T + Send,
    {
        let Some(path) = self.path() else {
            return Ok(f());
        };
        let file = open(&path)?;
        std::thread::scope(|s| {
            s.spawn(move || {
                enter(&file).map_err(|e| Error::enter(&path, e))?;
                Ok(f())
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    /// Makes the *calling thread* enter this namespace for the rest of its life.
    /// Use on threads you own (for example a capture or load worker thread).
    pub fn enter_current_thread(&self) -> Result<(), Error> {
        let Some(path) = self.path() else {
            return Ok(());
        };
        let file = open(&path)?;
        enter(&file).map_err(|e| Error::enter(&path, e))
    }

    /// The namespace's inode number (identifies it across names and processes). `Current`
    /// is the calling thread's namespace (`/proc/thread-self`): `/proc/self` is the main
    /// thread's, another namespace than a thread's that entered one.
    pub fn inode(&self) -> io::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        let p = self
            .path()
            .unwrap_or_else(|| PathBuf::from("/proc/thread-self/ns/net"));
        Ok(std::fs::metadata(p)?.ino())
    }
}

fn open(path: &Path) -> Result<File, Error> {
    File::open(path).map_err(|err| Error::Open {
        path: path.to_path_buf(),
        err,
    })
}

fn enter(file: &File) -> io::Result<()> {
    // SAFETY: setns on a valid fd we own; affects only the calling thread.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Names of the namespaces under /run/netns.
pub fn list_named() -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(NETNS_RUN_DIR) else {
        return Vec::new();
    };
    let mut v: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_runs_inline_and_has_an_inode() {
        assert_eq!(NetNs::Current.run(|| 7).unwrap(), 7);
        assert!(NetNs::Current.inode().unwrap() > 0);
        assert!(NetNs::Current.exists());
    }

    #[test]
    fn a_missing_namespace_is_an_error_naming_it() {
        let ns = NetNs::Named("lagtrace-no-such-ns-xyz".into());
        assert!(!ns.exists());
        let e = ns.run(|| ()).unwrap_err();
        assert!(e.to_string().contains("lagtrace-no-such-ns-xyz"), "{e}");
    }

    #[test]
    #[ignore = "needs root"]
    fn current_is_the_calling_threads_namespace() {
        let main = NetNs::Current.inode().unwrap();
        let (own, seen) = std::thread::spawn(|| {
            // SAFETY: unshare on this thread only; it ends with the thread.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
            let own = std::fs::metadata("/proc/thread-self/ns/net").map(|m| {
                use std::os::unix::fs::MetadataExt;
                m.ino()
            });
            (own.unwrap(), NetNs::Current.inode().unwrap())
        })
        .join()
        .unwrap();
        assert_ne!(own, main);
        assert_eq!(seen, own);
        assert_eq!(NetNs::Current.inode().unwrap(), main);
    }

    #[test]
    #[ignore = "needs root"]
    fn own_pid_namespace_is_the_current_one() {
        let me = NetNs::Pid(std::process::id());
        assert_eq!(me.inode().unwrap(), NetNs::Current.inode().unwrap());
        assert_eq!(me.run(|| 3).unwrap(), 3);
    }
}
