#!/usr/bin/env bash
# The project's test command: installs what the tests need (only what is missing), then
# checks formatting and lints, builds the release binaries the integration tests drive,
# and runs every test. Non-interactive and idempotent; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

libc_a=$(gcc -print-file-name=libc.a 2>/dev/null || echo /nonexistent/libc.a)
need_packages gcc:gcc g++:g++ c++filt:binutils "$libc_a":libc6-dev sqlite3:sqlite3 python3:python3 /usr/bin/kill:procps valgrind:valgrind

if ! command -v cargo >/dev/null 2>&1; then
    echo "scripts/test.sh: cargo is not installed (install Rust with rustup)" >&2
    exit 1
fi
for component in fmt clippy; do
    if ! cargo "$component" --version >/dev/null 2>&1; then
        echo "scripts/test.sh: cargo $component is missing (rustup component add ${component/fmt/rustfmt})" >&2
        exit 1
    fi
done

# The Python environment the Python tests run in (NumPy, pyarrow; meson and ninja for the
# C extension NumPy's handler tests build), made once.
if ! .venv/bin/python -c 'import numpy, pytest, hypothesis, pyarrow, mesonbuild, ninja' >/dev/null 2>&1; then
    python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || install_packages python3-venv
    rm -rf .venv
    python3 -m venv .venv
    .venv/bin/python -m pip install --quiet --disable-pip-version-check numpy pytest hypothesis pyarrow meson ninja
fi

export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
echo "== cargo fmt" >&2
cargo fmt --all -- --check
echo "== cargo clippy" >&2
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo build --release" >&2
cargo build --release --workspace
echo "== cargo test --release" >&2
# The runs under test keep their symbols in the build folder, not in the user's cache
# folder (each test compiles programs of its own, each a new cache file).
export MEMWARDEN_SYMBOL_CACHE=${MEMWARDEN_SYMBOL_CACHE:-$PWD/target/test-symbol-cache}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --release --workspace --no-fail-fast 2>&1 | tee "$log" || status=$?
# One closing line for the whole run (cargo's own last line is that of the last crate's
# doc tests, often "0 passed").
awk '/^test result:/ { passed += $4; failed += $6 } END { printf "%d passed, %d failed\n", passed, failed }' "$log"
exit "$status"
