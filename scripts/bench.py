#!/usr/bin/env python3
"""Benchmarks memwarden side by side with the bare run and heaptrack, and writes
docs/benchmarks.md. Not a test: figures depend on the machine and its load.

For each workload (bench/churn.c, bench/threads.c, the sqlite3 shell on a generated
script) it runs bare, under `memwarden run` and under `heaptrack`, interleaved, N times
each (a round runs every tool on a workload back to back: in the order listed on even
rounds and in the reverse order on odd ones, so that the machine's drift within a round,
and whatever one tool leaves behind for the next, falls on both sides of a ratio alike),
and takes medians of:
- wall time, as a ratio to the bare run of the same round (the median of the per-round
  ratios: the machine's slow phases then hit both sides of a ratio alike), for the whole command
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
Standard library only. The tools, workloads and targets are in bench_config.py; the markdown
is written by bench_markdown.py, with the ratios and their spread from bench_stats.py.
"""


import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench_config import (
    EXTRA_TOOLS,
    FAIL_TOOL,
    GUARD_OPTIONS,
    MEMRAY_OPTIONS,
    MEMWARDEN,
    NEVER_FIRING_RULE,
    PAGE_CALLS,
    PAGE_TOOLS,
    PAGE_WORKLOAD,
    PY_COMMS,
    PY_ENV,
    PY_OBJECT_TOOLS,
    PY_OBJECT_WORKLOAD,
    PY_PEERS,
    PY_TOOLS,
    PY_TOOL_NAMES,
    PY_WORKLOADS,
    ROOT,
    SHORT_SCALE,
    Sample,
    TOOLS,
    VENV,
    WORK,
    Workload,
)
from bench_markdown import (
    native_markdown,
    python_markdown,
    write_doc,
)
from bench_stats import fmt_bytes


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
    memwarden_options = {
        "memwarden": [],
        FAIL_TOOL: ["--fail", NEVER_FIRING_RULE],
        "memwarden-objects": ["--python-objects"],
        **GUARD_OPTIONS,
    }
    if tool == "bare":
        argv = w.argv
    elif tool == "heaptrack":
        argv = ["heaptrack", "-o", str(ht_base), *w.argv]
    elif tool == "fil":  # w.argv is [python, script, args...]
        argv = [str(VENV / "bin" / "fil-profile"), "-o", str(out_dir), "--no-browser", "run", *w.argv[1:]]
    elif tool in MEMRAY_OPTIONS:
        argv = [str(VENV / "bin" / "memray"), "run", *MEMRAY_OPTIONS[tool], "-o", str(memray_out), *w.argv[1:]]
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
    for package, module, tools in (("filprofiler", "filprofiler", ("fil",)), ("memray", "memray", tuple(MEMRAY_OPTIONS))):
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
    def tools(name):
        extra = PY_OBJECT_TOOLS if name == PY_OBJECT_WORKLOAD else ()
        return tuple(t for t in PY_TOOLS + extra if t not in PY_PEERS or t in peers)

    return [
        Workload(
            name,
            [str(python), str(ROOT / "scripts" / script), f"{scale:g}"],
            "python",
            tools=tools(name),
            group="python",
            also_comms=PY_COMMS,
            env=PY_ENV,
        )
        for name, (script, _target, _what) in PY_WORKLOADS.items()
    ]


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
    # memwarden's symbol cache: emptied, so that the first round is cold (docs say so).
    symbol_cache = WORK / "symbol-cache"
    shutil.rmtree(symbol_cache, ignore_errors=True)
    os.environ["MEMWARDEN_SYMBOL_CACHE"] = str(symbol_cache)
    samples = {w.name: {t: [] for t in w.tools} for w in workloads}
    for n in range(runs):
        for w in workloads:
            for tool in w.tools if n % 2 == 0 else reversed(w.tools):
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
