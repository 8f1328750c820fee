"""The verify under DCP checked on the kernel it will run, once per process, before the first DCP verify.

The verify's proof (``tools/emulation/mla/verify_dcp.py``) runs on CPU, with a reference
of flashinfer's ``BatchMLAPagedAttentionWrapper`` written from its documented
contract. It rests on assumptions that contract does not spell out in full. If
one is false on a GPU, the plugin would admit a launch and serve wrong tokens
without a word, so each is checked on the real wrapper, on the device the
verify runs on, with the head count, dims and dtypes it plans, against
attention written out in torch on the same device:

- ``rows``: a row planned without a mask gives each of its queries softmax
  attention over exactly the row's keys: several queries in one row (the
  prefix side), one query, a row of one key, and rows after a filler row;
- ``lse-base``: the LSE the wrapper returns is ``log2(sum(exp(score)))``, the
  base the verify's merges are told;
- ``causal``: ``causal=True`` aligns a row's queries to the bottom right (the
  one-rank verify the proof compares with plans that way);
- ``merge``: two halves of a row's keys, each run alone and merged by the
  verify's own merge, equal the whole, and a half that is the neutral
  partial leaves the other half as it is;
- ``replan``: a wrapper bound to buffers for CUDA graphs gives the right
  answer after it is planned again with other lengths, as every replay plans it.

A disagreement past the dtype's tolerance raises :class:`KernelCheckFailed`
with one line naming the assumption and the flag that avoids the verify; the
launch then stops while its attention backend is built or its first verify
graph is captured, before it serves a token. ``SGLANG_ENABLE_DCP_DSPARK_PLUGIN=0``
turns the check off with the rest of the plugin.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

logger = logging.getLogger(__name__)

AVOID = "launch with --dcp-size 1, or without --speculative-algorithm"
# Per dtype: max |error| of an output and of an LSE against torch's attention on the same inputs. A kernel
# that computes in bf16 stays well inside; each assumption the check tests breaks by far more (LSE base e is
# off by a third of the LSE, a top-left mask or a dropped row by whole attention outputs).
TOLERANCE = {"float32": (1e-4, 1e-4), "float64": (1e-8, 1e-8), "bfloat16": (3e-2, 5e-2), "float16": (1e-2, 2e-2)}


class KernelCheckFailed(RuntimeError):
    """The kernel breaks an assumption the verify under DCP rests on; the message is one line."""

    def __init__(self, assumption: str, detail: str) -> None:
        self.assumption = assumption
        super().__init__(f"dcp_dspark: the verify under DCP cannot run on this kernel ({assumption}): {detail}; "
                         f"it would serve wrong tokens: {AVOID}")


_passed: set[str] = set()


def ensure(backend, wrapper_class) -> None:
    """Run :func:`check` for ``backend``'s device and plan shape, unless it passed in this process already."""
    updater = backend.indices_updater_prefill
    shape = dict(num_heads=int(backend.indices_updater_decode.num_local_heads), head_dim_ckv=int(updater.kv_lora_rank),
                 head_dim_kpe=int(updater.qk_rope_head_dim), sm_scale=float(updater.scaling),
                 q_dtype=updater.q_data_type, kv_dtype=updater.data_type)
    key = f"{backend.device}|{wrapper_class.__module__}.{wrapper_class.__qualname__}|{sorted(shape.items())}"
    if key in _passed:
        return
    try:
        check(wrapper_class, workspace=backend.workspace_buffer, device=backend.device, **shape)
    except KernelCheckFailed as exc:
        logger.error("%s", exc)
        raise
    _passed.add(key)
    logger.info("dcp_dspark: the verify under DCP's kernel check passed on %s (%s)", backend.device,
                ", ".join(CHECKS))


CHECKS = ("rows", "lse-base", "causal", "merge", "replan")


