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
- ``split-kv``: a row long enough for the kernel to split its keys over
  several CTAs and merge them (16K keys on a GPU, a rank's row at 128K
  context and dcp 8) attends over exactly its keys;
- ``merge``: two halves of a row's keys, each run alone and merged by the
  verify's own merge kernel, equal the whole; a flagged half leaves the
  other as it is, and two give (0, -inf);
- ``replay``: a wrapper bound to buffers for CUDA graphs, planned once as at
  capture, then given new lengths and ids in its bound buffers and planned as
  a replay plans it (the native scheduler alone), gives the new answer.

Only the modes the verify plans are checked: rows without a mask, their LSE.

A disagreement past the dtype's tolerance raises :class:`KernelCheckFailed`
with one line naming the assumption and the flag that avoids the verify; the
launch then stops while its attention backend is built or its first verify
graph is captured, before it serves a token. Every rank of the DCP group runs
the check, and the ranks agree on the outcome before any goes on: a failure
on one rank stops every rank with one line, instead of leaving the others
waiting in the verify's first collective. ``SGLANG_ENABLE_DCP_DSPARK_PLUGIN=0``
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
    failure = None
    try:
        check(wrapper_class, workspace=backend.workspace_buffer, device=backend.device, **shape)
    except KernelCheckFailed as exc:
        logger.error("%s", exc)
        failure = exc
    failed_ranks = _agree(failure is not None, backend.device)
    if failure is not None:
        raise failure
    if failed_ranks:
        raise KernelCheckFailed("another rank", f"rank {failed_ranks[0]} of the DCP group failed its check (its log "
                                                f"names the assumption)")
    _passed.add(key)
    logger.info("dcp_dspark: the verify under DCP's kernel check passed on %s (%s)", backend.device,
                ", ".join(CHECKS))


CHECKS = ("rows", "lse-base", "split-kv", "merge", "replay")
# Keys in the split-kv check's row: on a GPU the length of a rank's row at 128K context and dcp 8, which flashinfer
# splits; elsewhere (a reference kernel on CPU) long enough for a reference that splits long rows to split it.
LONG_ROW = {"cuda": 16384}
LONG_ROW_ELSEWHERE = 1024


def _agree(failed: bool, device) -> list[int]:
    """The DCP ranks that failed their check, the same list on every rank: one all-gather over the DCP group
    (none where no group is up: a single process, or the check run alone)."""
    try:
        from sglang.srt.distributed.parallel_state import get_dcp_group_no_assert
    except ImportError:
        return [0] if failed else []
    group = get_dcp_group_no_assert()
    if group is None or group.world_size <= 1:
        return [0] if failed else []
    import torch

    flags = group.all_gather(torch.tensor([1 if failed else 0], dtype=torch.int32, device=device))
    return [rank for rank, flag in enumerate(flags.tolist()) if flag]


