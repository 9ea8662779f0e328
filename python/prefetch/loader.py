"""Loader and Batch: a prefetchd session seen from a Python trainer.

A Loader is one libprefetch client with one session open on a dataset.
``for batch in loader`` runs the current epoch (``loader.set_epoch(n)``
chooses it, as DistributedSampler's does) and ``loader.epoch(n)`` runs epoch
n; each Batch maps field names to arrays that share the daemon's slot memory
(zero-copy): numpy arrays for host sessions, torch tensors (or, without
torch, objects exposing ``__cuda_array_interface__``) for CUDA sessions.

Epoch numbers.  Epoch n is shuffled with seed + n, and n is the number the
daemon knows it by: ``batch.epoch``, ``prefetchctl status`` and the
daemon's messages ("epoch 3 batch 7: ...") all say n.  Within one session
the numbers only grow (prefetchd's protocol), so an epoch number runs once
per Loader; ``for batch in loader`` without ``set_epoch`` runs the epoch
after the last one.

Orders.  An epoch is shuffled (``shuffle=True``: the README's shuffle of
seed + n), sequential, an explicit list of picks (``sampler=``, this rank's
indices as torch's DataLoader takes them, or ``epoch(n, order=...)``, the
whole epoch's list, which the daemon shards across ranks like the
shuffle), or paced (``batch_sampler=`` or ``epoch(n, batches=...)``: the
trainer names every batch's picks and the daemon loads them in that order,
``paced_ahead`` requests ahead of the batch being trained on).

The release rule.  A slot goes back to the daemon when the trainer asks for
the next batch, when the epoch loop ends or is left, or on
``batch.release()``.  For a CUDA session the release is queued behind the
work already on ``torch.cuda.current_stream()``: libprefetch records an
event there and returns the slot only once that event has completed, so a
kernel still reading the batch never sees it overwritten, and the trainer
never blocks on it.  Host arrays are read synchronously by the trainer, so
their slot goes back at once: after its release an array (or tensor) taken
from a batch may show another batch's bytes; ``arr.copy()`` keeps the data.

Lifetime.  The memory an array or tensor reads stays mapped as long as it
exists: each one holds (through its base chain, or torch's reference to the
``__cuda_array_interface__`` object) the native client whose mappings it
reads, and ``pf_close`` runs only when the last reference goes, the
Loader's included.  So reading an array after ``loader.close()``, or after
the Loader was garbage-collected, never crashes; the connection and the
session (idle, its epoch abandoned) last until then.  The exception: with
``reconnect_s``, arrays taken before a daemon restart read the old daemon's
arenas, which libprefetch unmaps once no batch taken from them is held.

Pickling.  A Loader pickles as its configuration and its position (the
epoch ``for batch in loader`` runs next, a pending ``load_state_dict``), not
as its connection: the copy connects on first use, in whatever process
unpickles it, with a session of its own.

Threads: a Loader is used from one thread at a time (as a pf_client is).
"""

from __future__ import annotations

import errno
import os
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Optional, Union

import ctypes

import numpy as np

from . import _lib

# pf_next waits in slices this long, so that a Ctrl-C in a trainer waiting
# for a stalled daemon is seen within this time (a signal only reaches
# Python code once the C call returns).
_WAIT_SLICE_MS = 200
_ETIMEDOUT = errno.ETIMEDOUT
# Views kept for reuse (Loader._view): a few per slot and field.
_MAX_VIEWS = 4096
# Skipped error batches kept in Loader.skipped_errors (the count has no cap).
_MAX_SKIPPED_KEPT = 100
# ctypes.c_char * (8 * count), by count: the types a batch's picks are
# copied out through (one a batch size, in practice).
_PICKS_TYPES: dict = {}

# What may stand for a device: "cpu", "host", "cuda", "cuda:N" or a
# torch.device (anything whose str() is one of those).
Device = Union[str, Any]
# Picks: a sequence of non-negative integers (a list, a range, a numpy array).
Picks = Union[Sequence[int], np.ndarray]


