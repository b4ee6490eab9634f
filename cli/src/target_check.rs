//! Before the run: finds the program the command names and refuses one the preload could
//! not reach — statically linked, setuid/setgid, or with file capabilities (the loader
//! ignores LD_PRELOAD in secure mode) — following `#!` scripts to their interpreter.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use object::elf::{PT_DYNAMIC, PT_INTERP};
use object::read::elf::{ElfFile, ElfFile32, ElfFile64, FileHeader, ProgramHeader};
use object::read::ReadCache;
use object::{Endianness, FileKind};

use crate::io_reason;

/// Scripts whose interpreter is itself a script, followed at most this deep (as Linux).
const MAX_INTERPRETER_DEPTH: usize = 4;

/// Finds the executable `name` names: a path if it has a `/`, else the first executable
/// file of that name on `PATH`.
pub fn resolve(name: &OsStr) -> Result<PathBuf, String> {
    let shown = name.to_string_lossy();
    if name.as_bytes().contains(&b'/') {
        let path = PathBuf::from(name);
        check_executable(&path)?;
        return Ok(path);
    }
    let search = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&search)
        .map(|dir| {
            let dir = if dir.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                dir
            };
            dir.join(name)
        })
        .find(|candidate| check_executable(candidate).is_ok())
        .ok_or_else(|| format!("{shown}: command not found on PATH"))
}

/// A regular file this process may execute.
fn check_executable(path: &Path) -> Result<(), String> {
    let shown = path.display();
    let metadata = std::fs::metadata(path).map_err(|e| format!("{shown}: {}", io_reason(&e)))?;
    if metadata.is_dir() {
        return Err(format!("{shown}: is a folder, not a program"));
    }
    if !metadata.is_file() {
        return Err(format!("{shown}: not a regular file"));
    }
    if !may_execute(path) {
        return Err(format!("{shown}: not executable (permission denied)"));
    }
    Ok(())
}

