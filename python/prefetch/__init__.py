"""prefetch: batches from the node's prefetchd for Python trainers.

    import prefetch
    loader = prefetch.Loader("demo", batch_size=256, device="cuda:0")
    for epoch in range(3):
        loader.set_epoch(epoch)
        for batch in loader:
            loss = step(batch["images"], batch["labels"])

A pure-Python package over libprefetch (client/prefetch.h) through ctypes.
Batches share the daemon's slot memory: numpy arrays for host sessions,
torch tensors on the GPU for CUDA sessions.  loader.py states the release
rule and the epoch numbering; _lib.py where the library is looked for
(``library_path()`` says which was used).  ``prefetch.torch.DataLoader``
dresses a Loader as torch's DataLoader; torch is imported only when it is
used (``import prefetch`` never imports it).
"""

from .loader import Batch, DeviceArray, Loader, PrefetchError, PrefetchWarning

__all__ = ["Batch", "DeviceArray", "Loader", "PrefetchError", "PrefetchWarning",
           "library_path"]
__version__ = "0.1.0"


def library_path() -> str:
    """The path libprefetch was loaded from, loading it if it was not yet:
    ``$PREFETCH_LIB``, else ``libprefetch.so`` next to this package, else
    the checkout's ``build/libprefetch.so``, else ``libprefetch.so.0`` from
    the system path (or ``/usr/local/lib``).  OSError naming every place
    tried when none loads."""
    from . import _lib

    return _lib.path()


def __getattr__(name: str):
    # prefetch.torch on first use, so that importing prefetch imports no
    # torch (the submodule itself imports torch only when it is used).
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError("module 'prefetch' has no attribute %r" % name)
