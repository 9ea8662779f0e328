"""The Python binding over CUDA sessions, with torch: a real prefetchd with
a GPU, tensors checked against the .npy files they came from, and the
release rule checked against a deliberately long kernel.

Every case skips, saying why, when torch cannot be imported, has no CUDA,
or the daemon has no GPU; PF_REQUIRE_GPU=1 (make check-cuda) turns those
skips into failures.  Run through tests/run.py or `python3 -m unittest`.
"""

import errno
import gc
import os
import shutil
import sys
import tempfile
import time
import unittest

import numpy as np

import pfutil
from pfutil import prefetch

try:
    import torch
    _TORCH_WHY = None if torch.cuda.is_available() else (
        "torch %s under %s sees no CUDA device (CPU-only build or no GPU)"
        % (torch.__version__, sys.executable))
except ImportError as e:
    torch = None
    _TORCH_WHY = "torch is not importable by %s (%s)" % (sys.executable, e)

N = 1000
SEED = 9
# Cycles of torch.cuda._sleep for the race: about 0.5 s at the 1.98 GHz of
# an H200's boost clock, against the few milliseconds the trainer needs to
# take the next batches; long enough that a slot given back early would be
# refilled (the daemon fills one in well under a millisecond) while the
# kernel waits.
SLEEP_CYCLES = 1 << 30


def make_arrays():
    rng = np.random.default_rng(4321)
    arrays = pfutil.mixed_arrays(rng, N)
    arrays["s"] = rng.integers(-2**15, 2**15, size=(N, 3), dtype=np.int16)
    # The race's field: 4 KiB rows, so that a batch is a real slot's worth.
    arrays["w"] = rng.integers(-2**31, 2**31, size=(N, 1024), dtype=np.int32)
    return arrays


