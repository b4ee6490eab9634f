//! Tests of the cache folder's file format and its keys.

use super::*;

fn location(function: &str, file: Option<&str>, line: Option<u32>, inlined: bool) -> Location {
    Location {
        function: Some(function.to_owned()),
        file: file.map(str::to_owned),
        line,
        inlined,
    }
}

fn sample() -> Vec<(u64, Vec<Location>)> {
    vec![
        (
            0x1234,
            vec![
                location("inner", Some("a.c"), Some(7), true),
                location("outer", Some("a.c"), Some(0), false),
            ],
        ),
        (0x99, vec![Location::default()]),
        (0x4000, vec![location("outer", None, None, false)]),
    ]
}

fn as_entries(sample: &[(u64, Vec<Location>)]) -> Vec<(u64, &[Location])> {
    sample.iter().map(|(p, l)| (*p, l.as_slice())).collect()
}

#[test]
fn what_is_encoded_decodes_the_same_for_its_key_only() {
    let sample = sample();
    let bytes = encode(b"key", &as_entries(&sample));
    let decoded = decode(&bytes, b"key").unwrap();
    let expected: Vec<(u64, Box<[Location]>)> = sample
        .into_iter()
        .map(|(p, l)| (p, l.into_boxed_slice()))
        .collect();
    assert_eq!(decoded, expected);
    assert_eq!(decode(&bytes, b"other key"), None);
    // A line 0 stays a line 0, distinct from no line.
    assert_eq!(decoded[0].1[1].line, Some(0));
    assert_eq!(decoded[2].1[0].line, None);
}

#[test]
fn every_cut_or_damaged_file_is_refused_without_panicking() {
    let bytes = encode(b"k", &as_entries(&sample()));
    for len in 0..bytes.len() {
        assert_eq!(decode(&bytes[..len], b"k"), None, "cut at {len}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert_eq!(decode(&longer, b"k"), None);
    for at in 0..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[at] ^= 0xff;
        // Any outcome but a panic: a damaged byte may still decode (a line number).
        let _ = decode(&damaged, b"k");
    }
}

#[test]
fn saved_entries_load_back_and_another_key_finds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("nested").join("symbols");
    let sample = sample();
    save(&folder, b"module v1", &as_entries(&sample));
    let loaded = load(&folder, b"module v1");
    assert_eq!(loaded.len(), 3);
    assert_eq!(loaded[0].1[0].function.as_deref(), Some("inner"));
    assert!(load(&folder, b"module v2").is_empty());
    // No temporary file is left behind.
    let names: Vec<_> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 1);
    assert!(names[0].ends_with(".sym"), "{names:?}");
}

#[test]
fn a_folder_that_cannot_be_made_is_no_error() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, b"x").unwrap();
    save(&blocker.join("symbols"), b"k", &as_entries(&sample()));
    assert!(load(&blocker.join("symbols"), b"k").is_empty());
}

#[test]
fn the_oldest_files_go_past_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("0000000000000000.sym");
    std::fs::write(&old, b"x").unwrap();
    let long_ago = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    std::fs::File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(long_ago)
        .unwrap();
    for n in 0..MAX_FILES {
        std::fs::write(dir.path().join(format!("{:016x}.sym", n + 1)), b"x").unwrap();
    }
    // A temporary file a dead run left, and one being written now.
    let abandoned = dir.path().join(".1.0000000000000001.sym.tmp");
    std::fs::write(&abandoned, b"x").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&abandoned)
        .unwrap()
        .set_modified(long_ago)
        .unwrap();
    let in_progress = dir.path().join(".2.0000000000000002.sym.tmp");
    std::fs::write(&in_progress, b"x").unwrap();
    trim(dir.path());
    assert!(!old.exists());
    assert!(!abandoned.exists());
    assert!(in_progress.exists());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        MAX_FILES + 1
    );
}
