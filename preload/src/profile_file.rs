//! Store: the process's profile file, created in the output folder and mapped `MAP_SHARED`
//! so that every update lands in the page cache and survives the process's death. Regions
//! are reserved at full size (sparse) and backed with `fallocate` a chunk (64 KiB) at a time as
//! they fill, so a full disk is met as an error here rather than as SIGBUS on a later store.
//! A fresh chunk is also written with zeros (`populate_with_zeros`), which makes its pages
//! about four times cheaper to fault in.

use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use memwarden_abi::{
    Header, Layout, ModuleRecord, StackRecord, ARGV_CAPACITY, FORMAT_VERSION, HEADER_SIZE, MAGIC,
    PROFILE_EXTENSION, RAW_DIR,
};
use portable_atomic::AtomicU128;

use crate::profile_fd::ProfileDescriptor;
use crate::thread_state::single_threaded;

/// Granularity of `fallocate` backing: small, so a small profile stays small on disk.
const CHUNK: u64 = 64 << 10;

pub struct ProfileFile {
    base: *mut u8,
    layout: Layout,
    descriptor: ProfileDescriptor,
    /// One bit per CHUNK of the file: set once the chunk is backed.
    backed: Vec<AtomicU64>,
    /// Whether a chunk not yet backed holds nothing but zeros, so that writing zeros over it
    /// changes nothing: true for a file this process created, false once a forked child
    /// has adopted a copy of its parent's data.
    fresh_chunks_empty: AtomicBool,
}

// SAFETY: the mapping is shared memory valid for the life of the process (never unmapped);
// all concurrent access to it goes through atomics or per-record locks.
unsafe impl Sync for ProfileFile {}
// SAFETY: as above; the raw pointer is only an address of process-wide memory.
unsafe impl Send for ProfileFile {}

/// What a new process image (or forked child) writes into a fresh header.
pub struct Identity {
    pub pid: u32,
    pub ppid: u32,
    pub max_depth: u32,
    pub start_realtime_ns: u64,
    pub start_monotonic_ns: u64,
}

impl Identity {
    pub fn of_this_process(max_depth: u32) -> Identity {
        // SAFETY: getpid/getppid have no preconditions.
        let (pid, ppid) = unsafe { (libc::getpid() as u32, libc::getppid() as u32) };
        Identity {
            pid,
            ppid,
            max_depth,
            start_realtime_ns: clock_ns(libc::CLOCK_REALTIME),
            start_monotonic_ns: clock_ns(libc::CLOCK_MONOTONIC),
        }
    }
}

/// Reads a clock in ns (0 if the clock cannot be read).
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; the clocks used are always available on Linux.
    if unsafe { libc::clock_gettime(clock, &mut now) } != 0 {
        return 0;
    }
    (now.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec as u64)
}

