#!/usr/bin/env python3
"""cold.py — a dataset larger than the page cache can help, read at the disk's speed (issue 19).

One run on a GPU machine, everything measured in the same run:

  data      a .npy of --gib GiB (default 16) of 4 KiB rows (512 int64: row r holds
            r*512 .. r*512+511), its header padded to 4096 bytes so that every row is one
            aligned 4 KiB block; written once, synced and dropped from the page cache.
  disk      sequential O_DIRECT reads of 4 MiB (1 thread, and 4 threads on quarters of the
            file: the larger is the disk's sequential bandwidth), and random O_DIRECT 4 KiB
            reads from --threads threads (default 32) for --secs seconds: the random-read rate.
  prefetchd `read = direct`, `pool = off`, default configuration otherwise; one Loader on
            cuda:0, batches of 1024 rows (4 MiB), through Python:
              shuffle        the first --shuffle-batches batches of an epoch (default 200:
                             a whole epoch is ~4M random reads);
              block_shuffle  the first --block-batches batches (default 1500, 6 GiB) with the
                             default block (4 MiB) and window (16 blocks).
            Every batch's first and last rows are checked against the formula, and the picks
            of the batches taken are checked to be distinct and in range.

Targets: block_shuffle >= 0.8 of the sequential bandwidth; shuffle >= 0.8 of the random-read
rate (4 KiB rows: one random read each).

  python3 bench/cold.py [--gib 16] [--data DIR] [--json OUT]
"""

import argparse
import json
import mmap
import os
import random
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train_step as ts  # noqa: E402 (after the path)

ROW_WORDS = 512
ROW_BYTES = ROW_WORDS * 8
HEADER = 4096
BATCH = 1024
MiB = 1 << 20


def log(msg):
    sys.stderr.write("cold: %s\n" % msg)
    sys.stderr.flush()


def npy_header(rows):
    """A version 1.0 header for (rows, 512) <i8, padded to HEADER bytes in all."""
    d = "{'descr': '<i8', 'fortran_order': False, 'shape': (%d, %d), }" % (rows, ROW_WORDS)
    pad = HEADER - 10 - len(d) - 1
    return b"\x93NUMPY\x01\x00" + (HEADER - 10).to_bytes(2, "little") + \
        d.encode() + b" " * pad + b"\n"


def prepare(args):
    import numpy as np
    rows = int(args.gib * (1 << 30)) // ROW_BYTES // BATCH * BATCH
    os.makedirs(args.data, exist_ok=True)
    path = os.path.join(args.data, "cold-%d.npy" % rows)
    if not (os.path.exists(path) and os.path.getsize(path) == HEADER + rows * ROW_BYTES):
        log("writing %d rows (%.1f GiB) to %s" % (rows, rows * ROW_BYTES / (1 << 30), path))
        t0 = time.perf_counter()
        with open(path + ".part", "wb") as f:
            f.write(npy_header(rows))
            step = 65536
            for r in range(0, rows, step):
                n = min(step, rows - r)
                f.write(np.arange(r * ROW_WORDS, (r + n) * ROW_WORDS, dtype="<i8").tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".part", path)
        log("written in %.1f s" % (time.perf_counter() - t0))
    mm = np.load(path, mmap_mode="r")
    assert mm.shape == (rows, ROW_WORDS) and int(mm[rows - 1, ROW_WORDS - 1]) == rows * ROW_WORDS - 1
    del mm
    drop_cache(path)
    return {"path": path, "rows": rows}


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# ---- the disk on its own ---------------------------------------------------------------


def seq_read(path, start, length, chunk=4 * MiB):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, chunk)
    done = 0
    try:
        while done < length:
            n = os.preadv(fd, [buf], start + done)
            if n <= 0:
                break
            done += n
    finally:
        os.close(fd)
        buf.close()
    return done


def disk_sequential(path, size, gib=4):
    length = min(size - HEADER, gib << 30) // (4 * MiB) * (4 * MiB)
    t0 = time.perf_counter()
    got = seq_read(path, HEADER, length)
    one = got / (time.perf_counter() - t0) / 1e9
    # 4 threads, each a quarter of another region of the file.
    base = HEADER + length if size - HEADER >= 2 * length else HEADER
    q = length // 4 // (4 * MiB) * (4 * MiB)
    res = [0] * 4
    ts_ = [threading.Thread(target=lambda i=i: res.__setitem__(i, seq_read(path, base + i * q, q)))
           for i in range(4)]
    t0 = time.perf_counter()
    for t in ts_:
        t.start()
    for t in ts_:
        t.join()
    four = sum(res) / (time.perf_counter() - t0) / 1e9
    return one, four


def disk_random(path, size, threads, secs, block=4096):
    blocks = (size - HEADER) // block
    stop = time.perf_counter() + secs
    counts = [0] * threads

    def worker(i):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, block)
        rng = random.Random(i)
        n = 0
        while time.perf_counter() < stop:
            os.preadv(fd, [buf], HEADER + rng.randrange(blocks) * block)
            n += 1
        counts[i] = n
        os.close(fd)
        buf.close()

    t0 = time.perf_counter()
    th = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    el = time.perf_counter() - t0
    iops = sum(counts) / el
    return iops, iops * block / 1e9


