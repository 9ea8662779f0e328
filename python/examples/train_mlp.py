#!/usr/bin/env python3
"""train_mlp.py — a small real PyTorch training loop fed by prefetchd.

It trains an MLP on the demo dataset that `make run` serves (tools/demo.sh: dataset "demo",
field "images" u1 of shape (3, 32, 32), field "labels" i8), on the CPU through a host session
(numpy batches) or on a GPU through a CUDA session (torch tensors already on the device).

The task.  The demo images are random bytes and `labels` holds each sample's row id, so
neither "predict the label" nor anything else about the label can be learnt.  The target is
instead a deterministic function of the input that an MLP can learn: which colour channel is
brightest on average (class = argmax over the 3 channel means: 0 red, 1 green, 2 blue).  The
three classes are balanced, the rule is piecewise linear in the pixels, and chance is
ln(3) = 1.099 nats of loss and 33 % accuracy, so a loss going down means the model learns.

    make run                                   # writes run/ and its config (and stops)
    build/prefetchd -c run/prefetchd.conf &    # serve it (or pass --serve below)
    python3 python/examples/train_mlp.py [--epochs 3] [--device cpu|cuda:0] [--serve]

It prints the loss and accuracy of each epoch, then the loader's stall fraction (the share
of the time the trainer waited for data, from loader.stats()).  --serve starts
build/prefetchd -c run/prefetchd.conf itself when nothing answers on the socket, and stops it
at the end.
"""

import argparse
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def find_package():
    """Uses the repository's python/prefetch and build/libprefetch.so when they are there (an
    installed package and library are used otherwise)."""
    pydir = os.path.join(REPO, "python")
    if os.path.isdir(os.path.join(pydir, "prefetch")) and pydir not in sys.path:
        sys.path.insert(0, pydir)
    lib = os.path.join(REPO, "build", "libprefetch.so")
    if "PREFETCH_LIB" not in os.environ and os.path.exists(lib):
        os.environ["PREFETCH_LIB"] = lib


def answers(sock):
    import socket
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(sock)
        return True
    except OSError:
        return False
    finally:
        s.close()


def serve(sock):
    """Starts the demo daemon when nothing answers on sock; returns the process to stop."""
    if answers(sock):
        return None
    conf = os.path.join(REPO, "run", "prefetchd.conf")
    binary = os.path.join(REPO, "build", "prefetchd")
    if not os.path.exists(conf):
        sys.exit("train_mlp: no %s: run `make run` first" % conf)
    log = open(os.path.join(REPO, "run", "prefetchd.log"), "ab")
    proc = subprocess.Popen([binary, "-c", conf], stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT)
    log.close()
    deadline = time.monotonic() + 15
    while not answers(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            sys.exit("train_mlp: prefetchd did not come up on %s (see run/prefetchd.log; "
                     "the config's socket must be %s)" % (sock, sock))
        time.sleep(0.05)
    print("train_mlp: started prefetchd (pid %d) on %s" % (proc.pid, sock))
    return proc


def main():
    default_sock = os.environ.get("PREFETCHD_SOCKET") or os.path.join(REPO, "run",
                                                                       "prefetchd.sock")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", default=default_sock,
                   help="the daemon's socket (default: $PREFETCHD_SOCKET, else the repo's "
                        "run/prefetchd.sock, which `make run`'s config names)")
    p.add_argument("--dataset", default="demo")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--hidden", type=int, default=64, help="width of the first hidden layer")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None,
                   help="cpu, cuda or cuda:N (default: cuda:0 when torch sees a GPU, else cpu)")
    p.add_argument("--serve", action="store_true",
                   help="start build/prefetchd -c run/prefetchd.conf if the socket does not "
                        "answer, and stop it at the end")
    args = p.parse_args()

    find_package()
    import numpy as np
    import torch
    from torch import nn

    import prefetch

    if args.device is None:
        args.device = "cuda:0" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(args.seed)

    daemon = serve(args.socket) if args.serve else None
    try:
        # A CUDA session puts each batch in GPU memory: batch["images"] is then a uint8
        # tensor on `device`, read in place (no host copy, no .to()).  A host session gives a
        # read-only numpy view of the daemon's slot.
        loader = prefetch.Loader(args.dataset, batch_size=args.batch_size,
                                 device=str(device) if device.type == "cuda" else "cpu",
                                 shuffle=True, seed=args.seed, socket=args.socket,
                                 name="train_mlp")
        fields = {name: (dtype, shape) for name, dtype, shape in loader.fields}
        if "images" not in fields:
            sys.exit("train_mlp: dataset %r has no field 'images' (fields: %s)"
                     % (args.dataset, ", ".join(fields)))
        shape = tuple(fields["images"][1])
        if len(shape) != 3 or shape[0] != 3:
            sys.exit("train_mlp: expected images of shape (3, H, W), got %s" % (shape,))
        features = int(np.prod(shape))
        print("train_mlp: %d samples of images %s %s on %s, batch %d, %d epochs"
              % (loader.num_samples, fields["images"][0], shape, device, args.batch_size,
                 args.epochs))

        model = nn.Sequential(nn.Linear(features, args.hidden), nn.ReLU(),
                              nn.Linear(args.hidden, 32), nn.ReLU(),
                              nn.Linear(32, 3)).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
        loss_fn = nn.CrossEntropyLoss()

        losses = []
        for epoch in range(args.epochs):
            t0 = time.perf_counter()
            # Summed on the device; read once per epoch (a .item() per batch would make the
            # trainer wait for the GPU at every step).
            loss_sum = torch.zeros((), device=device)
            correct = torch.zeros((), dtype=torch.int64, device=device)
            seen = 0
            for batch in loader.epoch(epoch):
                images = batch["images"]
                if not isinstance(images, torch.Tensor):
                    # Host session: the view is valid only until the next batch is taken,
                    # so copy it out (the float conversion below copies anyway).
                    images = torch.from_numpy(np.array(images))
                x = images.float()
                # The target: the brightest colour channel of each image.
                y = x.mean(dim=(2, 3)).argmax(dim=1)
                x = x.flatten(1).div_(255.0).sub_(0.5)
                logits = model(x)
                loss = loss_fn(logits, y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                n = y.shape[0]
                loss_sum += loss.detach() * n
                correct += (logits.detach().argmax(dim=1) == y).sum()
                seen += n
            mean = loss_sum.item() / max(seen, 1)
            losses.append(mean)
            print("epoch %d: loss %.4f, accuracy %.3f, %d samples, %.2f s"
                  % (epoch, mean, correct.item() / max(seen, 1), seen,
                     time.perf_counter() - t0), flush=True)

        st = loader.stats()
        print("stall fraction: %.3f (waited %.2f s for batches in pf_next, %.2f s between "
              "them; %d batches)" % (st["stall_fraction"], st["wait_s"], st["busy_s"],
                                    st["batches"]))
        if len(losses) > 1:
            print("loss %s: %.4f in epoch 0, %.4f in epoch %d (chance: %.4f)"
                  % ("went down" if losses[-1] < losses[0] else "did NOT go down", losses[0],
                     losses[-1], len(losses) - 1, float(np.log(3))))
        loader.close()
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
