//! Apache Arrow's memory: pyarrow allocates from a mimalloc of its own, which no preload
//! can see, unless `ARROW_DEFAULT_MEMORY_POOL` is `system`. `memwarden run` sets it, so an
//! Arrow buffer is charged exactly to the Python line that made it; a pool the user chose
//! is left as chosen.

mod common;
use common::python::*;
use common::*;

const SCRIPT: &str = r#"import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def arrow_compute():
    a = pa.array(np.arange(10_000_000, dtype=np.int64))  # NUMPY_BUFFER
    b = pc.add(a, 1)  # ARROW_BUFFER
    print(pa.default_memory_pool().backend_name, pa.total_allocated_bytes())
    return a, b


kept = arrow_compute()
"#;

#[test]
fn arrow_buffers_are_seen_at_the_line_that_made_them() {
    let Some(python) = venv_python("numpy, pyarrow") else {
        return;
    };
    let scratch = Scratch::new("python_arrow");
    let script = Script::new(&scratch, "arrow.py", SCRIPT);
    let run = run_script(&scratch, &python, &script, &[], &[]);
    assert_success(&run.outcome, "the script under memwarden");
    assert_eq!(run.outcome.stdout_text(), "system 80000000\n");
    let process = run.report.main_process(&script);
    let about = process.describe(&script);

    // pyarrow wraps the NumPy buffer without a copy: NumPy data, through the handler.
    let numpy_line = script.line_of("# NUMPY_BUFFER");
    let numpy: u64 = process
        .numpy_stacks_at(&script, numpy_line)
        .map(|s| s.at_peak_bytes)
        .sum();
    // NumPy's few bytes of shape and scalars beside the data are allowed for.
    assert!(
        (80_000_000..80_001_024).contains(&numpy),
        "{numpy}: {about}"
    );
    // The sum is a new Arrow buffer: 80,000,000 bytes from malloc, through Arrow's pool.
    // Beside it, a few kilobytes of Arrow's own bookkeeping come from the same line.
    let arrow_line = script.line_of("# ARROW_BUFFER");
    let largest = process
        .stacks_at(&script, arrow_line)
        .max_by_key(|s| s.at_peak_bytes)
        .unwrap_or_else(|| panic!("nothing at line {arrow_line}: {about}"));
    assert_eq!(largest.at_peak_bytes, 80_000_000, "{about}");
    assert_eq!(largest.allocations, 1, "{about}");
    assert_eq!(largest.category.as_deref(), Some("native"), "{about}");
}

#[test]
fn a_pool_the_user_chose_is_left_alone() {
    let Some(python) = venv_python("numpy, pyarrow") else {
        return;
    };
    let scratch = Scratch::new("python_arrow_chosen");
    let script = Script::new(&scratch, "arrow.py", SCRIPT);
    let chosen = [("ARROW_DEFAULT_MEMORY_POOL", "mimalloc")];
    let run = run_script(&scratch, &python, &script, &[], &chosen);
    assert_success(&run.outcome, "the script under memwarden");
    assert_eq!(run.outcome.stdout_text(), "mimalloc 80000000\n");
    let process = run.report.main_process(&script);
    let arrow_line = script.line_of("# ARROW_BUFFER");
    assert_eq!(
        process.at_peak_at(&script, arrow_line),
        0,
        "Arrow's own mimalloc is out of sight: {}",
        process.describe(&script)
    );
}
