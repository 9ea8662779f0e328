#!/usr/bin/env python3
"""eager_step.py — what prefetchd costs an eager PyTorch trainer whose CPU runs ahead (issue 33).

train_step.py's step is two big matmuls: the trainer's CPU idles while the GPU works, so a
loader that makes the CPU wait (a synchronize, a spin on an event) costs nothing there.  Here
each step is a real eager training step, forward, backward, optimizer.step() and
zero_grad(set_to_none=True), most of them launch-bound: the CPU queues kernels as fast as it
can, and whatever time the loader keeps it comes off the GPU's queue.  One run on a GPU
machine, every figure against a reference measured in the same run.

  mlp        Linear(1024, 4096) -> GELU -> Linear(4096, 1024), MSE against the input,
             AdamW(fused=True), float32 with TF32 matmuls allowed (allow_tf32 = True: the
             GPU's share small, the step launch-bound-ish); batches of 1024 shuffled rows of
             1024 float32 (4 MiB) from a .npy of --gib GiB (default 1) in the page cache
             (train_step.py's data).
  mlp-wide   the same with hidden 16384: GPU-heavier.
  gpt-small  token and learned position embeddings, 2 pre-LN blocks (causal
             F.scaled_dot_product_attention, MLP 4x with GELU), a final LayerNorm, the head
             tied to the embedding; vocab 50304, width 128, 4 heads, 4 x 256 tokens a batch;
             bf16 autocast, cross-entropy, AdamW(fused=True).  Launch-bound.
  gpt        6 layers, width 512, 8 heads, 8 x 1024 tokens.  GPU-bound.
             Tokens: llm.c shards written here (4 a dataset, random tokens < 50257 from a
             fixed seed, uneven lengths, tails too short for a window), a `format = tokens`
             dataset: 256 batches an epoch for gpt-small, 96 for gpt.  The u2 field becomes
             int64 on the GPU; inputs [:, :-1], targets [:, 1:].
  graph      the mlp step captured whole in a CUDA graph (PyTorch's whole-network recipe:
             warm-up on a side stream, forward, backward and AdamW(capturable=True) captured);
             per batch static_x.copy_(x) and replay().  Warm epochs only.

  compute    the step over 16 batches of the dataset already on the GPU, the CPU queueing
             ahead as a trainer's does, an epoch's number of steps, with the process's CPU
             time a step (time.process_time(): all its threads, the trainer's CPU).  A
             launch-bound step's time drifts by tens of percent within a minute on a shared
             machine (bench/NOTES.md, run 59), so every timed epoch is held against a
             compute-only run of as many steps just before it; the first epochs against the
             median of 3 reps before the loaders and 2 after.
  pool=off   prefetchd with `pool = off`, otherwise its default configuration, through
             python/prefetch's Loader on cuda:0: the first epoch after Loader() (timed from
             before the constructor), then --epochs (3) timed epochs.
  pool=on    the default configuration: the first epoch (cold: it fills the VRAM pool), a
             wait until the pool holds the dataset, --epochs timed warm epochs; then a new
             Loader on the same daemon (the pool lingers) and its first epoch, from Loader().
  figures    per epoch: step (wall time over batches, one synchronize at each end),
             overhead (step / compute - 1), the trainer's CPU-us per batch beyond
             compute-only's per step, the time inside the Loader's __next__ per batch.
             Every epoch is printed, and the median of the timed ones.
  checks     one more epoch of every Loader, without the step: every pick delivered exactly
             once; the float64 sum of all delivered rows (npy) or int64 sum of all tokens
             equal to the files'; every 32nd batch's first and last rows (npy) or all its
             windows (tokens) equal to the file bytes its picks name.  A failed check prints
             what differed and makes the exit status 1.

The report ends with the issue's targets, each `met` or `MISSED`: `eager overhead pool=off`
and `pool=on` (<= 2%), `eager first epoch` (<= 5%), `eager trainer cpu beyond compute-only`
(<= 20 us a batch), `eager graph` (<= 0%, or within the compute-only reps' spread).

  python3 bench/eager_step.py [--gib 1] [--epochs 3] [--only mlp,gpt-small,..] [--skip-graph]
                              [--data DIR] [--prefetchd-bin build/prefetchd] [--json OUT]

Progress goes to stderr, the report to stdout.  Exit status 0 whether or not a target is met,
1 on a failed check or an error, 77 with no CUDA device.  About 2 minutes on an H100.
"""

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, HERE)
import train_step as ts  # noqa: E402 (after the path)

