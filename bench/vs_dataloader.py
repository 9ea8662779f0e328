#!/usr/bin/env python3
"""vs_dataloader.py — prefetchd through its Python binding against PyTorch's DataLoader.

One run on a GPU machine: the same .npy dataset (>= 2 GiB of 4 KiB rows, one '<u1' field of
shape (N, 4096), in the page cache) and the same kind of batches (1024 shuffled rows, 4 MiB)
go to cuda:0 through five loaders:

  (a) prefetchd via python/prefetch: a real build/prefetchd on a temporary socket (readers =
      online CPUs - 3, ring_bytes 512M, max_depth 32), Loader(device="cuda:0",
      batch_size=1024, shuffle=True, max_depth=32).  Untimed warm-up (arena import, the
      daemon's probe), then whole shuffled epochs, each timed from loader.epoch(n) to its end.
  (b) torch DataLoader over a batch-fetch Dataset: BatchSampler(RandomSampler) as the
      sampler, batch_size=None, __getitem__(list of indices) fancy-indexes a memmap
      (np.load(mmap_mode='r')); 8 workers, pin_memory=True, prefetch_factor=4, then
      .to(device, non_blocking=True).
  (c) the same with 16 workers.
  (d) per-sample Dataset (one row per __getitem__) + default collate, batch_size=1024,
      8 workers, pin_memory=True, prefetch_factor=4.
  (e) the raw ceiling: 4 MiB copies from a pinned torch tensor (512 MiB, cycled) into 4
      device buffers, whole passes over the same number of bytes.

Every loader's consumer does the same per batch: x[:, 0].sum() added to a device scalar, one
torch.cuda.synchronize() at the end of the timed window.  (a) is checked, not trusted: every
timed epoch's sum must equal the file's column-0 sum and its picks must be a permutation of
the rows; a few rows of the warm-up batches and of every 128th timed batch are compared with
the file.

For each loader:
  GB/s       sample bytes (10^9) delivered on the device over the timed window.
  CPU-s/GB   utime+stime from /proc/<pid>/stat, summed over the process tree (this process,
             its live descendants, their reaped children via cutime/cstime; for (a) the
             daemon, which is a child), after minus before the timed window (for (a): each
             timed epoch, so that the checks between epochs are left out).
  cores      CPU-s over the timed seconds: how many CPUs the loader kept busy.
  peak RSS   the largest sum of VmRSS over the same tree, sampled every 50 ms by a separate
             sampler process (left out of every sum; a thread would take the GIL from the
             consumer), over the loader's whole life (startup, warm-up, timed part,
             shutdown).  Shared pages count once per process that maps them (page-cache
             pages of the memmap, fork-shared pages); RssAnon/RssFile/RssShmem and PSS
             (smaps_rollup, every 0.5 s) are printed too where the kernel has them.

Budget: (a) and (e) run whole epochs/passes until --min-seconds of timed work (at least 3,
at most 30 epochs / 50 passes); (b)(c)(d) take 2 x workers x prefetch_factor warm-up
batches, then --batches timed ones; each loop is cut at --loader-seconds.  Everything
together stays well under 4 minutes on the H200.  A watchdog (--watchdog, 330 s) fails the
loader in progress, skips the rest and still prints the report and stops the daemon.

  python3 bench/vs_dataloader.py [--gib 2] [--data DIR] [--batches 512] [--skip b,d]
                                 [--prefetchd-bin PATH] [--socket PATH] [--json OUT]

Progress goes to stderr, the report to stdout.  Exit status: 0 all loaders ran and (a)'s
checks passed (whether or not a target is met), 1 a loader failed or a check failed, 2 usage.
A loader that fails prints its error and the others still run.  `--device cpu` is a smoke test
of the code paths on a machine without a GPU (no pinned memory; figures meaningless).
"""

import argparse
import gc
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROW_BYTES = 4096
BATCH_ROWS = 1024
BATCH_BYTES = ROW_BYTES * BATCH_ROWS
GB = 1e9
GIB = float(1 << 30)
DATA_SEED = 0x5EED
SHUFFLE_SEED = 1
# Daemon settings, as bench/cuda_throughput.c uses them.
RING = "512M"
PIN_BYTES = 512 << 20
MAX_DEPTH = 32
PREFETCH_FACTOR = 4
# (a): a few rows of every CHECK_EVERY-th timed batch are compared with the file.
CHECK_EVERY = 128
LOADERS = ("e", "a", "b", "c", "d")  # run order: the ceiling first, on a quiet GPU
TITLES = {
    "a": "(a) prefetchd, Python binding",
    "b": "(b) DataLoader batch-fetch, 8 workers",
    "c": "(c) DataLoader batch-fetch, 16 workers",
    "d": "(d) DataLoader per-sample, 8 workers",
    "e": "(e) raw pinned copy (ceiling)",
}


class WatchdogExpired(BaseException):
    """Raised by SIGALRM in the main thread (BaseException: no loader's `except Exception`
    may swallow it)."""


def log(msg):
    print("vs_dataloader: " + msg, file=sys.stderr, flush=True)


# ---- /proc accounting -------------------------------------------------------------------

try:
    CLK_TCK = os.sysconf("SC_CLK_TCK")
except (ValueError, OSError):
    CLK_TCK = 100


