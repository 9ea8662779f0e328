#!/usr/bin/env python3
"""pool_linger.py — what a lingering VRAM pool gives a trainer that comes back (issue 17).

One run on a GPU machine, everything measured in the same run, with train_step.py's data (a
.npy of --gib GiB of 4 KiB float32 rows in the page cache, shuffled 4 MiB batches) and
prefetchd's default configuration (pool_linger 300 s) but for the keys named:

  restart   3 epochs, each in a new Python process with a new prefetch.Loader on cuda:0, as a
            job restarted after a crash or a script that makes a Loader per epoch does; tight
            loop (each batch's tensor taken, no compute).  Once with `pool = off`, once with
            the pool on.  An epoch's time runs from the first batch asked for to the end of
            the epoch (the process's start, CUDA's and the connection's are printed apart).
            With the pool on, epoch 1 fills the pool and the pool outlives the process:
            epochs 2 and 3 start from it.  Target: epochs 2 and 3 at least 4 times as fast
            as with the pool off.
  overflow  a dataset twice its pool's budget (`pool_bytes` = half the file): one Loader, a
            warm-up epoch (the pool fills to its cap), then 2 timed epochs, pool on against
            pool off.  Target: pool on at least 0.95 of pool off (what fits in no pool must
            not get slower for the pool's bookkeeping).

Every process checks an epoch after its timed one, with a second Loader (every pick once, the
float64 sum of every value equal to the file's, sampled rows equal); a failed check exits 1.

  python3 bench/pool_linger.py [--gib 4] [--data DIR] [--json OUT] [--skip restart,overflow]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train_step as ts  # noqa: E402 (after the path)

EPOCHS = 3


def log(msg):
    sys.stderr.write("pool_linger: %s\n" % msg)
    sys.stderr.flush()


def pool_of(status):
    pools = status.get("pools") or []
    return pools[0] if pools else {}


# ---- one trainer process ----------------------------------------------------------------


def child(args):
    """A new trainer: one Loader, one timed epoch (tight), one checked epoch; JSON on stdout."""
    t_start = time.perf_counter()
    import numpy as np
    import torch
    import prefetch
    torch.zeros(1, device="cuda:0")
    torch.cuda.synchronize()
    t_cuda = time.perf_counter()
    data = {"path": args.path, "rows": args.rows, "sum": args.sum,
            "mm": np.load(args.path, mmap_mode="r")}
    res = {}
    loader = prefetch.Loader("bench", batch_size=ts.BATCH_ROWS, device="cuda:0", shuffle=True,
                             seed=args.seed, socket=args.sock, name="pool_linger", timeout=120)
    with loader:
        t_open = time.perf_counter()
        for e in range(args.timed):
            n = 0
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            t_first = None
            for b in loader.epoch(args.epoch + e):
                b["x"]
                if t_first is None:
                    t_first = time.perf_counter()
                n += 1
            torch.cuda.synchronize()
            res.setdefault("epochs", []).append(time.perf_counter() - t0)
            res.setdefault("first_s", []).append(t_first - t0)
        st = json.loads(subprocess.run(
            [os.path.join(ts.REPO, "build", "prefetchctl"), "-s", args.sock, "status",
             "--json"], stdout=subprocess.PIPE, timeout=10).stdout.decode())
        mine = [s for s in st.get("sessions", []) if s.get("name") == "pool_linger"]
        res["h2d_bytes"] = mine[0].get("h2d_bytes") if mine else None
        res["pool_hits"] = mine[0].get("pool_hits") if mine else None
        res["hit_rate"] = pool_of(st).get("hit_rate")
    # The check in a Loader of its own, as a script that makes a Loader per epoch would:
    # the timed session's orders (its epoch's, and the next one built ahead) stay the
    # daemon's for the next process, not replaced by the check's.
    with prefetch.Loader("bench", batch_size=ts.BATCH_ROWS, device="cuda:0", shuffle=True,
                         seed=args.seed, socket=args.sock, name="pool_linger-check",
                         timeout=120) as check:
        res["check"] = ts.verify_epoch(torch, check, data, args.epoch + 100)
    res["batches"] = n
    res["start_s"] = t_cuda - t_start
    res["open_s"] = t_open - t_cuda
    json.dump(res, sys.stdout)
    return 0


def run_child(args, data, sock, epoch, timed=1):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--sock", sock, "--path",
           data["path"], "--rows", str(data["rows"]), "--sum", repr(data["sum"]), "--epoch",
           str(epoch), "--timed", str(timed), "--seed", "7"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    if p.returncode != 0 or args.diag:
        sys.stderr.write(p.stderr.decode("utf-8", "replace")[-4000:])
    if p.returncode != 0:
        raise SystemExit("pool_linger: a trainer process failed (exit %d)" % p.returncode)
    return json.loads(p.stdout.decode())


# ---- the two parts ----------------------------------------------------------------------


def restart(args, data, tmp):
    out = {}
    for tag, pool in (("pool=off", False), ("pool=on", True)):
        d = ts.Daemon(args, tmp, data, "", pool, "linger-" + tag.replace("=", ""))
        try:
            eps = []
            for e in range(1, EPOCHS + 1):
                r = run_child(args, data, d.sock, e)
                r["gbs"] = data["rows"] * ts.ROW_BYTES / r["epochs"][0] / 1e9
                eps.append(r)
                p = pool_of(d.status())
                r["pool_after"] = {k: p.get(k) for k in ("lingering", "rows", "bytes",
                                                         "linger_left_s")}
                log("%s epoch %d (new process): %.2f GB/s (first batch after %.1f ms), %s "
                    "sample bytes over PCIe, hit rate %s; pool after it: %s" % (
                        tag, e, r["gbs"], r["first_s"][0] * 1e3, r["h2d_bytes"],
                        r["hit_rate"], r["pool_after"]))
            out[tag] = eps
        finally:
            d.stop()
    return out


def overflow(args, data, tmp):
    out = {}
    cap = data["rows"] * ts.ROW_BYTES // 2
    for tag, pool in (("pool=off", False), ("pool=on", True)):
        d = ts.Daemon(args, tmp, data, "pool_bytes = %d\n" % cap, pool,
                      "overflow-" + tag.replace("=", ""))
        try:
            # Warm-up epoch 1 (the pool fills to its cap), then 2 timed epochs.
            r = run_child(args, data, d.sock, 1, timed=3)
            r["gbs"] = 2 * data["rows"] * ts.ROW_BYTES / sum(r["epochs"][1:]) / 1e9
            p = pool_of(d.status())
            r["pool"] = {k: p.get(k) for k in ("rows", "bytes", "budget", "hit_rate",
                                               "last_hit_rate")}
            log("%s, pool_bytes %.2f GiB: %.2f GB/s (epochs %s), pool %s" % (
                tag, cap / ts.GIB, r["gbs"], ["%.3f" % t for t in r["epochs"]], r["pool"]))
            out[tag] = r
        finally:
            d.stop()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "pf-train-step"))
    ap.add_argument("--prefetchd-bin", default=os.path.join(ts.REPO, "build", "prefetchd"))
    ap.add_argument("--skip", default="")
    ap.add_argument("--json")
    ap.add_argument("--diag", action="store_true")
    # the child's
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--sock")
    ap.add_argument("--path")
    ap.add_argument("--rows", type=int)
    ap.add_argument("--sum", type=float)
    ap.add_argument("--epoch", type=int)
    ap.add_argument("--timed", type=int, default=1)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    skip = set(filter(None, args.skip.split(",")))
    data = ts.prepare_data(args)
    tmp = tempfile.mkdtemp(prefix="pf-linger-")
    res = {}
    if "restart" not in skip:
        res["restart"] = restart(args, data, tmp)
    if "overflow" not in skip:
        res["overflow"] = overflow(args, data, tmp)
    ok = True
    if "restart" in res:
        print("restart: %d epochs, each a new process and Loader, tight loop (GB/s; process "
              "start and Loader open not counted):" % EPOCHS)
        for tag in ("pool=off", "pool=on"):
            eps = res["restart"][tag]
            print("  %-9s %s   (start %.2f s, open %.2f s, sample bytes over PCIe %s)" % (
                tag, "  ".join("e%d %7.2f" % (i + 1, r["gbs"]) for i, r in enumerate(eps)),
                eps[-1]["start_s"], eps[-1]["open_s"],
                " / ".join(str(r["h2d_bytes"]) for r in eps)))
        off, on = res["restart"]["pool=off"], res["restart"]["pool=on"]
        t_off = sum(r["epochs"][0] for r in off[1:])
        t_on = sum(r["epochs"][0] for r in on[1:])
        speed = t_off / t_on
        met = speed >= 4
        ok = ok and met
        print("epochs 2-3, pool on over pool off: %.2f x faster (target >= 4: %s); pool on "
              "hit rate %s" % (speed, "met" if met else "missed",
                               " / ".join(str(r["hit_rate"]) for r in on[1:])))
        res["restart_speedup"] = speed
    if "overflow" in res:
        off, on = res["overflow"]["pool=off"], res["overflow"]["pool=on"]
        ratio = on["gbs"] / off["gbs"]
        met = ratio >= 0.95
        print("overflow: dataset %.2f GiB, pool_bytes %.2f GiB: pool off %.2f GB/s, pool on "
              "%.2f GB/s (%s of %s rows resident, hit rate %s): %.3f of pool off (target >= "
              "0.95: %s)" % (data["rows"] * ts.ROW_BYTES / ts.GIB,
                             data["rows"] * ts.ROW_BYTES / 2 / ts.GIB, off["gbs"], on["gbs"],
                             on["pool"]["rows"], data["rows"], on["pool"]["last_hit_rate"],
                             ratio, "met" if met else "missed"))
        res["overflow_ratio"] = ratio
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
