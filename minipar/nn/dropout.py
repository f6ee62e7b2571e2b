"""Dropout whose mask does not depend on how the model is split: a counter-based draw per element.

    draw = Draw(p=0.1, seed=0)                        # one per rank, shared by every site
    drop = nn.Dropout(draw, layer=3, site="hidden", shape=(T, H), cols=(lo, hi))
    draw.at(step=7, rows=np.arange(8, 12))            # the global rows of the micro-batch running now
    y, mask = drop.forward(x)                         # x: (4, T, hi-lo), my columns of rows 8 ... 11
    dx = drop.backward_input(dy, mask)                # dy * mask / (1 - p)

An element is kept with probability 1 - p and scaled by 1 / (1 - p), so the expectation is
unchanged. Whether it is kept is a function of (seed, step, layer, site, its *global* index
(row of the global batch, position, feature)) and of nothing else:

    key     = SeedSequence([seed, step, layer, site]).generate_state(2)     # Philox's 128-bit key
    u[r]    = Generator(Philox(key=key, counter=[0, r, 0, 0])).random((T, D))   # global row r
    keep    = u[r][t, j] >= p          # position t, feature j

The attention probabilities (``AttentionDropout``, inside the attention core) are indexed by
(row, head, query position, key position), one stream per global (row, head):

    u[r, h] = Generator(Philox(key=key, counter=[0, r, h, 0])).random((T, T))
    keep    = u[r, h][i, j] >= p    # query i, key j

so a TP rank draws the heads it holds by their global index (t nh/tp + its own), and a
context-parallel core its queries against each block of keys by their global positions,
whichever rank the block came from and whatever order the core lays the sequence out in.

Philox (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3") is counter-based:
its output is a fixed function of (key, counter), so any rank can start the stream of global
row r without drawing rows 0 ... r-1 first. A rank therefore draws exactly the bits one process
draws for the rows, positions and columns it holds, whatever the grid: dp or a micro-batch
picks the rows, cp (zigzag) and sequence parallelism pick the positions, tp picks the columns of
a site inside a TP region (the MLP's hidden layer) or its heads (the attention probabilities).
The losses of every grid then equal one process's with dropout on, and whatever draws a mask
again replays it, because it draws at the same (step, rows): a recomputed forward
(``minipar.nn.recompute``), selective recomputation's probabilities, ring attention's and
Ulysses' backward (they keep no mask).

Cost: a rank draws the whole (T, D) of each of its rows and keeps its slice, so a site drawn
with cp x tp ranks sharing a row draws up to cp x tp times the uniforms it keeps (T D float64s
of scratch per row); the kept mask (bools, one byte an element) lives in the ctx until the
backward, one more activation of the size of the site's output; the probabilities' mask is
b nh T^2 bytes per layer, as many elements as p (selective recomputation drops both). Drawing
each (row, position) from its own counter would cut the waste to the columns, at one stream per
position.

The torch backend draws with NumPy's Philox too and converts (``from_numpy``): torch's CPU
generator is a Mersenne Twister, which cannot start at an element's index, and its Philox is
CUDA's; one generator on both backends gives both the same masks, bit for bit.

Megatron-LM's alternative (``tensor_parallel/random.py``, ``CudaRNGStatesTracker``): a
stateful generator per rank, seeded so that TP ranks share a seed in the replicated regions
(the residual dropouts, identical on every TP rank, as they must be) and differ inside a TP
region (``seed + 2718 + tp_rank``, so the shards of the hidden layer or of the attention
probabilities get different masks). Each rank draws only what it holds, nothing redundant. What
it gives up: the mask is a function of the rank and of the order of the draws, not of the
element, so it changes with tp, pp and the micro-batching: two grids train different models and
their losses differ from one process's. And the classic bug it guards against is easy to write:
one seed shared inside a TP region makes every TP rank draw the *same* mask for its own shard
(``minipar.train.mutants``: ``dropout_shared_in_tp``), a correlation between columns that no
one process would have.
"""
from __future__ import annotations

import numpy as np

from ..xp import like_kind

# the residual after attention, the MLP's hidden layer, after the MLP; the embedding's output
# (token + position), the attention probabilities (after the softmax, before P V)
SITES = {"attn": 1, "hidden": 2, "mlp": 3, "embed": 4, "probs": 5}


class Draw:
    """What every dropout site of a rank shares: p, the seed, and where the rank is now (the
    step and the global rows of the micro-batch being computed, set before each pipeline action)."""

    def __init__(self, p: float, seed: int = 0):
        if not 0 <= p < 1:
            raise ValueError(f"dropout p={p!r}: must be in [0, 1)")
        self.p, self.seed = float(p), int(seed)
        self.step, self.rows = 0, np.zeros(0, dtype=np.int64)

    def at(self, step=None, rows=None):
        """Move to ``step`` and/or the global batch ``rows`` (what the next forward computes)."""
        if step is not None:
            self.step = int(step)
        if rows is not None:
            self.rows = np.asarray(rows, dtype=np.int64)

    def keep(self, layer, site, shape, positions=None, cols=None) -> np.ndarray:
        """``keep_mask`` of site ``site`` of layer ``layer`` at this step, for the rows I am at."""
        return keep_mask((self.seed, self.step, layer, SITES[site]), self.rows, shape, positions, cols, self.p)

    def keep_probs(self, layer, heads, q_pos, k_pos, seq_len) -> np.ndarray:
        """``probs_keep_mask`` of layer ``layer``'s attention at this step, for the rows I am at."""
        return probs_keep_mask((self.seed, self.step, layer, SITES["probs"]), self.rows, heads, q_pos, k_pos,
                               seq_len, self.p)


