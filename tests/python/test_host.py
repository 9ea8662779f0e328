"""The Python binding over host sessions: a real prefetchd on a temporary
socket, .npy files written with numpy, and every delivered sample compared
with the array it came from.

The daemon runs with CUDA_VISIBLE_DEVICES="" so that it serves host
sessions only, on a GPU machine too.  Run through tests/run.py (make check)
or with `python3 -m unittest` from this directory.
"""

import ctypes
import ctypes.util
import errno
import gc
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import warnings

try:
    import numpy as np
except ImportError as e:  # run.py turns this into one failed case
    raise ImportError("%s cannot import numpy (%s): install python3-numpy (make deps)"
                      % (sys.executable, e)) from None

import pfutil
from pfutil import prefetch

N = 1000
SEED = 5


def make_arrays():
    rng = np.random.default_rng(1234)
    arrays = pfutil.mixed_arrays(rng, N)
    arrays["u"] = rng.integers(0, 65536, size=(N, 4), dtype=np.uint16)
    return arrays


def plain_env():
    """The environment of a plain python3 this case starts: under make
    check-asan/tsan $PREFETCH_LIB is the sanitized library, which only an
    interpreter with the sanitizer's runtime preloaded can load, so the
    child takes the checkout's build/libprefetch.so instead."""
    env = dict(os.environ)
    env.pop("PREFETCH_LIB", None)
    return env


def sanitized():
    """Whether a sanitizer's runtime is in this interpreter (make
    check-asan/tsan)."""
    with open("/proc/self/maps") as f:
        return any(n in f.read() for n in ("libasan", "libtsan", "clang_rt.asan",
                                            "clang_rt.tsan"))


def cuda_driver_loads():
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