/// Creates `<dir>/raw/<pid>-<start ns>.mwp`, sized for `layout`, open read-write.
pub fn create_file(dir: &[u8], identity: &Identity, layout: &Layout) -> Result<i32, i32> {
    let mut folder = raw_dir(dir);
    folder.push(0);
    // The CLI creates raw/; a target run by hand with the variable set may not have it.
    // SAFETY: NUL-terminated path; EEXIST is the normal case and is ignored.
    unsafe { libc::mkdir(folder.as_ptr().cast(), 0o755) };
    let path = file_path(dir, identity.pid, identity.start_monotonic_ns);
    // SAFETY: NUL-terminated path; flags create a new file that no exec'd image inherits.
    let fd = unsafe {
        libc::open(
            path.as_ptr().cast(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
            0o644,
        )
    };
    if fd < 0 {
        return Err(last_errno());
    }
    // SAFETY: fd was just opened read-write.
    if unsafe { libc::ftruncate(fd, layout.file_size as libc::off_t) } != 0 {
        let errno = last_errno();
        // SAFETY: closing the fd opened above.
        unsafe { libc::close(fd) };
        return Err(errno);
    }
    Ok(fd)
}

/// Removes the profile file of `identity` (one that could not be used), so the report does
/// not take its zeros for a profile.
pub fn remove_file(dir: &[u8], identity: &Identity) {
    let path = file_path(dir, identity.pid, identity.start_monotonic_ns);
    // SAFETY: NUL-terminated path; a failure leaves the file, which the report then names.
    unsafe { libc::unlink(path.as_ptr().cast()) };
}

/// `DIR/raw`.
fn raw_dir(dir: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(dir.len() + 64);
    path.extend_from_slice(dir);
    path.push(b'/');
    path.extend_from_slice(RAW_DIR.as_bytes());
    path
}

/// `DIR/raw/PID-START.mwp` of process `pid` started at `start_ns`, NUL-terminated.
pub fn file_path(dir: &[u8], pid: u32, start_ns: u64) -> Vec<u8> {
    let mut path = raw_dir(dir);
    let name = format!("/{pid}-{start_ns}.{PROFILE_EXTENSION}");
    path.extend_from_slice(name.as_bytes());
    path.push(0);
    path
}

/// Tells the kernel not to read ahead around the pages of the profile mapping at `base`.
/// The file is sparse and written at scattered places (header, stack records, frames, code
/// records), and each first touch of a page otherwise reads ahead a large window of zeros
/// into the page cache: that was over half of a short Python process's start-up under the
/// preload (`python -c pass`: 28–33 ms with read-ahead, 16–17 ms without, 11 ms bare).
/// Advice only: if refused, the mapping works as before.
pub fn no_read_ahead(base: *mut libc::c_void, size: u64) {
    // SAFETY: `base` and `size` are a mapping this process made; MADV_RANDOM only changes
    // how its faults are served, never its contents.
    unsafe { libc::madvise(base, size as usize, libc::MADV_RANDOM) };
}

pub fn last_errno() -> i32 {
    // SAFETY: __errno_location always returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() }
}

impl ProfileFile {
    /// Maps the new file `fd` of `identity`, created in the output folder `dir`. The caller
    /// closes `fd` (the file is opened again when it needs disk blocks).
    pub fn map(
        fd: i32,
        layout: Layout,
        dir: &[u8],
        identity: &Identity,
    ) -> Result<ProfileFile, i32> {
        // SAFETY: a fresh shared mapping of the whole (sparse) file; the kernel picks the
        // address. It is never unmapped.
        let base = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                layout.file_size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(last_errno());
        }
        no_read_ahead(base, layout.file_size);
        let chunks = layout.file_size.div_ceil(CHUNK).div_ceil(64) as usize;
        let file = ProfileFile {
            base: base.cast(),
            layout,
            descriptor: ProfileDescriptor::new(fd, dir, identity),
            backed: (0..chunks).map(|_| AtomicU64::new(0)).collect(),
            fresh_chunks_empty: AtomicBool::new(true),
        };
        if !file.back(0, HEADER_SIZE) {
            return Err(libc::ENOSPC);
        }
        Ok(file)
    }

    /// Fills a fresh header: magic, version, identity, layout and the command line.
    pub fn write_header(&self, identity: &Identity) -> bool {
        let header = self.header();
        // SAFETY: the header page is mapped, backed, and not yet seen by any other thread.
        unsafe {
            core::ptr::write_bytes(header.cast::<u8>(), 0, core::mem::size_of::<Header>());
            (*header).magic = MAGIC;
            (*header).version = FORMAT_VERSION;
            (*header).header_size = core::mem::size_of::<Header>() as u32;
            (*header).layout = self.layout;
            self.write_identity(identity);
            let argv = &mut (*header).argv;
            let (length, truncated) = read_command_line(argv);
            (*header).argv_len = length as u32;
            if truncated {
                (*header).flags |= memwarden_abi::flags::ARGV_TRUNCATED;
            }
        }
        true
    }

    /// Writes pid, parent, depth and start times.
    ///
    /// # Safety
    /// No other thread may be reading or writing these header fields.
    pub unsafe fn write_identity(&self, identity: &Identity) {
        let header = self.header();
        // SAFETY: the caller guarantees exclusive access; the header is mapped.
        unsafe {
            (*header).pid = identity.pid;
            (*header).ppid = identity.ppid;
            (*header).max_depth = identity.max_depth;
            (*header).start_realtime_ns = identity.start_realtime_ns;
            (*header).start_monotonic_ns = identity.start_monotonic_ns;
        }
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn base(&self) -> *mut u8 {
        self.base
    }

    /// Switches to a new file of `identity`, open as `fd` and mapped at the same address
    /// (forked child), all chunks unbacked.
    pub fn adopt(&self, fd: i32, identity: &Identity) {
        self.fresh_chunks_empty.store(false, Ordering::Relaxed);
        self.descriptor.adopt(fd, identity);
        for word in &self.backed {
            word.store(0, Ordering::Relaxed);
        }
    }

    pub fn header(&self) -> *mut Header {
        self.base.cast()
    }

    fn header_field<T>(&self, offset: usize) -> *mut T {
        // SAFETY: offsets come from offset_of! on Header, inside the mapped header page.
        unsafe { self.base.add(offset).cast() }
    }

    /// The `[live, peak]` pair as one 128-bit atomic (low half = live).
    pub fn heap(&self) -> &AtomicU128 {
        let word = self.header_field::<u128>(core::mem::offset_of!(Header, heap));
        // SAFETY: the field is 16-byte aligned (asserted in the abi crate), mapped for the
        // life of the process, and only ever accessed atomically while the process runs.
        unsafe { AtomicU128::from_ptr(word) }
    }

    pub fn counter(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: `offset` is a u64 header field (offset_of! at every call site), 8-byte
        // aligned, mapped for the life of the process, accessed atomically while it runs.
        unsafe { AtomicU64::from_ptr(self.header_field(offset)) }
    }

    pub fn word32(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: as `counter`, for a u32 header field.
        unsafe { AtomicU32::from_ptr(self.header_field(offset)) }
    }

    pub fn stack(&self, id: u64) -> *mut StackRecord {
        debug_assert!(id < self.layout.stack_capacity);
        // SAFETY: callers pass ids below stack_capacity, so the record is inside the mapping.
        unsafe { self.base.add(self.layout.stack_offset(id) as usize).cast() }
    }

    pub fn module(&self, index: u64) -> *mut ModuleRecord {
        debug_assert!(index < self.layout.module_capacity);
        // SAFETY: callers pass indexes below module_capacity.
        unsafe {
            self.base
                .add(self.layout.module_offset(index) as usize)
                .cast()
        }
    }

    pub fn failure(&self, index: u64) -> *mut memwarden_abi::FailureRecord {
        debug_assert!(index < self.layout.failure_capacity);
        // SAFETY: callers pass indexes below failure_capacity.
        unsafe {
            self.base
                .add(self.layout.failure_offset(index) as usize)
                .cast()
        }
    }

    pub fn error_record(&self, index: u64) -> *mut memwarden_abi::ErrorRecord {
        debug_assert!(index < self.layout.error_capacity);
        // SAFETY: callers pass indexes below error_capacity.
        unsafe {
            self.base
                .add(self.layout.error_offset(index) as usize)
                .cast()
        }
    }

    pub fn leak_record(&self, index: u64) -> *mut memwarden_abi::LeakRecord {
        debug_assert!(index < self.layout.leak_capacity);
        // SAFETY: callers pass indexes below leak_capacity.
        unsafe {
            self.base
                .add(self.layout.leak_offset(index) as usize)
                .cast()
        }
    }

    pub fn frame_words(&self, start: u64) -> *mut u64 {
        debug_assert!(start < self.layout.frame_capacity);
        // SAFETY: callers pass word indexes below frame_capacity.
        unsafe {
            self.base
                .add(self.layout.frame_offset(start) as usize)
                .cast()
        }
    }

    /// Makes sure the file has disk blocks for `[offset, offset + len)`. False if the disk
    /// is full; true as well where the file system cannot preallocate (sparse it stays).
    pub fn back(&self, offset: u64, len: u64) -> bool {
        self.back_chunks(offset, len, || {
            self.fresh_chunks_empty.load(Ordering::Relaxed) && single_threaded()
        })
    }

    /// [`Self::back`], writing zeros over each chunk it backs if `populate` says so (asked
    /// only when a chunk is backed, not on the usual call that finds them all backed).
    fn back_chunks(&self, offset: u64, len: u64, populate: impl Fn() -> bool) -> bool {
        if len == 0 {
            return true;
        }
        let first = offset / CHUNK;
        let last = (offset + len - 1) / CHUNK;
        let backed = |chunk: u64| {
            let word = &self.backed[(chunk / 64) as usize];
            (word, 1u64 << (chunk % 64))
        };
        let all_backed = (first..=last).all(|chunk| {
            let (word, bit) = backed(chunk);
            word.load(Ordering::Relaxed) & bit != 0
        });
        if all_backed {
            return true;
        }
        let back_each = |fd: i32| {
            for chunk in first..=last {
                let (word, bit) = backed(chunk);
                if word.load(Ordering::Relaxed) & bit != 0 {
                    continue;
                }
                let start = chunk * CHUNK;
                let size = CHUNK.min(self.layout.file_size - start);
                // SAFETY: fd is open on this process's profile file (checked by `with_open`);
                // the range lies inside its size.
                let status =
                    unsafe { libc::fallocate(fd, 0, start as libc::off_t, size as libc::off_t) };
                if status != 0 {
                    let errno = last_errno();
                    if errno != libc::EOPNOTSUPP && errno != libc::EINTR {
                        return false;
                    }
                }
                if populate() {
                    populate_with_zeros(fd, start, size);
                }
                word.fetch_or(bit, Ordering::Relaxed);
            }
            true
        };
        self.descriptor.with_open(back_each).unwrap_or(false)
    }
}

/// Zeros written with `pwrite` over `[start, start + size)` of the profile file `fd`, a chunk
/// nothing has been written into yet: an optimization only, so a failure is ignored.
///
/// Why: the first store to a page of a shared file mapping costs a page fault through the
/// file system's `page_mkwrite` (on ext4, a journal handle per page): about 5 µs a page on
/// the benchmark machine. A page the write path has already put in the page cache, dirty,
/// faults in at about 1.3 µs, the write included. An imports-heavy Python program fills
/// thousands of pages of stacks and frames.
///
/// Only while the process has one thread: then nothing can close the descriptor between
/// its opening (`ProfileDescriptor::with_open`) and this write and open a file of the
/// program's under the same number, which would receive the zeros.
fn populate_with_zeros(fd: i32, start: u64, size: u64) {
    static ZEROS: [u8; CHUNK as usize] = [0; CHUNK as usize];
    let mut done = 0u64;
    while done < size {
        let len = (size - done).min(CHUNK) as usize;
        // SAFETY: writes from a static buffer of at least `len` bytes into the profile file,
        // at a range inside its size; `fd` is open on it (checked by the caller, and no
        // other thread exists to close it meanwhile).
        let written = unsafe {
            libc::pwrite(
                fd,
                ZEROS.as_ptr().cast(),
                len,
                (start + done) as libc::off_t,
            )
        };
        if written <= 0 {
            return;
        }
        done += written as u64;
    }
}

/// Copies /proc/self/cmdline into `argv`; returns the length used and whether it was cut.
fn read_command_line(argv: &mut [u8; ARGV_CAPACITY]) -> (usize, bool) {
    // SAFETY: NUL-terminated path; read-only open closed below.
    let fd = unsafe {
        libc::open(
            c"/proc/self/cmdline".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return (0, false);
    }
    let mut used = 0usize;
    while used < argv.len() {
        // SAFETY: reads into the unused tail of `argv`.
        let got = unsafe { libc::read(fd, argv[used..].as_mut_ptr().cast(), argv.len() - used) };
        if got <= 0 {
            break;
        }
        used += got as usize;
    }
    let mut probe = 0u8;
    // SAFETY: reads one byte into a local to learn whether the command line went on.
    let more =
        used == argv.len() && unsafe { libc::read(fd, (&mut probe as *mut u8).cast(), 1) } > 0;
    // SAFETY: closes the fd opened above.
    unsafe { libc::close(fd) };
    // The kernel ends each argument with NUL; drop the last one.
    if used > 0 && argv[used - 1] == 0 {
        used -= 1;
    }
    (used, more)
}

/// For unit tests: a profile file in a folder of its own, removed with it.
#[cfg(test)]
pub struct ScratchProfile {
    pub file: ProfileFile,
    pub identity: Identity,
    dir: std::path::PathBuf,
}

#[cfg(test)]
impl ScratchProfile {
    /// The profile file's path.
    pub fn path(&self) -> std::path::PathBuf {
        let mut files = std::fs::read_dir(self.dir.join(RAW_DIR)).unwrap();
        files.next().unwrap().unwrap().path()
    }
}

#[cfg(test)]
impl Drop for ScratchProfile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// For unit tests: a profile of `stacks` records in a fresh folder named after `tag`, its
/// header written. The folder stays while the profile is used: backing the file opens it
/// by its path.
#[cfg(test)]
pub fn scratch_profile(tag: &str, stacks: u64) -> ScratchProfile {
    let dir = std::env::temp_dir().join(format!("memwarden-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let layout = Layout::new(16, stacks, 4096, 16, 16, 16, 4096).unwrap();
    let identity = Identity::of_this_process(8);
    let dir_bytes = dir.as_os_str().as_encoded_bytes();
    let fd = create_file(dir_bytes, &identity, &layout).unwrap();
    let file = ProfileFile::map(fd, layout, dir_bytes, &identity).unwrap();
    file.write_header(&identity);
    ScratchProfile {
        file,
        identity,
        dir,
    }
}

#[cfg(test)]
#[path = "profile_file_tests.rs"]
mod tests;