DEVICE = "cuda:0"
ROW = ts.ROW_FLOATS
TOKEN_SEED = 33
GPT2_TOKENS = 50257  # what llm.c's GPT-2 shards hold
VOCAB = 50304  # padded to a multiple of 128, as llm.c and nanoGPT do
COMPUTE_REPS = (3, 2)  # before the loaders, after them
CHECK_EVERY = 32
POOL_WAIT_S = 20
BREAKDOWN = False  # --breakdown: where the time inside __next__ and b[field] goes

# Token shards: windows per shard (their sum a multiple of the batch, so every batch is
# whole) and tokens past the last whole window, up to seq_len - 1, so that a check that let
# windows run across shards, or ignored a shard's tail, would fail.
SHARD_WINDOWS = {256: (300, 212, 256, 256), 1024: (200, 184, 192, 192)}
SHARD_TAILS = (0, 17, -1, 100)  # -1: seq_len - 1

WORKLOADS = {
    "mlp": {"data": "npy", "hidden": 4096},
    "mlp-wide": {"data": "npy", "hidden": 16384},
    "gpt-small": {"data": "tokens", "seq": 256, "batch": 4, "layers": 2, "width": 128,
                  "heads": 4},
    "gpt": {"data": "tokens", "seq": 1024, "batch": 8, "layers": 6, "width": 512, "heads": 8},
    "graph": {"data": "npy", "hidden": 4096},
}
EAGER = ("mlp", "mlp-wide", "gpt-small", "gpt")


def log(msg):
    sys.stderr.write("eager_step: %s\n" % msg)
    sys.stderr.flush()


# train_step's helpers (prepare_data) log through its module's log: say it under this name.
ts.log = log


class CheckFailed(Exception):
    """A delivered batch, or an epoch's picks, differ from the files."""


# ---- data ---------------------------------------------------------------------------------