fn may_execute(path: &Path) -> bool {
    let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c_path` is a valid NUL-terminated string that outlives the call; `access`
    // only reads it.
    unsafe { libc::access(c_path.as_ptr(), libc::X_OK) == 0 }
}

/// Refuses a program the preload cannot reach, in one line naming it and why.
pub fn check(program: &Path) -> Result<(), String> {
    check_at_depth(program, 0)
}

fn check_at_depth(program: &Path, depth: usize) -> Result<(), String> {
    let shown = program.display();
    let mut head = [0u8; 256];
    let len = File::open(program)
        .and_then(|mut f| read_up_to(&mut f, &mut head))
        .map_err(|e| format!("{shown}: cannot read: {}", io_reason(&e)))?;
    let head = &head[..len];
    if let Some(line) = head.strip_prefix(b"#!") {
        if depth >= MAX_INTERPRETER_DEPTH {
            return Err(format!("{shown}: too many levels of #! interpreters"));
        }
        let interpreter = interpreter_of(line)
            .ok_or_else(|| format!("{shown}: its #! line names no interpreter"))?;
        let interpreter = resolve(&interpreter)
            .map_err(|e| format!("{shown}: its interpreter cannot run: {e}"))?;
        return check_at_depth(&interpreter, depth + 1);
    }
    if !head.starts_with(b"\x7fELF") {
        return Err(format!("{shown}: not an ELF executable or a #! script"));
    }
    check_secure_mode(program)?;
    match linkage(program).map_err(|e| format!("{shown}: unreadable ELF file: {e}"))? {
        Linkage::Dynamic => Ok(()),
        Linkage::StaticPie if is_dynamic_loader(program) => Ok(()),
        Linkage::StaticPie => Err(format!(
            "{shown}: statically linked (static-pie, no program interpreter): LD_PRELOAD cannot reach it"
        )),
        Linkage::Static => Err(format!(
            "{shown}: statically linked: LD_PRELOAD cannot reach it; link it dynamically to profile it"
        )),
    }
}

fn read_up_to(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut len = 0;
    while len < buf.len() {
        match file.read(&mut buf[len..])? {
            0 => break,
            n => len += n,
        }
    }
    Ok(len)
}

/// The program a `#!` line runs: its interpreter, or for `/usr/bin/env [-S] NAME` the
/// program NAME (looked up on PATH like env does).
fn interpreter_of(line: &[u8]) -> Option<std::ffi::OsString> {
    let line = line.split(|&b| b == b'\n').next()?;
    let mut words = line
        .split(|b| b.is_ascii_whitespace())
        .filter(|w| !w.is_empty());
    let interpreter = words.next()?;
    let is_env = interpreter.rsplit(|&b| b == b'/').next() == Some(b"env");
    let program = if is_env {
        words.find(|w| !w.starts_with(b"-"))?
    } else {
        interpreter
    };
    Some(OsStr::from_bytes(program).to_owned())
}

/// The loader ignores LD_PRELOAD for a program that gains privileges at exec.
fn check_secure_mode(program: &Path) -> Result<(), String> {
    let shown = program.display();
    let mode = std::fs::metadata(program)
        .map_err(|e| format!("{shown}: {}", io_reason(&e)))?
        .permissions()
        .mode();
    if mode & 0o4000 != 0 {
        return Err(format!(
            "{shown}: setuid program: the loader ignores LD_PRELOAD for it (profile a copy without the setuid bit)"
        ));
    }
    // Set-group-id without group execute is mandatory locking, not a privilege.
    if mode & 0o2010 == 0o2010 {
        return Err(format!(
            "{shown}: setgid program: the loader ignores LD_PRELOAD for it (profile a copy without the setgid bit)"
        ));
    }
    if has_file_capabilities(program) && !is_root() {
        return Err(format!(
            "{shown}: has file capabilities: the loader ignores LD_PRELOAD for it (profile a copy)"
        ));
    }
    Ok(())
}

fn has_file_capabilities(program: &Path) -> bool {
    let Ok(c_path) = CString::new(program.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: both strings are valid and NUL-terminated; a null buffer with size 0 asks
    // only for the attribute's size, so nothing is written.
    let size = unsafe {
        libc::getxattr(
            c_path.as_ptr(),
            c"security.capability".as_ptr(),
            std::ptr::null_mut(),
            0,
        )
    };
    size > 0
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// How an ELF program is linked, as far as LD_PRELOAD is concerned.
#[derive(Debug, PartialEq, Eq)]
enum Linkage {
    /// It has a program interpreter (the dynamic loader), which honours LD_PRELOAD.
    Dynamic,
    /// It has a dynamic section but no interpreter: static-pie, or the loader itself.
    StaticPie,
    /// Neither: fully static.
    Static,
}

fn linkage(program: &Path) -> Result<Linkage, String> {
    let file = File::open(program).map_err(|e| e.to_string())?;
    let cache = ReadCache::new(file);
    let types: Vec<u32> = match FileKind::parse(&cache).map_err(|e| e.to_string())? {
        FileKind::Elf32 => {
            segment_types(&ElfFile32::<Endianness, _>::parse(&cache).map_err(|e| e.to_string())?)
        }
        FileKind::Elf64 => {
            segment_types(&ElfFile64::<Endianness, _>::parse(&cache).map_err(|e| e.to_string())?)
        }
        _ => return Err("not an ELF file".into()),
    };
    Ok(if types.contains(&PT_INTERP) {
        Linkage::Dynamic
    } else if types.contains(&PT_DYNAMIC) {
        Linkage::StaticPie
    } else {
        Linkage::Static
    })
}

fn segment_types<'data, Elf: FileHeader<Endian = Endianness>, R: object::ReadRef<'data>>(
    file: &ElfFile<'data, Elf, R>,
) -> Vec<u32> {
    let endian = file.endian();
    file.elf_program_headers()
        .iter()
        .map(|header| header.p_type(endian))
        .collect()
}

/// `ld-linux-x86-64.so.2` and friends run programs themselves and honour LD_PRELOAD.
fn is_dynamic_loader(program: &Path) -> bool {
    let real = program
        .canonicalize()
        .unwrap_or_else(|_| program.to_owned());
    real.file_name()
        .and_then(OsStr::to_str)
        .is_some_and(|name| name.starts_with("ld-") || name.starts_with("ld.so"))
}

#[cfg(test)]
#[path = "target_check_tests.rs"]
mod tests;