class AttentionDropout:
    """Dropout on one layer's attention probabilities (GPT-2's attn_pdrop): where the core is in
    the global (row, head, query, key) index space. ``heads``: the global indices of the heads
    this attention holds (tensor parallelism: TP rank t's nh/tp, t nh/tp ... (t+1) nh/tp - 1);
    ``seq_len``: T. The core says which queries and keys it is computing, by global position
    (``keep``); the rows are those of the micro-batch ``draw`` is at."""

    def __init__(self, draw: Draw, layer: int, heads, seq_len: int):
        self.draw, self.layer, self.seq_len = draw, int(layer), int(seq_len)
        self.heads = np.asarray(heads, dtype=np.int64)

    @property
    def rate(self) -> float:
        return self.draw.p

    def global_heads(self, heads=None) -> np.ndarray:
        """The global index of each of my heads ``heads`` (an index into mine; None: all)."""
        return self.heads if heads is None else self.heads[heads]

    def keep(self, like, q_pos, k_pos, heads=None):
        """The keep mask (B, h, tq, tk), bools in ``like``'s kind, of my heads ``heads`` for the
        queries at global positions ``q_pos`` against the keys at ``k_pos``; None when p = 0."""
        if self.draw.p == 0:
            return None
        return like_kind(self.draw.keep_probs(self.layer, self.global_heads(heads), q_pos, k_pos, self.seq_len),
                         like)


def _streams(key):
    """``uniforms(counter, shape)``: the first prod(shape) uniforms of the Philox stream of
    ``key`` that starts at ``counter``. One generator serves every stream, its counter set for
    each (its output buffer emptied): what a fresh ``Philox(key=key, counter=counter)`` draws, at
    half the cost of making one per stream."""
    bits = np.random.Philox(key=key)
    gen, state = np.random.Generator(bits), bits.state

    def uniforms(counter, shape):
        state["state"]["counter"][:] = counter
        state["buffer_pos"], state["has_uint32"] = 4, 0  # nothing buffered: the next draw starts at counter
        bits.state = state
        return gen.random(shape)

    return uniforms


def _philox_key(key) -> np.ndarray:
    """Philox's 128-bit key from the ints (seed, step, layer, site)."""
    return np.random.SeedSequence(list(key)).generate_state(2, np.uint64)


def probs_keep_mask(key, rows, heads, q_pos, k_pos, seq_len, p) -> np.ndarray:
    """Which attention probabilities dropout keeps: (rows, heads, queries, keys) bools, for the
    global batch ``rows``, global ``heads`` and the global positions ``q_pos`` of the queries
    and ``k_pos`` of the keys. Element (r, h, i, j) is kept iff u[i, j] >= p, u the (T, T)
    uniforms of Philox(key, counter = (r, h)): its global index decides, whichever rank holds
    the head, whichever rank the key's block came from, in whatever order a core lays them out.
    A position >= T (context parallelism's padding) is kept: its probability is 0, or its row
    is dropped."""
    uniforms, T = _streams(_philox_key(key)), seq_len
    q_pos, k_pos = np.asarray(q_pos), np.asarray(k_pos)
    qi, kj = np.ix_(np.minimum(q_pos, T - 1), np.minimum(k_pos, T - 1))
    pad = (q_pos >= T)[:, None] | (k_pos >= T)[None, :]  # (tq, tk)
    out = np.empty((len(rows), len(heads), len(q_pos), len(k_pos)), dtype=bool)
    for a, r in enumerate(rows):  # each (global row, global head) its own counter
        for b, h in enumerate(heads):
            out[a, b] = (uniforms((0, int(r), int(h), 0), (T, T))[qi, kj] >= p) | pad  # (tq, tk)
    return out  # (b, h, tq, tk)


def keep_mask(key, rows, shape, positions, cols, p) -> np.ndarray:
    """Which elements dropout keeps: (rows, positions, columns) bools of a site whose global
    tensor is (global batch, T, D), ``shape`` = (T, D); ``key``: ints (seed, step, layer, site);
    ``rows``: the global batch rows held, ``positions`` (None: all T) and ``cols`` ((lo, hi),
    None: all D) the global positions and columns held. Element (r, t, j) is kept iff
    u[t, j] >= p, u the (T, D) uniforms of Philox(key, counter = r): its global index decides."""
    uniforms = _streams(_philox_key(key))
    T, D = shape
    pos = slice(None) if positions is None else np.asarray(positions)
    lo, hi = cols if cols is not None else (0, D)
    out = []
    for r in rows:  # each global row its own counter: no rank draws another row's bits
        u = uniforms((0, int(r), 0, 0), (T, D))
        out.append(u[pos, lo:hi] >= p)  # (t, hi - lo)
    return np.stack(out)  # (b, t, d)