def npy_dataset(args):
    """train_step's .npy (float32 rows of 1024), read once into the page cache."""
    d = ts.prepare_data(args)
    d.update(kind="npy", dataset="bench", field="x", batch=ts.BATCH_ROWS, samples=d["rows"],
             batches=d["rows"] // ts.BATCH_ROWS)
    return d


def token_dataset(tmp, seq, batch):
    """llm.c shards for seq_len `seq` in a directory of their own, written afresh (a few MB),
    then read back from the files: the checks compare against what the daemon reads."""
    import numpy as np
    d = os.path.join(tmp, "tok-s%d" % seq)
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(TOKEN_SEED + seq)
    for k, w in enumerate(SHARD_WINDOWS[seq]):
        toks = rng.integers(0, GPT2_TOKENS, size=w * seq + 1 + SHARD_TAILS[k] % seq,
                            dtype=np.uint16)
        head = np.zeros(256, dtype="<i4")  # magic, version 1 (uint16 tokens), count
        head[:3] = 20240520, 1, toks.size
        with open(os.path.join(d, "shard_%03d.bin" % k), "wb") as f:
            f.write(head.tobytes() + toks.astype("<u2").tobytes())
    pattern = os.path.join(d, "shard_*.bin")
    shards, first, windows, total = [], [], 0, 0
    for path in sorted(glob.glob(pattern)):  # the daemon takes them in name order too
        t = np.fromfile(path, dtype="<u2", offset=1024)
        w = (t.size - 1) // seq
        shards.append(t)
        first.append(windows)
        windows += w
        # Every window's tokens: each shard's whole windows, plus the tokens two windows
        # share (a window's last token is the next one's first).
        c = t[:w * seq + 1].astype(np.int64)
        total += int(c.sum()) + int(c[seq:w * seq:seq].sum())
    log("token shards for seq_len %d: %d shards, %d windows, %d tokens in %s"
        % (seq, len(shards), windows, sum(len(x) for x in shards), d))
    return {"kind": "tokens", "dataset": "tok", "field": "tokens", "batch": batch, "seq": seq,
            "pattern": pattern, "shards": shards, "first": first, "sum": total,
            "samples": windows, "batches": windows // batch}


def token_window(ds, s):
    """Window s as the daemon defines it (daemon/data/dataset.c load_tokens): windows never cross
    shards; window j of a shard is its tokens [j * seq_len, j * seq_len + seq_len]."""
    import numpy as np
    k = int(np.searchsorted(ds["first"], s, side="right")) - 1
    j = s - ds["first"][k]
    seq = ds["seq"]
    return ds["shards"][k][j * seq:j * seq + seq + 1]


def dataset_of(ctx, name):
    """The workload's dataset, made on first use (the mlp steps share the .npy)."""
    wl = WORKLOADS[name]
    key = wl["data"] + str(wl.get("seq", ""))
    if key not in ctx["datasets"]:
        ctx["datasets"][key] = (npy_dataset(ctx["args"]) if wl["data"] == "npy" else
                                token_dataset(ctx["tmp"], wl["seq"], wl["batch"]))
    return ctx["datasets"][key]


class TokenDaemon(ts.Daemon):
    """train_step's Daemon serving a `format = tokens` dataset named tok instead."""

    def __init__(self, args, tmpdir, ds, pool, tag):
        self.sock = os.path.join(tmpdir, "pf-%s.sock" % tag)
        self.conf = os.path.join(tmpdir, "pf-%s.conf" % tag)
        self.log_path = os.path.join(tmpdir, "pf-%s.log" % tag)
        self.keep = None
        with open(self.conf, "w") as f:
            f.write("# bench/eager_step.py: %s\n[daemon]\nsocket = %s\n\n[dataset.tok]\n"
                    "format = tokens\nshards = %s\nseq_len = %d\npool = %s\n"
                    % (tag, self.sock, ds["pattern"], ds["seq"], "on" if pool else "off"))
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen([args.prefetchd_bin, "-c", self.conf],
                                         stdin=subprocess.DEVNULL, stdout=logf,
                                         stderr=subprocess.STDOUT, close_fds=True)
        ts.wait_listening(self.proc, self.sock, self.tail)


def start_daemon(ctx, ds, pool, tag):
    if ds["kind"] == "npy":
        return ts.Daemon(ctx["args"], ctx["tmp"], ds, "", pool, tag)
    return TokenDaemon(ctx["args"], ctx["tmp"], ds, pool, tag)


def gpu_batches(torch, ds, n=16):
    """n batches of random picks, built from the files and put on the GPU: the compute-only
    step's inputs, of the dtype and shape the Loader delivers."""
    import numpy as np
    rng = np.random.default_rng(5)
    out = []
    for _ in range(n):
        picks = np.sort(rng.choice(ds["samples"], ds["batch"], replace=False))
        if ds["kind"] == "npy":
            arr = np.ascontiguousarray(ds["mm"][picks])
        else:
            arr = np.stack([token_window(ds, int(p)) for p in picks])
        try:
            t = torch.from_numpy(arr).to(DEVICE)
        except TypeError:  # a torch without uint16 from numpy: the same bits as int16
            t = torch.from_numpy(arr.view(np.int16)).to(DEVICE).view(torch.uint16)
        out.append(t)
    torch.cuda.synchronize()
    return out


# ---- the steps ----------------------------------------------------------------------------


def mlp_model(torch, hidden):
    nn = torch.nn
    return nn.Sequential(nn.Linear(ROW, hidden), nn.GELU(), nn.Linear(hidden, ROW)).to(DEVICE)


class MlpStep:
    def __init__(self, torch, hidden):
        self.model = mlp_model(torch, hidden)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=True)
        self.mse = torch.nn.functional.mse_loss

    def __call__(self, x):
        loss = self.mse(self.model(x), x)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def token_ids(torch):
    """u2 -> int64 on the GPU; torch builds whose uint16 lacks the cast go through int16."""
    try:
        torch.empty(2, dtype=torch.uint16, device=DEVICE).to(torch.int64)
        return lambda t: t.to(torch.int64)
    except (RuntimeError, TypeError, AttributeError):
        return lambda t: t.view(torch.int16).to(torch.int64) & 0xFFFF


def gpt_model(torch, seq, width, layers, heads):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, heads, C // heads).permute(2, 0, 3,
                                                                                     1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, width), nn.Embedding(seq, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(width)
            self.head = nn.Linear(width, VOCAB, bias=False)
            self.head.weight = self.wte.weight  # tied
            for e in (self.wte, self.wpe):  # GPT-2's init: a loss near ln(vocab) at start
                nn.init.normal_(e.weight, std=0.02)
            self.register_buffer("pos", torch.arange(seq), persistent=False)

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(self.pos[:idx.shape[1]])
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln_f(x))

    return Gpt().to(DEVICE)