# ---- prefetchd ---------------------------------------------------------------------------


def run_loader(args, data, tmp, order, nbatches, **opts):
    import numpy as np
    import prefetch
    torch = None
    if args.device != "cpu":
        import torch
    d = ts.Daemon(args, tmp, {"path": data["path"]}, "read = direct\n", False,
                  "cold-" + order)
    try:
        loader = prefetch.Loader("bench", batch_size=BATCH, device=args.device, order=order,
                                 seed=11, socket=d.sock, name="cold-" + order, timeout=600,
                                 **opts)
        seen = np.zeros(data["rows"], dtype=np.uint8)
        n = 0
        with loader:
            it = iter(loader.epoch(1))
            if torch:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for b in it:
                x = b["x"]
                picks = b.picks.astype(np.int64)
                ends = x[[0, b.count - 1]]
                ends = ends.cpu().numpy() if torch else np.asarray(ends)
                for row, pick in ((ends[0], picks[0]), (ends[1], picks[b.count - 1])):
                    if int(row[0]) != pick * ROW_WORDS or int(row[-1]) != pick * ROW_WORDS + 511:
                        raise SystemExit("cold: %s batch %d: row of pick %d holds %d.." % (
                            order, n, pick, int(row[0])))
                if seen[picks].any() or (picks >= data["rows"]).any():
                    raise SystemExit("cold: %s: a pick came twice or out of range" % order)
                seen[picks] = 1
                n += 1
                if n == nbatches:
                    break
            if torch:
                torch.cuda.synchronize()
            el = time.perf_counter() - t0
        st = d.status()
    finally:
        d.stop()
    gbs = n * BATCH * ROW_BYTES / el / 1e9
    log("%s: %d batches in %.2f s: %.3f GB/s (%.0f rows/s)" % (order, n, el, gbs,
                                                              n * BATCH / el))
    return {"batches": n, "secs": el, "gbs": gbs, "rows_per_s": n * BATCH / el,
            "readers": st.get("readers")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=16.0)
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "pf-cold"))
    ap.add_argument("--prefetchd-bin", default=os.path.join(ts.REPO, "build", "prefetchd"))
    ap.add_argument("--threads", type=int, default=32)
    ap.add_argument("--secs", type=float, default=4.0)
    ap.add_argument("--shuffle-batches", type=int, default=200)
    ap.add_argument("--block-batches", type=int, default=1500)
    ap.add_argument("--json")
    ap.add_argument("--device", default="cuda:0", help="cuda:0, or cpu for a dry run")
    ap.add_argument("--diag", action="store_true")
    args = ap.parse_args(argv)
    data = prepare(args)
    size = os.path.getsize(data["path"])
    seq1, seq4 = disk_sequential(data["path"], size)
    seq = max(seq1, seq4)
    log("disk sequential O_DIRECT 4 MiB: %.2f GB/s (1 thread), %.2f GB/s (4 threads)" % (seq1,
                                                                                        seq4))
    iops, rnd = disk_random(data["path"], size, args.threads, args.secs)
    log("disk random O_DIRECT 4 KiB, %d threads: %.0f reads/s = %.3f GB/s" % (args.threads,
                                                                             iops, rnd))
    tmp = tempfile.mkdtemp(prefix="pf-cold-")
    drop_cache(data["path"])
    sh = run_loader(args, data, tmp, "shuffle", args.shuffle_batches)
    drop_cache(data["path"])
    bl = run_loader(args, data, tmp, "block_shuffle", args.block_batches)
    r_sh, r_bl = sh["gbs"] / rnd, bl["gbs"] / seq
    print("dataset: %.1f GiB of 4 KiB rows, read = direct, pool off" % (size / (1 << 30)))
    print("disk: sequential O_DIRECT 4 MiB %.2f GB/s (1 thread %.2f, 4 threads %.2f); random "
          "O_DIRECT 4 KiB %.0f reads/s = %.3f GB/s (%d threads)" % (seq, seq1, seq4, iops, rnd,
                                                                   args.threads))
    print("prefetchd into cuda:0, shuffle:       %.3f GB/s over %d batches = %.2f of the "
          "random-read rate (target >= 0.8: %s)" % (sh["gbs"], sh["batches"], r_sh,
                                                    "met" if r_sh >= 0.8 else "missed"))
    print("prefetchd into cuda:0, block_shuffle: %.3f GB/s over %d batches = %.2f of the "
          "sequential bandwidth (target >= 0.8: %s)" % (bl["gbs"], bl["batches"], r_bl,
                                                        "met" if r_bl >= 0.8 else "missed"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seq": [seq1, seq4], "random": [iops, rnd], "shuffle": sh,
                       "block_shuffle": bl}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
