//! Interposed call → stack: which pages above a stack pointer can be read, asked of the
//! kernel, so that a walk's bounds (`thread_state::Guard::stack_top`) never span a gap or
//! a guard page. A thread may run on a stack mapped apart from its own (a coroutine's, a
//! fiber's): the words between it and the thread's own stack top are then no stack at all.
//!
//! The kernel is asked with `process_vm_readv` on this very process: one byte from the
//! start of each page, one page per remote `iovec`. It copies the elements in order and
//! stops at the first it cannot read, saying how many bytes it copied, so the count is the
//! number of readable pages before the first that is not (unmapped, `PROT_NONE`, or past
//! the end of a file). It never faults and never grows a mapping; permissions are per
//! page, so one byte stands for its page.

use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, Ordering};

use crate::real::SavedErrno;

/// The page size of x86_64 Linux: mappings and their permissions are page-granular.
pub const PAGE: u64 = 4096;
/// Pages asked about per system call. Kept small: the `iovec`s live on the stack of the
/// capture that asks (on the preload's own stack, but a thread without a slice shares an
/// emergency one).
const PAGES_PER_CALL: usize = 16;

/// Set once the kernel refused the question itself (a seccomp filter, say): not asked
/// again in this process.
static CANNOT_ASK: AtomicBool = AtomicBool::new(false);

/// What the kernel said of a span of pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Span {
    /// Every page of it can be read.
    Readable,
    /// The page at this address is the first that cannot be read.
    StopsAt(u64),
    /// The kernel cannot be asked (the call is refused or missing).
    Unknown,
}

/// Whether every page that holds a byte of `[from, to)` can be read, or the first that
/// cannot. `from` is rounded down to its page. errno is left as it was.
pub fn readable_pages(from: u64, to: u64) -> Span {
    if CANNOT_ASK.load(Ordering::Relaxed) {
        return Span::Unknown;
    }
    let errno = SavedErrno::save();
    let span = ask(from & !(PAGE - 1), to);
    errno.restore();
    span
}

fn ask(mut page: u64, to: u64) -> Span {
    let mut bytes = [0u8; PAGES_PER_CALL];
    let mut remote = [libc::iovec {
        iov_base: core::ptr::null_mut(),
        iov_len: 0,
    }; PAGES_PER_CALL];
    // SAFETY: getpid has no preconditions (asked each time: a forked child has another).
    let pid = unsafe { libc::getpid() };
    while page < to {
        let count = (to - page).div_ceil(PAGE).min(PAGES_PER_CALL as u64) as usize;
        for (i, element) in remote[..count].iter_mut().enumerate() {
            element.iov_base = (page + i as u64 * PAGE) as *mut c_void;
            element.iov_len = 1;
        }
        let local = libc::iovec {
            iov_base: bytes.as_mut_ptr().cast(),
            iov_len: count,
        };
        // SAFETY: `local` is `count` writable bytes of this frame; `remote` holds `count`
        // elements. The kernel reads the remote addresses itself and reports a fault as
        // an error or a short count, never as a signal.
        let read = unsafe {
            libc::syscall(
                libc::SYS_process_vm_readv,
                pid,
                &raw const local,
                1usize,
                remote.as_ptr(),
                count,
                0usize,
            )
        };
        if read < 0 {
            // SAFETY: __errno_location always returns the calling thread's errno slot.
            let error = unsafe { *libc::__errno_location() };
            if error == libc::EFAULT {
                return Span::StopsAt(page);
            }
            CANNOT_ASK.store(true, Ordering::Relaxed);
            return Span::Unknown;
        }
        let pages = read as u64;
        if pages < count as u64 {
            return Span::StopsAt(page + pages * PAGE);
        }
        page += pages * PAGE;
    }
    Span::Readable
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pages` fresh pages, readable and writable.
    fn mapped(pages: u64) -> u64 {
        // SAFETY: a fresh anonymous mapping; no existing memory is touched.
        let start = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                (pages * PAGE) as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(start, libc::MAP_FAILED);
        start as u64
    }

    #[test]
    fn a_readable_mapping_is_readable_from_inside_its_first_page() {
        let start = mapped(40);
        assert_eq!(
            readable_pages(start + 100, start + 40 * PAGE),
            Span::Readable
        );
        assert_eq!(readable_pages(start, start + 1), Span::Readable);
        assert_eq!(readable_pages(start, start), Span::Readable);
    }

    #[test]
    fn a_guard_page_stops_the_span_where_it_starts() {
        let start = mapped(40);
        let guard = start + 33 * PAGE;
        // SAFETY: a page of the mapping made above, used by nothing else.
        let protected = unsafe { libc::mprotect(guard as *mut c_void, PAGE as usize, 0) };
        assert_eq!(protected, 0);
        assert_eq!(
            readable_pages(start + 8, start + 40 * PAGE),
            Span::StopsAt(guard)
        );
        // In the first call's batch, and as the first page of a call.
        assert_eq!(
            readable_pages(guard - 2 * PAGE, start + 40 * PAGE),
            Span::StopsAt(guard)
        );
        assert_eq!(readable_pages(guard, guard + 1), Span::StopsAt(guard));
        assert_eq!(readable_pages(start, guard), Span::Readable);
    }

    #[test]
    fn an_unmapped_gap_stops_the_span_and_errno_is_kept() {
        let start = mapped(20);
        let gap = start + 17 * PAGE;
        // SAFETY: pages of the mapping made above, used by nothing else.
        let unmapped = unsafe { libc::munmap(gap as *mut c_void, PAGE as usize) };
        assert_eq!(unmapped, 0);
        // SAFETY: the calling thread's errno slot.
        unsafe { *libc::__errno_location() = libc::EINTR };
        assert_eq!(readable_pages(start, start + 20 * PAGE), Span::StopsAt(gap));
        // SAFETY: as above.
        assert_eq!(unsafe { *libc::__errno_location() }, libc::EINTR);
    }
}
