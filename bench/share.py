#!/usr/bin/env python3
"""share.py — a sweep's trainers sharing one read and one copy per batch (issue 35).

Part of `make bench-node`, after node.py, with its data and trainers (a .npy of --gib GiB of
4 KiB float32 rows, 5 MiB batches, each trainer a process with its own prefetch.Loader on
cuda:0, default configuration).  Every trainer of a run has the same seed, as a sweep's do;
they differ only in how they open:

  alone      N independent sessions (no share);
  shared     N Loaders with share="..." (one producing session, N members).

For the pool off and on (on: one epoch first fills the pool), and N in --n (1, 2, 4, 8), each
run measures, all N at once:

  tight      epochs with no compute until --tight-s seconds have passed: the aggregate
             batches/s (every trainer's batches over the wall time), the daemon's CPU
             (utime + stime from /proc) in cores over the same time, and what the daemon
             holds, from `prefetchctl status --json` sampled every 0.2 s, at its most:
             pinned (the ring's bytes in use plus host arenas) and device (device slots;
             the pool, shared by every session of the GPU either way, apart);
  eager      node.py's eager MLP step (1024-4096-1024, fused AdamW) on --steps batches of
             the Loader: each trainer's step overhead against its own compute-only step
             with the same N running, and its CPU beyond it;
  check      one more epoch each: every pick once, the float64 sum equal to the file's.
  alone_b    batches the share's members got from a session of their own (status): a
             member that fell share_lag behind, or started an epoch after the others.

The report ends with the issue's targets, each `met` or `MISSED`: shared aggregate batches/s
at N = 4 >= 3.5 x one trainer's (alone, N = 1); the daemon's CPU and the bytes it holds flat in
N for shared trainers (N = 8 within 1.5 x of N = 1); the shared trainers' step overhead <= 5%
(what node.py holds a node's sessions to).

  python3 bench/share.py [--gib 2] [--n 1,2,4,8] [--steps 50] [--tight-s 1.5]
                         [--pool off,on] [--data DIR] [--json OUT]

Progress goes to stderr, the report to stdout.  Exit status 0 whether or not a target is met,
1 on a failed check or an error, 77 with no CUDA device.
"""

import json
import os
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import node  # noqa: E402 (after the path)
import train_step as ts  # noqa: E402

SEED = 7  # every trainer's, as a sweep's
# The phases' first epochs: members of a share start each epoch alike.
TIGHT_EPOCH, EAGER_EPOCH, CHECK_EPOCH = 1000, 2000, 3000


def log(msg):
    sys.stderr.write("share: %s\n" % msg)
    sys.stderr.flush()


def held(st):
    """(pinned, device) bytes the daemon holds for its sessions, from one status."""
    sess = st.get("sessions") or []
    dev = sum(s.get("device_bytes", 0) for s in sess)
    host = sum(s.get("arena_bytes", 0) for s in sess) - dev
    return st.get("ring_used", 0) + host, dev


class Sampler:
    """Samples the daemon's status in a thread until stop(): the most each was."""

    def __init__(self, d):
        self.d, self.pinned, self.device, self.pool = d, 0, 0, 0
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.halt.is_set():
            try:
                st = self.d.status()
            except (OSError, ValueError):
                st = {}
            p, dv = held(st)
            self.pinned, self.device = max(self.pinned, p), max(self.device, dv)
            pool = sum(x.get("bytes", 0) for x in st.get("pools") or [])
            self.pool = max(self.pool, pool)
            self.halt.wait(0.2)

    def stop(self):
        self.halt.set()
        self.thread.join()


def alone_batches(d, name):
    for sh in d.status().get("shares") or []:
        if sh.get("name") == name:
            return sum(m.get("own_batches", 0) for m in sh.get("members") or []), \
                sum(m.get("dropped", 0) for m in sh.get("members") or [])
    return 0, 0


def run_one(args, data, d, n, pool, shared):
    name = "sweep-%s-%d" % (pool, n) if shared else ""
    t = node.Trainers(args, data, d.sock, n, share=name, seed=SEED)
    alone = [0, 0]
    try:
        samp = Sampler(d)
        c0, w0 = node.daemon_cpu_s(d.proc.pid), time.perf_counter()
        tight = t.phase("tight %d" % TIGHT_EPOCH)
        wall = time.perf_counter() - w0
        dcpu = node.daemon_cpu_s(d.proc.pid) - c0
        samp.stop()
        if shared:
            alone = list(alone_batches(d, name))
        compute = t.phase("compute")
        eager = t.phase("eager %d" % EAGER_EPOCH)
        checks = t.phase("check %d" % CHECK_EPOCH)
        if shared:
            a, dr = alone_batches(d, name)
            alone = [a + alone[0], max(dr, alone[1])]
    finally:
        t.close()
    bad = [c["err"] for c in checks if not c["ok"]]
    if bad:
        raise SystemExit("share: pool=%s N=%d %s: a check failed: %s"
                         % (pool, n, "shared" if shared else "alone", bad[0]))
    nbytes = sum(r["bytes"] for r in tight)
    return {"n": n, "pool": pool, "shared": shared,
            "batches_s": nbytes / node.BATCH_BYTES / wall, "gbs": nbytes / wall / 1e9,
            "daemon_cores": dcpu / wall, "pinned": samp.pinned, "device": samp.device,
            "pool_bytes": samp.pool,
            "overhead": [e["step_s"] / c["step_s"] - 1 for e, c in zip(eager, compute)],
            "cpu_us": [(e["cpu_s"] - c["cpu_s"]) * 1e6 for e, c in zip(eager, compute)],
            "compute_us": [c["step_s"] * 1e6 for c in compute],
            "alone_batches": alone[0], "dropped": alone[1]}


