"""Hook on ``sglang.srt.layers.attention.flashinfer_mla_backend``: the target verify under DCP (0.5.22, 0.5.23).

Under DCP the model treats a TARGET_VERIFY like a DCP decode: q all-gathered
(heads x dcp), the backend asked for ``(out, lse)``, the ranks' partials merged
by LSE (``forward_mla.py``). flashinfer MLA plans the verify like a prefill
instead: virtual ids, global lengths, bottom-right causal, heads / attn_tp,
and no LSE. Three AROUND hooks make the verify what the model expects, with
:mod:`..dcp_verify`'s split plan (the committed prefix once per request, the
window per draft token, heads x dcp, merged on the rank):

- ``FlashInferMLAAttnBackend.init_forward_metadata``: an eager verify under
  DCP is planned split, on the backend's verify wrapper and a second one for
  the window;
- ``FlashInferMLAAttnBackend.init_forward_metadata_out_graph``: a verify
  graph under DCP is captured on a prefix wrapper bound to stock's own graph
  buffers (one row per request, as stock's verify graph binds them) and a
  window wrapper bound to buffers of one row per draft token, and each replay
  plans both from the host lengths;
- ``FlashInferMLAAttnBackend.forward_extend``: a verify under DCP writes its
  KV as before, runs both sides with their LSE, merges them, and returns
  ``(out, lse)``.

The target's own NextN layer as draft (NEXTN) runs two more passes under DCP
on this backend, on the same striped pool:

- ``FlashInferMLAIndicesUpdaterDecode.call_begin_forward``: the draft decode
  in its CUDA-graph form hands the kernel ``generate_draft_decode_kv_indices``'
  logical locs untranslated; under DCP a draft decode is planned as the eager
  form plans it (sglang's own DCP decode plan over ``req_to_token``, ids built
  and translated on the device);
- the draft extend (``DRAFT_EXTEND_V2``): each query reads this rank's keys up
  to its own position, the verify's problem, so it is planned by the same
  split plan on a wrapper pair of its own, returns ``(out, lse)``, and the
  model merges it across ranks as it merges a decode (:mod:`.forward_mla`).

Before its first verify under DCP, a process checks the kernel it will run
(:mod:`..kernel_check`). patches/upstream-next 0012 makes the same change in
sglang's module, and 0017 the NextN draft's. Every other batch goes to
sglang's own code unchanged. The verify's three hooks are judged together on
the code they patch: the verify of 0.5.22 and 0.5.23 (a plan-bound
``call_begin_forward``, graph-keyed verify wrappers, a ``forward_extend`` that
never asks for the LSE); 0.5.19 to 0.5.21 plan the verify another way and are
left alone, and so is their draft decode. ``SGLANG_ENABLE_DCP_DSPARK_PLUGIN=0``
turns them off with the rest of the plugin.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from .common import Finding, Verdict, carrier, first_call, unhooked
from .entry import FORWARD_STAGE, Hook

MODULE = "sglang.srt.layers.attention.flashinfer_mla_backend"
METADATA = f"{MODULE}.FlashInferMLAAttnBackend.init_forward_metadata"
GRAPH = f"{MODULE}.FlashInferMLAAttnBackend.init_forward_metadata_out_graph"
FORWARD = f"{MODULE}.FlashInferMLAAttnBackend.forward_extend"
DRAFT_DECODE = f"{MODULE}.FlashInferMLAIndicesUpdaterDecode.call_begin_forward"
# The name upstream-next 0012 gives its planner in sglang's code: a module that has it is fixed.
SERIES_MARK = "plan_dcp_split_verify"
# And the name 0017 gives the backend's answer to whether it planned a draft extend split.
DRAFT_SERIES_MARK = "dcp_draft_extend_planned"
# The index builder the split verify gathers its ids with: sglang's own, for the Triton backend's DCP decode.
ID_BUILDER = "sglang.kernels.ops.attention.dcp_kernels"


def _module():
    return importlib.import_module(MODULE)


def _source(fn) -> str:
    try:
        return inspect.getsource(unhooked(fn))
    except (OSError, TypeError):
        return ""


def verify_verdict(original: Callable | None = None) -> Finding:
    """Does this release's flashinfer MLA verify need the split plan under DCP, and is its code the shape the
    hooks are written for?"""
    module = _module()
    backend = getattr(module, "FlashInferMLAAttnBackend", None)
    updater = getattr(module, "FlashInferMLAIndicesUpdaterPrefill", None)
    if backend is None or updater is None:
        return Finding(METADATA, Verdict.OUT_OF_SCOPE, "this release has no flashinfer MLA backend")
    if SERIES_MARK in inspect.getsource(module):
        return Finding(METADATA, Verdict.FIXED, "the release plans the verify split under DCP (upstream-next 0012)")
    plan_src, forward_src = _source(updater.call_begin_forward), _source(backend.forward_extend)
    params = inspect.signature(unhooked(updater.call_begin_forward)).parameters
    shaped = ("plan" in params and "spec_info" in params and "fast_verify_plan_kwargs" in params
              and "generate_attn_arg_prefill" in plan_src and hasattr(backend, "_apply_cuda_graph_metadata")
              and hasattr(backend, "_verify_graph_key") and _has_id_builder())
    if not shaped:
        return Finding(METADATA, Verdict.OUT_OF_SCOPE,
                       "the verify fix is written against the flashinfer MLA verify of 0.5.22 and 0.5.23 (plan-bound, "
                       "graph-keyed); this release's differs, and the argument check keeps refusing the verify under DCP")
    if "return_lse" in forward_src:
        return Finding(METADATA, Verdict.UNRECOGNISED,
                       "forward_extend asks for an LSE: not the code the hooks were written for")
    return Finding(METADATA, Verdict.NEEDS_FIX, "under DCP the verify plans virtual ids with global lengths and a "
                                                "bottom-right causal mask, and forward_extend returns no LSE")


def _has_id_builder() -> bool:
    try:
        return hasattr(importlib.import_module(ID_BUILDER), "create_triton_kv_indices_for_dcp_triton")
    except ImportError:
        return False


def verify_fix_in_effect(plugin_on: bool) -> str | None:
    """Who plans this release's flashinfer MLA verify split under DCP: "upstream-next" where its code carries
    0012, "plugin" where the plugin is on and its hooks apply, else None (the release's own verify)."""
    return carrier(verify_verdict, plugin_on)


def draft_decode_verdict(original: Callable | None = None) -> Finding:
    """Does this release's draft decode graph hand the kernel untranslated ids under DCP? Where the verify hooks
    apply (the same 0.5.22 / 0.5.23 code) and the decode updater takes a draft's ids from ``spec_info`` beside its
    own DCP plan."""
    found = verify_verdict()
    if DRAFT_SERIES_MARK in inspect.getsource(_module()):
        return Finding(DRAFT_DECODE, Verdict.FIXED, "the release plans the NextN draft's passes under DCP itself "
                                                    "(upstream-next 0017)")
    if found.verdict is not Verdict.NEEDS_FIX:
        detail = ("the release plans the verify itself (upstream-next 0012) but not the NextN draft's passes"
                  if found.verdict is Verdict.FIXED else found.detail)
        return Finding(DRAFT_DECODE, Verdict.OUT_OF_SCOPE, detail)
    source = _source(_module().FlashInferMLAIndicesUpdaterDecode.call_begin_forward)
    if "plan_dcp_decode_metadata" not in source or "spec_info.kv_indices" not in source:
        return Finding(DRAFT_DECODE, Verdict.UNRECOGNISED, "the decode updater does not plan DCP and take a draft's "
                                                           "ids from spec_info: not the code the hook was written for")
    return Finding(DRAFT_DECODE, Verdict.NEEDS_FIX, "under DCP a draft decode graph hands the kernel the draft "
                                                    "kernel's logical locs, untranslated and unsharded")


def _dcp():
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    return int(parallel.attn_dcp_size), int(parallel.attn_dcp_rank)


def _is_dcp_verify(forward_batch) -> bool:
    spec_info = forward_batch.spec_info
    if not forward_batch.forward_mode.is_target_verify() or spec_info is None:
        return False
    return getattr(spec_info, "is_verify_input", lambda: False)() and _dcp()[0] > 1


def _is_dcp_draft_extend(forward_batch) -> bool:
    """A NextN draft's extend under DCP (EAGLE v2's ``prepare_for_draft_extend``): its queries are the verified
    tokens, each reading the keys up to its own position, as a verify's draft tokens do."""
    spec_info = forward_batch.spec_info
    if not forward_batch.forward_mode.is_draft_extend_v2() or spec_info is None:
        return False
    return getattr(spec_info, "is_draft_input", lambda: False)() and _dcp()[0] > 1


def is_split_pass(forward_batch) -> bool:
    """A pass planned split under DCP: the target verify or a NextN draft's extend."""
    mode = forward_batch.forward_mode
    return mode.is_target_verify() or mode.is_draft_extend_v2()


def _refuse(spec_info, translator) -> None:
    from ..dcp_verify import VerifyRefused

    topk = int(getattr(spec_info, "topk", 1) or 1)
    if topk > 1:
        raise VerifyRefused(f"the verify under DCP plans the window per draft token of a chain; topk {topk} needs a "
                            "tree mask it does not carry: use --speculative-eagle-topk 1")
    if getattr(spec_info, "ragged_verify_layout", None) is not None:
        raise VerifyRefused("the verify under DCP plans the same number of draft tokens per request; a ragged verify "
                            "layout is not planned: unset SGLANG_RAGGED_VERIFY_MODE (its default is static)")
    if getattr(translator, "is_translating", False):
        raise VerifyRefused("the verify under DCP gathers its ids with the static pool's // dcp translation; a "
                            "translating (unified-memory) pool is not planned: launch without --enable-unified-memory")


def host_prefix_lens(forward_batch, bs: int):
    """Each request's committed length on the host, from what sglang keeps there: DSpark's verify input carries
    it (``live_seq_lens_cpu``; the batch's ``seq_lens_cpu`` then already counts the window), EAGLE's batch
    carries it as ``seq_lens_cpu``. Rows a graph pads the batch with get 0. Where neither is kept, the device
    lengths are read back: ``bs`` numbers, as flashinfer's own plan reads back device indptrs."""
    import torch

    spec_info = forward_batch.spec_info
    live = getattr(spec_info, "live_seq_lens_cpu", None)
    dflash = getattr(getattr(spec_info, "spec_input_type", None), "name", "") == "DFLASH_VERIFY"
    if live is not None:
        out = torch.zeros(bs, dtype=torch.int64)
        n = min(bs, int(live.numel()))
        out[:n] = live[:n].to(torch.int64)
        return out
    seq_lens_cpu = getattr(forward_batch, "seq_lens_cpu", None)
    if seq_lens_cpu is not None and not dflash:
        return seq_lens_cpu[:bs].to(torch.int64)
    return forward_batch.seq_lens[:bs].to(torch.int64).cpu()


def split_lengths(forward_batch, bs: int):
    """Each request's committed prefix and its queries, on the host: a verify's draft tokens follow
    :func:`host_prefix_lens`; a draft extend's ``num_tokens_per_req`` tokens end at ``seq_lens``, which the
    batch already counts them in ("forward sees post-write length"), as its stock plan reads them."""
    import torch

    spec_info = forward_batch.spec_info
    if forward_batch.forward_mode.is_target_verify():
        return host_prefix_lens(forward_batch, bs), torch.full((bs,), int(spec_info.draft_token_num))
    per_request = int(spec_info.num_tokens_per_req)
    seq_lens_cpu = getattr(forward_batch, "seq_lens_cpu", None)
    lens = (seq_lens_cpu if seq_lens_cpu is not None else forward_batch.seq_lens.cpu())[:bs].to(torch.int64)
    return lens - per_request, torch.full((bs,), per_request)


class SplitVerify:
    """What one verify under DCP runs on a rank: the prefix and the window wrappers, the plan of the step, and
    the plan's numbers on the device. Rides on the prefix wrapper (``_dcp_split``), which sglang keeps as the
    verify's ``PrefillMetadata.prefill_wrapper`` and, per graph, in ``prefill_cuda_graph_metadata``. A graph's
    split carries the views of the pack its wrappers are bound to (``meta``), fixed at capture."""

    __slots__ = ("prefix", "window", "graph", "plan", "meta")

    def __init__(self, prefix, window, graph: _GraphBuffers | None = None, meta=None) -> None:
        self.prefix, self.window, self.graph = prefix, window, graph
        self.plan, self.meta = None, meta
        prefix._dcp_split = self


class _GraphBuffers:
    """A backend's buffers for verify graphs under DCP, shared by the graphs as sglang shares
    ``cuda_graph_kv_indices`` (graphs replay one at a time): the window's ids, one row per draft token of at
    most ``ceil(draft tokens / dcp)`` ids, and the plan's pack, whose views each graph binds as its wrappers'
    indptrs and lengths (``dcp_verify.PACK``). The prefix ids use stock's own ``cuda_graph_kv_indices``."""

    def __init__(self, backend, max_bs: int, draft_tokens: int, dcp: int) -> None:
        import torch

        from .. import dcp_verify

        device = backend.cuda_graph_kv_indices.device
        tokens = max_bs * int(draft_tokens)
        self.max_bs, self.max_tokens = max_bs, tokens
        self.kv_indices = torch.zeros(tokens * dcp_verify.window_capacity(draft_tokens, dcp), dtype=torch.int32,
                                      device=device)
        self.pack = torch.zeros(dcp_verify.pack_size(max_bs, tokens), dtype=torch.int32, device=device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.kv_indices, self.pack))


