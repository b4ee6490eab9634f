//! Tests of the reader: a synthetic profile round trip, and every corruption it must refuse
//! with the right error instead of reading out of bounds.

use std::mem::offset_of;

use memwarden_abi::{
    flags, Header, ModuleRecord, StackRecord, FORMAT_VERSION, HEADER_SIZE, MODULE_MAIN,
};

use super::synthetic::{stack_record, ProfileBuilder, SyntheticModule};
use super::*;

fn poke(bytes: &mut [u8], offset: impl TryInto<usize>, value: &[u8]) {
    let Ok(offset) = offset.try_into() else {
        panic!("offset")
    };
    bytes[offset..offset + value.len()].copy_from_slice(value);
}

fn figures(live: i64, allocated: u64) -> StackRecord {
    let mut r = stack_record();
    (r.live_bytes, r.live_blocks, r.max_live_bytes) = (live, 1, live);
    (r.allocated_bytes, r.allocations, r.frees) = (allocated, 2, 1);
    r
}

fn sample() -> ProfileBuilder {
    let mut builder = ProfileBuilder::new(4242)
        .argv(&["./prog", "--flag", "ünï"])
        .exit(Some(Exit::Code(3)))
        .start_ns(123_456)
        .heap(48, 80)
        .module(SyntheticModule {
            path: "/usr/lib/libz.so.1".into(),
            base: 0x7f00_0000_0000,
            start: 0x7f00_0000_1000,
            end: 0x7f00_0000_9000,
            flags: 0,
            build_id: vec![1, 2, 3, 4],
        })
        .module(SyntheticModule {
            path: "/bin/prog".into(),
            base: 0x5555_0000_0000,
            start: 0x5555_0000_0000,
            end: 0x5555_0001_0000,
            flags: MODULE_MAIN,
            build_id: vec![],
        })
        .stack(&[0x5555_0000_1234, 0x5555_0000_2000], figures(32, 64))
        .stack(&[0x7f00_0000_1500], figures(16, 16));
    builder.header.ppid = 4000;
    builder.header.flags = flags::FORKED | flags::STACKS_FULL;
    builder.header.lock_waits = 5;
    builder.header.heap_cas_retries = 6;
    builder.header.peak_time_ns = 1_000;
    builder.header.rise_time_ns = 2_000;
    builder.header.end_time_ns = 3_000;
    builder.unknown_stack.allocations = 9;
    builder
}