class GptStep:
    def __init__(self, torch, wl):
        self.torch = torch
        self.model = gpt_model(torch, wl["seq"], wl["width"], wl["layers"], wl["heads"])
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4, weight_decay=0.1,
                                     fused=True)
        self.ids = token_ids(torch)
        self.ce = torch.nn.functional.cross_entropy

    def __call__(self, t):
        idx = self.ids(t)
        inp, tgt = idx[:, :-1], idx[:, 1:]
        with self.torch.autocast("cuda", dtype=self.torch.bfloat16):
            logits = self.model(inp)
            loss = self.ce(logits.reshape(-1, VOCAB), tgt.reshape(-1))
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


class GraphStep:
    """The mlp step captured whole (torch.cuda.graphs' whole-network capture): a static input,
    grads allocated inside the capture, AdamW(capturable=True), fused, or foreach where this
    torch cannot capture the fused one."""

    def __init__(self, torch, hidden):
        err = None
        for kind in ("fused", "foreach"):
            try:
                self._capture(torch, hidden, kind)
                self.kind = kind
                return
            except (RuntimeError, TypeError, ValueError) as e:
                log("graph: AdamW(%s=True, capturable=True) could not be captured: %s"
                    % (kind, e))
                err = e
        raise err

    def _capture(self, torch, hidden, kind):
        self.model = model = mlp_model(torch, hidden)
        self.opt = opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=True,
                                           **{kind: True})
        mse = torch.nn.functional.mse_loss
        self.x = x = torch.randn(ts.BATCH_ROWS, ROW, device=DEVICE)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture's stream, as the recipe says
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                mse(model(x), x).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(side)
        self.g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)  # so that backward allocates .grad in the graph's pool
        with torch.cuda.graph(self.g):
            self.loss = mse(model(x), x)
            self.loss.backward()
            opt.step()
        torch.cuda.synchronize()

    def __call__(self, x):
        self.x.copy_(x)
        self.g.replay()


def make_step(torch, name):
    wl = WORKLOADS[name]
    torch.manual_seed(33)
    if name == "graph":
        return GraphStep(torch, wl["hidden"])
    if wl["data"] == "npy":
        return MlpStep(torch, wl["hidden"])
    return GptStep(torch, wl)


# ---- timing -------------------------------------------------------------------------------


def compute_runs(torch, step, xs, steps, reps, warm=0):
    """reps runs of `steps` steps over the GPU-resident batches xs (after `warm` untimed
    steps): (wall s per step, CPU s per step) each."""
    pc, cpu = time.perf_counter, time.process_time
    for i in range(warm):
        step(xs[i % len(xs)])
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0, c0 = pc(), cpu()
        for i in range(steps):
            step(xs[i % len(xs)])
        torch.cuda.synchronize()
        out.append(((pc() - t0) / steps, (cpu() - c0) / steps))
    return out


def run_epoch(torch, loader, n, step, field, start=None):
    """Epoch n of the training loop, timed: wall and CPU seconds, batches, and the seconds
    spent inside the Loader's __next__.  start: (wall, CPU) clocks read before Loader(), for
    the first epoch after it; else read here, after a synchronize."""
    pc, cpu = time.perf_counter, time.process_time
    if start is None:
        torch.cuda.synchronize()
        start = (pc(), cpu())
    timer = None
    if BREAKDOWN:
        timer = loader._libref = ts.PfNextTimer(loader._libref)
    it = iter(loader.epoch(n))
    inside, field_s, nb = 0.0, 0.0, 0
    try:
        while True:
            t0 = pc()
            b = next(it, None)
            inside += pc() - t0
            if b is None:
                break
            if timer is None:
                step(b[field])
            else:
                t0 = pc()
                x = b[field]
                field_s += pc() - t0
                step(x)
            nb += 1
        torch.cuda.synchronize()
    finally:
        if timer is not None:
            loader._libref = timer._lib
    out = {"epoch": n, "wall_s": pc() - start[0], "cpu_s": cpu() - start[1], "batches": nb,
           "next_s": inside}
    if timer is not None:
        out.update(c_s=timer.inside, c_cpu_s=timer.inside_cpu, field_s=field_s)
    return out


