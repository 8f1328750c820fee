"""The split verify's on-rank merge as one Triton kernel: the prefix and window partials of each query, weighed by
their base-2 LSEs, a side the plan flags empty weighed at zero.

Why one kernel: the merge runs in every layer of every verify step, so what it
costs is counted in launches and in passes over ``[tokens, heads, kv_lora_rank]``
outputs. Composed from torch ops and sglang's ``merge_state`` it took about 18
launches and 5 full-size passes per layer (fills to neutralise the flagged sides,
base conversions, the merge, a fill of the result). Here it is one launch that
reads the two outputs once and writes the merge in place over the prefix side's.

- The flags are the plan's (``prefix_empty`` and ``window_empty``, one int32 per
  query, made on the host with the plan and copied to the device in its pack),
  read as they are: nothing is computed from them per layer.
- A flagged side is never read: its filler row's output is masked out of the
  load, and its LSE taken as -inf. So the kernel needs no neutral output, only
  a -inf weight, and a query with both sides flagged gets (0, -inf), the neutral
  partial the ranks' merge weighs at zero.
- Everything stays in base 2, the base flashinfer's MLA ``run`` returns and the
  model's DCP merge is told (``is_lse_base_on_e=False``), so there is no base
  conversion on either side of it.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _merge_verify_sides(
    prefix_out,  # [tokens, heads, dim]; overwritten with the merge
    prefix_lse,  # [tokens, heads], base 2; overwritten with the merge's
    window_out,  # [tokens, heads, dim]
    window_lse,  # [tokens, heads], base 2
    prefix_empty,  # [tokens] int32: this rank holds no key of the query's prefix
    window_empty,  # [tokens] int32: nor of its window
    heads,
    dim,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    head_ok = h < heads
    prefix_on = tl.load(prefix_empty + token) == 0
    window_on = tl.load(window_empty + token) == 0

    row = token * heads + h
    lse_a = tl.load(prefix_lse + row, mask=head_ok & prefix_on, other=float("-inf"))
    lse_b = tl.load(window_lse + row, mask=head_ok & window_on, other=float("-inf"))
    top = tl.maximum(lse_a, lse_b)
    # Both sides empty: top is -inf, and -inf - -inf is NaN; any finite shift gives both weights exp2(-inf) = 0.
    shift = tl.where(top == float("-inf"), 0.0, top)
    w_a = tl.exp2(lse_a - shift)
    w_b = tl.exp2(lse_b - shift)
    total = w_a + w_b
    seen = total > 0
    scale = tl.where(seen, 1.0 / tl.where(seen, total, 1.0), 0.0)
    tl.store(prefix_lse + row, tl.where(seen, shift + tl.log2(tl.where(seen, total, 1.0)), float("-inf")),
             mask=head_ok)

    at = row[:, None] * dim + d[None, :]
    inside = head_ok[:, None] & (d[None, :] < dim)
    out_a = tl.load(prefix_out + at, mask=inside & prefix_on, other=0.0).to(tl.float32)
    out_b = tl.load(window_out + at, mask=inside & window_on, other=0.0).to(tl.float32)
    merged = (out_a * (w_a * scale)[:, None]) + (out_b * (w_b * scale)[:, None])
    tl.store(prefix_out + at, merged.to(prefix_out.dtype.element_ty), mask=inside)


def merge_verify_sides(prefix_out, prefix_lse, window_out, window_lse, prefix_empty, window_empty):
    """Merge the window side into the prefix side's tensors, in place, and return them: ``(out, lse)``.

    ``*_out`` are contiguous ``[tokens, heads, dim]``, ``*_lse`` contiguous float32 ``[tokens, heads]`` in base 2,
    ``*_empty`` int32 ``[tokens]`` (non-zero: the side holds no key on this rank). One launch."""
    tokens, heads, dim = prefix_out.shape
    if tokens == 0:
        return prefix_out, prefix_lse
    block_d = triton.next_power_of_2(dim)
    # A program holds BLOCK_H x BLOCK_D values in registers: 8 x 512 fp32 is 16 kB, as much as a decode kernel's
    # tile; fewer heads than 8 take one program per token.
    block_h = min(8, triton.next_power_of_2(heads))
    grid = (tokens, triton.cdiv(heads, block_h))
    _merge_verify_sides[grid](prefix_out, prefix_lse, window_out, window_lse, prefix_empty, window_empty, heads, dim,
                              BLOCK_H=block_h, BLOCK_D=block_d)
    return prefix_out, prefix_lse
