#!/usr/bin/env python3
"""Benchmarks memwarden side by side with the bare run and heaptrack, and writes
docs/benchmarks.md. Not a test: figures depend on the machine and its load.

For each workload (bench/churn.c, bench/threads.c, the sqlite3 shell on a generated
script) it runs bare, under `memwarden run` and under `heaptrack`, interleaved, N times
each, and takes medians of:
- wall time, as a ratio to the bare run of the same benchmark run, for the whole command
  and for the target process alone (from its start to its exit, measured inside it);
- peak RSS of the target process itself (VmHWM, reported at exit by a tiny preloaded
  library, bench/hwm.c, so it is the target's and not the profiler's CLI or helper), and
  of the largest other process of the run (memwarden's CLI, heaptrack_interpret);
- profile size on disk (memwarden: blocks used by DIR/raw, which is sparse; heaptrack:
  its compressed .zst file);
- memwarden's contention counters on the threads workload;
- on churn only, memwarden with a fault-injection rule configured that never fires
  (`--fail nth=1000000000000`), as a ratio to the plain memwarden run: the cost of having
  injection on;
- on churn only, memwarden with heap guards (`--guard header`, `--guard sampled
  --sample-rate 1000`), as ratios to the plain memwarden run; and `--guard page` on a
  shorter churn (PAGE_CALLS calls, since every block then costs pages and system calls),
  against plain memwarden on the same shorter churn, time and peak RSS.

Python group (issue 3): three Python workloads (scripts/bench_py_numpy.py, a NumPy compute
workload; scripts/bench_py_objects.py, pure-Python object churn; scripts/bench_py_imports.py,
imports and compile()), each run bare, under memwarden, heaptrack, Fil (`fil-profile run`),
Memray (`memray run`) and Memray with `--native`, interleaved like the native ones, with the
same medians (wall time of the whole command and of the Python process alone, peak RSS of
the Python process, profile size). Fil, Memray and NumPy are installed from PyPI into a venv
of their own (bench-out/venv, made with the Python that runs this script); a peer that cannot
be installed is left out, with a note in the results. BLAS and OpenMP are held to one thread
in every Python run (Fil forces that for itself, so all tools get the same).

Usage: scripts/bench.py [--quick] [--runs N] [--only native|python] [--short] [--out FILE]
(scripts/bench.sh builds first). `--only` runs one group and rewrites only that group's part
of the markdown file, keeping the other's from the file as it was. `--short` shrinks the
Python workloads to a fifth, to check the script end to end (their figures then mean little).
Standard library only.
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
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
}
# The peers from PyPI: tool -> (package, executable in the venv).
PY_PEERS = {"fil": ("filprofiler", "fil-profile"), "memray": ("memray", "memray"), "memray-native": ("memray", "memray")}
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


def sh(*argv, **kw):
    return subprocess.run(argv, check=True, text=True, capture_output=True, **kw).stdout.strip()


class RunFailed(Exception):
    def __init__(self, message, log=None):
        super().__init__(message)
        self.log = log  # the failed run's stderr, kept in bench-out/


def build(groups=("native",)) -> tuple[list, Path]:
    """Compiles the workloads and the RSS probe into bench-out/, writes the SQL script."""
    WORK.mkdir(exist_ok=True)
    bench = ROOT / "bench"
    sh("gcc", "-O2", "-Wall", "-shared", "-fPIC", "-o", str(WORK / "libmwbench_hwm.so"), str(bench / "hwm.c"))
    if "native" not in groups:
        return [], WORK / "libmwbench_hwm.so"
    flags = ["-O2", "-g", "-Wall", "-pthread"]
    sh("gcc", *flags, "-o", str(WORK / "churn"), str(bench / "churn.c"))
    sh("gcc", *flags, "-o", str(WORK / "threads"), str(bench / "threads.c"))
    sql = WORK / "sqlite.sql"
    with open(sql, "w") as f:
        subprocess.run([sys.executable, str(bench / "sqlite_script.py")], stdout=f, check=True)
    workloads = [
        Workload("churn", [str(WORK / "churn")], "churn", tools=TOOLS + EXTRA_TOOLS["churn"]),
        Workload("threads", [str(WORK / "threads")], "threads"),
        Workload("sqlite", [shutil.which("sqlite3") or "sqlite3", ":memory:"], "sqlite3", sql),
        Workload(PAGE_WORKLOAD, [str(WORK / "churn"), str(PAGE_CALLS)], "churn", tools=PAGE_TOOLS, table=False),
    ]
    return workloads, WORK / "libmwbench_hwm.so"


def disk_usage(path: Path) -> int:
    """Bytes of disk blocks used (files may be sparse), as `du` counts them."""
    return int(sh("du", "-s", "--block-size=1", str(path)).split()[0])


def contention(report: Path) -> dict:
    try:
        processes = json.loads(report.read_text())["processes"]
    except (OSError, ValueError, KeyError):
        return {}
    totals = {}
    for p in processes:
        for key, value in (p.get("contention") or {}).items():
            if isinstance(value, (int, float)):
                totals[key] = totals.get(key, 0) + value
        # Every allocation and free is one accounting event (one lock and one CAS).
        counts = p.get("totals") or {}
        events = counts.get("allocations", 0) + counts.get("frees", 0)
        totals["events"] = totals.get("events", 0) + events
    return totals


def heap_errors(report: Path) -> int:
    """Heap errors the guards found over every process (a benchmark must have none)."""
    try:
        processes = json.loads(report.read_text())["processes"]
    except (OSError, ValueError, KeyError):
        return 0
    return sum(p.get("error_count", 0) for p in processes)


def run_once(tool: str, w: Workload, probe: Path, n: int) -> Sample:
    tag = f"{w.name}-{tool}-{n}"
    hwm_file = WORK / f"{tag}.hwm"
    err_file = WORK / f"{tag}.stderr"
    out_dir = WORK / f"{tag}.mw"
    ht_base = WORK / f"{tag}.heaptrack"
    for stale in (hwm_file, err_file):
        stale.unlink(missing_ok=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    memray_out = WORK / f"{tag}.memray.bin"
    memray_out.unlink(missing_ok=True)
    memwarden_options = {"memwarden": [], FAIL_TOOL: ["--fail", NEVER_FIRING_RULE], **GUARD_OPTIONS}
    if tool == "bare":
        argv = w.argv
    elif tool == "heaptrack":
        argv = ["heaptrack", "-o", str(ht_base), *w.argv]
    elif tool == "fil":  # w.argv is [python, script, args...]
        argv = [str(VENV / "bin" / "fil-profile"), "-o", str(out_dir), "--no-browser", "run", *w.argv[1:]]
    elif tool in ("memray", "memray-native"):
        native = ["--native"] if tool == "memray-native" else []
        argv = [str(VENV / "bin" / "memray"), "run", *native, "-o", str(memray_out), *w.argv[1:]]
    else:
        argv = [str(MEMWARDEN), "run", "-o", str(out_dir), *memwarden_options[tool], "--", *w.argv]
    env = dict(os.environ, LD_PRELOAD=str(probe), MWBENCH_HWM_FILE=str(hwm_file), **w.env)
    stdin = open(w.stdin) if w.stdin else subprocess.DEVNULL
    with open(err_file, "w") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.DEVNULL, stderr=err, env=env)
        _, status, _ = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
    if w.stdin:
        stdin.close()
    if proc.returncode != 0:
        tail = err_file.read_text(errors="replace")[-2000:]
        raise RunFailed(f"bench: {tool} on {w.name} exited {proc.returncode}:\n{tail}", err_file)
    target, target_wall, other = 0, 0.0, 0
    if not hwm_file.exists():
        raise RunFailed(f"bench: {tool} on {w.name}: no process reported its peak RSS (was the probe preloaded?)")
    for line in hwm_file.read_text().splitlines():
        _pid, rest = line.split(" ", 1)
        comm, kib, micros = rest.rsplit(" ", 2)
        if comm == w.comm or comm in w.also_comms:
            target = max(target, int(kib))
            target_wall = max(target_wall, int(micros) / 1e6)
        else:
            other = max(other, int(kib))
    sample = Sample(wall, target_wall, target, other)
    if tool.startswith("memwarden"):
        sample.output_bytes = disk_usage(out_dir / "raw")
        sample.contention = contention(out_dir / "report.json")
        sample.heap_errors = heap_errors(out_dir / "report.json")
        if sample.heap_errors:
            raise SystemExit(f"bench: {tool} on {w.name} found {sample.heap_errors} heap errors (see {out_dir})")
        shutil.rmtree(out_dir, ignore_errors=True)
    elif tool == "heaptrack":
        files = [p for p in WORK.glob(f"{ht_base.name}.*")]
        sample.output_bytes = sum(p.stat().st_size for p in files)
        for p in files:
            p.unlink()
    elif tool == "fil":
        sample.output_bytes = disk_usage(out_dir) if out_dir.exists() else None
        shutil.rmtree(out_dir, ignore_errors=True)
    elif tool.startswith("memray"):
        sample.output_bytes = memray_out.stat().st_size if memray_out.exists() else None
        memray_out.unlink(missing_ok=True)
    hwm_file.unlink()
    err_file.unlink()
    return sample


def venv_python_ok(python: Path) -> bool:
    """The venv's Python runs and is the version of the Python running this script."""
    want = "%d.%d" % sys.version_info[:2]
    try:
        got = subprocess.run(
            [str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, timeout=60,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return False
    return got == want


def pip_install(python: Path, packages, log: Path) -> str | None:
    """Installs packages from PyPI into the venv; None, or the last line pip said on failure."""
    with open(log, "a") as f:
        f.write(f"\n$ pip install {' '.join(packages)}\n")
        f.flush()
        proc = subprocess.run(
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--quiet", *packages],
            stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
    if proc.returncode == 0:
        return None
    lines = [l.strip() for l in log.read_text(errors="replace").splitlines() if l.strip()]
    return lines[-1] if lines else f"pip exited {proc.returncode}"


def python_env(notes: list) -> tuple[Path, set]:
    """Makes bench-out/venv with NumPy, Fil (filprofiler) and Memray from PyPI, each installed
    on its own so that one that fails leaves the others. Returns the venv's Python and the
    peer tools that are there; a peer that is not gets a line in notes. No NumPy, no group."""
    python = VENV / "bin" / "python"
    log = WORK / "venv-install.log"
    log.unlink(missing_ok=True)
    if not venv_python_ok(python):
        shutil.rmtree(VENV, ignore_errors=True)
        print(f"bench: making {VENV} with {sys.executable}", flush=True)
        made = subprocess.run([sys.executable, "-m", "venv", str(VENV)], capture_output=True, text=True)
        if made.returncode != 0:
            raise SystemExit(f"bench: `{sys.executable} -m venv {VENV}` failed:\n{made.stderr[-2000:]}")

    def has(module):
        return subprocess.run([str(python), "-c", f"import {module}"], capture_output=True).returncode == 0

    if not has("numpy"):
        print("bench: installing NumPy into the venv", flush=True)
        failed = pip_install(python, ["numpy"], log)
        if failed:
            raise SystemExit(f"bench: NumPy could not be installed from PyPI ({failed}); see {log}")
    installed = set()
    for package, module, tools in (("filprofiler", "filprofiler", ("fil",)), ("memray", "memray", ("memray", "memray-native"))):
        exe = VENV / "bin" / PY_PEERS[tools[0]][1]
        if not (exe.exists() and has(module)):
            print(f"bench: installing {package} into the venv", flush=True)
            failed = pip_install(python, [package], log)
            if failed or not exe.exists():
                name = PY_TOOL_NAMES[tools[0]]
                notes.append(
                    f"{name} (`{package}`) could not be installed from PyPI ({failed or f'no {exe.name} after install'}), "
                    "so it was left out of this run."
                )
                continue
        installed.update(tools)
    return python, installed


def python_versions(python: Path) -> dict:
    code = (
        "import json, sys, importlib.metadata as m\n"
        "out = {'Python': sys.version.split()[0]}\n"
        "for name, dist in (('NumPy', 'numpy'), ('Fil', 'filprofiler'), ('Memray', 'memray')):\n"
        "    try:\n"
        "        out[name] = m.version(dist)\n"
        "    except m.PackageNotFoundError:\n"
        "        pass\n"
        "print(json.dumps(out))\n"
    )
    try:
        return json.loads(sh(str(python), "-c", code))
    except (subprocess.CalledProcessError, ValueError):
        return {}


def python_workloads(python: Path, peers: set, scale: float) -> list:
    tools = tuple(t for t in PY_TOOLS if t not in PY_PEERS or t in peers)
    return [
        Workload(
            name,
            [str(python), str(ROOT / "scripts" / script), f"{scale:g}"],
            "python",
            tools=tools,
            group="python",
            also_comms=PY_COMMS,
            env=PY_ENV,
        )
        for name, (script, _target, _what) in PY_WORKLOADS.items()
    ]


def median(values):
    return statistics.median(values) if values else None


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kib = int(next(l for l in open("/proc/meminfo") if l.startswith("MemTotal")).split()[1])
    except (OSError, StopIteration, ValueError):
        mem_kib = 0
    return f"{os.cpu_count()} cores ({cpu}), {mem_kib / 2**20:.0f} GiB, Linux {platform.release()}"


def versions() -> str:
    def first_line(*argv):
        try:
            return subprocess.run(argv, capture_output=True, text=True).stdout.splitlines()[0].strip()
        except (OSError, IndexError):
            return "unknown"

    rev = first_line("git", "-C", str(ROOT), "describe", "--always", "--dirty")
    return (
        f"memwarden {rev}; {first_line('heaptrack', '--version')}; "
        f"sqlite3 {first_line('sqlite3', '-version').split(' ')[0]}; {first_line('gcc', '--version')}"
    )


def fmt_ratio(x):
    return "–" if x is None else f"{x:.2f}×"


def fmt_bytes(n):
    if n is None:
        return "–"
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def guard_lines(workloads, samples) -> tuple[list, list]:
    """The heap-guard rows of the targets table, and the heap-guard section: each guard mode
    on churn as a ratio to plain memwarden on the same churn (whole command, target alone,
    target peak RSS)."""

    def med(name, tool, attr):
        return median([getattr(s, attr) for s in samples.get(name, {}).get(tool, [])])

    def over_plain(name, tool, attr):
        value, base = med(name, tool, attr), med(name, "memwarden", attr)
        return None if value is None or not base else value / base

    churn = next(w for w in workloads if w.name == "churn")
    modes = [(tool, "churn", " ".join(GUARD_OPTIONS[tool])) for tool in churn.tools if tool in GUARD_OPTIONS]
    if any(w.name == PAGE_WORKLOAD for w in workloads):
        modes.append(("memwarden-page", PAGE_WORKLOAD, " ".join(GUARD_OPTIONS["memwarden-page"])))
    modes = [m for m in modes if samples.get(m[1], {}).get(m[0])]
    if not modes:
        return [], []
    rows = []
    for tool, name, options in modes:
        limit = GUARD_TARGETS.get(tool)
        if limit is not None:
            value = over_plain(name, tool, "wall")
            met = "yes" if value is not None and value <= limit else "**no**"
            rows.append(f"| churn with `{options}` ≤ {limit}× plain memwarden | {fmt_ratio(value)} | {met} |")
    section = [
        "",
        "## Heap guards (churn)",
        "",
        "Each guard mode against plain memwarden (profiling only) on the same churn; the page "
        f"mode runs on a shorter churn of {PAGE_CALLS:,} calls (both it and its plain run), since "
        "each of its blocks costs at least two pages of address space, one of memory, and "
        "system calls to map and protect them. No run found a heap error.",
        "",
        "| mode | churn calls | memwarden, whole command | × memwarden, whole command | "
        "× memwarden, target alone | target peak RSS | × memwarden, peak RSS |",
        "|---|---|---|---|---|---|---|",
    ]
    for tool, name, options in modes:
        calls = f"{PAGE_CALLS:,}" if name == PAGE_WORKLOAD else "3,000,000"
        section.append(
            f"| `{options}` | {calls} | {med(name, 'memwarden', 'wall'):.2f} s | "
            f"{fmt_ratio(over_plain(name, tool, 'wall'))} | {fmt_ratio(over_plain(name, tool, 'target_wall'))} | "
            f"{fmt_bytes(med(name, tool, 'target_rss_kib') * 1024)} | "
            f"{fmt_ratio(over_plain(name, tool, 'target_rss_kib'))} |"
        )
    return rows, section


def native_markdown(all_workloads, samples, runs: int) -> str:
    workloads = [w for w in all_workloads if w.table]

    def med(w, tool, attr):
        return median([getattr(s, attr) for s in samples[w.name][tool]])

    def ratio(w, tool, attr):
        base = med(w, "bare", attr)
        value = med(w, tool, attr)
        return None if not base or value is None else value / base

    today = datetime.date.today().isoformat()
    lines = [
        "# Benchmarks",
        "",
        f"Measured {today} by `scripts/bench.sh` ({runs} run{'s' if runs > 1 else ''} of each tool on each "
        "workload, interleaved; medians). These are measurements, not tests: the machine is shared "
        "and noisy, so compare only ratios taken side by side in one run. The Python workloads, beside Fil and "
        "Memray, are in [Python](#python) below (`scripts/bench.sh --only native|python` runs one group and "
        "keeps the other's figures).",
        "",
        f"- Machine: {machine()}",
        f"- Versions: {versions()}",
        "- Workloads (`bench/`): **churn**, one thread making 3 million malloc/calloc/realloc/"
        "posix_memalign/free calls of 16 B–4 KiB with about 45,000 blocks live; **threads**, the same churn "
        "on two threads (1.5 million calls each), every eighth block freed by the other thread; **sqlite**, "
        "`sqlite3 :memory:` running a generated script of 200,000 inserts and 22,000 queries.",
        "",
        "## Wall time, × bare",
        "",
        "| workload | bare | memwarden | heaptrack | memwarden, target alone | heaptrack, target alone "
        "| memwarden target | heaptrack earlier |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w in workloads:
        target = TIME_TARGETS.get(w.name)
        lines.append(
            f"| {w.name} | {med(w, 'bare', 'wall'):.2f} s | {fmt_ratio(ratio(w, 'memwarden', 'wall'))} | "
            f"{fmt_ratio(ratio(w, 'heaptrack', 'wall'))} | {fmt_ratio(ratio(w, 'memwarden', 'target_wall'))} | "
            f"{fmt_ratio(ratio(w, 'heaptrack', 'target_wall'))} | {'≤ ' + fmt_ratio(target) if target else '–'} | "
            f"{fmt_ratio(HEAPTRACK_EARLIER.get(w.name))} |"
        )
    lines += [
        "",
        "The first two ratios are of the whole command, as a user waits for it: memwarden's includes "
        "building the report and flamegraphs after the target exits; heaptrack's includes interpreting "
        "and compressing its trace (its default mode). The \"target alone\" ratios time the target "
        "process from its start to its exit, measured inside it, against the bare process timed the same "
        "way. The targets apply to the whole command.",
        "",
        "## Peak RSS of the target process, × bare",
        "",
        "| workload | bare | memwarden | heaptrack | memwarden's CLI | heaptrack's helper |",
        "|---|---|---|---|---|---|",
    ]
    rss_ratios = []
    for w in workloads:
        mw = ratio(w, "memwarden", "target_rss_kib")
        rss_ratios.append(mw)
        lines.append(
            f"| {w.name} | {fmt_bytes(med(w, 'bare', 'target_rss_kib') * 1024)} | {fmt_ratio(mw)} | "
            f"{fmt_ratio(ratio(w, 'heaptrack', 'target_rss_kib'))} | "
            f"{fmt_bytes(med(w, 'memwarden', 'other_rss_kib') * 1024)} | "
            f"{fmt_bytes(med(w, 'heaptrack', 'other_rss_kib') * 1024)} |"
        )
    lines += [
        "",
        "The last two columns are the peak RSS of the largest process of the run other than the target: "
        "memwarden's CLI (which waits, then builds the report) and heaptrack_interpret (which runs "
        f"alongside the target). Target: the target's peak RSS ≤ {RSS_TARGET}× bare.",
        "",
        "## Profile size on disk",
        "",
        "| workload | memwarden (`DIR/raw`, blocks used) | heaptrack (`.zst`) |",
        "|---|---|---|",
    ]
    for w in workloads:
        lines.append(
            f"| {w.name} | {fmt_bytes(med(w, 'memwarden', 'output_bytes'))} | "
            f"{fmt_bytes(med(w, 'heaptrack', 'output_bytes'))} |"
        )
    threads = next((w for w in workloads if w.name == "threads"), None)
    lines += ["", "## Contention (memwarden, threads workload)", ""]
    counters = [s.contention for s in samples["threads"]["memwarden"]] if threads else []
    if counters and any(counters):
        keys = sorted({k for c in counters for k in c} - {"events"})
        events = median([c.get("events", 0) for c in counters])
        lines += [
            "Locking strategy (docs/design.md): a spin lock per stack record and one 128-bit",
            "compare-and-swap on the process's `(live, peak)` pair per event; no process-wide lock.",
            f"Events (allocations + frees) per run: {events:.0f}.",
            "",
            "| counter | median over runs | share of events |",
            "|---|---|---|",
        ]
        for k in keys:
            value = median([c.get(k, 0) for c in counters])
            share = f"{100 * value / events:.2f}%" if events else "–"
            lines.append(f"| `{k}` | {value:.0f} | {share} |")
    else:
        lines.append("report.json had no `processes[].contention` figures in this run.")
    churn = next(w for w in workloads if w.name == "churn")
    checks = [
        (f"churn wall time ≤ {TIME_TARGETS['churn']}× bare", ratio(churn, "memwarden", "wall"), TIME_TARGETS["churn"]),
        (f"threads wall time ≤ {TIME_TARGETS['threads']}× bare", ratio(threads, "memwarden", "wall"), TIME_TARGETS["threads"]),
        (f"target peak RSS ≤ {RSS_TARGET}× bare (worst workload)", max(r for r in rss_ratios if r), RSS_TARGET),
    ]
    lines += ["", "## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for what, value, limit in checks:
        lines.append(f"| {what} | {fmt_ratio(value)} | {'yes' if value <= limit else '**no**'} |")
    size = med(churn, "memwarden", "output_bytes")
    met = "yes" if size < CHURN_PROFILE_TARGET else "**no**"
    lines.append(f"| churn profile < 1 MiB | {fmt_bytes(size)} | {met} |")
    fail_ratio, fail_section = None, []
    if samples["churn"].get(FAIL_TOOL):
        fail_ratio = med(churn, FAIL_TOOL, "wall") / med(churn, "memwarden", "wall")
        met = "yes" if fail_ratio <= FAIL_OVERHEAD_TARGET else "**no**"
        lines.append(
            f"| churn with `--fail` configured, not firing ≤ {FAIL_OVERHEAD_TARGET}× plain memwarden "
            f"| {fmt_ratio(fail_ratio)} | {met} |"
        )
        target_ratio = med(churn, FAIL_TOOL, "target_wall") / med(churn, "memwarden", "target_wall")
        fail_section = [
            "",
            "## Fault injection configured, not firing (churn)",
            "",
            f"`memwarden run --fail {NEVER_FIRING_RULE}`: the rule is checked at every allocation (it "
            "applies to all of them) but never fires, so this is what having fault injection on costs.",
            "",
            "| | whole command | target alone |",
            "|---|---|---|",
            f"| memwarden, × bare | {fmt_ratio(ratio(churn, 'memwarden', 'wall'))} | "
            f"{fmt_ratio(ratio(churn, 'memwarden', 'target_wall'))} |",
            f"| memwarden `--fail`, × bare | {fmt_ratio(ratio(churn, FAIL_TOOL, 'wall'))} | "
            f"{fmt_ratio(ratio(churn, FAIL_TOOL, 'target_wall'))} |",
            f"| memwarden `--fail`, × memwarden | {fmt_ratio(fail_ratio)} | {fmt_ratio(target_ratio)} |",
        ]
    guard_rows, guard_section = guard_lines(all_workloads, samples)
    lines += guard_rows + fail_section + guard_section
    return "\n".join(lines) + "\n"


PY_SECTION = "\n## Python\n"


def python_markdown(workloads, samples, runs: int, versions: dict, notes: list, failures: dict, scale: float) -> str:
    """The Python section of docs/benchmarks.md: every tool's medians as ratios to bare."""

    def med(w, tool, attr):
        values = [getattr(s, attr) for s in samples[w.name].get(tool, [])]
        values = [v for v in values if v is not None]
        return median(values)

    def ratio(w, tool, attr):
        base, value = med(w, "bare", attr), med(w, tool, attr)
        return None if not base or value is None else value / base

    def cell(w, tool, attr):
        if (w.name, tool) in failures:
            return "failed"
        if tool not in w.tools:
            return "–"
        return fmt_ratio(ratio(w, tool, attr))

    def size(w, tool):
        if (w.name, tool) in failures:
            return "failed"
        return fmt_bytes(med(w, tool, "output_bytes")) if tool in w.tools else "–"

    tools = [t for t in PY_TOOLS[1:] if any(t in w.tools for w in workloads)]
    header = "| workload | bare | " + " | ".join(PY_TOOL_NAMES[t] for t in tools) + " |"
    rule = "|---|---|" + "---|" * len(tools)

    def bare_cell(w, attr, unit):
        value = med(w, "bare", attr)
        if value is None:
            return "failed"
        return f"{value:.2f} s" if unit == "s" else fmt_bytes(value * 1024)

    today = datetime.date.today().isoformat()
    short = (
        f", with the workloads shortened to {scale:g} of their size (`--short`), so start-up weighs more "
        "than in a full run"
        if scale != 1.0
        else ""
    )
    vers = ", ".join(f"{k} {v}" for k, v in versions.items() if k in ("Python", "NumPy"))
    peers = "; ".join(
        f"{label} {versions[k]}" for k, label in (("Fil", "Fil (filprofiler)"), ("Memray", "Memray")) if k in versions
    )
    rev = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True)
    heaptrack = subprocess.run(["heaptrack", "--version"], capture_output=True, text=True).stdout.strip()
    lines = [
        "## Python",
        "",
        f"Measured {today} by `scripts/bench.sh` ({runs} run{'s' if runs > 1 else ''} of each tool on each "
        f"workload, interleaved; medians){short}. As above, compare only ratios taken side by side in one run."
        + (
            " With so few runs, these figures show that the script works rather than measure anything."
            if runs < 3
            else ""
        ),
        "",
        f"- Versions: {vers}; memwarden {rev.stdout.strip() or 'unknown'}; {heaptrack or 'heaptrack unknown'}"
        + (f"; {peers}" if peers else "")
        + ". Fil and Memray are installed from PyPI by the script, into `bench-out/venv` beside NumPy.",
        "- Commands, each with the venv's `python`: `python SCRIPT`; `memwarden run -o DIR -- python SCRIPT`; "
        "`heaptrack -o FILE python SCRIPT`; `fil-profile -o DIR --no-browser run SCRIPT`; "
        "`memray run -o FILE.bin SCRIPT`; `memray run --native -o FILE.bin SCRIPT`. Every run has one BLAS and "
        "OpenMP thread (`OPENBLAS_NUM_THREADS=1` and the like: Fil forces that in its own process, so every "
        "tool gets the same) and `PYTHONHASHSEED=0`.",
        "- Workloads (`scripts/bench_py_*.py`): **numpy**, NumPy compute: matrix products, element-wise ufuncs "
        "with their temporaries, reductions, sorting, boolean and fancy indexing on arrays of 1–9 MiB, and a "
        "stream of 4 KiB vectors; **pyobjects**, pure-Python churn: batches of 10,000 records parsed from "
        "strings into class instances, lists, dicts, tuples and joined strings, indexed, formatted and dropped; "
        "**imports**, one fresh process that imports about 160 standard-library modules, `compile()`s the "
        "sources of nine standard-library packages three times, then writes 200 generated modules and imports "
        "each from source (no .pyc), running a function of each.",
        "",
        "### Wall time, × bare",
        "",
        header + " memwarden target |",
        rule + "---|",
    ]
    for w in workloads:
        target = PY_WORKLOADS[w.name][1]
        lines.append(
            f"| {w.name} | {bare_cell(w, 'wall', 's')} | "
            + " | ".join(cell(w, t, "wall") for t in tools)
            + f" | ≤ {fmt_ratio(target)} |"
        )
    lines += [
        "",
        "Of the whole command, as a user waits for it. memwarden's includes building its report and "
        "flamegraphs after the program exits; heaptrack's, interpreting and compressing its trace; Fil's, "
        "writing its HTML and SVG report at exit. Memray's includes only writing its capture file: a report "
        "from it is a separate step (`memray flamegraph`), not timed here.",
        "",
        "### The Python process alone, × bare",
        "",
        header,
        rule,
    ]
    for w in workloads:
        lines.append(
            f"| {w.name} | {bare_cell(w, 'target_wall', 's')} | "
            + " | ".join(cell(w, t, "target_wall") for t in tools)
            + " |"
        )
    lines += [
        "",
        "The process that runs the script, timed from its start to its exit inside it (`bench/hwm.c`). For "
        "Fil, that is the process after its launcher has re-executed itself through ld.so with its library "
        "preloaded; for Memray, the `memray` process, which runs the script itself after importing Memray.",
        "",
        "### Peak RSS of the Python process, × bare",
        "",
        header + " memwarden's CLI | heaptrack's helper |",
        rule + "---|---|",
    ]
    for w in workloads:
        helpers = [
            fmt_bytes(med(w, t, "other_rss_kib") * 1024) if t in w.tools and med(w, t, "other_rss_kib") else "–"
            for t in ("memwarden", "heaptrack")
        ]
        lines.append(
            f"| {w.name} | {bare_cell(w, 'target_rss_kib', 'KiB')} | "
            + " | ".join(cell(w, t, "target_rss_kib") for t in tools)
            + f" | {' | '.join(helpers)} |"
        )
    lines += [
        "",
        "Fil and Memray keep their data inside the Python process, so their ratios include it; memwarden's CLI "
        "and heaptrack_interpret are processes of their own, shown in the last two columns.",
        "",
        "### Profile size on disk",
        "",
        "| workload | " + " | ".join(PY_TOOL_NAMES[t] for t in tools) + " |",
        "|---|" + "---|" * len(tools),
    ]
    for w in workloads:
        lines.append(f"| {w.name} | " + " | ".join(size(w, t) for t in tools) + " |")
    lines += [
        "",
        "memwarden: blocks used by `DIR/raw`; heaptrack: its `.zst` file; Fil: its report folder; Memray: its "
        "capture file (compressed at exit, its default).",
        "",
        "### Targets",
        "",
        "| target | measured | met |",
        "|---|---|---|",
    ]
    for w in workloads:
        target = PY_WORKLOADS[w.name][1]
        earlier = ", ".join(f"{PY_TOOL_NAMES[t]} {fmt_ratio(x)}" for t, x in PY_EARLIER[w.name].items())
        value = ratio(w, "memwarden", "wall")
        if ("memwarden" in w.tools and (w.name, "memwarden") not in failures) and value is not None:
            met = "yes" if value <= target else "**no**"
            shown = fmt_ratio(value)
        else:
            met, shown = "**no**", "failed"
        lines.append(
            f"| {w.name} ({PY_WORKLOADS[w.name][2]}) wall time ≤ {fmt_ratio(target)} bare "
            f"(earlier: {earlier}) | {shown} | {met} |"
        )
    lines += [
        "",
        "The \"earlier\" figures are the peers' ratios measured before on this kind of machine, on workloads "
        "of the same kinds (NumPy compute, pure-Python objects, `python -m compileall -f` over a few "
        "standard-library packages), not these scripts; this run's figures for the peers are in the tables above.",
    ]
    if notes or failures:
        lines += ["", "### Notes on this run", ""]
        lines += [f"- {n}" for n in notes]
        for (name, tool), e in failures.items():
            said = [l.strip() for l in str(e).splitlines() if l.strip()]
            last = f" Its last words: `{said[-1]}`." if len(said) > 1 else ""
            log = f" (stderr kept in `{e.log.relative_to(ROOT)}`)" if e.log else ""
            lines.append(
                f"- {PY_TOOL_NAMES[tool]} failed on {name}{log}, so its figures there are left out: "
                f"`{said[0] if said else 'no message'}`{last}"
            )
    return "\n".join(lines) + "\n"


def write_doc(path: Path, native: str | None, python: str | None) -> str:
    """Writes the benchmark file: the native part, then the Python section. A part not
    measured in this run (None) is kept from the file as it was."""
    old = path.read_text() if path.exists() else ""
    i = old.find(PY_SECTION)
    old_native, old_python = (old[: i + 1], old[i + 1 :]) if i >= 0 else (old, "")
    native = old_native if native is None else native
    python = old_python if python is None else python
    if not native.strip():
        native = "# Benchmarks\n"
    text = native.rstrip("\n") + "\n" + ("\n" + python.rstrip("\n") + "\n" if python.strip() else "")
    path.write_text(text)
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one run of each tool on each workload")
    parser.add_argument("--runs", type=int, default=5, help="runs of each tool on each workload (default 5)")
    parser.add_argument(
        "--only", choices=("native", "python"), help="run one group; the other's part of the file is kept"
    )
    parser.add_argument(
        "--short", action="store_true", help=f"Python workloads at {SHORT_SCALE:g} of their size (a check, not figures)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md", help="markdown file to write")
    args = parser.parse_args()
    runs = 1 if args.quick else args.runs
    if runs < 1:
        raise SystemExit("bench: --runs must be at least 1")
    groups = (args.only,) if args.only else ("native", "python")
    if not MEMWARDEN.is_file():
        raise SystemExit(f"bench: {MEMWARDEN} is missing: run `cargo build --release` (scripts/bench.sh does)")
    for tool in ("gcc", "heaptrack", "sqlite3") if "native" in groups else ("gcc", "heaptrack"):
        if shutil.which(tool) is None:
            raise SystemExit(f"bench: {tool} is not installed (scripts/bench.sh installs it)")
    workloads, probe = build(groups)
    notes, failures, py_versions = [], {}, {}
    scale = SHORT_SCALE if args.short else 1.0
    if "python" in groups:
        try:
            python, peers = python_env(notes)
        except SystemExit as e:
            if groups == ("python",):
                raise
            # No venv or no NumPy: the native group still runs; the file keeps its Python section.
            print(f"{e}\nbench: running the native group only", file=sys.stderr, flush=True)
            groups = ("native",)
        else:
            py_versions = python_versions(python)
            workloads += python_workloads(python, peers, scale)
    samples = {w.name: {t: [] for t in w.tools} for w in workloads}
    for n in range(runs):
        for w in workloads:
            for tool in w.tools:
                if (w.name, tool) in failures:
                    continue
                try:
                    s = run_once(tool, w, probe, n)
                except RunFailed as e:
                    if w.group == "native":
                        raise SystemExit(str(e))
                    # A Python run that fails leaves out that tool on that workload, not the benchmark.
                    print(f"{e}\nbench: leaving {tool} out of {w.name}", file=sys.stderr, flush=True)
                    failures[(w.name, tool)] = e
                    samples[w.name][tool] = []
                    continue
                samples[w.name][tool].append(s)
                print(
                    f"run {n + 1}/{runs} {w.name:9} {tool:17} {s.wall:6.2f} s (target {s.target_wall:5.2f} s)"
                    f"  target RSS {s.target_rss_kib / 1024:7.1f} MiB"
                    + (f"  output {fmt_bytes(s.output_bytes)}" if s.output_bytes is not None else ""),
                    flush=True,
                )
    (WORK / "results.json").write_text(
        json.dumps({w: {t: [s.__dict__ for s in v] for t, v in d.items()} for w, d in samples.items()}, indent=1)
    )
    native = python_text = None
    if "native" in groups:
        native = native_markdown([w for w in workloads if w.group == "native"], samples, runs)
    if "python" in groups:
        py = [w for w in workloads if w.group == "python"]
        python_text = python_markdown(py, samples, runs, py_versions, notes, failures, scale)
    print(write_doc(args.out, native, python_text))


if __name__ == "__main__":
    main()
