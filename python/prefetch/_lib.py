"""ctypes view of libprefetch (client/prefetch.h): the library, its structs
and the prototypes of the functions the package calls.

The structs mirror prefetch.h field for field; ctypes lays them out with the
platform C ABI, so the offsets match the compiler's (tests/python/test_host.py
compiles prefetch.h and compares them).  Nothing here holds state beyond the
loaded library, which is loaded once per process on first use.

Where the library comes from, first match wins:

1. ``$PREFETCH_LIB``: a path to libprefetch.so (an error if it does not load:
   a path someone set on purpose must not be silently replaced);
2. ``libprefetch.so`` next to this file (a copy or link dropped into the
   package: ``make install PYTHONDIR=...`` links it to ``$(LIBDIR)``);
3. ``build/libprefetch.so`` of the source tree this package sits in
   (``python/prefetch/../../build``, only when that is a prefetchd
   checkout), so a checkout works after ``make``;
4. the system path: ``ctypes.util.find_library("prefetch")``, then
   ``libprefetch.so.0`` (what ``make install`` puts in ``$PREFIX/lib``);
5. ``/usr/local/lib/libprefetch.so.0`` by path: ``make install``'s default
   PREFIX, which ld.so finds only after ``ldconfig``.

When none loads, the error names each place and why it failed.
"""

import ctypes
import ctypes.util
import os
import threading

PF_ORDER_SEQUENTIAL = 0
PF_ORDER_SHUFFLE = 1
PF_ORDER_EXPLICIT = 2
PF_ORDER_PACED = 3
PF_ORDER_BLOCK_SHUFFLE = 4
# Paced requests the daemon holds not yet taken (prefetch.h).
PF_PACED_MAX = 1024

PF_IPC = {"default": 0, "fd": 1, "legacy": 2}

_u64p = ctypes.POINTER(ctypes.c_uint64)
u64p = _u64p  # const uint64_t *, for the picks the package passes


class OpenOpts(ctypes.Structure):
    """struct pf_open_opts"""

    _fields_ = [
        ("dataset", ctypes.c_char_p),
        ("device", ctypes.c_char_p),
        ("batch_size", ctypes.c_uint32),
        ("drop_last", ctypes.c_bool),
        ("augment", ctypes.c_uint32),
        ("min_depth", ctypes.c_uint32),
        ("max_depth", ctypes.c_uint32),
        ("ipc", ctypes.c_int),  # enum pf_ipc
        ("name", ctypes.c_char_p),
        ("reconnect_s", ctypes.c_double),
        ("share", ctypes.c_char_p),
    ]


class EpochOpts(ctypes.Structure):
    """struct pf_epoch_opts"""

    _fields_ = [
        ("order", ctypes.c_int),  # enum pf_order
        ("seed", ctypes.c_uint64),
        ("rank", ctypes.c_uint32),
        ("world", ctypes.c_uint32),
        ("start_batch", ctypes.c_uint64),
        ("indices", _u64p),
        ("nindices", ctypes.c_size_t),
        # PF_ORDER_BLOCK_SHUFFLE only; 0: not set (block_options).
        ("block_rows", ctypes.c_uint64),
        ("block_bytes", ctypes.c_uint64),
        ("window_blocks", ctypes.c_uint64),
    ]


def block_options(block_rows=None, block_bytes=None, window_blocks=None):
    """The EpochOpts fields of a block_shuffle epoch, as keyword arguments:

        EpochOpts(order=PF_ORDER_BLOCK_SHUFFLE, seed=..., **block_options(block_rows=4096))

    None is "not set" (the daemon's default: 4 MiB of samples a block, 16
    blocks a window; docs/SHUFFLE.md).  On the wire and in the C struct 0
    means the same, so an explicit 0, which can be told apart only here,
    is refused, as are both sizes at once (the daemon would refuse them
    too, with the same message)."""
    out = {}
    for name, v in (("block_rows", block_rows), ("block_bytes", block_bytes),
                    ("window_blocks", window_blocks)):
        if v is None:
            out[name] = 0
            continue
        if isinstance(v, bool) or int(v) != v or not 1 <= v < 1 << 64:
            raise ValueError("%s must be a positive integer, or None for the default, not %r"
                             % (name, v))
        out[name] = int(v)
    if out["block_rows"] and out["block_bytes"]:
        raise ValueError("block_rows (%d) and block_bytes (%d) are both set: give one of them"
                         % (out["block_rows"], out["block_bytes"]))
    return out


