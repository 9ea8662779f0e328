#!/usr/bin/env python3
"""train_step.py — what prefetchd costs a compute-bound PyTorch training step (issue 16).

One run on a GPU machine, everything measured in the same run:

  data      a .npy of --gib GiB (default 4) of float32 rows of 1024 values (4 KiB), read once
            into the page cache; shuffled batches of 1024 rows (4 MiB).
  step      two float32 matmuls (TF32 off): x (1024 x 1024) @ W1 (1024 x H) @ W2 (H x 1024),
            into preallocated outputs, on torch's current stream.  H is calibrated so that the
            step takes about --step-copies (4) times the PCIe copy of one batch (a pinned 4 MiB
            host-to-device copy measured first).
  compute   the step over 16 batches already on the GPU, the CPU queueing ahead as a trainer's
            does: the compute-only step time, the reference every overhead is against.
  loaders   the same step fed by
              pool=off     prefetchd with `pool = off` and otherwise its default configuration
                           (readers and ring_bytes auto), through python/prefetch's Loader;
              pool=on      prefetchd's default configuration (the pool is on), after one
                           epoch that fills the pool: every row resident, gathered in this
                           process's context by libprefetch;
              dataloader   torch DataLoader, 8 workers, pin_memory, batches fancy-indexed
                           from a memmap, .to(device, non_blocking=True).
            One Loader across --epochs timed epochs (default 3) after a warm-up epoch; the
            step time is the timed epochs' wall time over their batches (one synchronize at
            the end of each epoch).  overhead = step / compute - 1.
  tight     the same loaders with no compute, through Python: GB/s delivered (each batch's
            x tensor taken, nothing else), against `make bench-cuda`'s delivered rate from
            --cuda-bench run in this call; and the Python per-batch cost beyond pf_next
            (the time of a loop iteration less the time inside libprefetch's pf_release_next,
            which releases the batch before and takes the next), from one more epoch with
            that timer in place (the rate comes from the epochs without it).
  sweep     readers x ring_bytes over a grid, tight loop with the pool off, next to the
            default (auto) configuration; then the default and the best point of that pass
            measured again in turn, 3 times each: the default's median rate over the best's.
  checks    a verification epoch per prefetchd loader: every pick once, the float64 sum of
            every delivered value equal to the file's, the first and last row of every 64th
            batch equal to the file's rows.  A failed check exits 1.

The report ends with `overhead pool=off: X%` and `overhead pool=on: Y%`.

  python3 bench/train_step.py [--gib 4] [--epochs 3] [--data DIR] [--skip dataloader,sweep,..]
                              [--cuda-bench build/bench/cuda_throughput | --cuda-bench none]
                              [--mps] [--json OUT]

--mps runs everything under CUDA MPS: the script starts nvidia-cuda-mps-control -d with its
own pipe and log directories, runs itself again under it, and stops it at the end.
Progress goes to stderr, the report to stdout.
"""

import argparse
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vs_dataloader import wait_listening  # noqa: E402 (after the path)

GIB = 1 << 30
ROW_FLOATS = 1024
ROW_BYTES = ROW_FLOATS * 4
BATCH_ROWS = 1024
BATCH_BYTES = BATCH_ROWS * ROW_BYTES
DATA_SEED = 16


def log(msg):
    sys.stderr.write("train_step: %s\n" % msg)
    sys.stderr.flush()


# ---- data -------------------------------------------------------------------------------


def prepare_data(args):
    import numpy as np
    rows = int(args.gib * GIB) // BATCH_BYTES * BATCH_ROWS
    os.makedirs(args.data, exist_ok=True)
    path = os.path.join(args.data, "f4-rows-%d.npy" % rows)
    ok = False
    if os.path.exists(path):
        try:
            mm = np.load(path, mmap_mode="r")
            ok = mm.shape == (rows, ROW_FLOATS) and mm.dtype == np.float32
        except (OSError, ValueError):
            ok = False
    if not ok:
        log("writing %d rows of %d float32 (%.2f GiB) to %s" % (rows, ROW_FLOATS,
                                                                rows * ROW_BYTES / GIB, path))
        tmp = path + ".part"
        arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32,
                                        shape=(rows, ROW_FLOATS))
        rng = np.random.default_rng(DATA_SEED)
        step = 16384
        for r in range(0, rows, step):
            n = min(step, rows - r)
            arr[r:r + n] = rng.standard_normal((n, ROW_FLOATS), dtype=np.float32)
        arr.flush()
        del arr
        os.replace(tmp, path)
    # Once through the page cache, with the float64 sum every checked epoch must match.
    mm = np.load(path, mmap_mode="r")
    t0 = time.perf_counter()
    total = 0.0
    for r in range(0, rows, 16384):
        total += float(np.asarray(mm[r:r + 16384], dtype=np.float64).sum())
    log("dataset in the page cache (%.1f s); float64 sum %.6f" % (time.perf_counter() - t0,
                                                                     total))
    return {"path": path, "rows": rows, "sum": total, "mm": mm}


# ---- the daemon -------------------------------------------------------------------------


