#!/usr/bin/env bash
# Benchmarks memwarden side by side with the bare run and heaptrack and writes
# docs/benchmarks.md (see scripts/bench.py). Not a test. Usage: scripts/bench.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_packages gcc:gcc heaptrack:heaptrack zstd:zstd sqlite3:sqlite3 python3:python3
cargo build --release --workspace
exec python3 scripts/bench.py "$@"
