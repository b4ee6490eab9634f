"""memwarden's sitecustomize: the Python end of `memwarden run` (see docs/python.md).

`memwarden run` writes this file into a hidden folder of the output folder and puts that
folder first on PYTHONPATH, so every Python of the profiled tree imports it at start-up.
It does two things, and must never break the program:

1. It watches imports until NumPy's C core (`numpy._core._multiarray_umath`, or
   `numpy.core._multiarray_umath` in NumPy 1.x) has run, then installs memwarden's NEP 49
   data-memory handler through NumPy's C-API and stops watching. Other imports cost one
   set lookup each, while the watch lasts.
2. It takes itself out of `sys.path`, `sys.path_importer_cache` and `sys.modules`, and
   imports the `sitecustomize` that would have run without memwarden, if any. An exception
   there is the user's, and propagates for `site` to show as usual.

Any failure of memwarden's own part is one line on stderr starting with `memwarden:`, and
the program runs on.
"""

import sys

# The modules whose execution makes NumPy's C-API table (`_ARRAY_API`) available.
_CORE_MODULES = frozenset(("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"))
# Indices in NumPy's C-API table (numpy/_core/include/numpy/__multiarray_api.h), the
# same since NumPy 1.22, the first with NEP 49.
_API_GET_FEATURE_VERSION = 211
_API_SET_HANDLER = 304
_API_GET_HANDLER = 305
# PyArray_GetNDArrayCFeatureVersion() of NumPy 1.22 (NPY_1_22_API_VERSION).
_FEATURE_VERSION_1_22 = 0xF
# What `memwarden run` sets: the path of libmemwarden.so.
_LIBRARY_VARIABLE = "MEMWARDEN_LIBRARY"
# No value.
_ABSENT = object()


def _say(message):
    """One line on stderr; a closed or broken stderr is not worth failing for."""
    try:
        sys.stderr.write("memwarden: %s\n" % message)
        sys.stderr.flush()
    except Exception:
        pass


class _NumpyWatch:
    """A `sys.meta_path` finder that finds nothing itself: for NumPy's core module it asks
    the finders after it, and wraps the loader's `exec_module` so the handler is installed
    as soon as the module has run."""

    # Marks a watch of any copy of this file (a memwarden run inside another one), so that
    # one watch is installed and none asks another.
    memwarden_numpy_watch = True
    # The core module, when its loader could not be wrapped (a class, as for a NumPy built
    # into the interpreter): the handler is installed at the first import after it.
    waiting = None

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if cls.waiting is None and name not in _CORE_MODULES:
            return None
        try:
            if cls.waiting is not None:
                cls._install_if_loaded()
            if name in _CORE_MODULES:
                return cls._watched_spec(name, path, target)
        except Exception as error:
            _say("cannot watch the import of %s: %r" % (name, error))
            cls.stop()
        return None

    @classmethod
    def _watched_spec(cls, name, path, target):
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if find is None or getattr(finder, "memwarden_numpy_watch", False):
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec
        if isinstance(loader, type) or not hasattr(loader, "__dict__"):
            cls.waiting = name
            return spec
        # What the loader object itself held, put back before the module runs.
        own = loader.__dict__.get("exec_module", _ABSENT)

        def exec_module(module):
            if own is _ABSENT:
                del loader.exec_module
            else:
                loader.exec_module = own
            run(module)
            if getattr(module, "_ARRAY_API", None) is not None:
                cls.stop()
                _install_handler(module)

        loader.exec_module = exec_module
        return spec

    @classmethod
    def _install_if_loaded(cls):
        core = sys.modules.get(cls.waiting)
        if getattr(core, "_ARRAY_API", None) is not None:
            cls.waiting = None
            cls.stop()
            _install_handler(core)

    @classmethod
    def stop(cls):
        try:
            sys.meta_path.remove(cls)
        except ValueError:
            pass


def _install_handler(core):
    """Makes memwarden's handler NumPy's: the current context's (PyDataMem_SetHandler),
    and NumPy's default one, which every other context and thread starts with."""
    try:
        _install_handler_unguarded(core)
    except Exception as error:
        _say("NumPy's data-memory handler not installed (%s: %s); "
             "array data is seen through malloc only" % (type(error).__name__, error))


def _memwarden_library(ctypes):
    """libmemwarden.so as loaded in this process, or None when this process is not profiled
    (a child that dropped LD_PRELOAD but kept PYTHONPATH)."""
    process = ctypes.CDLL(None)
    if hasattr(process, "memwarden_numpy_handler"):
        return process
    import os

    path = os.environ.get(_LIBRARY_VARIABLE)
    if not path:
        return None
    try:
        library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
    except OSError:
        return None
    if not hasattr(library, "memwarden_numpy_handler"):
        raise RuntimeError("%s has no memwarden_numpy_handler (an older memwarden?)" % path)
    return library


def _install_handler_unguarded(core):
    import contextvars
    import ctypes

    library = _memwarden_library(ctypes)
    if library is None:
        return
    c_void_p, py_object, c_char_p = ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p
    # Fresh function objects: the shared ctypes.pythonapi ones may carry the program's own
    # argtypes.
    pythonapi = ctypes.pythonapi
    capsule_new = ctypes.PYFUNCTYPE(py_object, c_void_p, c_char_p, c_void_p)(
        ("PyCapsule_New", pythonapi))
    capsule_pointer = ctypes.PYFUNCTYPE(c_void_p, py_object, c_char_p)(
        ("PyCapsule_GetPointer", pythonapi))
    keep_forever = ctypes.PYFUNCTYPE(None, py_object)(("Py_IncRef", pythonapi))
    handler = ctypes.CFUNCTYPE(c_void_p)(("memwarden_numpy_handler", library))
    adopt = ctypes.CFUNCTYPE(ctypes.c_int, c_void_p)(("memwarden_numpy_adopt", library))

    table = ctypes.cast(capsule_pointer(core._ARRAY_API, None), ctypes.POINTER(c_void_p))
    feature_version = ctypes.PYFUNCTYPE(ctypes.c_uint)(table[_API_GET_FEATURE_VERSION])()
    if feature_version < _FEATURE_VERSION_1_22:
        raise RuntimeError("NumPy's C-API version %#x predates NEP 49 (NumPy 1.22)"
                           % feature_version)
    set_handler = ctypes.PYFUNCTYPE(py_object, py_object)(table[_API_SET_HANDLER])
    get_handler = ctypes.PYFUNCTYPE(py_object)(table[_API_GET_HANDLER])

    address = handler()
    if not address:
        raise RuntimeError("memwarden_numpy_handler() returned NULL")
    # A capsule keeps a pointer to its name: both live as long as the process, like every
    # array made with the handler.
    name = b"mem_handler"
    keep_forever(name)
    capsule = capsule_new(address, name, None)
    keep_forever(capsule)

    # A fresh context has no handler set: it sees NumPy's default one.
    default = contextvars.Context().run(get_handler)
    status = adopt(capsule_pointer(default, name))
    if status != 0:
        raise RuntimeError("memwarden_numpy_adopt() returned %d" % status)
    set_handler(capsule)


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
        sys.meta_path.insert(0, _NumpyWatch)
except Exception as _error:
    _say("cannot watch for NumPy: %r" % (_error,))

_leave_and_chain()