def read_text(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode("ascii", "replace")
    except OSError:
        return None


def proc_stat(pid):
    """(ppid, utime+stime, cutime+cstime) in ticks, or None when the process is gone.  The
    command name may hold spaces and parentheses: fields are counted after the last ')'."""
    text = read_text("/proc/%d/stat" % pid)
    if not text:
        return None
    try:
        rest = text[text.rindex(")") + 2:].split()
        # rest[0] is field 3 (state): ppid is field 4, utime..cstime fields 14..17.
        return int(rest[1]), int(rest[11]) + int(rest[12]), int(rest[13]) + int(rest[14])
    except (ValueError, IndexError):
        return None


def process_tree(root, exclude=()):
    """{pid: (ppid, ticks, child_ticks)} for root and its descendants, less `exclude` and
    everything below it.  One pass over /proc: in a container that is a few dozen entries."""
    stats = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    for name in names:
        if name.isdigit():
            st = proc_stat(int(name))
            if st:
                stats[int(name)] = st
    children = {}
    for pid, st in stats.items():
        children.setdefault(st[0], []).append(pid)
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in tree or pid in exclude or pid not in stats:
            continue
        tree[pid] = stats[pid]
        todo.extend(children.get(pid, ()))
    return tree


def tree_cpu_seconds(root, exclude=()):
    """CPU seconds of the tree: live processes' own time plus what their reaped children left
    in cutime/cstime (a DataLoader worker that exits inside a window moves its time from the
    one to the other, so the sum stays continuous).  Returns (seconds, number of processes)."""
    tree = process_tree(root, exclude)
    ticks = sum(st[1] + st[2] for st in tree.values())
    return ticks / float(CLK_TCK), len(tree)


STATUS_KEYS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")


def read_status_kb(pid):
    text = read_text("/proc/%d/status" % pid)
    out = {}
    if not text:
        return out
    for line in text.splitlines():
        key, _, val = line.partition(":")
        if key in STATUS_KEYS:
            try:
                out[key] = int(val.split()[0])
            except (ValueError, IndexError):
                pass
    return out


def read_pss_kb(pid):
    text = read_text("/proc/%d/smaps_rollup" % pid)
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith("Pss:"):
            try:
                return int(line.split()[1])
            except (ValueError, IndexError):
                return None
    return None


def sampler_main(root, interval, pss_every):
    """The RSS sampler, a child process of the bench.  Commands on stdin, one a line:
    'start' resets the peaks and starts sampling, 'stop' takes a last sample and answers one
    JSON line with the window's peaks.  EOF ends it (so does the bench's death: its pipe
    closes)."""
    me = os.getpid()
    active, peaks, nsample = False, {}, 0
    pss_ok = pss_every > 0
    buf = b""
    next_t = time.monotonic()

    def sample():
        nonlocal nsample, pss_ok
        tree = process_tree(root, exclude=(me,))
        sums = dict.fromkeys(STATUS_KEYS, 0)
        seen = dict.fromkeys(STATUS_KEYS, False)
        for pid in tree:
            kb = read_status_kb(pid)
            for k, v in kb.items():
                sums[k] += v
                seen[k] = True
        for k in STATUS_KEYS:
            if seen[k]:
                peaks[k] = max(peaks.get(k, 0), sums[k])
        peaks["nprocs"] = max(peaks.get("nprocs", 0), len(tree))
        if "root_rss_start" not in peaks:
            peaks["root_rss_start"] = read_status_kb(root).get("VmRSS")
        if pss_ok and nsample % pss_every == 0:
            total = 0
            for pid in tree:
                v = read_pss_kb(pid)
                if v is None and pid == root:
                    pss_ok = False  # no smaps_rollup here (older kernel, gVisor)
                    break
                total += v or 0
            if pss_ok:
                peaks["Pss"] = max(peaks.get("Pss", 0), total)
        nsample += 1

    while True:
        timeout = max(0.0, next_t - time.monotonic()) if active else None
        ready, _, _ = select.select([0], [], [], timeout)
        if ready:
            chunk = os.read(0, 4096)
            if not chunk:
                return 0
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                cmd = line.strip().decode()
                if cmd == "start":
                    peaks, nsample, active = {}, 0, True
                    sample()
                    next_t = time.monotonic() + interval
                elif cmd == "stop":
                    if active:
                        sample()
                    peaks["samples"] = nsample
                    sys.stdout.write(json.dumps(peaks) + "\n")
                    sys.stdout.flush()
                    active = False
            continue
        if active:
            sample()
            next_t += interval
            if next_t < time.monotonic():
                next_t = time.monotonic() + interval


class TreeSampler:
    """The bench's side of sampler_main.  Every failure degrades to 'no memory figures'."""

    def __init__(self, interval=0.05, pss_every=10):
        self.proc = None
        try:
            self.proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--_sampler", str(os.getpid()),
                 "--_interval", str(interval), "--_pss-every", str(pss_every)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        except OSError as e:
            log("RSS sampler did not start (%s): no memory figures" % e)

    @property
    def pid(self):
        return self.proc.pid if self.proc else -1

    def start(self):
        if not self.proc:
            return
        try:
            self.proc.stdin.write(b"start\n")
            self.proc.stdin.flush()
        except OSError as e:
            log("RSS sampler: %s" % e)
            self.proc = None

    def stop(self):
        if not self.proc:
            return {}
        try:
            self.proc.stdin.write(b"stop\n")
            self.proc.stdin.flush()
            ready, _, _ = select.select([self.proc.stdout], [], [], 10.0)
            if not ready:
                log("RSS sampler did not answer within 10 s")
                return {}
            return json.loads(self.proc.stdout.readline().decode() or "{}")
        except (OSError, ValueError) as e:
            log("RSS sampler: %s" % e)
            return {}

    def close(self):
        if not self.proc:
            return
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.proc = None


class CpuWindow:
    """utime+stime of the whole tree between begin() and end()."""

    def __init__(self, exclude):
        self.exclude = exclude
        self.root = os.getpid()
        self.t0 = self.c0 = None
        self.seconds = self.cpu_s = None
        self.nprocs = 0

    def begin(self):
        self.c0, _ = tree_cpu_seconds(self.root, self.exclude)
        self.t0 = time.perf_counter()

    def end(self):
        self.seconds = time.perf_counter() - self.t0
        c1, self.nprocs = tree_cpu_seconds(self.root, self.exclude)
        self.cpu_s = c1 - self.c0


# ---- the dataset --------------------------------------------------------------------------


def npy_data_offset(path):
    import numpy as np
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        return f.tell(), tuple(shape), fortran, dtype


def write_dataset(path, rows):
    """build/npygen when it is there (what cuda_throughput writes), else numpy."""
    import numpy as np
    npygen = os.path.join(REPO, "build", "npygen")
    tmp = path + ".part"
    if os.access(npygen, os.X_OK):
        subprocess.run([npygen, tmp, "--rows", str(rows), "--shape", str(ROW_BYTES),
                        "--dtype", "u1", "--seed", str(DATA_SEED)], check=True,
                       stdout=sys.stderr)
    else:
        log("no build/npygen: writing with numpy")
        arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8,
                                        shape=(rows, ROW_BYTES))
        rng = np.random.default_rng(DATA_SEED)
        step = 16384
        for r in range(0, rows, step):
            n = min(step, rows - r)
            arr[r:r + n] = rng.integers(0, 256, size=(n, ROW_BYTES), dtype=np.uint8)
        arr.flush()
        del arr
    os.replace(tmp, path)