class HostSessions(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="pf-pyhost-")
        cls.arrays = make_arrays()
        fields = {}
        for name, arr in cls.arrays.items():
            if name == "y":
                # Two shards, concatenated on axis 0 by the daemon.
                parts = []
                for i, part in enumerate((arr[:600], arr[600:])):
                    parts.append(os.path.join(cls.tmp, "y-%d.npy" % i))
                    np.save(parts[-1], part)
                fields[name] = parts
            else:
                fields[name] = os.path.join(cls.tmp, name + ".npy")
                np.save(fields[name], arr)
        cls.late = np.random.default_rng(7).integers(0, 256, size=(200, 64), dtype=np.uint8)
        cls.late_path = os.path.join(cls.tmp, "late.npy")
        np.save(cls.late_path, cls.late)
        # Cut short by the case that skips its error batch ("late" is the
        # other case's).
        cls.cut_path = os.path.join(cls.tmp, "cut.npy")
        np.save(cls.cut_path, cls.late)
        cls.fields = fields
        # The bystander's dataset (pfutil.Bystander), "by".
        by_path = os.path.join(cls.tmp, "by.npy")
        pfutil.Bystander.write_rows(by_path)
        cls.daemon = pfutil.Daemon("host", {"multi": fields, "late": {"x": cls.late_path},
                                            "cut": {"x": cls.cut_path}, "by": {"x": by_path}},
                                   env={"CUDA_VISIBLE_DEVICES": ""}, tmpdir=cls.tmp)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        if not os.environ.get("PF_KEEP_TMP"):
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def loader(self, dataset="multi", **kw):
        kw.setdefault("socket", self.daemon.sock)
        kw.setdefault("timeout", 30)
        return prefetch.Loader(dataset, **kw)

    def check_batch(self, batch, loader):
        """Every field of batch holds the rows its picks name, with the
        .npy's dtype and sample shape."""
        self.assertEqual(batch.picks.dtype, np.uint64)
        self.assertEqual(batch.picks.shape, (batch.count,))
        self.assertEqual(sorted(batch), sorted(self.arrays))
        rows = batch.picks % N
        for name, src in self.arrays.items():
            arr = batch[name]
            self.assertIsInstance(arr, np.ndarray)
            self.assertEqual(arr.dtype, src.dtype, name)
            self.assertEqual(arr.shape, (batch.count,) + src.shape[1:], name)
            np.testing.assert_array_equal(arr, src[rows], "field %s, batch %d" % (name,
                                                                                   batch.seq))

    def run_epoch(self, loader, n, check=True):
        """Picks of epoch n in delivery order, batches' seq and counts."""
        picks, seqs, counts = [], [], []
        for batch in loader.epoch(n):
            if check:
                self.check_batch(batch, loader)
            self.assertEqual(batch.epoch, n)
            picks.append(batch.picks)
            seqs.append(batch.seq)
            counts.append(batch.count)
        return (np.concatenate(picks) if picks else np.zeros(0, np.uint64)), seqs, counts

    # ---- delivery ------------------------------------------------------------

    def test_fields_report_the_npy_dtypes_and_shapes(self):
        with self.loader(batch_size=10) as loader:
            self.assertEqual(loader.num_samples, N)
            want = [(name, arr.dtype.str.lstrip("<|"), arr.shape[1:])
                    for name, arr in self.arrays.items()]
            self.assertEqual(sorted(loader.fields), sorted(want))

    def test_shuffled_epochs_deliver_every_sample_once_with_its_bytes(self):
        with self.loader(batch_size=64, seed=SEED) as loader:
            orders = []
            for n in (0, 1):
                picks, seqs, counts = self.run_epoch(loader, n)
                self.assertEqual(sorted(picks.tolist()), list(range(N)))
                # docs/SHUFFLE.md's shuffle under seed + n, batch by batch.
                self.assertEqual(picks.tolist(), pfutil.shuffle(N, SEED + n))
                self.assertEqual(seqs, list(range(16)))
                self.assertEqual(counts, [64] * 15 + [N - 15 * 64])
                orders.append(picks.tolist())
            self.assertNotEqual(orders[0], orders[1])

    def test_loaders_of_one_share_get_the_same_batches_each_sample_once(self):
        with self.loader(batch_size=64, seed=SEED, share="sweep") as a, \
                self.loader(batch_size=64, seed=SEED, share="sweep") as b:
            got = {id(a): [], id(b): []}
            for x, y in zip(a.epoch(0), b.epoch(0)):
                self.check_batch(x, a)
                self.check_batch(y, b)
                got[id(a)].append(x.picks.copy())
                got[id(b)].append(y.picks.copy())
            for picks in got.values():
                self.assertEqual(sorted(np.concatenate(picks).tolist()), list(range(N)))
        with self.assertRaises(prefetch.PrefetchError) as cm:
            with self.loader(batch_size=64, share="strict"), \
                    self.loader(batch_size=32, share="strict"):
                pass
        self.assertIn("batch_size 64, not 32", str(cm.exception))

    def test_sequential_epoch_without_drop_last_ends_with_a_short_batch(self):
        with self.loader(batch_size=64, shuffle=False) as loader:
            picks, seqs, counts = self.run_epoch(loader, 0)
            self.assertEqual(picks.tolist(), list(range(N)))
            self.assertEqual(counts[-1], N % 64)

    def test_drop_last_drops_the_short_batch(self):
        with self.loader(batch_size=64, shuffle=False, drop_last=True) as loader:
            picks, seqs, counts = self.run_epoch(loader, 0)
            self.assertEqual(counts, [64] * (N // 64))
            self.assertEqual(picks.tolist(), list(range(N // 64 * 64)))

    def test_augmented_picks_range_over_k_times_the_samples(self):
        with self.loader(batch_size=128, augment=2, seed=3) as loader:
            picks, _, _ = self.run_epoch(loader, 0)  # check_batch reads rows pick % N
            self.assertEqual(sorted(picks.tolist()), list(range(2 * N)))

    def test_two_ranks_share_an_epoch_and_their_union_is_the_epoch(self):
        shares = []
        for rank in (0, 1):
            with self.loader(batch_size=50, seed=SEED, rank=rank, world_size=2) as loader:
                picks, _, _ = self.run_epoch(loader, 4)
                self.assertEqual(picks.tolist(),
                                 pfutil.shard(pfutil.shuffle(N, SEED + 4), rank, 2))
                shares.append(picks)
        self.assertEqual(len(shares[0]), N // 2)
        self.assertEqual(sorted(np.concatenate(shares).tolist()), list(range(N)))

    def test_three_ranks_get_padded_distributed_sampler_shares(self):
        perm = pfutil.shuffle(N, SEED)
        for rank in range(3):
            with self.loader(batch_size=100, seed=SEED, rank=rank, world_size=3) as loader:
                picks, _, _ = self.run_epoch(loader, 0, check=False)
                self.assertEqual(picks.tolist(), pfutil.shard(perm, rank, 3))

    def test_block_shuffle_through_the_binding_is_the_reference_order(self):
        # What the Loader will do for a block_shuffle epoch, with the
        # ctypes binding alone: EpochOpts with block_options, every batch
        # compared with order.py's picks and with the arrays' rows.
        from prefetch import _lib, order

        lib = _lib.lib()
        client = ctypes.c_void_p()
        self.assertEqual(lib.pf_connect(self.daemon.sock.encode(), ctypes.byref(client)), 0)
        try:
            oo = _lib.OpenOpts(dataset=b"multi", batch_size=48)
            self.assertEqual(lib.pf_open(client, ctypes.byref(oo)), 0, lib.pf_errmsg(client))
            fields = []
            for i in range(lib.pf_num_fields(client)):
                fi = _lib.Field()
                self.assertEqual(lib.pf_field_info(client, i, ctypes.byref(fi)), 0)
                fields.append((fi.name.decode(), fi.sample_bytes))
            sample_bytes = sum(b for _, b in fields)
            for kw, rank, world, start in (({"block_rows": 37, "window_blocks": 3}, 0, 1, 0),
                                           ({"block_bytes": 5000}, 1, 3, 2),
                                           ({}, 2, 4, 1)):
                b, w = order.block_params(N, 1, sample_bytes, **kw)
                want = order.batches(order.block_epoch_picks(N, b, w, seed=SEED, epoch=4,
                                                             rank=rank, world=world),
                                     48, start_batch=start)
                opts = _lib.EpochOpts(order=_lib.PF_ORDER_BLOCK_SHUFFLE, seed=SEED + 4,
                                      rank=rank, world=world, start_batch=start,
                                      **_lib.block_options(**kw))
                nbatches = ctypes.c_uint64()
                self.assertEqual(lib.pf_start_epoch(client, ctypes.byref(opts),
                                                    ctypes.byref(nbatches)), 0,
                                 lib.pf_errmsg(client))
                self.assertEqual(nbatches.value, len(want))
                for k in range(len(want) + 1):
                    batch = ctypes.POINTER(_lib.Batch)()
                    self.assertEqual(lib.pf_next(client, 30000, ctypes.byref(batch)), 0,
                                     lib.pf_errmsg(client))
                    if not batch:
                        break
                    bt = batch.contents
                    picks = np.frombuffer(ctypes.string_at(bt.picks, 8 * bt.count), np.uint64)
                    self.assertEqual(picks.tolist(), want[k], "%s, batch %d" % (kw, k))
                    for f, (name, nbytes) in enumerate(fields):
                        self.assertEqual(ctypes.string_at(bt.data[f], nbytes * bt.count),
                                         self.arrays[name][picks % N].tobytes(), name)
                    self.assertEqual(lib.pf_release(client, batch, None), 0)
                self.assertEqual(k, len(want))
            # Both sizes: refused by the daemon with its message.
            opts = _lib.EpochOpts(order=_lib.PF_ORDER_BLOCK_SHUFFLE, block_rows=4,
                                  block_bytes=64)
            self.assertEqual(lib.pf_start_epoch(client, ctypes.byref(opts), None),
                             -errno.EINVAL)
            self.assertIn(b"are both set", lib.pf_errmsg(client))
        finally:
            lib.pf_close(client)

    def test_loader_block_shuffle_epochs_are_the_reference_order_byte_exact(self):
        from prefetch import order

        for kw, rank, world in (({"block_rows": 50, "window_blocks": 4}, 0, 1),
                                ({"block_rows": 40}, 1, 2)):
            with self.loader(batch_size=64, seed=SEED, order="block_shuffle", rank=rank,
                             world_size=world, **kw) as loader:
                picks, _, _ = self.run_epoch(loader, 2)  # rows checked against the file
                sample_bytes = sum(a[0].nbytes for a in self.arrays.values())
                b, w = order.block_params(N, 1, sample_bytes, **kw)
                self.assertEqual(picks.tolist(), order.block_epoch_picks(
                    N, b, w, seed=SEED, epoch=2, rank=rank, world=world))
                self.assertEqual(len(loader), -(-len(picks) // 64))
        with self.assertRaisesRegex(ValueError, "block_rows must be a positive integer"):
            self.loader(order="block_shuffle", block_rows=0)
        with self.assertRaisesRegex(ValueError, "for order='block_shuffle' only"):
            self.loader(block_rows=10)
        with self.assertRaisesRegex(ValueError, "both set"):
            self.loader(order="block_shuffle", block_rows=10, block_bytes=100)

    def test_rank_and_world_size_default_from_torchrun_environment(self):
        saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE")}
        os.environ.update(RANK="1", WORLD_SIZE="2")
        try:
            with self.loader(batch_size=100, seed=SEED) as loader:
                self.assertEqual((loader.rank, loader.world_size), (1, 2))
                picks, _, _ = self.run_epoch(loader, 0, check=False)
                self.assertEqual(picks.tolist(), pfutil.shard(pfutil.shuffle(N, SEED), 1, 2))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        with self.loader(batch_size=100) as loader:
            self.assertEqual((loader.rank, loader.world_size), (0, 1))

    def test_stats_count_batches_and_bytes_taken(self):
        row_bytes = sum(a.itemsize * int(np.prod(a.shape[1:])) for a in self.arrays.values())
        with self.loader(batch_size=64) as loader:
            self.run_epoch(loader, 0, check=False)
            st = loader.stats()
            self.assertEqual(st["batches"], 16)
            self.assertEqual(st["bytes"], N * row_bytes)
            self.assertEqual(st["held"], 0)
            self.assertGreaterEqual(st["stall_fraction"], 0.0)
            self.assertLessEqual(st["stall_fraction"], 1.0)

    # ---- resume --------------------------------------------------------------

    def test_resume_from_state_dict_delivers_exactly_the_rest(self):
        k = 6
        with self.loader(batch_size=64, seed=SEED) as first:
            head = []
            for batch in first.epoch(2):
                head.append(batch.picks)
                if len(head) == k:
                    state = first.state_dict()
                    break
        self.assertEqual((state["epoch"], state["batches_taken"], state["seed"]), (2, k, SEED))
        state = json.loads(json.dumps(state))  # a checkpoint survives serialisation
        # Another seed at construction: the saved one wins.
        with self.loader(batch_size=64, seed=999) as second:
            second.load_state_dict(state)
            self.assertEqual(second.state_dict()["batches_taken"], k)
            tail, seqs, _ = self.run_epoch(second, 2)
            self.assertEqual(seqs, list(range(k, 16)))
            whole = np.concatenate(head + [tail]).tolist()
            self.assertEqual(whole, pfutil.shuffle(N, SEED + 2))
            # After a whole epoch, the saved position is the next epoch's start.
            end = second.state_dict()
            self.assertEqual((end["epoch"], end["batches_taken"]), (3, 0))
            picks, _, _ = self.run_epoch(second, 3, check=False)
            self.assertEqual(picks.tolist(), pfutil.shuffle(N, SEED + 3))

    def test_resume_at_the_last_batch_delivers_nothing_more(self):
        with self.loader(batch_size=64) as loader:
            state = loader.state_dict()
            state.update(epoch=0, batches_taken=16)
            loader.load_state_dict(state)
            picks, seqs, _ = self.run_epoch(loader, 0)
            self.assertEqual(seqs, [])

    def test_load_state_dict_refuses_another_batch_size(self):
        with self.loader(batch_size=64) as a:
            state = a.state_dict()
        with self.loader(batch_size=32) as b:
            with self.assertRaisesRegex(ValueError, "batch_size"):
                b.load_state_dict(state)

    # ---- early exit and the release rule -------------------------------------

    def test_leaving_an_epoch_early_abandons_it(self):
        with self.loader(batch_size=32, shuffle=False) as loader:
            sid = loader.stats()["session"]
            for i, batch in enumerate(loader.epoch(0)):
                if i == 2:
                    break
            # The abandon was a request with a reply: the daemon has stopped.
            s = self.daemon.session(sid)
            self.assertEqual(s["state"], "idle")
            self.assertEqual(s["held"], 0)
            self.assertLess(s["sent"], N // 32)
            sent = s["sent"]
            time.sleep(0.2)
            self.assertEqual(self.daemon.session(sid)["sent"], sent, "still filling")
            self.assertEqual(loader.stats()["held"], 0)
            self.assertEqual(loader.state_dict()["batches_taken"], 3)

            with self.assertRaises(KeyError):
                for batch in loader.epoch(1):
                    batch["no such field"]
            s = self.daemon.session(sid)
            self.assertEqual((s["state"], s["held"]), ("idle", 0))

            picks, _, _ = self.run_epoch(loader, 2)
            self.assertEqual(picks.tolist(), list(range(N)))
            self.assertEqual(self.daemon.session(sid)["held"], 0)

    def test_starting_an_epoch_ends_the_one_before(self):
        with self.loader(batch_size=100) as loader:
            old = loader.epoch(0)
            first = next(old)
            picks, _, _ = self.run_epoch(loader, 1)
            self.assertEqual(sorted(picks.tolist()), list(range(N)))
            self.assertTrue(first.released)
            with self.assertRaisesRegex(RuntimeError, "another epoch"):
                next(old)

    def test_host_batch_is_released_when_the_next_is_taken(self):
        with self.loader(batch_size=50) as loader:
            sid = loader.stats()["session"]
            it = loader.epoch(0)
            b0 = next(it)
            self.assertEqual(loader.stats()["held"], 1)
            s = self.daemon.wait_session(sid, lambda s: s["held"] == 1)
            self.assertEqual(s["held"], 1)
            view = b0["z"]
            self.assertFalse(view.flags.writeable)
            with self.assertRaises(ValueError):
                view[0, 0] = 1
            b1 = next(it)
            self.assertTrue(b0.released)
            self.assertFalse(b1.released)
            with self.assertRaisesRegex(RuntimeError, "released"):
                b0["z"]
            # Picks are a copy: they outlive the slot.
            self.assertEqual(b0.picks.tolist(), pfutil.shuffle(N, 0)[:50])
            self.assertEqual(loader.stats()["held"], 1)
            self.assertEqual(self.daemon.wait_session(sid, lambda s: s["held"] == 1)["held"], 1)
            it.close()
            self.assertTrue(b1.released)
            self.assertEqual(self.daemon.session(sid)["held"], 0)

    def next_in_slot(self, it, addr):
        """The next batch of `it` whose field z lies at addr (its slot again)."""
        for batch in it:
            if batch["z"].ctypes.data == addr:
                return batch
        self.fail("the slot at 0x%x was never filled again" % addr)

    def test_released_slot_is_reused_so_only_a_copy_keeps_the_data(self):
        z = self.arrays["z"]
        with self.loader(batch_size=50, shuffle=False, min_depth=1, max_depth=1) as loader:
            it = loader.epoch(0)
            b0 = next(it)
            view, copy = b0["z"], b0["z"].copy()
            reused = self.next_in_slot(it, view.ctypes.data)
            # The old view shows the new batch's rows: it aliased the slot.
            np.testing.assert_array_equal(view, z[reused.picks])
            self.assertFalse(np.array_equal(view, copy))
            np.testing.assert_array_equal(copy, z[b0.picks])

    def test_what_a_trainer_does_to_one_batch_array_leaves_the_next_in_its_slot_alone(self):
        # Views are made once per slot and reused: each batch still gets an
        # array object of its own, so reshaping one in place (or setting
        # its flags) cannot reach a later batch in the same slot.
        z = self.arrays["z"]
        with self.loader(batch_size=50, shuffle=False, min_depth=1, max_depth=1) as loader:
            it = loader.epoch(0)
            b0 = next(it)
            v0 = b0["z"]
            shape, addr = v0.shape, v0.ctypes.data
            v0.shape = (-1,)
            reused = self.next_in_slot(it, addr)
            self.assertIsNot(reused["z"], v0)
            self.assertEqual(reused["z"].shape, shape)
            np.testing.assert_array_equal(reused["z"], z[reused.picks])

    def test_batch_release_gives_the_slot_back_early(self):
        with self.loader(batch_size=50) as loader:
            sid = loader.stats()["session"]
            for batch in loader.epoch(0):
                self.assertEqual(self.daemon.wait_session(sid, lambda s: s["held"] == 1)["held"],
                                 1)
                batch.release()
                self.assertTrue(batch.released)
                self.assertEqual(loader.stats()["held"], 0)
                batch.release()  # twice: harmless
                self.assertEqual(self.daemon.wait_session(sid, lambda s: s["held"] == 0)["held"],
                                 0)
                break

    # ---- arrays outlive their loader -------------------------------------------

    def wait_session_gone(self, sid, timeout=5.0):
        """True once the daemon no longer lists session sid."""
        deadline = time.monotonic() + timeout
        while self.daemon.session(sid) is not None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def start_bystander(self):
        """Another client (pfutil.Bystander) on this class's daemon from
        here to assert_bystander_unharmed; killed if the case fails first."""
        by = pfutil.Bystander(self.daemon.sock, "by")
        self.addCleanup(by.kill)
        return by

    def assert_bystander_unharmed(self, by):
        """Issue 15's measure: the other client's epochs stayed byte-exact
        and its status answered within 100 ms throughout.  Its exit status
        says so; the report is read too, so that a bystander that exits 0
        without having run cannot pass."""
        rc, report = by.stop()
        print(report)
        self.assertEqual(rc, 0, report)
        m = re.search(r"bystander: (\d+) epochs, \d+ batches, (\d+) statuses, "
                      r"slowest ([0-9.]+) ms", report)
        self.assertIsNotNone(m, report)
        self.assertGreaterEqual(int(m.group(1)), 1, report)
        self.assertGreaterEqual(int(m.group(2)), 1, report)
        self.assertLess(float(m.group(3)), 100, report)

    def test_array_read_after_close_stays_mapped_until_the_last_goes(self):
        # Once a segfault: the mapping went with pf_close.  Now every array
        # keeps the connection (and so the mapping) of its loader.
        z = self.arrays["z"]
        by = self.start_bystander()
        with self.loader(batch_size=50, shuffle=False) as loader:
            sid = loader.stats()["session"]
            epoch = loader.epoch(0)
            first = next(epoch)
            tail = first["z"][10:]  # a view of a view: the base chain holds
            rows = first.picks[10:] % N
            held = first["x"]
        self.assertTrue(first.released)
        with self.assertRaisesRegex(RuntimeError, "released"):
            first["z"]
        # Another loader's epoch, at the same time, byte for byte.
        with self.loader(batch_size=64, seed=SEED) as other:
            it = other.epoch(3)
            self.check_batch(next(it), other)
            # The closed loader's session stays (idle, nothing held)
            # while its arrays live; the epoch was abandoned before the
            # release, so nothing filled the slot again.
            s = self.daemon.wait_session(sid, lambda s: s["held"] == 0 and s["state"] == "idle")
            self.assertEqual((s["held"], s["state"]), (0, "idle"))
            np.testing.assert_array_equal(tail, z[rows])
            np.testing.assert_array_equal(held, self.arrays["x"][first.picks % N])
            del held
            np.testing.assert_array_equal(tail, z[rows])  # one array left is enough
            seen = 64
            for batch in it:
                self.check_batch(batch, other)
                seen += batch.count
            self.assertEqual(seen, N)
        self.assertIsNotNone(self.daemon.session(sid))
        del tail
        gc.collect()
        self.assertTrue(self.wait_session_gone(sid),
                        "session %d outlived the last array of its loader" % sid)
        self.assertIsNone(self.daemon.proc.poll())
        self.assert_bystander_unharmed(by)

    def test_array_returned_from_a_function_outlives_its_collected_loader(self):
        def first_rows():
            # The loader and its epoch go with this frame; only the
            # array leaves it.
            loader = self.loader(batch_size=50, shuffle=False)
            epoch = loader.epoch(0)
            batch = next(epoch)
            return loader.stats()["session"], batch["u"]

        by = self.start_bystander()
        sid, u = first_rows()
        gc.collect()
        with self.loader(batch_size=100) as other:
            it = other.epoch(1)
            self.check_batch(next(it), other)
            np.testing.assert_array_equal(u, self.arrays["u"][:50])
            self.assertFalse(u.flags.writeable)
            for batch in it:
                self.check_batch(batch, other)
        np.testing.assert_array_equal(u, self.arrays["u"][:50])
        del u
        gc.collect()
        self.assertTrue(self.wait_session_gone(sid))
        self.assertIsNone(self.daemon.proc.poll())
        self.assert_bystander_unharmed(by)

    # ---- errors ----------------------------------------------------------------

    def test_unknown_dataset_raises_the_daemons_message(self):
        with self.assertRaises(prefetch.PrefetchError) as cm:
            self.loader("no_such_dataset")
        self.assertEqual(cm.exception.code, -errno.ENOENT)
        self.assertIn("unknown dataset 'no_such_dataset'", str(cm.exception))

    def test_cuda_device_on_a_gpu_less_daemon_raises_prefetch_error(self):
        with self.assertRaises(prefetch.PrefetchError) as cm:
            self.loader(device="cuda:0")
        msg = str(cm.exception)
        print("refused: %s (%d)" % (msg, cm.exception.code))
        if "host sessions" in msg:
            # The client opened its GPU and the daemon refused the session.
            self.assertEqual(cm.exception.code, -errno.ENODEV)
            self.assertIn("device cuda:0: this daemon serves host sessions only", msg)
        else:
            # No usable driver in this process: the library refuses first.
            self.assertFalse(cuda_driver_loads() and "no CUDA driver" in msg)
            self.assertTrue(msg.startswith("pf_open: cuda:0: "), msg)
        with self.loader(batch_size=100) as loader:  # the daemon still serves
            self.assertEqual(self.run_epoch(loader, 0, check=False)[0].size, N)

    def test_unreachable_socket_raises_prefetch_error(self):
        path = os.path.join(self.tmp, "nobody.sock")
        with self.assertRaises(prefetch.PrefetchError) as cm:
            prefetch.Loader("multi", socket=path)
        self.assertEqual(cm.exception.code, -errno.ENOENT)
        self.assertIn(path, str(cm.exception))
        self.assertIn("is the daemon running?", str(cm.exception))

    def test_error_batch_raises_naming_the_file_and_abandons_the_epoch(self):
        hdr = os.path.getsize(self.late_path) - self.late.nbytes
        with self.loader("late", batch_size=50, shuffle=False) as loader:
            sid = loader.stats()["session"]
            # Rows 150.. vanish after the daemon loaded the file.
            os.truncate(self.late_path, hdr + 150 * 64)
            good = 0
            with self.assertRaises(prefetch.PrefetchError) as cm:
                for batch in loader.epoch(0):
                    np.testing.assert_array_equal(batch["x"], self.late[batch.picks])
                    good += 1
            self.assertEqual(good, 3)
            # A file cut short changed on disk: -ESTALE, the epoch ends.
            self.assertEqual(cm.exception.code, -errno.ESTALE)
            self.assertIn("late.npy changed on disk", str(cm.exception))
            self.assertEqual(self.daemon.session(sid)["state"], "idle")

    def test_closed_loader_refuses_use(self):
        loader = self.loader(batch_size=100)
        it = loader.epoch(0)
        next(it)
        loader.close()
        loader.close()  # twice: harmless
        with self.assertRaisesRegex(ValueError, "closed"):
            next(it)
        with self.assertRaisesRegex(ValueError, "closed"):
            loader.epoch(1)
        with self.assertRaisesRegex(ValueError, "closed"):
            loader.stats()

    # ---- daemon restart ------------------------------------------------------------

    def restart_daemon(self):
        """A daemon of its own serving "multi", started again on the same
        socket and config by each call (the one before must be dead)."""
        return pfutil.Daemon("restart", {"multi": self.fields}, env={"CUDA_VISIBLE_DEVICES": ""},
                             tmpdir=self.tmp)

    def test_reconnecting_loader_ends_an_epoch_across_a_daemon_restart(self):
        daemon = self.restart_daemon()
        try:
            with self.loader(socket=daemon.sock, batch_size=64, seed=SEED,
                             reconnect_s=10) as loader:
                picks, seqs = [], []
                for batch in loader.epoch(2):
                    self.check_batch(batch, loader)
                    picks.append(batch.picks)
                    seqs.append(batch.seq)
                    if batch.seq == 5:
                        daemon.proc.kill()
                        daemon.proc.wait()
                        # The batch in hand stays readable: its arena is
                        # this process's mapping, which outlives the daemon.
                        self.check_batch(batch, loader)
                        daemon = self.restart_daemon()
                self.assertEqual(seqs, list(range(16)))
                self.assertEqual(np.concatenate(picks).tolist(), pfutil.shuffle(N, SEED + 2))
                st = loader.stats()
                self.assertEqual(st["reconnects"], 1)
                self.assertEqual(st["resume_batch"], 16)
                self.assertEqual(st["held"], 0)
                self.assertEqual(loader.state_dict()["epoch"], 3)
                # And the next epoch runs on the new daemon as on any.
                picks, _, _ = self.run_epoch(loader, 3)
                self.assertEqual(picks.tolist(), pfutil.shuffle(N, SEED + 3))
        finally:
            daemon.stop()

    def test_loader_without_reconnect_raises_econnreset_within_a_second_of_a_kill(self):
        daemon = self.restart_daemon()
        try:
            with self.loader(socket=daemon.sock, batch_size=64, seed=SEED) as loader:
                it = loader.epoch(0)
                for _ in range(3):
                    self.check_batch(next(it), loader)
                daemon.proc.kill()
                daemon.proc.wait()
                t0 = time.monotonic()
                with self.assertRaises(prefetch.PrefetchError) as cm:
                    while True:
                        next(it)  # batches already received may come first
                self.assertLess(time.monotonic() - t0, 1.0)
                self.assertEqual(cm.exception.errno, errno.ECONNRESET)
                self.assertIn(daemon.sock, cm.exception.message)
                self.assertIn("went away", cm.exception.message)
                with self.assertRaises(prefetch.PrefetchError):
                    next(loader.epoch(1))
        finally:
            daemon.stop()

    def test_reconnect_s_must_be_a_number_of_seconds(self):
        for bad in (-1, float("nan")):
            with self.assertRaisesRegex(ValueError, "reconnect_s"):
                self.loader(batch_size=10, reconnect_s=bad)

    # ---- PyTorch conventions: iteration, len, set_epoch -----------------------

    def collect(self, loader, check=True):
        """`for batch in loader`: the picks in delivery order, and each
        batch's epoch number."""
        picks, epochs = [], []
        for batch in loader:
            if check:
                self.check_batch(batch, loader)
            picks.append(batch.picks)
            epochs.append(batch.epoch)
        return (np.concatenate(picks).tolist() if picks else []), epochs

    def test_for_batch_in_loader_runs_the_epoch_set_epoch_chose(self):
        with self.loader(batch_size=64, seed=SEED) as loader:
            picks, epochs = self.collect(loader)  # epoch 0 first
            self.assertEqual(picks, pfutil.shuffle(N, SEED))
            self.assertEqual(set(epochs), {0})
            loader.set_epoch(5)
            picks, epochs = self.collect(loader)
            self.assertEqual(picks, pfutil.shuffle(N, SEED + 5))
            self.assertEqual(set(epochs), {5})
            # Without set_epoch the next iteration is the next epoch (a
            # number runs once per session), not epoch 5 again.
            picks, epochs = self.collect(loader, check=False)
            self.assertEqual(picks, pfutil.shuffle(N, SEED + 6))
            self.assertEqual(set(epochs), {6})
            with self.assertRaisesRegex(ValueError, "epoch 3 is not after epoch 6"):
                loader.set_epoch(3)
            with self.assertRaisesRegex(ValueError, "epoch 6 is not after epoch 6"):
                loader.epoch(6)
            # A loop left early still counts as that epoch's run.
            loader.set_epoch(9)
            for batch in loader:
                break
            self.assertEqual(loader.state_dict()["epoch"], 9)
            picks, epochs = self.collect(loader, check=False)
            self.assertEqual(set(epochs), {10})

    def test_len_is_this_ranks_batches_per_epoch(self):
        cases = [(1, 0, 64, False, 1), (1, 0, 64, True, 1), (3, 1, 64, False, 1),
                 (3, 2, 64, True, 1), (2, 1, 100, True, 1), (4, 3, 30, False, 2),
                 (7, 6, 1000, True, 1)]
        for world, rank, bs, drop, augment in cases:
            with self.subTest(world=world, rank=rank, batch_size=bs, drop_last=drop,
                              augment=augment):
                share = -(-N * augment // world)  # DistributedSampler pads
                want = share // bs if drop else -(-share // bs)
                with self.loader(batch_size=bs, rank=rank, world_size=world, drop_last=drop,
                                 augment=augment, seed=SEED) as loader:
                    self.assertEqual(len(loader), want)
                    got = sum(1 for _ in loader)
                    self.assertEqual(got, want)

    def test_sampler_picks_arrive_in_its_order_byte_exact_each_once(self):
        class Sampler:
            """A torch-style sampler: this rank's indices, reshuffled by
            set_epoch."""

            def __init__(self):
                self.epochs = []

            def set_epoch(self, epoch):
                self.epochs.append(epoch)

            def __iter__(self):
                rng = np.random.default_rng(100 + self.epochs[-1])
                return iter(rng.permutation(N).tolist())

            def __len__(self):
                return N

        sampler = Sampler()
        with self.loader(batch_size=96, sampler=sampler, world_size=1) as loader:
            self.assertEqual(len(loader), -(-N // 96))
            for epoch in (0, 1):
                loader.set_epoch(epoch)
                picks, epochs = self.collect(loader)  # every field's bytes checked
                want = np.random.default_rng(100 + epoch).permutation(N).tolist()
                self.assertEqual(picks, want)
                self.assertEqual(sorted(picks), list(range(N)))
                self.assertEqual(set(epochs), {epoch})
            self.assertEqual(sampler.epochs, [0, 1])
        # A plain list of picks (repeats allowed: it is the trainer's order).
        order = [7, 3, 3, 999, 0] * 40
        with self.loader(batch_size=64, sampler=order, drop_last=True) as loader:
            self.assertEqual(len(loader), 3)
            picks, _ = self.collect(loader)
            self.assertEqual(picks, order[:192])

    def test_an_explicit_order_is_shared_by_the_ranks_like_the_shuffle(self):
        order = np.random.default_rng(8).permutation(N)
        shares = []
        for rank in (0, 1):
            with self.loader(batch_size=70, rank=rank, world_size=2) as loader:
                got = []
                for batch in loader.epoch(0, order=order):
                    self.check_batch(batch, loader)
                    got += batch.picks.tolist()
                self.assertEqual(got, pfutil.shard(order.tolist(), rank, 2))
                shares.append(got)
        self.assertEqual(sorted(shares[0] + shares[1]), list(range(N)))
        with self.loader(batch_size=70) as loader:
            with self.assertRaisesRegex(ValueError, "negative"):
                loader.epoch(0, order=[1, -2])
            with self.assertRaisesRegex(TypeError, "integers"):
                loader.epoch(0, order=[1.5])
            with self.assertRaises(prefetch.PrefetchError) as cm:
                next(loader.epoch(0, order=[1, N]))
            self.assertEqual(cm.exception.code, -errno.ERANGE)
            self.assertIn("index %d at position 1 is out of range" % N, str(cm.exception))
            # The refused start used no epoch number: epoch 0 runs now.
            picks, _, _ = self.run_epoch(loader, 0)
            self.assertEqual(picks.tolist(), pfutil.shuffle(N, 0))

    def test_a_paced_epoch_delivers_each_requested_batch_byte_exact(self):
        rng = np.random.default_rng(21)
        perm = rng.permutation(N).tolist()
        cuts = sorted(set(rng.integers(1, N, size=60).tolist()))
        requests = [perm[a:b] for a, b in zip([0] + cuts, cuts + [N])]
        requests = [r for r in requests if r]
        big = max(len(r) for r in requests)
        with self.loader(batch_size=big, batch_sampler=requests) as loader:
            self.assertEqual(len(loader), len(requests))
            got = []
            for batch in loader:
                self.check_batch(batch, loader)
                self.assertEqual(batch.picks.tolist(), requests[len(got)])
                got.append(batch.picks.tolist())
            self.assertEqual(got, requests)
            self.assertEqual(sorted(sum(got, [])), list(range(N)))

            # Asked for lazily: at most paced_ahead requests ahead of the
            # batch in hand, so that a curriculum sees a short look-ahead.
            pulled = []

            def curriculum():
                for k in range(40):
                    pulled.append(k)
                    yield [k, (k * 37) % N]

            loader.paced_ahead = 3
            for k, batch in enumerate(loader.epoch(4, batches=curriculum())):
                self.check_batch(batch, loader)
                self.assertEqual(batch.picks.tolist(), [k, (k * 37) % N])
                self.assertEqual(batch.epoch, 4)
                self.assertLessEqual(len(pulled), k + 1 + 3)
            self.assertEqual(k, 39)
            with self.assertRaisesRegex(ValueError, "1 to batch_size"):
                next(loader.epoch(5, batches=[list(range(big + 1))]))

    def test_a_paced_epoch_resumes_from_state_dict(self):
        requests = [[i, i + 1] for i in range(0, 200, 2)]
        with self.loader(batch_size=2, batch_sampler=requests) as first:
            for k, batch in enumerate(first):
                if k == 9:
                    state = first.state_dict()
                    break
        self.assertEqual((state["epoch"], state["batches_taken"]), (0, 10))
        with self.loader(batch_size=2, batch_sampler=requests) as second:
            second.load_state_dict(state)
            got = [b.picks.tolist() for b in second]
            self.assertEqual(got, requests[10:])

    # ---- error batches ---------------------------------------------------------

    def test_skip_errors_skips_an_error_batch_with_a_warning_and_counts_it(self):
        requests = [[0, 1], [2, N + 5], [3, 4], [N * 2], [5]]
        with self.loader(batch_size=2, skip_errors=True) as loader:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = []
                for batch in loader.epoch(0, batches=requests):
                    self.check_batch(batch, loader)
                    got.append(batch.picks.tolist())
            self.assertEqual(got, [[0, 1], [3, 4], [5]])
            self.assertEqual(loader.skipped, 2)
            self.assertEqual(loader.stats()["skipped"], 2)
            self.assertEqual([e.code for e in loader.skipped_errors], [-errno.ERANGE] * 2)
            msgs = [str(w.message) for w in caught if w.category is prefetch.PrefetchWarning]
            self.assertEqual(len(msgs), 2, msgs)
            self.assertIn("ERANGE", msgs[0])
            self.assertIn("epoch 0 batch 1: pick %d at position 1 is out of range" % (N + 5),
                          msgs[0])
            # The warning points at the trainer's loop, not at the package.
            self.assertEqual([w.filename for w in caught][0], __file__)
        # Without the option the same batch ends the loop, as before.
        with self.loader(batch_size=2) as loader:
            got = []
            with self.assertRaises(prefetch.PrefetchError) as cm:
                for batch in loader.epoch(0, batches=requests):
                    got.append(batch.picks.tolist())
            self.assertEqual(cm.exception.code, -errno.ERANGE)
            self.assertEqual(got, [[0, 1]])

    def test_skip_errors_rides_over_a_file_cut_short_after_load(self):
        hdr = os.path.getsize(self.cut_path) - self.late.nbytes
        with self.loader("cut", batch_size=50, shuffle=False, skip_errors=True) as loader:
            sid = loader.stats()["session"]
            os.truncate(self.cut_path, hdr + 150 * 64)
            good = 0
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for batch in loader:
                    np.testing.assert_array_equal(batch["x"], self.late[batch.picks])
                    good += 1
            # The batches before the cut, then the change ends the epoch
            # (-ESTALE): skipped, so the loop ends as an epoch does.
            self.assertEqual(good, 3)
            self.assertEqual(loader.skipped, 1)
            self.assertEqual(loader.skipped_errors[0].code, -errno.ESTALE)
            msgs = [str(w.message) for w in caught if w.category is prefetch.PrefetchWarning]
            self.assertEqual(len(msgs), 1, msgs)
            self.assertIn("ESTALE", msgs[0])
            self.assertIn("cut.npy changed on disk", msgs[0])
            self.assertEqual(self.daemon.session(sid)["state"], "idle")
            self.assertEqual(loader.state_dict()["epoch"], 1)

    # ---- one epoch numbering -------------------------------------------------------

    def test_the_epoch_number_is_the_same_in_python_status_and_messages(self):
        with self.loader(batch_size=2, shuffle=False, name="epochs") as loader:
            sid = loader.stats()["session"]
            # No epoch yet: status says so rather than showing a number.
            s = self.daemon.session(sid)
            self.assertEqual((s["state"], s["epoch"]), ("open", None))
            it = loader.epoch(0)
            batch = next(it)
            self.assertEqual(batch.epoch, 0)
            self.assertEqual(self.daemon.session(sid)["epoch"], 0)
            it.close()
            loader.set_epoch(7)
            it = iter(loader)
            batch = next(it)
            self.assertEqual(batch.epoch, 7)
            s = self.daemon.session(sid)
            self.assertEqual((s["epoch"], s["state"]), (7, "running"))
            table = subprocess.run([pfutil.PREFETCHCTL, "-s", self.daemon.sock, "status"],
                                   capture_output=True, text=True, timeout=30).stdout
            head, row = None, None
            for line in table.splitlines():
                cols = line.split()
                if cols[:1] == ["SESSION"]:
                    head = cols
                elif head and cols[:1] == [str(sid)]:
                    row = cols
            self.assertIsNotNone(row, table)
            self.assertEqual(row[head.index("EPOCH")], "7", table)
            it.close()
            # An error batch's message names the same epoch.
            with self.assertRaises(prefetch.PrefetchError) as cm:
                for batch in loader.epoch(8, batches=[[0], [N]]):
                    self.assertEqual(batch.epoch, 8)
            self.assertTrue(str(cm.exception).startswith("epoch 8 batch 1: pick %d" % N),
                            str(cm.exception))
            self.assertEqual(self.daemon.session(sid)["epoch"], 8)
            # And so does the refusal of an epoch that is not after it.
            rc = pfutil._lib.lib().pf_set_epoch(loader._client, 8)
            self.assertEqual(rc, -errno.EINVAL)
            self.assertIn("epoch 8 is not after epoch 8",
                          pfutil._lib.lib().pf_errmsg(loader._client).decode())

    # ---- pickling ----------------------------------------------------------------

    def test_a_pickled_loader_runs_its_epoch_in_a_child_process(self):
        child = r"""
import json, pickle, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import prefetch
loader = pickle.load(sys.stdin.buffer)
arrays = {name: np.concatenate([np.load(p) for p in (path if isinstance(path, list) else [path])])
          for name, path in json.loads(sys.argv[2]).items()}
picks, epochs, bad = [], set(), 0
for batch in loader:
    for name, src in arrays.items():
        bad += not np.array_equal(batch[name], src[batch.picks % len(src)])
    picks += batch.picks.tolist()
    epochs.add(batch.epoch)
print(json.dumps({"picks": picks, "epochs": sorted(epochs), "bad": bad,
                  "session": loader.stats()["session"], "name": loader.name}))
"""
        with self.loader(batch_size=64, seed=SEED) as loader:
            parent_sid = loader.stats()["session"]
            next(loader.epoch(0))  # mid-epoch: the copy takes no part of it
            loader.set_epoch(2)
            blob = pickle.dumps(loader)
            out = subprocess.run([sys.executable, "-B", "-c", child,
                                  os.path.join(pfutil.ROOT, "python"), json.dumps(self.fields)],
                                 input=blob, capture_output=True, timeout=120, env=plain_env())
            self.assertEqual(out.returncode, 0, out.stderr.decode())
            got = json.loads(out.stdout)
            self.assertEqual(got["bad"], 0)
            self.assertEqual(got["epochs"], [2])
            self.assertEqual(got["picks"], pfutil.shuffle(N, SEED + 2))
            self.assertNotEqual(got["session"], parent_sid)
            self.assertNotEqual(got["name"], loader.name)  # named after its own pid
            # The original goes on with its own session.
            picks, _, _ = self.run_epoch(loader, 2)
            self.assertEqual(picks.tolist(), pfutil.shuffle(N, SEED + 2))
            # A copy in this process, too: it connects when first used.
            copy = pickle.loads(pickle.dumps(loader))
            self.assertIn("not connected", repr(copy))
            picks, _, _ = self.run_epoch(copy, 3)
            self.assertEqual(picks.tolist(), pfutil.shuffle(N, SEED + 3))
            self.assertNotEqual(copy.stats()["session"], parent_sid)
            copy.close()

    def test_importing_prefetch_and_running_an_epoch_imports_no_torch(self):
        code = ("import sys; sys.path.insert(0, %r); import prefetch; "
                "l = prefetch.Loader('multi', batch_size=100, socket=%r); "
                "n = sum(b.count for b in l); "
                "print(n, 'torch' in sys.modules)" % (os.path.join(pfutil.ROOT, "python"),
                                                     self.daemon.sock))
        out = subprocess.run([sys.executable, "-B", "-c", code], capture_output=True, text=True,
                             timeout=60, env=plain_env())
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split(), [str(N), "False"])

    def test_probe_of_a_host_session_says_it_is_not_a_cuda_session(self):
        with self.loader(batch_size=10) as loader:
            with self.assertRaises(prefetch.PrefetchError) as cm:
                loader.probe()
            self.assertEqual(cm.exception.code, -errno.EINVAL)
            self.assertIn("not a CUDA session", str(cm.exception))

    # ---- the torch adapter -----------------------------------------------------------

    def torch_or_skip(self):
        if sanitized():
            self.skipTest("a sanitizer's runtime is in this interpreter: torch's own "
                          "libraries are not this suite's to check")
        try:
            import torch
        except ImportError as e:
            self.skipTest("torch is not importable here (%s): the adapter needs it" % e)
        return torch

    def test_torch_dataloader_fits_a_loop_written_for_torchs(self):
        torch = self.torch_or_skip()
        from prefetch.torch import DataLoader

        quiet = warnings.catch_warnings()  # uint16's warning: checked below
        quiet.__enter__()
        self.addCleanup(quiet.__exit__, None, None, None)
        warnings.simplefilter("ignore", prefetch.PrefetchWarning)
        loader = DataLoader("multi", batch_size=64, shuffle=True, drop_last=True,
                            fields=("x", "u", "b"), seed=SEED, socket=self.daemon.sock,
                            timeout=30, num_workers=8, persistent_workers=True)
        self.assertEqual(len(loader), N // 64)
        self.assertEqual((loader.batch_size, loader.drop_last, loader.dataset), (64, True,
                                                                                 "multi"))
        self.assertEqual(len(loader.sampler), N)
        for epoch in (0, 1):
            # What DistributedSampler loops do.
            loader.sampler.set_epoch(epoch)
            order = pfutil.shuffle(N, SEED + epoch)
            self.assertEqual(list(loader.sampler), order)
            steps = 0
            for k, (x, u, b) in enumerate(loader):
                rows = order[k * 64:(k + 1) * 64]
                self.assertIsInstance(x, torch.Tensor)
                self.assertEqual(x.dtype, torch.float32)
                self.assertTrue(torch.equal(x, torch.from_numpy(self.arrays["x"][rows])))
                # uint16 widened to int32 where this torch lacks uint16.
                np.testing.assert_array_equal(u.numpy(), self.arrays["u"][rows])
                np.testing.assert_array_equal(b.numpy(), self.arrays["b"][rows])
                x.mul_(2)  # copies: writable, and the next batch is untouched
                steps += 1
            self.assertEqual(steps, len(loader))
        # Zero-copy dict batches, and a pickled copy that connects anew.
        zero = DataLoader("multi", batch_size=100, socket=self.daemon.sock, copy=False,
                          timeout=30)
        clone = pickle.loads(pickle.dumps(zero))
        try:
            torch.from_numpy(np.zeros(1, np.uint16))
            lacks_u2 = False
        except TypeError:
            lacks_u2 = True
        for dl in (zero, clone):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                first = next(iter(dl))
            said = [str(w.message) for w in caught if w.category is prefetch.PrefetchWarning]
            # A dtype this torch lacks is copied even so, and it says so.
            self.assertEqual(len(said), int(lacks_u2), said)
            self.assertEqual(sorted(first), sorted(self.arrays))
            np.testing.assert_array_equal(first["z"].numpy(), self.arrays["z"][:100])
        with self.assertRaisesRegex(TypeError, "collate_fn"):
            DataLoader("multi", socket=self.daemon.sock, collate_fn=lambda b: b)
        with self.assertRaisesRegex(KeyError, "no field 'nope'"):
            DataLoader("multi", socket=self.daemon.sock, fields=("x", "nope"))
        for dl in (loader, zero, clone):
            dl.close()

    def test_library_not_found_names_every_place_tried(self):
        if ctypes.util.find_library("prefetch") or os.path.exists(
                "/usr/local/lib/libprefetch.so.0"):
            self.skipTest("a libprefetch is installed on this system")
        pkg = os.path.join(self.tmp, "nolib")
        shutil.rmtree(pkg, ignore_errors=True)
        shutil.copytree(os.path.join(pfutil.ROOT, "python", "prefetch"),
                        os.path.join(pkg, "prefetch"),
                        ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        env = dict(os.environ)
        env.pop("PREFETCH_LIB", None)
        env.pop("LD_LIBRARY_PATH", None)
        out = subprocess.run([sys.executable, "-B", "-c",
                              "import prefetch; prefetch.library_path()"], cwd=pkg, env=env,
                             capture_output=True, text=True, timeout=60)
        self.assertNotEqual(out.returncode, 0)
        err = out.stderr.strip().splitlines()[-1]
        tried = err.split(". Build it")[0]
        for part in ("libprefetch not found", "$PREFETCH_LIB (not set)",
                     os.path.join(pkg, "prefetch", "libprefetch.so") + " (absent)",
                     "libprefetch.so.0 from the system path",
                     "/usr/local/lib/libprefetch.so.0 (absent)", "ldconfig"):
            self.assertIn(part, err)
        # Not a checkout: no build/ of someone else's is looked at.
        self.assertNotIn("build/libprefetch.so", tried)

    # ---- the binding itself ------------------------------------------------------

    def test_ctypes_structs_match_prefetch_h(self):
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if not cc:
            self.skipTest("no C compiler to read prefetch.h's layout")
        src = ["#include <stddef.h>", "#include <stdio.h>", '#include "prefetch.h"',
               "int main(void) {"]
        want = []
        for cname, cls in pfutil._lib.STRUCTS.items():
            src.append('printf("%%zu\\n", sizeof(struct %s));' % cname)
            want.append((cname, "sizeof", ctypes.sizeof(cls)))
            for field, _ in cls._fields_:
                src.append('printf("%%zu\\n", offsetof(struct %s, %s));' % (cname, field))
                want.append((cname, field, getattr(cls, field).offset))
        src.append("return 0; }")
        exe = os.path.join(self.tmp, "layout")
        c_file = exe + ".c"
        with open(c_file, "w") as f:
            f.write("\n".join(src) + "\n")
        subprocess.run([cc, "-I", os.path.join(pfutil.ROOT, "client"), "-o", exe, c_file],
                       check=True)
        got = subprocess.run([exe], check=True, capture_output=True, text=True).stdout.split()
        self.assertEqual(len(got), len(want))
        for (cname, what, size), c_value in zip(want, got):
            self.assertEqual(size, int(c_value), "struct %s: %s" % (cname, what))

    def test_device_array_describes_itself_by_cuda_array_interface_v3(self):
        # What a CUDA batch's field is without a CUDA-enabled torch.
        arr = prefetch.DeviceArray(0x7f0000001000, (4, 3, 5), np.dtype("f2"))
        self.assertEqual(arr.__cuda_array_interface__, {
            "shape": (4, 3, 5), "typestr": "<f2", "data": (0x7f0000001000, False),
            "strides": None, "version": 3, "stream": None})
        self.assertEqual(prefetch.DeviceArray(1, (2,), np.dtype("b1"))
                         .__cuda_array_interface__["typestr"], "|b1")

    def test_library_is_found_through_prefetch_lib_then_the_build_dir(self):
        code = ("import sys; sys.path.insert(0, %r); import prefetch; "
                "print(prefetch.library_path())" % os.path.join(pfutil.ROOT, "python"))
        built = os.path.join(pfutil.ROOT, "build", "libprefetch.so")
        copy = os.path.join(self.tmp, "libprefetch-copy.so")
        shutil.copy(built, copy)

        def run(lib):
            env = dict(os.environ)
            env.pop("PREFETCH_LIB", None)
            if lib is not None:
                env["PREFETCH_LIB"] = lib
            return subprocess.run([sys.executable, "-B", "-c", code], env=env, capture_output=True,
                                  text=True)

        out = run(copy)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), copy)
        out = run(os.path.join(self.tmp, "missing.so"))
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("PREFETCH_LIB=", out.stderr)
        if not os.path.exists(os.path.join(pfutil.ROOT, "python", "prefetch",
                                           "libprefetch.so")):
            out = run(None)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual(out.stdout.strip(), built)


if __name__ == "__main__":
    unittest.main()
