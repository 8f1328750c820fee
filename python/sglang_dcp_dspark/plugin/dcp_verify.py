"""The target verify under DCP on flashinfer MLA, split: the committed prefix once per request, the window per token.

What a rank must compute, for draft token ``j`` of a request whose committed
prefix is ``H`` tokens long: attention over the keys *this rank holds* among
positions ``0 .. H + j``. Stock sglang plans the verify like a prefill (virtual
ids, global lengths, bottom-right causal, heads / attn_tp, no LSE), which
neither reads this rank's rows nor bounds the keys by position: under DCP a
rank's keys are every ``dcp``-th position, and a causal mask over rank-local
lengths counts them back from the wrong end.

The bound splits in two (sglang 0.5.23's aiter verify and vLLM's RFC #50391 are
built the same way):

- **the committed prefix** ``0 .. H - 1`` is seen whole by every draft token, so
  it needs no mask: one row per request, its ``q`` draft tokens as the row's
  queries, over this rank's prefix keys. These are the ids a DCP decode plans,
  and they are handed to the kernel once per request;
- **the window** ``H .. H + q - 1`` (the draft tokens' own KV, striped over the
  ranks like the rest) needs a bound per token: one row per draft token, one
  query, over this rank's window keys up to its own position. A row holds at
  most ``ceil(q / dcp)`` keys.

Each partial comes back with flashinfer's base-2 LSE; the two are merged per
query on the rank by one Triton kernel (:mod:`.verify_merge`), in base 2, and
the ranks' results are then merged by the model's DCP merge as for a decode. A
rank that holds no prefix key of a request, or no window key of a token, flags
that side in the plan, and the merge weighs it at zero; the kernel itself never
sees a row of length zero ("the attention kernel fails on a shard of length
zero", sglang's ``dcp_kernels.py``), so such a row gets one filler slot, row 0,
whose result the merge never reads.

Which positions a rank holds follows from the lengths alone: locs are handed
out in logical pages of ``page_size * dcp`` slots, so position ``p`` sits at a
loc ``L`` with ``L % dcp == p % dcp`` (the owner rule, ``L`` at row ``L // dcp``
of rank ``L % dcp``). The host therefore computes O(rows) numbers per step,
counts, indptrs and flags, from the host lengths sglang keeps; the ids
themselves are gathered from ``req_to_token`` on the device by sglang's own
DCP index builder (``create_triton_kv_indices_for_dcp_triton``, which also
applies the static pool's ``// dcp`` translation). Nothing on the host, and
nothing copied to the device, grows with the context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class VerifyRefused(ValueError):
    """A verify this plan does not carry: a draft tree, a ragged layout, a translating (unified-memory) pool."""


@dataclass(frozen=True)
class SplitPlan:
    """One rank's plan for a verify batch, all host tensors (int32 unless said), O(rows) in size.

    ``bs`` requests with ``q_lens`` draft tokens each, ``tokens`` in all. The
    prefix side has one row per request, the window side one row per token;
    ``*_keys`` are the keys this rank holds (0 allowed), ``*_kv_len`` what the
    kernel is planned with (at least 1: the filler slot).
    """

    dcp_size: int
    dcp_rank: int
    q_lens: Any  # [bs]
    prefix_qo_indptr: Any  # [bs + 1]
    prefix_keys: Any  # [bs]
    prefix_kv_len: Any  # [bs]
    prefix_kv_indptr: Any  # [bs + 1]
    window_start: Any  # [tokens]: the token's request's H, the first window position
    window_keys: Any  # [tokens]
    window_qo_indptr: Any  # [tokens + 1]: one query per row
    window_kv_len: Any  # [tokens]
    window_kv_indptr: Any  # [tokens + 1]

    @property
    def bs(self) -> int:
        return int(self.q_lens.numel())

    @property
    def tokens(self) -> int:
        return int(self.window_keys.numel())

    @property
    def prefix_ids(self) -> int:
        return int(self.prefix_kv_indptr[-1])

    @property
    def window_ids(self) -> int:
        return int(self.window_kv_indptr[-1])

    @property
    def prefix_empty(self):
        """Per token: this rank holds no key of its request's prefix."""
        import torch

        return torch.repeat_interleave(self.prefix_keys == 0, self.q_lens.to(torch.int64))

    @property
    def window_empty(self):
        return self.window_keys == 0

    def device_pack(self):
        """Every number the device work reads, in one host int32 tensor (one copy to the device), laid out as
        :data:`PACK` says: see :func:`unpack`."""
        import torch

        parts = {"prefix_empty": self.prefix_empty.to(torch.int32), "window_empty": self.window_empty.to(torch.int32)}
        return torch.cat([parts[name] if name in parts else getattr(self, name) for name, _ in PACK])

    @property
    def host_elements(self) -> int:
        """Every element this plan made on the host, for the cost bench (``bench/verify_cost.py``)."""
        return sum(int(t.numel()) for t in (self.q_lens, self.prefix_qo_indptr, self.prefix_keys, self.prefix_kv_len,
                                            self.prefix_kv_indptr, self.window_start, self.window_keys,
                                            self.window_qo_indptr, self.window_kv_len, self.window_kv_indptr))


