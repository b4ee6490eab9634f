//! Analysis at exit (leak check): the process's memory map, read from `/proc/self/maps`
//! into scratch memory with raw system calls (no allocation: other threads are stopped and
//! may hold glibc's locks), parsed into [`Vma`] records in address order.

use crate::own_regions::ScratchArray;

/// Bits of [`Vma::flags`].
pub mod vma {
    pub const READ: u32 = 1;
    pub const WRITE: u32 = 2;
    pub const SHARED: u32 = 4;
    /// No file behind it (anonymous, or a named anonymous mapping).
    pub const ANONYMOUS: u32 = 8;
    /// `[heap]`: glibc's main arena (brk).
    pub const HEAP: u32 = 16;
    /// `[stack]`: the main thread's stack.
    pub const STACK: u32 = 32;
    /// `[vvar]`, `[vdso]`, `[vsyscall]` and other kernel mappings.
    pub const KERNEL: u32 = 64;
}

/// One mapping.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    pub flags: u32,
}

impl Vma {
    pub fn has(&self, flag: u32) -> bool {
        self.flags & flag != 0
    }

    /// Readable and writable, not shared: memory the program keeps its data in.
    pub fn is_private_data(&self) -> bool {
        self.has(vma::READ)
            && self.has(vma::WRITE)
            && !self.has(vma::SHARED)
            && !self.has(vma::KERNEL)
    }
}

/// Most mappings read (more are left out, and the check says so).
pub const MAX_VMAS: usize = 1 << 18;
const TEXT_BYTES: usize = 64 << 20;

/// The mappings, in address order.
pub struct Maps {
    vmas: ScratchArray<Vma>,
    /// Kept mapped while the maps are in use: it is listed in them.
    _text: ScratchArray<u8>,
    count: usize,
    pub truncated: bool,
}

impl Maps {
    pub fn as_slice(&self) -> &[Vma] {
        &self.vmas.as_slice()[..self.count]
    }

    /// The mapping that contains `address`.
    pub fn containing(&self, address: u64) -> Option<&Vma> {
        let vmas = self.as_slice();
        let after = vmas.partition_point(|v| v.start <= address);
        let vma = vmas.get(after.checked_sub(1)?)?;
        (address < vma.end).then_some(vma)
    }
}

/// Reads `/proc/self/maps`; `None` if it cannot be read or scratch memory is refused.
pub fn read_maps() -> Option<Maps> {
    let mut text = ScratchArray::<u8>::new(TEXT_BYTES)?;
    let used = read_file(c"/proc/self/maps", text.as_mut_slice())?;
    let mut vmas = ScratchArray::<Vma>::new(MAX_VMAS)?;
    let (count, truncated) = parse(&text.as_slice()[..used], vmas.as_mut_slice());
    Some(Maps {
        vmas,
        _text: text,
        count,
        truncated: truncated || used == TEXT_BYTES,
    })
}

/// Reads the file at `path` into `into`, as much as fits; the bytes read, `None` if it cannot
/// be opened. No allocation: usable at start-up and from the leak check alike.
pub(crate) fn read_file(path: &core::ffi::CStr, into: &mut [u8]) -> Option<usize> {
    // SAFETY: NUL-terminated path; read-only open, closed below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let mut used = 0;
    while used < into.len() {
        // SAFETY: reads into the unused tail of `into`.
        let got = unsafe { libc::read(fd, into[used..].as_mut_ptr().cast(), into.len() - used) };
        if got < 0 && crate::profile_file::last_errno() == libc::EINTR {
            continue;
        }
        if got <= 0 {
            break;
        }
        used += got as usize;
    }
    // SAFETY: closes the fd opened above.
    unsafe { libc::close(fd) };
    Some(used)
}

/// Parses maps text into `into`; returns the count and whether some lines did not fit.
pub fn parse(text: &[u8], into: &mut [Vma]) -> (usize, bool) {
    let mut count = 0;
    for line in text.split(|&b| b == b'\n') {
        let Some(vma) = parse_line(line) else {
            continue;
        };
        if count == into.len() {
            return (count, true);
        }
        into[count] = vma;
        count += 1;
    }
    (count, false)
}

fn parse_line(line: &[u8]) -> Option<Vma> {
    let mut fields = line.split(|&b| b == b' ').filter(|f| !f.is_empty());
    let range = fields.next()?;
    let perms = fields.next()?;
    let _offset = fields.next()?;
    let _device = fields.next()?;
    let inode = fields.next()?;
    // The path is the rest of the line (it may hold spaces); only its start matters here.
    let path = fields.next().unwrap_or(b"");
    let dash = range.iter().position(|&b| b == b'-')?;
    let start = hex(&range[..dash])?;
    let end = hex(&range[dash + 1..])?;
    let mut flags = 0;
    if perms.first() == Some(&b'r') {
        flags |= vma::READ;
    }
    if perms.get(1) == Some(&b'w') {
        flags |= vma::WRITE;
    }
    if perms.get(3) == Some(&b's') {
        flags |= vma::SHARED;
    }
    if inode == b"0" {
        flags |= match path {
            b"[heap]" => vma::HEAP | vma::ANONYMOUS,
            b"[stack]" => vma::STACK | vma::ANONYMOUS,
            b"" => vma::ANONYMOUS,
            p if p.starts_with(b"[anon") => vma::ANONYMOUS,
            p if p.starts_with(b"[") => vma::KERNEL,
            _ => 0,
        };
    }
    Some(Vma { start, end, flags })
}

fn hex(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    digits.iter().try_fold(0u64, |value, &d| {
        let digit = (d as char).to_digit(16)?;
        Some(value << 4 | u64::from(digit))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_into_flags() {
        let text =
            b"55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]\n\
7f00aa000000-7f00aa021000 rw-p 00000000 00:00 0 \n\
7f00aa021000-7f00ae000000 ---p 00000000 00:00 0 \n\
7f00b0000000-7f00b0001000 rw-p 0001d000 08:01 1234   /usr/lib/x86_64-linux-gnu/libc.so.6\n\
7f00b0100000-7f00b0101000 rw-s 00000000 08:01 99 /tmp/out/raw/1-2.mwp\n\
7ffd0000000-7ffd0021000 rw-p 00000000 00:00 0                          [stack]\n\
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]\n";
        let mut vmas = [Vma::default(); 16];
        let (count, truncated) = parse(text, &mut vmas);
        assert_eq!((count, truncated), (7, false));
        assert_eq!(vmas[0].start, 0x55d0c0a00000);
        assert!(vmas[0].has(vma::HEAP) && vmas[0].is_private_data());
        assert!(vmas[1].has(vma::ANONYMOUS) && !vmas[1].has(vma::HEAP));
        assert!(!vmas[2].has(vma::READ));
        assert!(!vmas[3].has(vma::ANONYMOUS) && vmas[3].is_private_data());
        assert!(vmas[4].has(vma::SHARED) && !vmas[4].is_private_data());
        assert!(vmas[5].has(vma::STACK));
        assert!(vmas[6].has(vma::KERNEL));
    }
}
