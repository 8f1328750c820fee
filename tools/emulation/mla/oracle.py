"""What flashinfer's ``BatchMLAPagedAttentionWrapper`` computes from its plan, on CPU, in plain torch.

Written from flashinfer's documented contract for the MLA wrapper (``plan`` then
``run``), not from its kernels:

- ``plan(qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv,
  head_dim_kpe, page_size, causal, sm_scale, q_data_type, kv_data_type)``.
  Request ``i`` owns queries ``qo_indptr[i]:qo_indptr[i+1]`` and pages
  ``kv_indices[kv_indptr[i]:kv_indptr[i+1]]``; its KV length is
  ``kv_len_arr[i]``, the last page filled only as far as that length needs.
- ``run(q_nope, q_pe, ckv_cache, kpe_cache, return_lse=...)``. The score of a
  query and a key is ``sm_scale * (q_nope . ckv + q_pe . kpe)``. The output is
  the softmax-weighted sum of the keys' ``ckv`` rows (MLA's values are its
  compressed keys). The LSE is in base 2: ``log2(sum(exp(score)))``.
- ``causal=True`` aligns the queries to the *bottom right*. In a request with
  ``q`` queries and ``L`` keys, query ``j`` sees keys ``0 .. L - q + j``. A
  top-left alignment (keys ``0 .. j``) is a different function; the tests keep
  a case that tells the two apart.

A row longer than ``SPLIT_KV`` keys is computed as flashinfer's scheduler splits a
long row over several CTAs: in chunks of ``SPLIT_KV`` keys, each with its own
(output, LSE), merged by LSE at the end (flashinfer's in-kernel merge). So code
proven on the oracle runs the split path wherever a rank's row is long, and a
kernel that merges its chunks wrongly is a control (``split-kv-unweighted``).

Two things flashinfer does not document are made strict here so that code
proven on the oracle does not lean on them: a request with no KV at all
raises (sglang's own DCP code gives an empty shard one slot because "the
attention kernel fails on a shard of length zero", ``dcp_kernels.py``), and a
page id outside the cache raises (on a GPU: an illegal access or another
request's rows). A query that the causal bound leaves no key gets the neutral
state, output 0 and LSE -inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LOG2E = 1.0 / math.log(2.0)
# Keys per chunk of a split row. On a GPU flashinfer splits rows of thousands of keys (a rank's 16K-key rows at
# 128K context and dcp 8); the oracle splits at 256 so that CPU-sized rows take the same path.
SPLIT_KV = 256


class PlanError(ValueError):
    """A plan or a run the wrapper would refuse, or that would read outside the cache."""


@dataclass
class Plan:
    qo_indptr: list[int]
    kv_indptr: list[int]
    kv_indices: list[int]
    kv_len: list[int]
    num_heads: int
    head_dim_ckv: int
    head_dim_kpe: int
    page_size: int
    causal: bool
    sm_scale: float


class MLAOracle:
    """``plan`` and ``run`` with the wrapper's signatures; ``run`` returns ``out`` or ``(out, lse)``.

    ``top_left``, ``lse_base_e`` and ``unweighted_split`` break the contract on purpose, for controls."""

    def __init__(self, *, top_left: bool = False, lse_base_e: bool = False, unweighted_split: bool = False) -> None:
        self.planned: Plan | None = None
        self.top_left, self.lse_base_e, self.unweighted_split = top_left, lse_base_e, unweighted_split

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe, page_size,
             causal, sm_scale, q_data_type=None, kv_data_type=None) -> None:
        qo, kv, lens = (_ints(x) for x in (qo_indptr, kv_indptr, kv_len_arr))
        if len(qo) != len(kv) or len(lens) != len(qo) - 1:
            raise PlanError(f"plan: {len(qo)} qo_indptr, {len(kv)} kv_indptr and {len(lens)} kv lengths do not "
                            f"describe one batch (expected n+1, n+1, n)")
        for i, n in enumerate(lens):
            pages = kv[i + 1] - kv[i]
            if pages != -(-n // page_size):
                raise PlanError(f"plan: request {i} has {pages} pages for {n} tokens at page size {page_size}")
        self.planned = Plan(qo, kv, _ints(kv_indices)[: kv[-1]], lens, int(num_heads), int(head_dim_ckv),
                            int(head_dim_kpe), int(page_size), bool(causal), float(sm_scale))

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse: bool = False):
        import torch

        p = self.planned
        if p is None:
            raise PlanError("run before plan")
        ckv = ckv_cache.reshape(-1, p.page_size, p.head_dim_ckv)
        kpe = kpe_cache.reshape(-1, p.page_size, p.head_dim_kpe)
        tokens = q_nope.shape[0]
        if tokens != p.qo_indptr[-1] or q_nope.shape[1] != p.num_heads:
            raise PlanError(f"run: q is {tuple(q_nope.shape)}, the plan has {p.qo_indptr[-1]} queries x "
                            f"{p.num_heads} heads")
        o = torch.zeros(tokens, p.num_heads, p.head_dim_ckv, dtype=torch.float64)
        s = torch.full((tokens, p.num_heads), float("-inf"), dtype=torch.float64)
        for i, n in enumerate(p.kv_len):
            q0, q1 = p.qo_indptr[i], p.qo_indptr[i + 1]
            if q1 == q0:
                continue
            if n == 0:
                raise PlanError(f"run: request {i} has no KV (a shard of length zero)")
            pages = p.kv_indices[p.kv_indptr[i]: p.kv_indptr[i + 1]]
            if min(pages) < 0 or max(pages) >= ckv.shape[0]:
                raise PlanError(f"run: request {i} reads page {max(pages) if max(pages) >= 0 else min(pages)}, "
                                f"outside a cache of {ckv.shape[0]} pages")
            keys_c = ckv[pages].reshape(-1, p.head_dim_ckv)[:n].double()
            keys_r = kpe[pages].reshape(-1, p.head_dim_kpe)[:n].double()
            qn, qr = q_nope[q0:q1].double(), q_pe[q0:q1].double()
            score = (torch.einsum("qhd,kd->qhk", qn, keys_c) + torch.einsum("qhd,kd->qhk", qr, keys_r)) * p.sm_scale
            if p.causal:
                # bottom-right: query j sees keys 0 .. n - q + j (top-left, the control: keys 0 .. j)
                last = torch.arange(q1 - q0) + (0 if self.top_left else n - (q1 - q0))
                hidden = torch.arange(n)[None, :] > last[:, None]
                score = score.masked_fill(hidden[:, None, :], float("-inf"))
            chunks = [_attend(score[..., at: at + SPLIT_KV], keys_c[at: at + SPLIT_KV]) for at in range(0, n, SPLIT_KV)]
            out_r, lse_r = chunks[0] if len(chunks) == 1 else _merge_chunks(chunks, self.unweighted_split)
            o[q0:q1] = out_r
            base = 1.0 if self.lse_base_e else LOG2E
            s[q0:q1] = lse_r * base
        result = o.to(q_nope.dtype)
        if out is not None:
            out.copy_(result)
            result = out
        if not return_lse:
            return result
        s = s.float()
        if lse is not None:
            lse.copy_(s)
            s = lse
        return result, s


class OracleMLAWrapper:
    """``BatchMLAPagedAttentionWrapper`` as its constructor, ``plan`` and ``run`` are documented, computed by
    :class:`MLAOracle`. Built with ``use_cuda_graph=True``, it is bound to the buffers it is given: ``plan``
    copies into them (each of the size flashinfer copies into: the indptrs and lengths whole, the ids as a
    prefix). As flashinfer's ``run`` (its plan info and ``_kv_indices_buf``), the kernel reads the rows the plan
    scheduled from the ids buffer as it is when it runs, so an ids buffer rebound or overwritten between plan and
    run shows."""

    oracle_options: dict = {}

    def __init__(self, float_workspace_buffer=None, use_cuda_graph: bool = False, qo_indptr=None, kv_indptr=None,
                 kv_indices=None, kv_len_arr=None, backend: str = "auto") -> None:
        self.oracle = MLAOracle(**self.oracle_options)
        self.use_cuda_graph = use_cuda_graph
        self._qo_indptr_buf, self._kv_indptr_buf = qo_indptr, kv_indptr
        self._kv_indices_buf, self._kv_len_arr_buf = kv_indices, kv_len_arr
        self._plan_args: tuple | None = None
        # What sglang's replay plans (fast_mla_prefill_plan, the split verify's replan) hand flashinfer's native
        # scheduler: the workspaces of the first plan, and the module it was planned with.
        self._float_workspace_buffer = float_workspace_buffer
        self._int_workspace_buffer = self._pin_memory_int_workspace_buffer = None
        self._cached_module = _FastPlan(self)

    def fast_plan(self, num_heads, head_dim_ckv, causal, qo_indptr=None, kv_indptr=None, kv_len_arr=None) -> None:
        """The native scheduler alone: the plan a replay makes after the capture's full plan (which gave the rest:
        the rope dim, page size and scale), on the host lengths it is handed, as flashinfer's ``_cached_module.plan``
        schedules from them (the bound buffers' where none is handed)."""
        if self._plan_args is None:
            raise PlanError("a fast plan before the first plan(): flashinfer has no module to plan with yet")
        _, _, _, _, _, _, head_dim_kpe, page_size, _, sm_scale = self._plan_args
        qo, kv, lens = (self._qo_indptr_buf if qo_indptr is None else qo_indptr,
                        self._kv_indptr_buf if kv_indptr is None else kv_indptr,
                        self._kv_len_arr_buf if kv_len_arr is None else kv_len_arr)
        self._plan_args = (qo.clone(), kv.clone(), self._kv_indices_buf, lens.clone(), num_heads, head_dim_ckv,
                           head_dim_kpe, page_size, causal, sm_scale)
        self.oracle.plan(*self._plan_args)

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe, page_size,
             causal, sm_scale, q_data_type=None, kv_data_type=None, use_profiler: bool = False) -> None:
        if self.use_cuda_graph:
            for name, buf, value in (("qo_indptr", self._qo_indptr_buf, qo_indptr),
                                     ("kv_indptr", self._kv_indptr_buf, kv_indptr),
                                     ("kv_len_arr", self._kv_len_arr_buf, kv_len_arr)):
                if buf is None or buf.numel() != value.numel():
                    raise PlanError(f"plan: {name} has {value.numel()} entries, the CUDA-graph buffer bound at "
                                    f"construction {None if buf is None else buf.numel()}")
                buf.copy_(value)
            if self._kv_indices_buf is None or self._kv_indices_buf.numel() < kv_indices.numel():
                raise PlanError(f"plan: {kv_indices.numel()} kv_indices, more than the CUDA-graph buffer holds")
            if kv_indices.data_ptr() != self._kv_indices_buf.data_ptr():
                self._kv_indices_buf[: kv_indices.numel()].copy_(kv_indices)
            kv_indices = self._kv_indices_buf
        # The schedule is fixed at plan time (flashinfer's run takes its plan info and the ids buffer, not the
        # indptrs or the lengths), so they are kept as planned; the ids are read when the kernel runs.
        self._plan_args = (qo_indptr.clone(), kv_indptr.clone(), kv_indices, kv_len_arr.clone(), num_heads,
                           head_dim_ckv, head_dim_kpe, page_size, causal, sm_scale)
        self.oracle.plan(*self._plan_args)

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse: bool = False, **_unused):
        if self.use_cuda_graph and self._plan_args is not None:  # the kernel reads the bound ids as they are now
            self.oracle.plan(*self._plan_args)
        return self.oracle.run(q_nope, q_pe, ckv_cache, kpe_cache, out=out, lse=lse, return_lse=return_lse)


