//! Interposed call → event (Python): finds the CPython runtime in this process at start-up —
//! its version, where the interpreter's code lies, and the function that gives a thread its
//! own thread state — so that every allocation can read the Python frames of the thread
//! that makes it. Nothing here runs Python or takes the GIL: a thread only ever reads its
//! own frames, which cannot change while it is inside a hook.

use core::ffi::c_void;
use core::sync::atomic::{AtomicPtr, Ordering};

use memwarden_abi::MODULE_MAIN;

use crate::modules::LoadedModule;
use crate::python_codes::CodeTable;
use crate::python_layout::{self, PyLayout};
use crate::real;

type ThisThreadStateFn = unsafe extern "C" fn() -> *mut c_void;

/// The Python runtime of this process.
pub struct PythonRuntime {
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
    this_thread_state: ThisThreadStateFn,
}

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
    let version_address = real::global_symbol(c"Py_Version");
    if version_address == 0 {
        // Before 3.11 there is no Py_Version; those layouts are not read either.
        return Detection::Unsupported(0);
    }
    // SAFETY: `Py_Version` is CPython's `const unsigned long`, mapped read-only.
    let version_hex = unsafe { *(version_address as *const u64) } as u32;
    let code_type = real::global_symbol(c"PyCode_Type") as u64;
    let (Some(layout), Some(eval_end)) =
        (python_layout::for_version(version_hex), function_end(eval))
    else {
        return Detection::Unsupported(version_hex);
    };
    let (true, Some(codes)) = (code_type != 0, CodeTable::new()) else {
        return Detection::Unsupported(version_hex);
    };
    let range = |module: Option<&LoadedModule>| module.map_or((0, 0), |m| (m.start, m.end));
    let library = modules.iter().find(|m| m.contains(eval));
    let executable = modules
        .iter()
        .find(|m| m.module_flags & MODULE_MAIN != 0 && is_python_executable(&m.path));
    let found = Box::new(PythonRuntime {
        layout,
        code_type,
        eval: (eval, eval_end),
        interpreter: [range(library), range(executable)],
        codes,
        // SAFETY: the symbol is CPython's `PyThreadState *PyGILState_GetThisThreadState(void)`.
        this_thread_state: unsafe {
            core::mem::transmute::<usize, ThisThreadStateFn>(this_thread_state)
        },
    });
    RUNTIME.store(Box::into_raw(found), Ordering::Release);
    Detection::Found(version_hex)
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
}
