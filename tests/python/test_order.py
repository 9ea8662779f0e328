"""python/prefetch/order.py, the reference implementation of the epoch
order, against the daemon's own (daemon/order/order.c, through build/pforder) on
1000 random (seed, epoch, N, rank, world) shuffle cases and 1000 random
block_shuffle epochs (N, augment, block size in rows or bytes or neither,
window, seed, rank, world, batch size, drop_last, start_batch), plus the
test vectors of docs/SHUFFLE.md.  No daemon and no numpy needed.
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


def c_lines(lines):
    """pforder's answer to each input line, in one run."""
    out = subprocess.run([PFORDER], input="".join(line + "\n" for line in lines),
                         capture_output=True, text=True, check=True,
                         timeout=300).stdout.splitlines()
    if len(out) != len(lines):
        raise AssertionError("pforder answered %d of %d cases" % (len(out), len(lines)))
    return out


def block_case(rng, big):
    """A random block_shuffle StartEpoch, and what the reference says its
    rank receives: pforder's output line (docs: tools/pforder.c)."""
    n = rng.randrange(20000, 60000) if big else rng.choice(
        [rng.randrange(1, 40), rng.randrange(1, 3000)])
    augment = rng.choice([1, 1, 1, 2, 3, 4])
    sample_bytes = rng.choice([1, 4, 12, 24, 4096, 1 << 16, 3 << 20])
    # The size in rows, in bytes, neither (the default), or both (refused).
    kind = rng.choices(range(4), weights=[45, 30, 20, 5])[0]
    rows = rng.choice([1, 2, 3, rng.randrange(1, 64), rng.randrange(1, n + 1),
                       rng.randrange(1, 2 * n + 2)]) if kind in (0, 3) else 0
    nbytes = rng.choice([1, rng.randrange(1, 100000), rng.randrange(1, 1 << 24)]) \
        if kind in (1, 3) else 0
    window = rng.choice([0, 1, 2, rng.randrange(1, 40), 1 << 40])
    world = rng.choice([1, 1, 2, 3, 4, 8])
    rank = rng.randrange(world)
    batch = rng.choice([1, 7, rng.randrange(1, 300)])
    drop_last = rng.randrange(2)
    seed = rng.getrandbits(64)
    nshare = -(-n * augment // world)
    start = rng.randrange(order.num_batches(nshare, batch, drop_last) + 1)
    line = "block %d %d %d %d %d %d %d %d %d %d %d %d" % (
        seed, n, augment, sample_bytes, rows, nbytes, window, rank, world, batch, drop_last,
        start)
    try:
        b, w = order.block_params(n, augment, sample_bytes, rows or None, nbytes or None,
                                  window or None)
    except ValueError as e:
        return line, "error: %s" % e
    share = order.share(order.block_shuffle(n, seed, b, w, augment), rank, world)
    want = "%d %d" % (b, w) + "".join(
        " | " + " ".join(map(str, picks))
        for picks in order.batches(share, batch, drop_last, start))
    return line, want


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

    def test_block_shuffle_vectors_hold(self):
        self.assertEqual(order.block_shuffle(10, 42, 3, 2), [0, 1, 7, 8, 2, 6, 9, 5, 4, 3])
        self.assertEqual(order.block_shuffle(8, 7, 3, 3, augment=2),
                         [5, 15, 14, 2, 1, 3, 0, 4, 13, 7, 11, 10, 8, 6, 12, 9])
        self.assertEqual(order.block_shuffle(20, 2026, 4, 2),
                         [15, 3, 0, 1, 2, 12, 14, 13, 19, 10, 11, 18, 17, 9, 16, 8, 6, 4, 5, 7])
        # B = 1, W = 1 and B = N are shuffle(seed), by the text.
        self.assertEqual(order.block_shuffle(10, 42, 1, 1), order.shuffle(10, 42))
        self.assertEqual(order.block_shuffle(10, 42, 10, 1), order.shuffle(10, 42))
        self.assertEqual([order.share(order.block_shuffle(10, 42, 3, 2), r, 4)
                          for r in range(4)], [[0, 2, 4], [1, 6, 3], [7, 9, 0], [8, 5, 1]])
        self.assertEqual(order.block_epoch_picks(10, 3, 2, seed=40, epoch=2, rank=1, world=4),
                         [1, 6, 3])

    def test_block_params_follow_the_documented_rules(self):
        self.assertEqual(order.block_params(10**6, 1, 24, block_bytes=10000), (416, 16))
        self.assertEqual(order.block_params(10**8, 1, 24), ((4 << 20) // 24, 16))
        self.assertEqual(order.block_params(10**6, 1, 24), ((4 << 20) // 24, 6))
        self.assertEqual(order.block_params(10**6, 1, 24, block_bytes=10), (1, 16))
        self.assertEqual(order.block_params(1000, 3, 8, block_rows=5000), (1000, 3))
        self.assertEqual(order.block_params(1000, 1, 8, block_rows=64, window_blocks=99),
                         (64, 16))
        for kw in ({"block_rows": 0}, {"block_bytes": 0}, {"window_blocks": 0}):
            with self.assertRaisesRegex(ValueError, list(kw)[0]):
                order.block_params(1000, 1, 8, **kw)
        with self.assertRaisesRegex(ValueError, "both set"):
            order.block_params(1000, 1, 8, block_rows=4, block_bytes=64)

    def test_block_options_refuse_an_explicit_zero(self):
        from prefetch import _lib

        self.assertEqual(_lib.block_options(), {"block_rows": 0, "block_bytes": 0,
                                                "window_blocks": 0})
        self.assertEqual(_lib.block_options(block_bytes=1 << 22, window_blocks=8),
                         {"block_rows": 0, "block_bytes": 1 << 22, "window_blocks": 8})
        for kw in ({"block_rows": 0}, {"block_bytes": 0}, {"window_blocks": 0},
                   {"block_rows": -3}, {"block_rows": 2.5}, {"window_blocks": True}):
            with self.assertRaisesRegex(ValueError, list(kw)[0]):
                _lib.block_options(**kw)
        with self.assertRaisesRegex(ValueError, "both set: give one of them"):
            _lib.block_options(block_rows=4, block_bytes=64)

    def test_block_uses_count_the_reads_of_each_sample_block(self):
        share = order.share(order.block_shuffle(103, 3, 10, 4, augment=2), 0, 1)
        self.assertEqual(order.block_uses(share, 103, 10), [20] * 10 + [6])
        self.assertEqual(order.sample_block(103 + 15, 103, 10), 1)

    def test_block_reference_matches_the_daemon_on_1000_random_cases(self):
        # 1000 epochs the daemon accepts, and the refused ones drawn
        # on the way (both sizes set).
        rng = random.Random(20260219)
        cases, accepted = [], 0
        while accepted < 1000:
            cases.append(block_case(rng, accepted % 100 == 0))
            accepted += not cases[-1][1].startswith("error: ")
        self.assertGreater(len(cases), 1020)
        got = c_lines([line for line, _ in cases])
        for i, ((line, want), g) in enumerate(zip(cases, got)):
            if want != g:
                wb, gb = want.split(" | "), g.split(" | ")
                where = next((k for k in range(min(len(wb), len(gb))) if wb[k] != gb[k]),
                             "count %d vs %d" % (len(wb), len(gb)))
                self.fail("case %d (%s): Python and C differ at batch part %s:\n  "
                          "python %.200s\n  C      %.200s" % (i, line, where, want, g))

    def test_shares_of_all_ranks_cover_the_epoch(self):
        picks = order.shuffle(103, 9)
        shares = [order.share(picks, r, 4) for r in range(4)]
        self.assertEqual(len({len(s) for s in shares}), 1)
        self.assertEqual(sorted(set(sum(shares, []))), list(range(103)))
        self.assertEqual(order.num_batches(26, 8), 4)
        self.assertEqual(order.num_batches(26, 8, drop_last=True), 3)


if __name__ == "__main__":
    unittest.main()