class _FastPlan:
    """``_cached_module`` as sglang's replay plans call it: ``plan(float_ws, int_ws, pinned_ws, qo_indptr,
    kv_indptr, kv_len_arr, num_heads, head_dim_ckv, causal)``."""

    def __init__(self, wrapper: OracleMLAWrapper) -> None:
        self.wrapper = wrapper

    def plan(self, float_ws, int_ws, pin_ws, qo_indptr, kv_indptr, kv_len_arr, num_heads, head_dim_ckv, causal):
        self.wrapper.fast_plan(num_heads, head_dim_ckv, causal, qo_indptr, kv_indptr, kv_len_arr)


class BaseELseWrapper(OracleMLAWrapper):
    """Control for the kernel check: returns its LSE in base e."""

    oracle_options = {"lse_base_e": True}


class DropsEmptyRowWrapper(OracleMLAWrapper):
    """Control for the kernel check: takes a row planned with one slot (the filler an empty row gets) for a row
    with no key and drops its result: output 0, LSE -inf. A row that really holds one key is lost with it."""

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse: bool = False, **_unused):

        result = super().run(q_nope, q_pe, ckv_cache, kpe_cache, out=out, lse=lse, return_lse=True)
        o, s = result
        p = self.oracle.planned
        for i, n in enumerate(p.kv_len):
            if n == 1:
                o[p.qo_indptr[i]: p.qo_indptr[i + 1]] = 0
                s[p.qo_indptr[i]: p.qo_indptr[i + 1]] = float("-inf")
        return (o, s) if return_lse else o
