"""The benchmark markdown (docs/benchmarks.md): the samples bench.py took, as medians of
per-round ratios to the bare runs, with the targets and the peers beside them."""

import datetime
import os
import platform
import subprocess
from pathlib import Path

from bench_config import (
    CHURN_PROFILE_TARGET,
    FAIL_OVERHEAD_TARGET,
    FAIL_TOOL,
    GUARD_OPTIONS,
    GUARD_TARGETS,
    HEAPTRACK_EARLIER,
    NEVER_FIRING_RULE,
    PAGE_CALLS,
    PAGE_WORKLOAD,
    PY_EARLIER,
    PY_OBJECT_TOOLS,
    PY_OBJECT_WORKLOAD,
    PY_TOOLS,
    PY_TOOL_NAMES,
    PY_WORKLOADS,
    ROOT,
    RSS_TARGET,
    TIME_TARGETS,
)
from bench_stats import fmt_bytes, fmt_ratio, median, middle_half, paired_ratio, round_ratios


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


def guard_lines(workloads, samples) -> tuple[list, list]:
    """The heap-guard rows of the targets table, and the heap-guard section: each guard mode
    on churn as a ratio to plain memwarden on the same churn (whole command, target alone,
    target peak RSS)."""

    def med(name, tool, attr):
        return median([getattr(s, attr) for s in samples.get(name, {}).get(tool, [])])

    def over_plain(name, tool, attr):
        runs = samples.get(name, {})
        return paired_ratio(runs.get(tool, []), runs.get("memwarden", []), attr)

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
        return paired_ratio(samples[w.name][tool], samples[w.name]["bare"], attr)

    today = datetime.date.today().isoformat()
    lines = [
        "# Benchmarks",
        "",
        f"Measured {today} by `scripts/bench.sh` ({runs} run{'s' if runs > 1 else ''} of each tool on each "
        "workload, interleaved, the tools in reverse order in odd rounds; each ratio is the median over rounds of the ratio within a round, "
        "where the runs compared were taken seconds apart; times and sizes are medians). These are "
        "measurements, not tests: the machine is shared and noisy (the same bare run varies by up to "
        "twice between rounds), so compare only ratios taken side by side in one run. The Python workloads, beside Fil and "
        "Memray, are in [Python](#python) below (`scripts/bench.sh --only native|python` runs one group and "
        "keeps the other's figures). memwarden keeps symbols across runs (`MEMWARDEN_SYMBOL_CACHE`, here "
        "`bench-out/symbol-cache`, emptied before the first round): the first round's memwarden runs "
        "symbolize from the debug information, the others mostly from that cache, as a program "
        "profiled again does.",
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
        fail_ratio = paired_ratio(samples["churn"][FAIL_TOOL], samples["churn"]["memwarden"], "wall")
        met = "yes" if fail_ratio <= FAIL_OVERHEAD_TARGET else "**no**"
        lines.append(
            f"| churn with `--fail` configured, not firing ≤ {FAIL_OVERHEAD_TARGET}× plain memwarden "
            f"| {fmt_ratio(fail_ratio)} | {met} |"
        )
        target_ratio = paired_ratio(samples["churn"][FAIL_TOOL], samples["churn"]["memwarden"], "target_wall")
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
        return paired_ratio(samples[w.name].get(tool, []), samples[w.name].get("bare", []), attr)

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

    def row(w, attr, unit, tail=" |"):
        """A table row: the workload, its bare figure, each tool's ratio, then `tail`."""
        return f"| {w.name} | {bare_cell(w, attr, unit)} | " + " | ".join(cell(w, t, attr) for t in tools) + tail

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
        f"workload, interleaved, the tools in reverse order in odd rounds; ratios are medians of per-round ratios, as above){short}. As above, "
        "compare only ratios taken side by side in one run."
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
        "`memray run -o FILE.bin SCRIPT`; `memray run --native -o FILE.bin SCRIPT`; on pyobjects also "
        "`memwarden run --python-objects -o DIR -- python SCRIPT` and `memray run --trace-python-allocators -o "
        "FILE.bin SCRIPT`. Every run has one BLAS and "
        "OpenMP thread (`OPENBLAS_NUM_THREADS=1` and the like: Fil forces that in its own process, so every "
        "tool gets the same) and `PYTHONHASHSEED=0`.",
        "- Workloads (`scripts/bench_py_*.py`): **numpy**, NumPy compute: matrix products, element-wise ufuncs "
        "with their temporaries, reductions, sorting, boolean and fancy indexing on arrays of 1–9 MiB, and a "
        "stream of 4 KiB vectors, 22 rounds of it (about 2.5 s bare here, the length of the peers' numpy_work in "
        "shared/peers.md; 18 rounds until 2026-11-24); **pyobjects**, pure-Python churn: batches of 10,000 records parsed from "
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
        lines.append(row(w, "wall", "s", f" | ≤ {fmt_ratio(target)} |"))
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
        lines.append(row(w, "target_wall", "s"))
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
        lines.append(row(w, "target_rss_kib", "KiB", f" | {' | '.join(helpers)} |"))
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
    ]
    objects = next((w for w in workloads if w.name == PY_OBJECT_WORKLOAD), None)
    objects_tools = [t for t in ("fil", *PY_OBJECT_TOOLS) if objects and t in objects.tools]
    if objects_tools:
        lines += [
            "",
            f"### Every Python object tracked ({PY_OBJECT_WORKLOAD})",
            "",
            "| tool | whole command | process alone | peak RSS |",
            "|---|---|---|---|",
        ]
        for t in objects_tools:
            lines.append(
                f"| {PY_TOOL_NAMES[t]} | "
                + " | ".join(cell(objects, t, attr) for attr in ("wall", "target_wall", "target_rss_kib"))
                + " |"
            )
        lines += [
            "",
            "Ratios to bare, in the same rounds as above. Python serves objects under 512 bytes from pymalloc's "
            "arenas, inside which memwarden and Memray do not see by default. Fil always sends every object "
            "through malloc (`PYTHONMALLOC=malloc`); memwarden does with `--python-objects`, Memray with "
            "`--trace-python-allocators`. Each then charges every object to the line that made it.",
        ]
    lines += [
        "",
        "### Targets",
        "",
        "| target | measured | met | middle half of the rounds |",
        "|---|---|---|---|",
    ]
    for w in workloads:
        target = PY_WORKLOADS[w.name][1]
        spread = middle_half(
            round_ratios(samples[w.name].get("memwarden", []), samples[w.name].get("bare", []), "wall")
        )
        earlier = ", ".join(f"{PY_TOOL_NAMES[t]} {fmt_ratio(x)}" for t, x in PY_EARLIER[w.name].items())
        value = ratio(w, "memwarden", "wall")
        if ("memwarden" in w.tools and (w.name, "memwarden") not in failures) and value is not None:
            met = "yes" if value <= target else "**no**"
            # Three decimals: at two, a median just over the target would read as the target.
            shown = f"{value:.3f}×"
        else:
            met, shown = "**no**", "failed"
        lines.append(
            f"| {w.name} ({PY_WORKLOADS[w.name][2]}) wall time ≤ {fmt_ratio(target)} bare "
            f"(earlier: {earlier}) | {shown} | {met} | {spread} |"
        )
    lines += [
        "",
        "A target is met when the median of the per-round ratios is within it. The last column holds "
        "the first and third quartiles of those ratios: how far this machine's noise moves one round's "
        "figure, and so how far another run's median may land.",
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
