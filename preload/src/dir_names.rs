//! The names in a folder, read with `getdents64` into a buffer on the stack: no `opendir`,
//! which allocates, for callers that must not (the leak check's list of threads while
//! others are stopped) or need not (the `wait` hooks' look for a child's profile).

use core::ffi::CStr;

/// Calls `each` with the name of every entry of folder `path` (`.` and `..` included);
/// nothing if it cannot be opened.
pub fn for_each_name(path: &CStr, mut each: impl FnMut(&[u8])) {
    // SAFETY: NUL-terminated path; a directory fd closed below.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return;
    }
    let mut buffer = [0u8; 4096];
    loop {
        // SAFETY: getdents64 into a buffer of the given size.
        let got =
            unsafe { libc::syscall(libc::SYS_getdents64, fd, buffer.as_mut_ptr(), buffer.len()) };
        if got <= 0 {
            break;
        }
        let mut at = 0usize;
        // Each record: inode (8 bytes), offset (8), record length (2), type (1), name.
        while at + 19 < got as usize {
            let record = u16::from_ne_bytes([buffer[at + 16], buffer[at + 17]]) as usize;
            if record == 0 {
                break;
            }
            let name = &buffer[at + 19..(at + record).min(got as usize)];
            each(&name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())]);
            at += record;
        }
    }
    // SAFETY: closes the fd opened above.
    unsafe { libc::close(fd) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_every_name_of_a_folder() {
        let dir = std::env::temp_dir().join(format!("memwarden-dir-names-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["a.mwp", "12-345.mwp", "notes"] {
            std::fs::write(dir.join(name), b"").unwrap();
        }
        let path = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
        let mut names = Vec::new();
        for_each_name(&path, |name| {
            names.push(String::from_utf8_lossy(name).into_owned())
        });
        names.sort();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(names, [".", "..", "12-345.mwp", "a.mwp", "notes"]);
        let mut none = 0;
        for_each_name(c"/no/such/folder", |_| none += 1);
        assert_eq!(none, 0);
    }
}