# The device pack: each entry's name and length, from (bs, tokens). A verify graph binds its wrappers' indptrs and
# lengths to views of it, so the one copy of the pack at a replay refreshes every buffer the plan binds, and the
# merge reads the flags from it as they are.
PACK = (
    ("q_lens", lambda bs, t: bs),
    ("prefix_qo_indptr", lambda bs, t: bs + 1),
    ("prefix_keys", lambda bs, t: bs),
    ("prefix_kv_len", lambda bs, t: bs),
    ("prefix_kv_indptr", lambda bs, t: bs + 1),
    ("window_start", lambda bs, t: t),
    ("window_keys", lambda bs, t: t),
    ("window_qo_indptr", lambda bs, t: t + 1),
    ("window_kv_len", lambda bs, t: t),
    ("window_kv_indptr", lambda bs, t: t + 1),
    ("prefix_empty", lambda bs, t: t),
    ("window_empty", lambda bs, t: t),
)


def pack_size(bs: int, tokens: int) -> int:
    return sum(size(bs, tokens) for _, size in PACK)


@dataclass(frozen=True)
class DeviceMeta:
    """Views of the device pack, at fixed offsets for a given (bs, tokens): a captured graph reads the same
    addresses on every replay, and the replay refreshes their contents. Int32, the flags included (non-zero:
    the side is empty), in the form the merge reads."""

    q_lens: Any
    prefix_qo_indptr: Any
    prefix_keys: Any
    prefix_kv_len: Any
    prefix_kv_indptr: Any
    window_start: Any
    window_keys: Any
    window_qo_indptr: Any
    window_kv_len: Any
    window_kv_indptr: Any
    prefix_empty: Any
    window_empty: Any


def unpack(pack, bs: int, tokens: int) -> DeviceMeta:
    views, at = {}, 0
    for name, size in PACK:
        n = size(bs, tokens)
        views[name] = pack[at: at + n]
        at += n
    return DeviceMeta(**views)


def owned_count(bound, dcp_size: int, dcp_rank: int):
    """How many of positions ``0 .. bound - 1`` rank ``dcp_rank`` holds (the owner rule, interleave 1)."""
    import torch

    return torch.clamp(torch.div(bound - dcp_rank + dcp_size - 1, dcp_size, rounding_mode="floor"), min=0)


def window_keys(prefix_lens, j, dcp_size: int, dcp_rank: int):
    """This rank's window keys for draft token ``j`` of a request with prefix ``H``: its positions in
    ``H .. H + j`` (the token sees its own KV, written with the window)."""
    return owned_count(prefix_lens + j + 1, dcp_size, dcp_rank) - owned_count(prefix_lens, dcp_size, dcp_rank)


def plan_split(prefix_lens, q_lens, *, dcp_size: int, dcp_rank: int) -> SplitPlan:
    """The split plan from host lengths: ``prefix_lens[r]`` committed tokens and ``q_lens[r]`` draft tokens."""
    import torch

    prefix = torch.as_tensor(prefix_lens).to(torch.int64).cpu()
    q = torch.as_tensor(q_lens).to(torch.int64).cpu()
    if prefix.dim() != 1 or q.shape != prefix.shape:
        raise ValueError(f"a verify plan needs one prefix length and one draft-token count per request; got "
                         f"{tuple(prefix.shape)} and {tuple(q.shape)}")
    if bool((q < 1).any()) or bool((prefix < 0).any()):
        raise ValueError("a verify request has no draft token, or a negative prefix")
    request = torch.repeat_interleave(torch.arange(len(q)), q)
    first = torch.zeros(len(q) + 1, dtype=torch.int64)
    first[1:] = torch.cumsum(q, 0)
    j = torch.arange(int(first[-1])) - first[:-1][request]
    p_keys = owned_count(prefix, dcp_size, dcp_rank)
    w_keys = window_keys(prefix[request], j, dcp_size, dcp_rank)
    p_len, w_len = torch.clamp(p_keys, min=1), torch.clamp(w_keys, min=1)
    i32 = torch.int32
    return SplitPlan(
        dcp_size=dcp_size, dcp_rank=dcp_rank, q_lens=q.to(i32), prefix_qo_indptr=first.to(i32),
        prefix_keys=p_keys.to(i32), prefix_kv_len=p_len.to(i32), prefix_kv_indptr=_indptr(p_len),
        window_start=prefix[request].to(i32), window_keys=w_keys.to(i32),
        window_qo_indptr=torch.arange(len(j) + 1, dtype=i32), window_kv_len=w_len.to(i32),
        window_kv_indptr=_indptr(w_len))


