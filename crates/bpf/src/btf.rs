//! The running kernel's BTF (`/sys/kernel/btf/vmlinux`) read in a single pass over its
//! type section that records where each type starts, then looked up by name: struct member
//! offsets (in place of CO-RE relocations) and function ids (a trampoline program's
//! `attach_btf_id`). A full BTF loader parses every one of the kernel's ~100 000 types into
//! objects (tens of ms of CPU, seconds on a loaded machine); an offset or function the
//! kernel's BTF does not have is an error, never a guess.

use std::fmt;

/// The running kernel's BTF.
pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";
const BTF_MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// Why the BTF could not be read, or has not what was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BtfError(pub String);

impl fmt::Display for BtfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernel BTF: {}", self.0)
    }
}

fn err(s: impl Into<String>) -> BtfError {
    BtfError(s.into())
}

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(off..off + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

/// A map an object declares: name, map type, key size, value size, max entries.
pub type MapDef = (String, u32, u32, u32, u32);

/// A BTF blob with the start of each type (by id) indexed.
pub struct Btf<'a> {
    types: &'a [u8],
    strings: &'a [u8],
    /// Byte offset in `types` of type id `i + 1`.
    starts: Vec<u32>,
}

/// A type's header: kind, member count, name offset, size-or-type.
struct Head {
    kind: u32,
    vlen: usize,
    kind_flag: bool,
    name: u32,
    type_or_size: u32,
}

impl<'a> Btf<'a> {
    /// Indexes the blob `b` (one pass).
    pub fn parse(b: &'a [u8]) -> Result<Btf<'a>, BtfError> {
        if u16_at(b, 0) != Some(BTF_MAGIC) {
            return Err(err("not little-endian BTF (bad magic)"));
        }
        let field = |o| {
            u32_at(b, o)
                .map(|v| v as usize)
                .ok_or_else(|| err("truncated header"))
        };
        let (hdr, type_off, type_len, str_off, str_len) =
            (field(4)?, field(8)?, field(12)?, field(16)?, field(20)?);
        let types = b
            .get(hdr + type_off..hdr + type_off + type_len)
            .ok_or_else(|| err("type section out of bounds"))?;
        let strings = b
            .get(hdr + str_off..hdr + str_off + str_len)
            .ok_or_else(|| err("string section out of bounds"))?;
        let mut starts = Vec::with_capacity(type_len / 16);
        let mut pos = 0usize;
        while pos < types.len() {
            let info = u32_at(types, pos + 4).ok_or_else(|| err("truncated type"))?;
            let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
            let extra = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
                2 | 7 | KIND_TYPEDEF..=KIND_RESTRICT | KIND_FUNC | 16 | KIND_TYPE_TAG => 0,
                k => return Err(err(format!("unknown type kind {k}"))),
            };
            starts.push(u32::try_from(pos).map_err(|_| err("type section too large"))?);
            pos += 12 + extra;
        }
        Ok(Btf {
            types,
            strings,
            starts,
        })
    }

    fn head(&self, id: u32) -> Option<Head> {
        let pos = *self.starts.get((id as usize).checked_sub(1)?)? as usize;
        let info = u32_at(self.types, pos + 4)?;
        Some(Head {
            kind: (info >> 24) & 0x1f,
            vlen: (info & 0xffff) as usize,
            kind_flag: info >> 31 == 1,
            name: u32_at(self.types, pos)?,
            type_or_size: u32_at(self.types, pos + 8)?,
        })
    }

    fn name_is(&self, off: u32, name: &str) -> bool {
        let s = self.strings.get(off as usize..).unwrap_or(&[]);
        s.len() > name.len() && s.starts_with(name.as_bytes()) && s[name.len()] == 0
    }

    /// The id of the struct (with members) named `name`.
    fn find_struct(&self, name: &str) -> Option<u32> {
        (1..=self.starts.len() as u32).find(|&id| {
            self.head(id)
                .is_some_and(|h| h.kind == KIND_STRUCT && h.vlen > 0 && self.name_is(h.name, name))
        })
    }

    /// `id` with typedefs and qualifiers taken off.
    fn resolve(&self, mut id: u32) -> Option<u32> {
        for _ in 0..32 {
            let h = self.head(id)?;
            match h.kind {
                KIND_TYPEDEF..=KIND_RESTRICT | KIND_TYPE_TAG => id = h.type_or_size,
                _ => return Some(id),
            }
        }
        None
    }

    /// Member `name` of the struct or union `id`, looking into anonymous members: its byte
    /// offset and type.
    fn member(&self, id: u32, name: &str, depth: u32) -> Option<(u32, u32)> {
        let h = self.head(id)?;
        if !matches!(h.kind, KIND_STRUCT | KIND_UNION) || depth > 8 {
            return None;
        }
        let base = *self.starts.get(id as usize - 1)? as usize + 12;
        (0..h.vlen).find_map(|i| {
            let m = base + 12 * i;
            let (m_name, m_type, m_off) = (
                u32_at(self.types, m)?,
                u32_at(self.types, m + 4)?,
                u32_at(self.types, m + 8)?,
            );
            let bits = if h.kind_flag {
                m_off & 0xff_ffff
            } else {
                m_off
            };
            if m_name == 0 {
                let (o, t) = self.member(self.resolve(m_type)?, name, depth + 1)?;
                return Some((bits / 8 + o, t));
            }
            self.name_is(m_name, name).then_some((bits / 8, m_type))
        })
    }

