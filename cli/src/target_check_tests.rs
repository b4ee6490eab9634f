//! Tests of the target checks on real files: programs built here with `cc` (dynamic,
//! static, static-pie), setuid copies, scripts and things that are not programs.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use super::*;

/// Compiles a trivial C program with `flags` into `dir/name`.
fn compile(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let source = dir.join("t.c");
    fs::write(&source, "int main(void) { return 0; }\n").unwrap();
    let out = dir.join(name);
    let status = Command::new("cc")
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&source)
        .status()
        .expect("these tests need a C compiler as `cc`");
    assert!(status.success(), "cc {flags:?} failed");
    out
}

fn write_script(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, text).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
    path
}

#[test]
fn a_dynamic_program_and_a_script_on_it_pass() {
    let dir = tempfile::tempdir().unwrap();
    let program = compile(dir.path(), "dyn", &[]);
    assert_eq!(check(&program), Ok(()));
    assert_eq!(linkage(&program), Ok(Linkage::Dynamic));
    let script = write_script(
        dir.path(),
        "s",
        &format!("#!{}\n", program.display()),
        0o755,
    );
    assert_eq!(check(&script), Ok(()));
    let env_script = write_script(dir.path(), "e", "#!/usr/bin/env -S sh -e\necho hi\n", 0o755);
    assert_eq!(check(&env_script), Ok(()));
}

#[test]
fn static_and_static_pie_programs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let program = compile(dir.path(), "static", &["-static"]);
    assert_eq!(linkage(&program), Ok(Linkage::Static));
    let message = check(&program).unwrap_err();
    assert_eq!(
        message,
        format!(
            "{}: statically linked: LD_PRELOAD cannot reach it; link it dynamically to profile it",
            program.display()
        )
    );
    let pie = compile(dir.path(), "static-pie", &["-static-pie"]);
    assert_eq!(linkage(&pie), Ok(Linkage::StaticPie));
    assert!(check(&pie).unwrap_err().contains("static-pie"));
    // A script whose interpreter is static is refused for its interpreter.
    let script = write_script(
        dir.path(),
        "s",
        &format!("#!{} -x\n", program.display()),
        0o755,
    );
    assert!(check(&script).unwrap_err().contains("statically linked"));
}

#[test]
fn setuid_and_setgid_programs_are_refused_but_not_mandatory_locking() {
    let dir = tempfile::tempdir().unwrap();
    let program = compile(dir.path(), "suid", &[]);
    fs::set_permissions(&program, fs::Permissions::from_mode(0o4755)).unwrap();
    assert!(check(&program).unwrap_err().contains("setuid program"));
    fs::set_permissions(&program, fs::Permissions::from_mode(0o2755)).unwrap();
    assert!(check(&program).unwrap_err().contains("setgid program"));
    fs::set_permissions(&program, fs::Permissions::from_mode(0o2745)).unwrap();
    assert_eq!(check(&program), Ok(()));
}

#[test]
fn things_that_are_not_programs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = write_script(dir.path(), "notes.txt", "not a program\n", 0o644);
    assert_eq!(
        resolve(text.as_os_str()),
        Err(format!(
            "{}: not executable (permission denied)",
            text.display()
        ))
    );
    let text_x = write_script(dir.path(), "notes-x", "not a program\n", 0o755);
    assert_eq!(
        check(&text_x),
        Err(format!(
            "{}: not an ELF executable or a #! script",
            text_x.display()
        ))
    );
    assert_eq!(
        resolve(dir.path().as_os_str()),
        Err(format!(
            "{}: is a folder, not a program",
            dir.path().display()
        ))
    );
    assert_eq!(
        resolve(OsStr::new("/nonexistent/prog")),
        Err("/nonexistent/prog: no such file".to_owned())
    );
    assert_eq!(
        resolve(OsStr::new("no-such-command-memwarden")),
        Err("no-such-command-memwarden: command not found on PATH".to_owned())
    );
    let orphan = write_script(dir.path(), "orphan", "#!/nonexistent/interp\n", 0o755);
    assert_eq!(
        check(&orphan),
        Err(format!(
            "{}: its interpreter cannot run: /nonexistent/interp: no such file",
            orphan.display()
        ))
    );
    let empty = write_script(dir.path(), "empty", "#!   \n", 0o755);
    assert!(check(&empty)
        .unwrap_err()
        .ends_with("its #! line names no interpreter"));
}

#[test]
fn scripts_that_interpret_themselves_stop() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loop");
    write_script(
        dir.path(),
        "loop",
        &format!("#!{}\n", path.display()),
        0o755,
    );
    assert!(check(&path)
        .unwrap_err()
        .ends_with("too many levels of #! interpreters"));
}

#[test]
fn commands_are_found_on_path() {
    let sh = resolve(OsStr::new("sh")).unwrap();
    assert!(sh.is_absolute() && sh.ends_with("sh"), "{}", sh.display());
}

#[test]
fn interpreter_lines() {
    let of = |line: &str| interpreter_of(line.as_bytes()).map(|p| p.to_string_lossy().into_owned());
    assert_eq!(of("/bin/sh -e\nrest").as_deref(), Some("/bin/sh"));
    assert_eq!(of(" /usr/bin/python3").as_deref(), Some("/usr/bin/python3"));
    assert_eq!(of("/usr/bin/env python3").as_deref(), Some("python3"));
    assert_eq!(of("/usr/bin/env -S perl -w").as_deref(), Some("perl"));
    assert_eq!(of("\n/bin/sh"), None);
}

#[test]
fn the_dynamic_loader_itself_is_allowed() {
    let loader = Path::new("/lib64/ld-linux-x86-64.so.2");
    if !loader.exists() {
        // Other architectures name it differently; the rule is the same.
        assert!(is_dynamic_loader(Path::new("/lib/ld-linux-aarch64.so.1")));
        return;
    }
    assert_eq!(linkage(loader), Ok(Linkage::StaticPie));
    assert_eq!(check(loader), Ok(()));
}
