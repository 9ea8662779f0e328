"""prefetch: batches from the node's prefetchd for Python trainers.

    import prefetch
    loader = prefetch.Loader("demo", batch_size=256, device="cuda:0")
    for batch in loader.epoch(0):
        loss = step(batch["x"], batch["y"])

A pure-Python package over libprefetch (client/prefetch.h) through ctypes.
Batches share the daemon's slot memory: numpy arrays for host sessions,
torch tensors on the GPU for CUDA sessions.  loader.py states the release
rule; _lib.py where the library is looked for.
"""

from .loader import Batch, DeviceArray, Loader, PrefetchError

__all__ = ["Batch", "DeviceArray", "Loader", "PrefetchError", "library_path"]
__version__ = "0.1.0"


def library_path():
    """The path libprefetch was (or now is) loaded from."""
    from . import _lib

    return _lib.lib()._name