    /// The byte offset of `path` (members, nested) in struct `root`.
    pub fn offset(&self, root: &str, path: &[&str]) -> Result<u32, BtfError> {
        let what = || format!("no {root}.{}", path.join("."));
        let mut id = self.find_struct(root).ok_or_else(|| err(what()))?;
        let mut total = 0;
        for field in path {
            let (o, t) = self.member(id, field, 0).ok_or_else(|| err(what()))?;
            total += o;
            id = self.resolve(t).ok_or_else(|| err(what()))?;
        }
        Ok(total)
    }

    /// The size in bytes of type `id` (`None` for a kind without one: void, a function).
    fn size_of(&self, id: u32) -> Option<u32> {
        let id = self.resolve(id)?;
        let h = self.head(id)?;
        match h.kind {
            KIND_INT | KIND_STRUCT | KIND_UNION | KIND_ENUM | KIND_ENUM64 => Some(h.type_or_size),
            2 => Some(8),
            KIND_ARRAY => {
                let (elem, n) = self.array(id)?;
                self.size_of(elem)?.checked_mul(n)
            }
            _ => None,
        }
    }

    /// An array's element type and length.
    fn array(&self, id: u32) -> Option<(u32, u32)> {
        let pos = *self.starts.get((id as usize).checked_sub(1)?)? as usize + 12;
        Some((u32_at(self.types, pos)?, u32_at(self.types, pos + 8)?))
    }

    /// The maps an object's BTF declares in its `.maps` section (libbpf's convention:
    /// `__uint(name, N)` is a pointer to an array of N, `__type(name, T)` a pointer to T),
    /// as (name, map type, key size, value size, max entries); an absent field is 0.
    pub fn map_defs(&self) -> Result<Vec<MapDef>, BtfError> {
        let sec = (1..=self.starts.len() as u32)
            .find(|&id| {
                self.head(id)
                    .is_some_and(|h| h.kind == KIND_DATASEC && self.name_is(h.name, ".maps"))
            })
            .ok_or_else(|| err("no .maps section"))?;
        let h = self.head(sec).ok_or_else(|| err("bad .maps"))?;
        let base = self.starts[sec as usize - 1] as usize + 12;
        (0..h.vlen)
            .map(|i| {
                let bad = || err(format!(".maps entry {i}"));
                let var = u32_at(self.types, base + 12 * i).ok_or_else(bad)?;
                let v = self
                    .head(var)
                    .filter(|v| v.kind == KIND_VAR)
                    .ok_or_else(bad)?;
                let name = self.name(v.name).ok_or_else(bad)?;
                let def = self.resolve(v.type_or_size).ok_or_else(bad)?;
                let field = |f: &str| -> Result<u32, BtfError> {
                    let Some((_, t)) = self.member(def, f, 0) else {
                        return Ok(0);
                    };
                    let target = self
                        .head(t)
                        .filter(|p| p.kind == 2)
                        .and_then(|p| self.resolve(p.type_or_size))
                        .ok_or_else(|| err(format!("map {name}: {f} is no pointer")))?;
                    let n = match self.head(target).map(|h| h.kind) {
                        Some(KIND_ARRAY)
                            if matches!(f, "type" | "max_entries" | "key_size" | "value_size") =>
                        {
                            self.array(target).map(|a| a.1)
                        }
                        _ => self.size_of(target),
                    };
                    n.ok_or_else(|| err(format!("map {name}: {f} has no size")))
                };
                let key = field("key")?.max(field("key_size")?);
                let value = field("value")?.max(field("value_size")?);
                let (ty, max) = (field("type")?, field("max_entries")?);
                Ok((name, ty, key, value, max))
            })
            .collect()
    }

    fn name(&self, off: u32) -> Option<String> {
        let s = self.strings.get(off as usize..)?;
        let end = s.iter().position(|&c| c == 0)?;
        Some(String::from_utf8_lossy(&s[..end]).into_owned())
    }

    /// For each name, the id of the kernel function of that name and its argument count
    /// (one pass over the types for all of them).
    pub fn funcs(&self, names: &[&str]) -> Vec<Option<(u32, usize)>> {
        let mut out = vec![None; names.len()];
        for id in 1..=self.starts.len() as u32 {
            let Some(h) = self.head(id).filter(|h| h.kind == KIND_FUNC) else {
                continue;
            };
            if let Some(i) = names.iter().position(|n| self.name_is(h.name, n)) {
                let nargs = self
                    .head(h.type_or_size)
                    .filter(|p| p.kind == KIND_FUNC_PROTO)
                    .map(|p| p.vlen);
                out[i] = nargs.map(|n| (id, n));
            }
        }
        out
    }
}