def plan_split_verify(backend, split: SplitVerify, forward_batch) -> None:
    """Plan one verify batch on ``split``'s wrappers: the plan from the host lengths, the ids on the device, both
    sides planned with heads x dcp and no mask. Eager, each wrapper gets flashinfer's full ``plan()``, as stock's
    eager verify does. A graph's wrappers get it once, at capture; a replay plans them as stock's verify replay
    does (:func:`..dcp_verify.replan`), with no allocation and nothing that grows with the context."""
    import torch

    from .. import dcp_verify, kernel_check

    spec_info = forward_batch.spec_info
    translator = backend.kv_index_translator
    _refuse(spec_info, translator)
    kernel_check.ensure(backend, _module().BatchMLAPagedAttentionWrapper)
    dcp, rank = _dcp()
    bs = int(forward_batch.batch_size)
    prefix_lens, q_lens = split_lengths(forward_batch, bs)
    plan = dcp_verify.plan_split(prefix_lens, q_lens, dcp_size=dcp, dcp_rank=rank)
    device = forward_batch.req_pool_indices.device
    pack = plan.device_pack()
    graph = split.graph
    if graph is None:
        meta = dcp_verify.unpack(pack.to(device, non_blocking=True), plan.bs, plan.tokens)
        prefix_ids = torch.empty(plan.prefix_ids, dtype=torch.int32, device=device)
        window_ids = torch.empty(plan.window_ids, dtype=torch.int32, device=device)
    else:
        if plan.prefix_ids > backend.cuda_graph_kv_indices.numel() or plan.window_ids > graph.kv_indices.numel():
            raise ValueError(f"a verify graph's plan of {plan.prefix_ids} prefix and {plan.window_ids} window ids "
                             f"exceeds its buffers ({backend.cuda_graph_kv_indices.numel()} and "
                             f"{graph.kv_indices.numel()})")
        # One copy refreshes the flags, the counts and every indptr and length the wrappers are bound to.
        graph.pack[: pack.numel()].copy_(pack, non_blocking=True)
        meta = split.meta
        prefix_ids, window_ids = backend.cuda_graph_kv_indices, graph.kv_indices
    source = translator.read_source(forward_batch.kv_loc_plan, req_pool_indices=forward_batch.req_pool_indices, bs=bs)
    if source.entry_page_size != 1 or source.v2p is not None or source.is_translated:
        raise dcp_verify.VerifyRefused("the verify under DCP gathers its ids from req_to_token's virtual token ids; "
                                       "this pool's read source is a translated table")
    dcp_verify.build_ids(plan, source, forward_batch.req_pool_indices, prefix_ids, window_ids, meta)
    updater = backend.indices_updater_prefill
    heads = backend.indices_updater_decode.num_local_heads  # heads / attn_tp x dcp: q is all-gathered
    sides = ((split.prefix, plan.prefix_qo_indptr, plan.prefix_kv_indptr, prefix_ids[: plan.prefix_ids],
              plan.prefix_kv_len),
             (split.window, plan.window_qo_indptr, plan.window_kv_indptr, window_ids[: plan.window_ids],
              plan.window_kv_len))
    for wrapper, qo_indptr, kv_indptr, ids, kv_len in sides:
        if graph is not None and split.plan is not None:
            dcp_verify.replan(wrapper, qo_indptr, kv_indptr, kv_len, heads, updater.kv_lora_rank)
        else:
            wrapper.plan(qo_indptr, kv_indptr, ids, kv_len, heads, updater.kv_lora_rank, updater.qk_rope_head_dim,
                         1, False, updater.scaling, updater.q_data_type, updater.data_type)
    split.plan, split.meta = plan, meta


