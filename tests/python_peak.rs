//! Known answers for a Python script: NumPy arrays of known sizes, made in known functions
//! at known lines and alive together at the peak, are charged to their lines exactly (the
//! data goes through memwarden's handler, category `numpy`); an array freed before the
//! peak is absent from it; NumPy's small-buffer cache hides no allocation; a native
//! `malloc` called through ctypes is seen with its Python caller; a `threading.Thread`'s
//! array is charged to the thread function's line.

mod common;
use common::python::*;
use common::*;

const SCRIPT: &str = r#"import ctypes
import threading
import numpy as np

kept = []


def make_temporary():
    t = np.full(250_000, 7.0)  # TEMPORARY
    return float(t.sum())


def make_ones():
    kept.append(np.ones(1_000_000))  # ONES


def make_zeros():
    kept.append(np.zeros((1000, 500)))  # ZEROS


def native_malloc():
    malloc = ctypes.CDLL(None).malloc
    malloc.restype = ctypes.c_void_p
    malloc.argtypes = [ctypes.c_size_t]
    kept.append(malloc(12345))  # CTYPES


def small_arrays():
    for _ in range(100):
        a = np.empty(10)  # SMALL
        del a


def in_thread():
    kept.append(np.ones(300_000))  # THREAD


make_temporary()
small_arrays()
make_ones()
make_zeros()
native_malloc()
worker = threading.Thread(target=in_thread)
worker.start()
worker.join()
kept.clear()
print("done")
"#;

/// NumPy's own bytes beside an array's data at the line that makes it (its shape and
/// strides, a 0-d temporary), at most.
const ARRAY_OVERHEAD: u64 = 1024;

#[test]
fn arrays_alive_at_the_peak_are_charged_to_their_lines_exactly() {
    let Some(python) = venv_python("numpy") else {
        return;
    };
    let scratch = Scratch::new("python_peak");
    let script = Script::new(&scratch, "peak.py", SCRIPT);
    let run = run_script(&scratch, &python, &script, &[], &[]);
    assert_success(&run.outcome, "the script under memwarden");
    assert_eq!(run.outcome.stdout_text(), "done\n");
    let process = run.report.main_process(&script);
    let about = process.describe(&script);

    let known = [
        ("# ONES", "make_ones", 8_000_000),
        ("# ZEROS", "make_zeros", 4_000_000),
        ("# THREAD", "in_thread", 2_400_000),
    ];
    for (marker, function, bytes) in known {
        let line = script.line_of(marker);
        let data: Vec<&PyStack> = process.numpy_stacks_at(&script, line).collect();
        let arrays: Vec<&&PyStack> = data
            .iter()
            .filter(|s| (s.allocations, s.allocated_bytes, s.at_peak_bytes) == (1, bytes, bytes))
            .collect();
        assert_eq!(
            arrays.len(),
            1,
            "one array of {bytes} bytes at {marker}\n{about}"
        );
        let frame = frame_in(&arrays[0].frames, &script).expect("frame in the script");
        assert_eq!(frame.function.as_deref(), Some(function), "{about}");
        // Beside it, only NumPy's small temporaries (`np.ones` fills through a 0-d array).
        let numpy: u64 = data.iter().map(|s| s.at_peak_bytes).sum();
        assert!(
            numpy < bytes + ARRAY_OVERHEAD,
            "NumPy data at {marker}: {numpy}\n{about}"
        );
        let everything = process.at_peak_at(&script, line);
        assert!(
            everything >= bytes && everything < bytes + ARRAY_OVERHEAD,
            "all bytes at the peak at {marker}: {everything}\n{about}"
        );
    }

    // Made, used and freed before the peak: allocated exactly, absent at the peak.
    let temporary = script.line_of("# TEMPORARY");
    let data: Vec<&PyStack> = process.numpy_stacks_at(&script, temporary).collect();
    let arrays = data
        .iter()
        .filter(|s| (s.allocations, s.allocated_bytes) == (1, 2_000_000))
        .count();
    assert_eq!(arrays, 1, "one array of 2,000,000 bytes\n{about}");
    assert_eq!(
        data.iter().map(|s| s.at_peak_bytes).sum::<u64>(),
        0,
        "{about}"
    );

    // NumPy's cache of small buffers belongs to its default functions, which memwarden's
    // replaced: each of the 100 small arrays is an allocation of its own.
    let small = script.line_of("# SMALL");
    let data: Vec<&PyStack> = process.numpy_stacks_at(&script, small).collect();
    assert_eq!(
        (
            data.iter().map(|s| s.allocations).sum::<u64>(),
            data.iter().map(|s| s.allocated_bytes).sum::<u64>(),
            data.iter().map(|s| s.at_peak_bytes).sum::<u64>(),
        ),
        (100, 8000, 0),
        "{about}"
    );

    // libc's malloc through ctypes: one native block, never freed, under its Python caller.
    let ctypes_line = script.line_of("# CTYPES");
    let native: Vec<&PyStack> = process
        .stacks_at(&script, ctypes_line)
        .filter(|s| s.allocated_bytes == 12345)
        .collect();
    assert_eq!(native.len(), 1, "one stack of the ctypes malloc\n{about}");
    let stack = native[0];
    assert_eq!(
        (stack.allocations, stack.at_peak_bytes, stack.live_bytes),
        (1, 12345, 12345),
        "{about}"
    );
    assert_eq!(stack.category.as_deref(), Some("native"), "{about}");
    let frame = frame_in(&stack.frames, &script).expect("frame in the script");
    assert_eq!(frame.function.as_deref(), Some("native_malloc"));

    assert!(
        process.peak_bytes >= 8_000_000 + 4_000_000 + 2_400_000 + 12345,
        "{about}"
    );

    // The process's NumPy figures: the three arrays (and temporaries) at the peak, and the
    // NumPy flame graph's line for the first of them.
    let numpy = process.numpy.as_ref().expect("a numpy summary");
    let numpy_peak = numpy["peak_bytes"].as_u64().expect("numpy.peak_bytes");
    let known = 8_000_000 + 4_000_000 + 2_400_000;
    assert!(
        numpy_peak >= known && numpy_peak < known + ARRAY_OVERHEAD,
        "numpy.peak_bytes {numpy_peak}\n{about}"
    );
    let folded = std::fs::read_to_string(run.dir.join("numpy-peak.folded")).expect("folded");
    let ones = format!("peak.py:{} (make_ones)", script.line_of("# ONES"));
    assert!(
        folded
            .lines()
            .any(|l| l.contains(&ones) && l.ends_with(" 8000000")),
        "no line with {ones} and 8000000 bytes in numpy-peak.folded:\n{folded}"
    );
}
