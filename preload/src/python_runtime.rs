//! Interposed call → event (Python): finds the CPython runtime in this process at start-up —
//! its version, where the interpreter's code lies, and the function that gives a thread its
//! own thread state — so that every allocation can read the Python frames of the thread
//! that makes it. Nothing here runs Python or takes the GIL: a thread only ever reads its
//! own frames, which cannot change while it is inside a hook.

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicPtr, Ordering};

use memwarden_abi::MODULE_MAIN;

use crate::modules::LoadedModule;
use crate::python_codes::CodeTable;
use crate::python_frame_word::ChainOffsets;
use crate::python_layout::{self, CurrentFrame, PyLayout};
use crate::real;

type ThisThreadStateFn = unsafe extern "C" fn() -> *mut c_void;
type LineOfFn = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
type VersionFn = unsafe extern "C" fn() -> *const c_char;

/// The Python runtime of this process.
#[repr(C, align(64))]
pub struct PythonRuntime {
    /// What every capture reads first, in one cache line: the thread state's getter, and
    /// where a 3.11+ frame's fields are (made once from `layout`).
    this_thread_state: ThisThreadStateFn,
    pub chain: ChainOffsets,
    pub layout: &'static PyLayout,
    /// `&PyCode_Type`: a frame's code object is checked against it before it is read.
    pub code_type: u64,
    /// `[start, end)` of `_PyEval_EvalFrameDefault`: native frames there run Python frames.
    pub eval: (u64, u64),
    /// `[start, end)` of the modules that make up the interpreter (`libpython`, and the
    /// executable when it is `python…`): their native frames are hidden between Python ones.
    pub interpreter: [(u64, u64); 2],
    /// The code objects seen so far.
    pub codes: CodeTable,
    /// `PyCode_Addr2Line`, for Pythons whose line tables are not copied (3.9, 3.10).
    line_of: Option<LineOfFn>,
}

const _: () = assert!(core::mem::offset_of!(PythonRuntime, layout) == 64);

// Read by every hook: beside the other such words (lib.rs, "Hot words").
#[link_section = ".data.memwarden_hot"]
static RUNTIME: AtomicPtr<PythonRuntime> = AtomicPtr::new(core::ptr::null_mut());

/// The Python runtime, if this process has one memwarden can read.
#[inline(always)]
pub fn runtime() -> Option<&'static PythonRuntime> {
    // SAFETY: published once as a leaked Box, never freed.
    unsafe { RUNTIME.load(Ordering::Acquire).as_ref() }
}

/// What start-up found.
pub enum Detection {
    /// No Python in this process.
    Absent,
    /// A Python whose layout memwarden does not know: `PY_VERSION_HEX` (0 if unknown).
    Unsupported(u32),
    /// Python frames will be recorded.
    Found(u32),
}

/// Looks for CPython among the loaded modules. Called once at start-up (from the library
/// constructor, holding the guard: `dlsym` may allocate).
pub fn detect(modules: &[LoadedModule]) -> Detection {
    let eval = real::global_symbol(c"_PyEval_EvalFrameDefault") as u64;
    let this_thread_state = real::global_symbol(c"PyGILState_GetThisThreadState");
    if eval == 0 || this_thread_state == 0 {
        return Detection::Absent;
    }
    let version_hex = version_hex();
    if version_hex == 0 {
        return Detection::Unsupported(0);
    }
    let code_type = real::global_symbol(c"PyCode_Type") as u64;
    let (Some(layout), Some(eval_end)) =
        (python_layout::for_version(version_hex), function_end(eval))
    else {
        return Detection::Unsupported(version_hex);
    };
    let line_of = real::global_symbol(c"PyCode_Addr2Line");
    let old = matches!(layout.current_frame, CurrentFrame::FrameObjects { .. });
    let (true, Some(codes)) = (code_type != 0 && (line_of != 0 || !old), CodeTable::new()) else {
        return Detection::Unsupported(version_hex);
    };
    let range = |module: Option<&LoadedModule>| module.map_or((0, 0), |m| (m.start, m.end));
    let library = modules.iter().find(|m| m.contains(eval));
    let executable = modules
        .iter()
        .find(|m| m.module_flags & MODULE_MAIN != 0 && is_python_executable(&m.path));
    let found = Box::new(PythonRuntime {
        chain: ChainOffsets::of(layout),
        layout,
        code_type,
        eval: (eval, eval_end),
        interpreter: [range(library), range(executable)],
        codes,
        // SAFETY: the symbol (if found) is CPython's `int PyCode_Addr2Line(PyCodeObject *, int)`.
        line_of: (line_of != 0)
            .then(|| unsafe { core::mem::transmute::<usize, LineOfFn>(line_of) }),
        // SAFETY: the symbol is CPython's `PyThreadState *PyGILState_GetThisThreadState(void)`.
        this_thread_state: unsafe {
            core::mem::transmute::<usize, ThisThreadStateFn>(this_thread_state)
        },
    });
    RUNTIME.store(Box::into_raw(found), Ordering::Release);
    // After the runtime is published, whose code table a death marks; before Python runs.
    crate::python_code_deaths::install(code_type);
    Detection::Found(version_hex)
}