def plan_verify_eager(original: Callable, self, forward_batch, *args, **kwargs):
    """AROUND hook for ``FlashInferMLAAttnBackend.init_forward_metadata``: an eager verify under DCP, and a NextN
    draft's extend under DCP, are planned split; every other batch is sglang's. The draft extend gets a wrapper
    pair of its own (``_dcp_draft_extend``): the backend's paged prefill wrapper stays the plain extend's."""
    first_call()
    if _is_dcp_verify(forward_batch):
        split = getattr(self.prefill_wrapper_verify, "_dcp_split", None)
        if split is None:
            window = _module().BatchMLAPagedAttentionWrapper(self.workspace_buffer, backend="auto")
            split = SplitVerify(self.prefill_wrapper_verify, window)
    elif _is_dcp_draft_extend(forward_batch):
        split = getattr(self, "_dcp_draft_extend", None)
        if split is None:
            wrapper = _module().BatchMLAPagedAttentionWrapper
            split = SplitVerify(wrapper(self.workspace_buffer, backend="auto"),
                                wrapper(self.workspace_buffer, backend="auto"))
            self._dcp_draft_extend = split
    else:
        return original(self, forward_batch, *args, **kwargs)
    plan_split_verify(self, split, forward_batch)
    self.forward_metadata = _module().PrefillMetadata(split.prefix, False)
    return None


