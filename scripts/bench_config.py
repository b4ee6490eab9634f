"""Benchmark settings shared by the runner (bench.py) and the markdown writer
(bench_markdown.py): the tools, the workloads, the targets and the peers' earlier figures."""

from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench-out"
MEMWARDEN = ROOT / "target" / "release" / "memwarden"
TOOLS = ("bare", "memwarden", "heaptrack")
# memwarden with a --fail rule that never fires: only on churn, to keep runs short.
FAIL_TOOL = "memwarden-fail"
NEVER_FIRING_RULE = "nth=1000000000000"
# memwarden with heap guards (issue 4): the options of each guard tool.
GUARD_OPTIONS = {
    "memwarden-header": ["--guard", "header"],
    "memwarden-sampled": ["--guard", "sampled", "--sample-rate", "1000"],
    "memwarden-page": ["--guard", "page"],
}
EXTRA_TOOLS = {"churn": (FAIL_TOOL, "memwarden-header", "memwarden-sampled")}
# Page mode runs on its own, shorter churn, against plain memwarden on the same churn.
PAGE_WORKLOAD = "churn-page"
PAGE_CALLS = 300_000
PAGE_TOOLS = ("bare", "memwarden", "memwarden-page")

# Targets of issue 2, and heaptrack's ratios measured earlier on this kind of machine
# (shared/peers.md, heaptrack 1.4.0) for comparison.
TIME_TARGETS = {"churn": 1.5, "threads": 2.0}
RSS_TARGET = 1.3
CHURN_PROFILE_TARGET = 1 << 20
# Issue 5: fault injection configured but not firing costs at most 5% over plain memwarden.
FAIL_OVERHEAD_TARGET = 1.05
# Issue 4: header guard ≤ 1.3×, sampled page guard (1 in 1000) ≤ 1.1× plain memwarden on churn.
GUARD_TARGETS = {"memwarden-header": 1.3, "memwarden-sampled": 1.1}
HEAPTRACK_EARLIER = {"churn": 3.07, "threads": 3.65, "sqlite": 2.47}

# The Python group (issue 3). Its tools, in the order they run and are shown.
VENV = WORK / "venv"
PY_TOOLS = ("bare", "memwarden", "heaptrack", "fil", "memray", "memray-native")
PY_TOOL_NAMES = {
    "bare": "bare",
    "memwarden": "memwarden",
    "heaptrack": "heaptrack",
    "fil": "Fil",
    "memray": "Memray",
    "memray-native": "Memray `--native`",
    "memwarden-objects": "memwarden `--python-objects`",
    "memray-objects": "Memray `--trace-python-allocators`",
}
# Every Python object tracked, on the object-churn workload only: memwarden and Memray with
# the option that makes each object an allocation they see (Fil always does so).
PY_OBJECT_WORKLOAD = "pyobjects"
PY_OBJECT_TOOLS = ("memwarden-objects", "memray-objects")
# The peers from PyPI: tool -> (package, executable in the venv).
PY_PEERS = {
    "fil": ("filprofiler", "fil-profile"),
    "memray": ("memray", "memray"),
    "memray-native": ("memray", "memray"),
    "memray-objects": ("memray", "memray"),
}
# The options of each memray tool.
MEMRAY_OPTIONS = {"memray": [], "memray-native": ["--native"], "memray-objects": ["--trace-python-allocators"]}
# The Python workloads: name -> (script, wall-time target × bare, what it is).
PY_WORKLOADS = {
    "numpy": ("bench_py_numpy.py", 1.05, "NumPy compute"),
    "pyobjects": ("bench_py_objects.py", 1.5, "pure-Python object churn"),
    "imports": ("bench_py_imports.py", 1.3, "imports and compile()"),
}
# The peers' ratios measured earlier on this kind of machine (issue 3; numpy_work,
# pyobjects and compileall there), for comparison.
PY_EARLIER = {
    "numpy": {"fil": 1.11, "memray": 1.17, "memray-native": 1.19, "heaptrack": 1.38},
    "pyobjects": {"fil": 4.50, "memray": 2.34, "memray-native": 2.42, "heaptrack": 1.25},
    "imports": {"fil": 2.06, "memray": 1.37, "memray-native": 1.46, "heaptrack": 1.60},
}
SHORT_SCALE = 0.2
# Every Python run: one BLAS/OpenMP thread (as Fil forces), a fixed hash seed.
PY_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
# The /proc/PID/comm of the Python process under each tool: the venv's `python`; `memray`
# (its script runs the workload in its own process); Fil re-executes itself through ld.so.
PY_COMMS = ("python", "memray", "ld-linux-x86-64")


@dataclass
class Workload:
    name: str
    argv: list
    comm: str  # the target's /proc/PID/comm
    stdin: Path | None = None
    tools: tuple = TOOLS  # the tools run on it
    table: bool = True  # shown in the main tables (side by side with heaptrack)
    group: str = "native"  # "native" or "python"
    also_comms: tuple = ()  # other comms that are the target too (the Python group)
    env: dict = field(default_factory=dict)  # added to the environment of every run


@dataclass
class Sample:
    wall: float
    target_wall: float
    target_rss_kib: int
    other_rss_kib: int
    output_bytes: int | None = None
    contention: dict = field(default_factory=dict)
    heap_errors: int = 0