def mib(x):
    return x / 1048576.0


def report(res):
    print("share.py: trainers of one seed on one GPU, 5 MiB batches, default configuration")
    print("%-5s %-6s %3s %9s %8s %7s %10s %10s %9s %8s %8s %8s" % (
        "pool", "mode", "N", "batch/s", "GB/s", "dcores", "pinnedMiB", "deviceMiB", "poolMiB",
        "step+%", "cpu_us", "alone_b"))
    for r in res:
        print("%-5s %-6s %3d %9.0f %8.2f %7.3f %10.1f %10.1f %9.1f %8.2f %8.1f %8s" % (
            r["pool"], "shared" if r["shared"] else "alone", r["n"], r["batches_s"], r["gbs"],
            r["daemon_cores"], mib(r["pinned"]), mib(r["device"]), mib(r["pool_bytes"]),
            100 * max(r["overhead"]), max(r["cpu_us"]),
            "%d" % r["alone_batches"] if r["shared"] else "-"))
    print("(batch/s, GB/s: all trainers' together; dcores: the daemon's CPU over the tight "
          "phase; pinned, device: the most the daemon held for sessions in it; step+%: the "
          "worst trainer's eager overhead against its own compute-only step with the same N; "
          "cpu_us: its CPU beyond it (at N >= 2 the GPU is shared and this means little); "
          "alone_b: batches members got from sessions of their own)")
    for pool in ("off", "on"):
        one = [r for r in res if r["pool"] == pool and not r["shared"] and r["n"] == 1]
        sh = sorted((r for r in res if r["pool"] == pool and r["shared"]), key=lambda r: r["n"])
        if not sh:
            continue
        four = [r for r in sh if r["n"] == 4]
        if one and four:
            x = four[0]["batches_s"] / one[0]["batches_s"]
            print("aggregate shared N=4 pool=%s: %.2f x one trainer's (%.0f of %.0f batch/s; "
                  "target >= 3.5): %s" % (pool, x, four[0]["batches_s"], one[0]["batches_s"],
                                          node.verdict(x >= 3.5)))
        lo, hi = sh[0], sh[-1]
        if hi["n"] > lo["n"]:
            c = hi["daemon_cores"] / max(lo["daemon_cores"], 1e-9)
            b = (hi["pinned"] + hi["device"]) / max(lo["pinned"] + lo["device"], 1)
            print("daemon CPU shared pool=%s: N=%d %.3f cores, N=%d %.3f, ratio %.2f (flat: "
                  "<= 1.5): %s" % (pool, hi["n"], hi["daemon_cores"], lo["n"],
                                   lo["daemon_cores"], c, node.verdict(c <= 1.5)))
            print("bytes held shared pool=%s: N=%d %.1f MiB, N=%d %.1f MiB, ratio %.2f (flat: "
                  "<= 1.5): %s" % (pool, hi["n"], mib(hi["pinned"] + hi["device"]), lo["n"],
                                   mib(lo["pinned"] + lo["device"]), b, node.verdict(b <= 1.5)))
        w = max(max(r["overhead"]) for r in sh)
        wa = [max(r["overhead"]) for r in res if r["pool"] == pool and not r["shared"]]
        print("step overhead shared pool=%s: worst trainer %.1f%% (alone: worst %.1f%%; target "
              "<= 5%%): %s" % (pool, 100 * w, 100 * max(wa) if wa else float("nan"),
                               node.verdict(w <= 0.05)))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = node.parse_args(["--n", "1,2,4,8", "--steps", "50"] + argv)
    if node.cuda_torch(log) is None:
        return 77
    data = ts.prepare_data(args)
    res = []
    with tempfile.TemporaryDirectory() as tmp:
        for pool in args.pool.split(","):
            d = ts.Daemon(args, tmp, data, "\n".join(args.daemon_lines.split(";")),
                          pool == "on", "share-" + pool)
            try:
                if pool == "on":
                    node.fill_pool(args, data, d)
                for n in (int(x) for x in args.n.split(",")):
                    for shared in (False, True):
                        log("pool=%s N=%d %s" % (pool, n, "shared" if shared else "alone"))
                        r = run_one(args, data, d, n, pool, shared)
                        log("  %.0f batch/s, daemon %.3f cores, pinned %.1f MiB, device %.1f "
                            "MiB, worst step +%.1f%%, alone %d" % (
                                r["batches_s"], r["daemon_cores"], mib(r["pinned"]),
                                mib(r["device"]), 100 * max(r["overhead"]),
                                r["alone_batches"]))
                        res.append(r)
            finally:
                d.stop()
    report(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": res}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
