"""prefetch.torch: a Loader dressed as ``torch.utils.data.DataLoader``.

    from prefetch.torch import DataLoader
    loader = DataLoader("demo", batch_size=256, shuffle=True, drop_last=True,
                        fields=("images", "labels"), device="cuda:0")
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)       # or loader.set_epoch(epoch)
        for images, labels in loader:         # torch tensors
            ...

What a training loop written for torch's DataLoader asks of it: iteration
over one epoch, ``len()`` (this rank's batches), ``batch_size``,
``drop_last``, ``dataset`` and a ``sampler`` whose ``set_epoch(n)`` picks the
epoch.  Batches are dicts of tensors (``{field: tensor}``), or tuples in the
order of ``fields``.  Keyword arguments of torch's DataLoader that ask for
loader workers (``num_workers``, ``prefetch_factor``, ``persistent_workers``,
``worker_init_fn``, ``multiprocessing_context``) are accepted and ignored:
the daemon does the loading.  ``collate_fn`` is refused (the daemon stacks
the samples; ``transform`` is applied to each whole batch instead).

Host sessions: each batch is copied into ordinary tensors (writable, valid
for as long as the trainer keeps them: what torch's DataLoader gives), into
page-locked memory with ``pin_memory=True``; ``copy=False`` hands out
zero-copy tensors instead, read-only (the daemon's slot is mapped read-only:
an in-place write crashes) and valid only until the next batch.  CUDA
sessions: the Loader's own zero-copy tensors on the GPU (``copy=True``
clones them).  Unsigned dtypes that this torch cannot hold (uint16, uint32
before torch 2.3: token shards are uint16) are widened to the next signed
one (int32, int64), in a copy even with ``copy=False`` (with a
PrefetchWarning, once per field).

torch is imported when a DataLoader is made, not when this module is.  The
DataLoader pickles (its Loader's configuration and options), so it can be
handed to code that pickles its data loader.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Optional

import numpy as np

from .loader import Batch, Loader, Picks, PrefetchWarning

# torch DataLoader arguments about loader workers: there are none here.
_WORKER_ARGS = ("num_workers", "prefetch_factor", "persistent_workers", "worker_init_fn",
                "multiprocessing_context", "generator", "pin_memory_device")
# What an unsigned numpy dtype widens to when this torch lacks it.
_WIDER = {np.dtype("u2"): np.dtype("i4"), np.dtype("u4"): np.dtype("i8")}


def _import_torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("prefetch.torch.DataLoader needs PyTorch (import torch failed: %s); "
                          "prefetch.Loader works without it" % e) from None
    return torch


class _EpochSampler:
    """``loader.sampler``: what training loops call ``set_epoch`` on.  It
    forwards the epoch to the Loader (which hands it on to a sampler of the
    trainer's own); iterating it gives this rank's picks of the epoch, as
    the daemon would deliver them when they are known without one."""

    def __init__(self, loader: Loader):
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)

    def __len__(self) -> int:
        loader = self._loader
        if loader.sampler is not None:
            return len(loader.sampler)
        world = loader.world_size
        return -(-loader.num_samples * loader.augment // world)

    def __iter__(self) -> Iterator[int]:
        loader = self._loader
        if loader.sampler is not None:
            return iter(loader.sampler)
        from .order import epoch_picks

        return iter(epoch_picks(loader.num_samples * loader.augment, loader.seed,
                                loader._next_epoch, loader.rank, loader.world_size,
                                loader.shuffle))

    def __getattr__(self, name):
        # The trainer's sampler's own attributes (a DistributedSampler's
        # num_replicas, rank, ...).
        inner = self.__dict__.get("_loader")
        if inner is not None and inner.sampler is not None:
            return getattr(inner.sampler, name)
        raise AttributeError(name)


class DataLoader:
    """A prefetch.Loader on ``dataset`` (a name in the daemon's config) that
    fits where torch's DataLoader is expected; see the module's text.

    ``batch_size``, ``shuffle``, ``sampler``, ``batch_sampler``, ``drop_last``,
    ``pin_memory`` and ``timeout`` mean what they mean to torch (defaults
    too: batch_size 1, no shuffle; with a batch_sampler, ``max_batch_size``
    or the sampler's own ``batch_size`` sizes the slots); ``fields`` makes batches tuples in that
    order; ``copy`` (None: copy host batches, not CUDA ones) and
    ``transform`` (a callable applied to each batch) as the module says;
    every other keyword (``device``, ``seed``, ``rank``, ``world_size``,
    ``socket``, ``skip_errors``, ...) goes to prefetch.Loader.
    """

    def __init__(self, dataset: str, batch_size: Optional[int] = 1, shuffle: bool = False,
                 sampler: Optional[Iterable[int]] = None,
                 batch_sampler: Optional[Iterable[Picks]] = None, drop_last: bool = False,
                 pin_memory: bool = False, timeout: float = 0, *,
                 fields: Optional[Sequence[str]] = None, copy: Optional[bool] = None,
                 transform: Optional[Callable[[Any], Any]] = None, collate_fn: Any = None,
                 max_batch_size: Optional[int] = None, **loader_kwargs: Any):
        torch = _import_torch()
        if collate_fn is not None:
            raise TypeError("prefetch.torch.DataLoader takes no collate_fn: the daemon "
                            "stacks each batch's samples itself; use transform=, which "
                            "gets the whole batch")
        for name in _WORKER_ARGS:
            loader_kwargs.pop(name, None)
        if batch_sampler is not None:
            # torch's rule: a batch_sampler comes with the default
            # batch_size.  Here the session's slots must hold the largest
            # batch: a torch BatchSampler says it, others are told.
            batch_size = max_batch_size or getattr(batch_sampler, "batch_size", None)
            if not batch_size:
                raise ValueError("with a batch_sampler, give max_batch_size= (the most picks "
                                 "a batch of it holds): the session's slots are sized by it")
        if batch_size is None:
            raise ValueError("batch_size=None (unbatched samples) is not served: prefetchd "
                             "delivers batches")
        self.dataset = dataset
        self.pin_memory = bool(pin_memory) and torch.cuda.is_available()
        self.fields = tuple(fields) if fields is not None else None
        self.transform = transform
        self.loader = Loader(dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                             batch_sampler=batch_sampler, drop_last=drop_last,
                             timeout=timeout if timeout and timeout > 0 else None,
                             **loader_kwargs)
        self.copy = (self.loader.device == "host") if copy is None else bool(copy)
        if self.fields is not None:
            known = [f[0] for f in self.loader.fields]
            for name in self.fields:
                if name not in known:
                    raise KeyError("dataset %r has no field %r (it has %s)"
                                   % (dataset, name, ", ".join(known)))
        self.sampler = _EpochSampler(self.loader)
        self._widened = set()  # fields copy=False had to copy (warned once)

    # What loops read off a DataLoader.
    @property
    def batch_size(self) -> int:
        return self.loader.batch_size

    @property
    def drop_last(self) -> bool:
        return self.loader.drop_last

    @property
    def batch_sampler(self) -> Optional[Iterable[Picks]]:
        return self.loader.batch_sampler

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (as sampler.set_epoch)."""
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        torch = _import_torch()
        for batch in self.loader:
            out = self._convert(torch, batch)
            yield self.transform(out) if self.transform is not None else out

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)

    def close(self) -> None:
        self.loader.close()

    def _tensor(self, torch, batch: Batch, name: str):
        arr = batch[name]
        if batch.on_device:
            if isinstance(arr, torch.Tensor):
                return arr.clone() if self.copy else arr
            raise TypeError("field %r of a CUDA batch: this torch cannot take device memory "
                            "(no CUDA-enabled torch sees the GPU)" % name)
        if not self.copy:
            with warnings.catch_warnings():
                # The slot is mapped read-only on purpose; the module's
                # text says what that means for the tensor.
                warnings.filterwarnings("ignore", message="The given NumPy array is not "
                                        "writable")
                try:
                    return torch.from_numpy(arr)
                except TypeError:
                    pass  # a dtype this torch lacks: widened below, in a copy
            if name not in self._widened:
                self._widened.add(name)
                warnings.warn("prefetch.torch: field %r is %s, which this torch cannot hold; "
                              "its batches are copied, widened to %s" % (name, arr.dtype,
                                                                         _WIDER.get(arr.dtype)),
                              PrefetchWarning, stacklevel=5)  # the trainer's loop
        try:
            out = torch.empty(arr.shape, dtype=torch.from_numpy(arr[:0].copy()).dtype,
                              pin_memory=self.pin_memory)
            out.numpy()[...] = arr
        except TypeError:
            wide = _WIDER.get(arr.dtype)
            if wide is None:
                raise TypeError("field %r: this torch has no dtype for %s" % (name, arr.dtype))
            out = torch.from_numpy(arr.astype(wide))
            if self.pin_memory:
                out = out.pin_memory()
        return out

    def _convert(self, torch, batch: Batch):
        if self.fields is not None:
            return tuple(self._tensor(torch, batch, name) for name in self.fields)
        return {name: self._tensor(torch, batch, name) for name in batch}

    def __repr__(self):
        return "<prefetch.torch.DataLoader %r over %r>" % (self.dataset, self.loader)
