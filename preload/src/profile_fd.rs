//! Store: how the preload reaches its profile file's descriptor. It keeps none open. The
//! file is mapped once and needs a descriptor only to get disk blocks as it fills, a chunk
//! at a time, so each such use opens it by its path, checks that it is still the profile
//! (the same device and inode: the user may have replaced it), and closes it again.
//!
//! A descriptor held for the whole run took the lowest free number, which belongs to the
//! program: a program started with stdin closed (`posix_spawn` with a close action, a
//! daemon) found the profile as its fd 0, and one that lists its descriptors (a test of
//! `pass_fds`, a daemon closing what it inherited) found one it never opened. The program
//! could also close that number (`close_range(3, ~0)`) and open a file of its own under it,
//! which blocks meant for the profile would then have lengthened.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::profile_file::{file_path, Identity};

pub struct ProfileDescriptor {
    device: AtomicU64,
    inode: AtomicU64,
    /// The output folder, and the process and start time the file is named after.
    dir: Vec<u8>,
    pid: AtomicU32,
    start_ns: AtomicU64,
}

/// The device and inode of what `fd` is open on, if it is open.
fn file_identity(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: stat is plain data; fstat fills it or fails (EBADF for a closed number).
    let mut stat: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: valid out-pointer.
    (unsafe { libc::fstat(fd, &mut stat) } == 0).then_some((stat.st_dev, stat.st_ino))
}

impl ProfileDescriptor {
    /// Follows the profile file of `identity` just created in `dir` and open as `fd`
    /// (which the caller closes once it has mapped the file).
    pub fn new(fd: i32, dir: &[u8], identity: &Identity) -> ProfileDescriptor {
        let (device, inode) = file_identity(fd).unwrap_or((0, 0));
        ProfileDescriptor {
            device: AtomicU64::new(device),
            inode: AtomicU64::new(inode),
            dir: dir.to_vec(),
            pid: AtomicU32::new(identity.pid),
            start_ns: AtomicU64::new(identity.start_monotonic_ns),
        }
    }

    /// Whether `fd` is open on the profile file.
    fn is_profile(&self, fd: i32) -> bool {
        file_identity(fd).is_some_and(|(device, inode)| {
            device == self.device.load(Ordering::Relaxed)
                && inode == self.inode.load(Ordering::Relaxed)
        })
    }

    /// Runs `use_fd` with a descriptor open on the profile file, and closes it. `None` if
    /// the file cannot be opened or is no longer the profile (the errno is then left set).
    pub fn with_open<R>(&self, use_fd: impl FnOnce(i32) -> R) -> Option<R> {
        let path = file_path(
            &self.dir,
            self.pid.load(Ordering::Relaxed),
            self.start_ns.load(Ordering::Relaxed),
        );
        // SAFETY: NUL-terminated path; the descriptor is closed below.
        let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        let used = if self.is_profile(fd) {
            Some(use_fd(fd))
        } else {
            None
        };
        // close may set errno: the caller reads the one `use_fd` or the check left.
        // SAFETY: this thread's errno slot, read and written back around closing the
        // descriptor opened above, which nothing else uses.
        unsafe {
            let errno = *libc::__errno_location();
            libc::close(fd);
            *libc::__errno_location() = if used.is_none() { libc::ENOENT } else { errno };
        }
        used
    }

    /// Fork (child): follows the child's own file, of `identity`, just created and open as
    /// `fd`, in place of the parent's.
    pub fn adopt(&self, fd: i32, identity: &Identity) {
        let (device, inode) = file_identity(fd).unwrap_or((0, 0));
        self.device.store(device, Ordering::Relaxed);
        self.inode.store(inode, Ordering::Relaxed);
        self.pid.store(identity.pid, Ordering::Relaxed);
        self.start_ns
            .store(identity.start_monotonic_ns, Ordering::Relaxed);
    }
}
