"""The Python binding over host sessions: a real prefetchd on a temporary
socket, .npy files written with numpy, and every delivered sample compared
with the array it came from.

The daemon runs with CUDA_VISIBLE_DEVICES="" so that it serves host
sessions only, on a GPU machine too.  Run through tests/run.py (make check)
or with `python3 -m unittest` from this directory.
"""

import ctypes
import errno
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

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
        cls.fields = fields
        # The bystander's dataset (pfutil.Bystander), "by".
        by_path = os.path.join(cls.tmp, "by.npy")
        pfutil.Bystander.write_rows(by_path)
        cls.daemon = pfutil.Daemon("host", {"multi": fields, "late": {"x": cls.late_path},
                                            "by": {"x": by_path}},
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
