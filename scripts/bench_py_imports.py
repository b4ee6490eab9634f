#!/usr/bin/env python3
"""Python benchmark workload for scripts/bench.py: import-heavy and compile-heavy.

One fresh process (no subprocess, no subinterpreter) that:
1. imports a large set of standard-library modules (about 150, with what they import in
   turn), as the start-up of a big application does;
2. compiles, with `compile()`, the sources of several standard-library packages, as
   `python -m compileall -f` does but without writing .pyc files;
3. writes a package of generated modules (classes, methods, functions, dicts of constants,
   decorators, comprehensions) to a temporary folder and imports every module from source
   (`sys.dont_write_bytecode`, so each import parses, compiles and executes the module),
   then calls into them.

The parser and compiler allocate many short-lived objects and arenas, and reach malloc
far more often than steady-state Python code does. Deterministic.

Usage: bench_py_imports.py [SCALE]   (SCALE multiplies the compile passes and the number
of generated modules; default 1.0)
"""

import importlib
import os
import shutil
import sys
import tempfile

STDLIB_MODULES = """
abc argparse ast asyncio base64 bdb binascii bisect bz2 calendar cmd code codecs codeop
collections collections.abc colorsys compileall concurrent.futures configparser contextlib
contextvars copy copyreg cProfile csv ctypes dataclasses datetime decimal difflib dis doctest
email email.mime.multipart email.mime.text email.parser email.policy encodings.idna enum
filecmp fileinput fnmatch fractions ftplib functools gc getopt getpass gettext glob graphlib
gzip hashlib heapq hmac html html.parser http http.client http.cookiejar http.cookies
http.server imaplib importlib importlib.metadata importlib.resources inspect io ipaddress
itertools json json.decoder keyword linecache locale logging logging.config logging.handlers
lzma mailbox mimetypes multiprocessing multiprocessing.pool netrc numbers operator optparse
os pathlib pdb pickle pickletools pkgutil platform plistlib poplib pprint profile pstats
py_compile pydoc queue quopri random re reprlib rlcompleter runpy sched secrets selectors
shelve shlex shutil signal site smtplib socket socketserver sqlite3 ssl stat statistics
string stringprep struct subprocess symtable sysconfig tabnanny tarfile tempfile textwrap
threading timeit token tokenize tomllib trace traceback tracemalloc types typing unittest
unittest.mock urllib.parse urllib.request uuid warnings wave weakref webbrowser wsgiref
wsgiref.simple_server xml.dom.minidom xml.etree.ElementTree xml.sax xmlrpc.client
xmlrpc.server zipapp zipfile zipimport zoneinfo
""".split()

# Packages (folders of the standard library) whose sources are compiled.
COMPILED_PACKAGES = ("email", "json", "http", "logging", "unittest", "xml", "concurrent", "urllib", "importlib")
COMPILE_PASSES = 3
GENERATED_MODULES = 200


def import_stdlib():
    loaded = 0
    for name in STDLIB_MODULES:
        try:
            importlib.import_module(name)
            loaded += 1
        except ImportError:  # an optional C module this Python was built without
            pass
    return loaded


def compile_stdlib(passes):
    root = os.path.dirname(os.__file__)
    sources = []
    for package in COMPILED_PACKAGES:
        for folder, _dirs, files in os.walk(os.path.join(root, package)):
            if "test" in os.path.relpath(folder, root).split(os.sep):
                continue
            for f in sorted(files):
                if f.endswith(".py"):
                    path = os.path.join(folder, f)
                    with open(path, encoding="utf-8") as fh:
                        sources.append((path, fh.read()))
    size = 0
    for _ in range(passes):
        for path, text in sources:
            code = compile(text, path, "exec", dont_inherit=True)
            size += len(code.co_consts)
    return size


def generated_module(i):
    """The source of one generated module: about 150 lines of varied code."""
    lines = [f'"""Generated module {i}."""', "import functools", "from dataclasses import dataclass", ""]
    lines.append(f"TABLE = {{{', '.join(f'{k!r}: {k * i % 1000}' for k in range(60))}}}")
    lines.append(f"NAMES = [{', '.join(repr(f'name_{i}_{k}') for k in range(40))}]")
    for c in range(4):
        lines += [
            "",
            "@dataclass",
            f"class Item{c}:",
            "    key: int",
            "    label: str = ''",
            f"    weight: float = {c}.5",
            "",
            "    def scaled(self, factor):",
            "        return Item{c}(self.key * factor, self.label + '!', self.weight * factor)".replace("{c}", str(c)),
            "",
            "    def describe(self):",
            f"        return f'{{self.label}}#{{self.key}} ({{self.weight:.2f}}) in module {i}'",
            "",
            f"class Handler{c}:",
            "    registry = {}",
            "",
            "    def __init__(self, name):",
            "        self.name = name",
            "        self.seen = []",
            "",
            "    def handle(self, event):",
            "        if event is None:",
            "            return None",
            "        elif isinstance(event, dict):",
            "            return {k: v for k, v in sorted(event.items()) if v is not None}",
            "        elif isinstance(event, (list, tuple)):",
            "            return [self.handle(e) for e in event]",
            "        self.seen.append(event)",
            "        return str(event).strip().lower()",
        ]
    for f in range(8):
        lines += [
            "",
            "@functools.lru_cache(maxsize=None)",
            f"def compute_{f}(n, m={f}):",
            "    total = 0",
            "    for k in range(n):",
            "        if k % 3 == 0:",
            "            total += k * m",
            "        elif k % 3 == 1:",
            "            total -= TABLE.get(k % 60, 0)",
            "        else:",
            "            total ^= k",
            "    try:",
            "        return total // (m or 1)",
            "    except ZeroDivisionError:",
            "        return -1",
            "",
            f"def transform_{f}(items):",
            f"    pairs = [(x, y) for x in items for y in NAMES[:{f + 2}] if len(y) > x % 7]",
            "    grouped = {}",
            "    for x, y in pairs:",
            "        grouped.setdefault(y, []).append(x)",
            "    return sorted(grouped.items(), key=lambda kv: (len(kv[1]), kv[0]))",
        ]
    lines += [
        "",
        "def run():",
        "    items = [Item0(k, NAMES[k % 40]) for k in range(20)]",
        f"    return sum(compute_{i % 8}(50) for _ in range(3)) + len(transform_{i % 8}(range(10))) + len(items)",
        "",
    ]
    return "\n".join(lines)


def import_generated(count):
    folder = tempfile.mkdtemp(prefix="mwbench-imports-")
    try:
        package = os.path.join(folder, "mwbench_generated")
        os.mkdir(package)
        open(os.path.join(package, "__init__.py"), "w").close()
        for i in range(count):
            with open(os.path.join(package, f"mod_{i}.py"), "w") as f:
                f.write(generated_module(i))
        sys.path.insert(0, folder)
        sys.dont_write_bytecode = True  # every import parses and compiles its module
        importlib.invalidate_caches()
        total = 0
        for i in range(count):
            module = importlib.import_module(f"mwbench_generated.mod_{i}")
            total += module.run()
        return total
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main():
    scale = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    loaded = import_stdlib()
    compiled = compile_stdlib(max(1, round(COMPILE_PASSES * scale)))
    generated = import_generated(max(1, round(GENERATED_MODULES * scale)))
    print(f"imports: {loaded} stdlib modules, checksum {compiled + generated}")


if __name__ == "__main__":
    main()
