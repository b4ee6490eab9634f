//! Tests of the bytecode kept across runs: which pycs are kept and offered, and that a
//! run starts from a clean `__pycache__`.

use super::*;

/// A pyc header (magic number, flags) and a body.
fn pyc(flags: u32, body: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0xa7, 0x0d, 0x0d, 0x0a];
    bytes.extend(flags.to_le_bytes());
    bytes.extend([0u8; 8]);
    bytes.extend(body);
    bytes
}

/// `DIR/.python/__pycache__` of the output folder `out`.
fn pycache(out: &Path) -> PathBuf {
    out.join(SITE_DIR).join(PYCACHE)
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|listing| {
            listing
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn only_pycs_of_memwardens_files_are_ours() {
    assert!(is_ours("sitecustomize.cpython-311.pyc"));
    assert!(is_ours("memwarden_numpy.cpython-313.pyc"));
    assert!(is_ours("memwarden_numpy.pypy310.pyc"));
    assert!(!is_ours("sitecustomize.cpython-311.pyc.77.tmp"));
    assert!(!is_ours("sitecustomize_extra.cpython-311.pyc"));
    assert!(!is_ours("sitecustomize.py"));
    assert!(!is_ours("other.cpython-311.pyc"));
}

#[test]
fn the_cache_folder_is_named_by_the_files_text() {
    let dir = cache_dir(Path::new("/cache"));
    assert_eq!(dir.parent(), Some(Path::new("/cache/python")));
    let name = dir.file_name().unwrap().to_str().unwrap();
    assert_eq!(name.len(), 16);
    assert_eq!(name, format!("{:016x}", sources_hash()));
}

#[test]
fn hash_based_pycs_are_kept_and_offered_to_the_next_run() {
    let root = tempfile::tempdir().unwrap();
    let (first, second) = (root.path().join("first"), root.path().join("second"));
    let kept = cache_dir(&root.path().join("cache"));
    fs::create_dir_all(pycache(&first)).unwrap();
    let hashed = pyc(0b11, b"code");
    fs::write(
        pycache(&first).join("sitecustomize.cpython-311.pyc"),
        &hashed,
    )
    .unwrap();
    // Python's own pyc (checked by time) is of no use to a later run; others are not ours.
    let timed = pyc(0, b"code");
    fs::write(
        pycache(&first).join("memwarden_numpy.cpython-311.pyc"),
        &timed,
    )
    .unwrap();
    fs::write(pycache(&first).join("user.cpython-311.pyc"), &hashed).unwrap();
    // Bytecode kept for other versions of the files goes.
    let stale = root
        .path()
        .join("cache")
        .join("python")
        .join("0123456789abcdef");
    fs::create_dir_all(&stale).unwrap();

    keep(&first, &kept);
    assert_eq!(names_in(&kept), ["sitecustomize.cpython-311.pyc"]);
    assert_eq!(
        fs::read(kept.join("sitecustomize.cpython-311.pyc")).unwrap(),
        hashed
    );
    assert!(!stale.exists());

    // The next run's folder starts with what was kept, and nothing of its own past.
    fs::create_dir_all(pycache(&second)).unwrap();
    fs::write(
        pycache(&second).join("memwarden_numpy.cpython-311.pyc"),
        &timed,
    )
    .unwrap();
    offer(&second, Some(&kept));
    assert_eq!(
        names_in(&pycache(&second)),
        ["sitecustomize.cpython-311.pyc"]
    );
    assert_eq!(
        fs::read(pycache(&second).join("sitecustomize.cpython-311.pyc")).unwrap(),
        hashed
    );
}

#[test]
fn a_kept_pyc_is_not_replaced_and_no_cache_means_a_clean_folder() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("out");
    let kept = cache_dir(&root.path().join("cache"));
    fs::create_dir_all(&kept).unwrap();
    fs::write(
        kept.join("sitecustomize.cpython-311.pyc"),
        pyc(0b11, b"first"),
    )
    .unwrap();
    fs::create_dir_all(pycache(&out)).unwrap();
    fs::write(
        pycache(&out).join("sitecustomize.cpython-311.pyc"),
        pyc(0b11, b"second"),
    )
    .unwrap();
    keep(&out, &kept);
    assert_eq!(
        fs::read(kept.join("sitecustomize.cpython-311.pyc")).unwrap(),
        pyc(0b11, b"first")
    );

    offer(&out, None);
    assert!(!pycache(&out).exists());
    // A run without Python bytecode leaves the cache as it was.
    keep(&out, &kept);
    assert_eq!(names_in(&kept), ["sitecustomize.cpython-311.pyc"]);
}
