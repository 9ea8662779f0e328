#!/usr/bin/env python3
"""node.py — a node's worth of trainers on one GPU, default configuration (issue 34).

One run on a GPU machine, everything measured in the same run, with train_step.py's data (a
.npy of --gib GiB, default 2, of float32 rows of 1024 values, 4 KiB, in the page cache) and
5 MiB batches (1280 rows), the size that refused the 8th Loader when each session took a
range of the pinned ring:

  limit      the pinned host-to-device copy of one 5 MiB batch, torch, alone: GB/s (the
             PCIe link every trainer of the GPU shares).
  daemons    prefetchd's default configuration (readers, ring_bytes auto), once with
             `pool = off` (every byte crosses PCIe, copied by each trainer from the host
             arenas) and once as it ships (pool on; one epoch first fills the pool, so
             every later batch is gathered in its trainer's own context).
  trainers   for N in --n (1, 2, 4, 8, 16): N processes at once, each with its own
             prefetch.Loader on cuda:0, each epoch shuffled with a seed of its own:
               first      seconds from Loader() to its first batch (all N opening at once);
               tight      epochs with no compute (each batch's x taken) until --tight-s
                          seconds have passed; the aggregate GB/s is all their bytes over
                          the wall time from the common start to the last one's end, and
                          the daemon's CPU seconds (utime + stime from /proc) over the
                          same time, per delivered GB;
               compute    eager_step.py's MLP step (1024-4096-1024, forward, backward,
                          fused AdamW) on 16 batches already on the GPU, --steps steps, all
                          N processes at once: each one's step time and CPU per step;
               eager      the same step on --steps batches of the Loader, all N at once:
                          each trainer's step overhead against its own compute-only step
                          of the same N, and its CPU-us per batch beyond it;
               check      one more epoch each, no compute: every pick once, the float64
                          sum of every delivered value equal to the file's.  A failed check
                          exits 1.

The report ends with the issue's targets, each `met` or `MISSED`: every session open at
N = 16 (pool off and on), aggregate tight rate at N >= 4 >= 0.85 x the pinned limit (pool
off) and above it (pool on), per-trainer step overhead <= 5%, daemon CPU per GB flat in N
(the largest N's within 1.5x of N = 1's).

  python3 bench/node.py [--gib 2] [--n 1,2,4,8,16] [--steps 100] [--tight-s 1.5]
                        [--pool off,on] [--daemon-lines "max_depth = 4;readers = 8"]
                        [--data DIR] [--json OUT]

Progress goes to stderr, the report to stdout.  Exit status 0 whether or not a target is met,
1 on a failed check or an error, 77 with no CUDA device.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train_step as ts  # noqa: E402 (after the path)

ROWS = 1280  # 5 MiB batches of 4 KiB rows
BATCH_BYTES = ROWS * ts.ROW_BYTES
HIDDEN = 4096
TUNED = ""  # --daemon-lines, for the report


def log(msg):
    sys.stderr.write("node: %s\n" % msg)
    sys.stderr.flush()


# ---- one trainer process ----------------------------------------------------------------


def child(args):
    """One trainer: answers the parent's phases on stdin with one JSON line each."""
    import numpy as np
    import torch
    import prefetch
    import eager_step as es
    torch.zeros(1, device="cuda:0")
    torch.backends.cuda.matmul.allow_tf32 = False
    step = es.MlpStep(torch, HIDDEN)
    xs = [torch.randn(ROWS, ts.ROW_FLOATS, device="cuda:0") for _ in range(16)]
    for i in range(8):  # the step's kernels and AdamW's state exist before anyone times
        step(xs[i % 16])
    torch.cuda.synchronize()
    pc, cpu = time.perf_counter, time.process_time
    say = lambda obj: (sys.stdout.write(json.dumps(obj) + "\n"), sys.stdout.flush())  # noqa

    t0 = pc()
    loader = prefetch.Loader("bench", batch_size=ROWS, device="cuda:0", shuffle=True,
                             seed=1000 + args.index if args.seed < 0 else args.seed,
                             socket=args.sock, name="node-%d" % args.index, timeout=120,
                             share=args.share or None)
    epoch = 0
    with loader:
        it = iter(loader.epoch(epoch))
        first = next(it)
        first_s = pc() - t0
        for b in it:
            b["x"]
        torch.cuda.synchronize()
        say({"phase": "open", "first_s": first_s})
        for line in sys.stdin:
            # "PHASE [EPOCH]": the phase's first epoch is EPOCH when given (the
            # members of a share start their epochs alike: share.py).
            phase, _, first_epoch = line.strip().partition(" ")
            if first_epoch:
                epoch = int(first_epoch) - 1
            if phase == "tight":
                nbytes, t0 = 0, pc()
                while pc() - t0 < args.tight_s:
                    epoch += 1
                    for b in loader.epoch(epoch):
                        nbytes += b["x"].shape[0] * ts.ROW_BYTES
                torch.cuda.synchronize()
                say({"phase": phase, "bytes": nbytes, "seconds": pc() - t0})
            elif phase == "compute":
                torch.cuda.synchronize()
                t0, c0 = pc(), cpu()
                for i in range(args.steps):
                    step(xs[i % 16])
                torch.cuda.synchronize()
                say({"phase": phase, "step_s": (pc() - t0) / args.steps,
                     "cpu_s": (cpu() - c0) / args.steps})
            elif phase == "eager":
                epoch += 1
                n, inside = 0, 0.0
                torch.cuda.synchronize()
                t0, c0 = pc(), cpu()
                it = iter(loader.epoch(epoch))
                while n < args.steps:
                    t1 = pc()
                    b = next(it, None)
                    inside += pc() - t1
                    if b is None:  # an epoch shorter than --steps: the next one
                        epoch += 1
                        it = iter(loader.epoch(epoch))
                        continue
                    step(b["x"])
                    n += 1
                torch.cuda.synchronize()
                wall, c = pc() - t0, cpu() - c0
                del it, b  # leaves the epoch (abandoned: the daemon stops filling)
                say({"phase": phase, "step_s": wall / n, "cpu_s": c / n,
                     "next_s": inside / n})
            elif phase == "check":
                epoch += 1
                seen = np.zeros(args.rows, dtype=np.uint8)
                acc = torch.zeros((), dtype=torch.float64, device="cuda:0")
                for b in loader.epoch(epoch):
                    acc += b["x"].double().sum()
                    np.add.at(seen, b.picks.astype(np.int64), 1)
                got = float(acc.item())
                ok = bool((seen == 1).all())
                err = "" if ok else "%d picks not delivered once" % int((seen != 1).sum())
                if ok and abs(got - args.sum) > 1e-6 * max(1.0, abs(args.sum)) + 1e-3:
                    ok, err = False, "float64 sum %.6f, the file's %.6f" % (got, args.sum)
                say({"phase": phase, "ok": ok, "err": err, "sum": got})
            elif phase == "quit":
                break
    return 0