def wait_pool(d, ds):
    """Until the pool holds every sample; a tokens pool, until its rows also stop growing for
    a second (what it counts of a window is the daemon's business); POOL_WAIT_S at most."""
    deadline = time.monotonic() + POOL_WAIT_S
    last, since = None, time.monotonic()
    while True:
        rows = ((d.status().get("pools") or [{}])[0]).get("rows") or 0
        if rows >= ds["samples"] or time.monotonic() > deadline:
            break
        if rows != last:
            last, since = rows, time.monotonic()
        elif ds["kind"] == "tokens" and rows and time.monotonic() - since >= 1.0:
            break
        time.sleep(0.2)
    if rows < ds["samples"]:
        log("pool holds %d of %d samples after the first epoch" % (rows, ds["samples"]))
    return rows


# ---- checks -------------------------------------------------------------------------------


def host(x):
    """A batch's field as a numpy array (a host Loader's already is one)."""
    if hasattr(x, "__array_interface__") or not hasattr(x, "cpu"):
        return x
    try:
        return x.cpu().numpy()
    except (TypeError, RuntimeError):  # uint16 without numpy support in this torch
        import numpy as np
        import torch
        return x.view(torch.int16).cpu().numpy().view(np.uint16)


def delivered_sum(x, tokens, ids):
    """Of a batch's field: on the GPU for a CUDA batch (no synchronize a batch), numpy's for
    a host one; float64 for rows, int64 (exact) for tokens."""
    if hasattr(x, "double"):
        return ids(x).sum() if tokens else x.double().sum()
    return int(x.sum(dtype="i8")) if tokens else x.sum(dtype="f8")


def verify(ctx, loader, ds, n):
    """Epoch n without the step: every pick once; the sum of everything delivered equal to
    the files'; every 32nd batch against the files (npy: its first and last rows; tokens: all
    its windows, at the shard bytes the picks name)."""
    import numpy as np
    tokens = ds["kind"] == "tokens"
    picks, acc = [], 0
    for i, b in enumerate(loader.epoch(n)):
        x = b[ds["field"]]
        acc = acc + delivered_sum(x, tokens, ctx.get("ids"))
        p = b.picks.astype(np.int64)
        picks.append(p)
        if i % CHECK_EVERY:
            continue
        sel = list(range(b.count)) if tokens else [0, b.count - 1]
        got = host(x if tokens else x[sel])
        want = (np.stack([token_window(ds, int(p[r])) for r in sel]) if tokens
                else ds["mm"][p[sel]])
        if got.shape != want.shape:
            raise CheckFailed("epoch %d batch %d: shape %s, expected %s"
                              % (n, i, got.shape, want.shape))
        if not np.array_equal(got, want):
            r, c = [int(v[0]) for v in np.nonzero(got != want)]
            raise CheckFailed("epoch %d batch %d: row %d (%s %d), %s %d is %r, the %s %r" % (
                n, i, sel[r], "window" if tokens else "pick", p[sel[r]],
                "token" if tokens else "column", c, got[r, c],
                "shard has" if tokens else "file has", want[r, c]))
    if not picks:
        raise CheckFailed("epoch %d: no batch delivered" % n)
    seen = np.bincount(np.concatenate(picks), minlength=ds["samples"])
    bad = np.flatnonzero(seen != 1)
    if bad.size:
        raise CheckFailed("epoch %d: %d of %d samples not delivered exactly once (sample %d "
                          "%d times%s)" % (n, bad.size, ds["samples"], bad[0], seen[bad[0]],
                                           ", and more" if bad.size > 1 else ""))
    got = int(acc) if tokens else float(acc)
    if (got != ds["sum"] if tokens else
            abs(got - ds["sum"]) > 1e-6 * max(1.0, abs(ds["sum"])) + 1e-3):
        raise CheckFailed("epoch %d: what was delivered sums to %r, the files to %r"
                          % (n, got, ds["sum"]))
    return "every pick once, %s sum %s = the files', batches 0, %d, .. equal to them" % (
        "int64" if tokens else "float64", got if tokens else "%.3f" % got, CHECK_EVERY)


