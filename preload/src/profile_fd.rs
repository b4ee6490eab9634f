//! Store: the descriptor of the process's profile file, which the preload keeps open to
//! back the file with disk blocks as it fills. The program may close it (`close_range(3,
//! ~0)`, as daemons and test runners do) and may then get the same number for a file of
//! its own: using the number blindly would stop tracking with a false "disk full", or
//! worse, allocate blocks in the program's file and so lengthen it. So the descriptor is
//! checked to still be the profile (same device and inode) before each use, and the file is
//! opened again by its path when it is not.

use core::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use crate::profile_file::file_path;

pub struct ProfileDescriptor {
    fd: AtomicI32,
    device: AtomicU64,
    inode: AtomicU64,
    /// The output folder, to find the file again.
    dir: Vec<u8>,
}

/// The device and inode of what `fd` is open on, if it is open.
fn file_identity(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: stat is plain data; fstat fills it or fails (EBADF for a closed number).
    let mut stat: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: valid out-pointer.
    (unsafe { libc::fstat(fd, &mut stat) } == 0).then_some((stat.st_dev, stat.st_ino))
}

impl ProfileDescriptor {
    /// Follows `fd`, the profile file just created in `dir`.
    pub fn new(fd: i32, dir: &[u8]) -> ProfileDescriptor {
        let (device, inode) = file_identity(fd).unwrap_or((0, 0));
        ProfileDescriptor {
            fd: AtomicI32::new(fd),
            device: AtomicU64::new(device),
            inode: AtomicU64::new(inode),
            dir: dir.to_vec(),
        }
    }

    /// Whether `fd` is open on the profile file.
    pub fn is_profile(&self, fd: i32) -> bool {
        file_identity(fd).is_some_and(|(device, inode)| {
            device == self.device.load(Ordering::Relaxed)
                && inode == self.inode.load(Ordering::Relaxed)
        })
    }

    /// A descriptor open on the profile file of process `pid` started at `start_ns`: the
    /// one kept, or, if the program closed it, the file opened again. `None` if it cannot
    /// be opened (the errno is left set).
    pub fn get(&self, pid: u32, start_ns: u64) -> Option<i32> {
        let kept = self.fd.load(Ordering::Acquire);
        if self.is_profile(kept) {
            return Some(kept);
        }
        let path = file_path(&self.dir, pid, start_ns);
        // SAFETY: NUL-terminated path; the file exists unless the user removed it.
        let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        if !self.is_profile(fd) {
            // Another file now has the name: the profile is gone.
            let errno = libc::ENOENT;
            // SAFETY: closes the descriptor opened above.
            unsafe { libc::close(fd) };
            // SAFETY: this thread's errno slot.
            unsafe { *libc::__errno_location() = errno };
            return None;
        }
        match self
            .fd
            .compare_exchange(kept, fd, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Some(fd),
            Err(newer) => {
                // Another thread opened it again first.
                // SAFETY: closes the descriptor opened above, which nothing else uses.
                unsafe { libc::close(fd) };
                Some(newer)
            }
        }
    }

    /// Fork (child): the child's own file, just created as `fd`, replaces the parent's.
    /// The parent's descriptor, inherited, is closed if it is still the parent's file (the
    /// program may have reused its number).
    pub fn adopt(&self, fd: i32) {
        let parent = self.fd.swap(fd, Ordering::AcqRel);
        if self.is_profile(parent) {
            // SAFETY: the parent's profile file, inherited by fork; the child no longer uses it.
            unsafe { libc::close(parent) };
        }
        let (device, inode) = file_identity(fd).unwrap_or((0, 0));
        self.device.store(device, Ordering::Relaxed);
        self.inode.store(inode, Ordering::Relaxed);
    }
}
