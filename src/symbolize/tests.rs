//! Tests of symbolization against real ELF files: the test binary itself, and small
//! shared libraries compiled here with `cc` (DWARF, inlining, stripped, debuglink).

use std::path::{Path, PathBuf};
use std::process::Command;

use memwarden_abi::MODULE_VDSO;
use object::{Object, ObjectSymbol};

use super::*;
use crate::profile::synthetic::ProfileBuilder;

const LIBRARY_SOURCE: &str = r#"
static inline __attribute__((always_inline)) int inner(int x) { return x * 3 + 1; }
volatile int sink;
__attribute__((noinline)) int outer(int x) { sink = inner(x); return sink + 2; }
"#;

fn profile_with(modules: Vec<Module>) -> Profile {
    let mut profile = ProfileBuilder::new(1).build_profile();
    profile.modules = modules;
    profile
}

fn module(path: &Path, base: u64, start: u64, end: u64, flags: u32) -> Module {
    Module {
        path: path.to_string_lossy().into_owned(),
        base,
        start,
        end,
        loaded_ns: 0,
        flags,
        build_id: Vec::new(),
    }
}

/// Compiles [`LIBRARY_SOURCE`] into `dir/libmwtest.so` with `-O2 -g`.
fn compile_library(dir: &Path) -> PathBuf {
    let source = dir.join("mwtest.c");
    std::fs::write(&source, LIBRARY_SOURCE).unwrap();
    let library = dir.join("libmwtest.so");
    let status = Command::new("cc")
        .args(["-O2", "-g", "-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(&source)
        .status()
        .expect("these tests need a C compiler as `cc`");
    assert!(status.success(), "cc failed");
    library
}

fn run(tool: &str, args: &[&std::ffi::OsStr]) {
    let status = Command::new(tool).args(args).status().unwrap();
    assert!(status.success(), "{tool} failed");
}

/// Address range of symbol `name` in the ELF file at `path`.
fn symbol_range(path: &Path, name: &str) -> (u64, u64) {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let symbol = file
        .symbols()
        .chain(file.dynamic_symbols())
        .find(|s| s.name() == Ok(name))
        .unwrap();
    (symbol.address(), symbol.address() + symbol.size())
}

/// Symbolizes every address of `outer` in a library mapped with bias 0; returns the
/// frames of the first address inside the inlined `inner`, or of the first address.
fn frames_in_outer(library: &Path, symbols_from: &Path) -> Vec<Frame> {
    let (start, end) = symbol_range(symbols_from, "outer");
    let profile = profile_with(vec![module(library, 0, 0, 1 << 40, 0)]);
    let mut symbolizer = Symbolizer::new();
    let all: Vec<Vec<Frame>> = (start..end)
        .map(|address| symbolizer.frames(&profile, address + 1))
        .collect();
    assert!(
        symbolizer.warnings().is_empty(),
        "{:?}",
        symbolizer.warnings()
    );
    all.iter()
        .find(|frames| frames.len() > 1)
        .unwrap_or(&all[0])
        .clone()
}

#[test]
fn an_address_outside_every_module_keeps_only_its_address() {
    let profile = profile_with(vec![module(Path::new("/x.so"), 0, 0x1000, 0x2000, 0)]);
    let frames = Symbolizer::new().frames(&profile, 0x2001);
    assert_eq!(
        frames,
        [Frame {
            function: None,
            file: None,
            line: None,
            module: None,
            address: 0x2001,
            inlined: false,
            kind: FrameKind::Native,
        }]
    );
}

#[test]
fn a_return_address_just_past_a_module_belongs_to_it() {
    let profile = profile_with(vec![module(Path::new("/gone/x.so"), 0, 0x1000, 0x2000, 0)]);
    let frames = Symbolizer::new().frames(&profile, 0x2000);
    assert_eq!(frames[0].module.as_deref(), Some("/gone/x.so"));
}

#[test]
fn vdso_frames_name_the_module_only() {
    let profile = profile_with(vec![module(
        Path::new("linux-vdso.so.1"),
        0,
        0x1000,
        0x2000,
        MODULE_VDSO,
    )]);
    let frames = Symbolizer::new().frames(&profile, 0x1800);
    assert_eq!(
        (frames[0].function.as_deref(), frames[0].module.as_deref()),
        (None, Some("[vdso]"))
    );
}

#[test]
fn a_missing_module_file_keeps_its_name_and_warns_once() {
    let profile = profile_with(vec![module(
        Path::new("/nonexistent/libgone.so"),
        0,
        0x1000,
        0x9000,
        0,
    )]);
    let mut symbolizer = Symbolizer::new();
    let a = symbolizer.frames(&profile, 0x1800);
    let b = symbolizer.frames(&profile, 0x1900);
    assert_eq!(a[0].module.as_deref(), Some("/nonexistent/libgone.so"));
    assert_eq!((a[0].function.as_deref(), b[0].address), (None, 0x1900));
    assert_eq!(symbolizer.warnings().len(), 1);
    assert!(symbolizer.warnings()[0].starts_with("no symbols for /nonexistent/libgone.so: "));
}

#[test]
fn a_module_whose_build_id_changed_is_not_symbolized() {
    let exe = std::env::current_exe().unwrap();
    let mut stale = module(&exe, 0, 0, 1 << 40, 0);
    stale.build_id = vec![0xde, 0xad];
    let mut symbolizer = Symbolizer::new();
    let frames = symbolizer.frames(&profile_with(vec![stale]), 0x2000);
    assert_eq!(frames[0].function, None);
    assert!(
        symbolizer.warnings()[0].contains("build id differs"),
        "{:?}",
        symbolizer.warnings()
    );
}

#[test]
fn dwarf_gives_function_file_line_and_inlined_frames() {
    let dir = tempfile::tempdir().unwrap();
    let library = compile_library(dir.path());
    let frames = frames_in_outer(&library, &library);
    let summary: Vec<_> = frames
        .iter()
        .map(|f| (f.function.as_deref(), f.inlined, f.module.as_deref()))
        .collect();
    assert_eq!(
        summary,
        [
            (Some("inner"), true, library.to_str()),
            (Some("outer"), false, library.to_str()),
        ]
    );
    assert!(frames[0].file.as_deref().unwrap().ends_with("mwtest.c"));
    assert_eq!(frames[0].line, Some(2));
    assert_eq!(frames[1].line, Some(4));
}

#[test]
fn without_dwarf_the_symbol_table_names_the_function() {
    let dir = tempfile::tempdir().unwrap();
    let library = compile_library(dir.path());
    let original = dir.path().join("original.so");
    std::fs::copy(&library, &original).unwrap();
    run("strip", &["--strip-all".as_ref(), library.as_os_str()]);
    let frames = frames_in_outer(&library, &original);
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].function.as_deref(), Some("outer"));
    assert_eq!((frames[0].file.as_deref(), frames[0].line), (None, None));
}