# ---- one workload -------------------------------------------------------------------------


def loader_runs(ctx, name, ds, step, pool, xs):
    """One daemon; a Loader's first epoch, the timed epochs and a checked one; with the pool,
    then a new Loader's first epoch (warm pool) and a checked one."""
    import prefetch
    torch, epochs = ctx["torch"], ctx["args"].epochs
    tag = "%s-%s" % (name, "on" if pool else "off")
    d = start_daemon(ctx, ds, pool, tag)
    out = {}

    def opened(what):
        torch.cuda.synchronize()
        start = (time.perf_counter(), time.process_time())
        loader = prefetch.Loader(ds["dataset"], batch_size=ds["batch"], device=DEVICE,
                                 shuffle=True, seed=7, socket=d.sock,
                                 name="eager_step-%s-%s" % (tag, what), timeout=120)
        return loader, start

    try:
        loader, start = opened("a")
        with loader:
            out["open_ms"] = (time.perf_counter() - start[0]) * 1e3
            out["first"] = run_epoch(torch, loader, 0, step, ds["field"], start)
            if pool:
                out["pool_rows"] = wait_pool(d, ds)
            # Each timed epoch right after a compute-only run of as many steps: a
            # launch-bound step's time drifts by tens of percent within a minute on
            # these shared machines, so each epoch is held against its neighbour.
            out["timed"] = []
            for e in range(1, epochs + 1):
                ref = compute_runs(torch, step, xs, ds["batches"], 1)[0]
                ep = run_epoch(torch, loader, e, step, ds["field"])
                ep["ref"] = {"step_s": ref[0], "cpu_s": ref[1]}
                out["timed"].append(ep)
            out["check"] = verify(ctx, loader, ds, epochs + 1)
        if pool and name != "graph":
            loader, start = opened("b")
            with loader:
                out["relaunch_open_ms"] = (time.perf_counter() - start[0]) * 1e3
                out["relaunch"] = run_epoch(torch, loader, epochs + 2, step, ds["field"],
                                            start)
                out["check_relaunch"] = verify(ctx, loader, ds, epochs + 3)
    finally:
        d.stop()
    return out


def run_workload(ctx, name):
    torch = ctx["torch"]
    ds = dataset_of(ctx, name)
    step = make_step(torch, name)
    xs = gpu_batches(torch, ds)
    nb = ds["batches"]
    res = {"batches": nb, "loaders": {}}
    if name == "graph":
        res["optimizer"] = "AdamW(%s, capturable)" % step.kind
    t0 = time.perf_counter()
    runs = compute_runs(torch, step, xs, nb, COMPUTE_REPS[0], warm=32)
    log("%s: compute-only %.1f us/step (%d batches an epoch)"
        % (name, statistics.median(r[0] for r in runs) * 1e6, nb))
    for pool in (False, True):
        tag = "pool=on" if pool else "pool=off"
        res["loaders"][tag] = r = loader_runs(ctx, name, ds, step, pool, xs)
        log("%s %s: %s" % (name, tag, r["check"]))
    runs += compute_runs(torch, step, xs, nb, COMPUTE_REPS[1])
    res["compute_runs"] = runs
    res["compute"] = {"step_s": statistics.median(r[0] for r in runs),
                      "cpu_s": statistics.median(r[1] for r in runs)}
    res["seconds"] = time.perf_counter() - t0
    return res


# ---- the report ---------------------------------------------------------------------------


def metrics(ep, ref):
    n = ep["batches"]
    step = ep["wall_s"] / n
    m = {"step_us": step * 1e6, "overhead_pct": (step / ref["step_s"] - 1) * 100,
         "cpu_us_extra": (ep["cpu_s"] / n - ref["cpu_s"]) * 1e6,
         "next_us": ep["next_s"] / n * 1e6}
    for k in ("c_s", "c_cpu_s", "field_s"):
        if k in ep:
            m[k[:-2] + "_us"] = ep[k] / n * 1e6
    return m


