"""The epoch order, as the daemon computes it: a reference in plain Python.

This is the specification of README.md ("Shuffle specification") and
docs/SHUFFLE.md in code.  A trainer, a checker or another language's port
can reproduce exactly which samples rank r of `world` receives, in which
order, in any epoch, with no daemon:

    from prefetch import order
    picks = order.epoch_picks(n=1_000_000, seed=0, epoch=3, rank=1, world=8)

`epoch_picks` follows the convention the Loader and `prefetchctl bench`
use: epoch e is shuffled with seed + e (mod 2**64).  `shuffle` and `share`
are the two steps underneath.  tests/python/test_order.py checks this module
against the daemon's C implementation on 1000 random cases.

`block_shuffle` is the IO-aware order (docs/SHUFFLE.md, "Block shuffle"):
runs of B consecutive samples stay together on disk and are read whole,
only W blocks' worth of picks are mixed at a time.  `block_params` turns
the options a trainer gives (rows or bytes per block, window) into B and W
as the daemon does; `block_epoch_picks` is `epoch_picks` for it;
`sample_block` and `block_uses` are what a block cache needs to know.

Plain Python: about a second per million picks, fine for checking and for
small datasets; the daemon builds its orders itself.
"""

MASK = (1 << 64) - 1

__all__ = ["SplitMix64", "shuffle", "share", "epoch_picks", "num_batches", "batches",
           "block_shuffle", "block_params", "block_epoch_picks", "sample_block",
           "block_uses", "BLOCK_DEFAULT_BYTES", "BLOCK_DEFAULT_WINDOW"]

# The daemon's block_shuffle defaults, when StartEpoch sets no block size
# and no window (docs/SHUFFLE.md): 4 MiB of samples per block, 16 blocks
# per window.
BLOCK_DEFAULT_BYTES = 4 << 20
BLOCK_DEFAULT_WINDOW = 16


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


def batches(picks, batch_size, drop_last=False, start_batch=0):
    """A share cut into the batches the daemon delivers: batch_size
    consecutive picks each, the last one short unless drop_last drops it,
    starting at batch start_batch."""
    nb = num_batches(len(picks), batch_size, drop_last)
    return [picks[k * batch_size:(k + 1) * batch_size] for k in range(start_batch, nb)]


def _fisher_yates(rng, items, lo, hi):
    """Shuffles items[lo:hi] in place, top down, drawing from rng."""
    for i in range(hi - lo - 1, 0, -1):
        j = rng.bounded(i + 1)
        items[lo + i], items[lo + j] = items[lo + j], items[lo + i]


def block_shuffle(n, seed, block_rows, window_blocks, augment=1):
    """The block_shuffle list over augment * n picks (before sharding).

    Blocks are runs of block_rows consecutive picks that restart at every
    copy of the dataset (pick c*n is always a block's first); they are
    permuted with one generator, laid out each in ascending order, and
    each window of window_blocks consecutive blocks of that layout is then
    shuffled in place with the same generator, window after window."""
    if n < 1 or augment < 1:
        raise ValueError("an empty schedule (n %d, augment %d)" % (n, augment))
    if block_rows < 1:
        raise ValueError("block_rows must be at least 1, not %d" % block_rows)
    if window_blocks < 1:
        raise ValueError("window_blocks must be at least 1, not %d" % window_blocks)
    per_copy = -(-n // block_rows)
    nblocks = augment * per_copy
    rng = SplitMix64(seed)
    bperm = list(range(nblocks))
    _fisher_yates(rng, bperm, 0, nblocks)

    picks, starts = [], []
    for b in bperm:
        copy, j = divmod(b, per_copy)
        starts.append(len(picks))
        first = copy * n + j * block_rows
        picks.extend(range(first, copy * n + min((j + 1) * block_rows, n)))
    starts.append(len(picks))
    for w in range(0, nblocks, window_blocks):
        _fisher_yates(rng, picks, starts[w], starts[min(w + window_blocks, nblocks)])
    return picks


def block_params(n, augment, sample_bytes, block_rows=None, block_bytes=None,
                 window_blocks=None):
    """(B, W) as the daemon derives them from a StartEpoch's options.

    None means "not set" (0 on the wire); an explicit 0 is refused here,
    where it can be told apart.  block_rows and block_bytes exclude each
    other; block_bytes gives B = max(1, block_bytes // sample_bytes); with
    neither, B is BLOCK_DEFAULT_BYTES of samples.  B is clamped to n and W
    (default BLOCK_DEFAULT_WINDOW) to the number of blocks, which changes
    nothing in the order, only the figures it is described by."""
    for name, v in (("block_rows", block_rows), ("block_bytes", block_bytes),
                    ("window_blocks", window_blocks)):
        if v is not None and (int(v) != v or v < 1):
            raise ValueError("%s must be a positive integer (or None for the default), "
                             "not %r" % (name, v))
    if block_rows is not None and block_bytes is not None:
        raise ValueError("block_rows (%d) and block_bytes (%d) are both set: give one of them"
                         % (block_rows, block_bytes))
    sample_bytes = max(int(sample_bytes), 1)
    if block_rows is not None:
        b = int(block_rows)
    else:
        b = max(1, (BLOCK_DEFAULT_BYTES if block_bytes is None else int(block_bytes))
                // sample_bytes)
    b = min(b, n)
    nblocks = max(augment, 1) * -(-n // b)
    w = BLOCK_DEFAULT_WINDOW if window_blocks is None else int(window_blocks)
    return b, min(w, nblocks)


def block_epoch_picks(n, block_rows, window_blocks=BLOCK_DEFAULT_WINDOW, seed=0, epoch=0,
                      rank=0, world=1, augment=1):
    """`epoch_picks` for block_shuffle: rank `rank`'s picks in epoch
    `epoch` (seed + epoch) over augment copies of n samples."""
    base = block_shuffle(n, (seed + epoch) & MASK, block_rows, window_blocks, augment)
    return share(base, rank, world)


def sample_block(pick, n, block_rows):
    """The sample block a pick reads: copies of one block share its data."""
    return (pick % n) // block_rows


def block_uses(picks, n, block_rows):
    """Per sample block (ceil(n / block_rows) of them), how many of these
    picks read it: a block cache may drop a block once that many of its
    rows were served."""
    uses = [0] * -(-n // block_rows)
    for p in picks:
        uses[(p % n) // block_rows] += 1
    return uses