def plan_verify_graph(original: Callable, self, forward_batch, in_capture: bool = False, *args, **kwargs):
    """AROUND hook for ``FlashInferMLAAttnBackend.init_forward_metadata_out_graph``: a verify graph under DCP is
    captured on split wrappers, and each replay plans them; every other mode is sglang's."""
    first_call()
    if not _is_dcp_verify(forward_batch):
        return original(self, forward_batch, in_capture, *args, **kwargs)
    from .. import dcp_verify

    module = _module()
    spec_info = forward_batch.spec_info
    bs = int(forward_batch.batch_size)
    key = self._verify_graph_key(bs, spec_info)
    if in_capture:
        graph = getattr(self, "_dcp_verify_graph_buffers", None)
        if graph is None:
            graph = _GraphBuffers(self, int(self.cuda_graph_kv_lens.numel()), int(spec_info.draft_token_num),
                                  _dcp()[0])
            self._dcp_verify_graph_buffers = graph
        tokens = bs * int(spec_info.draft_token_num)
        if bs > graph.max_bs or tokens > graph.max_tokens:
            raise ValueError(f"a verify graph of {bs} requests and {tokens} draft tokens exceeds the "
                             f"{graph.max_bs} and {graph.max_tokens} its buffers were sized for at the first capture")
        # Both sides bind their indptrs and lengths to this graph's views of the pack, so a replay's one copy of
        # the pack refreshes them; the prefix ids go to stock's own graph buffer, one row per request.
        meta = dcp_verify.unpack(graph.pack, bs, tokens)
        prefix = module.BatchMLAPagedAttentionWrapper(
            self.workspace_buffer, use_cuda_graph=True, qo_indptr=meta.prefix_qo_indptr,
            kv_indptr=meta.prefix_kv_indptr, kv_indices=self.cuda_graph_kv_indices, kv_len_arr=meta.prefix_kv_len,
            backend="auto")
        window = module.BatchMLAPagedAttentionWrapper(
            self.workspace_buffer, use_cuda_graph=True, qo_indptr=meta.window_qo_indptr,
            kv_indptr=meta.window_kv_indptr, kv_indices=graph.kv_indices, kv_len_arr=meta.window_kv_len,
            backend="auto")
        split = SplitVerify(prefix, window, graph, meta)
        self.prefill_cuda_graph_metadata[key] = prefix
        self.forward_metadata = module.PrefillMetadata(prefix, False)
    else:
        split = self.prefill_cuda_graph_metadata[key]._dcp_split
    plan_split_verify(self, split, forward_batch)
    return None