def check(wrapper_class, *, workspace, device, num_heads: int, head_dim_ckv: int, head_dim_kpe: int, sm_scale: float,
          q_dtype, kv_dtype, merge: Callable | None = None) -> None:
    """Every assumption in the module docstring, on ``wrapper_class`` (flashinfer's, or a stand-in for it)."""
    import torch

    if merge is None:
        from .dcp_verify import merge_partials as merge
    case = _Case(torch, device, num_heads, head_dim_ckv, head_dim_kpe, sm_scale, q_dtype, kv_dtype)
    out_tol, lse_tol = TOLERANCE.get(str(q_dtype).removeprefix("torch."), TOLERANCE["bfloat16"])

    # One batch the way the verify plans it: a multi-query row, a filler row, a row of one key, a one-query row.
    rows = [([0, 1, 2], list(range(3, 14))), ([3], None), ([4, 5], [20]), ([6], [30, 31, 32, 33, 34, 35])]
    wrapper = case.graph_wrapper(wrapper_class, workspace, rows=len(rows), ids=64)
    out, lse = case.run(wrapper, rows, causal=False)
    want_out, want_lse = case.dense(rows, causal=False)
    planned = [q for qs, keys in rows if keys is not None for q in qs]
    _compare("rows", "a row planned without a mask does not attend over exactly its keys (several queries, one "
             "query, one key, after a filler row)", out[planned], want_out[planned], out_tol)
    _compare_lse(lse[planned], want_lse[planned], lse_tol)

    # The causal alignment the one-rank reference plans with.
    causal = [([0, 1, 2, 3], list(range(40, 49)))]
    c_out, _ = case.run(case.graph_wrapper(wrapper_class, workspace, rows=1, ids=16), causal, causal=True)
    want_c, _ = case.dense(causal, causal=True)
    top_left, _ = case.dense(causal, causal=True, top_left=True)
    if not case.close(c_out[:4], want_c[:4], out_tol):
        aligned = " (it aligns them top-left)" if case.close(c_out[:4], top_left[:4], out_tol) else ""
        raise KernelCheckFailed("causal", f"causal=True does not align a row's queries to the bottom right{aligned}, "
                                          f"max error {case.error(c_out[:4], want_c[:4]):.2g}")

    # Halves merged by the verify's merge against the whole, and a neutral half.
    whole = [([7], list(range(50, 63)))]
    halves = ([([7], list(range(50, 56)))], [([7], list(range(56, 63)))])
    # A wrapper each, so that this tests the merge alone (planning one wrapper again is the last check's).
    w_out, w_lse = case.run(case.graph_wrapper(wrapper_class, workspace, rows=1, ids=16), whole, causal=False)
    a_out, a_lse = case.run(case.graph_wrapper(wrapper_class, workspace, rows=1, ids=16), halves[0], causal=False)
    b_out, b_lse = case.run(case.graph_wrapper(wrapper_class, workspace, rows=1, ids=16), halves[1], causal=False)
    no, yes = torch.zeros(1, dtype=torch.bool, device=device), torch.ones(1, dtype=torch.bool, device=device)
    m_out, m_lse = merge(a_out[7:8].clone(), a_lse[7:8].clone(), b_out[7:8].clone(), b_lse[7:8].clone(), no, no)
    _compare("merge", "two halves of a row merged by LSE are not the whole row", m_out, w_out[7:8], out_tol)
    _compare("merge", "two halves of a row merged by LSE do not give the whole row's LSE", m_lse, w_lse[7:8], lse_tol)
    n_out, n_lse = merge(a_out[7:8].clone(), a_lse[7:8].clone(), b_out[7:8].clone(), b_lse[7:8].clone(), yes, no)
    _compare("merge", "a neutral half merged by LSE changes the other half", n_out, b_out[7:8], out_tol)
    e_out, e_lse = merge(a_out[7:8].clone(), a_lse[7:8].clone(), b_out[7:8].clone(), b_lse[7:8].clone(), yes, yes)
    if bool(e_out.abs().max() != 0) or not bool(torch.isneginf(e_lse).all()):
        raise KernelCheckFailed("merge", "two neutral halves do not merge to the neutral partial (0, -inf)")

    # The graph wrapper planned again with other lengths, into the same bound buffers.
    again = [([0, 1, 2], list(range(8, 12))), ([3], list(range(14, 30))), ([4, 5], None), ([6], [2])]
    r_out, _ = case.run(wrapper, again, causal=False)
    want_r, _ = case.dense(again, causal=False)
    planned = [q for qs, keys in again if keys is not None for q in qs]
    _compare("replan", "a CUDA-graph wrapper planned again into its bound buffers gives another answer",
             r_out[planned], want_r[planned], out_tol)


def _compare(name: str, what: str, got, want, tol: float) -> None:
    error = float((got.float() - want.float()).abs().max())
    if not math.isfinite(error) or error > tol:
        raise KernelCheckFailed(name, f"{what}, max error {error:.2g} over {tol:g}")


def _compare_lse(got, want, tol: float) -> None:
    error = float((got.float() - want.float()).abs().max())
    if math.isfinite(error) and error <= tol:
        return
    base_e = float((got.float() - want.float() * math.log(2.0)).abs().max())
    if math.isfinite(base_e) and base_e <= tol:
        raise KernelCheckFailed("lse-base", "the kernel returns its LSE in base e, not base 2 as the verify's "
                                            "merges are told")
    raise KernelCheckFailed("lse-base", f"the kernel's LSE is not log2(sum(exp(score))), max error {error:.2g} "
                                        f"over {tol:g}")


