"""Hook on ``sglang.srt.layers.attention.flashinfer_mla_backend``: the target verify under DCP (0.5.22, 0.5.23).

Under DCP the model treats a TARGET_VERIFY like a DCP decode: q all-gathered
(heads x dcp), the backend asked for ``(out, lse)``, the ranks' partials merged
by LSE (``forward_mla.py``). flashinfer MLA plans the verify like a prefill
instead: virtual ids, global lengths, bottom-right causal, heads / attn_tp,
and no LSE. Three AROUND hooks make the verify what the model expects,
with :mod:`..dcp_verify`'s plan (one row per draft token, this rank's keys up
to that token's position, heads x dcp):

- ``FlashInferMLAIndicesUpdaterPrefill.call_begin_forward``: a verify batch
  under DCP is planned per row (eager, capture and replay alike);
- ``FlashInferMLAAttnBackend.init_forward_metadata_out_graph``: a verify graph
  under DCP is captured on a wrapper bound to buffers of one row per draft
  token (the stock capture binds one row per request);
- ``FlashInferMLAAttnBackend.forward_extend``: a verify under DCP writes its
  KV as before, runs the planned rows with the LSE, gives empty rows the
  neutral partial, and returns ``(out, lse)``.

patches/upstream-next 0012 makes the same change in sglang's module. Every
other batch goes to sglang's own code unchanged. The three are judged
together on the code they patch: the verify branch 0.5.22 and 0.5.23 have
(its ``call_begin_forward`` takes the iteration's ``plan``, its
``forward_extend`` never asks for the LSE); 0.5.19 to 0.5.21 plan the verify
another way and are left alone. ``SGLANG_ENABLE_DCP_DSPARK_PLUGIN=0`` turns them off
with the rest of the plugin.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from . import Hook
from ._common import Finding, Verdict, first_call, unhooked

MODULE = "sglang.srt.layers.attention.flashinfer_mla_backend"
PLAN = f"{MODULE}.FlashInferMLAIndicesUpdaterPrefill.call_begin_forward"
CAPTURE = f"{MODULE}.FlashInferMLAAttnBackend.init_forward_metadata_out_graph"
FORWARD = f"{MODULE}.FlashInferMLAAttnBackend.forward_extend"
# The name upstream-next 0012 gives its planner in sglang's module: code that has it is fixed.
SERIES_MARK = "plan_dcp_verify_rows"


def _module():
    return importlib.import_module(MODULE)


def _source(fn) -> str:
    try:
        return inspect.getsource(unhooked(fn))
    except (OSError, TypeError):
        return ""


def verify_verdict(original: Callable | None = None) -> Finding:
    """Does this release's flashinfer MLA verify need the per-row plan under DCP, and is its code the shape the
    hooks are written for?"""
    module = _module()
    backend = getattr(module, "FlashInferMLAAttnBackend", None)
    updater = getattr(module, "FlashInferMLAIndicesUpdaterPrefill", None)
    if backend is None or updater is None:
        return Finding(PLAN, Verdict.OUT_OF_SCOPE, "this release has no flashinfer MLA backend")
    plan_src, forward_src = _source(updater.call_begin_forward), _source(backend.forward_extend)
    if SERIES_MARK in plan_src or SERIES_MARK in inspect.getsource(module):
        return Finding(PLAN, Verdict.FIXED, "the release plans the verify per draft token under DCP (upstream-next 0012)")
    params = inspect.signature(unhooked(updater.call_begin_forward)).parameters
    shaped = ("plan" in params and "spec_info" in params and "fast_verify_plan_kwargs" in params
              and "generate_attn_arg_prefill" in plan_src and hasattr(backend, "_apply_cuda_graph_metadata")
              and hasattr(backend, "_verify_graph_key"))
    if not shaped:
        return Finding(PLAN, Verdict.OUT_OF_SCOPE,
                       "the verify fix is written against the flashinfer MLA verify of 0.5.22 and 0.5.23 (plan-bound, "
                       "graph-keyed); this release's differs, and the argument check keeps refusing the verify under DCP")
    if "return_lse" in forward_src:
        return Finding(PLAN, Verdict.UNRECOGNISED, "forward_extend asks for an LSE: not the code the hooks were written for")
    return Finding(PLAN, Verdict.NEEDS_FIX, "under DCP the verify plans virtual ids with global lengths and a "
                                            "bottom-right causal mask, and forward_extend returns no LSE")


def verify_fix_in_effect(plugin_on: bool) -> str | None:
    """Who plans this release's flashinfer MLA verify per draft token under DCP: "upstream-next" where its code
    carries 0012, "plugin" where the plugin is on and its hooks apply, else None (the release's own verify)."""
    try:
        finding = verify_verdict()
    except Exception:  # a probe never breaks a launch: judged as the release's own verify
        return None
    if finding.verdict is Verdict.FIXED:
        return "upstream-next"
    if finding.verdict is Verdict.NEEDS_FIX and plugin_on:
        return "plugin"
    return None


def _dcp():
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    return int(parallel.attn_dcp_size), int(parallel.attn_dcp_rank)


def _is_dcp_verify(spec_info) -> bool:
    if spec_info is None or not getattr(spec_info, "is_verify_input", lambda: False)():
        return False
    return _dcp()[0] > 1


def _refuse_tree(spec_info) -> None:
    from ..dcp_verify import TopkRefused

    topk = int(getattr(spec_info, "topk", 1) or 1)
    if topk > 1:
        raise TopkRefused(f"the verify under DCP plans one row per draft token of a chain; topk {topk} needs a "
                          "tree mask it does not carry: use --speculative-eagle-topk 1")


def plan_rows(updater, wrapper, spec_info, req_pool_indices, paged_kernel_lens, paged_kernel_lens_sum, plan,
              qo_indptr_cpu=None, kv_indptr_cpu=None):
    """Plan one verify batch on ``wrapper``: this rank's rows, one per draft token, heads x dcp, no mask."""
    from .. import dcp_verify

    _refuse_tree(spec_info)
    backend = updater.attn_backend
    translator = backend.kv_index_translator
    virtual_ids, kv_indptr, qo_indptr, _mask = spec_info.generate_attn_arg_prefill(
        req_pool_indices=req_pool_indices, paged_kernel_lens=paged_kernel_lens,
        paged_kernel_lens_sum=paged_kernel_lens_sum, translator=translator, plan=plan)
    dcp, rank = _dcp()
    # The replay hands the host copies of the same CSR layout; eager reads it back, as flashinfer's plan does.
    rows = dcp_verify.verify_rows(qo_indptr if qo_indptr_cpu is None else qo_indptr_cpu,
                                  kv_indptr if kv_indptr_cpu is None else kv_indptr_cpu, dcp_size=dcp, dcp_rank=rank)
    ids = dcp_verify.row_ids(rows, virtual_ids, translator.translate_dcp_read_ids)
    bound = getattr(wrapper, "_dcp_verify_empty", None)
    if bound is not None and bound.numel() == rows.rows:  # a captured graph reads the buffer bound at capture
        bound.copy_(rows.empty, non_blocking=True)
    else:
        wrapper._dcp_verify_empty = rows.empty.to(virtual_ids.device, non_blocking=True)
    heads = backend.indices_updater_decode.num_local_heads  # heads / attn_tp x dcp: q is all-gathered
    wrapper.plan(rows.qo_indptr, rows.kv_indptr, ids, rows.kv_len, heads, updater.kv_lora_rank,
                 updater.qk_rope_head_dim, 1, False, updater.scaling, updater.q_data_type, updater.data_type)
    return rows


def plan_verify_per_row(original: Callable, self, *args, **kwargs):
    """AROUND hook for ``FlashInferMLAIndicesUpdaterPrefill.call_begin_forward``."""
    first_call()
    bound = inspect.signature(unhooked(original)).bind(self, *args, **kwargs)
    a = bound.arguments
    if a.get("use_ragged") or not _is_dcp_verify(a.get("spec_info")):
        return original(self, *args, **kwargs)
    plan_rows(self, a["wrapper_paged"], a["spec_info"], a["req_pool_indices"], a["paged_kernel_lens"],
              a["paged_kernel_lens_sum"], a.get("plan"), a.get("qo_indptr_cpu"), a.get("kv_indptr_cpu"))
    return None


class _RowBuffers:
    """A backend's capture buffers for verify graphs under DCP: one row per draft token, shared by the graphs as
    sglang shares ``cuda_graph_kv_indices`` (graphs replay one at a time)."""

    def __init__(self, backend, max_rows: int, dcp: int) -> None:
        import torch

        device = backend.cuda_graph_kv_indices.device
        per_row = -(-int(backend.max_context_len) // dcp) + 1
        self.max_rows = max_rows
        self.qo_indptr = torch.zeros(max_rows + 1, dtype=torch.int32, device=device)
        self.kv_indptr = torch.zeros(max_rows + 1, dtype=torch.int32, device=device)
        self.kv_len = torch.ones(max_rows, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_rows * per_row, dtype=torch.int32, device=device)
        self.empty = torch.zeros(max_rows, dtype=torch.bool, device=device)


def capture_verify_rows(original: Callable, self, forward_batch, in_capture: bool = False, *args, **kwargs):
    """AROUND hook for ``FlashInferMLAAttnBackend.init_forward_metadata_out_graph``: a verify graph under DCP is
    captured on a wrapper bound to one row per draft token; replay and every other mode are sglang's."""
    first_call()
    spec_info = forward_batch.spec_info
    if not (in_capture and forward_batch.forward_mode.is_target_verify() and _is_dcp_verify(spec_info)):
        return original(self, forward_batch, in_capture, *args, **kwargs)
    module = _module()
    bs = forward_batch.batch_size
    rows = int(forward_batch.positions.numel())
    buffers = getattr(self, "_dcp_verify_buffers", None)
    if buffers is None:
        buffers = _RowBuffers(self, int(self.cuda_graph_kv_lens.numel()) * int(spec_info.draft_token_num), _dcp()[0])
        self._dcp_verify_buffers = buffers
    if rows > buffers.max_rows:
        raise ValueError(f"a verify graph of {rows} draft tokens exceeds the {buffers.max_rows} rows its buffers "
                         "were sized for at the first capture")
    wrapper = module.BatchMLAPagedAttentionWrapper(
        self.workspace_buffer, use_cuda_graph=True, qo_indptr=buffers.qo_indptr[: rows + 1],
        kv_indptr=buffers.kv_indptr[: rows + 1], kv_indices=buffers.kv_indices, kv_len_arr=buffers.kv_len[:rows],
        backend="auto")
    wrapper._dcp_verify_empty = buffers.empty[:rows]
    self.prefill_cuda_graph_metadata[self._verify_graph_key(bs, spec_info)] = wrapper
    self.forward_metadata = module.PrefillMetadata(wrapper, False)
    seq_lens = forward_batch.seq_lens
    self._apply_cuda_graph_metadata(
        plan=forward_batch.kv_loc_plan, bs=bs, req_pool_indices=forward_batch.req_pool_indices, seq_lens=seq_lens,
        seq_lens_sum=int(seq_lens.sum().item()), forward_mode=forward_batch.forward_mode, spec_info=spec_info,
        seq_lens_cpu=seq_lens.cpu(), in_capture=True)
    return None


def verify_with_lse(original: Callable, self, q, k, v, layer, forward_batch, save_kv_cache: bool = True,
                    q_rope=None, k_rope=None, *args, **kwargs):
    """AROUND hook for ``FlashInferMLAAttnBackend.forward_extend``: a verify under DCP returns ``(out, lse)``."""
    first_call()
    wrapper = getattr(self.forward_metadata, "prefill_wrapper", None)
    if not (forward_batch.forward_mode.is_target_verify() and getattr(wrapper, "_dcp_verify_empty", None) is not None
            and _dcp()[0] > 1):
        return original(self, q, k, v, layer, forward_batch, save_kv_cache, q_rope, k_rope, *args, **kwargs)
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    from ..dcp_verify import neutralise

    pool = self.token_to_kv_pool
    if save_kv_cache and k is not None:
        if k_rope is not None:
            pool.set_mla_kv_buffer(layer, KVWriteLoc.for_batch(forward_batch), k, k_rope)
        else:
            pool.set_kv_buffer(layer, KVWriteLoc.for_batch(forward_batch), k, v)
    heads, dv = layer.tp_q_head_num, layer.v_head_dim
    if q_rope is None:
        whole = q.view(-1, heads, layer.head_dim)
        q, q_rope = whole[:, :, :dv], whole[:, :, dv:]
    else:
        q, q_rope = q.view(-1, heads, dv), q_rope.view(-1, heads, layer.head_dim - dv)
    cache = pool.get_key_buffer(layer.layer_id).to(q.dtype)
    out, lse = wrapper.run(q, q_rope, cache[:, :, :dv], cache[:, :, dv:], out=q.new_empty(q.shape), return_lse=True)
    neutralise(out, lse, wrapper._dcp_verify_empty)
    return out.view(-1, heads * dv), lse


def same_verdict(original: Callable | None = None) -> Finding:
    """The capture and forward hooks are needed exactly where the plan hook is."""
    return verify_verdict()


# The table's entries (plugin/hooks/__init__.py collects them; docs/patches.md is generated from them).
_VERIFY_WHY = ("under DCP flashinfer's MLA verify plans virtual ids with global lengths and returns no LSE, so the "
               "target reads other tokens' KV and the DCP merge has nothing to weigh")
_VERIFY_UPSTREAM = "not yet sent (patches/upstream-next 0012; docs/upstreaming.md)"
_VERIFY_DROP = "upstream plans the verify under DCP on flashinfer MLA itself"
HOOKS = (
    Hook(
        module=MODULE, target=PLAN, judge=verify_verdict, hook=plan_verify_per_row,
        does="plans a verify under DCP with one row per draft token over this rank's keys up to its position, "
             "heads x dcp, no causal mask",
        why=_VERIFY_WHY, upstream=_VERIFY_UPSTREAM, drop_when=_VERIFY_DROP, series_patch="upstream-next/0012",
    ),
    Hook(
        module=MODULE, target=CAPTURE, judge=same_verdict, hook=capture_verify_rows,
        does="captures a verify graph under DCP on a wrapper bound to one row per draft token",
        why=_VERIFY_WHY, upstream=_VERIFY_UPSTREAM, drop_when=_VERIFY_DROP, series_patch="upstream-next/0012",
    ),
    Hook(
        module=MODULE, target=FORWARD, judge=same_verdict, hook=verify_with_lse,
        does="returns a verify's (out, lse) under DCP, the neutral partial for a row this rank holds no key of",
        why=_VERIFY_WHY, upstream=_VERIFY_UPSTREAM, drop_when=_VERIFY_DROP, series_patch="upstream-next/0012",
    ),
)