def verify_with_lse(original: Callable, self, q, k, v, layer, forward_batch, save_kv_cache: bool = True,
                    q_rope=None, k_rope=None, *args, **kwargs):
    """AROUND hook for ``FlashInferMLAAttnBackend.forward_extend``: a verify, or a NextN draft's extend, planned
    split under DCP returns ``(out, lse)``."""
    first_call()
    wrapper = getattr(self.forward_metadata, "prefill_wrapper", None)
    split = getattr(wrapper, "_dcp_split", None)
    if not (is_split_pass(forward_batch) and split is not None and _dcp()[0] > 1):
        return original(self, q, k, v, layer, forward_batch, save_kv_cache, q_rope, k_rope, *args, **kwargs)
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    from ..dcp_verify import merge

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
    ckv, kpe = cache[:, :, :dv], cache[:, :, dv:]
    prefix_out, prefix_lse = split.prefix.run(q, q_rope, ckv, kpe, out=q.new_empty(q.shape), return_lse=True)
    window_out, window_lse = split.window.run(q, q_rope, ckv, kpe, out=q.new_empty(q.shape), return_lse=True)
    out, lse = merge(prefix_out, prefix_lse, window_out, window_lse, split.meta)
    return out.view(-1, heads * dv), lse


def plan_draft_decode(original: Callable, self, wrapper, paged_kernel_lens, paged_kernel_lens_sum, q_indptr,
                      kv_indptr, init_metadata_replay: bool = False, spec_info=None, *args, **kwargs):
    """AROUND hook for ``FlashInferMLAIndicesUpdaterDecode.call_begin_forward``: under DCP a draft decode (a
    draft input's ids) is planned as the eager draft decode plans it, by sglang's own DCP decode plan over
    ``req_to_token``. The replay plans into the buffer its graph was captured on, on the host lengths sglang's
    ``_apply_cuda_graph_metadata`` already made this rank's."""
    first_call()
    if spec_info is not None and getattr(spec_info, "is_draft_input", lambda: False)() and _dcp()[0] > 1:
        spec_info = None
    return original(self, wrapper, paged_kernel_lens, paged_kernel_lens_sum, q_indptr, kv_indptr,
                    init_metadata_replay, spec_info, *args, **kwargs)