#[test]
fn a_debuglink_beside_the_library_is_followed() {
    let dir = tempfile::tempdir().unwrap();
    let library = compile_library(dir.path());
    let debug = dir.path().join("libmwtest.so.dbg");
    run(
        "objcopy",
        &[
            "--only-keep-debug".as_ref(),
            library.as_os_str(),
            debug.as_os_str(),
        ],
    );
    run("strip", &["--strip-debug".as_ref(), library.as_os_str()]);
    let link = format!("--add-gnu-debuglink={}", debug.display());
    run("objcopy", &[link.as_ref(), library.as_os_str()]);
    let frames = frames_in_outer(&library, &debug);
    let functions: Vec<_> = frames.iter().map(|f| f.function.as_deref()).collect();
    assert_eq!(functions, [Some("inner"), Some("outer")]);
    assert!(frames[1].file.as_deref().unwrap().ends_with("mwtest.c"));
}

#[inline(never)]
fn marker_for_symbolizer_test() -> u64 {
    std::hint::black_box(7)
}

#[test]
fn a_rust_function_of_this_process_is_found_and_demangled() {
    let exe = std::env::current_exe().unwrap();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let exe_text = exe.to_string_lossy();
    // The lowest mapping of the executable holds its first segment (vaddr 0 in a PIE).
    let start = maps
        .lines()
        .filter(|line| line.ends_with(&*exe_text))
        .filter_map(|line| u64::from_str_radix(line.split('-').next()?, 16).ok())
        .min()
        .unwrap();
    let data = std::fs::read(&exe).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let first_vaddr = object::Object::segments(&file)
        .map(|s| object::ObjectSegment::address(&s))
        .min()
        .unwrap();
    let base = start - (first_vaddr & !0xfff);
    let profile = profile_with(vec![module(&exe, base, start, u64::MAX, 0)]);
    let address = marker_for_symbolizer_test as *const () as u64 + 1;
    let frames = Symbolizer::new().frames(&profile, address);
    let last = frames.last().unwrap();
    let function = last.function.as_deref().unwrap();
    assert!(
        function.ends_with("::marker_for_symbolizer_test"),
        "{function}"
    );
    assert!(last
        .file
        .as_deref()
        .unwrap()
        .ends_with("symbolize/tests.rs"));
    assert_eq!(marker_for_symbolizer_test(), 7);
}

