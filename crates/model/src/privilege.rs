//! The one privilege error: what could not be done and which Linux capability it needs.
//! Engines return it inside their own `Error` enums; the orchestrator and the binary decide
//! "missing privilege" by this type, never by matching message text.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A Linux capability lagtrace may need (`capabilities(7)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Capability {
    /// Raw sockets and packet capture.
    NetRaw,
    /// Links, addresses, qdiscs, nftables.
    NetAdmin,
    /// Creating and entering namespaces.
    SysAdmin,
    /// Another process's descriptors (`pidfd_getfd`).
    SysPtrace,
    /// Loading eBPF programs.
    Bpf,
    /// Perf events.
    Perfmon,
}

impl Capability {
    /// The kernel's name, e.g. `CAP_NET_RAW`.
    pub fn name(self) -> &'static str {
        match self {
            Self::NetRaw => "CAP_NET_RAW",
            Self::NetAdmin => "CAP_NET_ADMIN",
            Self::SysAdmin => "CAP_SYS_ADMIN",
            Self::SysPtrace => "CAP_SYS_PTRACE",
            Self::Bpf => "CAP_BPF",
            Self::Perfmon => "CAP_PERFMON",
        }
    }

    /// The bit number in the capability sets (`linux/capability.h`).
    pub fn bit(self) -> u32 {
        match self {
            Self::NetAdmin => 12,
            Self::NetRaw => 13,
            Self::SysAdmin => 21,
            Self::SysPtrace => 19,
            Self::Perfmon => 38,
            Self::Bpf => 39,
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An operation refused for lack of a capability. Displays as
/// `{what} needs {CAP_A and CAP_B}{hint}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Privilege {
    /// What could not be done, e.g. `capturing on eth0`.
    pub what: String,
    /// The capabilities it needs (at least one).
    pub capabilities: Vec<Capability>,
    /// Appended after the capability names: how to get them, what works without them.
    pub hint: String,
}

impl Privilege {
    /// `what` needs `capability`; `hint` follows the capability's name verbatim.
    pub fn new(capability: Capability, what: impl Into<String>, hint: impl Into<String>) -> Self {
        Self {
            what: what.into(),
            capabilities: vec![capability],
            hint: hint.into(),
        }
    }

    /// Whether `capability` is one of those needed.
    pub fn needs(&self, capability: Capability) -> bool {
        self.capabilities.contains(&capability)
    }
}

impl fmt::Display for Privilege {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} needs ", self.what)?;
        for (i, c) in self.capabilities.iter().enumerate() {
            if i > 0 {
                f.write_str(" and ")?;
            }
            f.write_str(c.name())?;
        }
        f.write_str(&self.hint)
    }
}

impl std::error::Error for Privilege {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_every_capability_it_needs() {
        let p = Privilege {
            what: "the lab".into(),
            capabilities: vec![Capability::NetAdmin, Capability::SysAdmin],
            hint: " (run as root)".into(),
        };
        assert_eq!(
            p.to_string(),
            "the lab needs CAP_NET_ADMIN and CAP_SYS_ADMIN (run as root)"
        );
        assert!(p.needs(Capability::SysAdmin) && !p.needs(Capability::NetRaw));
        let one = Privilege::new(Capability::NetRaw, "capturing on lo", "");
        assert_eq!(one.to_string(), "capturing on lo needs CAP_NET_RAW");
        assert_eq!(
            serde_json::to_string(&Capability::SysPtrace).unwrap(),
            "\"SYS_PTRACE\""
        );
    }
}
