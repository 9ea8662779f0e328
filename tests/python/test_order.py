"""python/prefetch/order.py, the reference implementation of the epoch
order, against the daemon's own (daemon/order.c, through build/pforder) on
1000 random (seed, epoch, N, rank, world) cases, plus the README's test
vectors.  No daemon and no numpy needed.
"""

import os
import random
import subprocess
import unittest

import pfutil
from prefetch import order

PFORDER = os.environ.get("PFORDER_BIN") or os.path.join(pfutil.ROOT, "build", "pforder")


def c_orders(cases):
    """The daemon's picks for each (seed, n, rank, world), in one run."""
    text = "".join("%d %d %d %d\n" % c for c in cases)
    out = subprocess.run([PFORDER], input=text, capture_output=True, text=True, check=True,
                         timeout=300).stdout.splitlines()
    if len(out) != len(cases):
        raise AssertionError("pforder answered %d of %d cases" % (len(out), len(cases)))
    return [[int(x) for x in line.split()] for line in out]


class ReferenceOrder(unittest.TestCase):
    def test_readme_vectors_hold(self):
        g = order.SplitMix64(0)
        self.assertEqual([g.next() for _ in range(3)],
                         [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F])
        self.assertEqual(order.shuffle(10, 42), [0, 9, 5, 8, 6, 4, 7, 2, 1, 3])
        self.assertEqual(order.shuffle(16, 7),
                         [14, 6, 4, 2, 5, 11, 13, 1, 3, 12, 15, 10, 8, 0, 9, 7])
        self.assertEqual(order.share(order.shuffle(10, 42), 3, 4), [8, 2, 9])

    def test_reference_matches_the_daemon_on_1000_random_cases(self):
        rng = random.Random(20261201)
        cases, want = [], []
        for i in range(1000):
            seed = rng.getrandbits(64)
            epoch = rng.randrange(0, 1000)
            # Mostly small; every 100th case past 2**16 picks, where the
            # daemon takes its draws from a second thread.
            n = rng.randrange(70000, 140000) if i % 100 == 0 else rng.randrange(1, 5000)
            world = rng.randrange(1, 9)
            rank = rng.randrange(0, world)
            cases.append(((seed + epoch) & order.MASK, n, rank, world))
            want.append(order.epoch_picks(n, seed=seed, epoch=epoch, rank=rank, world=world))
        got = c_orders(cases)
        for i, (case, w, g) in enumerate(zip(cases, want, got)):
            if w != g:
                first = next(k for k in range(min(len(w), len(g))) if w[k] != g[k]) \
                    if len(w) == len(g) else "length %d vs %d" % (len(w), len(g))
                self.fail("case %d (seed+epoch %d, N %d, rank %d of %d): Python and C "
                          "differ at %s" % (i, case[0], case[1], case[2], case[3], first))

    def test_shares_of_all_ranks_cover_the_epoch(self):
        picks = order.shuffle(103, 9)
        shares = [order.share(picks, r, 4) for r in range(4)]
        self.assertEqual(len({len(s) for s in shares}), 1)
        self.assertEqual(sorted(set(sum(shares, []))), list(range(103)))
        self.assertEqual(order.num_batches(26, 8), 4)
        self.assertEqual(order.num_batches(26, 8, drop_last=True), 3)


if __name__ == "__main__":
    unittest.main()
