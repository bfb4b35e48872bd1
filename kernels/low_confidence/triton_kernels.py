"""Triton kernels of token choice and the LowConfidence fill (launchers in ``choose.py``).

``choose_kernel`` streams each row of logits in tiles, applying the controls as it loads them, and
picks the greedy token or an exact draw under top-k / top-p with its confidence, never writing a
[T, V] tensor; ``fill_kernel`` applies LowConfidence to the block in place. Each kernel's comment
says how.
"""

from __future__ import annotations

import triton
import triton.language as tl

import clover_agent.kernels.runtime  # noqa: F401  (decides interpretation before these kernels)


@triton.jit
def _controlled(
    logits_row,
    counts_ptr,
    bias_ids_ptr,
    bias_row,
    cols,
    ok,
    forced,
    mask_token,
    repetition,
    presence,
    frequency,
    inv_temperature,
    PENALIZE: tl.constexpr,
    NUM_BIAS: tl.constexpr,
):
    """The tile's controlled logits times 1/T (-inf past the row end, on the mask token, and on every
    token but the forced one of a forced row)."""
    z = tl.load(logits_row + cols, mask=ok, other=float("-inf")).to(tl.float32)
    if PENALIZE:
        c = tl.load(counts_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        seen = c > 0.0
        z = tl.where(seen, tl.where(z > 0.0, z / repetition, z * repetition), z)
        z = z - presence * seen.to(tl.float32) - frequency * c
    for j in tl.static_range(NUM_BIAS):
        token = tl.load(bias_ids_ptr + j)
        z = tl.where(cols == token, z + tl.load(bias_row + j), z)
    z = tl.where(forced >= 0, tl.where(cols == forced, 0.0, float("-inf")), z)
    z = tl.where((cols == mask_token) | ~ok, float("-inf"), z)
    return z * inv_temperature


@triton.jit
def _order_key(z):
    """int32 keys ordered as the float32 values (-inf lowest): the sign-magnitude bits, negatives flipped."""
    bits = z.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


# One program per row, streaming the row in BLOCK_V tiles (no [T, V] tensor is ever written). The
# controls are applied to each tile as it is loaded (``_controlled``). Greedy: one pass (online max,
# lowest-index argmax, sum of exponentials). Sampling: pass 1 also keeps the TOP_K_BLOCK largest
# scaled logits (``tl.topk`` per tile, merged), which give the top-k threshold exactly and, sorted,
# the top-p threshold; a pass sums the mass at or above the top-k threshold (ties included, as
# ``logits < kth`` is what the reference drops). Without a candidate list (no top-k, or one longer
# than the list) the thresholds are found by bisection over the values' order keys, one pass per
# step (about 32 each), exact as well. The last pass draws by Gumbel-max over the kept tokens
# (``argmax z/T + G``, G from Philox noise keyed by the seed and the element index, an exact draw
# from the renormalised distribution) and sums the kept mass for the confidence.
@triton.jit
def choose_kernel(
    logits_ptr,
    counts_ptr,
    bias_ids_ptr,
    row_bias_ptr,
    forced_ptr,
    decided_ptr,
    tokens_ptr,
    seed_ptr,
    chosen_ptr,
    confidence_ptr,
    vocab,
    stride_l,
    stride_rb,
    mask_token,
    repetition,
    presence,
    frequency,
    inv_temperature,
    top_k,
    top_p,
    PENALIZE: tl.constexpr,
    NUM_BIAS: tl.constexpr,
    HAS_FORCED: tl.constexpr,
    HAS_DECIDED: tl.constexpr,
    GREEDY: tl.constexpr,
    TOP_K_BLOCK: tl.constexpr,
    TOP_P: tl.constexpr,
    BISECT_K: tl.constexpr,
    SGLANG: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    if HAS_DECIDED:  # noqa: SIM102 (a compile-time switch around a run-time test)
        if tl.load(decided_ptr + row) != 0:
            tl.store(chosen_ptr + row, tl.load(tokens_ptr + row))
            tl.store(confidence_ptr + row, float("-inf"))
            return
    forced = -1
    if HAS_FORCED:
        forced = tl.load(forced_ptr + row)
    logits_row = logits_ptr + row * stride_l
    bias_row = row_bias_ptr + row * stride_rb
    offs = tl.arange(0, BLOCK_V)

    # pass 1: max, lowest-index argmax, sum of exp(z - max); the largest values for top-k / top-p;
    # SGLANG: also the sum at temperature 1, sum of exp((z - max) * T), for the top-1 probability
    best = float("-inf")
    best_at = 0
    mass = 0.0
    mass_t1 = 0.0
    temperature = 1.0 / inv_temperature
    if TOP_K_BLOCK > 0:
        top = tl.full([TOP_K_BLOCK], float("-inf"), dtype=tl.float32)
    for start in range(0, vocab, BLOCK_V):
        cols = start + offs
        z = _controlled(logits_row, counts_ptr, bias_ids_ptr, bias_row, cols, cols < vocab, forced, mask_token, repetition, presence, frequency, inv_temperature, PENALIZE, NUM_BIAS)  # fmt: skip
        tile_best = tl.max(z, 0)
        tile_at = tl.min(tl.where(z == tile_best, cols, vocab), 0)
        new_best = tl.maximum(best, tile_best)
        shift = tl.where(new_best == float("-inf"), 0.0, new_best)  # a tile with nothing allowed yet
        mass = mass * tl.exp(best - shift) + tl.sum(tl.exp(z - shift), 0)
        if SGLANG:
            mass_t1 = mass_t1 * tl.exp((best - shift) * temperature) + tl.sum(
                tl.exp((z - shift) * temperature), 0
            )
        best_at = tl.where(tile_best > best, tile_at, best_at)
        best = new_best
        if TOP_K_BLOCK > 0:  # noqa: SIM102 (a compile-time switch around a run-time test)
            if tile_best > tl.min(top, 0):  # most tiles of a long row hold none of the largest
                both = tl.reshape(tl.join(top, tl.topk(z, TOP_K_BLOCK)), [2 * TOP_K_BLOCK])
                top = tl.topk(both, TOP_K_BLOCK)

    if GREEDY:
        tl.store(chosen_ptr + row, best_at.to(tl.int64))  # type: ignore[attr-defined]  # a Triton tensor by now
        tl.store(confidence_ptr + row, 1.0 / mass)
        return

    # the kept set: order key >= cut (top-k, then top-p)
    cut = tl.full([], -2147483648, tl.int64)
    top_mass = mass
    if TOP_K_BLOCK > 0:
        rank = tl.arange(0, TOP_K_BLOCK)
        cut = _order_key(tl.max(tl.where(rank == top_k - 1, top, float("-inf")), 0)).to(tl.int64)
    if BISECT_K:  # top_k past the candidate list: the k-th largest key by bisection, one pass a step
        lo = cut
        hi = _order_key(best).to(tl.int64)
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            count = 0
            for start in range(0, vocab, BLOCK_V):
                cols = start + offs
                z = _controlled(logits_row, counts_ptr, bias_ids_ptr, bias_row, cols, cols < vocab, forced, mask_token, repetition, presence, frequency, inv_temperature, PENALIZE, NUM_BIAS)  # fmt: skip
                count += tl.sum((_order_key(z).to(tl.int64) >= mid).to(tl.int32), 0)
            lo = tl.where(count >= top_k, mid, lo)
            hi = tl.where(count >= top_k, hi, mid - 1)
        cut = lo
    if TOP_P:
        if (TOP_K_BLOCK > 0) | BISECT_K:
            top_mass = 0.0
            for start in range(0, vocab, BLOCK_V):
                cols = start + offs
                z = _controlled(logits_row, counts_ptr, bias_ids_ptr, bias_row, cols, cols < vocab, forced, mask_token, repetition, presence, frequency, inv_temperature, PENALIZE, NUM_BIAS)  # fmt: skip
                top_mass += tl.sum(tl.where(_order_key(z).to(tl.int64) >= cut, tl.exp(z - best), 0.0), 0)
        if TOP_K_BLOCK > 0:  # the nucleus among the sorted candidates
            probs = tl.where(rank < top_k, tl.exp(top - best) / top_mass, 0.0)
            before = tl.cumsum(probs, 0) - probs
            nucleus = (rank < top_k) & (before < top_p)
            smallest = tl.min(tl.where(nucleus, top, float("inf")), 0)
            cut = tl.maximum(cut, _order_key(smallest).to(tl.int64))
        else:  # the smallest key whose strictly larger kept mass is below top_p, by bisection
            lo = cut
            hi = _order_key(best).to(tl.int64)
            while lo < hi:
                mid = (lo + hi) >> 1
                above = 0.0
                for start in range(0, vocab, BLOCK_V):
                    cols = start + offs
                    z = _controlled(logits_row, counts_ptr, bias_ids_ptr, bias_row, cols, cols < vocab, forced, mask_token, repetition, presence, frequency, inv_temperature, PENALIZE, NUM_BIAS)  # fmt: skip
                    key = _order_key(z).to(tl.int64)
                    above += tl.sum(tl.where((key > mid) & (key >= cut), tl.exp(z - best), 0.0), 0)
                small = above < top_p * top_mass
                hi = tl.where(small, mid, hi)
                lo = tl.where(small, lo, mid + 1)
            cut = lo

    # last pass: Gumbel-max draw over the kept tokens, and their mass
    seed = tl.load(seed_ptr)
    drawn_key = float("-inf")
    drawn = 0
    drawn_z = float("-inf")
    kept_mass = 0.0
    for start in range(0, vocab, BLOCK_V):
        cols = start + offs
        z = _controlled(logits_row, counts_ptr, bias_ids_ptr, bias_row, cols, cols < vocab, forced, mask_token, repetition, presence, frequency, inv_temperature, PENALIZE, NUM_BIAS)  # fmt: skip
        kept = _order_key(z).to(tl.int64) >= cut
        kept_mass += tl.sum(tl.where(kept, tl.exp(z - best), 0.0), 0)
        noise = tl.rand(seed, (row * vocab + cols).to(tl.int32))
        key = tl.where(kept, z - tl.log(-tl.log(noise)), float("-inf"))
        tile_key = tl.max(key, 0)
        tile_at = tl.min(tl.where(key == tile_key, cols, vocab), 0)
        tile_z = tl.max(tl.where(cols == tile_at, z, float("-inf")), 0)
        better = tile_key > drawn_key
        drawn = tl.where(better, tile_at, drawn)
        drawn_z = tl.where(better, tile_z, drawn_z)
        drawn_key = tl.maximum(drawn_key, tile_key)
    confidence = tl.exp(drawn_z - best) / kept_mass
    if SGLANG:  # min(top-1 probability at T=1 unfiltered, exp((z - z_max) / T)); z here is z / T
        confidence = tl.minimum(1.0 / mass_t1, tl.exp(drawn_z - best))
    tl.store(chosen_ptr + row, drawn.to(tl.int64))  # type: ignore[attr-defined]  # a Triton tensor by now
    tl.store(confidence_ptr + row, confidence)


# One program over the block's rows (at most 64): threshold, fallback to the single most confident
# open row (lowest index on ties), tokens and decided flags updated in place, done and fallback flags.
@triton.jit
def fill_kernel(
    chosen_ptr,
    confidence_ptr,
    tokens_ptr,
    decided_ptr,
    fill_ptr,
    done_ptr,
    fallback_ptr,
    rows,
    threshold,
    BLOCK_T: tl.constexpr,
):
    r = tl.arange(0, BLOCK_T)
    ok = r < rows
    decided = tl.load(decided_ptr + r, mask=ok, other=1) != 0
    open_rows = ok & ~decided
    confidence = tl.load(confidence_ptr + r, mask=open_rows, other=float("-inf"))
    above = open_rows & (confidence > threshold)
    any_above = tl.sum(above.to(tl.int32), 0) > 0
    top = tl.max(tl.where(open_rows, confidence, float("-inf")), 0)
    single = tl.min(tl.where(open_rows & (confidence == top), r, BLOCK_T), 0)
    fill = tl.where(any_above, above, open_rows & (r == single))
    chosen = tl.load(chosen_ptr + r, mask=ok, other=0)
    tokens = tl.load(tokens_ptr + r, mask=ok, other=0)
    tl.store(tokens_ptr + r, tl.where(fill, chosen, tokens), mask=ok)
    now = decided | fill
    tl.store(decided_ptr + r, now.to(decided_ptr.dtype.element_ty), mask=ok)
    tl.store(fill_ptr + r, fill.to(fill_ptr.dtype.element_ty), mask=ok)
    tl.store(done_ptr, (tl.sum((ok & ~now).to(tl.int32), 0) == 0).to(done_ptr.dtype.element_ty))
    any_open = tl.sum(open_rows.to(tl.int32), 0) > 0
    tl.store(fallback_ptr, (any_open & ~any_above).to(fallback_ptr.dtype.element_ty))
