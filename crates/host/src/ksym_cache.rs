//! The kernel's text symbols kept for the boot: reading `/proc/kallsyms` makes the kernel
//! format ~120 000 lines (~40 ms of CPU on the lab's VM, most of the host layer's own cost),
//! and the core kernel's symbols do not change until the next boot. The first run of a boot
//! (or of a new set of modules: the key holds `/proc/modules`) reads the file and keeps its
//! text symbols in `/run/lagtrace/ksyms` (tmpfs, root's alone: kernel addresses undo KASLR);
//! later runs look the needed addresses up there. What a copy cannot follow: a BPF program
//! loaded since (listed only with `net.core.bpf_jit_kallsyms`) is named as the file then
//! named its address — by the symbol below it, as a read of the file at that time would.
//!
//! The file: `LTKSYM1\0`, the first and last symbol addresses, the entry count (u64 LE
//! each), the entries sorted by address (address u64, name offset u32, name length u32, LE),
//! then the names. Anything that does not parse is no cache.

use std::io::Write;
use std::path::PathBuf;

const DIR: &str = "/run/lagtrace/ksyms";
const MAGIC: &[u8; 8] = b"LTKSYM1\0";
const HEADER: usize = 8 + 3 * 8;
const ENTRY: usize = 16;

/// The cache file for this boot and this set of modules, when there is a boot id.
fn path() -> Option<PathBuf> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let boot = boot.trim();
    if boot.is_empty() || !boot.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        return None;
    }
    // FNV-1a over the module list (names, sizes, addresses): a module loaded or unloaded
    // changes the key. A kernel without modules has no list.
    let modules = std::fs::read("/proc/modules").unwrap_or_default();
    let h = modules.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    Some(PathBuf::from(format!("{DIR}/ksyms-{boot}-{h:016x}")))
}

/// The parsed file: its first symbol's address and the sorted entries.
struct Table<'a> {
    lo: u64,
    entries: &'a [u8],
    names: &'a [u8],
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

impl<'a> Table<'a> {
    fn parse(b: &'a [u8]) -> Option<Table<'a>> {
        if b.get(..8)? != MAGIC {
            return None;
        }
        let (lo, hi) = (u64_at(b, 8)?, u64_at(b, 16)?);
        let n = usize::try_from(u64_at(b, 24)?).ok()?;
        let end = HEADER.checked_add(n.checked_mul(ENTRY)?)?;
        let entries = b.get(HEADER..end)?;
        (n > 0 && lo <= hi).then_some(Table {
            lo,
            entries,
            names: &b[end..],
        })
    }

    fn len(&self) -> usize {
        self.entries.len() / ENTRY
    }

    fn addr(&self, i: usize) -> u64 {
        u64_at(self.entries, i * ENTRY).unwrap_or(u64::MAX)
    }

    fn name(&self, i: usize) -> Option<&'a str> {
        let off = u32_at(self.entries, i * ENTRY + 8)? as usize;
        let len = u32_at(self.entries, i * ENTRY + 12)? as usize;
        std::str::from_utf8(self.names.get(off..off.checked_add(len)?)?).ok()
    }

    /// The nearest symbol at or below `a` (none below the first).
    fn lookup(&self, a: u64) -> Option<(u64, &'a str)> {
        if a < self.lo {
            return None;
        }
        let (mut l, mut r) = (0, self.len());
        while l < r {
            let m = (l + r) / 2;
            if self.addr(m) <= a {
                l = m + 1;
            } else {
                r = m;
            }
        }
        let i = l.checked_sub(1)?;
        Some((self.addr(i), self.name(i)?))
    }
}

/// The symbols naming `needed` from the boot's cache; `None` when there is no cache or it
/// does not parse. An address below every symbol is left out (unnamed, as in the file).
pub(crate) fn lookup(needed: &[u64]) -> Option<Vec<(u64, String)>> {
    let bytes = std::fs::read(path()?).ok()?;
    let t = Table::parse(&bytes)?;
    let mut out = Vec::with_capacity(needed.len());
    for &a in needed {
        if let Some((addr, name)) = t.lookup(a) {
            out.push((addr, name.to_string()));
        }
    }
    Some(out)
}

/// Keeps the text symbols of a whole `/proc/kallsyms` (sorted by address) for the boot;
/// silently nothing when not root or the directory cannot be made root's alone.
pub(crate) fn store_sorted(syms: &[(u64, &str)]) {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    if let (Some(path), Some(bytes)) = (path(), encode(syms)) {
        let _ = write_private(&path, &bytes);
    }
}