class Daemon:
    """A build/prefetchd on a temporary socket with the given [daemon] lines."""

    def __init__(self, args, tmpdir, data, daemon_lines, pool, tag):
        self.sock = os.path.join(tmpdir, "pf-%s.sock" % tag)
        self.conf = os.path.join(tmpdir, "pf-%s.conf" % tag)
        self.log_path = os.path.join(tmpdir, "pf-%s.log" % tag)
        # (The other benches that use this class have no --keep-logs.)
        self.keep = getattr(args, "keep_logs", None)
        with open(self.conf, "w") as f:
            f.write("# bench/train_step.py: %s\n[daemon]\nsocket = %s\n%s\n"
                    "[dataset.bench]\nformat = npy\nfield.x = %s\npool = %s\n"
                    % (tag, self.sock, daemon_lines, data["path"], "on" if pool else "off"))
        logf = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen([args.prefetchd_bin, "-c", self.conf] +
                                         (["-v"] if args.diag or self.keep else []),
                                         stdin=subprocess.DEVNULL, stdout=logf,
                                         stderr=subprocess.STDOUT, close_fds=True)
        finally:
            logf.close()
        wait_listening(self.proc, self.sock, self.tail)

    def status(self):
        out = subprocess.run([os.path.join(REPO, "build", "prefetchctl"), "-s", self.sock,
                              "status", "--json"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, timeout=10).stdout
        return json.loads(out.decode())

    def tail(self, n=2500):
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n))
                return "\n" + f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.keep:  # --keep-logs: here, so that a run that failed keeps them too
            os.makedirs(self.keep, exist_ok=True)
            shutil.copy(self.log_path, self.keep)


# ---- the step ---------------------------------------------------------------------------


class Step:
    def __init__(self, torch, hidden):
        self.torch = torch
        dev = torch.device("cuda", 0)
        g = torch.Generator(device=dev).manual_seed(1)
        self.w1 = torch.randn(ROW_FLOATS, hidden, device=dev, generator=g) / 32
        self.w2 = torch.randn(hidden, ROW_FLOATS, device=dev, generator=g) / 32
        self.y = torch.empty(BATCH_ROWS, hidden, device=dev)
        self.z = torch.empty(BATCH_ROWS, ROW_FLOATS, device=dev)
        self.hidden = hidden

    def __call__(self, x):
        mm = self.torch.mm
        mm(x, self.w1, out=self.y)
        mm(self.y, self.w2, out=self.z)


def copy_time(torch, nbytes=BATCH_BYTES):
    """Seconds one pinned host-to-device copy of nbytes (a 4 MiB batch) takes (best of 3 x
    200)."""
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    best = None
    for _ in range(4):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        t = (time.perf_counter() - t0) / 200
        best = t if best is None else min(best, t)
    return best


