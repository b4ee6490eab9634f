#!/usr/bin/env bash
# Benchmarks memwarden side by side with the bare run and heaptrack (native workloads), and
# with heaptrack, Fil and Memray (Python workloads), and writes docs/benchmarks.md (see
# scripts/bench.py). Not a test.
# Usage: scripts/bench.sh [--quick] [--runs N] [--only native|python] [--short] [--out FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_packages gcc:gcc heaptrack:heaptrack zstd:zstd sqlite3:sqlite3 python3:python3
# The Python group makes a venv (bench-out/venv) for NumPy, Fil and Memray.
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || install_packages python3-venv
cargo build --release --workspace
exec python3 scripts/bench.py "$@"