class Field(ctypes.Structure):
    """struct pf_field"""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_char_p),
        ("ndim", ctypes.c_int),
        ("shape", _u64p),
        ("sample_bytes", ctypes.c_uint64),
    ]


class Batch(ctypes.Structure):
    """struct pf_batch"""

    _fields_ = [
        ("epoch", ctypes.c_uint64),
        ("seq", ctypes.c_uint64),
        ("count", ctypes.c_uint32),
        # const uint64_t *, read as an address: the picks are copied out
        # with one string_at rather than through a ctypes array.
        ("picks", ctypes.c_void_p),
        ("nfields", ctypes.c_uint32),
        ("data", ctypes.POINTER(ctypes.c_void_p)),
        ("on_device", ctypes.c_bool),
    ]


class Stats(ctypes.Structure):
    """struct pf_stats"""

    _fields_ = [
        ("session", ctypes.c_uint64),
        ("batches", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("held", ctypes.c_uint64),
        ("wait_s", ctypes.c_double),
        ("busy_s", ctypes.c_double),
        ("stall_fraction", ctypes.c_double),
        ("reconnects", ctypes.c_uint64),
        ("resume_batch", ctypes.c_uint64),
    ]


# Every struct the package passes, by its C name (the layout test uses it).
STRUCTS = {
    "pf_open_opts": OpenOpts,
    "pf_epoch_opts": EpochOpts,
    "pf_field": Field,
    "pf_batch": Batch,
    "pf_stats": Stats,
}

_client_p = ctypes.c_void_p  # struct pf_client *, opaque
_batch_p = ctypes.POINTER(Batch)
Batch_p = _batch_p

# name: (restype, argtypes)
_PROTOTYPES = {
    "pf_connect": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(_client_p)]),
    "pf_open": (ctypes.c_int, [_client_p, ctypes.POINTER(OpenOpts)]),
    "pf_num_samples": (ctypes.c_uint64, [_client_p]),
    "pf_num_fields": (ctypes.c_uint32, [_client_p]),
    "pf_field_info": (ctypes.c_int, [_client_p, ctypes.c_uint32, ctypes.POINTER(Field)]),
    "pf_start_epoch": (ctypes.c_int, [_client_p, ctypes.POINTER(EpochOpts), _u64p]),
    "pf_set_epoch": (ctypes.c_int, [_client_p, ctypes.c_uint64]),
    "pf_error_batch": (ctypes.c_bool, [_client_p]),
    "pf_load": (ctypes.c_int, [_client_p, _u64p, ctypes.c_size_t]),
    "pf_load_end": (ctypes.c_int, [_client_p]),
    "pf_probe": (ctypes.c_int, [_client_p]),
    "pf_next": (ctypes.c_int, [_client_p, ctypes.c_int, ctypes.POINTER(_batch_p)]),
    "pf_next_stream": (ctypes.c_int, [_client_p, ctypes.c_int, ctypes.c_void_p,
                                      ctypes.POINTER(_batch_p)]),
    "pf_release": (ctypes.c_int, [_client_p, _batch_p, ctypes.c_void_p]),
    "pf_release_next": (ctypes.c_int, [_client_p, _batch_p, ctypes.c_void_p, ctypes.c_int,
                                       ctypes.POINTER(_batch_p)]),
    "pf_set_depth": (ctypes.c_int, [_client_p, ctypes.c_uint64, ctypes.c_uint32]),
    "pf_abandon": (ctypes.c_int, [_client_p]),
    "pf_stats": (ctypes.c_int, [_client_p, ctypes.POINTER(Stats)]),
    "pf_close": (None, [_client_p]),
    "pf_errmsg": (ctypes.c_char_p, [_client_p]),
}

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
# Where `make install` puts the library with its default PREFIX.  ld.so
# searches /usr/local/lib only once ldconfig has been run over it (Debian's
# /etc/ld.so.conf.d/libc.conf names it, but the cache is not refreshed by
# `make install`), so the path is tried by name as well.
_DEFAULT_LIBDIR = "/usr/local/lib"
_lib = None
_lib_lock = threading.Lock()