/// The runtime's `PY_VERSION_HEX`: `Py_Version` (3.11+), else parsed from
/// `Py_GetVersion()` ("3.10.13 (main, …)", taken as a final release); 0 if neither.
fn version_hex() -> u32 {
    let exported = real::global_symbol(c"Py_Version");
    if exported != 0 {
        // SAFETY: `Py_Version` is CPython's `const unsigned long`, mapped read-only.
        return unsafe { *(exported as *const u64) } as u32;
    }
    let text = real::global_symbol(c"Py_GetVersion");
    if text == 0 {
        return 0;
    }
    // SAFETY: CPython's `const char *Py_GetVersion(void)`: formats into a static buffer
    // (snprintf, no allocation) and returns it, NUL-terminated.
    let text =
        unsafe { core::ffi::CStr::from_ptr(core::mem::transmute::<usize, VersionFn>(text)()) };
    parse_version(text.to_bytes())
}

/// `"3.10.13 (main…"` → 0x030a0df0.
fn parse_version(text: &[u8]) -> u32 {
    let mut parts = text.split(|&b| b == b'.' || b == b' ').map(|part| {
        core::str::from_utf8(part)
            .ok()
            .and_then(|p| p.parse::<u32>().ok())
    });
    match (
        parts.next().flatten(),
        parts.next().flatten(),
        parts.next().flatten(),
    ) {
        (Some(major), Some(minor), Some(micro)) if major < 256 && minor < 256 && micro < 256 => {
            (major << 24) | (minor << 16) | (micro << 8) | 0xf0
        }
        _ => 0,
    }
}

/// One past the last byte of the function starting at `start`, from its symbol's size.
fn function_end(start: u64) -> Option<u64> {
    const RTLD_DL_SYMENT: libc::c_int = 1;
    // SAFETY: Dl_info is plain data dladdr1 fills; `symbol` receives a pointer into the
    // module's dynamic symbol table, which stays mapped while the module is loaded.
    unsafe {
        let mut info: libc::Dl_info = core::mem::zeroed();
        let mut symbol: *mut c_void = core::ptr::null_mut();
        if libc::dladdr1(
            start as *const c_void,
            &mut info,
            &mut symbol,
            RTLD_DL_SYMENT,
        ) == 0
            || symbol.is_null()
        {
            return None;
        }
        let size = (*symbol.cast::<libc::Elf64_Sym>()).st_size;
        (size > 0).then(|| start.saturating_add(size))
    }
}

fn is_python_executable(path: &[u8]) -> bool {
    let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    name.starts_with(b"python")
}

impl PythonRuntime {
    /// The calling thread's `PyThreadState`, null if it has none (a thread Python did not
    /// start and that never called into Python, or one whose state is gone).
    #[inline(always)]
    pub fn this_thread_state(&self) -> *mut c_void {
        // SAFETY: CPython's function takes no arguments, reads a thread-specific key and
        // allocates nothing; it answers null before initialization and after finalization.
        unsafe { (self.this_thread_state)() }
    }

    /// True if the native frame at return address `address` is running Python frames.
    #[inline(always)]
    pub fn is_eval(&self, address: u64) -> bool {
        (self.eval.0 < address) && (address <= self.eval.1)
    }

    /// True if `address` lies in the interpreter's own code.
    #[inline(always)]
    pub fn in_interpreter(&self, address: u64) -> bool {
        self.interpreter
            .iter()
            .any(|&(start, end)| (start..end).contains(&address))
    }

    /// The line `byte_offset` into `code` is on, asked of CPython (3.9, 3.10 only).
    ///
    /// # Safety
    /// `code` is a live code object.
    pub unsafe fn line_of(&self, code: u64, byte_offset: i32) -> Option<u32> {
        let line_of = self.line_of?;
        // SAFETY: CPython's function reads the code object's line table; no allocation.
        let line = unsafe { line_of(code as *mut c_void, byte_offset) };
        u32::try_from(line).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::parse_version;

    #[test]
    fn versions_from_the_version_string() {
        assert_eq!(
            parse_version(b"3.10.13 (main, Nov  1 2026) [GCC 12.2.0]"),
            0x030a0df0
        );
        assert_eq!(parse_version(b"3.9.18 (main)"), 0x030912f0);
        assert_eq!(parse_version(b"3.12.0rc1 (main)"), 0);
        assert_eq!(parse_version(b"garbage"), 0);
    }
}