#[test]
fn an_instruction_address_is_looked_up_as_is_not_minus_one() {
    let dir = tempfile::tempdir().unwrap();
    let library = compile_library(dir.path());
    let (start, _) = symbol_range(&library, "outer");
    let profile = profile_with(vec![module(&library, 0, 0, 1 << 40, 0)]);
    let mut symbolizer = Symbolizer::new();
    let at = symbolizer.instruction_frames(&profile, start);
    assert_eq!(at.last().unwrap().function.as_deref(), Some("outer"));
    assert_eq!(at[0].address, start);
    // As a return address, the same value means "the call just before": not in `outer`.
    let returned_to = symbolizer.frames(&profile, start);
    assert_ne!(
        returned_to.last().unwrap().function.as_deref(),
        Some("outer")
    );
}

#[test]
fn symbols_loaded_ahead_serve_the_report_and_failures_warn_only_when_it_uses_them() {
    use crate::profile::synthetic::{stack_record, SyntheticModule};
    use crate::report::warm::{Found, LookAhead};
    use std::sync::atomic::AtomicBool;

    let dir = tempfile::tempdir().unwrap();
    let library = compile_library(dir.path());
    let (outer, _) = symbol_range(&library, "outer");
    let whole_space = |path: &Path, start: u64, end: u64| SyntheticModule {
        path: path.to_string_lossy().into_owned(),
        base: 0,
        start,
        end,
        flags: 0,
        build_id: Vec::new(),
    };
    let gone = dir.path().join("libgone.so");
    let bytes = ProfileBuilder::new(1)
        .module(whole_space(&library, 0, 1 << 40))
        .module(whole_space(&gone, 1 << 40, 2 << 40))
        .stack(&[outer + 1], stack_record())
        .stack(&[(1 << 40) + 0x20], stack_record())
        .build();
    let out = dir.path().join("out");
    std::fs::create_dir_all(out.join("raw")).unwrap();
    let profile_path = out.join("raw").join("1-1.mwp");
    std::fs::write(&profile_path, bytes).unwrap();

    let mut ahead = LookAhead::new(&out, Symbolizer::new());
    let go_on = AtomicBool::new(false);
    assert_eq!(ahead.look(&go_on), Some(Found::NewStacks));
    assert_eq!(
        ahead.look(&go_on),
        Some(Found::Nothing),
        "nothing new since"
    );
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(empty.join("raw")).unwrap();
    assert_eq!(
        LookAhead::new(&empty, Symbolizer::new()).look(&go_on),
        Some(Found::NoProfileYet)
    );
    assert_eq!(
        LookAhead::new(&empty, Symbolizer::new()).look(&AtomicBool::new(true)),
        None,
        "stopped"
    );
    let (mut symbolizer, _) = ahead.into_parts();
    assert!(
        symbolizer.warnings().is_empty(),
        "no warning ahead of the report"
    );

    // The library is gone by report time: only what was loaded ahead can name `outer`.
    std::fs::remove_file(&library).unwrap();
    let profile = crate::profile::read_profile_file(&profile_path).unwrap();
    let frames = symbolizer.frames(&profile, outer + 1);
    assert_eq!(frames.last().unwrap().function.as_deref(), Some("outer"));
    assert!(symbolizer.warnings().is_empty());
    let fresh = Symbolizer::new().frames(&profile, outer + 1);
    assert_eq!(
        fresh[0].function, None,
        "without the look-ahead, no symbols"
    );

    // The module that never loaded is warned about once, when the report uses it.
    symbolizer.frames(&profile, (1 << 40) + 0x20);
    symbolizer.frames(&profile, (1 << 40) + 0x30);
    assert_eq!(
        symbolizer.warnings().len(),
        1,
        "{:?}",
        symbolizer.warnings()
    );
    assert!(symbolizer.warnings()[0].contains("libgone.so"));
}

