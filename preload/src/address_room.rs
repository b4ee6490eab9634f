//! Interposed call → store, at start-up: how much address space a limit on it
//! (`RLIMIT_AS`, a shell's `ulimit -v`) leaves the process, so that the profile's mapping
//! takes a share of that room rather than all it can get. The profile file is sparse, but
//! its mapping counts in full against the limit: mapped as large as would fit, it left the
//! program too little to start (CPython failed with `MemoryError` under `ulimit -v 100000`).

/// The profile's mapping takes at most this fraction (one part in N) of the address space
/// left when the process starts; the program keeps the rest.
pub const PROFILE_SHARE: u64 = 4;

/// The address space the process may still map under its soft `RLIMIT_AS`, in bytes; `None`
/// when there is no limit, or when what the process maps now cannot be read.
pub fn left() -> Option<u64> {
    let limit = soft_limit(libc::RLIMIT_AS);
    if limit == libc::RLIM_INFINITY {
        return None;
    }
    Some(limit.saturating_sub(mapped_bytes()?))
}

/// The process's soft limit on `resource`; `RLIM_INFINITY` when there is none or it cannot
/// be read.
pub fn soft_limit(resource: libc::__rlimit_resource_t) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: valid out-pointer; on failure the limit stays infinite.
    unsafe { libc::getrlimit(resource, &mut limit) };
    limit.rlim_cur
}

/// The process's whole address space now (`/proc/self/statm`'s first field, in pages).
fn mapped_bytes() -> Option<u64> {
    let mut text = [0u8; 128];
    let used = crate::leak_maps::read_file(c"/proc/self/statm", &mut text)?;
    let pages = first_number(&text[..used])?;
    // SAFETY: sysconf has no preconditions.
    let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages.checked_mul(u64::try_from(page_size).ok()?)
}

/// The decimal number that opens `text`, up to the first space or newline.
fn first_number(text: &[u8]) -> Option<u64> {
    let end = text
        .iter()
        .position(|&b| b == b' ' || b == b'\n')
        .unwrap_or(text.len());
    crate::config::parse_decimal(&text[..end])
}

/// The first of `shrinks` (halvings of the profile's capacities, fewest first) whose file,
/// of the size `file_size` gives, fits in a [`PROFILE_SHARE`] of `room`; the last one if
/// none does (the mapping may still succeed, and `recorder` halves further if it fails).
pub fn shrink_for_room(
    room: u64,
    shrinks: core::ops::RangeInclusive<u32>,
    file_size: impl Fn(u32) -> Option<u64>,
) -> u32 {
    let last = *shrinks.end();
    let budget = room / PROFILE_SHARE;
    shrinks
        .into_iter()
        .find(|&shrink| file_size(shrink).is_some_and(|size| size <= budget))
        .unwrap_or(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_field_of_statm_is_read_up_to_its_space() {
        assert_eq!(first_number(b"25123 3012 1800 1 0 900 0\n"), Some(25123));
        assert_eq!(first_number(b"7\n"), Some(7));
        assert_eq!(first_number(b" 7"), None);
        assert_eq!(first_number(b""), None);
    }

    #[test]
    fn the_fewest_halvings_whose_file_fits_a_quarter_of_the_room_are_taken() {
        // A file of 512 MiB at no halving, halved each time.
        let size = |shrink: u32| Some((512u64 << 20) >> shrink);
        // 400 MiB left: at most 100 MiB for the profile, i.e. 64 MiB (three halvings).
        assert_eq!(shrink_for_room(400 << 20, 0..=6, size), 3);
        // Room for the whole file four times over: no halving.
        assert_eq!(shrink_for_room(2048 << 20, 0..=6, size), 0);
        // Never fewer halvings than the file size limit asked for.
        assert_eq!(shrink_for_room(2048 << 20, 2..=6, size), 2);
        // Too little room for even the smallest: the smallest, left to the mapping to try.
        assert_eq!(shrink_for_room(1 << 20, 0..=6, size), 6);
    }

    #[test]
    fn this_process_has_no_address_space_limit_or_reads_its_room() {
        // Test runners set no RLIMIT_AS; with one, the room is below it.
        let limit = soft_limit(libc::RLIMIT_AS);
        match left() {
            None => assert_eq!(limit, libc::RLIM_INFINITY),
            Some(room) => assert!(room < limit),
        }
        assert!(mapped_bytes().is_some_and(|bytes| bytes > 0));
    }
}