# ---- the parent -----------------------------------------------------------------------------


def daemon_cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pinned_limit(torch):
    return BATCH_BYTES / ts.copy_time(torch, BATCH_BYTES) / 1e9


class Trainers:
    """N child processes on one daemon; phase() sends a phase to all and reads one line each."""

    def __init__(self, args, data, sock, n, share="", seed=-1):
        self.procs = []
        for i in range(n):
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--sock", sock,
                   "--index", str(i), "--rows", str(data["rows"]), "--sum", repr(data["sum"]),
                   "--steps", str(args.steps), "--tight-s", str(args.tight_s),
                   "--seed", str(seed), "--share", share]
            self.procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE,
                                               stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        self.opened = [self.read(p) for p in self.procs]

    def read(self, p):
        line = p.stdout.readline().decode().strip()
        if not line:
            p.kill()
            raise SystemExit("node: a trainer failed:\n%s"
                             % p.stderr.read().decode("utf-8", "replace")[-3000:])
        return json.loads(line)

    def phase(self, name):
        for p in self.procs:
            p.stdin.write((name + "\n").encode())
            p.stdin.flush()
        return [self.read(p) for p in self.procs]

    def close(self):
        for p in self.procs:
            try:
                p.stdin.write(b"quit\n")
                p.stdin.flush()
            except BrokenPipeError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


