//! Store, after the run: rewrites a finished profile file densely. The preload reserves each
//! file at full capacity (sparse, about 580 MiB apparent) so it can grow in place while the
//! process runs; once every process is gone, the regions in use are copied into a file
//! whose capacities equal its counts, so the output folder copies, archives and uploads at
//! its real size. A compacted file is an ordinary profile: the layout in its header says
//! where each region now is.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use memwarden_abi::{Header, Layout, HEADER_SIZE};

use super::header::check_header;
use super::plain::read_plain;
use super::ProfileError;
use crate::Error;

/// Rewrites the profile at `path` densely if that makes it smaller. Its header is first
/// validated like any profile's; the file is replaced atomically (write aside, then rename).
/// Returns whether it was rewritten.
pub fn compact_profile_file(path: &Path) -> Result<bool, Error> {
    let wrap = |source: ProfileError| Error::Profile {
        path: path.to_owned(),
        source,
    };
    let file = File::open(path).map_err(|e| wrap(e.into()))?;
    let length = file.metadata().map_err(|e| wrap(e.into()))?.len();
    if length < HEADER_SIZE {
        return Err(wrap(ProfileError::TooShort { len: length }));
    }
    let mut header_bytes = vec![0u8; HEADER_SIZE as usize];
    file.read_exact_at(&mut header_bytes, 0)
        .map_err(|e| wrap(e.into()))?;
    let header = read_plain::<Header>(&header_bytes, 0).ok_or(wrap(ProfileError::TooShort {
        len: header_bytes.len() as u64,
    }))?;
    // The header is all the copy relies on; the records are checked when the report reads
    // the dense file, with the same checks.
    check_header(&header, length).map_err(wrap)?;
    let old = header.layout;
    let failures_stored = header.failure_count.min(old.failure_capacity);
    let errors_stored = header.error_count.min(old.error_capacity);
    let leaks_stored = header.leak_record_count.min(old.leak_capacity);
    let Some(dense) = Layout::new(
        header.module_count,
        header.stack_count,
        header.frame_words_used,
        failures_stored,
        errors_stored,
        header.code_count,
        header.blob_used,
    )
    .and_then(|dense| dense.with_leak_capacity(leaks_stored)) else {
        return Ok(false);
    };
    if dense.file_size >= length {
        return Ok(false);
    }
    write_layout(&mut header_bytes, &dense);
    let regions = [
        (
            old.modules_offset,
            dense.modules_offset,
            old.module_offset(header.module_count) - old.modules_offset,
        ),
        (
            old.stacks_offset,
            dense.stacks_offset,
            old.stack_offset(header.stack_count) - old.stacks_offset,
        ),
        (
            old.frames_offset,
            dense.frames_offset,
            old.frame_offset(header.frame_words_used) - old.frames_offset,
        ),
        (
            old.failures_offset,
            dense.failures_offset,
            old.failure_offset(failures_stored) - old.failures_offset,
        ),
        (
            old.errors_offset,
            dense.errors_offset,
            old.error_offset(errors_stored) - old.errors_offset,
        ),
        (
            old.codes_offset,
            dense.codes_offset,
            old.code_offset(header.code_count) - old.codes_offset,
        ),
        (old.blob_offset, dense.blob_offset, header.blob_used),
        (
            old.leaks_offset,
            dense.leaks_offset,
            old.leak_offset(leaks_stored) - old.leaks_offset,
        ),
    ];
    let aside = path.with_extension("mwp.compacting");
    // Not synced to disk: the rename already makes the swap atomic for every reader, and
    // the sparse file it replaces was never synced either (its pages are written back
    // whenever the kernel sees fit). Syncing cost about 50 ms on a 33 MB profile.
    let written = File::create(&aside)
        .and_then(|out| write_dense(&file, out, &header_bytes, &regions, dense.file_size))
        .and_then(|()| fs::rename(&aside, path));
    if let Err(e) = written {
        let _ = fs::remove_file(&aside);
        return Err(wrap(e.into()));
    }
    Ok(true)
}

/// Writes the dense file: the header, then each region (`from` in `file`, `to` in `out`,
/// `len` bytes), the gaps between them left as holes that read as zeros. The regions are
/// copied file to file by the kernel (`io::copy` uses `copy_file_range` between files):
/// a large profile is tens of MB, which through a buffer of our own cost a page fault per
/// 4 KiB of it and a copy more.
fn write_dense(
    file: &File,
    mut out: File,
    header: &[u8],
    regions: &[(u64, u64, u64)],
    size: u64,
) -> std::io::Result<()> {
    out.write_all(header)?;
    let mut from_file = file;
    for &(from, to, len) in regions.iter().filter(|region| region.2 > 0) {
        from_file.seek(SeekFrom::Start(from))?;
        out.seek(SeekFrom::Start(to))?;
        if io::copy(&mut from_file.take(len), &mut out)? != len {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    out.set_len(size)
}

/// Writes `layout` into the header bytes, field by field at its `repr(C)` offsets.
fn write_layout(header: &mut [u8], layout: &Layout) {
    let at = std::mem::offset_of!(Header, layout);
    let fields = super::plain::layout_fields(layout);
    for (offset, value) in fields {
        header[at + offset..at + offset + 8].copy_from_slice(&value.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::read_profile_file;
    use crate::profile::synthetic::{stack_record, ProfileBuilder};

    #[test]
    fn a_compacted_profile_reads_the_same_and_is_smaller() {
        let mut record = stack_record();
        record.live_bytes = 40;
        record.live_blocks = 1;
        record.allocated_bytes = 40;
        record.allocations = 1;
        let bytes = ProfileBuilder::new(4242)
            .heap(40, 0)
            .stack(&[0x1000, 0x2000, 0x3000], record)
            .build();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("4242-1.mwp");
        fs::write(&path, &bytes).unwrap();
        let before = read_profile_file(&path).unwrap();
        assert!(compact_profile_file(&path).unwrap());
        let after = read_profile_file(&path).unwrap();
        assert!(fs::metadata(&path).unwrap().len() < bytes.len() as u64);
        assert_eq!(
            format!("{:?}", after.stacks),
            format!("{:?}", before.stacks)
        );
        assert_eq!(after.live_bytes, 40);
        assert!(!compact_profile_file(&path).unwrap(), "already dense");
    }

    #[test]
    fn python_code_records_and_their_blob_survive_compaction() {
        use crate::profile::synthetic::SyntheticCode;
        use memwarden_abi::python::python_frame;
        let bytes = ProfileBuilder::new(7)
            .python_version(0x030c_01f0)
            .python_code(SyntheticCode {
                filename: "/w/a.py".into(),
                name: "f".into(),
                qualname: "C.f".into(),
                first_line: 3,
                line_table: vec![0x80 | (10 << 3), 0, 0],
            })
            .stack(&[0x1000, python_frame(0, 0, false)], stack_record())
            .build();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("7.mwp");
        fs::write(&path, &bytes).unwrap();
        let before = read_profile_file(&path).unwrap();
        assert!(compact_profile_file(&path).unwrap());
        let after = read_profile_file(&path).unwrap();
        assert_eq!(after.python_codes, before.python_codes);
        assert_eq!(after.python_code(0).unwrap().qualname, "C.f");
        assert_eq!(after.python_version, 0x030c_01f0);
    }
}