def _indptr(lengths):
    import torch

    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.cumsum(lengths, 0)
    return out


def build_ids(plan: SplitPlan, source, req_pool_indices, prefix_out, window_out, meta: DeviceMeta) -> None:
    """This rank's kernel ids for both sides, gathered on the device from ``source`` (the translator's read
    source under DCP: ``req_to_token`` itself, virtual ids) by sglang's DCP index builder, which keeps the
    positions this rank owns and translates them ``// dcp``. ``meta`` holds the plan's numbers on the device
    already. A filler slot reads row 0. No host sync."""
    import torch
    from sglang.kernels.ops.attention.dcp_kernels import create_triton_kv_indices_for_dcp_triton

    bs, tokens = plan.bs, plan.tokens
    rows = source.row_ids[:bs]
    # Zeroed first: a row this rank holds no key of is not written by the builder, and its filler slot must
    # name a row of the pool.
    prefix_out[: plan.prefix_ids].zero_()
    window_out[: plan.window_ids].zero_()
    stride = source.row_stride
    create_triton_kv_indices_for_dcp_triton[(bs,)](
        source.ids, rows, meta.prefix_keys, meta.prefix_kv_indptr, None, prefix_out, stride,
        plan.dcp_size, plan.dcp_rank)
    token_rows = torch.repeat_interleave(rows, meta.q_lens, output_size=tokens)
    create_triton_kv_indices_for_dcp_triton[(tokens,)](
        source.ids, token_rows, meta.window_keys, meta.window_kv_indptr, meta.window_start, window_out, stride,
        plan.dcp_size, plan.dcp_rank)


def merge(prefix_out, prefix_lse, window_out, window_lse, meta: DeviceMeta):
    """Per query, the rank's partial over both sides, flagged by the plan: one launch
    (:func:`.verify_merge.merge_verify_sides`), written over the prefix side's tensors."""
    from .verify_merge import merge_verify_sides

    return merge_verify_sides(prefix_out, prefix_lse, window_out, window_lse, meta.prefix_empty, meta.window_empty)


def merge_partials(out_a, lse_a, out_b, lse_b, empty_a, empty_b):
    """Two partials of the same queries merged by their base-2 LSE, each flagged side (a bool or int per query)
    weighed at zero; a query with both sides flagged gets (0, -inf). The same kernel as :func:`merge`; side a's
    tensors are overwritten."""
    import torch

    from .verify_merge import merge_verify_sides

    return merge_verify_sides(out_a, lse_a, out_b, lse_b, empty_a.to(torch.int32), empty_b.to(torch.int32))


def replan(wrapper, qo_indptr, kv_indptr, kv_len, heads: int, head_dim_ckv: int) -> None:
    """A replay's plan of a wrapper planned at capture: flashinfer's native scheduler on the host lengths, into
    the workspaces the capture's plan made (its pinned one included), as sglang's ``fast_mla_prefill_plan``
    plans stock's verify replay. Nothing is copied here: the builder wrote the ids into the bound buffer, and
    the pack's copy refreshed the bound indptrs and lengths. flashinfer's full ``plan()`` would validate and
    snapshot every bound buffer (the whole ``cuda_graph_kv_indices`` among them) and allocate its workspaces
    again, on every replay."""
    wrapper._cached_module.plan(wrapper._float_workspace_buffer, wrapper._int_workspace_buffer,
                                wrapper._pin_memory_int_workspace_buffer, qo_indptr, kv_indptr, kv_len, heads,
                                head_dim_ckv, False)


def kv_handed(plan: SplitPlan) -> int:
    """KV tokens handed to the kernel by this rank's plan, filler slots included."""
    return plan.prefix_ids + plan.window_ids


def window_capacity(draft_tokens: int, dcp_size: int) -> int:
    """The most ids one window row is planned with: ``ceil(q / dcp)`` keys, and at least the filler."""
    return max(1, -(-int(draft_tokens) // int(dcp_size)))