def compute_only(torch, step, steps=1024, reps=5):
    xs = [torch.randn(BATCH_ROWS, ROW_FLOATS, device="cuda:0") for _ in range(16)]
    times = []
    for _ in range(reps + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(steps):
            step(xs[i % 16])
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / steps)
    times = sorted(times[1:])
    return times[len(times) // 2], times


def calibrate(torch, args):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    t_copy = copy_time(torch)
    want = args.step_copies * t_copy
    hidden = 1024
    for _ in range(3):
        t, _ = compute_only(torch, Step(torch, hidden), steps=256, reps=2)
        hidden = max(128, min(16384, int(round(hidden * want / t / 128.0)) * 128))
    step = Step(torch, hidden)
    t0, times = compute_only(torch, step)
    return step, t_copy, t0, times


# ---- prefetchd through python/prefetch ------------------------------------------------


class PfNextTimer:
    """Stands in for the Loader's ctypes library: the time spent inside libprefetch's
    pf_release_next (the previous batch's release and pf_next_stream, one call), in wall
    time (inside) and the calling thread's CPU time (inside_cpu)."""

    def __init__(self, lib):
        self._lib = lib
        self.inside = 0.0
        self.inside_cpu = 0.0
        self.other = 0.0

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def pf_release_next_addr(self, *a):
        t0, c0 = time.perf_counter(), time.thread_time()
        rc = self._lib.pf_release_next_addr(*a)
        self.inside += time.perf_counter() - t0
        self.inside_cpu += time.thread_time() - c0
        return rc

    def pf_start_epoch(self, *a):
        # Once an epoch: libprefetch's too, not the binding's per-batch cost.
        t0 = time.perf_counter()
        rc = self._lib.pf_start_epoch(*a)
        self.other += time.perf_counter() - t0
        return rc


def timeline(evs, n, cpu):
    """GPU view of the last timed epoch: each step's own time (event to event on the
    trainer's stream) and the idle gaps between steps; for the gaps over 100 us, the
    step's index, how long the CPU waited for its batch, and how many steps the CPU had
    queued ahead (1..32, approximate) when it launched the step before."""
    steps = [evs[2 * i].elapsed_time(evs[2 * i + 1]) * 1e3 for i in range(n)]
    gaps = [evs[2 * i + 1].elapsed_time(evs[2 * i + 2]) * 1e3 for i in range(n - 1)]
    big = [(i + 1, round(g), round(cpu[i + 1][0] * 1e6), cpu[i][1])
           for i, g in enumerate(gaps) if g > 100]
    leads = sorted(c[1] for c in cpu[:n])
    st = sorted(steps)
    return {"step_us_mean": sum(steps) / n, "step_us_p50": st[n // 2],
            "step_us_p99": st[int(n * 0.99)], "gap_us_mean": sum(gaps) / max(1, len(gaps)),
            "gaps_over_20us": sum(1 for g in gaps if g > 20),
            "gap_us_total": sum(gaps), "lead_p50": leads[n // 2],
            # First step's start to the last one's end, on the GPU: the epoch's wall time
            # less this is its start (the first batch) and end.
            "span_us": evs[0].elapsed_time(evs[2 * n - 1]) * 1e3,
            "big_gaps": big[:40]}


def run_inproc(ctx, epochs=2, registered=False):
    """Reference: the trainer's own process copies each batch (gathered into a pinned
    buffer by the CPU beforehand) on a second stream, the step waiting on an event.
    registered: the pinned buffers are 4 KiB-page anonymous memory registered with
    cudaHostRegister (as the daemon's ring is), not torch's pin_memory."""
    import mmap
    import numpy as np
    torch = ctx["torch"]
    step = ctx["step"]
    mm = ctx["data"]["mm"]
    k = 32
    if registered:
        buf = mmap.mmap(-1, k * BATCH_BYTES)
        buf.madvise(mmap.MADV_NOHUGEPAGE)
        arr = np.frombuffer(buf, dtype=np.float32).reshape(k, BATCH_ROWS, ROW_FLOATS)
        arr[:] = mm[:k * BATCH_ROWS].reshape(k, BATCH_ROWS, ROW_FLOATS)
        rc = torch.cuda.cudart().cudaHostRegister(arr.ctypes.data, k * BATCH_BYTES, 0)
        if int(rc) != 0:
            raise RuntimeError("cudaHostRegister: %s" % rc)
        host = [torch.from_numpy(arr[i]) for i in range(k)]
    else:
        host = [torch.from_numpy(np.ascontiguousarray(mm[i * BATCH_ROWS:(i + 1) * BATCH_ROWS]))
                .pin_memory() for i in range(k)]
    dev = [torch.empty(BATCH_ROWS, ROW_FLOATS, device="cuda:0") for _ in range(k)]
    side = torch.cuda.Stream()
    evs = [torch.cuda.Event() for _ in range(k)]
    done = [torch.cuda.Event() for _ in range(k)]
    nb = ctx["data"]["rows"] // BATCH_ROWS
    total = 0.0
    for e in range(epochs + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(nb):
            j = i % k
            with torch.cuda.stream(side):
                side.wait_event(done[j])
                dev[j].copy_(host[j], non_blocking=True)
                evs[j].record(side)
            torch.cuda.current_stream().wait_event(evs[j])
            step(dev[j])
            done[j].record()
        torch.cuda.synchronize()
        if e:
            total += time.perf_counter() - t0
    if registered:
        torch.cuda.cudart().cudaHostUnregister(arr.ctypes.data)
    return {"name": "in-process copies", "step_s": total / (nb * epochs),
            "gbs": nb * epochs * BATCH_BYTES / total / 1e9}


_COPIER = r"""
import sys, time, torch
n, period = int(sys.argv[1]), float(sys.argv[2])
h = torch.empty(4 << 20, dtype=torch.uint8).pin_memory()
d = [torch.empty(4 << 20, dtype=torch.uint8, device="cuda:0") for _ in range(4)]
torch.cuda.synchronize()
print("ready", flush=True)
t = time.perf_counter()
for i in range(n):
    d[i % 4].copy_(h, non_blocking=True)
    t += period
    while time.perf_counter() < t:
        pass
torch.cuda.synchronize()
"""


def run_foreign_copies(ctx):
    """Compute-only steps while a second process copies a pinned 4 MiB buffer to the GPU
    once per compute step: cross-process copies with no reader work."""
    torch = ctx["torch"]
    step = ctx["step"]
    n = 3000
    p = subprocess.Popen([sys.executable, "-c", _COPIER, str(n + 2000),
                          str(ctx["compute_s"])], stdout=subprocess.PIPE)
    p.stdout.readline()
    xs = [torch.randn(BATCH_ROWS, ROW_FLOATS, device="cuda:0") for _ in range(16)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        step(xs[i % 16])
    torch.cuda.synchronize()
    t = time.perf_counter() - t0
    p.wait()
    return {"name": "foreign copies", "step_s": t / n, "gbs": n * BATCH_BYTES / t / 1e9}


def run_host_readers(ctx, epochs=2):
    """Compute-only steps on resident data while a host session of prefetchd streams the
    same batches to this process at the step's pace: the readers' work, no device copy."""
    import prefetch
    torch = ctx["torch"]
    step = ctx["step"]
    d = Daemon(ctx["args"], ctx["tmp"], ctx["data"], "", False, "host")
    xs = [torch.randn(BATCH_ROWS, ROW_FLOATS, device="cuda:0") for _ in range(16)]
    try:
        with prefetch.Loader("bench", batch_size=BATCH_ROWS, device="host", shuffle=True,
                             seed=7, socket=d.sock, timeout=120) as loader:
            for b in loader.epoch(0):
                pass
            total, nb = 0.0, 0
            for e in range(1, epochs + 1):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for i, b in enumerate(loader.epoch(e)):
                    b["x"]
                    step(xs[i % 16])
                    nb += 1
                torch.cuda.synchronize()
                total += time.perf_counter() - t0
    finally:
        d.stop()
    return {"name": "host readers", "step_s": total / nb, "gbs": nb * BATCH_BYTES / total / 1e9}


def run_host_client_copies(ctx, epochs=2):
    """Experiment: a host session (the daemon's readers fill memfd slots this process
    maps), the trainer registering each slot once (read-only) and copying the batch to the
    GPU itself, on a second stream of its own context; the step waits on an event."""
    import prefetch
    torch = ctx["torch"]
    step = ctx["step"]
    cudart = torch.cuda.cudart()
    d = Daemon(ctx["args"], ctx["tmp"], ctx["data"], "", False, "hostcopy")
    k = 8
    dev = [torch.empty(BATCH_ROWS, ROW_FLOATS, device="cuda:0") for _ in range(k)]
    side = torch.cuda.Stream()
    evs = [torch.cuda.Event() for _ in range(k)]
    done = [torch.cuda.Event() for _ in range(k)]
    registered = {}
    page = 4096
    try:
        with prefetch.Loader("bench", batch_size=BATCH_ROWS, device="host", shuffle=True,
                             seed=7, socket=d.sock, timeout=120) as loader:
            total, nb = 0.0, 0
            for e in range(epochs + 1):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for i, b in enumerate(loader.epoch(e)):
                    x = b["x"]
                    addr = x.ctypes.data
                    if addr not in registered:
                        lo = addr // page * page
                        hi = -(-(addr + x.nbytes) // page) * page
                        rc = cudart.cudaHostRegister(lo, hi - lo, 8)  # ReadOnly
                        registered[addr] = (lo, int(rc))
                    j = i % k
                    with torch.cuda.stream(side):
                        side.wait_event(done[j])
                        import warnings
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            dev[j].copy_(torch.from_numpy(x), non_blocking=True)
                        evs[j].record(side)
                    torch.cuda.current_stream().wait_event(evs[j])
                    step(dev[j])
                    done[j].record()
                    evs[j].synchronize()  # the slot goes back when the next is taken
                    nb += e > 0
                torch.cuda.synchronize()
                if e:
                    total += time.perf_counter() - t0
    finally:
        for lo, rc in registered.values():
            if rc == 0:
                cudart.cudaHostUnregister(lo)
        d.stop()
    bad = sum(1 for _, rc in registered.values() if rc != 0)
    return {"name": "host session, trainer copies", "step_s": total / nb,
            "gbs": nb * BATCH_BYTES / total / 1e9,
            "check": "%d slots registered, %d failed" % (len(registered), bad)}


def verify_epoch(torch, loader, data, n):
    """One epoch checked: every pick once, the float64 sum, sampled rows."""
    import numpy as np
    rows = data["rows"]
    seen = np.zeros(rows, dtype=np.uint8)
    acc = torch.zeros((), dtype=torch.float64, device="cuda:0")
    for i, b in enumerate(loader.epoch(n)):
        x = b["x"]
        acc += x.double().sum()
        seen[b.picks.astype(np.int64)] += 1
        if i % 64 == 0:
            got = x[[0, b.count - 1]].cpu().numpy()
            want = data["mm"][[int(b.picks[0]), int(b.picks[b.count - 1])]]
            if not np.array_equal(got, want):
                raise RuntimeError("epoch %d batch %d: rows differ from the file" % (n, i))
    torch.cuda.synchronize()
    if not (seen == 1).all():
        raise RuntimeError("epoch %d: %d rows not delivered exactly once"
                           % (n, int((seen != 1).sum())))
    got = float(acc.item())
    if abs(got - data["sum"]) > 1e-6 * max(1.0, abs(data["sum"])) + 1e-3:
        raise RuntimeError("epoch %d: sum %.6f, file %.6f" % (n, got, data["sum"]))
    return "every pick once, sum %.3f = file's, sampled rows equal" % got


def run_prefetchd(ctx, tag, pool, daemon_lines, compute, epochs, check=True, tight_only=False):
    """A Loader across warm-up + `epochs` timed epochs; returns a result dict."""
    import prefetch
    torch = ctx["torch"]
    d = Daemon(ctx["args"], ctx["tmp"], ctx["data"], daemon_lines, pool, tag)
    res = {"name": tag}
    try:
        loader = prefetch.Loader("bench", batch_size=BATCH_ROWS, device="cuda:0", shuffle=True,
                                 seed=7, socket=d.sock, name="train_step-" + tag, timeout=120)
        with loader:
            step = ctx["step"]
            # Warm-up epoch: arenas imported, the probe sized the target and the pool,
            # the pool filled (pool=on).
            for b in loader.epoch(0):
                if compute:
                    step(b["x"])
            torch.cuda.synchronize()
            if pool:
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    st = d.status()
                    p = (st.get("pools") or [{}])[0]
                    if p.get("rows") == ctx["data"]["rows"]:
                        break
                    time.sleep(0.2)
                res["pool_rows"] = p.get("rows")
                if p.get("rows") != ctx["data"]["rows"]:
                    log("%s: pool holds %s of %d rows after warm-up" % (tag, p.get("rows"),
                                                                       ctx["data"]["rows"]))
            per_epoch = []
            nb = 0
            for e in range(1, epochs + 1):
                n = 0
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                if compute and e == epochs and ctx.get("timeline"):
                    evs = ctx["timeline"]
                    cpu = ctx["timeline_cpu"]
                    pc = time.perf_counter
                    t_prev = pc()
                    for b in loader.epoch(e):
                        t_got = pc()
                        evs[2 * n].record()
                        step(b["x"])
                        evs[2 * n + 1].record()
                        # Steps queued and not done: how far ahead the CPU is.
                        lead = 0
                        for j in (1, 2, 4, 8, 16, 32):
                            if n - j >= 0 and not evs[2 * (n - j) + 1].query():
                                lead = j
                        cpu[n] = (t_got - t_prev, lead)
                        t_prev = pc()
                        n += 1
                elif compute:
                    for b in loader.epoch(e):
                        step(b["x"])
                        n += 1
                else:
                    for b in loader.epoch(e):
                        b["x"]
                        n += 1
                torch.cuda.synchronize()
                per_epoch.append((time.perf_counter() - t0, n))
                nb += n
            if compute and ctx.get("timeline"):
                res["gpu"] = timeline(ctx["timeline"], n, ctx["timeline_cpu"])
            total = sum(t for t, _ in per_epoch)
            res["epochs"] = [(round(t, 4), n) for t, n in per_epoch]
            res["step_s"] = total / nb
            res["gbs"] = nb * BATCH_BYTES / total / 1e9
            if not compute:
                # Where a batch's time goes, from one more epoch with the time inside
                # libprefetch taken apart (the timer costs a little itself, so the
                # rate above comes from the epochs without it).
                timer = PfNextTimer(loader._libref)
                loader._libref = timer
                n = 0
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for b in loader.epoch(epochs + 1):
                    b["x"]
                    n += 1
                t_sync = time.perf_counter()
                torch.cuda.synchronize()
                t_all = time.perf_counter() - t0
                timer.other += time.perf_counter() - t_sync
                loader._libref = timer._lib
                res["timed_gbs"] = n * BATCH_BYTES / t_all / 1e9
                res["py_us"] = (t_all - timer.inside - timer.other) / n * 1e6
                res["pf_next_us"] = timer.inside / n * 1e6
                epochs += 1
            st = d.status()
            s = [x for x in st.get("sessions", []) if x.get("name") == "train_step-" + tag]
            if s:
                res["stall"] = s[0].get("stall_fraction")
                res["target"] = s[0].get("target")
                res["h2d_bytes"] = s[0].get("h2d_bytes")
                res["pool_hits"] = s[0].get("pool_hits")
            res["readers"] = st.get("readers")
            res["ring_mib"] = (st.get("ring_bytes") or 0) / 1048576.0
            res["gpu_desc"] = st.get("gpu")
            if check:
                res["check"] = verify_epoch(torch, loader, ctx["data"], epochs + 1)
            if ctx["args"].diag:
                with open(d.log_path, errors="replace") as f:
                    res["daemon_timing"] = [ln.strip() for ln in f if "per batch: read" in ln
                                            or "first batch sent" in ln][-4:]
    finally:
        d.stop()
    return res


# ---- torch DataLoader -------------------------------------------------------------------


class BatchRows:
    """Map-style dataset: __getitem__(list of rows) -> (len, 1024) float32 tensor."""

    def __init__(self, path):
        self.path, self.arr = path, None

    def __len__(self):
        import numpy as np
        return int(np.load(self.path, mmap_mode="r").shape[0])

    def __getitem__(self, idx):
        import numpy as np
        import torch
        if self.arr is None:
            self.arr = np.load(self.path, mmap_mode="r")
        return torch.from_numpy(np.ascontiguousarray(self.arr[np.sort(np.asarray(idx))]))


def run_dataloader(ctx, compute, batches=384):
    import torch
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler
    ds = BatchRows(ctx["data"]["path"])
    sampler = BatchSampler(RandomSampler(range(ctx["data"]["rows"])), BATCH_ROWS, True)
    dl = DataLoader(ds, sampler=sampler, batch_size=None, num_workers=8, pin_memory=True,
                    prefetch_factor=4, persistent_workers=False)
    step = ctx["step"]
    it = iter(dl)
    for _ in range(64):
        x = next(it).to("cuda:0", non_blocking=True)
        if compute:
            step(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(batches):
        x = next(it).to("cuda:0", non_blocking=True)
        if compute:
            step(x)
        else:
            x
    torch.cuda.synchronize()
    t = time.perf_counter() - t0
    del it, dl
    return {"name": "dataloader", "step_s": t / batches,
            "gbs": batches * BATCH_BYTES / t / 1e9}


# ---- the C bench --------------------------------------------------------------------------


def run_cuda_bench(path):
    log("running %s (make bench-cuda) for the reference rate" % path)
    p = subprocess.run([path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=400)
    out = p.stdout.decode("utf-8", "replace")
    res = {"rc": p.returncode, "tail": out[-6000:]}
    m = re.search(r"^prefetchd delivered on cuda:0\s+([0-9.]+)", out, re.M)
    if m:
        res["gbs"] = float(m.group(1))
    m = re.search(r"^ratio: ([0-9.]+)", out, re.M)
    if m:
        res["ratio"] = float(m.group(1))
    m = re.search(r"hand-off of a ready batch \(.*?p50 ([0-9.]+) us, p99 ([0-9.]+) us", out)
    if m:
        res["p50"], res["p99"] = float(m.group(1)), float(m.group(2))
    m = re.search(r"hand-off of a ready batch, consumer busy.*?p50 ([0-9.]+) us, p99 ([0-9.]+) us",
                  out)
    if m:
        res["busy_p50"], res["busy_p99"] = float(m.group(1)), float(m.group(2))
    return res


# ---- main ---------------------------------------------------------------------------------


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "pf-train-step"))
    ap.add_argument("--prefetchd-bin", default=os.path.join(REPO, "build", "prefetchd"))
    ap.add_argument("--cuda-bench", default=os.path.join(REPO, "build", "bench",
                                                         "cuda_throughput"))
    ap.add_argument("--step-copies", type=float, default=4.0)
    ap.add_argument("--skip", default="",
                    help="comma list: dataloader,tight,sweep,checks; and, for diagnostics, "
                    "compute (prefetchd's compute loops), tight-off (the pool-off tight loop)")
    ap.add_argument("--sweep-readers", default="4,6,8,13,16")
    ap.add_argument("--sweep-ring", default="256M,512M,1G")
    ap.add_argument("--mps", action="store_true")
    ap.add_argument("--timeline", action="store_true",
                    help="events around every step of the last timed epoch (GPU busy, gaps)")
    ap.add_argument("--diag-more", default="")
    ap.add_argument("--diag", action="store_true",
                    help="also: pool on gathered by the daemon, in-process copies")
    ap.add_argument("--keep-logs", metavar="DIR",
                    help="daemons log verbosely (-v, which costs them a little: a diagnostic "
                    "run, not a measurement to report), and their logs are copied into DIR")
    ap.add_argument("--mps-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json")
    return ap.parse_args(argv)


def with_mps(argv):
    """Runs this script again under an MPS control daemon of its own."""
    ctl = shutil.which("nvidia-cuda-mps-control")
    if not ctl:
        log("--mps: nvidia-cuda-mps-control not found")
        return 1
    d = tempfile.mkdtemp(prefix="pf-mps-")
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=os.path.join(d, "pipe"),
               CUDA_MPS_LOG_DIRECTORY=os.path.join(d, "log"))
    os.makedirs(env["CUDA_MPS_PIPE_DIRECTORY"])
    os.makedirs(env["CUDA_MPS_LOG_DIRECTORY"])
    subprocess.run([ctl, "-d"], env=env, check=True)
    log("MPS control daemon started (pipes in %s)" % env["CUDA_MPS_PIPE_DIRECTORY"])
    try:
        return subprocess.run([sys.executable, os.path.abspath(__file__), "--mps-child"] +
                              [a for a in argv if a != "--mps"], env=env).returncode
    finally:
        subprocess.run([ctl], input=b"quit\n", env=env)
        time.sleep(1)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.mps:
        return with_mps(argv)
    skip = set(x for x in args.skip.split(",") if x)
    import torch
    if not torch.cuda.is_available():
        log("no CUDA device: nothing to measure")
        return 77
    tmp = tempfile.mkdtemp(prefix="pf-train-step-")
    ctx = {"args": args, "torch": torch, "tmp": tmp}
    results = {}
    failed = False
    cb = None
    if args.cuda_bench != "none" and "tight" not in skip:
        cb = run_cuda_bench(args.cuda_bench)
        results["cuda_bench"] = {k: v for k, v in cb.items() if k != "tail"}
        results["cuda_bench_output"] = cb.get("tail")
        if cb["rc"] or "gbs" not in cb:
            log("make bench-cuda failed (rc %s):\n%s" % (cb["rc"], cb["tail"]))
    ctx["data"] = prepare_data(args)
    step, t_copy, t0, times = calibrate(torch, args)
    ctx["step"] = step
    results["copy_s"] = t_copy
    results["compute_s"] = t0
    ctx["compute_s"] = t0
    results["hidden"] = step.hidden
    log("batch copy %.1f us; step H=%d: %.1f us compute-only (runs %s)"
        % (t_copy * 1e6, step.hidden, t0 * 1e6, ", ".join("%.1f" % (t * 1e6) for t in times)))

    runs = [("pool=off", False, ""), ("pool=on", True, "")]
    loaders = {}
    if args.timeline:
        ctx["timeline"] = [torch.cuda.Event(enable_timing=True)
                           for _ in range(2 * ctx["data"]["rows"] // BATCH_ROWS + 2)]
        ctx["timeline_cpu"] = [(0.0, 0)] * (ctx["data"]["rows"] // BATCH_ROWS + 1)
    if args.diag:
        runs += [("pool=off,readers=4", False, "readers = 4\n"),
                 ("pool=off,readers=13", False, "readers = 13\n")]
    for tag, pool, lines in runs:
        if "compute" in skip:
            break
        if tag.endswith("daemon-gather"):
            os.environ["PREFETCH_CLIENT_GATHER"] = "0"
        log("%s: compute loop" % tag)
        try:
            loaders[tag] = run_prefetchd(ctx, tag, pool, lines, True, args.epochs,
                                         check="checks" not in skip)
            r = loaders[tag]
            log("%s: step %.1f us (%+.2f%%), %s" % (tag, r["step_s"] * 1e6,
                                                     (r["step_s"] / t0 - 1) * 100,
                                                     r.get("check", "unchecked")))
        except Exception as e:  # noqa: BLE001 - report it and go on
            log("%s failed: %s" % (tag, e))
            loaders[tag] = {"name": tag, "error": str(e)}
            failed = True
        os.environ.pop("PREFETCH_CLIENT_GATHER", None)
    if args.diag:
        loaders["in-process copies"] = run_inproc(ctx)
        if "hostcopy" in args.diag_more:
            try:
                loaders["host session, trainer copies"] = run_host_client_copies(ctx)
            except Exception as e:  # noqa: BLE001
                loaders["host session, trainer copies"] = {"name": "x", "error": str(e)}
        if "foreign" in args.diag_more:
            loaders["copies from another process"] = run_foreign_copies(ctx)
            loaders["host session readers"] = run_host_readers(ctx)
    if "dataloader" not in skip:
        log("dataloader: compute loop")
        try:
            loaders["dataloader"] = run_dataloader(ctx, True)
        except Exception as e:  # noqa: BLE001
            log("dataloader failed: %s" % e)
            loaders["dataloader"] = {"name": "dataloader", "error": str(e)}
    results["compute_loop"] = loaders

    tight = {}
    if "tight" not in skip:
        for tag, pool, lines in runs:
            if tag == "pool=off" and "tight-off" in skip:
                continue
            log("%s: tight loop" % tag)
            try:
                tight[tag] = run_prefetchd(ctx, tag + "-tight", pool, lines, False,
                                           args.epochs, check=False)
            except Exception as e:  # noqa: BLE001
                log("%s tight failed: %s" % (tag, e))
                tight[tag] = {"error": str(e)}
                failed = True
    results["tight"] = tight

    sweep = []
    if "sweep" not in skip:
        cpus = len(os.sched_getaffinity(0))
        grid = [(int(r), g) for r in args.sweep_readers.split(",") for g in
                args.sweep_ring.split(",") if int(r) <= cpus]
        for r, g in [(None, None)] + grid:
            lines = "" if r is None else "readers = %d\nring_bytes = %s\n" % (r, g)
            tag = "default" if r is None else "r%d-%s" % (r, g)
            try:
                res = run_prefetchd(ctx, "sweep-" + tag, False, lines, False, 2, check=False)
                sweep.append((tag, res["gbs"], res.get("readers"), res.get("ring_mib")))
                log("sweep %s: %.2f GB/s (readers %s, ring %.0f MiB)" % (
                    tag, res["gbs"], res.get("readers"), res.get("ring_mib") or 0))
            except Exception as e:  # noqa: BLE001
                log("sweep %s failed: %s" % (tag, e))
    results["sweep"] = sweep
    # One pass of 2 epochs a point moves by +-10% on the lent machine (bench/NOTES.md, run
    # 36), and the best of 16 such figures is the luckiest one.  So the default and the
    # point the pass found best are measured again, in turn, 3 times each, and compared
    # by their medians.
    confirm = {}
    dflt_pass = [x for x in sweep if x[0] == "default"]
    if dflt_pass and len(sweep) > 1:
        best_pass = max(sweep, key=lambda x: x[1])
        if best_pass[0] != "default":
            lines = {"default": ""}
            r, g = best_pass[0][1:].split("-")
            lines[best_pass[0]] = "readers = %s\nring_bytes = %s\n" % (r, g)
            for _ in range(3):
                for tag in ("default", best_pass[0]):
                    try:
                        res = run_prefetchd(ctx, "confirm-" + tag, False, lines[tag], False, 2,
                                            check=False)
                        confirm.setdefault(tag, []).append(res["gbs"])
                        log("confirm %s: %.2f GB/s" % (tag, res["gbs"]))
                    except Exception as e:  # noqa: BLE001
                        log("confirm %s failed: %s" % (tag, e))
    results["sweep_confirm"] = confirm

    # ---- report ----
    gpu = (loaders.get("pool=off") or {}).get("gpu_desc", "?")
    print("train_step: %s" % gpu)
    print("batch: %d x %d float32 (%.1f MiB); pinned H2D copy of one batch %.1f us" % (
        BATCH_ROWS, ROW_FLOATS, BATCH_BYTES / 1048576.0, t_copy * 1e6))
    print("step: two f32 matmuls, H = %d: compute-only %.1f us (%.2f x the copy)" % (
        step.hidden, t0 * 1e6, t0 / t_copy))
    print("%-12s %10s %10s %8s %8s %8s %s" % ("loader", "step us", "overhead", "GB/s",
                                              "readers", "ring MiB", "check"))
    for tag in loaders:
        r = loaders.get(tag)
        if not r:
            continue
        if "error" in r:
            print("%-12s failed: %s" % (tag, r["error"]))
            continue
        print("%-12s %10.1f %9.2f%% %8.2f %8s %8s %s" % (
            tag, r["step_s"] * 1e6, (r["step_s"] / t0 - 1) * 100, r["gbs"],
            r.get("readers", "-"), "%.0f" % r["ring_mib"] if "ring_mib" in r else "-",
            r.get("check", "-")))
        for ln in r.get("daemon_timing", []):
            print("%-12s daemon: %s" % ("", ln[-160:]))
        if isinstance(r.get("gpu"), dict):
            g = r["gpu"]
            print("%-12s GPU: step %.1f us mean, p50 %.1f, p99 %.1f; gaps %.1f us mean "
                  "(%.1f ms in all), %d over 20 us; CPU lead p50 %d steps" % (
                      "", g["step_us_mean"], g["step_us_p50"], g["step_us_p99"],
                      g["gap_us_mean"], g["gap_us_total"] / 1e3, g["gaps_over_20us"],
                      g["lead_p50"]))
            if g["big_gaps"]:
                print("%-12s gaps > 100 us (step, gap us, CPU wait for its batch us, lead "
                      "before): %s" % ("", " ".join("%d:%d/%d/%d" % x for x in g["big_gaps"])))
    if tight:
        print("tight loop (no compute), through Python:")
        for tag in ("pool=off", "pool=on"):
            r = tight.get(tag) or {}
            if not r:
                continue
            if "error" in r:
                print("  %-10s failed: %s" % (tag, r["error"]))
                continue
            extra = ""
            if tag == "pool=off" and cb and cb.get("gbs"):
                extra = "  = %.2f of make bench-cuda's %.2f GB/s (target >= 0.85: %s)" % (
                    r["gbs"] / cb["gbs"], cb["gbs"], "met" if r["gbs"] / cb["gbs"] >= 0.85
                    else "missed")
            if tag == "pool=on":
                extra = "  (target >= 200: %s)" % ("met" if r["gbs"] >= 200 else "missed")
            print("  %-10s %8.2f GB/s, per batch: %.1f us in pf_next, %.1f us more in "
                  "Python (target <= 10: %s)%s" % (tag, r["gbs"], r["pf_next_us"], r["py_us"],
                                                    "met" if r["py_us"] <= 10 else "missed",
                                                    extra))
    if cb:
        print("make bench-cuda: %s GB/s, ratio %s, hand-off p50 %s us, p99 %s us (consumer "
              "asleep between batches), p50 %s us, p99 %s us (consumer busy)" % (
                  cb.get("gbs", "?"), cb.get("ratio", "?"), cb.get("p50", "?"),
                  cb.get("p99", "?"), cb.get("busy_p50", "?"), cb.get("busy_p99", "?")))
    if sweep:
        best = max(sweep, key=lambda x: x[1])
        dflt = [x for x in sweep if x[0] == "default"]
        print("sweep (tight loop, pool off): " + ", ".join("%s %.1f" % (x[0], x[1])
                                                            for x in sweep))
        if dflt and best[0] == "default":
            print("default (readers %s, ring %.0f MiB) %.2f GB/s is the best of the sweep "
                  "(target >= 0.90: met)" % (dflt[0][2], dflt[0][3] or 0, dflt[0][1]))
        elif dflt:
            print("one pass: default %.2f GB/s = %.3f of the best, %s %.2f GB/s" % (
                dflt[0][1], dflt[0][1] / best[1], best[0], best[1]))
            cd, cbst = confirm.get("default", []), confirm.get(best[0], [])
            if cd and cbst:
                md = sorted(cd)[len(cd) // 2]
                mb = sorted(cbst)[len(cbst) // 2]
                ratio = md / mb
                print("default (readers %s, ring %.0f MiB) %.2f GB/s = %.3f of the best, %s "
                      "%.2f GB/s (medians of %d runs each, in turn: %s against %s; target >= "
                      "0.90: %s)" % (dflt[0][2], dflt[0][3] or 0, md, ratio, best[0], mb,
                                     len(cd), " ".join("%.1f" % x for x in cd),
                                     " ".join("%.1f" % x for x in cbst),
                                     "met" if ratio >= 0.90 else "missed"))
    for tag in ("pool=off", "pool=on"):
        r = loaders.get(tag) or {}
        if "step_s" in r:
            print("overhead %s: %.2f%%" % (tag, (r["step_s"] / t0 - 1) * 100))
        elif "compute" in skip:
            print("overhead %s: not measured (--skip compute)" % tag)
        else:
            print("overhead %s: failed" % tag)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
