//! Analysis at exit (leak check): the roots in private writable file mappings that are not
//! a module's segments. A program may keep pointers there: the JVM maps its class-data
//! archive (`classes.jsa`) private and writable and links the metadata in it to blocks of
//! the heap, and memcheck counts such mappings as roots. Unlike a module's segments they
//! may reach past the end of their file, where a read raises SIGBUS, so their words are
//! copied with `process_vm_readv` on this process: a page that cannot be read fails the
//! call with `EFAULT` instead of a signal, and is skipped (nothing was ever written
//! there, or the write would have faulted).

use crate::leak_classify::Marker;
use crate::own_regions::ScratchArray;

const PAGE: u64 = 4096;
/// Pages copied per call, each its own remote piece, so that a call that stops at an
/// unreadable page has copied every page before it whatever the kernel's granularity.
const PAGES_PER_COPY: usize = 16;

/// Reads words of this process's memory through the kernel.
pub struct FileRootReader {
    buffer: ScratchArray<u64>,
    pid: libc::pid_t,
    /// The kernel refused the call itself (a seccomp filter, say): no further attempt.
    refused: bool,
}

impl FileRootReader {
    /// `None` if the scratch buffer is refused.
    pub fn new() -> Option<FileRootReader> {
        Some(FileRootReader {
            buffer: ScratchArray::new(PAGES_PER_COPY * PAGE as usize / 8)?,
            // SAFETY: getpid has no preconditions.
            pid: unsafe { libc::getpid() },
            refused: false,
        })
    }

    /// True if the kernel refused the copy itself: the mappings' roots are then missing.
    pub fn refused(&self) -> bool {
        self.refused
    }

    /// Scans the readable words of `[start, end)` as a root.
    pub fn scan(&mut self, marker: &mut Marker, start: u64, end: u64) {
        let mut at = start.next_multiple_of(8);
        while at < end && !self.refused {
            match self.copy(at, end) {
                Some(bytes) if bytes > 0 => {
                    marker.scan_values(&self.buffer.as_slice()[..bytes / 8]);
                    marker.scanned_bytes += bytes as u64;
                    at += bytes as u64;
                }
                // The page at `at` cannot be read: on to the next one.
                _ => at = ((at / PAGE) + 1) * PAGE,
            }
        }
    }

    /// Copies from `at` towards `end` (at most PAGES_PER_COPY pieces, none crossing a page
    /// boundary) into the buffer; the bytes copied, or `None` if the first page cannot be
    /// read.
    fn copy(&mut self, at: u64, end: u64) -> Option<usize> {
        let mut remote = [libc::iovec {
            iov_base: core::ptr::null_mut(),
            iov_len: 0,
        }; PAGES_PER_COPY];
        let mut pieces = 0;
        let mut from = at;
        while pieces < PAGES_PER_COPY && from < end {
            let to = (((from / PAGE) + 1) * PAGE).min(end);
            remote[pieces] = libc::iovec {
                iov_base: from as *mut libc::c_void,
                iov_len: (to - from) as usize,
            };
            pieces += 1;
            from = to;
        }
        let local = libc::iovec {
            iov_base: self.buffer.as_mut_ptr().cast(),
            iov_len: (from - at) as usize,
        };
        // SAFETY: the local piece lies in the scratch buffer (PAGES_PER_COPY pages, and
        // the remote pieces total at most that); the remote pieces are only read, by the
        // kernel, which reports an unreadable page as an error rather than a signal.
        let copied = unsafe {
            libc::process_vm_readv(
                self.pid,
                &local,
                1,
                remote.as_ptr(),
                pieces as libc::c_ulong,
                0,
            )
        };
        if copied >= 0 {
            // Whole words only: the rest of a word the copy stopped in was not read.
            return Some(copied as usize / 8 * 8);
        }
        if crate::profile_file::last_errno() != libc::EFAULT {
            self.refused = true;
        }
        None
    }
}