fn error_of(bytes: &[u8]) -> String {
    match read_profile(bytes) {
        Ok(_) => panic!("corrupt profile accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_synthetic_profile_round_trips() {
    let p = read_profile(&sample().build()[..]).unwrap();
    assert_eq!((p.pid, p.ppid, p.max_depth), (4242, 4000, 64));
    assert_eq!(p.argv, ["./prog", "--flag", "ünï"]);
    assert_eq!(p.recorded_exit, Some(Exit::Code(3)));
    assert_eq!(p.start_monotonic_ns, 123_456);
    assert_eq!((p.live_bytes, p.committed_peak_bytes), (48, 80));
    assert_eq!(
        (p.peak_time_ns, p.rise_time_ns, p.end_time_ns),
        (1_000, 2_000, 3_000)
    );
    assert_eq!((p.lock_waits, p.heap_cas_retries), (5, 6));
    assert!(p.forked() && p.has_flag(flags::STACKS_FULL) && !p.has_flag(flags::OWN_MALLOC));
    // Sorted by start address.
    let modules: Vec<_> = p
        .modules
        .iter()
        .map(|m| (m.path.as_str(), m.is_main()))
        .collect();
    assert_eq!(
        modules,
        [("/bin/prog", true), ("/usr/lib/libz.so.1", false)]
    );
    assert_eq!(p.modules[1].build_id, [1, 2, 3, 4]);
    assert_eq!(p.modules[1].base, 0x7f00_0000_0000);
    let stacks: Vec<_> = p
        .stacks
        .iter()
        .map(|s| {
            (
                s.id,
                s.frames.to_vec(),
                s.record.live_bytes,
                s.record.allocations,
            )
        })
        .collect();
    assert_eq!(
        stacks,
        [
            (0, vec![], 0, 9),
            (1, vec![0x5555_0000_1234, 0x5555_0000_2000], 32, 2),
            (2, vec![0x7f00_0000_1500], 16, 2),
        ]
    );
}

#[test]
fn exit_kinds_decode_and_unknown_ones_are_refused() {
    let signal = sample().exit(Some(Exit::Signal(6))).build_profile();
    assert_eq!(signal.recorded_exit, Some(Exit::Signal(6)));
    let unknown = sample().exit(None).build_profile();
    assert_eq!(unknown.recorded_exit, None);
    let mut bytes = sample().build();
    poke(
        &mut bytes,
        offset_of!(Header, exit_kind),
        &7u32.to_le_bytes(),
    );
    assert_eq!(error_of(&bytes), "corrupt header: unknown exit_kind 7");
}

#[test]
fn unpublished_stacks_and_modules_do_not_count() {
    let mut builder = sample();
    builder.stacks[0].1.published = 0;
    let p = builder.build_profile();
    assert_eq!(p.stacks.iter().map(|s| s.id).collect::<Vec<_>>(), [0, 2]);
    let mut bytes = sample().build();
    let modules_offset = sample().header.layout.modules_offset as usize;
    poke(
        &mut bytes,
        modules_offset + offset_of!(ModuleRecord, published),
        &0u32.to_le_bytes(),
    );
    let p = read_profile(&bytes[..]).unwrap();
    assert_eq!(p.modules.len(), 1);
}

#[test]
fn files_shorter_than_the_header_are_truncated() {
    assert_eq!(
        error_of(&[]),
        "truncated: 0 bytes, shorter than the 8192-byte header"
    );
    let bytes = sample().build();
    assert_eq!(
        error_of(&bytes[..HEADER_SIZE as usize - 1]),
        "truncated: 8191 bytes, shorter than the 8192-byte header"
    );
}

#[test]
fn regions_in_use_past_the_end_of_the_file_are_truncated() {
    let bytes = sample().build();
    let layout = sample().header.layout;
    let stacks_end = layout.stack_offset(3) as usize;
    assert_eq!(
        error_of(&bytes[..stacks_end - 1]),
        format!(
            "truncated: stack records end at byte {stacks_end}, but the file has {} bytes",
            stacks_end - 1
        )
    );
    let frames_end = layout.frame_offset(3) as usize;
    assert!(error_of(&bytes[..frames_end - 8]).starts_with("truncated: frame words end at byte"));
    // Exactly long enough is fine: the rest of the file may not exist yet.
    assert!(read_profile(&bytes[..frames_end]).is_ok());
}

#[test]
fn identity_fields_are_checked() {
    let mut bytes = sample().build();
    poke(&mut bytes, 0, b"NOTMWP\0\0");
    assert!(error_of(&bytes).starts_with("not a memwarden profile (wrong magic"));

    let mut bytes = sample().build();
    poke(
        &mut bytes,
        offset_of!(Header, version),
        &(FORMAT_VERSION + 1).to_le_bytes(),
    );
    assert_eq!(
        error_of(&bytes),
        format!(
            "profile format version {}, this memwarden reads version {FORMAT_VERSION}",
            FORMAT_VERSION + 1
        )
    );

    let mut bytes = sample().build();
    poke(
        &mut bytes,
        offset_of!(Header, header_size),
        &64u32.to_le_bytes(),
    );
    assert_eq!(
        error_of(&bytes),
        format!(
            "header size 64 recorded, this memwarden expects {}",
            size_of::<Header>()
        )
    );
}

#[test]
fn a_layout_that_does_not_follow_the_capacities_is_refused() {
    let layout_at = offset_of!(Header, layout);
    let mut bytes = sample().build();
    let stacks_offset_at = layout_at + offset_of!(memwarden_abi::Layout, stacks_offset);
    poke(&mut bytes, stacks_offset_at, &u64::MAX.to_le_bytes());
    assert!(error_of(&bytes).starts_with("corrupt layout:"));

    let mut bytes = sample().build();
    let capacity_at = layout_at + offset_of!(memwarden_abi::Layout, stack_capacity);
    poke(&mut bytes, capacity_at, &u64::MAX.to_le_bytes());
    assert!(error_of(&bytes).starts_with("corrupt layout:"));
}

#[test]
fn counts_beyond_capacities_are_refused() {
    let cases = [
        (
            offset_of!(Header, stack_count),
            65u64,
            "stack_count 65 exceeds capacity 64",
        ),
        (
            offset_of!(Header, module_count),
            17,
            "module_count 17 exceeds capacity 16",
        ),
        (
            offset_of!(Header, frame_words_used),
            1025,
            "frame_words_used 1025 exceeds capacity 1024",
        ),
    ];
    for (offset, value, message) in cases {
        let mut bytes = sample().build();
        poke(&mut bytes, offset, &value.to_le_bytes());
        assert_eq!(error_of(&bytes), format!("corrupt header: {message}"));
    }
    let mut bytes = sample().build();
    poke(
        &mut bytes,
        offset_of!(Header, max_depth),
        &257u32.to_le_bytes(),
    );
    assert_eq!(
        error_of(&bytes),
        "corrupt header: max_depth 257 exceeds capacity 256"
    );
    let mut bytes = sample().build();
    poke(
        &mut bytes,
        offset_of!(Header, argv_len),
        &4097u32.to_le_bytes(),
    );
    assert_eq!(
        error_of(&bytes),
        "corrupt header: argv_len 4097 exceeds capacity 4096"
    );
}

#[test]
fn stacks_deeper_than_max_depth_or_with_frames_outside_the_area_are_refused() {
    let mut builder = sample();
    builder.header.max_depth = 1;
    assert_eq!(
        error_of(&builder.build()),
        "stack 1: depth 2 exceeds max_depth 1"
    );

    let mut bytes = sample().build();
    let stack_2 = sample().header.layout.stack_offset(2) as usize;
    poke(
        &mut bytes,
        stack_2 + offset_of!(StackRecord, frames_start),
        &3u64.to_le_bytes(),
    );
    assert_eq!(
        error_of(&bytes),
        "stack 2: frames 3..4 outside the 3 frame words in use"
    );

    let mut bytes = sample().build();
    poke(
        &mut bytes,
        stack_2 + offset_of!(StackRecord, frames_start),
        &u64::MAX.to_le_bytes(),
    );
    assert!(error_of(&bytes).starts_with("stack 2: frames 18446744073709551615.."));
}

#[test]
fn module_records_with_impossible_lengths_are_refused() {
    let modules_offset = sample().header.layout.modules_offset as usize;
    let mut bytes = sample().build();
    poke(
        &mut bytes,
        modules_offset + offset_of!(ModuleRecord, path_len),
        &433u32.to_le_bytes(),
    );
    assert_eq!(error_of(&bytes), "module 0: path_len 433 exceeds 432");

    let mut bytes = sample().build();
    poke(
        &mut bytes,
        modules_offset + offset_of!(ModuleRecord, build_id_len),
        &33u32.to_le_bytes(),
    );
    assert_eq!(error_of(&bytes), "module 0: build_id_len 33 exceeds 32");

    let mut bytes = sample().build();
    poke(
        &mut bytes,
        modules_offset + offset_of!(ModuleRecord, end),
        &0u64.to_le_bytes(),
    );
    assert_eq!(
        error_of(&bytes),
        "module 0: start 0x7f0000001000 above end 0x0"
    );
}

#[test]
fn argv_is_split_on_nul_without_a_trailing_empty_argument() {
    let p = ProfileBuilder::new(1).build_profile();
    assert!(p.argv.is_empty());
    let p = ProfileBuilder::new(1).argv(&["a", "", "b"]).build_profile();
    assert_eq!(p.argv, ["a", "", "b"]);
}

#[test]
fn files_are_read_from_disk_and_errors_name_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("1.mwp");
    std::fs::write(&path, sample().build()).unwrap();
    let p = read_profile_file(&path).unwrap();
    assert_eq!((p.pid, p.path.as_path()), (4242, path.as_path()));
    std::fs::write(&path, b"short").unwrap();
    let message = read_profile_file(&path).unwrap_err().to_string();
    assert_eq!(
        message,
        format!(
            "{}: truncated: 5 bytes, shorter than the 8192-byte header",
            path.display()
        )
    );
    let missing = dir.path().join("missing.mwp");
    let message = read_profile_file(&missing).unwrap_err().to_string();
    assert!(message.starts_with(&format!("{}: cannot read: ", missing.display())));
}

#[test]
fn a_finished_file_reads_as_the_same_profile_its_frames_mapped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("1.mwp");
    std::fs::write(&path, sample().build()).unwrap();
    let read = read_profile_file(&path).unwrap();
    let finished = read_finished_profile_file(&path).unwrap();
    assert_eq!(format!("{finished:?}"), format!("{read:?}"));
    assert_eq!(
        &*finished.stacks[1].frames,
        [0x5555_0000_1234, 0x5555_0000_2000]
    );
    // The mapping outlives the file's name: compaction replaces the file while the
    // report still reads the profile it loaded.
    std::fs::remove_file(&path).unwrap();
    assert_eq!(&*finished.stacks[2].frames, [0x7f00_0000_1500]);
    // A file that is not whole is refused as when it is read.
    std::fs::write(&path, b"short").unwrap();
    assert!(read_finished_profile_file(&path).is_err());
}
