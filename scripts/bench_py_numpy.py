#!/usr/bin/env python3
"""Python benchmark workload for scripts/bench.py: realistic NumPy compute.

A few seconds of array work of the kind a data pipeline does: element-wise arithmetic
and ufuncs on arrays of several MB (with the temporaries NumPy makes for every
intermediate result), reductions, matrix products, sorting, boolean masks, fancy
indexing, concatenation and reshaping, and a stream of small arrays (a few KiB) as a
feature loop makes them. Deterministic (seeded). Most of the time is spent inside NumPy
and BLAS, not in start-up or in the interpreter.

Usage: bench_py_numpy.py [SCALE]   (SCALE multiplies the number of rounds; default 1.0)
"""

import sys

import numpy as np

N = 384  # a 384×384 float64 matrix is 1.1 MiB; the stacked arrays below are 3–9 MiB
# 22 rounds run about 2.5 s bare on this machine: the length of the peers' numpy_work in
# shared/peers.md, on which the figures for Fil and Memray were taken. (18 rounds,
# 2.0-2.1 s, until 2026-11-24: fixed costs such as the start, `import numpy` and a
# profiler's report after exit then weigh a fifth more in the ratio.)
ROUNDS = 22
SMALL_ARRAYS = 2500  # per round: vectors of 512 float64 (4 KiB)


def big_arrays(rng, n):
    a = rng.standard_normal((n, n))
    b = rng.standard_normal((n, n))
    c = a @ b  # BLAS
    c /= np.abs(c).max()
    d = np.exp(-(c**2)) * np.sin(a) + np.cos(b) * 0.5  # several temporaries of n×n
    e = np.where(d > 0, np.sqrt(np.abs(d)), -np.log1p(np.abs(d)))
    stacked = np.concatenate([a, b, c, d, e, a * b, a - b, b - c]).reshape(-1, n)  # 9 MiB
    col_means = stacked.mean(axis=0)
    centered = stacked - col_means  # 9 MiB temporary
    norms = np.sqrt((centered**2).sum(axis=1))
    cov = centered.T @ centered / len(centered)  # BLAS, n×n
    return float(norms.sum() + np.trace(cov) + e.std())


def indexing(rng, n):
    flat = rng.random(n * n * 4)  # 4.5 MiB
    idx = rng.integers(0, flat.size, size=flat.size // 2)
    gathered = flat[idx]  # fancy indexing: a 2.3 MiB copy
    order = np.argsort(gathered, kind="stable")
    ranked = gathered[order]
    mask = ranked > 0.5
    picked = ranked[mask]  # boolean indexing
    flat[idx[:1000]] = 0.0  # fancy assignment
    uniq = np.unique(np.round(picked, 3))
    hist, _ = np.histogram(flat, bins=64)
    cums = np.cumsum(picked)
    return float(cums[-1] + uniq.size + hist.max())


def small_arrays(rng, count):
    total = 0.0
    for i in range(count):
        v = rng.standard_normal(512)
        w = v * 2.0 + 1.0
        w = np.clip(w, -3.0, 3.0)
        total += float(np.dot(v, w)) + float(w[i % 512])
    return total


def main():
    scale = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    rng = np.random.default_rng(1234)
    checksum = 0.0
    for _ in range(max(1, round(ROUNDS * scale))):
        checksum += big_arrays(rng, N)
        checksum += indexing(rng, N)
        checksum += small_arrays(rng, SMALL_ARRAYS)
    print(f"numpy checksum {checksum:.6g}")


if __name__ == "__main__":
    main()