def mincore_fraction(path):
    """The fraction of the file's pages in memory, from mincore(2) over a fresh mapping (which
    touches no page).  None where that cannot be asked."""
    import ctypes
    import mmap
    import numpy as np
    try:
        size = os.path.getsize(path)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        page = mmap.PAGESIZE
        m = np.memmap(path, dtype=np.uint8, mode="r", shape=(size,))
        vec = np.zeros((size + page - 1) // page, dtype=np.uint8)
        rc = libc.mincore(ctypes.c_void_p(m.ctypes.data), ctypes.c_size_t(size),
                          ctypes.c_void_p(vec.ctypes.data))
        del m
        if rc != 0:
            return None
        return float(np.count_nonzero(vec & 1)) / len(vec)
    except Exception:  # noqa: BLE001 - a diagnostic, never fatal
        return None


def prepare_dataset(args, tmpdir):
    """Writes or reuses the file, reads it once (page cache), returns a dict describing it
    with the column-0 sum that (a)'s epochs are checked against."""
    import numpy as np
    rows = int(args.gib * GIB) // BATCH_BYTES * BATCH_ROWS
    if rows < BATCH_ROWS * 8:
        raise SystemExit("vs_dataloader: --gib %.3f is too small" % args.gib)
    ddir = args.data or tmpdir
    os.makedirs(ddir, exist_ok=True)
    path = os.path.join(ddir, "rows-%d.npy" % rows)
    reuse = False
    if os.path.exists(path):
        try:
            off, shape, fortran, dtype = npy_data_offset(path)
            reuse = (shape == (rows, ROW_BYTES) and not fortran and dtype == np.uint8 and
                     os.path.getsize(path) == off + rows * ROW_BYTES)
        except Exception as e:  # noqa: BLE001
            log("%s: not reusable (%s)" % (path, e))
    t0 = time.perf_counter()
    if reuse:
        log("reusing %s" % path)
    else:
        log("writing %d rows x %d B (%.2f GiB) to %s" % (rows, ROW_BYTES,
                                                         rows * ROW_BYTES / GIB, path))
        write_dataset(path, rows)
    t_write = time.perf_counter() - t0
    off, shape, _, _ = npy_data_offset(path)

    # Read the whole file once, the column-0 sum on the way.  Plain reads, not the memmap:
    # this process's RSS must not grow by the file.
    log("reading the dataset once into the page cache")
    t0 = time.perf_counter()
    chunk_rows = 16384
    buf = np.empty(chunk_rows * ROW_BYTES, dtype=np.uint8)
    colsum = 0
    with open(path, "rb", buffering=0) as f:
        f.seek(off)
        done = 0
        while done < rows:
            n = min(chunk_rows, rows - done)
            view = memoryview(buf)[:n * ROW_BYTES]
            got = 0
            while got < len(view):
                k = f.readinto(view[got:])
                if not k:
                    raise SystemExit("vs_dataloader: %s: short read" % path)
                got += k
            colsum += int(buf[:n * ROW_BYTES].reshape(n, ROW_BYTES)[:, 0].sum(dtype=np.uint64))
            done += n
    t_read = time.perf_counter() - t0
    resident = mincore_fraction(path)
    return {"path": path, "rows": rows, "bytes": rows * ROW_BYTES, "offset": off,
            "colsum": colsum, "reused": reuse, "write_s": t_write, "read_s": t_read,
            "resident": resident, "mm": np.load(path, mmap_mode="r")}


# ---- Datasets for torch's DataLoader (top level, so spawn/forkserver workers can import
# them; no torch import at module level, so the sampler process stays light) ---------------


class BatchRows:
    """Map-style dataset whose __getitem__ takes a list of row indices (from a BatchSampler)
    and returns those rows as one (len, 4096) uint8 tensor: fancy indexing on a memmap opened
    lazily in each worker (a pickled np.memmap would carry its data)."""

    def __init__(self, path, rows):
        self.path, self.rows, self.arr = path, rows, None

    def __len__(self):
        return self.rows

    def __getstate__(self):
        d = dict(self.__dict__)
        d["arr"] = None
        return d

    def __getitem__(self, idx):
        import numpy as np
        import torch
        if self.arr is None:
            self.arr = np.load(self.path, mmap_mode="r")
        return torch.from_numpy(self.arr[np.asarray(idx, dtype=np.int64)])


class SampleRows(BatchRows):
    """One row per __getitem__, as a (4096,) uint8 tensor; default_collate stacks them."""

    def __getitem__(self, i):
        import numpy as np
        import torch
        if self.arr is None:
            self.arr = np.load(self.path, mmap_mode="r")
        return torch.from_numpy(np.array(self.arr[i]))


# ---- the loaders ----------------------------------------------------------------------------


class Ctx:
    pass


def sync(ctx):
    if ctx.cuda:
        ctx.torch.cuda.synchronize()


def free_host_caches(ctx):
    gc.collect()
    if ctx.cuda:
        ctx.torch.cuda.empty_cache()
        # Pinned blocks stay in torch's host caching allocator after their tensors die; they
        # would count in the next loader's RSS.
        empty = getattr(ctx.torch._C, "_host_emptyCache", None)
        if empty:
            try:
                empty()
            except Exception:  # noqa: BLE001
                pass


def run_raw(ctx):
    """(e): 4 MiB copies from a pinned buffer (512 MiB or the dataset, cycled) into 4 device
    buffers, one stream, with the same per-batch consumer; whole passes over the dataset's
    bytes, the first untimed."""
    torch, ds = ctx.torch, ctx.ds
    nbatches = ds["rows"] // BATCH_ROWS
    nbuf = max(1, min(nbatches, PIN_BYTES // BATCH_BYTES))
    src = torch.empty((nbuf, BATCH_ROWS, ROW_BYTES), dtype=torch.uint8, pin_memory=ctx.cuda)
    flat = src.numpy().reshape(-1)
    with open(ds["path"], "rb", buffering=0) as f:
        f.seek(ds["offset"])
        view, got = memoryview(flat), 0
        while got < len(view):
            k = f.readinto(view[got:])
            if not k:
                raise RuntimeError("short read of the dataset")
            got += k
    slots = torch.empty((4, BATCH_ROWS, ROW_BYTES), dtype=torch.uint8, device=ctx.device)
    acc = torch.zeros((), dtype=torch.int64, device=ctx.device)

    def one_pass():
        for i in range(nbatches):
            d = slots[i & 3]
            d.copy_(src[i % nbuf], non_blocking=True)
            acc.add_(d[:, 0].sum())

    one_pass()
    sync(ctx)
    cw = CpuWindow(ctx.exclude)
    cw.begin()
    passes = []
    while True:
        t0 = time.perf_counter()
        one_pass()
        sync(ctx)
        passes.append(time.perf_counter() - t0)
        el = time.perf_counter() - cw.t0
        if len(passes) >= 50 or (len(passes) >= 3 and el >= ctx.args.min_seconds):
            break
    cw.end()
    nbytes = len(passes) * nbatches * BATCH_BYTES
    per = ["%.1f" % (nbatches * BATCH_BYTES / GB / p) for p in passes]
    return {"bytes": nbytes, "seconds": sum(passes), "batches": len(passes) * nbatches,
            "cpu_s": cw.cpu_s, "window_s": cw.seconds,
            "notes": ["%d passes of %.2f GiB from a %d MiB %s buffer; GB/s per pass: %s" %
                      (len(passes), nbatches * BATCH_BYTES / GIB, nbuf * BATCH_BYTES >> 20,
                       "pinned" if ctx.cuda else "pageable", " ".join(per))]}


def setpriv_prefix():
    """`setpriv --pdeathsig TERM --`: the daemon dies with this process even if it is killed
    before its cleanup runs.  Empty where setpriv lacks the option."""
    sp = shutil.which("setpriv")
    if not sp:
        return []
    try:
        out = subprocess.run([sp, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             timeout=5).stdout.decode("ascii", "replace")
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [sp, "--pdeathsig", "TERM", "--"] if "--pdeathsig" in out else []


def wait_listening(proc, sock, log_tail, seconds=30):
    """Returns once the daemon proc accepts on sock; RuntimeError (with log_tail()) if it
    exits first or does not listen within `seconds`.  bench/train_step.py uses it too."""
    deadline = time.monotonic() + seconds
    while True:
        if proc.poll() is not None:
            raise RuntimeError("prefetchd exited at start (status %s)%s"
                               % (proc.returncode, log_tail()))
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(sock)
            return
        except OSError:
            pass
        finally:
            s.close()
        if time.monotonic() > deadline:
            raise RuntimeError("prefetchd did not listen on %s within %d s%s"
                               % (sock, seconds, log_tail()))
        time.sleep(0.05)


class Daemon:
    def __init__(self, ctx):
        self.ctx = ctx
        self.proc = None
        self.log_path = os.path.join(ctx.tmpdir, "prefetchd.log")
        self.sock = ctx.args.socket or os.path.join(ctx.tmpdir, "prefetchd.sock")
        self.conf = os.path.join(ctx.tmpdir, "prefetchd.conf")

    def start(self):
        ctx = self.ctx
        binary = ctx.args.prefetchd_bin
        if not os.access(binary, os.X_OK):
            raise RuntimeError("%s is not an executable (build it: make)" % binary)
        if os.path.exists(self.sock):
            raise RuntimeError("%s exists: another daemon? (give --socket)" % self.sock)
        with open(self.conf, "w") as f:
            f.write("# written by bench/vs_dataloader.py\n[daemon]\nsocket = %s\n"
                    "readers = %d\nring_bytes = %s\ndepth = 4\nmax_depth = %d\n\n"
                    "[dataset.bench]\nformat = npy\nfield.x = %s\n"
                    % (self.sock, ctx.readers, RING, MAX_DEPTH, ctx.ds["path"]))
        logf = open(self.log_path, "ab")
        try:
            # stdout/stderr to a file, stdin closed: an orphaned daemon must never hold the
            # pipes of whoever ran the bench.
            self.proc = subprocess.Popen(setpriv_prefix() + [binary, "-c", self.conf],
                                         stdin=subprocess.DEVNULL, stdout=logf,
                                         stderr=subprocess.STDOUT, close_fds=True)
        finally:
            logf.close()
        ctx.daemon = self
        wait_listening(self.proc, self.sock, self.log_tail)

    def status_session(self, name):
        """Our session in `prefetchctl status --json`, or None."""
        ctl = os.path.join(REPO, "build", "prefetchctl")
        if not os.access(ctl, os.X_OK):
            return None
        try:
            out = subprocess.run([ctl, "-s", self.sock, "status", "--json"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 timeout=5).stdout
            for s in json.loads(out.decode()).get("sessions", []):
                if s.get("name") == name:
                    return s
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass
        return None

    def log_tail(self, nbytes=3000):
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - nbytes))
                return "\n---- tail of %s ----\n%s----" % (self.log_path,
                                                          f.read().decode("utf-8", "replace"))
        except OSError:
            return ""

    def stop(self):
        if not self.proc:
            return None
        p, self.proc = self.proc, None
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log("prefetchd ignored SIGTERM for 10 s: SIGKILL")
                p.kill()
                p.wait()
        if self.ctx.daemon is self:
            self.ctx.daemon = None
        return p.returncode


def as_torch(ctx, x):
    """A host session's numpy view as a tensor (--device cpu smoke test only)."""
    if isinstance(x, ctx.torch.Tensor):
        return x
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # read-only slot memory: we never write it
        return ctx.torch.from_numpy(x)


def check_rows(ctx, picks, got, which, what):
    """got: rows `which` of a batch (host numpy); picks: the batch's picks."""
    import numpy as np
    ds = ctx.ds
    want = ds["mm"][np.asarray(picks, dtype=np.int64)[which] % ds["rows"]]
    if not np.array_equal(got, want):
        raise RuntimeError("%s: rows %s of the batch differ from the file (picks %s)"
                           % (what, list(which), list(np.asarray(picks)[which])))


def run_prefetchd(ctx):
    """(a): the Python binding against a real daemon."""
    import numpy as np
    torch, ds, args = ctx.torch, ctx.ds, ctx.args
    pydir = os.path.join(REPO, "python")
    if pydir not in sys.path:
        sys.path.insert(0, pydir)
    lib = os.path.join(REPO, "build", "libprefetch.so")
    if "PREFETCH_LIB" not in os.environ and os.path.exists(lib):
        os.environ["PREFETCH_LIB"] = lib
    import prefetch  # noqa: E402 (after the path is set)

    daemon = Daemon(ctx)
    notes = []
    name = "vs_dataloader"
    log("(a) starting %s: readers %d, ring %s, max_depth %d"
        % (args.prefetchd_bin, ctx.readers, RING, MAX_DEPTH))
    daemon.start()
    loader = None
    try:
        loader = prefetch.Loader("bench", batch_size=BATCH_ROWS, device=ctx.loader_device,
                                 shuffle=True, seed=SHUFFLE_SEED, socket=daemon.sock,
                                 max_depth=MAX_DEPTH, name=name)
        if loader.num_samples != ds["rows"]:
            raise RuntimeError("daemon serves %d samples, the file has %d"
                               % (loader.num_samples, ds["rows"]))
        fields = [(f[0], str(f[1]), tuple(f[2])) for f in loader.fields]
        if len(fields) != 1 or fields[0][0] != "x" or fields[0][2] != (ROW_BYTES,):
            raise RuntimeError("unexpected fields %r" % (fields,))
        epoch_no = [0]

        def partial_epoch(limit, what):
            """Untimed: `limit` batches of a fresh epoch, rows 0, 1 and last of each checked
            against the file, then the epoch left early (abandon)."""
            it = loader.epoch(epoch_no[0])
            epoch_no[0] += 1
            n = 0
            try:
                for batch in it:
                    x = batch["x"]
                    if n == 0:
                        want_dt = torch.uint8 if isinstance(x, torch.Tensor) else np.uint8
                        if tuple(x.shape) != (BATCH_ROWS, ROW_BYTES) or x.dtype != want_dt:
                            raise RuntimeError("batch x is %s %s, expected (%d, %d) uint8"
                                               % (tuple(x.shape), x.dtype, BATCH_ROWS,
                                                  ROW_BYTES))
                        if ctx.cuda and not (isinstance(x, torch.Tensor) and x.is_cuda):
                            raise RuntimeError("batch x is not a CUDA tensor: %r" % type(x))
                    which = [0, 1, x.shape[0] - 1]
                    got = x[which]
                    got = got.cpu().numpy() if isinstance(got, torch.Tensor) else np.array(got)
                    check_rows(ctx, np.array(batch.picks), got, which, what)
                    n += 1
                    if n >= limit:
                        break
            finally:
                close = getattr(it, "close", None)
                if close:
                    close()
            return n

        n = partial_epoch(8, "warm-up")
        # The client sends the honest-depth probe (CUDA sessions only) after its 2nd batch;
        # the C bench waits up to 3 s for the daemon to show it.
        deadline = time.monotonic() + (3.0 if ctx.cuda else 0.0)
        sess = None
        while time.monotonic() < deadline:
            sess = daemon.status_session(name)
            if sess is not None and sess.get("probe_total", 0) > 0:
                break
            time.sleep(0.05)
        if sess is not None and ctx.cuda:
            notes.append("warm-up: %s; target %s (%s)"
                         % ("probe seen" if sess.get("probe_total", 0) > 0
                            else "NO probe within 3 s", sess.get("target"),
                            sess.get("target_reason")))
        n += partial_epoch(2 * (MAX_DEPTH + 2) + 16, "warm-up")
        notes.append("warm-up: %d batches checked (rows 0, 1, last against the file)" % n)
        sync(ctx)

        expect_batches = ds["rows"] // BATCH_ROWS
        st0 = loader.stats()
        t_window = time.perf_counter()
        epochs, cpu_s, nprocs, total_bytes, total_batches, checked = [], 0.0, 0, 0, 0, 0
        while True:
            acc = torch.zeros((), dtype=torch.int64, device=ctx.device)
            picks, spots = [], []
            # CPU is counted over each epoch alone: the checks between epochs are the
            # bench's, not the loader's (and the daemon's threads run on meanwhile).
            cw = CpuWindow(ctx.exclude)
            cw.begin()
            nb = 0
            for batch in loader.epoch(epoch_no[0]):
                x = as_torch(ctx, batch["x"])
                acc.add_(x[:, 0].sum())
                picks.append(np.array(batch.picks, dtype=np.uint64))
                if nb % CHECK_EVERY == 0:
                    # Rows 0 and last (a strided view: no index tensor to upload), copied on
                    # the current stream before the slot's release event is recorded there.
                    spots.append((nb, x[0::max(1, x.shape[0] - 1)].clone()))
                nb += 1
            sync(ctx)
            cw.end()
            epoch_no[0] += 1
            nrows = sum(len(p) for p in picks)
            epochs.append(cw.seconds)
            cpu_s += cw.cpu_s
            nprocs = max(nprocs, cw.nprocs)
            total_bytes += nrows * ROW_BYTES
            total_batches += nb
            # Checks, outside the epoch's time and CPU.
            if nb != expect_batches or nrows != ds["rows"]:
                raise RuntimeError("epoch %d: %d batches / %d rows, expected %d / %d"
                                   % (epoch_no[0] - 1, nb, nrows, expect_batches, ds["rows"]))
            seen = np.zeros(ds["rows"], dtype=np.uint8)
            allp = np.concatenate(picks).astype(np.int64)
            if allp.min() < 0 or allp.max() >= ds["rows"]:
                raise RuntimeError("epoch %d: a pick outside 0..%d" % (epoch_no[0] - 1,
                                                                       ds["rows"] - 1))
            seen[allp] = 1
            if int(seen.sum()) != ds["rows"]:
                raise RuntimeError("epoch %d: picks are not a permutation of the rows"
                                   % (epoch_no[0] - 1))
            got = int(acc.item())
            if got != ds["colsum"]:
                raise RuntimeError("epoch %d: column-0 sum %d on the device, %d in the file"
                                   % (epoch_no[0] - 1, got, ds["colsum"]))
            for bno, rows_t in spots:
                check_rows(ctx, picks[bno], rows_t.cpu().numpy(), [0, BATCH_ROWS - 1],
                           "timed batch %d" % bno)
                checked += 1
            el = time.perf_counter() - t_window
            if len(epochs) >= 30 or (len(epochs) >= 3 and sum(epochs) >= args.min_seconds):
                break
            if el >= args.loader_seconds:
                notes.append("cut at --loader-seconds after %d epochs" % len(epochs))
                break
        st1 = loader.stats()
        wait = st1.get("wait_s", 0) - st0.get("wait_s", 0)
        busy = st1.get("busy_s", 0) - st0.get("busy_s", 0)
        notes.append("%d timed epochs of %d batches; GB/s per epoch: %s"
                     % (len(epochs), expect_batches,
                        " ".join("%.1f" % (ds["bytes"] / GB / e) for e in epochs)))
        notes.append("checked: every epoch's column-0 sum and picks (each row once), rows "
                     "0 and last of %d timed batches against the file" % checked)
        notes.append("loader.stats over the timed epochs: wait %.3f s, busy %.3f s, stall "
                     "fraction %.3f" % (wait, busy, wait / (wait + busy) if wait + busy else 0))
        sess = daemon.status_session(name)
        if sess is not None:
            notes.append("daemon's view: target %s (%s), copy %.2f GB/s, errors %s"
                         % (sess.get("target"), sess.get("target_reason"),
                            float(sess.get("copy_gbps") or 0), sess.get("errors")))
        return {"bytes": total_bytes, "seconds": sum(epochs), "batches": total_batches,
                "cpu_s": cpu_s, "nprocs": nprocs, "notes": notes}
    finally:
        if loader is not None:
            try:
                loader.close()
            except Exception as e:  # noqa: BLE001
                log("(a) loader.close: %s" % e)
        rc = daemon.stop()
        if rc not in (0, None):
            log("(a) prefetchd exit status %s%s" % (rc, daemon.log_tail()))


def run_dataloader(ctx, key, workers, per_sample):
    """(b), (c), (d): torch's DataLoader, then .to(device, non_blocking=True)."""
    torch, ds, args = ctx.torch, ctx.ds, ctx.args
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    warm = max(1, args.warmup if args.warmup >= 0 else 2 * workers * PREFETCH_FACTOR)
    total = warm + args.batches
    gen = torch.Generator()
    gen.manual_seed(SHUFFLE_SEED)
    kw = dict(num_workers=workers, pin_memory=ctx.cuda, prefetch_factor=PREFETCH_FACTOR,
              timeout=60)
    if args.mp_context:
        kw["multiprocessing_context"] = args.mp_context
    if per_sample:
        dset = SampleRows(ds["path"], ds["rows"])
        # More samples than rows: RandomSampler chains permutations (no replacement within
        # one), so warm-up + timed batches never end an epoch (and restart the workers).
        sampler = RandomSampler(dset, num_samples=total * BATCH_ROWS, generator=gen)
        dl = DataLoader(dset, batch_size=BATCH_ROWS, sampler=sampler, drop_last=False, **kw)
    else:
        dset = BatchRows(ds["path"], ds["rows"])
        sampler = BatchSampler(RandomSampler(dset, num_samples=total * BATCH_ROWS,
                                             generator=gen), BATCH_ROWS, drop_last=False)
        dl = DataLoader(dset, batch_size=None, sampler=sampler, **kw)

    acc = torch.zeros((), dtype=torch.int64, device=ctx.device)
    notes = []
    t_start = time.perf_counter()
    it = iter(dl)
    try:
        first = None
        for i in range(warm):
            b = next(it)
            if first is None:
                first = time.perf_counter() - t_start
                if tuple(b.shape) != (BATCH_ROWS, ROW_BYTES) or b.dtype != torch.uint8:
                    raise RuntimeError("batch is %s %s" % (tuple(b.shape), b.dtype))
                if ctx.cuda and not b.is_pinned():
                    raise RuntimeError("pin_memory=True gave an unpinned batch")
            x = b.to(ctx.device, non_blocking=True)
            acc.add_(x[:, 0].sum())
            if time.perf_counter() - t_start > args.loader_seconds:
                raise RuntimeError("warm-up (%d of %d batches) took over --loader-seconds"
                                   % (i + 1, warm))
        sync(ctx)
        notes.append("%d workers, prefetch_factor %d, warm-up %d batches; first batch "
                     "%.2f s after iter()" % (workers, PREFETCH_FACTOR, warm, first or 0))
        cw = CpuWindow(ctx.exclude)
        cw.begin()
        nbytes = nb = 0
        for nb in range(1, args.batches + 1):
            b = next(it)
            x = b.to(ctx.device, non_blocking=True)
            acc.add_(x[:, 0].sum())
            nbytes += x.shape[0] * x.shape[1] * x.element_size()
            if time.perf_counter() - cw.t0 > args.loader_seconds:
                notes.append("cut at --loader-seconds after %d batches" % nb)
                break
        sync(ctx)
        cw.end()
        return {"bytes": nbytes, "seconds": cw.seconds, "batches": nb, "cpu_s": cw.cpu_s,
                "window_s": cw.seconds, "nprocs": cw.nprocs, "notes": notes}
    finally:
        t0 = time.perf_counter()
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown:
            shutdown()
        del it, dl
        gc.collect()
        log("(%s) workers shut down in %.2f s" % (key, time.perf_counter() - t0))


# ---- report -------------------------------------------------------------------------------


def fmt(v, spec, missing="-"):
    return missing if v is None else format(v, spec)


def machine_lines(ctx):
    import numpy as np
    torch = ctx.torch
    lines = []
    model = "?"
    text = read_text("/proc/cpuinfo") or ""
    for line in text.splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    lines.append("machine: %d online CPUs (%d usable), %s; kernel %s" %
                 (os.cpu_count() or 0, len(os.sched_getaffinity(0)), model,
                  os.uname().release))
    gpu = "none"
    if ctx.cuda:
        p = torch.cuda.get_device_properties(0)
        gpu = "%s, %.1f GiB, cc %d.%d" % (p.name, p.total_memory / GIB, p.major, p.minor)
    lines.append("python %s, torch %s (CUDA %s), numpy %s; device %s: %s" %
                 (sys.version.split()[0], torch.__version__, torch.version.cuda,
                  np.__version__, ctx.device, gpu))
    try:
        st = os.statvfs("/dev/shm")
        shm = "%.1f GiB free" % (st.f_bavail * st.f_frsize / GIB)
    except OSError:
        shm = "absent"
    import multiprocessing
    import torch.multiprocessing as tmp
    method = ctx.args.mp_context or multiprocessing.get_start_method(allow_none=True)
    if not method:
        method = multiprocessing.get_all_start_methods()[0] + " (the default)"
    lines.append("/dev/shm: %s; DataLoader start method: %s; torch sharing strategy: %s" %
                 (shm, method, tmp.get_sharing_strategy()))
    return lines


def report(ctx, results, order):
    ds = ctx.ds
    out = []
    out.extend(machine_lines(ctx))
    out.append("dataset: %s, %d rows x %d B = %.2f GiB, one '<u1' field (N, %d); %s in "
               "%.2f s; read once in %.2f s (%.2f GB/s); mincore: %s resident"
               % (ds["path"], ds["rows"], ROW_BYTES, ds["bytes"] / GIB, ROW_BYTES,
                  "reused" if ds["reused"] else "written", ds["write_s"], ds["read_s"],
                  ds["bytes"] / GB / ds["read_s"] if ds["read_s"] else 0,
                  "%.1f%%" % (ds["resident"] * 100) if ds["resident"] is not None else "n/a"))
    out.append("batches: %d rows (%d MiB), shuffled; consumer: x[:, 0].sum() added on the "
               "device every batch, one synchronize at the end" % (BATCH_ROWS,
                                                                  BATCH_BYTES >> 20))
    out.append("prefetchd: readers %d (online CPUs - 3), ring_bytes %s, max_depth %d, ipc "
               "default" % (ctx.readers, RING, MAX_DEPTH))
    out.append("")
    out.append("%-40s %8s %9s %10s %8s %8s %6s" % ("", "GB/s", "CPU-s/GB", "peak RSS",
                                                    "batches", "seconds", "cores"))
    for key in order:
        r = results.get(key)
        if r is None:
            out.append("%-40s %s" % (TITLES[key], "skipped"))
            continue
        if "error" in r:
            first = (r["error"].splitlines() or [""])[0]
            out.append("%-40s FAILED: %s" % (TITLES[key], first[:160]))
            continue
        mem = r.get("mem", {})
        rss = mem.get("VmRSS")
        out.append("%-40s %8.2f %9s %10s %8d %8.3f %6s" % (
            TITLES[key], r["gbs"], fmt(r["cpu_gb"], ".3f"),
            "%.2f GiB" % (rss / 1048576.0) if rss else "n/a", r["batches"], r["seconds"],
            fmt(r["cpu_s"] / r["seconds"] if r.get("cpu_s") is not None and r["seconds"]
                else None, ".1f")))
    out.append("")
    out.append("peak host memory of the process tree (GiB; each column's own peak; shared "
               "pages count once per process mapping them, except PSS):")
    out.append("%-40s %8s %8s %8s %8s %8s %6s %10s" % ("", "VmRSS", "RssAnon", "RssFile",
                                                        "RssShmem", "PSS", "procs",
                                                        "bench@0"))
    for key in order:
        r = results.get(key)
        if r is None or not r.get("mem"):
            continue
        m = r["mem"]

        def g(k, m=m):
            return "%.2f" % (m[k] / 1048576.0) if m.get(k) is not None else "n/a"
        out.append("%-40s %8s %8s %8s %8s %8s %6s %10s" % (
            TITLES[key], g("VmRSS"), g("RssAnon"), g("RssFile"), g("RssShmem"), g("Pss"),
            m.get("nprocs", "?"), g("root_rss_start")))
    out.append("")
    for key in order:
        r = results.get(key)
        if r is None:
            continue
        for n in r.get("notes", []):
            out.append("%s: %s" % (TITLES[key][:3], n))
    out.append("")

    a, b, e = results.get("a"), results.get("b"), results.get("e")
    ok = lambda r: r is not None and "error" not in r  # noqa: E731
    summary = {}
    if ok(a) and ok(b):
        ratio = a["gbs"] / b["gbs"] if b["gbs"] else float("inf")
        summary["a_over_b"] = ratio
        out.append("ratio (a)/(b) GB/s: %.2f   target >= 10: %s"
                   % (ratio, "met" if ratio >= 10 else "missed"))
        if a["cpu_gb"] is not None and b["cpu_gb"] is not None:
            lim = b["cpu_gb"] / 5
            summary["cpu_a"], summary["cpu_b"] = a["cpu_gb"], b["cpu_gb"]
            out.append("CPU-s/GB (a) %.3f vs (b) %.3f: (b)/(a) = %s   target (a) <= (b)/5 = "
                       "%.3f: %s" % (a["cpu_gb"], b["cpu_gb"],
                                     "%.1f" % (b["cpu_gb"] / a["cpu_gb"]) if a["cpu_gb"]
                                     else "inf", lim, "met" if a["cpu_gb"] <= lim
                                     else "missed"))
    else:
        out.append("ratio (a)/(b): n/a (%s)" % ("(a) did not run" if not ok(a)
                                               else "(b) did not run"))
    if ok(a) and ok(e):
        summary["a_over_e"] = a["gbs"] / e["gbs"] if e["gbs"] else 0
        out.append("ratio (a)/(e) GB/s: %.2f   (the C bench, bench/cuda_throughput, reached "
                   "0.86-0.88 of its raw copy)" % summary["a_over_e"])
    else:
        out.append("ratio (a)/(e): n/a")
    return out, summary


# ---- main ---------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="prefetchd's Python binding against torch DataLoader (issue 4)")
    p.add_argument("--gib", type=float, default=2.0,
                   help="dataset size in GiB (default 2; rows of 4096 B)")
    p.add_argument("--data", metavar="DIR",
                   help="write the dataset here, or reuse rows-N.npy found here (default: a "
                        "temporary directory, removed at the end)")
    p.add_argument("--batches", type=int, default=512,
                   help="timed batches for (b)(c)(d) (default 512 = 2 GiB)")
    p.add_argument("--warmup", type=int, default=-1,
                   help="warm-up batches for (b)(c)(d) (default 2 x workers x prefetch "
                        "factor)")
    p.add_argument("--skip", action="append", default=[], metavar="LIST",
                   help="loaders to leave out, e.g. --skip b,d (repeatable)")
    p.add_argument("--prefetchd-bin", default=os.path.join(REPO, "build", "prefetchd"))
    p.add_argument("--socket", help="the daemon's socket (default: in the temporary dir)")
    p.add_argument("--device", default="cuda:0",
                   help="cuda:0 (the benchmark) or cpu (a smoke test of the code paths)")
    p.add_argument("--min-seconds", type=float, default=2.0,
                   help="(a) and (e): timed epochs/passes until this long (at least 3)")
    p.add_argument("--loader-seconds", type=float, default=45.0,
                   help="cut any timed loop or warm-up at this many seconds")
    p.add_argument("--mp-context", choices=["fork", "forkserver", "spawn"],
                   help="DataLoader worker start method (default: torch's)")
    p.add_argument("--json", metavar="OUT", help="also write the figures here as JSON")
    p.add_argument("--watchdog", type=float, default=330.0,
                   help="dump all stacks and exit after this many seconds (0: never)")
    p.add_argument("--_sampler", type=int, help=argparse.SUPPRESS)
    p.add_argument("--_interval", type=float, default=0.05, help=argparse.SUPPRESS)
    p.add_argument("--_pss-every", type=int, default=10, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    skip = set()
    for item in args.skip:
        for k in item.replace(" ", ",").split(","):
            k = k.strip().strip("()").lower()
            if not k:
                continue
            if k not in LOADERS:
                p.error("--skip: unknown loader %r (a, b, c, d, e)" % k)
            skip.add(k)
    args.skip = skip
    if args.gib <= 0 or args.batches <= 0:
        p.error("--gib and --batches must be positive")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args._sampler is not None:
        return sampler_main(args._sampler, args._interval, args._pss_every)

    def on_term(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)
    if args.watchdog > 0:
        import faulthandler

        def on_alarm(signum, frame):
            faulthandler.dump_traceback(all_threads=True)
            raise WatchdogExpired("the watchdog expired after %g s" % args.watchdog)
        # First the alarm: the loader in progress fails, the rest are left out, the report
        # is printed and the daemon stopped.  Should the main thread never get back to
        # Python code, faulthandler ends the process a minute later (the daemon then dies
        # by its parent-death signal).
        signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(max(1, int(args.watchdog)))
        faulthandler.dump_traceback_later(args.watchdog + 60, exit=True)

    ctx = Ctx()
    ctx.args, ctx.daemon = args, None
    ctx.readers = max(2, len(os.sched_getaffinity(0)) - 3)
    ctx.tmpdir = tempfile.mkdtemp(prefix="pf-vsdl-")
    sampler = None
    rc = 0
    try:
        t_begin = time.perf_counter()
        ctx.ds = prepare_dataset(args, ctx.tmpdir)
        log("importing torch")
        import torch
        ctx.torch = torch
        ctx.device = torch.device(args.device)
        ctx.cuda = ctx.device.type == "cuda"
        if ctx.cuda:
            if not torch.cuda.is_available():
                print("vs_dataloader: torch sees no CUDA device (use --device cpu for a "
                      "smoke test)", file=sys.stderr)
                return 2
            torch.cuda.set_device(ctx.device)
            torch.zeros(1, device=ctx.device)  # the context, before any timing
        ctx.loader_device = str(ctx.device) if ctx.cuda else "cpu"
        sampler = TreeSampler()
        ctx.exclude = (sampler.pid,)

        runners = {
            "e": lambda: run_raw(ctx),
            "a": lambda: run_prefetchd(ctx),
            "b": lambda: run_dataloader(ctx, "b", 8, False),
            "c": lambda: run_dataloader(ctx, "c", 16, False),
            "d": lambda: run_dataloader(ctx, "d", 8, True),
        }
        results = {}
        expired = False
        for key in LOADERS:
            if key in args.skip:
                continue
            if expired:
                results[key] = {"error": "not run: the watchdog had expired"}
                continue
            free_host_caches(ctx)
            log("%s ..." % TITLES[key])
            t0 = time.perf_counter()
            sampler.start()
            try:
                r = runners[key]()
                r["gbs"] = r["bytes"] / GB / r["seconds"] if r["seconds"] > 0 else 0.0
                r["cpu_gb"] = (r["cpu_s"] / (r["bytes"] / GB)
                               if r.get("cpu_s") is not None and r["bytes"] else None)
                log("%s: %.2f GB/s, %s CPU-s/GB (%.1f s)"
                    % (TITLES[key], r["gbs"], fmt(r["cpu_gb"], ".3f"),
                       time.perf_counter() - t0))
            except WatchdogExpired as e:
                r = {"error": str(e)}
                log("%s FAILED: %s" % (TITLES[key], r["error"]))
                rc, expired = 1, True
            except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001
                traceback.print_exc()
                r = {"error": "%s: %s" % (type(e).__name__, e)}
                log("%s FAILED: %s" % (TITLES[key], r["error"]))
                rc = 1
                if isinstance(e, KeyboardInterrupt):
                    raise
            finally:
                mem = sampler.stop()
            r["mem"] = mem
            results[key] = r

        if args.watchdog > 0:
            signal.alarm(0)
        free_host_caches(ctx)
        order = ["a", "b", "c", "d", "e"]
        lines, summary = report(ctx, results, [k for k in order])
        print("\n".join(lines), flush=True)
        log("done in %.1f s" % (time.perf_counter() - t_begin))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"results": results, "summary": summary,
                           "dataset": {k: v for k, v in ctx.ds.items() if k != "mm"},
                           "readers": ctx.readers}, f, indent=1, default=str)
        return rc
    finally:
        if ctx.daemon is not None:
            ctx.daemon.stop()
        if sampler is not None:
            sampler.close()
        if getattr(ctx, "ds", None):
            ctx.ds.pop("mm", None)
        shutil.rmtree(ctx.tmpdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