class PrefetchError(Exception):
    """A libprefetch call failed.  ``code`` is its negative errno value and
    the message is the library's (``pf_errmsg``), which carries the daemon's
    own text when the daemon refused."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def errno(self) -> int:
        """The positive errno (``errno.ENOENT``, ...)."""
        return -self.code


class PrefetchWarning(UserWarning):
    """Issued for each error batch a Loader with ``skip_errors=True`` skips."""


class _Client:
    """The native client (a struct pf_client *), owned: pf_close runs when the
    last reference goes.  The Loader holds one, and so does every array and
    tensor of its batches (see the module's lifetime rule), so no array
    outlives the mapping it reads.  The finaliser may run on any thread;
    by then the Loader has let go, so nothing else uses the client."""

    __slots__ = ("_lib", "ptr")

    def __init__(self, lib, ptr):
        self._lib = lib
        self.ptr = ptr

    def __del__(self):
        ptr, self.ptr = self.ptr, None
        if ptr:
            self._lib.pf_close(ptr)


class _HostMemory:
    """One field of a host batch as numpy sees it (``__array_interface__``,
    read-only): the base of the arrays made from it, keeping the client that
    maps it alive."""

    __slots__ = ("_interface", "_owner")

    def __init__(self, addr, shape, dtype, owner):
        # Read-only: the arena is mapped read-only, so a write would be
        # SIGSEGV; numpy refuses it instead.
        self._interface = {"shape": shape, "typestr": dtype.str, "data": (addr, True),
                           "strides": None, "version": 3}
        self._owner = owner

    @property
    def __array_interface__(self):
        return self._interface


class DeviceArray:
    """A field of a CUDA batch when no CUDA-enabled torch can be imported:
    device memory described by ``__cuda_array_interface__`` (version 3),
    which CuPy, Numba and torch consume without a copy.  It keeps the client
    that imported the memory alive; so does a tensor made from it, since
    torch holds the interface object for the tensor's life."""

    __slots__ = ("ptr", "shape", "dtype", "stream", "_owner", "__weakref__")

    def __init__(self, ptr: int, shape: tuple, dtype: np.dtype, owner: Any = None,
                 stream: Optional[int] = None):
        self.ptr = ptr
        self.shape = shape
        self.dtype = dtype
        self.stream = stream
        self._owner = owner

    @property
    def __cuda_array_interface__(self) -> dict:
        # "stream": the stream whose work completes the batch (1, the
        # legacy default stream, which libprefetch orders after a batch
        # gathered from the VRAM pool), or None when torch consumes it on
        # the stream pf_next_stream was given.  Not marked read-only
        # although it is the daemon's slot: torch refuses read-only
        # interfaces.
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "strides": None,
            "version": 3,
            "stream": self.stream,
        }

    def __repr__(self):
        return "DeviceArray(ptr=0x%x, shape=%r, dtype=%s)" % (self.ptr, self.shape, self.dtype)


class Batch(Mapping):
    """One batch: ``batch[field]`` is that field's ``count`` samples, shaped
    ``(count, *sample_shape)`` with the .npy file's dtype.  ``picks`` (a copy,
    kept after release) are the schedule-space indices of the samples,
    ``seq`` the batch's number within this rank's share of the epoch and
    ``epoch`` the epoch's number (the one ``set_epoch`` or ``Loader.epoch``
    was given, and ``prefetchctl status`` shows).

    The arrays share the slot's memory, which another batch may fill once
    this one is released (see the module's release rule); ``batch[field]``
    after the release raises RuntimeError."""

    __slots__ = ("_loader", "_ptr", "_data", "_cache", "_picks_raw", "_picks", "on_device",
                 "count", "seq", "epoch", "__weakref__")

    def __init__(self, loader, addr):
        b = _lib.Batch.from_address(addr)
        self._loader = loader
        self._ptr = addr  # the struct pf_batch's address; None once released
        self._data = b.data
        self._cache = None
        self.on_device: bool = b.on_device
        self.count: int = b.count
        self.seq: int = b.seq
        self.epoch: int = b.epoch
        # The picks' bytes, copied now (the release frees them); the array
        # is made from them on first use, which a loop that never looks at
        # them does not pay for.  Copied through a char array type kept per
        # size: half the cost of ctypes.string_at, which is a foreign call.
        count = self.count
        picks_type = _PICKS_TYPES.get(count)
        if picks_type is None:
            picks_type = _PICKS_TYPES.setdefault(count, ctypes.c_char * (8 * count))
        self._picks_raw = picks_type.from_address(b.picks).raw if count else b""
        self._picks = None

    @property
    def picks(self) -> np.ndarray:
        """The schedule-space indices of the samples (uint64, a copy of this
        batch's own, kept after the release)."""
        if self._picks is None:
            self._picks = np.frombuffer(bytearray(self._picks_raw), dtype=np.uint64)
        return self._picks

    @property
    def released(self) -> bool:
        return self._ptr is None

    def __getitem__(self, name: str) -> Any:
        cache = self._cache  # None once released (Loader._forget)
        if cache is not None:
            arr = cache.get(name)
            if arr is not None:
                return arr
        if self._ptr is None:
            raise RuntimeError("batch %d of epoch %d was released; copy its arrays to keep "
                               "their data" % (self.seq, self.epoch))
        loader = self._loader
        index = loader._field_index[name]  # KeyError for a field it lacks
        arr = loader._view(self._data[index], index, self.count)
        if cache is None:
            self._cache = {name: arr}
        else:
            cache[name] = arr
        return arr

    def __iter__(self) -> Iterator[str]:
        return iter(self._loader._field_index)

    def __len__(self) -> int:
        return len(self._loader._field_index)

    def release(self) -> None:
        """Gives the slot back now (behind the current stream for CUDA
        batches).  Releasing twice is harmless."""
        if self._ptr is not None:
            self._loader._release(self)

    def __repr__(self):
        return "<prefetch.Batch epoch=%d seq=%d count=%d%s>" % (
            self.epoch, self.seq, self.count, " released" if self._ptr is None else "")