def same_verdict(original: Callable | None = None) -> Finding:
    """The graph and forward hooks are needed exactly where the eager one is."""
    return verify_verdict()


# The table's entries (plugin/hooks/__init__.py collects them; docs/patches.md is generated from them).
_VERIFY_WHY = ("under DCP flashinfer's MLA verify plans virtual ids with global lengths and returns no LSE, so the "
               "target reads other tokens' KV and the DCP merge has nothing to weigh")
_VERIFY_UPSTREAM = "not yet sent (patches/upstream-next 0012; docs/upstreaming.md)"
_VERIFY_DROP = "upstream plans the verify under DCP on flashinfer MLA itself"
HOOKS = (
    Hook(
        module=MODULE, target=METADATA, judge=verify_verdict, hook=plan_verify_eager,
        stage=FORWARD_STAGE,
        does="plans an eager verify under DCP split: the committed prefix once per request, the window per draft "
             "token, this rank's keys, heads x dcp, ids built on the device; checks the kernel first",
        why=_VERIFY_WHY, upstream=_VERIFY_UPSTREAM, drop_when=_VERIFY_DROP, series_patch="upstream-next/0012",
    ),
    Hook(
        module=MODULE, target=GRAPH, judge=same_verdict, hook=plan_verify_graph,
        stage=FORWARD_STAGE,
        does="captures a verify graph under DCP on a prefix wrapper bound to stock's graph buffers and a window "
             "wrapper of one row per draft token, and plans both at each replay",
        why=_VERIFY_WHY, upstream=_VERIFY_UPSTREAM, drop_when=_VERIFY_DROP, series_patch="upstream-next/0012",
    ),
    Hook(
        module=MODULE, target=FORWARD, judge=same_verdict, hook=verify_with_lse,
        stage=FORWARD_STAGE,
        does="runs a verify's (or a NextN draft extend's) two sides under DCP and returns their merge, (out, lse), "
             "the neutral partial for a query this rank holds no key of",
        why=_VERIFY_WHY, upstream=_VERIFY_UPSTREAM, drop_when=_VERIFY_DROP, series_patch="upstream-next/0012",
    ),
    Hook(
        module=MODULE, target=DRAFT_DECODE, judge=draft_decode_verdict, hook=plan_draft_decode,
        stage=FORWARD_STAGE,
        does="plans a NextN draft decode graph under DCP (its capture and each replay) as the eager form plans "
             "it: this rank's rows of req_to_token by sglang's DCP decode plan, translated on the device",
        why="under DCP the draft decode graph hands flashinfer MLA the draft kernel's logical locs, untranslated, "
            "so each rank reads other tokens' rows",
        upstream="not yet sent (patches/upstream-next 0017; docs/upstreaming.md)",
        drop_when="upstream plans the draft decode graph under DCP", series_patch="upstream-next/0017",
    ),
)
