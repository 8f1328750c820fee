"""The target verify under DCP on flashinfer MLA: each rank plans its own rows, one query per row.

Why stock sglang gets it wrong (0.5.23, ``flashinfer_mla_backend.py``): the
verify is planned like a prefill, with the request's *virtual* ids, its global
length and a bottom-right causal mask, over heads / attn_tp. Under DCP the
model all-gathers q (heads x dcp) and merges the ranks' partials by their LSE,
as it does for a decode; the prefill wrapper returns no LSE, so the unpack
raises (or, for a batch of exactly two tokens, splits the output silently).

What a rank must compute instead, for draft token ``j`` of a request whose
committed prefix is ``H`` tokens long: attention over the keys *this rank
holds* among positions ``0 .. H + j``. Translating the ids is not enough.
Rank-local lengths with flashinfer's bottom-right causal bound cut the wrong
keys: the bound counts this rank's keys from the end, while the true bound is
a position.

The design here is vLLM #47181's: every draft token becomes a row of its own
with one query, planned without a causal mask over exactly the keys that
token may see on this rank. That is the plan sglang already makes for a DCP
decode (``qo_indptr = arange``, rank-local lengths, heads x dcp, the LSE
returned), so the verify reaches the kernel path and the merge the decode
proves. The cost is that a request's prefix ids are handed to the kernel once
per draft token; a two-stage split (0.5.23's aiter verify: the prefix once,
non-causal, then the window per row, merged locally) reads them once.

Ownership follows sglang's owner rule (a logical loc ``L`` lives on rank
``L % dcp`` at row ``L // dcp``). Locs are handed out in logical pages of
``page_size * dcp`` slots, so position ``p`` of a request sits at a loc with
``L % dcp == p % dcp``: which positions a rank holds is known on the host
from the lengths alone, without reading the ids back from the device.

A row whose draft token sees no key on this rank still gets one slot (the
kernel is not asked to attend over nothing) and its result is replaced by the
neutral partial, output 0 and LSE -inf, which the merge weighs at zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class TopkRefused(ValueError):
    """A verify tree (topk > 1): its mask is not a per-row bound, and this plan does not carry it."""


@dataclass
class VerifyRows:
    """One rank's plan for a verify batch: one row per draft token.

    ``gather`` indexes the batch's virtual id stream (the one
    ``generate_attn_arg_prefill`` packs: request by request, position order);
    an empty row's single slot has ``gather = -1``.
    """

    qo_indptr: Any  # [rows + 1] int32, arange
    kv_indptr: Any  # [rows + 1] int32
    kv_len: Any  # [rows] int32, at least 1
    gather: Any  # [kv_indptr[-1]] int64
    empty: Any  # [rows] bool: the rank holds no key this draft token may see

    @property
    def rows(self) -> int:
        return int(self.kv_len.numel())


def owned_count(bound, dcp_size: int, dcp_rank: int):
    """How many of positions ``0 .. bound - 1`` rank ``dcp_rank`` holds (the owner rule, interleave 1)."""
    import torch

    return torch.clamp(torch.div(bound - dcp_rank + dcp_size - 1, dcp_size, rounding_mode="floor"), min=0)


def verify_rows(qo_indptr, kv_indptr, *, dcp_size: int, dcp_rank: int) -> VerifyRows:
    """Per-row plan from the verify's CSR layout (host tensors): request ``r`` has ``q_r`` draft tokens, the
    last ``q_r`` of its ``L_r`` positions; draft token ``j`` may see positions ``0 .. L_r - q_r + j``."""
    import torch

    qo, kv = qo_indptr.to(torch.int64).cpu(), kv_indptr.to(torch.int64).cpu()
    q_len, kv_len = qo[1:] - qo[:-1], kv[1:] - kv[:-1]
    if bool((q_len > kv_len).any()):
        raise ValueError("a verify request has more draft tokens than positions")
    request = torch.repeat_interleave(torch.arange(len(q_len)), q_len)
    j = torch.arange(int(q_len.sum())) - torch.repeat_interleave(qo[:-1], q_len)
    visible = (kv_len - q_len)[request] + j + 1  # positions 0 .. H + j
    count = owned_count(visible, dcp_size, dcp_rank)
    slots = torch.clamp(count, min=1)
    row_of = torch.repeat_interleave(torch.arange(len(slots)), slots)
    first = torch.zeros(len(slots) + 1, dtype=torch.int64)
    first[1:] = torch.cumsum(slots, 0)
    k = torch.arange(int(first[-1])) - first[:-1][row_of]
    gather = kv[:-1][request][row_of] + dcp_rank + dcp_size * k
    gather = torch.where(count[row_of] > 0, gather, torch.full_like(gather, -1))
    return VerifyRows(qo_indptr=torch.arange(len(slots) + 1, dtype=torch.int32), kv_indptr=first.to(torch.int32),
                      kv_len=slots.to(torch.int32), gather=gather, empty=count == 0)


def row_ids(rows: VerifyRows, virtual_ids, translate, out=None):
    """The kernel's ids for ``rows``: this rank's virtual ids, translated to its rows; an empty row reads row 0
    (any row of the pool: its result is discarded). ``translate`` is the translator's read door
    (``KVIndexTranslator.translate_dcp_read_ids``, ``widened // dcp``). Device work only, no host sync."""
    import torch

    gather = rows.gather.to(virtual_ids.device, non_blocking=True)
    ids = translate(virtual_ids[torch.clamp(gather, min=0)].to(torch.int64))
    ids = torch.where(gather >= 0, ids, torch.zeros_like(ids)).to(torch.int32)
    if out is None:
        return ids
    out[: ids.numel()].copy_(ids)
    return out[: ids.numel()]


def neutralise(out, lse, empty) -> None:
    """Give each empty row the neutral partial: output 0, LSE -inf (the merge then weighs it at zero)."""
    # No early return on "no empty row": under a CUDA graph this runs once at capture and then replays on
    # whatever the plan wrote into ``empty``.
    empty = empty.to(out.device, non_blocking=True)
    out.masked_fill_(empty.view(-1, *([1] * (out.dim() - 1))), 0.0)
    lse.masked_fill_(empty.view(-1, *([1] * (lse.dim() - 1))), float("-inf"))
