"""The benchmarks' arithmetic: ratios of runs taken side by side, their median and spread,
and how figures are written in docs/benchmarks.md."""

import statistics


def median(values):
    return statistics.median(values) if values else None


def round_ratios(runs, base_runs, attr):
    """`attr` in each of `runs` divided by the same round's `base_runs` (the two were taken
    seconds apart, interleaved)."""
    return [
        getattr(run, attr) / getattr(base, attr)
        for run, base in zip(runs, base_runs)
        if getattr(run, attr) is not None and getattr(base, attr)
    ]


def paired_ratio(runs, base_runs, attr):
    """The median over rounds of the ratio within each round (`round_ratios`). This machine
    has slow phases lasting seconds to minutes; a ratio of two medians taken over all rounds
    mixes runs from different phases, a ratio within a round does not."""
    return median(round_ratios(runs, base_runs, attr))


def middle_half(ratios):
    """The first and third quartiles of `ratios`, as text ("–" for fewer than four)."""
    if len(ratios) < 4:
        return "–"
    first, _, third = statistics.quantiles(ratios, n=4)
    return f"{fmt_ratio(first)}–{fmt_ratio(third)}"


def fmt_ratio(x):
    return "–" if x is None else f"{x:.2f}×"


def fmt_bytes(n):
    if n is None:
        return "–"
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
