#!/usr/bin/env bash
# The README's first command: builds memwarden, compiles the example program
# (examples/peak_and_leak.c: a peak in two functions and a leak) and profiles it.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_packages gcc:gcc

cargo build --release --workspace
mkdir -p target/demo
gcc -O2 -g -o target/demo/peak_and_leak examples/peak_and_leak.c

out=memwarden-out-demo
rm -rf "$out"
echo "== memwarden run -o $out -- target/demo/peak_and_leak" >&2
target/release/memwarden run -o "$out" -- target/demo/peak_and_leak
cat >&2 <<EOT

The report is in $out/:
  $out/report.json        every process, its peak and the stacks at the peak, leaks, totals
  $out/peak.svg           flamegraph of the bytes live at the peak (open it in a browser)
  $out/not-freed.svg      flamegraph of the bytes not freed at exit
  $out/allocated.svg      flamegraph of all bytes allocated
Render it again with: target/release/memwarden report $out
EOT
