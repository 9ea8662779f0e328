#!/usr/bin/env python3
"""multi_gpu.py — one daemon feeding a trainer per GPU (issue 20).

One run on a machine with two GPUs (or more; the first two are used), everything measured in
the same run, with train_step.py's data (a .npy of --gib GiB of 4 KiB float32 rows in the page
cache, shuffled 4 MiB batches) and one prefetchd with its default configuration but
`pool = off` (every byte crosses PCIe: the case that needs the host most):

  host      the host's own limit: the same shuffled 4 KiB rows gathered from the file's
            mapping into 4 MiB buffers by a thread per usable CPU, with the C code of
            make bench-cuda's readers' diagnostic (cuda_throughput --gather-only), nothing
            else running.  GB/s.
  tight     trainers with no compute, through Python, each a process of its own with
            CUDA_VISIBLE_DEVICES set to its GPU (so each opens "cuda:0", which the daemon
            finds by PCI bus id): first one trainer on GPU 0 alone, then ranks 0 and 1 of
            world 2 on GPUs 0 and 1 at once.  Each rank takes its share of --epochs timed
            epochs after a warm-up epoch.  Target: the two together at least 1.8 times the
            one alone.
  step      the same two ranks at once, each running train_step.py's step (two f32 matmuls
            calibrated on its own GPU to about 4 times a batch's copy) on every batch:
            each rank's step time against its own compute-only step measured in the same
            process.  Target: overhead <= 2% on both GPUs.

Each rank checks one epoch after its timed ones (every pick of its share once, its rows'
float64 sum, and, from the two ranks, every pick of the epoch once); a failed check exits 1.
With fewer than two GPUs it runs the single-GPU part and says what it could not run (exit 77).

  python3 bench/multi_gpu.py [--gib 4] [--epochs 3] [--data DIR] [--json OUT]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train_step as ts  # noqa: E402 (after the path)


def log(msg):
    sys.stderr.write("multi_gpu: %s\n" % msg)
    sys.stderr.flush()


# ---- one trainer process ----------------------------------------------------------------


def child(args):
    """A rank on its GPU (CUDA_VISIBLE_DEVICES set by the parent): JSON on stdout."""
    import numpy as np
    import torch
    import prefetch
    torch.zeros(1, device="cuda:0")
    res = {"gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "rank": args.rank}
    step = None
    if args.compute:
        step, t_copy, t0, _ = ts.calibrate(torch, args)
        res.update(compute_s=t0, copy_s=t_copy, hidden=step.hidden)
    loader = prefetch.Loader("bench", batch_size=ts.BATCH_ROWS, device="cuda:0", shuffle=True,
                             seed=7, rank=args.rank, world_size=args.world, socket=args.sock,
                             name="multi_gpu-r%d" % args.rank, timeout=120)
    with loader:
        for b in loader.epoch(0):  # warm-up: arenas imported, the probe sized the target
            if step:
                step(b["x"])
        torch.cuda.synchronize()
        # The parent starts every rank's timed epochs at once.
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        sys.stdin.readline()
        nb, t_start = 0, time.perf_counter()
        for e in range(1, args.epochs + 1):
            for b in loader.epoch(e):
                if step:
                    step(b["x"])
                else:
                    b["x"]
                nb += 1
        torch.cuda.synchronize()
        total = time.perf_counter() - t_start
        res.update(batches=nb, seconds=total, gbs=nb * ts.BATCH_BYTES / total / 1e9,
                   step_s=total / nb)
        # The check: this rank's share of one epoch, every pick once, its sum.
        seen = np.zeros(args.rows, dtype=np.uint8)
        acc = torch.zeros((), dtype=torch.float64, device="cuda:0")
        for b in loader.epoch(100):
            acc += b["x"].double().sum()
            seen[b.picks.astype(np.int64)] += 1
        torch.cuda.synchronize()
        if (seen > 1).any():
            raise SystemExit("rank %d: %d picks delivered twice" % (args.rank,
                                                                      int((seen > 1).sum())))
        mm = np.load(args.path, mmap_mode="r")
        want = float(mm[np.flatnonzero(seen)].astype(np.float64).sum())
        got = float(acc.item())
        if abs(got - want) > 1e-6 * max(1.0, abs(want)) + 1e-3:
            raise SystemExit("rank %d: sum %.6f, its rows' %.6f" % (args.rank, got, want))
        res["picks"] = int(seen.sum())
        np.save(args.seen_out, seen)
    sys.stdout.write(json.dumps(res) + "\n")
    return 0


def start_rank(args, data, sock, gpu, rank, world, compute, tmp):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu))
    seen = os.path.join(tmp, "seen-g%d-r%d-w%d.npy" % (gpu, rank, world))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--sock", sock, "--path",
           data["path"], "--rows", str(data["rows"]), "--rank", str(rank), "--world",
           str(world), "--epochs", str(args.epochs), "--seen-out", seen,
           "--step-copies", str(args.step_copies)] + (["--compute"] if compute else [])
    p = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.seen = seen
    return p


def run_ranks(args, data, sock, gpus, compute, tmp):
    """Ranks 0..len(gpus)-1 of world len(gpus), one per GPU, timed epochs started at once."""
    import numpy as np
    procs = [start_rank(args, data, sock, g, r, len(gpus), compute, tmp)
             for r, g in enumerate(gpus)]
    for p in procs:
        line = p.stdout.readline().decode().strip()
        if line != "ready":
            p.kill()
            raise SystemExit("multi_gpu: a rank failed before its timed epochs:\n%s"
                             % p.stderr.read().decode("utf-8", "replace")[-3000:])
    t0 = time.perf_counter()
    for p in procs:
        p.stdin.write(b"go\n")
        p.stdin.flush()
    out = []
    for p in procs:
        o, e = p.communicate(timeout=900)
        if p.returncode != 0:
            raise SystemExit("multi_gpu: rank %d (GPU %d) failed (exit %d):\n%s" % (
                len(out), gpus[len(out)], p.returncode, e.decode("utf-8", "replace")[-3000:]))
        out.append(json.loads(o.decode().strip().splitlines()[-1]))
    wall = time.perf_counter() - t0
    union = sum(np.load(p.seen).astype(np.int64) for p in procs)
    if not (union == 1).all():
        raise SystemExit("multi_gpu: the ranks' check epochs together are not every pick "
                         "once (%d rows not once)" % int((union != 1).sum()))
    return {"ranks": out, "wall_s": wall, "gbs": sum(r["gbs"] for r in out)}


def host_gather(data):
    """The readers' gather alone, on every usable CPU, with nothing else running: the
    same C code as make bench-cuda's "gather of the shuffled rows" (cuda_throughput
    --gather-only), on this bench's file.  A Python gather (numpy take, a process per CPU)
    made 37 GB/s where one trainer got 51 GB/s: it measured numpy, not the host."""
    ncpu = len(os.sched_getaffinity(0))
    exe = os.path.join(ts.REPO, "build", "bench", "cuda_throughput")
    p = subprocess.run([exe, "--gather-only", data["path"], "--readers", str(ncpu)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    m = re.search(r"gather of the shuffled rows, (\d+) threads: ([0-9.]+) GB/s",
                  p.stdout.decode())
    if p.returncode or not m:
        raise SystemExit("multi_gpu: %s --gather-only failed (rc %d): %s"
                         % (exe, p.returncode, p.stderr.decode("utf-8", "replace")[-2000:]))
    return {"threads": int(m.group(1)), "gbs": float(m.group(2))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "pf-train-step"))
    ap.add_argument("--prefetchd-bin", default=os.path.join(ts.REPO, "build", "prefetchd"))
    ap.add_argument("--step-copies", type=float, default=4.0)
    ap.add_argument("--json")
    ap.add_argument("--diag", action="store_true")
    # the child's
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--compute", action="store_true")
    ap.add_argument("--sock")
    ap.add_argument("--path")
    ap.add_argument("--rows", type=int)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--seen-out")
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    data = ts.prepare_data(args)
    host = host_gather(data)
    import torch
    ngpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if ngpus < 1:
        log("no CUDA device: nothing to measure")
        return 77
    tmp = tempfile.mkdtemp(prefix="pf-multi-")
    res = {"gpus": ngpus, "host": host}
    log("host: %d reader threads gathering shuffled 4 KiB rows: %.2f GB/s"
        % (res["host"]["threads"], res["host"]["gbs"]))
    d = ts.Daemon(args, tmp, data, "", False, "multi")
    try:
        res["one"] = run_ranks(args, data, d.sock, [0], False, tmp)
        log("one trainer on GPU 0: %.2f GB/s" % res["one"]["gbs"])
        if ngpus >= 2:
            res["two"] = run_ranks(args, data, d.sock, [0, 1], False, tmp)
            log("two trainers on GPUs 0 and 1: %s GB/s"
                % " + ".join("%.2f" % r["gbs"] for r in res["two"]["ranks"]))
            res["step"] = run_ranks(args, data, d.sock, [0, 1], True, tmp)
        res["status"] = d.status()
    finally:
        d.stop()
    print("host gather, %d threads: %.2f GB/s (the readers' ceiling on this host)"
          % (res["host"]["threads"], res["host"]["gbs"]))
    print("one trainer, GPU 0, pool off, tight loop: %.2f GB/s" % res["one"]["gbs"])
    rc = 0
    if "two" in res:
        ratio = res["two"]["gbs"] / res["one"]["gbs"]
        met = ratio >= 1.8
        print("two trainers, GPUs 0 and 1 at once: %s = %.2f GB/s, %.2f x one (target >= 1.8: "
              "%s)" % (" + ".join("%.2f" % r["gbs"] for r in res["two"]["ranks"]),
                       res["two"]["gbs"], ratio, "met" if met else "missed"))
        worst = 0.0
        for r in res["step"]["ranks"]:
            over = r["step_s"] / r["compute_s"] - 1
            worst = max(worst, over)
            print("step on GPU %s (rank %d): %.1f us against %.1f us compute-only: overhead "
                  "%+.2f%%" % (r["gpu"], r["rank"], r["step_s"] * 1e6, r["compute_s"] * 1e6,
                               over * 100))
        print("overhead on both GPUs at once: worst %+.2f%% (target <= 2%%: %s)"
              % (worst * 100, "met" if worst <= 0.02 else "missed"))
    else:
        print("two trainers: not run, this machine has %d GPU" % ngpus)
        rc = 77
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return rc


if __name__ == "__main__":
    sys.exit(main())