class CudaSessions(unittest.TestCase):
    tmp = None
    daemon = None
    race_daemon = None
    why = _TORCH_WHY

    @classmethod
    def setUpClass(cls):
        if cls.why:
            return
        cls.tmp = tempfile.mkdtemp(prefix="pf-pycuda-")
        cls.arrays = make_arrays()
        fields = {}
        for name, arr in cls.arrays.items():
            fields[name] = os.path.join(cls.tmp, name + ".npy")
            np.save(fields[name], arr)
        cls.daemon = pfutil.Daemon("cuda", {"multi": fields}, extra="ring_bytes = 64M",
                                   tmpdir=cls.tmp)
        # Two slots per session: 32 rows of 4 KiB are one 128 KiB slot.
        cls.race_daemon = pfutil.Daemon("race", {"race": {"w": fields["w"]}},
                                        extra="ring_bytes = 64M\nsession_bytes = 256K",
                                        tmpdir=cls.tmp)
        try:
            with prefetch.Loader("multi", batch_size=8, device="cuda:0",
                                 socket=cls.daemon.sock):
                pass
        except prefetch.PrefetchError as e:
            if e.code != -errno.ENODEV:
                raise
            cls.why = "prefetchd has no usable GPU: %s" % e

    @classmethod
    def tearDownClass(cls):
        for d in (cls.daemon, cls.race_daemon):
            if d:
                d.stop()
        if cls.tmp and not os.environ.get("PF_KEEP_TMP"):
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        if self.why:
            self.skipTest(self.why)

    def loader(self, **kw):
        kw.setdefault("socket", self.daemon.sock)
        kw.setdefault("device", "cuda:0")
        kw.setdefault("timeout", 60)
        return prefetch.Loader("multi", **kw)

    def check_batch(self, batch):
        rows = batch.picks % N
        for name, src in self.arrays.items():
            t = batch[name]
            self.assertIsInstance(t, torch.Tensor, name)
            self.assertEqual(t.device, torch.device("cuda", 0), name)
            self.assertEqual(t.dtype, getattr(torch, src.dtype.name), name)
            self.assertEqual(tuple(t.shape), (batch.count,) + src.shape[1:], name)
            np.testing.assert_array_equal(t.cpu().numpy(), src[rows],
                                          "field %s, batch %d" % (name, batch.seq))

    def exact_epochs(self, ipc):
        with self.loader(batch_size=64, seed=SEED, ipc=ipc) as loader:
            self.assertEqual(loader.device, "cuda:0")
            for n in (0, 1):
                picks = []
                for batch in loader.epoch(n):
                    self.check_batch(batch)
                    picks.append(batch.picks)
                picks = np.concatenate(picks).tolist()
                self.assertEqual(picks, pfutil.shuffle(N, SEED + n))
            self.assertEqual(loader.stats()["held"], 0)

    def test_tensors_hold_the_npy_values_and_dtypes_over_fd(self):
        self.exact_epochs("fd")

    def test_tensors_hold_the_npy_values_and_dtypes_over_legacy_ipc(self):
        self.exact_epochs("legacy")

    def test_loaders_of_one_share_map_the_same_device_batches(self):
        """Two Loaders of one share on cuda:0: the same batches, each from the
        one device copy they both map, every sample once and right."""
        with self.loader(batch_size=64, seed=SEED, share="gpu-sweep") as a, \
                self.loader(batch_size=64, seed=SEED, share="gpu-sweep") as b:
            # Epoch 0 fills the VRAM pool (pool = on): later ones are the
            # daemon's gathers from it into the slots both map.
            for n in (0, 1, 2):
                got = ([], [])
                for x, y in zip(a.epoch(n), b.epoch(n)):
                    self.check_batch(x)
                    self.check_batch(y)
                    got[0].append(x.picks.copy())
                    got[1].append(y.picks.copy())
                for picks in got:
                    self.assertEqual(sorted(np.concatenate(picks).tolist()), list(range(N)))
                self.assertEqual([p.tolist() for p in got[0]], [p.tolist() for p in got[1]])
            st = self.daemon.status()
            share = [sh for sh in st["shares"] if sh["name"] == "gpu-sweep"]
            self.assertEqual(len(share), 1)
            self.assertEqual(len(share[0]["members"]), 2)
            src = [s for s in st["sessions"] if s["session"] == share[0]["session"]][0]
            # One set of device slots, and rows gathered from the pool.
            self.assertGreater(src["device_bytes"], 0)
            self.assertGreater(src["pool_hits"], 0)
            self.assertEqual(a.stats()["held"], 0)

    def race(self, side_stream):
        """Batch 0 is read by kernels queued behind a long sleep; the
        trainer takes the next batches at once, which releases batch 0
        behind the current stream.  The race daemon's sessions have two
        slots, so the slot must be filled again within two batches, and
        only after the kernels have read it.

        side_stream: all of it on a torch side stream (non-blocking with
        respect to the legacy default stream, which stays idle), batch 0
        given back by batch.release(): a release recorded anywhere but on
        the current stream would let the daemon refill the slot at once."""
        w = self.arrays["w"]
        with prefetch.Loader("race", batch_size=32, shuffle=False, device="cuda:0",
                             socket=self.race_daemon.sock, timeout=60) as loader:
            it = loader.epoch(0)
            stream = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
            with torch.cuda.stream(stream):
                b0 = next(it)
                want = w[b0.picks.astype(np.int64)]
                t0 = b0["w"]
                addr = t0.data_ptr()
                torch.cuda._sleep(SLEEP_CYCLES)
                total = t0.to(torch.int64).sum(dim=0)
                snap = t0.clone()
                if side_stream:
                    b0.release()
                later = [next(it)["w"].data_ptr() for _ in range(3)]
            self.assertIn(addr, later, "batch 0's slot was never filled again: the test "
                          "proves nothing")
            stream.synchronize()
            np.testing.assert_array_equal(snap.cpu().numpy(), want)
            np.testing.assert_array_equal(total.cpu().numpy(), want.astype(np.int64).sum(0))
            it.close()

    def test_probe_and_for_batch_in_loader_on_the_gpu(self):
        # pf_probe reports free memory at once (a host session refuses it:
        # test_host.py); iteration runs the epoch set_epoch chose.
        with self.loader(batch_size=100, seed=SEED) as loader:
            loader.probe()
            loader.set_epoch(3)
            picks = []
            for batch in loader:
                self.check_batch(batch)
                self.assertEqual(batch.epoch, 3)
                picks += batch.picks.tolist()
            self.assertEqual(picks, pfutil.shuffle(N, SEED + 3))
            self.assertEqual(len(loader), N // 100)
            loader.probe()

    def test_released_slot_is_not_overwritten_while_a_kernel_reads_it(self):
        self.race(side_stream=False)

    def test_release_on_a_side_stream_waits_for_that_stream(self):
        self.race(side_stream=True)

    def test_what_a_trainer_does_to_one_batch_tensor_leaves_the_next_in_its_slot_alone(self):
        # A gradient asked of a batch's tensor, an in-place reshape or an
        # attribute set on it stays with that tensor: the slot's next batch
        # gets a plain tensor of its own shape with its own rows.
        last = {}  # data_ptr -> (tensor, what was done to it)
        changed_came_round = 0
        with self.loader(batch_size=16, seed=SEED) as loader:
            for n in (0, 1):
                picks = []
                for i, batch in enumerate(loader.epoch(n)):
                    self.check_batch(batch)
                    t = batch["x"]
                    self.assertFalse(t.requires_grad)
                    self.assertFalse(t.__dict__)
                    prev = last.get(t.data_ptr())
                    if prev is not None and prev[1] != "nothing":
                        self.assertIsNot(t, prev[0], "after %s" % prev[1])
                        changed_came_round += 1
                    what = ("nothing", "requires_grad_", "unsqueeze_", "transpose_",
                            "attribute")[i % 5]
                    if what == "requires_grad_":
                        t.requires_grad_()
                    elif what == "unsqueeze_":
                        t.unsqueeze_(0)
                    elif what == "transpose_":
                        t.transpose_(1, 2)
                    elif what == "attribute":
                        t.note = "mine"
                    last[t.data_ptr()] = (t, what)
                    picks.append(batch.picks)
                self.assertEqual(np.concatenate(picks).tolist(), pfutil.shuffle(N, SEED + n))
        self.assertGreater(changed_came_round, 0,
                           "no changed tensor's slot came round again: the test proves nothing")

    def test_leaving_a_cuda_epoch_early_returns_every_slot(self):
        with self.loader(batch_size=32) as loader:
            sid = loader.stats()["session"]
            for i, batch in enumerate(loader.epoch(0)):
                batch["x"].sum()
                if i == 3:
                    break
            s = self.daemon.wait_session(sid, lambda s: s["held"] == 0)
            self.assertEqual((s["state"], s["held"]), ("idle", 0))
            picks = []
            for batch in loader.epoch(1):
                self.check_batch(batch)
                picks.append(batch.picks)
            self.assertEqual(sorted(np.concatenate(picks).tolist()), list(range(N)))

    def test_tensor_read_after_close_keeps_its_import_until_it_goes(self):
        # The tensor holds (through torch's reference to its
        # __cuda_array_interface__ object) the client that imported the
        # arena: pf_close, which unmaps it, waits for the last tensor.
        with self.loader(batch_size=32, shuffle=False) as loader:
            sid = loader.stats()["session"]
            it = loader.epoch(0)
            b = next(it)
            t = b["x"]
            want = self.arrays["x"][b.picks % N]
        self.assertTrue(b.released)
        np.testing.assert_array_equal(t.cpu().numpy(), want)
        self.assertIsNotNone(self.daemon.session(sid))
        del t, it
        gc.collect()
        deadline = time.monotonic() + 5
        while self.daemon.session(sid) is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        self.assertIsNone(self.daemon.session(sid))

    def test_cuda_device_on_a_gpu_less_daemon_names_host_sessions(self):
        with pfutil.Daemon("nogpu", {"multi": {"z": os.path.join(self.tmp, "z.npy")}},
                           env={"CUDA_VISIBLE_DEVICES": ""}, tmpdir=self.tmp) as d:
            with self.assertRaises(prefetch.PrefetchError) as cm:
                prefetch.Loader("multi", device="cuda:0", socket=d.sock)
            self.assertEqual(cm.exception.code, -errno.ENODEV)
            self.assertIn("this daemon serves host sessions only", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