/// Symbolizes every address of `outer` in `library` with a cache folder `cache`; returns
/// the frames and whether the library's debug information had to be loaded.
fn frames_with_cache(library: &Path, cache: &Path) -> (Vec<Vec<Frame>>, bool) {
    let (start, end) = symbol_range(library, "outer");
    let profile = profile_with(vec![module(library, 0, 0, 1 << 40, 0)]);
    let mut symbolizer = Symbolizer::with_disk_cache(Some(cache.to_owned()));
    let frames = (start..end)
        .map(|address| symbolizer.frames(&profile, address + 1))
        .collect();
    let loaded = symbolizer.modules.iter().any(|m| m.symbols.is_some());
    symbolizer.save_disk_cache();
    (frames, loaded)
}

#[test]
fn a_second_run_is_answered_by_the_cache_folder_with_the_same_frames() {
    let dir = tempfile::tempdir().unwrap();
    let library = compile_library(dir.path());
    let cache = dir.path().join("cache");
    let (cold, loaded_cold) = frames_with_cache(&library, &cache);
    assert!(loaded_cold);
    let (warm, loaded_warm) = frames_with_cache(&library, &cache);
    assert!(!loaded_warm, "every address was in the cache folder");
    assert_eq!(warm, cold);
    assert!(cold.iter().any(|f| f.len() == 2 && f[0].inlined));

    // Rebuilt (another modification time, and here other code): another key, and the
    // frames of the new file.
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(
        dir.path().join("mwtest.c"),
        format!("int pad(int x) {{ return x * 5; }}\n{LIBRARY_SOURCE}"),
    )
    .unwrap();
    let status = Command::new("cc")
        .args(["-O2", "-g", "-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(dir.path().join("mwtest.c"))
        .status()
        .unwrap();
    assert!(status.success());
    let (rebuilt, loaded_rebuilt) = frames_with_cache(&library, &cache);
    assert!(
        loaded_rebuilt,
        "a rebuilt library is not answered from the cache"
    );
    assert_eq!(rebuilt.last().unwrap().last().unwrap().line, Some(5));
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 2);
}

#[test]
fn without_a_cache_folder_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let library = compile_library(dir.path());
    let profile = profile_with(vec![module(&library, 0, 0, 1 << 40, 0)]);
    let mut symbolizer = Symbolizer::new();
    let (start, _) = symbol_range(&library, "outer");
    symbolizer.frames(&profile, start + 1);
    symbolizer.save_disk_cache();
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}