class _Case:
    """Eight queries and 64 cached latent rows on ``device``; rows of a plan name which queries and which keys."""

    def __init__(self, torch, device, heads, ckv, kpe, sm_scale, q_dtype, kv_dtype) -> None:
        self.torch, self.device, self.heads, self.ckv, self.sm_scale = torch, device, heads, ckv, sm_scale
        self.q_dtype, self.kv_dtype = q_dtype, kv_dtype
        g = torch.Generator().manual_seed(20261203)
        # Scores of order 1 (q.k over ckv + kpe dims, scaled): softmax spreads over the keys.
        scale = (ckv + kpe) ** -0.25
        self.q = (torch.randn(8, heads, ckv + kpe, generator=g) * scale).to(device=device, dtype=q_dtype)
        self.cache = (torch.randn(64, 1, ckv + kpe, generator=g) * scale).to(device=device, dtype=kv_dtype)

    def graph_wrapper(self, wrapper_class, workspace, *, rows: int, ids: int):
        t, d = self.torch, self.device
        return wrapper_class(workspace, use_cuda_graph=True, qo_indptr=t.zeros(rows + 1, dtype=t.int32, device=d),
                             kv_indptr=t.zeros(rows + 1, dtype=t.int32, device=d),
                             kv_indices=t.zeros(ids, dtype=t.int32, device=d),
                             kv_len_arr=t.ones(rows, dtype=t.int32, device=d), backend="auto")

    def run(self, wrapper, rows, *, causal: bool):
        """Plan ``rows`` as the verify does (host indptrs, device ids, page size 1; a row without keys gets the
        filler slot, row 0) and run their queries, consecutive ones, through them; the result is laid out over
        all eight queries."""
        t = self.torch
        first = rows[0][0][0]
        qo, kv, ids, lens = [0], [0], [], []
        for queries, keys in rows:
            assert queries == list(range(first + qo[-1], first + qo[-1] + len(queries)))
            slots = keys if keys is not None else [0]
            qo.append(qo[-1] + len(queries))
            ids += slots
            lens.append(len(slots))
            kv.append(kv[-1] + len(slots))
        i32 = t.int32
        wrapper.plan(t.tensor(qo, dtype=i32), t.tensor(kv, dtype=i32), t.tensor(ids, dtype=i32, device=self.device),
                     t.tensor(lens, dtype=i32), self.heads, self.ckv, self.cache.shape[-1] - self.ckv, 1, causal,
                     self.sm_scale, self.q_dtype, self.kv_dtype)
        n = qo[-1]
        q = self.q[first: first + n]
        out, lse = wrapper.run(q[..., : self.ckv], q[..., self.ckv:], self.cache[..., : self.ckv],
                               self.cache[..., self.ckv:], out=q.new_empty(n, self.heads, self.ckv), return_lse=True)
        full_out = t.zeros(8, self.heads, self.ckv, dtype=out.dtype, device=self.device)
        full_lse = t.full((8, self.heads), float("-inf"), dtype=t.float32, device=self.device)
        full_out[first: first + n], full_lse[first: first + n] = out, lse
        return full_out, full_lse

    def dense(self, rows, *, causal: bool, top_left: bool = False):
        """Softmax attention written out in float32 over the same (rounded) inputs; base-2 LSE."""
        t = self.torch
        out = t.zeros(8, self.heads, self.ckv, dtype=t.float32, device=self.device)
        lse = t.full((8, self.heads), float("-inf"), dtype=t.float32, device=self.device)
        keys_all = self.cache[:, 0].float()
        for queries, keys in rows:
            if keys is None:
                continue
            k = keys_all[keys]
            q = self.q[queries].float()
            score = t.einsum("qhd,kd->qhk", q, k) * self.sm_scale
            if causal:
                n_q, n_k = len(queries), len(keys)
                last = t.arange(n_q, device=self.device) + (0 if top_left else n_k - n_q)
                hidden = t.arange(n_k, device=self.device)[None, :] > last[:, None]
                score = score.masked_fill(hidden[:, None, :], float("-inf"))
            out[queries] = t.einsum("qhk,kd->qhd", t.softmax(score, -1), k[:, : self.ckv])
            lse[queries] = t.logsumexp(score, -1) / math.log(2.0)
        return out, lse

    def close(self, got, want, tol: float) -> bool:
        return self.error(got, want) <= tol

    def error(self, got, want) -> float:
        error = float((got.float() - want.float()).abs().max())
        return error if math.isfinite(error) else float("inf")