def add_metrics(res):
    """Each epoch's figures against its workload's compute-only step, in place."""
    for r in res.values():
        if "compute" not in r:
            continue
        for L in r["loaders"].values():
            for key in ("first", "relaunch"):
                if key in L:
                    L[key]["m"] = metrics(L[key], r["compute"])
            for ep in L.get("timed", []):
                ep["m"] = metrics(ep, ep.get("ref", r["compute"]))
            if L.get("timed"):
                L["median"] = {k: statistics.median(ep["m"][k] for ep in L["timed"])
                               for k in L["timed"][0]["m"]}


def epoch_rows(name, r):
    """(workload, loader, epoch, metrics) for every row of the table."""
    for tag, L in r["loaders"].items():
        first = "warm-up" if name == "graph" else (
            "first, cold pool" if tag == "pool=on" else "first")
        if "first" in L:
            yield tag, "%s (Loader() %.0f ms)" % (first, L["open_ms"]), L["first"]["m"]
        for ep in L.get("timed", []):
            yield tag, "epoch %d" % ep["epoch"], ep["m"]
        if "median" in L:
            yield tag, "median of %d" % len(L["timed"]), L["median"]
        if "relaunch" in L:
            yield tag, "new Loader, warm (%.0f ms)" % L["relaunch_open_ms"], L["relaunch"]["m"]


def verdict(ok, near=False, noise=0.0):
    if ok:
        return "met"
    return "met (within the compute-only reps' spread, %.1f%%)" % noise if near else "MISSED"


def worst(head, items, unit, limit, target, note):
    """A summary line: the largest of items ((value, workload), ..) against its target."""
    if not items:
        return head + ": not measured"
    v, w = max(items)
    return "%s: max %.1f%s (%s, worst workload %s)  target <= %s: %s" % (
        head, v, unit, note, w, target, verdict(v <= limit))


def summary(res):
    """The closing lines, each with the issue's target."""
    eager = [w for w in EAGER if "compute" in res.get(w, {})]
    warm = [(w, tag, res[w]["loaders"][tag]["median"]) for w in eager
            for tag in ("pool=off", "pool=on") if "median" in res[w]["loaders"].get(tag, {})]
    firsts = [(L[key]["m"]["overhead_pct"], "%s, %s %s" % (w, tag, what)) for w in eager
              for tag, L in res[w]["loaders"].items()
              for key, what in (("first", "cold pool" if tag == "pool=on" else "first"),
                                ("relaunch", "new Loader, warm pool")) if key in L]
    lines = [worst("eager overhead " + t, [(m["overhead_pct"], w) for w, tag, m in warm
                                           if tag == t], "%", 2, "2%", "median of warm epochs")
             for t in ("pool=off", "pool=on")]
    lines.append(worst("eager first epoch", firsts, "%", 5, "5%", "first epoch after Loader()"))
    lines.append(worst("eager trainer cpu beyond compute-only",
                       [(m["cpu_us_extra"], "%s, %s" % (w, tag)) for w, tag, m in warm],
                       " us/batch", 20, "20 us", "median of warm epochs"))
    g = res.get("graph", {})
    meds = [g["loaders"][t].get("median") for t in ("pool=off", "pool=on")
            if "compute" in g]
    if len(meds) == 2 and all(meds):
        off, on = (m["overhead_pct"] for m in meds)
        steps = [s for s, _ in g["compute_runs"]]
        # "At or below compute-only within noise": the reps' own half-range, in percent.
        noise = (max(steps) - min(steps)) / 2 / g["compute"]["step_s"] * 100
        lines.append("eager graph: pool=off %.1f%% pool=on %.1f%%  target <= 0%%: %s"
                     % (off, on, verdict(max(off, on) <= 0.0, max(off, on) <= noise, noise)))
    else:
        lines.append("eager graph: not measured")
    return lines


