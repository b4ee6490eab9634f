"""memwarden's NumPy installer: the part of memwarden's `sitecustomize` that runs only in a
Python that imports NumPy (see docs/python.md).

`memwarden run` writes this file beside its `sitecustomize.py`, which loads it (from the
bytecode kept in `__pycache__`, else by compiling it) and runs it the first time NumPy's C
core (`numpy._core._multiarray_umath`, or `numpy.core._multiarray_umath` in NumPy 1.x) is
imported, so that every other Python start reads only the small watch. It wraps the
core's loader so that memwarden's NEP 49 data-memory handler is installed through NumPy's
C-API as soon as the core has run.

`sitecustomize` runs it with `watch` (its `sys.meta_path` finder) and `say` (one line on
stderr) set, and calls `watch_import`. Any failure of memwarden's own part is one line on
stderr starting with `memwarden:`, and the program runs on.
"""

import sys

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


def watch_import(name, path, target):
    """What the watch answers for the import of `name`: the core module's spec, its
    loader wrapped, or None. First installs the handler if the core ran unwrapped before."""
    if watch.waiting is not None:
        _install_if_loaded()
    if name in watch.core_modules:
        return _watched_spec(name, path, target)
    return None


def _watched_spec(name, path, target):
    """The spec the finders after the watch give for the core module, with its loader's
    `exec_module` wrapped to install the handler once the module has run."""
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
        # A class (as for a NumPy built into the interpreter) is never touched: the handler
        # is installed at the first import after the core's.
        watch.waiting = name
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
            watch.stop()
            _install_handler(module)

    loader.exec_module = exec_module
    return spec


def _install_if_loaded():
    core = sys.modules.get(watch.waiting)
    if getattr(core, "_ARRAY_API", None) is not None:
        watch.waiting = None
        watch.stop()
        _install_handler(core)


def _install_handler(core):
    """Makes memwarden's handler NumPy's in the current context (PyDataMem_SetHandler), and
    gives memwarden's functions to NumPy's default one, which every other context and
    thread starts with (it keeps its name, `default_allocator`, as NumPy promises)."""
    try:
        _install_handler_unguarded(core)
    except Exception as error:
        say("NumPy's data-memory handler not installed (%s: %s); "
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
    _keep_ufunc_state_found(core)


def _keep_ufunc_state_found(core):
    """Sets NumPy 2's ufunc error state (`_extobj_contextvar`) in the importing context to
    the value it already has there. Setting the handler gave this thread a context; in a
    context, CPython caches a variable's value only when the context holds it, so the error
    state, which every ufunc call reads and which is unset until `np.errstate` or
    `np.seterr`, would be looked up in the context's map on every call (about 95
    instructions and a few instruction-cache misses each, where a thread with no context
    reads the default at once). Held in the context, it is read from CPython's cache as
    cheaply as bare. The value is the one the program sees anyway; NumPy 1.x keeps its
    error state elsewhere and has no such variable."""
    state = getattr(core, "_extobj_contextvar", None)
    if state is not None:
        state.set(state.get())