def run_n(args, data, d, n, pool):
    t = Trainers(args, data, d.sock, n)
    try:
        st = d.status()
        open_sessions = len(st.get("sessions") or [])
        ring = {k: st.get(k, 0) for k in ("ring_bytes", "ring_reserved", "ring_waits")}
        c0, w0 = daemon_cpu_s(d.proc.pid), time.perf_counter()
        tight = t.phase("tight")
        wall = time.perf_counter() - w0
        dcpu = daemon_cpu_s(d.proc.pid) - c0
        nbytes = sum(r["bytes"] for r in tight)
        compute = t.phase("compute")
        eager = t.phase("eager")
        checks = t.phase("check")
    finally:
        t.close()
    bad = [c["err"] for c in checks if not c["ok"]]
    if bad:
        raise SystemExit("node: pool=%s N=%d: a check failed: %s" % (pool, n, bad[0]))
    over = [e["step_s"] / c["step_s"] - 1 for e, c in zip(eager, compute)]
    cpu_us = [(e["cpu_s"] - c["cpu_s"]) * 1e6 for e, c in zip(eager, compute)]
    return {"n": n, "pool": pool, "open": open_sessions, "ring": ring,
            "first_s": [o["first_s"] for o in t.opened],
            "gbs": nbytes / wall / 1e9, "wall_s": wall, "daemon_cpu_s": dcpu,
            "daemon_cpu_per_gb": dcpu / (nbytes / 1e9),
            "compute_step_us": [c["step_s"] * 1e6 for c in compute],
            "eager_step_us": [e["step_s"] * 1e6 for e in eager],
            "overhead": over, "cpu_us": cpu_us,
            "next_us": [e["next_s"] * 1e6 for e in eager],
            "sums": [c["sum"] for c in checks]}


def fill_pool(args, data, d):
    """One trainer's epoch, then a wait until the pool holds every row."""
    t = Trainers(args, data, d.sock, 1)
    t.close()
    deadline = time.monotonic() + 30
    rows = 0
    while time.monotonic() < deadline:
        rows = ((d.status().get("pools") or [{}])[0]).get("rows") or 0
        if rows >= data["rows"]:
            break
        time.sleep(0.2)
    log("pool holds %d of %d rows" % (rows, data["rows"]))


def verdict(ok):
    return "met" if ok else "MISSED"