/// The file's bytes for `syms` (sorted by address); None without a symbol.
fn encode(syms: &[(u64, &str)]) -> Option<Vec<u8>> {
    let (lo, hi) = (syms.first()?.0, syms.last()?.0);
    let mut out = Vec::with_capacity(HEADER + syms.len() * (ENTRY + 24));
    out.extend_from_slice(MAGIC);
    for v in [lo, hi, syms.len() as u64] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let mut off = 0u32;
    for (a, n) in syms {
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&off.to_le_bytes());
        out.extend_from_slice(&(n.len() as u32).to_le_bytes());
        off = off.saturating_add(n.len() as u32);
    }
    for (_, n) in syms {
        out.extend_from_slice(n.as_bytes());
    }
    Some(out)
}

/// Writes `bytes` to `path` through a temporary file renamed into place, in a directory
/// made root's alone (0700; refused when it exists with other owners or modes).
fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
    let _ = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(DIR);
    let m = std::fs::symlink_metadata(DIR)?;
    if !m.is_dir() || m.uid() != 0 || m.mode() & 0o077 != 0 {
        return Err(std::io::Error::other("not root's alone"));
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    let r = f
        .write_all(bytes)
        .and_then(|()| std::fs::rename(&tmp, path));
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> Vec<u8> {
        encode(&crate::offcpu::text_symbols(text)).unwrap()
    }

    #[test]
    fn the_table_names_each_address_by_the_symbol_below_it() {
        let b = table(
            "ffffffff81000200 T second\nffffffff81000000 T first\n\
             ffffffff81000100 D data\nffffffff81000300 t third\n\
             ffffffffc0000000 t m1\t[mod]\n",
        );
        let t = Table::parse(&b).unwrap();
        assert_eq!(
            t.lookup(0xffffffff81000150),
            Some((0xffffffff81000000, "first"))
        );
        assert_eq!(
            t.lookup(0xffffffff81000200),
            Some((0xffffffff81000200, "second"))
        );
        assert_eq!(
            t.lookup(0xffffffff81000300),
            Some((0xffffffff81000300, "third"))
        );
        assert_eq!(
            t.lookup(0xffffffff81000301),
            Some((0xffffffff81000300, "third"))
        );
        assert_eq!(
            t.lookup(0xffffffffc0000010),
            Some((0xffffffffc0000000, "m1"))
        );
        // Below every symbol: none.
        assert_eq!(t.lookup(0xffffffff80000000), None);
        // A truncated or foreign file is no table.
        assert!(Table::parse(&b[..b.len() - 3]).is_some_and(|t| t.name(2).is_none()));
        assert!(Table::parse(&b[..HEADER + 3]).is_none());
        assert!(Table::parse(b"LTKSYM2\0").is_none());
    }

    /// On this kernel (as root, with addresses): the boot's copy names every sampled
    /// address as the file's own table does, and its file is root's alone.
    #[test]
    fn the_boots_copy_names_what_the_file_names() {
        use std::os::unix::fs::MetadataExt;
        let Ok(text) = std::fs::read_to_string("/proc/kallsyms") else {
            return;
        };
        let full = crate::offcpu::Kallsyms::parse(&text);
        // SAFETY: geteuid has no preconditions.
        if full.is_empty() || unsafe { libc::geteuid() } != 0 {
            return;
        }
        let all = crate::offcpu::text_symbols(&text);
        store_sorted(&all);
        let m = std::fs::metadata(path().unwrap()).expect("the boot's copy");
        assert_eq!(m.mode() & 0o077, 0, "{:o}", m.mode());
        let needed: Vec<u64> = all.iter().step_by(89).map(|s| s.0 + 1).collect();
        let got = lookup(&needed).expect("the copy");
        assert_eq!(got.len(), needed.len());
        let one_pass = crate::offcpu::Kallsyms::naming(&all, &needed);
        for (&a, (at, name)) in needed.iter().zip(&got) {
            // The same symbol address (several names can share one).
            assert!(*at <= a, "{a:x}");
            assert_eq!(
                one_pass.name(a).is_some(),
                !name.is_empty(),
                "{a:x}: {name}"
            );
            assert!(
                all.iter().any(|s| s.0 == *at && s.1 == name),
                "{a:x}: {name} at {at:x}"
            );
            assert!(
                !all.iter().any(|s| s.0 > *at && s.0 <= a),
                "{a:x}: a nearer one"
            );
        }
    }
}
