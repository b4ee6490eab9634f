//! Backing the profile file: a chunk written with zeros when it is first backed must never
//! be one that holds data already (what earlier chunks hold, a chunk backed before, a forked
//! child's copy of its parent's profile).

use super::*;

/// Room for 4,096 stack records: 512 KiB, eight chunks.
const STACKS: u64 = 4096;

fn scratch(tag: &str) -> ScratchProfile {
    scratch_profile(&format!("profile-file-{tag}"), STACKS)
}

/// Record `id`'s 128 bytes, as the mapping shows them.
fn record_bytes(file: &ProfileFile, id: u64) -> Vec<u8> {
    // SAFETY: record `id` lies inside the mapping (id < STACKS).
    unsafe { core::slice::from_raw_parts(file.stack(id).cast::<u8>(), 128).to_vec() }
}

fn fill_record(file: &ProfileFile, id: u64, byte: u8) {
    // SAFETY: as above; the test's thread alone writes it.
    unsafe { core::ptr::write_bytes(file.stack(id).cast::<u8>(), byte, 128) };
}

/// The first stack id whose record starts in a chunk after `id`'s.
fn id_in_next_chunk(layout: &Layout, id: u64) -> u64 {
    let chunk = layout.stack_offset(id) / CHUNK;
    (id..STACKS)
        .find(|&next| layout.stack_offset(next) / CHUNK > chunk)
        .unwrap()
}

/// Whether every page of `[offset, offset + len)` of the file is in the page cache.
fn in_page_cache(file: &ProfileFile, offset: u64, len: u64) -> bool {
    let pages = (len / 4096) as usize;
    let mut resident = vec![0u8; pages];
    // SAFETY: a page-aligned range of the mapping, and a vector of one byte per page.
    let status = unsafe {
        libc::mincore(
            file.base().add(offset as usize).cast(),
            len as usize,
            resident.as_mut_ptr(),
        )
    };
    status == 0 && resident.iter().all(|&page| page & 1 == 1)
}

#[test]
fn a_populated_chunk_reads_as_zeros_and_keeps_earlier_chunks_data() {
    let scratch = scratch("populate");
    let file = &scratch.file;
    let layout = *file.layout();
    assert!(file.back_chunks(layout.stack_offset(1), 128, || true));
    fill_record(file, 1, 0xa5);
    let later = id_in_next_chunk(&layout, 1);
    assert!(file.back_chunks(layout.stack_offset(later), 128, || true));

    assert_eq!(record_bytes(file, 1), vec![0xa5; 128]);
    assert_eq!(record_bytes(file, later), vec![0; 128]);
    // The zeros went through the file's write path: every page of the chunk is in the page
    // cache before anything touched it through the mapping.
    let chunk_start = layout.stack_offset(later) / CHUNK * CHUNK;
    assert!(in_page_cache(file, chunk_start, CHUNK));
    let on_disk = std::fs::read(scratch.path()).unwrap();
    let start = (layout.stack_offset(later) / CHUNK * CHUNK) as usize;
    assert!(on_disk[start..start + CHUNK as usize]
        .iter()
        .all(|&b| b == 0));
    assert_eq!(
        &on_disk[layout.stack_offset(1) as usize..][..128],
        &[0xa5; 128][..]
    );
}

#[test]
fn a_chunk_backed_once_is_never_written_again() {
    let scratch = scratch("again");
    let file = &scratch.file;
    let layout = *file.layout();
    let id = id_in_next_chunk(&layout, 0);
    assert!(file.back_chunks(layout.stack_offset(id), 128, || true));
    fill_record(file, id, 0x3c);
    fill_record(file, id + 1, 0x3d);
    // Another record of the same chunk is backed, populate asked again.
    assert!(file.back_chunks(layout.stack_offset(id + 1), 128, || true));
    assert!(file.back(layout.stack_offset(id), 256));
    assert_eq!(record_bytes(file, id), vec![0x3c; 128]);
    assert_eq!(record_bytes(file, id + 1), vec![0x3d; 128]);
}

#[test]
fn a_file_adopted_by_a_forked_child_is_never_populated() {
    let scratch = scratch("adopt");
    let file = &scratch.file;
    assert!(file.fresh_chunks_empty.load(Ordering::Relaxed));
    // The child's own file, as `fork.rs` creates it (here: the same file opened again).
    let path = std::ffi::CString::new(scratch.path().as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path of an existing file.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    assert!(fd >= 0);
    file.adopt(fd, &scratch.identity);
    // SAFETY: closes the descriptor opened above.
    unsafe { libc::close(fd) };
    assert!(!file.fresh_chunks_empty.load(Ordering::Relaxed));
}
