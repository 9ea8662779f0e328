"""The epoch order, as the daemon computes it: a reference in plain Python.

This is the specification of README.md ("Shuffle specification") and
docs/SHUFFLE.md in code.  A trainer, a checker or another language's port
can reproduce exactly which samples rank r of `world` receives, in which
order, in any epoch, with no daemon:

    from prefetch import order
    picks = order.epoch_picks(n=1_000_000, seed=0, epoch=3, rank=1, world=8)

`epoch_picks` follows the convention the Loader and `prefetchctl bench`
use: epoch e is shuffled with seed + e (mod 2**64).  `shuffle` and `share`
are the two steps underneath.  tests/python/test_host.py checks this module
against the daemon's C implementation on 1000 random cases.

Plain Python: about a second per million picks, fine for checking and for
small datasets; the daemon builds its orders itself.
"""

MASK = (1 << 64) - 1

__all__ = ["SplitMix64", "shuffle", "share", "epoch_picks", "num_batches"]


class SplitMix64:
    """splitmix64: state += 0x9E3779B97F4A7C15, then the standard mix."""

    def __init__(self, seed):
        self.state = seed & MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def bounded(self, m):
        """An unbiased draw in [0, m): rejection below (2**64 - m) mod m."""
        threshold = ((1 << 64) - m) % m
        while True:
            r = self.next()
            if r >= threshold:
                return r % m


def shuffle(n, seed):
    """The permutation of range(n) under seed: top-down Fisher-Yates."""
    rng = SplitMix64(seed)
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        j = rng.bounded(i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def share(picks, rank=0, world=1):
    """Rank `rank`'s share, as torch's DistributedSampler (drop_last=False)
    takes it: the list padded by repeating its head to a multiple of
    world, then every world-th element from rank."""
    world = max(int(world), 1)
    if not 0 <= rank < world:
        raise ValueError("rank %d is not below world %d" % (rank, world))
    total = -(-len(picks) // world) * world
    padded = [picks[k % len(picks)] for k in range(total)]
    return padded[rank::world]


def epoch_picks(n, seed=0, epoch=0, rank=0, world=1, shuffled=True):
    """The picks rank `rank` receives in epoch `epoch` over n samples (n
    here is the schedule space: augment * N when augmenting)."""
    base = shuffle(n, (seed + epoch) & MASK) if shuffled else list(range(n))
    return share(base, rank, world)


def num_batches(npicks, batch_size, drop_last=False):
    """Batches in a share of npicks."""
    return npicks // batch_size if drop_last else -(-npicks // batch_size)