class UnweightedSplitWrapper(OracleMLAWrapper):
    """Control for the kernel check: a long row's chunks merged without their LSE weights."""

    oracle_options = {"unweighted_split": True}


class StaleReplayWrapper(OracleMLAWrapper):
    """Control for the kernel check: a replay's plan does nothing, so the graph runs on the capture's plan (a
    kernel that snapshots its metadata at plan() and ignores the lengths a replay plans with)."""

    def fast_plan(self, num_heads, head_dim_ckv, causal, *lengths) -> None:
        pass

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse: bool = False, **_unused):
        return self.oracle.run(q_nope, q_pe, ckv_cache, kpe_cache, out=out, lse=lse, return_lse=return_lse)


BROKEN_KERNELS = {"lse-base-e": BaseELseWrapper, "drops-empty-row": DropsEmptyRowWrapper,
                  "split-kv-unweighted": UnweightedSplitWrapper, "stale-replay": StaleReplayWrapper}


def _attend(score, keys_c):
    """One chunk of a row: softmax-weighted keys and the natural-log LSE; (0, -inf) where no key is visible."""
    import torch

    top = score.amax(-1, keepdim=True)
    seen = torch.isfinite(top)
    weight = torch.where(seen, torch.exp(score - torch.where(seen, top, 0.0)), 0.0)
    total = weight.sum(-1)
    out = torch.einsum("qhk,kd->qhd", weight, keys_c) / torch.where(total > 0, total, 1.0)[..., None]
    return out, torch.where(total > 0, torch.log(total) + top.squeeze(-1), float("-inf"))