def report(res, limit):
    print("node.py: up to %d trainer processes on one GPU, 5 MiB batches, %s"
          % (max(r["n"] for r in res), "[daemon] " + TUNED if TUNED else
             "default configuration"))
    print("pinned host->device limit, 5 MiB: %.2f GB/s" % limit)
    print("%-5s %3s %5s %8s %6s %9s %9s %9s %8s %8s %8s" % (
        "pool", "N", "open", "GB/s", "/pin", "first_ms", "dCPU_s/GB", "compute", "step+%",
        "cpu_us", "next_us"))
    for r in res:
        print("%-5s %3d %5d %8.2f %6.2f %9.1f %9.3f %9.1f %8.2f %8.1f %8.1f" % (
            r["pool"], r["n"], r["open"], r["gbs"], r["gbs"] / limit, 1e3 * max(r["first_s"]),
            r["daemon_cpu_per_gb"], statistics.median(r["compute_step_us"]),
            100 * max(r["overhead"]), max(r["cpu_us"]), statistics.median(r["next_us"])))
        print("      per trainer: step overhead %s%%; first batch %s ms" % (
            " ".join("%.1f" % (100 * o) for o in r["overhead"]),
            " ".join("%.0f" % (1e3 * f) for f in r["first_s"])))
    print("(first_ms: the slowest trainer's; step+%: the worst trainer's overhead against its "
          "own compute-only step with the same N running; cpu_us: the worst trainer's CPU "
          "beyond it)")
    for pool in ("off", "on"):
        rs = [r for r in res if r["pool"] == pool]
        if not rs:
            continue
        top = max(rs, key=lambda r: r["n"])
        print("sessions open pool=%s: %d of %d: %s" % (pool, top["open"], top["n"],
                                                       verdict(top["open"] == top["n"] == 16)))
        big = [r for r in rs if r["n"] >= 4]
        if big:
            worst = min(r["gbs"] / limit for r in big)
            want = 0.85 if pool == "off" else 1.0
            print("aggregate tight pool=%s N>=4: worst %.2f x the pinned limit (target %s %.2f):"
                  " %s" % (pool, worst, ">=" if pool == "off" else ">", want,
                           verdict(worst >= want if pool == "off" else worst > want)))
        w = max(max(r["overhead"]) for r in rs)
        print("step overhead pool=%s: worst trainer %.1f%% (target <= 5%%): %s"
              % (pool, 100 * w, verdict(w <= 0.05)))
        one = [r for r in rs if r["n"] == 1]
        if one:
            ratio = top["daemon_cpu_per_gb"] / max(one[0]["daemon_cpu_per_gb"], 1e-9)
            print("daemon CPU per GB pool=%s: N=%d %.3f s, N=1 %.3f s, ratio %.2f "
                  "(flat: <= 1.5): %s" % (pool, top["n"], top["daemon_cpu_per_gb"],
                                          one[0]["daemon_cpu_per_gb"], ratio,
                                          verdict(ratio <= 1.5)))


def cuda_torch(say):
    """torch with a CUDA device, or None (said why: the bench exits 77)."""
    try:
        import torch
    except ImportError:
        say("no torch here: nothing to measure")
        return None
    if not torch.cuda.is_available():
        say("no CUDA device: nothing to measure")
        return None
    return torch


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sock", help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--rows", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--sum", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--share", default="", help=argparse.SUPPRESS)
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--n", default="1,2,4,8,16")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--tight-s", type=float, default=1.5)
    ap.add_argument("--pool", default="off,on")
    ap.add_argument("--daemon-lines", default="",
                    help="[daemon] lines to tune with, ';'-separated (default: none)")
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "prefetchd-bench"))
    ap.add_argument("--prefetchd-bin", default=os.path.join(ts.REPO, "build", "prefetchd"))
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    a.diag = False
    a.keep_logs = None
    return a


def main(argv=None):
    global TUNED
    args = parse_args(argv)
    if args.child:
        return child(args)
    TUNED = args.daemon_lines
    torch = cuda_torch(log)
    if torch is None:
        return 77
    data = ts.prepare_data(args)
    limit = pinned_limit(torch)
    log("pinned host->device, 5 MiB: %.2f GB/s" % limit)
    del torch  # the parent holds no more GPU memory than it must
    res = []
    with tempfile.TemporaryDirectory() as tmp:
        for pool in args.pool.split(","):
            d = ts.Daemon(args, tmp, data, "\n".join(args.daemon_lines.split(";")),
                          pool == "on", "node-" + pool)
            try:
                if pool == "on":
                    fill_pool(args, data, d)
                for n in (int(x) for x in args.n.split(",")):
                    log("pool=%s N=%d" % (pool, n))
                    r = run_n(args, data, d, n, pool)
                    log("pool=%s N=%d: %.2f GB/s, worst step overhead %.1f%%, daemon %.3f "
                        "CPU-s/GB, ring %s" % (pool, n, r["gbs"], 100 * max(r["overhead"]),
                                              r["daemon_cpu_per_gb"], r["ring"]))
                    res.append(r)
            finally:
                d.stop()
    report(res, limit)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"limit_gbs": limit, "runs": res}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