def report(res, env):
    print("eager_step: %s" % env)
    fmt = "%-10s %-9s %-34s %9s %11s %13s %8s"
    print(fmt % ("workload", "loader", "epoch", "step_us", "overhead_%", "cpu_us_extra",
                 "next_us"))
    for name in WORKLOADS:
        r = res.get(name)
        if r is None:
            continue
        if "compute" not in r:
            print("%-10s failed: %s" % (name, r.get("error", "?")))
            continue
        c, steps = r["compute"], [s * 1e6 for s, _ in r["compute_runs"]]
        print("%-10s compute-only %.1f us/step (reps %.1f..%.1f), trainer CPU %.1f us/step; "
              "%d batches an epoch%s" % (name, c["step_s"] * 1e6, min(steps), max(steps),
                                         c["cpu_s"] * 1e6, r["batches"],
                                         ("; " + r["optimizer"]) if "optimizer" in r else ""))
        for tag, what, m in epoch_rows(name, r):
            print("%-10s %-9s %-34s %9.1f %11.2f %13.1f %8.1f%s" % (
                name, tag, what, m["step_us"], m["overhead_pct"], m["cpu_us_extra"],
                m["next_us"], "" if "c_us" not in m else
                "   in C %.1f us (CPU %.1f), b[field] %.1f us" % (m["c_us"], m["c_cpu_us"],
                                                              m["field_us"])))
        for tag, L in r["loaders"].items():
            print("%-10s %-9s check: %s" % (name, tag, L["check"]))
            if "check_relaunch" in L:
                print("%-10s %-9s check, new Loader: %s" % (name, tag, L["check_relaunch"]))
    for line in summary(res):
        print(line)


# ---- main ---------------------------------------------------------------------------------


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=1.0, help="the .npy dataset's size")
    ap.add_argument("--epochs", type=int, default=3, help="timed epochs per Loader")
    ap.add_argument("--only", default="", metavar="NAME[,NAME]",
                    help="workloads to run, of: " + ", ".join(WORKLOADS))
    ap.add_argument("--skip-graph", action="store_true")
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "pf-eager-step"))
    ap.add_argument("--prefetchd-bin", default=os.path.join(REPO, "build", "prefetchd"))
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time libprefetch's call and b[field] inside each batch (a "
                    "diagnostic: the timers add a few us a batch)")
    # What train_step's Daemon asks of its args.
    ap.set_defaults(diag=False, keep_logs=None)
    args = ap.parse_args(argv)
    names = [x for x in args.only.split(",") if x] or list(WORKLOADS)
    bad = [x for x in names if x not in WORKLOADS]
    if bad:
        ap.error("--only: unknown workload %s (of %s)" % (", ".join(bad), ", ".join(WORKLOADS)))
    if args.epochs < 1:
        ap.error("--epochs must be at least 1")
    args.names = [x for x in WORKLOADS if x in names and not (args.skip_graph and x == "graph")]
    return args


def main(argv=None):
    global BREAKDOWN
    args = parse_args(sys.argv[1:] if argv is None else argv)
    BREAKDOWN = args.breakdown
    import torch
    if not torch.cuda.is_available():
        log("no CUDA device: nothing to measure")
        return 77
    if not os.access(args.prefetchd_bin, os.X_OK):
        log("%s not found: run make first" % args.prefetchd_bin)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = True  # the mlp steps: launch-bound, see above
    torch.backends.cudnn.allow_tf32 = True
    t_start = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="pf-eager-step-")
    ctx = {"args": args, "torch": torch, "tmp": tmp, "datasets": {}, "ids": token_ids(torch)}
    env = "%s, torch %s, %d CPUs" % (torch.cuda.get_device_name(0), torch.__version__,
                                     len(os.sched_getaffinity(0)))
    res, failed = {}, False
    try:
        for name in args.names:
            try:
                log("%s: compute-only, then pool=off and pool=on" % name)
                res[name] = run_workload(ctx, name)
                log("%s done in %.1f s" % (name, res[name]["seconds"]))
            except CheckFailed as e:
                log("%s: CHECK FAILED: %s" % (name, e))
                res[name] = {"error": "check failed: %s" % e}
                failed = True
            except Exception as e:  # noqa: BLE001 - report it, go on with the others
                log("%s failed: %s: %s" % (name, type(e).__name__, e))
                res[name] = {"error": "%s: %s" % (type(e).__name__, e)}
                failed = True
            torch.cuda.empty_cache()  # the next workload's daemons probe free memory
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    add_metrics(res)
    report(res, env)
    log("whole run %.1f s" % (time.perf_counter() - t_start))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": env, "workloads": res, "summary": summary(res)}, f, indent=1,
                      default=str)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
