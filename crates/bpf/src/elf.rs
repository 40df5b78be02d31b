//! The programs of a BPF ELF object as clang writes it (64-bit little-endian, one program
//! per section, map references as relocations against the map symbols).

use super::Error;

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

fn cstr(b: &[u8], off: usize) -> Option<&[u8]> {
    let s = b.get(off..)?;
    Some(&s[..s.iter().position(|&c| c == 0)?])
}

/// One section header: name offset, type, file offset, size, link, info.
#[derive(Clone, Copy)]
struct Section {
    name: u32,
    ty: u32,
    off: usize,
    size: usize,
    link: u32,
    info: u32,
}

/// A BPF ELF object.
pub struct Object<'a> {
    obj: &'a [u8],
    sections: Vec<Section>,
    names: &'a [u8],
}

fn malformed(what: &str) -> Error {
    Error::Kernel(format!("the BPF object is malformed ({what})"))
}

impl<'a> Object<'a> {
    /// Reads the section table of `obj`.
    pub fn parse(obj: &'a [u8]) -> Result<Object<'a>, Error> {
        let head = || -> Option<(usize, usize, usize)> {
            (obj.get(..4)? == b"\x7fELF").then_some(())?;
            Some((
                u64_at(obj, 0x28)? as usize,
                u16_at(obj, 0x3c)? as usize,
                u16_at(obj, 0x3e)? as usize,
            ))
        };
        let (shoff, shnum, shstr) = head().ok_or_else(|| malformed("ELF header"))?;
        let sections = (0..shnum)
            .map(|i| {
                let h = shoff + 64 * i;
                Some(Section {
                    name: u32_at(obj, h)?,
                    ty: u32_at(obj, h + 4)?,
                    off: u64_at(obj, h + 24)? as usize,
                    size: u64_at(obj, h + 32)? as usize,
                    link: u32_at(obj, h + 40)?,
                    info: u32_at(obj, h + 44)?,
                })
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| malformed("section table"))?;
        let mut o = Object {
            obj,
            sections,
            names: &[],
        };
        o.names = o.data(shstr).ok_or_else(|| malformed("section names"))?;
        Ok(o)
    }

    fn data(&self, i: usize) -> Option<&'a [u8]> {
        let s = self.sections.get(i)?;
        self.obj.get(s.off..s.off + s.size)
    }

    fn find(&self, name: &str) -> Option<usize> {
        (0..self.sections.len())
            .find(|&i| cstr(self.names, self.sections[i].name as usize) == Some(name.as_bytes()))
    }

    /// The object's own BTF (`.BTF`), when clang wrote one.
    pub fn btf(&self) -> Option<&'a [u8]> {
        self.data(self.find(".BTF")?)
    }

    /// The `license` section's text.
    pub fn license(&self) -> Result<&'a [u8], Error> {
        let i = self
            .find("license")
            .ok_or_else(|| malformed("no license"))?;
        let d = self.data(i).ok_or_else(|| malformed("license"))?;
        Ok(&d[..d.iter().position(|&c| c == 0).unwrap_or(d.len())])
    }

    /// The instructions of the program in section `section`, each map reference set to the
    /// descriptor `maps` gives for its name.
    pub fn program(&self, section: &str, maps: &[(&str, i32)]) -> Result<Vec<u8>, Error> {
        let what = |s: &str| malformed(&format!("{section}: {s}"));
        let prog = self.find(section).ok_or_else(|| what("no such section"))?;
        let mut insns = self.data(prog).ok_or_else(|| what("data"))?.to_vec();
        // Its relocations: the SHT_REL section whose info is the program.
        let Some(rel) = (0..self.sections.len())
            .find(|&i| self.sections[i].ty == 9 && self.sections[i].info as usize == prog)
        else {
            return Ok(insns);
        };
        let symtab = self.sections[rel].link as usize;
        let syms = self.data(symtab).ok_or_else(|| what("symbols"))?;
        let strtab = self
            .sections
            .get(symtab)
            .and_then(|s| self.data(s.link as usize))
            .ok_or_else(|| what("symbol names"))?;
        for r in self
            .data(rel)
            .ok_or_else(|| what("relocations"))?
            .chunks_exact(16)
        {
            let (at, sym) = (
                u64_at(r, 0).unwrap_or(0) as usize,
                (u64_at(r, 8).unwrap_or(0) >> 32) as usize,
            );
            let name = u32_at(syms, 24 * sym)
                .and_then(|n| cstr(strtab, n as usize))
                .ok_or_else(|| what("relocation symbol"))?;
            let Some((_, map_fd)) = maps.iter().find(|(n, _)| n.as_bytes() == name) else {
                let name = String::from_utf8_lossy(name);
                return Err(what(&format!("reference to {name}, not a known map")));
            };
            let regs = insns.get_mut(at + 1).ok_or_else(|| what("relocation"))?;
            *regs = (*regs & 0x0f) | (super::PSEUDO_MAP_FD << 4);
            insns
                .get_mut(at + 4..at + 8)
                .ok_or_else(|| what("relocation"))?
                .copy_from_slice(&map_fd.to_ne_bytes());
        }
        Ok(insns)
    }
}