/// The running kernel's BTF: mapped when the kernel allows it (no copy of its ~5 MB),
/// else read.
pub enum Vmlinux {
    /// A read-only shared mapping.
    Mapped(*const u8, usize),
    /// Read into memory.
    Read(Vec<u8>),
}

impl Vmlinux {
    /// Maps or reads [`VMLINUX`].
    pub fn open() -> std::io::Result<Vmlinux> {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::open(VMLINUX)?;
        let len = usize::try_from(f.metadata()?.len()).unwrap_or(0);
        if len > 0 {
            // SAFETY: a private read-only mapping of a file we opened, unmapped in Drop.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE,
                    f.as_raw_fd(),
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                return Ok(Vmlinux::Mapped(p.cast(), len));
            }
        }
        std::fs::read(VMLINUX).map(Vmlinux::Read)
    }

    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            // SAFETY: the mapping is `len` readable bytes and lives as long as self.
            Vmlinux::Mapped(p, len) => unsafe { std::slice::from_raw_parts(*p, *len) },
            Vmlinux::Read(v) => v,
        }
    }
}

impl Drop for Vmlinux {
    fn drop(&mut self) {
        if let Vmlinux::Mapped(p, len) = self {
            // SAFETY: unmapping the mapping `open` made.
            unsafe { libc::munmap(p.cast_mut().cast(), *len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny BTF: `struct inner { int pad; int x; }`, `struct outer { long a;
    /// union { struct inner *p; long q; }; struct inner in; }` (anonymous union).
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0inner\0pad\0x\0outer\0a\0p\0q\0in\0long\0".to_vec();
        let s = |name: &str| {
            let pat = [&[0u8][..], name.as_bytes(), &[0u8][..]].concat();
            (strings.windows(pat.len()).position(|w| w == pat).unwrap() + 1) as u32
        };
        let mut t = Vec::new();
        let ty = |t: &mut Vec<u8>, name: u32, kind: u32, vlen: u32, x: u32| {
            for v in [name, (kind << 24) | vlen, x] {
                t.extend_from_slice(&v.to_le_bytes());
            }
        };
        let mem = |t: &mut Vec<u8>, name: u32, ty: u32, bits: u32| {
            for v in [name, ty, bits] {
                t.extend_from_slice(&v.to_le_bytes());
            }
        };
        ty(&mut t, s("int"), KIND_INT, 0, 4); // 1
        t.extend_from_slice(&32u32.to_le_bytes());
        ty(&mut t, s("inner"), KIND_STRUCT, 2, 8); // 2
        mem(&mut t, s("pad"), 1, 0);
        mem(&mut t, s("x"), 1, 32);
        ty(&mut t, 0, 2, 0, 2); // 3: struct inner *
        ty(&mut t, s("long"), KIND_INT, 0, 8); // 4
        t.extend_from_slice(&64u32.to_le_bytes());
        ty(&mut t, 0, KIND_UNION, 2, 8); // 5
        mem(&mut t, s("p"), 3, 0);
        mem(&mut t, s("q"), 4, 0);
        ty(&mut t, s("outer"), KIND_STRUCT, 3, 24); // 6
        mem(&mut t, s("a"), 4, 0);
        mem(&mut t, 0, 5, 64);
        mem(&mut t, s("in"), 2, 128);
        let mut b = Vec::new();
        b.extend_from_slice(&BTF_MAGIC.to_le_bytes());
        b.extend_from_slice(&[1, 0]);
        for v in [
            24u32,
            0,
            t.len() as u32,
            t.len() as u32,
            strings.len() as u32,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&t);
        b.extend_from_slice(&strings);
        b
    }

    #[test]
    fn finds_nested_and_anonymous_members() {
        let b = blob();
        let btf = Btf::parse(&b).unwrap();
        assert_eq!(btf.offset("outer", &["a"]), Ok(0));
        assert_eq!(btf.offset("outer", &["p"]), Ok(8));
        assert_eq!(btf.offset("outer", &["in", "x"]), Ok(20));
        assert!(btf.offset("outer", &["nope"]).is_err());
        assert!(btf.offset("missing", &["a"]).is_err());
        assert!(Btf::parse(&b[..10]).is_err());
    }

    #[test]
    fn reads_the_running_kernel() {
        let Ok(b) = Vmlinux::open() else {
            return; // no BTF on this machine: nothing to check
        };
        let btf = Btf::parse(b.bytes()).unwrap();
        // A field that is not at the start of its struct on any kernel.
        assert!(btf.offset("sk_buff", &["sk"]).unwrap() > 0);
        let f = btf.funcs(&["tcp_sendmsg", "no_such_function_here"]);
        assert_eq!(f[0].map(|(_, n)| n), Some(3), "tcp_sendmsg(sk, msg, size)");
        assert_eq!(f[1], None);
        // Mapped or read, the same bytes.
        assert_eq!(std::fs::read(VMLINUX).unwrap(), b.bytes());
    }
}