def _checkout_build():
    """build/libprefetch.so of the source tree this package sits in
    (python/prefetch/../../build), or None when the package is not in a
    checkout (an installed copy: its ../../build is someone else's)."""
    root = os.path.normpath(os.path.join(_PKG_DIR, "..", ".."))
    if not os.path.exists(os.path.join(root, "client", "prefetch.h")):
        return None
    return os.path.join(root, "build", "libprefetch.so")


def candidates():
    """The places the library is looked for, in order, as (how, path) pairs:
    how is "env", "package", "build", "system" (a name ld.so looks up) or
    "libdir" (make install's default $(PREFIX)/lib, by path)."""
    out = []
    env = os.environ.get("PREFETCH_LIB")
    if env:
        out.append(("env", env))
    out.append(("package", os.path.join(_PKG_DIR, "libprefetch.so")))
    build = _checkout_build()
    if build:
        out.append(("build", build))
    found = ctypes.util.find_library("prefetch")
    if found and found != "libprefetch.so.0":
        out.append(("system", found))
    out.append(("system", "libprefetch.so.0"))
    out.append(("libdir", os.path.join(_DEFAULT_LIBDIR, "libprefetch.so.0")))
    return out


def _load():
    tried = []
    if not os.environ.get("PREFETCH_LIB"):
        tried.append("$PREFETCH_LIB (not set)")
    for how, path in candidates():
        if how in ("package", "build", "libdir") and not os.path.exists(path):
            tried.append(path + " (absent)")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            if how == "env":
                raise OSError("PREFETCH_LIB=%s does not load: %s" % (path, e)) from None
            what = path if how != "system" else "%s from the system path" % path
            tried.append("%s (%s)" % (what, e))
            continue
        for name, (restype, argtypes) in _PROTOTYPES.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                raise OSError("%s is an older libprefetch: it lacks %s (rebuild it, or point "
                              "PREFETCH_LIB at a current one)" % (path, name)) from None
            fn.restype = restype
            fn.argtypes = argtypes
        # pf_release_next once more, for the Loader's loop: the batches go
        # in and out as plain addresses (a c_void_p it reuses), which costs
        # Python less per batch than a new POINTER(Batch) and its contents.
        fn = lib._FuncPtr(("pf_release_next", lib))
        fn.restype = ctypes.c_int
        fn.argtypes = [_client_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                       ctypes.POINTER(ctypes.c_void_p)]
        lib.pf_release_next_addr = fn
        return lib
    raise OSError("libprefetch not found; tried: " + "; ".join(tried) +
                  ". Build it with `make` (a checkout finds its build/libprefetch.so) and set "
                  "PREFETCH_LIB to its path, or `make install` it and, if its $(PREFIX)/lib "
                  "is not in ld.so's cache, run `ldconfig` (or set PREFETCH_LIB).")


def path():
    """The path of the library loaded (loading it on the first call)."""
    return lib()._name


def lib():
    """The loaded library (loaded on the first call); its path is lib()._name."""
    global _lib
    with _lib_lock:
        if _lib is None:
            _lib = _load()
        return _lib