def check(wrapper_class, *, workspace, device, num_heads: int, head_dim_ckv: int, head_dim_kpe: int, sm_scale: float,
          q_dtype, kv_dtype, merge: Callable | None = None, replan: Callable | None = None) -> None:
    """Every assumption in the module docstring, on ``wrapper_class`` (flashinfer's, or a stand-in for it), with
    the verify's own merge and replay plan unless others are given."""
    import torch

    if merge is None:
        from .dcp_verify import merge_partials as merge
    if replan is None:
        from .dcp_verify import replan
    long = LONG_ROW.get(getattr(torch.device(device), "type", str(device)), LONG_ROW_ELSEWHERE)
    case = _Case(torch, device, num_heads, head_dim_ckv, head_dim_kpe, sm_scale, q_dtype, kv_dtype, long)
    out_tol, lse_tol = TOLERANCE.get(str(q_dtype).removeprefix("torch."), TOLERANCE["bfloat16"])

    # One batch the way the verify plans it: a multi-query row, a filler row, a row of one key, a one-query row.
    rows = [([0, 1, 2], list(range(3, 14))), ([3], None), ([4, 5], [20]), ([6], [30, 31, 32, 33, 34, 35])]
    wrapper = case.graph_wrapper(wrapper_class, workspace, rows=len(rows), ids=64)
    out, lse = case.run(wrapper, rows)
    want_out, want_lse = case.dense(rows)
    planned = [q for qs, keys in rows if keys is not None for q in qs]
    _compare("rows", "a row planned without a mask does not attend over exactly its keys (several queries, one "
             "query, one key, after a filler row)", out[planned], want_out[planned], out_tol)
    _compare_lse(lse[planned], want_lse[planned], lse_tol)

    # A row the kernel splits over CTAs: the prefix side's queries over a rank's keys at long context.
    long = [([0, 1, 2], list(range(64, 64 + case.long)))]
    l_out, l_lse = case.run(case.graph_wrapper(wrapper_class, workspace, rows=1, ids=case.long), long)
    want_l, want_l_lse = case.dense(long)
    _compare("split-kv", f"a row of {case.long} keys, split by the kernel, does not attend over exactly its keys",
             l_out[:3], want_l[:3], out_tol)
    _compare("split-kv", f"a row of {case.long} keys, split by the kernel, has another LSE", l_lse[:3],
             want_l_lse[:3], lse_tol)

    # Halves merged by the verify's merge against the whole, and flagged halves.
    whole = [([7], list(range(50, 63)))]
    halves = ([([7], list(range(50, 56)))], [([7], list(range(56, 63)))])
    # A wrapper each, so that this tests the merge alone (planning one wrapper again is the last check's).
    w_out, w_lse = case.run(case.graph_wrapper(wrapper_class, workspace, rows=1, ids=16), whole)
    a_out, a_lse = case.run(case.graph_wrapper(wrapper_class, workspace, rows=1, ids=16), halves[0])
    b_out, b_lse = case.run(case.graph_wrapper(wrapper_class, workspace, rows=1, ids=16), halves[1])
    no, yes = torch.zeros(1, dtype=torch.int32, device=device), torch.ones(1, dtype=torch.int32, device=device)
    m_out, m_lse = merge(a_out[7:8].clone(), a_lse[7:8].clone(), b_out[7:8].clone(), b_lse[7:8].clone(), no, no)
    _compare("merge", "two halves of a row merged by LSE are not the whole row", m_out, w_out[7:8], out_tol)
    _compare("merge", "two halves of a row merged by LSE do not give the whole row's LSE", m_lse, w_lse[7:8], lse_tol)
    n_out, n_lse = merge(a_out[7:8].clone(), a_lse[7:8].clone(), b_out[7:8].clone(), b_lse[7:8].clone(), yes, no)
    _compare("merge", "a flagged half merged by LSE changes the other half", n_out, b_out[7:8], out_tol)
    e_out, e_lse = merge(a_out[7:8].clone(), a_lse[7:8].clone(), b_out[7:8].clone(), b_lse[7:8].clone(), yes, yes)
    if bool(e_out.abs().max() != 0) or not bool(torch.isneginf(e_lse).all()):
        raise KernelCheckFailed("merge", "two flagged halves do not merge to the neutral partial (0, -inf)")

    # The graph wrapper as a replay finds it: new lengths and ids written into its bound buffers, then planned
    # the way a replay plans it (the native scheduler alone, into the capture's workspaces).
    again = [([0, 1, 2], list(range(8, 12))), ([3], list(range(14, 30))), ([4, 5], None), ([6], [2])]
    r_out, _ = case.replay(wrapper, again, replan)
    want_r, _ = case.dense(again)
    planned = [q for qs, keys in again if keys is not None for q in qs]
    _compare("replay", "a CUDA-graph wrapper given new lengths in its bound buffers and planned as a replay plans "
             "it gives another answer", r_out[planned], want_r[planned], out_tol)


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
    """Eight queries and 64 + ``long`` cached latent rows on ``device``; rows of a plan name which queries and which
    keys."""

    def __init__(self, torch, device, heads, ckv, kpe, sm_scale, q_dtype, kv_dtype, long: int) -> None:
        self.torch, self.device, self.heads, self.ckv, self.sm_scale = torch, device, heads, ckv, sm_scale
        self.q_dtype, self.kv_dtype, self.long = q_dtype, kv_dtype, long
        g = torch.Generator().manual_seed(20261203)
        # Scores of order 1 (q.k over ckv + kpe dims, scaled): softmax spreads over the keys.
        scale = (ckv + kpe) ** -0.25
        self.q = (torch.randn(8, heads, ckv + kpe, generator=g) * scale).to(device=device, dtype=q_dtype)
        cache = torch.randn(64 + long, 1, ckv + kpe, generator=g) * scale
        # The long row's keys grow along it, so the kernel's chunks of it carry very different mass: a split merge
        # that does not weigh them by their LSE is off by a whole attention output, not by noise.
        cache[64:] *= torch.linspace(0.25, 3.0, long)[:, None, None]
        cache[64:] += torch.linspace(-1.0, 1.0, long)[:, None, None]  # and each chunk's output is another
        self.cache = cache.to(device=device, dtype=kv_dtype)
        self.bound: dict = {}

    def graph_wrapper(self, wrapper_class, workspace, *, rows: int, ids: int):
        t, d = self.torch, self.device
        buffers = dict(qo_indptr=t.zeros(rows + 1, dtype=t.int32, device=d),
                       kv_indptr=t.zeros(rows + 1, dtype=t.int32, device=d),
                       kv_indices=t.zeros(ids, dtype=t.int32, device=d),
                       kv_len_arr=t.ones(rows, dtype=t.int32, device=d))
        wrapper = wrapper_class(workspace, use_cuda_graph=True, backend="auto", **buffers)
        self.bound[id(wrapper)] = buffers
        return wrapper

    def _csr(self, rows):
        """Host indptrs and lengths, device ids, page size 1; a row without keys gets the filler slot, row 0."""
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
        return (first, t.tensor(qo, dtype=i32), t.tensor(kv, dtype=i32),
                t.tensor(ids, dtype=i32, device=self.device), t.tensor(lens, dtype=i32))

    def run(self, wrapper, rows):
        """Plan ``rows`` as the verify does, without a mask, and run their queries, consecutive ones, through
        them; the result is laid out over all eight queries."""
        first, qo, kv, ids, lens = self._csr(rows)
        wrapper.plan(qo, kv, ids, lens, self.heads, self.ckv, self.cache.shape[-1] - self.ckv, 1, False,
                     self.sm_scale, self.q_dtype, self.kv_dtype)
        return self._run(wrapper, first, int(qo[-1]))

    def replay(self, wrapper, rows, replan):
        """``rows`` written into ``wrapper``'s bound buffers, as a replay's pack copy and id build write them, then
        planned by ``replan`` and run."""
        first, qo, kv, ids, lens = self._csr(rows)
        bound = self.bound[id(wrapper)]
        bound["qo_indptr"].copy_(qo)
        bound["kv_indptr"].copy_(kv)
        bound["kv_len_arr"].copy_(lens)
        bound["kv_indices"][: ids.numel()].copy_(ids)
        replan(wrapper, qo, kv, lens, self.heads, self.ckv)
        return self._run(wrapper, first, int(qo[-1]))

    def _run(self, wrapper, first: int, n: int):
        t = self.torch
        q = self.q[first: first + n]
        out, lse = wrapper.run(q[..., : self.ckv], q[..., self.ckv:], self.cache[..., : self.ckv],
                               self.cache[..., self.ckv:], out=q.new_empty(n, self.heads, self.ckv), return_lse=True)
        full_out = t.zeros(8, self.heads, self.ckv, dtype=out.dtype, device=self.device)
        full_lse = t.full((8, self.heads), float("-inf"), dtype=t.float32, device=self.device)
        full_out[first: first + n], full_lse[first: first + n] = out, lse
        return full_out, full_lse

    def dense(self, rows):
        """Softmax attention written out in float32 over the same (rounded) inputs, no mask; base-2 LSE."""
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
            out[queries] = t.einsum("qhk,kd->qhd", t.softmax(score, -1), k[:, : self.ckv])
            lse[queries] = t.logsumexp(score, -1) / math.log(2.0)
        return out, lse
