//! Store → analysis: the checks of a profile file's header that everything reading the
//! file relies on (identity, layout, counts within capacities, regions within the file),
//! shared by the reader, the compaction and the look-ahead on a file still being written.

use memwarden_abi::{Header, Layout, ARGV_CAPACITY, FORMAT_VERSION, MAGIC, MAX_DEPTH_LIMIT};

use super::errors::error_region;
use super::failures::failure_region;
use super::leaks::leak_region;
use super::python::{blob_region, code_region};
use super::ProfileError;

/// Checks everything the rest of the reader relies on: identity, layout, counts within
/// capacities, regions in use within the file.
pub(crate) fn check_header(header: &Header, len: u64) -> Result<(), ProfileError> {
    if header.magic != MAGIC {
        return Err(ProfileError::BadMagic {
            found: header.magic,
        });
    }
    if header.version != FORMAT_VERSION {
        return Err(ProfileError::Version {
            found: header.version,
        });
    }
    if header.header_size as usize != size_of::<Header>() {
        return Err(ProfileError::HeaderSize {
            found: header.header_size,
            expected: size_of::<Header>(),
        });
    }
    let l = header.layout;
    if Layout::new(
        l.module_capacity,
        l.stack_capacity,
        l.frame_capacity,
        l.failure_capacity,
        l.error_capacity,
        l.code_capacity,
        l.blob_capacity,
    )
    .and_then(|dense| dense.with_leak_capacity(l.leak_capacity))
        != Some(l)
    {
        return Err(ProfileError::Layout {
            modules: l.module_capacity,
            stacks: l.stack_capacity,
            frames: l.frame_capacity,
        });
    }
    let counts = [
        ("module_count", header.module_count, l.module_capacity),
        ("stack_count", header.stack_count, l.stack_capacity),
        // Stack ids are u32 in every consumer.
        ("stack_count", header.stack_count, 1 << 32),
        (
            "frame_words_used",
            header.frame_words_used,
            l.frame_capacity,
        ),
        ("max_depth", header.max_depth.into(), MAX_DEPTH_LIMIT.into()),
        ("argv_len", header.argv_len.into(), ARGV_CAPACITY as u64),
        ("code_count", header.code_count, l.code_capacity),
        ("blob_used", header.blob_used, l.blob_capacity),
    ];
    for (what, count, capacity) in counts {
        if count > capacity {
            return Err(ProfileError::OverCapacity {
                what,
                count,
                capacity,
            });
        }
    }
    // Counts are within capacities, and `Layout::new` proved the full regions do not
    // overflow, so these ends cannot overflow either.
    let regions = [
        ("module records", l.module_offset(header.module_count)),
        ("stack records", l.stack_offset(header.stack_count)),
        ("frame words", l.frame_offset(header.frame_words_used)),
        ("injected-failure records", failure_region(header).1),
        ("heap-error records", error_region(header).1),
        ("code records", code_region(header).1),
        ("blob bytes", blob_region(header).1),
        ("leak records", leak_region(header).1),
    ];
    for (what, end) in regions {
        if end > len {
            return Err(ProfileError::Truncated { what, end, len });
        }
    }
    Ok(())
}
