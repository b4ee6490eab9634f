"""memwarden's sitecustomize: the Python end of `memwarden run` (see docs/python.md).

`memwarden run` writes this file into a hidden folder of the output folder and puts that
folder first on PYTHONPATH, so every Python of the profiled tree imports it at start-up.
It does three things, and must never break the program:

1. It watches imports until NumPy's C core (`numpy._core._multiarray_umath`, or
   `numpy.core._multiarray_umath` in NumPy 1.x) is imported, then loads and runs
   `memwarden_numpy.py` from the same folder, which installs memwarden's NEP 49
   data-memory handler through NumPy's C-API once the core has run, and stops the watch.
   Other imports cost one set lookup each, while the watch lasts. This file stays small
   because every Python start reads it.
2. It keeps its own bytecode, and the installer's, in `__pycache__` beside them as pycs
   checked by the source's hash (`_keep_bytecode`), even under PYTHONDONTWRITEBYTECODE:
   this folder is memwarden's, not the program's. The next Python of the run loads them
   rather than compiling, and `memwarden run` keeps them for later runs (a pyc checked by
   time would not do: each run writes these files anew).
3. It takes itself out of `sys.path`, `sys.path_importer_cache` and `sys.modules`, and
   imports the `sitecustomize` that would have run without memwarden, if any. An exception
   there is the user's, and propagates for `site` to show as usual.

Any failure of memwarden's own part is one line on stderr starting with `memwarden:`, and
the program runs on.
"""

import sys

# The modules whose execution makes NumPy's C-API table (`_ARRAY_API`) available.
_CORE_MODULES = frozenset(("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"))
# Beside this file: the part that installs the handler.
_INSTALLER = "memwarden_numpy.py"
# The flags of a pyc's header (PEP 552): checked by the source's hash rather than by its
# modification time, and checked at each load.
_HASH_BASED = 0b01
_CHECK_SOURCE = 0b10


def _say(message):
    """One line on stderr; a closed or broken stderr is not worth failing for."""
    try:
        sys.stderr.write("memwarden: %s\n" % message)
        sys.stderr.flush()
    except Exception:
        pass


class _NumpyWatch:
    """A `sys.meta_path` finder that finds nothing itself: for NumPy's core module it hands
    the import to the installer (`memwarden_numpy.py`), loaded then."""

    # Marks a watch of any copy of this file (a memwarden run inside another one), so that
    # one watch is installed and none asks another.
    memwarden_numpy_watch = True
    core_modules = _CORE_MODULES
    # The core module, when its loader could not be wrapped: the handler is installed at
    # the first import after it.
    waiting = None
    # The installer's path and the class of the loader that loaded this file (a source
    # file loader, which also reads and writes bytecode), set below; the installer's
    # namespace once loaded.
    installer_path = None
    loader_type = None
    installer = None

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if cls.waiting is None and name not in _CORE_MODULES:
            return None
        try:
            if cls.installer is None:
                cls.installer = cls._load_installer()
            return cls.installer["watch_import"](name, path, target)
        except Exception as error:
            _say("cannot watch the import of %s: %r" % (name, error))
            cls.stop()
        return None

    @classmethod
    def _load_installer(cls):
        """The installer's namespace, run with `watch` and `say` set. Its code comes through
        the loader class that loaded this file, so that the bytecode `_keep_bytecode`
        left in `__pycache__` is used; it is never importable by name."""
        path = cls.installer_path
        code = None
        if cls.loader_type is not None:
            code = cls.loader_type("memwarden_numpy", path).get_code("memwarden_numpy")
        if code is None:
            with open(path, encoding="utf-8") as source:
                code = compile(source.read(), path, "exec", dont_inherit=True)
        _keep_bytecode(code, path)
        namespace = {"__name__": "memwarden_numpy", "__file__": path,
                     "watch": cls, "say": _say}
        exec(code, namespace)
        return namespace

    @classmethod
    def stop(cls):
        try:
            sys.meta_path.remove(cls)
        except ValueError:
            pass


def _keep_bytecode(code, source_path):
    """Writes `code`, compiled from `source_path` (a file of this folder), to `__pycache__`
    as a pyc checked by the source's hash, unless a pyc of that kind is there already.
    Never fails: bytecode only saves the next Python a compilation."""
    try:
        if sys.pycache_prefix:
            return  # Python would look for it there, outside this folder
        # What `importlib.util` would use, taken where the import system keeps it, so that
        # no module is imported that the program would not have imported.
        bootstrap = sys.modules["_frozen_importlib_external"]
        cached = bootstrap.cache_from_source(source_path)  # no cache tag: raises
        try:
            with open(cached, "rb") as pyc:
                if int.from_bytes(pyc.read(8)[4:], "little") & _HASH_BASED:
                    return
        except OSError:
            pass
        import _imp
        import marshal
        import os

        with open(source_path, "rb") as source:
            source_hash = _imp.source_hash(bootstrap._RAW_MAGIC_NUMBER, source.read())
        flags = (_HASH_BASED | _CHECK_SOURCE).to_bytes(4, "little")
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        # Written whole under another name, then renamed: a Python starting meanwhile
        # reads the old file or the new one, never part of one.
        partial = "%s.%d.tmp" % (cached, os.getpid())
        try:
            with open(partial, "wb") as pyc:
                pyc.write(bootstrap.MAGIC_NUMBER + flags + source_hash + marshal.dumps(code))
            os.replace(partial, cached)
        except OSError:
            os.remove(partial)  # a full disk, say: no half file is left behind
    except Exception:
        pass


def _leave_and_chain():
    """Leaves sys.path and sys.modules as they would be without memwarden, then imports
    the next `sitecustomize` on the path, if there is one."""
    try:
        import os

        here = os.path.dirname(os.path.abspath(__file__))
        sys.path[:] = [entry for entry in sys.path
                       if not entry or os.path.abspath(entry) != here]
        sys.path_importer_cache.pop(here, None)
        if getattr(sys.modules.get(__name__), "__dict__", None) is globals():
            del sys.modules[__name__]
    except Exception as error:
        _say("cannot step aside for the program's own sitecustomize: %r" % (error,))
        return
    # A missing module raises ImportError(name="sitecustomize"), which `site` takes as
    # "no sitecustomize", as without memwarden; the import system then drops this module
    # too. An error in the program's own module propagates for `site` to show.
    __import__(__name__)


try:
    if not any(getattr(finder, "memwarden_numpy_watch", False) for finder in sys.meta_path):
        import os

        _NumpyWatch.installer_path = os.path.join(
            os.path.dirname(os.path.abspath(__file__)), _INSTALLER)
        if hasattr(type(__loader__), "path_stats"):
            _NumpyWatch.loader_type = type(__loader__)
        sys.meta_path.insert(0, _NumpyWatch)
except Exception as _error:
    _say("cannot watch for NumPy: %r" % (_error,))
_keep_bytecode(sys._getframe().f_code, __file__)

_leave_and_chain()