def _merge_chunks(chunks, unweighted: bool):
    """A split row's chunks merged by their LSE, as flashinfer's merge does; ``unweighted`` is the control's
    wrong merge: the chunks' outputs averaged as if they held the same mass."""
    import torch

    lses = torch.stack([lse for _, lse in chunks])
    total = torch.logsumexp(lses, 0)
    if unweighted:
        seen = torch.isfinite(lses).double()
        out = sum(o * seen[i][..., None] for i, (o, _) in enumerate(chunks)) / seen.sum(0).clamp(min=1)[..., None]
        return out, total
    weights = torch.exp(lses - torch.where(torch.isfinite(total), total, 0.0)).nan_to_num(0.0)
    return sum(o * weights[i][..., None] for i, (o, _) in enumerate(chunks)), total


def _ints(x) -> list[int]:
    return [int(v) for v in (x.tolist() if hasattr(x, "tolist") else x)]


def dense_reference(q_nope, q_pe, keys_c, keys_r, sm_scale: float, visible):
    """Softmax attention written out for one request, with an explicit mask ``visible[query, key]``: the
    oracle's tests compare it with the paged, planned form. Returns ``(out, lse base 2)`` in float64."""
    import torch

    score = (torch.einsum("qhd,kd->qhk", q_nope.double(), keys_c.double())
             + torch.einsum("qhd,kd->qhk", q_pe.double(), keys_r.double())) * sm_scale
    score = score.masked_fill(~visible[:, None, :], float("-inf"))
    lse = torch.logsumexp(score, -1)
    out = torch.einsum("qhk,kd->qhd", torch.softmax(score, -1), keys_c.double())
    return out, lse * LOG2E
