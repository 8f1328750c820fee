"""The pass map for external EAGLE and EAGLE3 drafts: a dense Llama-style draft on a DeepSeek-V3-shaped MLA target.

``nextn`` and ``fa3`` map NEXTN (the target's own MLA layer as draft), ``dspark`` DSPARK. This module adds the external
dense drafts, ``LlamaForCausalLMEagle`` (``--speculative-algorithm EAGLE``) and ``LlamaForCausalLMEagle3``
(``EAGLE3``), with ``--attention-backend flashinfer``: the MLA target runs ``FlashInferMLAAttnBackend``; the draft
runner (``use_mla_backend`` false) gets what the release's ``DraftBackendFactory`` builds for "flashinfer"
(0.5.23: ``FlashInferMultiStepDraftBackend`` for the draft decode, ``FlashInferAttnBackend`` for the draft extend,
``speculative/draft_utils.py::_create_flashinfer_decode_backend / _create_flashinfer_prefill_backend``).

The method is the pass map's, with its helpers (``harness``, ``nextn``):

1. pools: the release's own ``KVCacheConfigurator`` (``harness.configurator``) builds the target (MLA) and the
   draft (``use_mla_backend`` false, algorithm EAGLE / EAGLE3, a Llama-style draft architecture); whether the draft
   pool holds loc L at row L (replicated) or at row L // N on its owner (striped) is measured after the write;
2. the draft's write door is the one its flashinfer backend's ``forward_extend`` / ``forward_decode`` use:
   ``MHATokenToKVPool.set_kv_buffer`` at ``KVWriteLoc.for_layer(forward_batch, layer)`` (0.5.22 on), i.e. the
   batch's ``out_cache_loc`` as ``KVLocPlan.bind`` set it with the draft's translator, or at
   ``KVWriteLoc(forward_batch.out_cache_loc, ...)`` before 0.5.22;
3. each pass's read ids come from the release's own metadata builder on the backend object the factory built
   (``init_forward_metadata``; CUDA-graph forms: ``init_cuda_graph_state``, a capture
   ``init_forward_metadata_out_graph(in_capture=True)`` and the replay), with the flashinfer wrapper classes and
   flashinfer's ``fast_decode_plan`` replaced by the harness's MHA recorders (``stub_flashinfer_mha``; they keep what the
   kernel would read: for a CUDA-graph wrapper, its bound buffers). DRAFT_EXTEND runs in both forms the worker
   has (eager through the draft runner, and ``EAGLEDraftExtendCudaGraphRunner``'s capture + replay); its verdict is
   the worse of the two and the detail gives both;
4. the HiCache round trip is the harness's, with the draft as a SIDECAR host pool (``base_spec_worker.
   _build_hicache_draft_plan``: neither EAGLE3 nor an external EAGLE draft without NextN layers is packable).

Nothing is hard-coded: every verdict is what the run found.

Usage: TRITON_INTERPRET=1 PYTHONPATH=build/trees/sglang-X .venv/bin/python -m emulation.passmap.eagle [--json]
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import json
import os
import sys
from types import SimpleNamespace

from emulation.passmap import harness, nextn

ALGORITHMS = ("EAGLE", "EAGLE3")
FB = "sglang.srt.layers.attention.flashinfer_backend"
DU = "sglang.srt.speculative.draft_utils"
TR = harness.TR
TARGET_BACKEND = "flashinfer_mla"  # --attention-backend flashinfer on the MLA target: FlashInferMLAAttnBackend
ATTENTION_BACKEND = "flashinfer"  # the --attention-backend value this map stands for


# ---------------------------------------------------------------- the case's launch, pools and backends


@functools.cache
def launch_for(algorithm: str):
    """The data-path harness's launch for this draft (``datapath.layouts.launches``): an MHA Llama-style draft,
    the plain MHA write path (fa3 / flashinfer), not replicated by hand."""
    from emulation.datapath import layouts

    return next(launch for launch in layouts.launches()
                if launch.algorithm == algorithm and launch.kind == "mha" and launch.path == "mha-plain"
                and not launch.replicated)


def draft_class_exported(architecture: str) -> bool:
    """Does the release ship the draft model class (``models.llama_eagle`` / ``models.llama_eagle3`` EntryClass)?"""
    for name in ("llama_eagle", "llama_eagle3"):
        try:
            mod = importlib.import_module(f"sglang.srt.models.{name}")
        except Exception:  # a model module that cannot import on CPU: look at the next
            continue
        entry = getattr(mod, "EntryClass", None)
        entries = entry if isinstance(entry, (list, tuple)) else [entry]
        if any(getattr(e, "__name__", None) == architecture for e in entries):
            return True
    return False


def eagle_pools(algorithm: str):
    """Target (2 MLA layers) and draft (1 layer, MHA: ``use_mla_backend`` false) pools, each built by this release's
    ``KVCacheConfigurator`` (``loc_space_scale`` / ``pool_page_size`` / ``_derive_pool_sizes`` /
    ``_build_token_to_kv_pool`` -> ``_build_mha_kv_pool``)."""
    from emulation.datapath import layouts

    launch = launch_for(algorithm)
    target = layouts.build_pool(harness.configurator(launch, draft=False, layers=layouts.TARGET_LAYERS,
                                                     architecture="DeepseekV3ForCausalLM"))
    draft = layouts.build_pool(harness.configurator(launch, draft=True, layers=1, architecture=launch.architecture))
    return launch, target, draft


@contextlib.contextmanager
def eagle_server_args():
    """``--attention-backend flashinfer``, as the draft backend factory reads it (``attention_backends()``, the
    exec bag's ``attention_backend`` leaf, published by the server; the sidecar's published config leaves it
    unset). Changed with the bag's own scoped ``override``, or, on a release whose bag has no such leaf, by
    answering ``draft_utils.attention_backends`` with the pair that config resolves to."""
    from unittest import mock

    from sglang.srt.runtime_context import get_exec

    kernel = getattr(get_exec(), "kernel", None)
    if kernel is not None and "attention_backend" in kernel:
        with kernel.override(attention_backend=ATTENTION_BACKEND):
            yield
        return
    with mock.patch.object(importlib.import_module(DU), "attention_backends",
                           lambda: (ATTENTION_BACKEND, ATTENTION_BACKEND)):
        yield


def draft_runner(pool, req, tr, architecture: str, algorithm: str):
    """The harness's stand-in runner, as a Llama-style draft runner: MHA (``use_mla_backend`` false), a draft worker
    whose ``draft_attention_backend`` is what ``model_runner.resolve_draft_attention_backend`` gives with the flag
    unset (eagle_worker_v2 builds its TpModelWorker without one)."""
    from sglang.srt.runtime_context import get_server_args

    # The runner's server args: the config this rank published (FlashInferAttnBackend reads DllmConfig from it,
    # resolve_draft_decode_window its --speculative-draft-window-size).
    runner = harness.model_runner(pool, req.req_to_token, tr, server_args=get_server_args())
    hf = SimpleNamespace(architectures=[architecture])
    mc = runner.model_config
    mc.hf_config = mc.hf_text_config = hf
    mc.head_dim = mc.v_head_dim = harness.MHA_HEAD_DIM
    mc.get_max_num_attention_heads = lambda: harness.HEADS
    from sglang.srt.configs.model_config import ModelConfig

    heads = SimpleNamespace(get_total_num_kv_heads=lambda: harness.MHA_KV_HEADS, is_draft_model=True)

    def kv_heads(tp, dcp=1):  # the release's own answer for a draft model (drafts are not split by DCP)
        try:
            return ModelConfig.get_num_kv_heads(heads, tp, dcp)
        except TypeError:  # a get_num_kv_heads that takes no dcp
            return ModelConfig.get_num_kv_heads(heads, tp)

    mc.get_num_kv_heads = kv_heads
    mc.model_is_mrope = False
    try:
        import inspect

        from sglang.srt.model_executor.model_runner import resolve_draft_attention_backend

        kw = dict(draft_attention_backend=None, is_draft_worker=True)
        if "server_args" in inspect.signature(resolve_draft_attention_backend).parameters:  # 0.5.18 reads it
            kw["server_args"] = runner.server_args
        flag = resolve_draft_attention_backend(**kw)
    except ImportError:  # a release without it: the runner keeps the process flag
        from sglang.srt.runtime_context import get_spec

        flag = get_spec().speculative_draft_attention_backend
    runner.__dict__.update(use_mla_backend=False, is_draft_worker=True, draft_attention_backend=flag,
                           init_new_workspace=False, prefill_attention_backend_str=ATTENTION_BACKEND,
                           decode_attention_backend_str=ATTENTION_BACKEND, sliding_window_size=None,
                           spec_algorithm=harness.spec_algorithm(algorithm), canary_manager=None)
    return runner


def draft_backends(runner):
    """What ``EagleDraftWorker.init_attention_backend`` builds: ``DraftBackendFactory(draft_runner, topk,
    num_steps).create_decode_backend()`` and ``create_draft_extend_backend()`` (the latter becomes the draft
    runner's ``attn_backend``, which its prefill extend and its draft extend run)."""
    fb_module = importlib.import_module(FB)
    harness.stub_flashinfer_mha(fb_module)
    du = importlib.import_module(DU)
    if "server_args" in inspect.signature(du.DraftBackendFactory.__init__).parameters:  # 0.5.17 takes them first
        factory = du.DraftBackendFactory(harness.ReleaseArgs(speculative_eagle_topk=1, attention_backend=ATTENTION_BACKEND),
                                         runner, 1, harness.STEPS)
    else:
        factory = du.DraftBackendFactory(runner, 1, harness.STEPS)
    return factory.create_decode_backend(), factory.create_draft_extend_backend()


def backend_name(backend) -> str:
    """The ``--attention-backend`` value the draft's backend runs as: the name the factory stamped on it
    (``prefill_attention_backend_str``, 0.5.18 on). 0.5.17's factory stamps none; with no draft-backend flag it
    builds the backend of the value its server args name, :data:`ATTENTION_BACKEND`. Never the class's name: the
    map's backends are read back as the values an operator passes (preflight's lines name them)."""
    return getattr(backend, "prefill_attention_backend_str", None) or ATTENTION_BACKEND


# ---------------------------------------------------------------- the draft's write door


def draft_write_loc(batch):
    """What the draft's ``FlashInferAttnBackend.forward_extend`` / ``forward_decode`` hand ``set_kv_buffer``:
    ``KVWriteLoc.for_layer(forward_batch, layer, ...)`` from 0.5.22 (the batch's ``out_cache_loc`` with its
    physical mark, both set by ``KVLocPlan.bind``); before, ``KVWriteLoc(forward_batch.out_cache_loc, ...)``."""
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    if hasattr(KVWriteLoc, "for_layer"):
        return KVWriteLoc.for_layer(batch, harness.LAYER)
    return KVWriteLoc(batch.out_cache_loc, None)


def write_draft(pool, batch, locs) -> None:
    """``MHATokenToKVPool.set_kv_buffer`` at the batch's write loc; the row values carry the tokens' locs."""
    pool.set_kv_buffer(harness.LAYER, draft_write_loc(batch), *harness.tag_values("mha", locs, pool.head_num,
                                                                                    pool.head_dim))


def write_draft_prefix(pool, req, tr_d, tr_t) -> str:
    """The prefix as the draft's prefill extend writes it: its batch (out_cache_loc = the prefix's locs) bound to
    the target prefill's plan with the draft's translator (``eagle_worker_v2._draft_extend_for_prefill`` hands
    ``kv_loc_plan`` to ``ForwardBatch.init_new``)."""
    import torch

    S = req.S
    locs = torch.tensor(req.locs(S), dtype=torch.int64)

    def batch():
        return _prefill_batch(0, S, locs.clone(), out_cache_loc_is_physical=False)

    b = batch()
    if _bind_target_prefill(b, batch, tr_t, tr_d):
        how = f"the target prefill's {TR}.own_plan bound with the draft's translator"
    else:
        how = "the batch's out_cache_loc (no KVLocPlan in this release)"
    write_draft(pool, b, locs)
    return how


def _prefill_batch(prefix: int, new: int, out_cache_loc, **extra):
    """An EXTEND batch of ``new`` tokens over ``prefix`` cached ones, as ``ForwardBatch.init_new`` fills it."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return harness.fb(forward_mode=ForwardMode.EXTEND, **harness.seqs(prefix + new),
                      extend_prefix_lens=torch.tensor([prefix], dtype=torch.int32), extend_prefix_lens_cpu=[prefix],
                      extend_seq_lens=torch.tensor([new], dtype=torch.int32), extend_seq_lens_cpu=[new],
                      out_cache_loc=out_cache_loc, **extra)


def _bind_target_prefill(b, batch, tr_t, tr_d) -> bool:
    """The target prefill's ``own_plan`` (built on a fresh ``batch()``), bound to ``b`` with the draft's translator,
    where the release has plans (``eagle_worker_v2`` hands ``kv_loc_plan`` to the draft's ``ForwardBatch.init_new``)."""
    if not harness.has_plans(tr_t):
        return False
    tr_t.own_plan(batch()).bind(b, tr_d)
    return True


def write_draft_window(pool, req, tr_d, tr_t) -> str:
    """The speculative window as the draft decode steps and the draft extend write it: the iteration's window plan
    (``eagle_window_plan``: ``prepare_for_draft``'s, num_draft_tokens wide) bound with the draft's translator."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    S, n = req.S, harness.DRAFT_TOKENS
    locs = torch.tensor(req.locs(S + n)[S:], dtype=torch.int64)
    mode = ForwardMode.DRAFT_EXTEND_V2 if hasattr(ForwardMode, "DRAFT_EXTEND_V2") else ForwardMode.DRAFT_EXTEND
    b = harness.fb(forward_mode=mode, **harness.seqs(S), out_cache_loc=locs.clone(), out_cache_loc_is_physical=False)
    plan, _ = harness.eagle_window_plan(tr_t, req)
    harness.bind_plan(plan, b, tr_d)
    write_draft(pool, b, locs)
    return "the window plan bound with the draft's translator" if plan is not None else "the batch's out_cache_loc"


# ---------------------------------------------------------------- the draft passes


def _note_ragged(be, S: int, E: int, req) -> tuple[list[int], str]:
    """What the paged wrapper must read: with the ragged wrapper on (``use_ragged``: the backend's own choice), the
    cached prefix only (the extend tokens' K/V come from the forward); else prefix and extend tokens."""
    if getattr(be.forward_metadata, "use_ragged", False):
        return req.locs(S), "paged read = the cached prefix; the extend tokens' K/V come from the forward (ragged)"
    return req.locs(S + E), "paged read = prefix and extend tokens (use_ragged off)"


def pass_extend(pool, req, dcp, rank, striped, *, be, tr_d, tr_t) -> dict:
    """The draft's prefill extend over a cached prefix (``_draft_extend_for_prefill``): ForwardMode.EXTEND on the
    draft runner's ``attn_backend`` (``FlashInferAttnBackend.init_forward_metadata`` -> prefill updater
    ``call_begin_forward``), its plan the target prefill's ``own_plan`` bound with the draft's translator. A Llama
    draft has no ``prepare_context_parallel_metadata_for_dcp``, so the eager runner builds no attn_dcp_metadata."""
    import torch

    S, E = req.S, harness.DRAFT_TOKENS

    def batch():
        return _prefill_batch(S, E, torch.tensor(req.locs(S + E)[S:], dtype=torch.int64),
                              cross_attention_custom_mask=None, encoder_out_cache_loc=None)

    b = batch()
    if _bind_target_prefill(b, batch, tr_t, tr_d):
        plan_where = f"the target prefill's {TR}.own_plan, bound to the draft batch (eagle_worker_v2)"
    else:
        plan_where = "no KVLocPlan in this release"
    be.init_forward_metadata(b)
    want, note = _note_ragged(be, S, E, req)
    ids = be.prefill_wrappers_paged[0].kernel_ids()
    return harness.with_plan(harness.judge("mha", pool, ids, harness.owned(want, striped, dcp, rank), note=note),
                             plan_where)


def pass_draft_decode_eager(pool, req, dcp, rank, striped, *, multi, tr_d, tr_t) -> dict:
    """``FlashInferMultiStepDraftBackend.init_forward_metadata`` -> ``common_template``
    (``generate_draft_decode_kv_indices``) -> each step's ``FlashInferAttnBackend.init_forward_metadata`` (decode
    updater ``call_begin_forward`` with ``spec_info.kv_indices``); the batch is ``prepare_for_draft``'s, with the
    window plan's columns [0, num_steps)."""
    b, _, where = harness.live_draft_decode_batch(req, tr_d, tr_t)
    multi.init_forward_metadata(b)
    wrappers = [x.decode_wrappers[0] for x in multi.attn_backends]
    return harness.with_plan(harness.judge_steps(pool, wrappers, req, striped, dcp, rank, kind="mha"), where + ", columns [0, num_steps)")


def pass_draft_decode_graph(pool, req, dcp, rank, striped, *, multi, tr_d, tr_t) -> dict:
    """CUDA-graph form (``EAGLEDraftCudaGraphRunner``): ``init_cuda_graph_state``, a capture
    ``init_forward_metadata_out_graph(in_capture=True)`` on the runner's own buffers (``bind_runner_slots``), then
    the replay with the live batch; each step's kernel reads its capture-bound wrapper's buffers (the replay plans
    through flashinfer's ``fast_decode_plan``)."""
    import torch

    multi.init_cuda_graph_state(1, 1)
    cap = harness.draft_decode_batch(req, seq_len=1, out_cache_loc=torch.zeros(harness.STEPS, dtype=torch.int64))
    cap_where = harness.bind_runner_slots(cap, tr_d)
    multi.init_forward_metadata_out_graph(cap, in_capture=True)
    live, _, where = harness.live_draft_decode_batch(req, tr_d, tr_t)
    multi.init_forward_metadata_out_graph(live, in_capture=False)
    wrappers = [x.decode_cuda_graph_metadata[1][0] for x in multi.attn_backends]
    return harness.with_plan(harness.judge_steps(pool, wrappers, req, striped, dcp, rank, kind="mha"),
                             f"{cap_where}; replay: {where}, columns [0, num_steps)")


def pass_draft_extend(pool, req, dcp, rank, striped, *, be, tr_d, tr_t) -> dict:
    """EAGLE v2's draft extend (``eagle_worker_common.prepare_for_draft_extend``): ForwardMode.DRAFT_EXTEND_V2
    (DRAFT_EXTEND on a release without it), planned eagerly by the draft runner's ``attn_backend.
    init_forward_metadata``; ``seq_lens`` is the post-write length; the plan is the iteration's
    (``verify_input.kv_loc_plan``), bound with the draft's translator."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    mode = ForwardMode.DRAFT_EXTEND_V2 if hasattr(ForwardMode, "DRAFT_EXTEND_V2") else ForwardMode.DRAFT_EXTEND
    S, n = req.S, harness.DRAFT_TOKENS
    b, where = harness.draft_extend_batch(req, tr_d, tr_t, mode=mode, cross_attention_custom_mask=None,
                                          out_cache_loc=torch.tensor(req.locs(S + n)[S:], dtype=torch.int64),
                                          encoder_out_cache_loc=None)
    be.init_forward_metadata(b)
    want, note = _note_ragged(be, S, n, req)
    ids = be.prefill_wrappers_paged[0].kernel_ids()
    return harness.with_plan(harness.judge("mha", pool, ids, harness.owned(want, striped, dcp, rank), note=note),
                             where + f" ({mode.name})")


def _draft_extend_input(n: int):
    """The draft extend's spec_info (``_draft_extend_for_decode``'s ``EagleDraftExtendInput``): every draft token
    accepted, ``num_tokens_per_req`` the verify window (num_draft_tokens)."""
    import torch
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput

    return EagleDraftExtendInput(hidden_states=torch.zeros(n, 8), num_correct_drafts=torch.tensor([n - 1], dtype=torch.int32),
                                 num_accept_tokens=torch.tensor([n], dtype=torch.int32), num_accept_tokens_cpu=[n],
                                 num_tokens_per_req=n, num_tokens_for_logprob_per_req=n)


def pass_draft_extend_graph(pool, req, dcp, rank, striped, *, be, tr_d, tr_t) -> dict:
    """The draft extend as ``EAGLEDraftExtendCudaGraphRunner`` runs it: ``init_cuda_graph_state(max_bs,
    max_bs * num_draft_tokens)``, a capture ``init_forward_metadata_out_graph(in_capture=True)`` on the runner's own
    slots (``bind_runner_slots``, seq_lens filled with the backend's ``get_cuda_graph_seq_len_fill_value``), then the
    replay with the live batch (post-write ``seq_lens``, the iteration's plan): DRAFT_EXTEND_V2 ->
    ``spec_info.generate_attn_arg_prefill`` -> ``fast_prefill_plan`` into the capture-bound wrapper."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    S, n = req.S, harness.DRAFT_TOKENS
    be.init_cuda_graph_state(1, n)
    fill = be.get_cuda_graph_seq_len_fill_value()
    cap = harness.fb(forward_mode=ForwardMode.DRAFT_EXTEND_V2, **harness.seqs(fill), positions=torch.zeros(n, dtype=torch.int64),
                     out_cache_loc=torch.zeros(n, dtype=torch.int64), spec_info=_draft_extend_input(n),
                     extend_seq_lens_cpu=[n])
    cap_where = harness.bind_runner_slots(cap, tr_d)
    be.init_forward_metadata_out_graph(cap, in_capture=True)
    live = harness.fb(forward_mode=ForwardMode.DRAFT_EXTEND_V2, **harness.seqs(S), positions=torch.arange(S, S + n),
                      out_cache_loc=torch.tensor(req.locs(S + n)[S:], dtype=torch.int64), spec_info=_draft_extend_input(n),
                      extend_seq_lens_cpu=[n])
    plan, where = harness.eagle_window_plan(tr_t, req)
    harness.bind_plan(plan, live, tr_d)
    live.seq_lens, live.seq_lens_cpu, live.seq_lens_sum = live.seq_lens + n, live.seq_lens_cpu + n, S + n
    be.init_forward_metadata_out_graph(live, in_capture=False)
    w = be.draft_extend_cuda_graph_metadata[1][0]
    replayed = "fast_prefill_plan" if getattr(getattr(w.begin_forward, "func", None), "__name__", "") == \
        "fast_prefill_plan" else "the wrapper's own plan"
    return harness.with_plan(harness.judge("mha", pool, w.kernel_ids(), harness.owned(req.locs(S + n), striped, dcp, rank),
                                           note=f"paged read = prefix and window (replayed through {replayed})"),
                             f"{cap_where}; replay: {where}")


# ---------------------------------------------------------------- where (the 0.5.23 chains, adapted per release)


def _multistep_read_source() -> str:
    fb_module = importlib.import_module(FB)
    src = harness.source(fb_module.FlashInferMultiStepDraftBackend.common_template)
    return f"{TR}.read_source" if "read_source" in src else "req_to_token_pool.req_to_token"


def _extend_input_builder() -> str:
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput

    src = harness.source(EagleDraftExtendInput.generate_attn_arg_prefill)
    return f"{TR}.pack_read_stream" if "pack_read_stream" in src else "create_flashinfer_kv_indices_triton over req_to_token"


@functools.cache
def eagle_where() -> dict:
    builder = nextn.read_builder(FB)
    fbx = f"{FB}.FlashInferAttnBackend"
    multi = f"{FB}.FlashInferMultiStepDraftBackend"
    factory = f"{DU}.DraftBackendFactory"
    write = ("memory_pool.MHATokenToKVPool.set_kv_buffer at KVWriteLoc.for_layer (out_cache_loc from KVLocPlan.bind "
             "with the draft's translator)" if "for_layer" in harness.source(
                 importlib.import_module("sglang.srt.mem_cache.memory_pool").KVWriteLoc)
             else "memory_pool.MHATokenToKVPool.set_kv_buffer at KVWriteLoc(forward_batch.out_cache_loc)")
    nw = nextn.nextn_where()
    return {
        "EXTEND": f"sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill -> "
                  f"{factory}.create_draft_extend_backend ({fbx}) .init_forward_metadata (EXTEND) -> "
                  f"FlashInferIndicesUpdaterPrefill.call_begin_forward ({builder}); write: {write}",
        "DRAFT_DECODE_GRAPH": f"{factory}.create_decode_backend ({multi}) .init_cuda_graph_state -> "
                              f"init_forward_metadata_out_graph(in_capture=True) -> replay: init_forward_metadata_out_graph"
                              f" -> common_template (sglang.srt.speculative.spec_utils.generate_draft_decode_kv_indices "
                              f"over {_multistep_read_source()}) -> {fbx}.init_forward_metadata_out_graph -> "
                              "FlashInferIndicesUpdaterDecode.call_begin_forward (spec_info.kv_indices) -> "
                              f"flashinfer fast_decode_plan (the capture-bound buffers); write: {write}",
        "DRAFT_DECODE_EAGER": f"{factory}.create_decode_backend ({multi}) .init_forward_metadata -> common_template "
                              f"(generate_draft_decode_kv_indices over {_multistep_read_source()}) -> "
                              f"{fbx}.init_forward_metadata -> FlashInferIndicesUpdaterDecode.call_begin_forward "
                              f"(spec_info.kv_indices); write: {write}",
        "DRAFT_EXTEND": "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode -> "
                        "sglang.srt.speculative.eagle_worker_common.prepare_for_draft_extend (DRAFT_EXTEND_V2); eager: "
                        f"{fbx}.init_forward_metadata -> FlashInferIndicesUpdaterPrefill.call_begin_forward "
                        f"({builder}); CUDA graph (sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner."
                        f"EAGLEDraftExtendCudaGraphRunner): {fbx}.init_cuda_graph_state -> "
                        "init_forward_metadata_out_graph(in_capture=True) -> replay: init_forward_metadata_out_graph -> "
                        "FlashInferIndicesUpdaterPrefill.call_begin_forward -> sglang.srt.speculative.eagle_info."
                        f"EagleDraftExtendInput.generate_attn_arg_prefill ({_extend_input_builder()}) -> "
                        f"{FB}.fast_prefill_plan into the capture-bound wrapper; write: {write}",
        "TARGET_VERIFY_GRAPH": nw["TARGET_VERIFY_GRAPH"],
        "TARGET_VERIFY_EAGER": nw["TARGET_VERIFY_EAGER"],
    }


def pool_note(pool, striped: bool, dcp: int) -> str:
    layout = "row = loc" if dcp == 1 else ("striped: row = loc // N on the owner" if striped
                                           else "replicated: row = loc")
    return (f" [draft pool: {type(pool).__name__}, {pool.size} rows, page {pool.page_size} "
            f"(kv_cache_configurator.KVCacheConfigurator._derive_pool_sizes / _build_mha_kv_pool), measured {layout}]")


# ---------------------------------------------------------------- the case


def not_run_case(case: harness.Case, reason: str) -> tuple[harness.Case, dict]:
    msg = {"verdict": "not-run", "detail": reason, "where": "tools/emulation/passmap/eagle.py (set-up)"}
    return case, {p: dict(msg, after_hicache={"verdict": "not-run", "detail": reason}) for p in harness.PASSES}


def eagle_case(algorithm: str, dcp: int, rank: int) -> tuple[harness.Case, dict]:
    """algorithm in ("EAGLE", "EAGLE3"): an external dense draft on the flashinfer-MLA target."""
    assert algorithm in ALGORITHMS, algorithm
    try:
        launch = launch_for(algorithm)
        draft_class = launch.architecture
    except Exception as exc:
        return not_run_case(harness.Case(algorithm, "?", "mha", TARGET_BACKEND, ATTENTION_BACKEND, dcp, rank),
                            f"no data-path launch for an MHA {algorithm} draft: {harness.raised(exc)['detail']}")
    case = harness.Case(algorithm, draft_class, "mha", TARGET_BACKEND, ATTENTION_BACKEND, dcp, rank)
    try:
        return _eagle_case(case, algorithm, draft_class, dcp, rank)
    except Exception as exc:  # the release lacks an API the harness drives
        return not_run_case(case, "the harness could not build this release's pools/backends on CPU: "
                                  f"{harness.raised(exc)['detail']}")


def _eagle_case(case, algorithm: str, draft_class: str, dcp: int, rank: int) -> tuple[harness.Case, dict]:
    if not draft_class_exported(draft_class):
        return not_run_case(case, f"this release ships no {draft_class} (sglang.srt.models.llama_eagle*.EntryClass)")
    with harness.on_rank(dcp, rank) as ops, eagle_server_args():
        _, target, draft = eagle_pools(algorithm)
        req = harness.Request(dcp)
        tr_t = harness.translator_for(target, req.req_to_token, draft=False)
        tr_d = harness.translator_for(draft, req.req_to_token, draft=True)
        runner = draft_runner(draft, req, tr_d, draft_class, algorithm)
        _, extend_be = draft_backends(runner)  # the backend name the factory stamps; each pass builds its own
        case.draft_backend = backend_name(extend_be)

        def write_all():
            import torch

            harness.write_mla(target, torch.tensor(req.locs(req.S + len(req.window))))
            write_draft_prefix(draft, req, tr_d, tr_t)
            write_draft_window(draft, req, tr_d, tr_t)

        write_all()
        striped_t = harness.is_striped("mla", target, req.prefix, dcp, rank)
        striped_d = harness.is_striped("mha", draft, req.prefix, dcp, rank)
        w = eagle_where()
        note = pool_note(draft, striped_d, dcp)

        def fresh_multi():  # each graph/eager form on a backend of its own, as the worker keeps one per form
            return draft_backends(runner)[0]

        def draft_extend_both():  # the eager runner's form and the draft-extend CUDA graph's, each on its own backend
            graph = harness.run_pass(lambda: pass_draft_extend_graph(
                draft, req, dcp, rank, striped_d, be=draft_backends(runner)[1], tr_d=tr_d, tr_t=tr_t), "")
            eager = harness.run_pass(lambda: pass_draft_extend(
                draft, req, dcp, rank, striped_d, be=draft_backends(runner)[1], tr_d=tr_d, tr_t=tr_t), "")
            out = harness.worse_of({"CUDA graph": graph, "eager": eager})
            out["where"] = f"{w['DRAFT_EXTEND']}{note} [eager{eager['where']}] [CUDA graph{graph['where']}]"
            return out

        def run_all():
            out = {
                "EXTEND": harness.run_pass(lambda: pass_extend(draft, req, dcp, rank, striped_d, be=draft_backends(
                    runner)[1], tr_d=tr_d, tr_t=tr_t), w["EXTEND"] + note),
                "DRAFT_DECODE_GRAPH": harness.run_pass(lambda: pass_draft_decode_graph(
                    draft, req, dcp, rank, striped_d, multi=fresh_multi(), tr_d=tr_d, tr_t=tr_t),
                    w["DRAFT_DECODE_GRAPH"] + note),
                "DRAFT_DECODE_EAGER": harness.run_pass(lambda: pass_draft_decode_eager(
                    draft, req, dcp, rank, striped_d, multi=fresh_multi(), tr_d=tr_d, tr_t=tr_t),
                    w["DRAFT_DECODE_EAGER"] + note),
                "DRAFT_EXTEND": draft_extend_both(),
                # The verify runs on the target's MLA pool with an EagleVerifyInput, as NEXTN's does (the harness's
                # verify_input builds one for any algorithm but DSPARK).
                "TARGET_VERIFY_GRAPH": harness.run_pass(lambda: nextn.pass_target_verify_graph(
                    target, req, dcp, rank, striped_t, algorithm=algorithm, tr_t=tr_t), w["TARGET_VERIFY_GRAPH"]),
                "TARGET_VERIFY_EAGER": harness.run_pass(lambda: nextn.pass_target_verify(
                    target, req, dcp, rank, striped_t, algorithm=algorithm, tr_t=tr_t), w["TARGET_VERIFY_EAGER"]),
            }
            return out

        def rewrite_window():
            harness.write_mla(target, req.window)
            write_draft_window(draft, req, tr_d, tr_t)

        # The draft as a SIDECAR host pool: build_hicache_draft_sidecars -> build_full_draft_pools (logical_size
        # rows; its indices follow the target KV anchor's), as _build_hicache_draft_plan picks for a draft that
        # cannot be packed (_can_pack_hicache_mtp: EAGLE3, or EAGLE without NextN layers).
        passes = harness.with_after_hicache(run_all(), run_all, lambda: harness.hicache_round_trip(
            ops, target, draft, req, dcp, draft_kind="mha", sidecar=True, rewrite_window=rewrite_window))
    return case, passes


# ---------------------------------------------------------------- main


def measure(dcp_sizes=harness.DCP_SIZES) -> list[dict]:
    records = []
    for algorithm in ALGORITHMS:
        for dcp in dcp_sizes:
            for rank in sorted({0, dcp - 1}):
                case, passes = eagle_case(algorithm, dcp, rank)
                records.append(case.record({p: passes[p] for p in harness.PASSES}))
    return records


SHORT = {"consistent": "ok", "wrong-rows": "WRONG", "raises": "RAISES", "not-admitted": "not-admitted",
         "not-run": "not-run"}


def line(rec: dict) -> str:
    cells = []
    for p in harness.PASSES:
        v = rec["passes"][p]
        cells.append(f"{p}={SHORT[v['verdict']]}/{SHORT[v['after_hicache']['verdict']]}")
    head = (f"sglang {rec['release']} {rec['algorithm']:<6} {rec['draft_class']} draft={rec['draft_backend']} "
            f"dcp={rec['dcp']} rank={rec['rank']}: ")
    out = head + " ".join(cells)
    bad = [(p, when, d) for p in harness.PASSES
           for when, d in (("before", rec["passes"][p]), ("after HiCache", rec["passes"][p]["after_hicache"]))
           if d["verdict"] not in ("consistent",)]
    if bad:
        p, when, d = bad[0]
        out += f"\n    first non-consistent: {p} ({when}): {d['verdict']}: {d['detail']}"
    return out


def main(argv: list[str]) -> int:
    harness.prepare()
    records = measure()
    if "--json" in argv:
        print(json.dumps(records, indent=1))
        return 0
    print("cells: PASS=before/after-HiCache")
    for rec in records:
        print(line(rec))
    return 0


if __name__ == "__main__":
    os.environ["TRITON_INTERPRET"] = "1"  # before sglang (and Triton) import
    sys.exit(main(sys.argv[1:]))