def _cuda_torch():
    """torch, when it is importable and built with CUDA that sees a GPU;
    else None (a CPU-only torch cannot hold device tensors)."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _env_int(name, default):
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError("$%s=%r is not an integer" % (name, value)) from None


def _picks_array(picks: Picks, what: str) -> np.ndarray:
    """picks as a C-contiguous uint64 array (what libprefetch reads), after
    checking that they are non-negative integers: a float or a negative
    number must not silently become some other sample."""
    arr = np.asarray(picks)
    if arr.ndim != 1:
        raise ValueError("%s: picks must be one-dimensional, not of shape %r" % (what, arr.shape))
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError("%s: picks must be integers, not %s" % (what, arr.dtype))
    if arr.size and arr.dtype.kind == "i" and int(arr.min()) < 0:
        raise ValueError("%s: pick %d is negative" % (what, int(arr.min())))
    return np.ascontiguousarray(arr, dtype=np.uint64)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class Loader:
    """A session on ``dataset`` at the node's prefetchd.

    ``device``: "cpu" or "host" (numpy arrays in host memory), "cuda:N"
    (torch tensors on GPU N in this process's numbering), "cuda" (torch's
    current device), or a torch.device.  ``seed``: epoch n is shuffled with
    seed + n.  ``rank``/``world_size``: this trainer's share of each epoch
    (DistributedSampler-style), by default from torchrun's $RANK and
    $WORLD_SIZE, else 0 and 1.  ``socket``: the daemon's socket, by default
    $PREFETCHD_SOCKET, else /run/prefetchd/prefetchd.sock.  ``augment``,
    ``min_depth``, ``max_depth``, ``ipc`` ("default", "fd" or "legacy") and
    ``name`` go to the session as in ``struct pf_open_opts``.  ``timeout``:
    seconds a batch may take before PrefetchError (-ETIMEDOUT); None waits
    for ever.

    ``sampler``: this rank's picks of each epoch, in order, instead of the
    shuffle: a list (or array) of picks, or an iterable of them that is
    iterated again each epoch, such as a torch Sampler (its
    ``set_epoch(n)``, when it has one, is called first, so a
    DistributedSampler shards and shuffles itself).  They are this rank's
    already, as with torch's DataLoader: the daemon shards them no further.
    ``batch_sampler``: an iterable of batches, each a sequence of 1 to
    ``batch_size`` picks, iterated again each epoch (``set_epoch`` called as
    for ``sampler``): the epoch is paced, each batch what the trainer asked
    for, ``paced_ahead`` (at most 1024) requested ahead of the one being
    trained on.  Picks range over ``augment`` times the dataset's samples.

    ``order``: "shuffle" (the default, or "sequential" when ``shuffle`` is
    false), or "block_shuffle" for datasets read from disk (``read =
    direct``): blocks of consecutive samples in a shuffled order, shuffled
    among themselves in windows of ``window_blocks`` blocks (default 16);
    the block is ``block_rows`` samples or ``block_bytes`` bytes of them
    (one of the two; default 4 MiB).  docs/SHUFFLE.md specifies it.

    ``skip_errors``: an error batch (a file cut short or changed on disk, a
    read error, a paced pick out of range) raises PrefetchError and ends
    the epoch loop by default; with ``skip_errors=True`` it is skipped with a
    PrefetchWarning naming the error, counted in ``skipped`` (the errors
    themselves, the last 100, in ``skipped_errors``), and the epoch goes on.
    Connection failures and timeouts are never skipped.

    ``reconnect_s``: seconds to keep trying to get the session back when
    the daemon goes away (it crashed, was killed or restarted); 0, the
    default, raises PrefetchError (errno ECONNRESET) within a second of its
    death instead.  While reconnecting, the epoch loop simply waits; once a
    daemon answers on the socket again, the session is re-opened and the
    epoch goes on with the first batch not yet taken, nothing lost or
    repeated (``stats()["reconnects"]`` counts the times).  The batch in
    hand when the daemon died stays readable (host sessions) until it is
    released; for CUDA sessions treat it as gone.  ``timeout`` still bounds
    each wait for a batch, the time spent reconnecting included.

    ``share``: a name; Loaders of one user that give the same name (a
    sweep's or an ensemble's trainers, on one GPU or on the host) get the
    same batches from one read, and on a GPU from one copy into device
    memory that each of them maps.  They must ask for the same dataset,
    device, batch_size, drop_last and augment (else PrefetchError names the
    difference), and start each epoch with the same order, seed, rank and
    world_size.  A Loader that falls more than the daemon's ``share_lag``
    batches behind the share's fastest gets the rest of the epoch from a
    session of its own, and one that starts an epoch late gets the share's
    next batch first and the ones it missed at the end: each Loader still
    sees every sample of the epoch once.  Shared batches are read-only to
    every one of them.  README, "Shares".

    Raises PrefetchError (with the daemon's message) when the daemon cannot
    be reached or refuses the session.
    """

    # The constructor's arguments, which are what a Loader pickles as
    # (with the position: see __getstate__).
    _CONFIG = ("dataset", "batch_size", "device", "shuffle", "seed", "drop_last", "rank",
               "world_size", "socket", "augment", "min_depth", "max_depth", "ipc", "name",
               "timeout", "reconnect_s", "sampler", "batch_sampler", "skip_errors",
               "paced_ahead", "order", "block_rows", "block_bytes", "window_blocks", "share")

    def __init__(self, dataset: str, batch_size: int = 256, device: Device = "cpu",
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 rank: Optional[int] = None, world_size: Optional[int] = None,
                 socket: Optional[str] = None, augment: int = 1, min_depth: int = 0,
                 max_depth: int = 0, ipc: str = "default", name: Optional[str] = None,
                 timeout: Optional[float] = None, reconnect_s: float = 0, *,
                 sampler: Optional[Iterable[int]] = None,
                 batch_sampler: Optional[Iterable[Picks]] = None, skip_errors: bool = False,
                 paced_ahead: int = 64, order: Optional[str] = None,
                 block_rows: Optional[int] = None, block_bytes: Optional[int] = None,
                 window_blocks: Optional[int] = None, share: Optional[str] = None):
        self._client = None  # a live connection: set by _connect
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.world_size = _env_int("WORLD_SIZE", 1) if world_size is None else int(world_size)
        self.rank = _env_int("RANK", 0) if rank is None else int(rank)
        self.socket = None if socket is None else os.fsdecode(socket)
        self.augment = int(augment)
        self.min_depth = int(min_depth)
        self.max_depth = int(max_depth)
        self.ipc = ipc
        self.timeout = timeout
        self.reconnect_s = float(reconnect_s)
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.skip_errors = bool(skip_errors)
        self.paced_ahead = int(paced_ahead)
        self.share = None if share is None else str(share)
        if self.share is not None and not self.share:
            raise ValueError("share must be a non-empty name, or None")
        if self.share is not None and batch_sampler is not None:
            raise ValueError("a batch_sampler's epochs are paced by each trainer and "
                             "cannot be shared")
        # order: "shuffle" or "sequential" (what shuffle says, by default),
        # or "block_shuffle" with its block size and window (docs/SHUFFLE.md).
        self.order = ("shuffle" if self.shuffle else "sequential") if order is None else order
        if self.order not in ("shuffle", "sequential", "block_shuffle"):
            raise ValueError("order must be 'shuffle', 'sequential' or 'block_shuffle', not %r"
                             % (order,))
        self.block_rows, self.block_bytes, self.window_blocks = (block_rows, block_bytes,
                                                                 window_blocks)
        if self.order != "block_shuffle" and (block_rows, block_bytes, window_blocks) != (
                None, None, None):
            raise ValueError("block_rows, block_bytes and window_blocks are for "
                             "order='block_shuffle' only")
        self._block_opts = (_lib.block_options(block_rows, block_bytes, window_blocks)
                            if self.order == "block_shuffle" else {})
        if self.batch_size <= 0:
            raise ValueError("batch_size must be positive, not %d" % self.batch_size)
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError("rank %d of world_size %d: need 0 <= rank < world_size"
                             % (self.rank, self.world_size))
        if not 0 <= self.reconnect_s <= 1e9:
            raise ValueError("reconnect_s must be a number of seconds >= 0, not %r"
                             % (reconnect_s,))
        if ipc not in _lib.PF_IPC:
            raise ValueError("ipc must be one of %s, not %r" % (", ".join(_lib.PF_IPC), ipc))
        if sampler is not None and batch_sampler is not None:
            raise ValueError("sampler and batch_sampler are exclusive: a batch_sampler "
                             "chooses every batch's picks itself")
        if not 1 <= self.paced_ahead <= _lib.PF_PACED_MAX:
            raise ValueError("paced_ahead must be 1..%d (requests the daemon holds), not %d"
                             % (_lib.PF_PACED_MAX, self.paced_ahead))
        self.device = self._parse_device(device)
        self._auto_name = name is None
        self.name = self._default_name() if name is None else str(name)
        self._reset_position()
        self._closed = False
        self._num_samples = self._fields = None  # the dataset's shape, once connected
        self._connect()

    # ---- set-up ------------------------------------------------------------

    def _reset_position(self):
        """What a new Loader (or an unpickled one) starts from."""
        # The epoch `for batch in loader` runs next (set_epoch).
        self._next_epoch = 0
        # Epoch bookkeeping for state_dict: the epoch last started, how many
        # batches of it were taken (counting from 0, including any skipped
        # by a resume or as error batches), and whether it ran to its end.
        self._epoch = None
        self._taken = 0
        self._finished = False
        self._resume = None  # (epoch, start_batch) from load_state_dict
        self.skipped = 0
        self.skipped_errors = []

    def _forget_connection(self):
        """The state that belongs to one connection and session."""
        self._client = None  # the pf_client pointer while open (self._owner.ptr)
        self._owner = None  # the _Client that closes it
        self._held = None  # the batch last yielded, until released
        self._active = None  # token of the epoch generator that may call pf_next
        self._views = {}  # (address, field, rows) -> maker of its view (Loader._view)
        # pf_release_next's output, reused by every call (Loader._next).
        self._out = ctypes.c_void_p()
        self._out_ref = ctypes.byref(self._out)
        self._last_started = None  # the session's last epoch, which later ones exceed
        self._torch = None

    @staticmethod
    def _default_name():
        prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        return "%s[%d]" % (prog, os.getpid())

    def _connect(self):
        """Connects and opens the session (the constructor, or the first use
        of an unpickled Loader)."""
        self._forget_connection()
        self._device_index = None if self.device == "host" else int(self.device[5:])
        lib = _lib.lib()
        self._libref = lib
        client = ctypes.c_void_p()
        path = None if self.socket is None else os.fsencode(self.socket)
        rc = lib.pf_connect(path, ctypes.byref(client))
        if rc:
            message = lib.pf_errmsg(client).decode(errors="replace")
            lib.pf_close(client)
            raise PrefetchError(rc, message)
        self._owner = _Client(lib, client)
        self._client = client
        opts = _lib.OpenOpts(dataset=self.dataset.encode(), device=self.device.encode(),
                             batch_size=self.batch_size, drop_last=self.drop_last,
                             augment=self.augment, min_depth=self.min_depth,
                             max_depth=self.max_depth, ipc=_lib.PF_IPC[self.ipc],
                             name=self.name.encode(), reconnect_s=self.reconnect_s,
                             share=None if self.share is None else self.share.encode())
        try:
            self._check(lib.pf_open(client, ctypes.byref(opts)))
            self._read_fields()
            if self._device_index is not None:
                self._torch = _cuda_torch()
                if self._torch is not None:
                    self._torch_device = self._torch.device("cuda", self._device_index)
                    # Asked once per batch: torch's private getter returns
                    # the handle without building a Stream object.
                    self._raw_stream = getattr(
                        self._torch._C, "_cuda_getCurrentRawStream",
                        lambda i, torch=self._torch: torch.cuda.current_stream(i).cuda_stream)
                    # Before the first tensor: torch's lazy CUDA set-up, in
                    # the primary context the arenas are mapped into.
                    self._torch.cuda.init()
        except BaseException:
            self._disconnect()
            raise

    def _ensure_open(self):
        """Raises on a closed Loader; connects an unpickled one."""
        if self._closed:
            raise ValueError("this Loader is closed")
        if self._client is None:
            self._connect()

    @staticmethod
    def _parse_device(device):
        if device is None:
            return "host"
        device = str(device)  # a torch.device prints as "cuda:0" or "cpu"
        if device in ("cpu", "host"):
            return "host"
        if device == "cuda":
            torch = _cuda_torch()
            return "cuda:%d" % (torch.cuda.current_device() if torch is not None else 0)
        if device.startswith("cuda:") and device[5:].isdigit():
            return device
        raise ValueError("device must be \"cpu\", \"host\", \"cuda\" or \"cuda:N\", not %r"
                         % device)

    def _read_fields(self):
        lib = self._libref
        self._num_samples = lib.pf_num_samples(self._client)
        self._fields = []
        self._field_index = {}
        self._layout = []  # per field: (numpy dtype, sample shape)
        for i in range(lib.pf_num_fields(self._client)):
            f = _lib.Field()
            self._check(lib.pf_field_info(self._client, i, ctypes.byref(f)))
            name = f.name.decode()
            dtype = np.dtype(f.dtype.decode())
            shape = tuple(int(f.shape[d]) for d in range(f.ndim))
            self._fields.append((name, f.dtype.decode(), shape))
            self._field_index[name] = i
            self._layout.append((dtype, shape))

    @property
    def num_samples(self) -> int:
        """N: the dataset's samples (picks range over augment * N)."""
        if self._num_samples is None:
            self._ensure_open()
        return self._num_samples

    @property
    def fields(self) -> list:
        """The dataset's fields: (name, dtype string, sample shape) each."""
        if self._fields is None:
            self._ensure_open()
        return self._fields

    # ---- errors --------------------------------------------------------------

    def _check(self, rc):
        if rc:
            raise PrefetchError(rc, self._errmsg(rc))
        return rc

    def _errmsg(self, rc):
        msg = self._libref.pf_errmsg(self._client).decode(errors="replace")
        return msg or os.strerror(-rc)

    # ---- batches -------------------------------------------------------------

    def _view(self, addr, index, count):
        """Field `index` of a batch at addr: a read-only numpy view of host
        memory, or a tensor / DeviceArray on the GPU.  Slots are reused, so
        each view is made once per (address, rows) and handed out again
        for every later batch in that slot (building a tensor costs more
        than the rest of a batch); a view read after its batch's release
        shows whatever the slot holds, as the release rule says."""
        key = (addr, index, count)
        fresh = self._views.get(key)
        if fresh is not None:
            return fresh()
        dtype, shape = self._layout[index]
        full = (count,) + shape
        if self.device == "host":
            view = np.asarray(_HostMemory(addr, full, dtype, self._owner))
        else:
            view = DeviceArray(addr, full, dtype, self._owner,
                               stream=1 if self._torch is None else None)
            if self._torch is not None:
                view = self._torch.as_tensor(view, device=self._torch_device)
        if len(self._views) >= _MAX_VIEWS:
            self._views.clear()  # a reconnect moved the arenas: start again
        # Kept as what makes each batch's object: a new tensor or numpy
        # array over the same memory each time, since what a trainer does
        # to one batch's tensor (requires_grad_, an in-place reshape) must
        # not reach the next batch in that slot.  A DeviceArray, a plain
        # descriptor, is handed out as it is.
        if isinstance(view, DeviceArray):
            fresh = (lambda v=view: v)
        elif self._torch is not None:
            fresh = view.detach
        else:
            fresh = view.view
        self._views[key] = fresh
        return fresh()

    def _stream(self):
        """The cudaStream_t a CUDA release waits for: torch's current stream
        on this device, else the legacy default stream (NULL)."""
        if self._torch is None:
            return None
        return self._raw_stream(self._device_index) or None

    def _forget(self, batch):
        """Marks batch released here and returns its address for the
        library.  Forgotten even if the library's call then fails: it has
        either dropped the batch (a broken connection) or keeps it until
        pf_close, and it refuses a batch it does not hold, so nothing is
        freed twice."""
        ptr, batch._ptr = batch._ptr, None
        batch._cache = None
        if self._held is batch:
            self._held = None
        return ptr

    def _release(self, batch):
        ptr = self._forget(batch)
        if self._client is None:
            return
        rc = self._libref.pf_release(self._client, ctypes.cast(ptr, _lib.Batch_p),
                                     self._stream() if batch.on_device else None)
        self._check(rc)

    def _next(self, held=None):
        """pf_release_next in slices (see _WAIT_SLICE_MS), giving back `held`
        (the batch in hand) in the same call; a batch's address, or None at
        the end of the epoch.  Run once a batch: kept lean."""
        # CUDA: the batch is used on torch's current stream, which
        # libprefetch orders after the batch's assembly, and the one given
        # back is released behind it.
        stream = self._stream()
        release = self._forget(held) if held is not None else None
        fn = self._libref.pf_release_next_addr
        out = self._out
        waited = 0.0
        while True:
            rc = fn(self._client, release, stream, _WAIT_SLICE_MS, self._out_ref)
            release = None
            if rc != -_ETIMEDOUT:
                if rc:
                    self._check(rc)
                return out.value
            waited += _WAIT_SLICE_MS / 1000.0
            if self.timeout is not None and waited >= self.timeout:
                raise PrefetchError(rc, "no batch from prefetchd within %g s" % self.timeout)

    def _skip(self, error):
        """An error batch, skipped (skip_errors): counted, kept, warned of."""
        self.skipped += 1
        self.skipped_errors.append(error)
        del self.skipped_errors[:-_MAX_SKIPPED_KEPT]
        name = errno.errorcode.get(error.errno, "errno %d" % error.errno)
        warnings.warn("prefetch: skipped an error batch (%s): %s" % (name, error.message),
                      PrefetchWarning, stacklevel=3)

    # ---- epochs --------------------------------------------------------------

    def set_epoch(self, n: int) -> None:
        """Makes ``for batch in loader`` run epoch n next (shuffled with
        seed + n), as DistributedSampler.set_epoch does.  Epoch numbers only
        grow within a session: ValueError for one not above the last epoch
        this Loader started."""
        self._next_epoch = self._check_epoch_number(n)

    def _check_epoch_number(self, n):
        n = int(n)
        if n < 0:
            raise ValueError("epoch numbers start at 0, not %d" % n)
        if self._client is not None and self._last_started is not None \
                and n <= self._last_started:
            raise ValueError("epoch %d is not after epoch %d, the last this Loader started: "
                             "epoch numbers only grow within a session (prefetchd's "
                             "protocol); a new Loader may start at any"
                             % (n, self._last_started))
        return n

    def __iter__(self) -> Iterator[Batch]:
        """Runs the current epoch: the one set_epoch (or load_state_dict)
        chose, else the one after the last this Loader started (0 first)."""
        return self.epoch(self._next_epoch)

    def __len__(self) -> int:
        """This rank's batches per epoch: its DistributedSampler-style share
        of augment * N picks (or the sampler's picks, or the batch sampler's
        batches) in batches of batch_size, the last one partial unless
        drop_last.  TypeError when a sampler has no length."""
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        if self.sampler is not None:
            picks = len(self.sampler)
        else:
            picks = _ceil_div(self.num_samples * self.augment, self.world_size)
        return picks // self.batch_size if self.drop_last else _ceil_div(picks, self.batch_size)

    def epoch(self, n: int, *, order: Optional[Picks] = None,
              batches: Optional[Iterable[Picks]] = None) -> Iterator[Batch]:
        """Starts epoch n and yields its batches.  The epoch is ordered as
        the Loader says (shuffled with seed + n, sequential, its sampler's,
        or paced by its batch_sampler), or by ``order``: the whole epoch's
        picks, the same list on every rank, which the daemon shards across
        ranks like the shuffle; or paced by ``batches``: this rank's batches,
        each a sequence of 1 to batch_size picks, loaded in that order.

        Leaving the loop early (break, an exception, the generator closed or
        dropped) abandons the epoch: the daemon stops filling at once.  After
        ``load_state_dict``, ``epoch(d["epoch"])`` resumes after the batches
        the saved loader had taken.  Starting another epoch ends this one.
        ValueError for an epoch number not above the last one started."""
        self._ensure_open()
        n = self._check_epoch_number(n)
        if order is not None and batches is not None:
            raise ValueError("order and batches are exclusive")
        if order is not None:
            order = _picks_array(order, "epoch %d's order" % n)
        return self._run_epoch(n, order, batches)

    def _epoch_source(self, n, order, batches):
        """(PF_ORDER_*, explicit picks or None, paced batches or None, rank,
        world) for epoch n."""
        if batches is not None:
            return _lib.PF_ORDER_PACED, None, batches, 0, 1
        if order is not None:
            return _lib.PF_ORDER_EXPLICIT, order, None, self.rank, self.world_size
        source = self.batch_sampler if self.batch_sampler is not None else self.sampler
        if source is not None and hasattr(source, "set_epoch"):
            source.set_epoch(n)
        if self.batch_sampler is not None:
            return _lib.PF_ORDER_PACED, None, self.batch_sampler, 0, 1
        if self.sampler is not None:
            picks = _picks_array(self.sampler if isinstance(self.sampler, np.ndarray)
                                 else list(self.sampler), "epoch %d's sampler" % n)
            return _lib.PF_ORDER_EXPLICIT, picks, None, 0, 1
        kind = {"shuffle": _lib.PF_ORDER_SHUFFLE, "sequential": _lib.PF_ORDER_SEQUENTIAL,
                "block_shuffle": _lib.PF_ORDER_BLOCK_SHUFFLE}[self.order]
        return kind, None, None, self.rank, self.world_size

    def _run_epoch(self, n, order, batches):
        lib = self._libref
        start = 0
        if self._resume is not None:
            if self._resume[0] == n:
                start = self._resume[1]
            self._resume = None
        self._end_epoch()
        token = object()
        self._active = token
        kind, picks, paced, rank, world = self._epoch_source(n, order, batches)
        self._epoch, self._taken, self._finished = n, start, False
        requests = None
        try:
            self._check(lib.pf_set_epoch(self._client, n))
            opts = _lib.EpochOpts(order=kind, seed=(self.seed + n) & (2**64 - 1), rank=rank,
                                  world=world, start_batch=0 if paced is not None else start,
                                  **(self._block_opts
                                     if kind == _lib.PF_ORDER_BLOCK_SHUFFLE else {}))
            if picks is not None:
                opts.indices = picks.ctypes.data_as(_lib.u64p)
                opts.nindices = picks.size
            self._check(lib.pf_start_epoch(self._client, ctypes.byref(opts), None))
            self._last_started = n
            self._next_epoch = n + 1
            if paced is not None:
                requests = _PacedRequests(self, n, iter(paced), start)
                requests.send()
            while True:
                if self._closed or self._client is None:
                    raise ValueError("this Loader is closed")
                if self._active is not token:
                    raise RuntimeError("epoch %d was ended by another epoch started on the "
                                       "same Loader" % n)
                try:
                    ptr = self._next(self._held)
                except PrefetchError as e:
                    if not (self.skip_errors and lib.pf_error_batch(self._client)):
                        raise
                    self._taken += 1  # it had its place in the epoch
                    self._skip(e)
                    if requests is not None:
                        requests.send()
                    continue
                if ptr is None:
                    self._finished = True
                    return
                batch = Batch(self, ptr)
                self._held = batch
                self._taken += 1
                if requests is not None:
                    requests.send()
                yield batch
        finally:
            if self._active is token:
                self._end_epoch()

    def _end_epoch(self):
        """Abandons an unfinished epoch and releases the batch in hand.  A
        host batch goes back after the abandon, so that the daemon does not
        fill its slot again for the epoch being left (as pf_abandon does
        with the batches it returns).  A device batch is released first:
        its release waits behind the trainer's stream, and pf_abandon, which
        waits a little for such releases, sends it after the abandon; in
        the other order it would wait for the next call into the loader."""
        self._active = None
        if self._client is None:
            return
        held = self._held
        if held is not None and held.on_device:
            self._release_quietly(held)
        if self._epoch is not None and not self._finished:
            # An abandon that fails means the connection is gone; this may
            # run while another exception propagates (or from the garbage
            # collector), so it must not raise in its place.
            self._libref.pf_abandon(self._client)
        if held is not None and not held.on_device:
            self._release_quietly(held)

    @staticmethod
    def _release_quietly(batch):
        try:
            batch.release()
        except PrefetchError:
            pass  # the connection is broken: the next call says so

    # ---- resume ----------------------------------------------------------------

    def state_dict(self) -> dict:
        """Where this loader stands: ``epoch`` and ``batches_taken`` (batches
        of that epoch taken so far, the one in hand included), so that
        ``epoch(d["epoch"])`` after ``load_state_dict(d)`` goes on with the
        next one; after an epoch ran to its end, the next epoch and 0.  The
        other keys describe the schedule and are checked on load."""
        if self._resume is not None:
            epoch, taken = self._resume
        elif self._epoch is None:
            epoch, taken = self._next_epoch, 0
        elif self._finished:
            epoch, taken = self._epoch + 1, 0
        else:
            epoch, taken = self._epoch, self._taken
        return {
            "epoch": epoch,
            "batches_taken": taken,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "rank": self.rank,
            "world_size": self.world_size,
            "augment": self.augment,
            "dataset": self.dataset,
            "num_samples": self.num_samples,
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Makes the next epoch (``for batch in loader``, or
        ``epoch(state["epoch"])``) start after ``state["batches_taken"]``
        batches, with the saved seed.  The batch size, world size, shuffle,
        drop_last, augment and sample count must match (they decide which
        samples the batches hold): ValueError otherwise.  A paced epoch
        resumes by passing over the first batches_taken batches its batch
        sampler yields (it must yield the same ones again)."""
        for key in ("batch_size", "world_size", "shuffle", "drop_last", "augment",
                    "num_samples"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError("state_dict has %s=%r but this Loader has %r: the saved "
                                 "position means other samples here"
                                 % (key, state[key], getattr(self, key)))
        epoch, taken = int(state["epoch"]), int(state["batches_taken"])
        if epoch < 0 or taken < 0:
            raise ValueError("state_dict has epoch %d, batches_taken %d" % (epoch, taken))
        self._next_epoch = self._check_epoch_number(epoch)
        if "seed" in state:
            self.seed = int(state["seed"])
        self._resume = (epoch, taken)

    # ---- pickling ----------------------------------------------------------------

    def __getstate__(self) -> dict:
        state = {key: getattr(self, key) for key in self._CONFIG}
        if self._auto_name:
            state["name"] = None  # the new process names itself
        state["position"] = {"next_epoch": self._next_epoch, "resume": self._resume}
        return state

    def __setstate__(self, state: dict) -> None:
        position = state.pop("position", {})
        for key in self._CONFIG:
            setattr(self, key, state.get(key))
        self._auto_name = self.name is None
        if self._auto_name:
            self.name = self._default_name()
        self._reset_position()
        self._next_epoch = position.get("next_epoch", 0)
        self._resume = position.get("resume")
        self._closed = False
        self._num_samples = self._fields = None
        self._forget_connection()
        self._device_index = None if self.device == "host" else int(self.device[5:])

    # ---- the rest ------------------------------------------------------------------

    def stats(self) -> dict:
        """This client's counters: batches and bytes taken, batches held,
        seconds waiting in pf_next (wait_s) and between calls (busy_s),
        stall_fraction = wait / (wait + busy), reconnects (sessions opened
        again after the daemon went away), resume_batch (the first batch of
        the current epoch not taken yet) and skipped (error batches skipped
        under skip_errors, all epochs)."""
        self._ensure_open()
        s = _lib.Stats()
        self._check(self._libref.pf_stats(self._client, ctypes.byref(s)))
        out = {k: getattr(s, k) for k, _ in _lib.Stats._fields_}
        out["skipped"] = self.skipped
        return out

    def set_depth(self, target: int) -> None:
        """Sets this session's target depth (0: automatic)."""
        self._ensure_open()
        self._check(self._libref.pf_set_depth(self._client, 0, int(target)))

    def probe(self) -> None:
        """CUDA sessions: reports the GPU's free memory to the daemon now
        (pf_probe), so that it resizes the depth and the VRAM pool at once;
        call it after the trainer's own memory use changed (a bigger model,
        an evaluation pass).  PrefetchError (-EINVAL) for a host session."""
        self._ensure_open()
        self._check(self._libref.pf_probe(self._client))

    def _disconnect(self):
        self._held = None
        self._client = None
        self._owner = None
        self._views = {}  # the views hold the client: only the trainer's may now

    def close(self) -> None:
        """Abandons the epoch, releases the batch in hand and lets go of the
        connection: it closes now, or once the last array or tensor of this
        loader's batches is gone (they stay readable until then)."""
        self._closed = True
        if self._client is None:
            return
        try:
            # Behind the current stream for a CUDA batch, as any release.
            self._end_epoch()
        finally:
            self._disconnect()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        return "<prefetch.Loader %s on %s, batch_size=%d%s>" % (
            self.dataset, self.device, self.batch_size,
            ", closed" if self._closed else "" if self._client is not None else ", not connected")


class _PacedRequests:
    """The requests of one paced epoch: pf_load for the trainer's batches,
    kept `paced_ahead` ahead of those taken (error batches included), then
    pf_load_end once the iterator is spent.  Pulled lazily, so that a
    sampler that adapts to the training (a curriculum) sees a bounded
    look-ahead.  A resumed epoch passes over the batches taken before."""

    def __init__(self, loader, n, it, skip):
        self.loader = loader
        self.n = n
        self.it = it
        self.requested = skip
        self.ended = False
        for _ in range(skip):
            if next(it, None) is None:
                break

    def send(self):
        loader = self.loader
        lib = loader._libref
        while not self.ended and self.requested - loader._taken < loader.paced_ahead:
            try:
                picks = next(self.it)
            except StopIteration:
                loader._check(lib.pf_load_end(loader._client))
                self.ended = True
                return
            what = "epoch %d, paced batch %d" % (self.n, self.requested)
            arr = _picks_array(picks, what)
            if not 1 <= arr.size <= loader.batch_size:
                raise ValueError("%s: %d picks; a batch holds 1 to batch_size = %d"
                                 % (what, arr.size, loader.batch_size))
            loader._check(lib.pf_load(loader._client, arr.ctypes.data_as(_lib.u64p), arr.size))
            self.requested += 1
