"""The flashinfer-MLA passes: NEXTN's target and draft (the target's own MLA layer) on ``FlashInferMLAAttnBackend``.

EXTEND (the prefix gathered under DCP), the multi-step draft decode (eager and CUDA graph), EAGLE v2's draft extend
and the target verify (eager and CUDA graph), each on the real backend object with the flashinfer wrappers
recording what the kernel is handed; ``nextn_case`` runs them on one rank, before and after a HiCache round trip.
The target verify passes are the DSPARK and external-draft cases' too (``dspark``, ``eagle``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import SimpleNamespace

from emulation.passmap import harness
from emulation.passmap.harness import (
    DRAFT_TOKENS,
    PAGE,
    STEPS,
    TR,
    Case,
    Request,
    bind_own,
    bind_plan,
    bind_runner_slots,
    draft_decode_batch,
    draft_extend_batch,
    fb,
    has_plans,
    hicache_round_trip,
    is_striped,
    judge,
    judge_steps,
    live_draft_decode_batch,
    model_runner,
    on_rank,
    owned,
    pools,
    run_pass,
    seqs,
    source,
    span,
    stub_flashinfer,
    translator_for,
    verify_batch,
    verify_input,
    verify_plan,
    with_after_hicache,
    with_plan,
)

FMB = "sglang.srt.layers.attention.flashinfer_mla_backend"
# What the flashinfer-MLA backends read of the server args: 0.5.18's multi-step draft backend reads page_size.
FI_ARGS = SimpleNamespace(page_size=PAGE)


def fi_mla_backend(pool, req: Request, *, draft: bool, skip_prefill: bool = False, tr=None):
    import importlib

    fmb = importlib.import_module(FMB)
    stub_flashinfer(fmb)
    tr = tr or translator_for(pool, req.req_to_token, draft=draft)
    return fmb.FlashInferMLAAttnBackend(model_runner(pool, req.req_to_token, tr, server_args=FI_ARGS),
                                      skip_prefill=skip_prefill), tr


def pass_extend_mla(pool, req: Request, dcp: int, rank: int, striped: bool, *, draft: bool, tr, target_tr) -> dict:
    """A first EXTEND over a cached prefix: under DCP the prefix is gathered (``prepare_decode_context_parallel_metadata``,
    as ``eager_runner`` calls it through the model's ``prepare_context_parallel_metadata_for_dcp``), then planned.
    The plan: the target prefill's ``own_plan`` (``ForwardBatch.init_new``); a NextN draft's prefill takes the
    target prefill's plan (``eagle_worker_v2`` hands ``kv_loc_plan`` to the draft's ``ForwardBatch.init_new``)."""
    import torch
    from sglang.srt.layers.dcp import planner
    from sglang.srt.model_executor import forward_context
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    be, _ = fi_mla_backend(pool, req, draft=draft, tr=tr)
    S, E = req.S, DRAFT_TOKENS
    md = None
    if dcp > 1:
        # the kernel eager_runner hands the model's prepare_context_parallel_metadata_for_dcp
        from sglang.srt.model_executor.runner.eager_runner import create_chunked_prefix_cache_kv_indices
        prev = forward_context.set_forward_context(SimpleNamespace(attn_backend=be))
        try:
            md = planner.prepare_decode_context_parallel_metadata(
                seq_lens=torch.tensor([S + E], dtype=torch.int32), extend_prefix_lens=torch.tensor([S], dtype=torch.int32),
                extend_prefix_lens_cpu=[S], extend_seq_lens=torch.tensor([E], dtype=torch.int32),
                req_pool_indices=torch.tensor([0]), req_to_token=req.req_to_token, seq_lens_sum=S + E,
                kv_buffer_shape=pool.get_kv_buffer_shape()[0] if hasattr(pool, "get_kv_buffer_shape")
                else pool.kv_buffer[0].shape, kv_cache_dtype=torch.bfloat16, kv_cache_device="cpu",
                create_chunked_prefix_cache_kv_indices_fn=create_chunked_prefix_cache_kv_indices)
        finally:
            forward_context.set_forward_context(prev)

    def batch():
        return fb(forward_mode=ForwardMode.EXTEND, **seqs(S + E),
                  extend_prefix_lens=torch.tensor([S], dtype=torch.int32), extend_prefix_lens_cpu=[S],
                  extend_seq_lens=torch.tensor([E], dtype=torch.int32), extend_seq_lens_cpu=[E], attn_dcp_metadata=md,
                  out_cache_loc=torch.tensor(req.locs(S + E)[S:], dtype=torch.int64))
    b = batch()
    if draft and has_plans(target_tr):
        target_batch = batch()
        target_tr.own_plan(target_batch).bind(b, tr)
        plan_where = f"the target prefill's {TR}.own_plan, bound to the draft batch (eagle_worker_v2)"
    else:
        plan_where = bind_own(b, tr)
    be.init_forward_metadata(b)
    ids = be.prefill_wrapper_paged.kernel_ids()
    prefix = req.locs(S)
    if md is None:  # no DCP: the kernel reads the pool at the planned ids (prefix + the extend tokens)
        return with_plan(judge("mla", pool, ids, req.locs(S + E)), plan_where)
    # Under DCP the pool read is the rank's prefix gather (get_mla_kv_buffer at dcp_local_prefix_kv_indices) ...
    rows = [int(x) for x in md.dcp_local_prefix_kv_indices.tolist()]
    verdict = judge("mla", pool, rows, owned(prefix, striped, dcp, rank),
                    note="pool rows = dcp_local_prefix_kv_indices (the rank's gather)")
    if verdict["verdict"] != "consistent":
        return with_plan(verdict, plan_where)
    # ... and the kernel reads the gathered buffer at dcp_kv_indices. sglang.srt.layers.dcp.comm.
    # all_gather_kv_cache_for_dcp re-orders every rank's share to position order, then the extend tokens follow
    # (all_gather_kv_cache_for_mla_extend); that collective is not run here (no process group): its documented
    # order stands in, so only the index side is checked: the kernel must see positions 0..S+E-1 in order.
    buffer = prefix + req.locs(S + E)[S:]
    seen = [buffer[i] if 0 <= i < len(buffer) else None for i in ids]
    if seen == req.locs(S + E):
        verdict["detail"] += "; dcp_kv_indices read the gathered buffer in position order"
        return with_plan(verdict, plan_where)
    bad = [i for i, (a, b) in enumerate(zip(seen, req.locs(S + E), strict=False)) if a != b]
    return with_plan({"verdict": "wrong-rows", "detail": f"the gathered buffer is read out of order at positions "
                      f"{span(bad)}"}, plan_where)


def _multistep(pool, req, dcp, tr):
    import importlib

    fmb = importlib.import_module(FMB)
    stub_flashinfer(fmb)
    return fmb.FlashInferMLAMultiStepDraftBackend(model_runner(pool, req.req_to_token, tr, server_args=FI_ARGS), topk=1,
                                                  speculative_num_steps=STEPS)


def pass_draft_decode_eager(pool, req, dcp, rank, striped, *, tr_d, tr_t) -> dict:
    multi = _multistep(pool, req, dcp, tr_d)
    b, _, where = live_draft_decode_batch(req, tr_d, tr_t)
    multi.init_forward_metadata(b)
    return with_plan(judge_steps(pool, [x.decode_wrapper for x in multi.attn_backends], req, striped, dcp, rank),
                     where + ", columns [0, num_steps)")


def pass_draft_decode_graph(pool, req, dcp, rank, striped, *, tr_d, tr_t) -> dict:
    import torch

    multi = _multistep(pool, req, dcp, tr_d)
    multi.init_cuda_graph_state(1, 1)
    # capture: the runner's own buffers (seq_lens filled with 1, its out_cache_loc buffer)
    cap = draft_decode_batch(req, seq_len=1, out_cache_loc=torch.zeros(STEPS, dtype=torch.int64))
    cap_where = bind_runner_slots(cap, tr_d)
    multi.init_forward_metadata_out_graph(cap, in_capture=True)
    live, _, where = live_draft_decode_batch(req, tr_d, tr_t)  # replay: the live batch (its plan) is handed over
    multi.init_forward_metadata_out_graph(live, in_capture=False)
    return with_plan(judge_steps(pool, [x.decode_cuda_graph_metadata[1] for x in multi.attn_backends], req,
                                  striped, dcp, rank),
                     f"{cap_where}; replay: {where}, columns [0, num_steps)")


def pass_draft_extend_v2(pool, req, dcp, rank, striped, *, tr_d, tr_t) -> dict:
    """EAGLE v2's draft extend (``prepare_for_draft_extend``): ForwardMode.DRAFT_EXTEND_V2, planned by the draft
    backend's ``init_forward_metadata`` straight away (no ``attn_dcp_metadata``: that is built by the eager runner).
    Its plan: the iteration's (``verify_input.kv_loc_plan``, handed to ``ForwardBatch.init_new``)."""

    be, _ = fi_mla_backend(pool, req, draft=True, tr=tr_d)
    b, where = draft_extend_batch(req, tr_d, tr_t)
    be.init_forward_metadata(b)
    # Stock plans it on the paged prefill wrapper, one causal run per request; the plugin plans it split under DCP
    # (a wrapper pair of its own), judged as the verify's split is: token j reads this rank's keys up to S + j.
    return with_plan(judge_verify(pool, be.forward_metadata.prefill_wrapper, req, dcp, rank, striped), where)


def judge_verify(pool, wrapper, req, dcp, rank, striped) -> dict:
    """The verify's reads (and a NextN draft extend's, whose queries are the verify's): one lane for the request
    (stock: every draft token reads the request's whole run), or, under DCP planned split (upstream-next 0012, the
    plugin's flashinfer MLA hooks), the prefix lane (one per request, all draft tokens) and a window lane per draft
    token: token j must read this rank's share of positions 0 .. S + j over the two, a side the plan flags empty
    (its filler slot) reading nothing."""
    S, n = req.S, DRAFT_TOKENS
    split = getattr(wrapper, "_dcp_split", None)
    if dcp == 1 or split is None:
        return judge("mla", pool, wrapper.kernel_ids(), owned(req.locs(S + n), striped, dcp, rank))
    plan = split.plan
    prefix = [] if int(plan.prefix_keys[0]) == 0 else split.prefix.kernel_ids(0)
    verdicts = [judge("mla", pool, prefix + ([] if int(plan.window_keys[j]) == 0 else split.window.kernel_ids(j)),
                      owned(req.locs(S + j + 1), striped, dcp, rank)) for j in range(n)]
    wrong = next((v for v in verdicts if v["verdict"] != "consistent"), None)
    if wrong is not None:
        return {"verdict": wrong["verdict"], "detail": f"split: {wrong['detail']}"}
    return {"verdict": "consistent", "detail": f"split: the prefix lane ({len(prefix)} ids) once for the request, a "
                                               f"window lane per draft token, token j reading this rank's tokens up to "
                                               f"position S + j; {verdicts[-1]['detail']}"}


def pass_target_verify(pool, req, dcp, rank, striped, *, algorithm: str, tr_t) -> dict:
    """TARGET_VERIFY eager: ``init_forward_metadata`` -> ``spec_info.generate_attn_arg_prefill``; the verify batch's plan
    is the worker's window plan (``verify_input.kv_loc_plan``), bound with the target's translator."""
    be, _ = fi_mla_backend(pool, req, draft=False, tr=tr_t)
    spec = verify_input(algorithm)
    b = verify_batch(req, spec)
    plan, where = verify_plan(algorithm, req, tr_t)
    spec.kv_loc_plan = plan
    bind_plan(plan, b, tr_t)
    be.init_forward_metadata(b)
    return with_plan(judge_verify(pool, be.prefill_wrapper_verify, req, dcp, rank, striped), where)


def pass_target_verify_graph(pool, req, dcp, rank, striped, *, algorithm: str, tr_t) -> dict:
    """TARGET_VERIFY in CUDA-graph form: ``init_cuda_graph_state``, capture (``init_forward_metadata_out_graph``
    with ``in_capture=True`` on the runner's own buffers), then replay with the live batch: ``_apply_cuda_graph_metadata``
    -> ``indices_updater_prefill.update`` -> ``call_begin_forward`` -> ``spec_info.generate_attn_arg_prefill``, into
    the wrapper bound at capture (EAGLE's replay plans through ``fast_mla_prefill_plan``)."""
    import torch

    be, _ = fi_mla_backend(pool, req, draft=False, tr=tr_t)
    n = DRAFT_TOKENS
    be.init_cuda_graph_state(1, n)
    cap_spec = verify_input(algorithm)
    cap = verify_batch(req, cap_spec, seq_len=1, out_cache_loc=torch.zeros(n, dtype=torch.int64))
    cap_where = bind_runner_slots(cap, tr_t)
    be.init_forward_metadata_out_graph(cap, in_capture=True)
    spec = verify_input(algorithm)
    live = verify_batch(req, spec)
    plan, where = verify_plan(algorithm, req, tr_t)
    spec.kv_loc_plan = plan
    bind_plan(plan, live, tr_t)
    be.init_forward_metadata_out_graph(live, in_capture=False)
    wrapper = be.prefill_cuda_graph_metadata[be._verify_graph_key(1, spec)] if hasattr(be, "_verify_graph_key") \
        else be.prefill_cuda_graph_metadata[1]
    return with_plan(judge_verify(pool, wrapper, req, dcp, rank, striped), f"{cap_where}; replay: {where}")


W_EXTEND = f"{FMB}.FlashInferMLAAttnBackend.init_forward_metadata -> FlashInferMLAIndicesUpdaterPrefill.call_begin_forward"
W = {
    "NEXTN": {
        "EXTEND": "sglang.srt.layers.dcp.planner.prepare_decode_context_parallel_metadata "
                  "(KVIndexTranslator.translate_dcp_read_ids on the rank's prefix), " + W_EXTEND + " (dcp_kv_indices)",
        "DRAFT_DECODE_GRAPH": f"{FMB}.FlashInferMLAMultiStepDraftBackend.init_forward_metadata_out_graph -> "
                              "common_template (sglang.srt.speculative.spec_utils.generate_draft_decode_kv_indices) -> "
                              "FlashInferMLAAttnBackend._apply_cuda_graph_metadata -> "
                              "FlashInferMLAIndicesUpdaterDecode.call_begin_forward (spec_info.kv_indices)",
        "DRAFT_DECODE_EAGER": f"{FMB}.FlashInferMLAMultiStepDraftBackend.init_forward_metadata -> "
                              "FlashInferMLAAttnBackend.init_forward_metadata -> "
                              "FlashInferMLAIndicesUpdaterDecode.call_begin_forward (KVIndexTranslator.pack_read_stream, "
                              "sglang.srt.layers.dcp.planner.plan_dcp_decode_metadata, "
                              "KVIndexTranslator.translate_dcp_read_ids)",
        "DRAFT_EXTEND": "sglang.srt.speculative.eagle_worker_common.prepare_for_draft_extend (DRAFT_EXTEND_V2) -> "
                        + W_EXTEND + " (KVIndexTranslator.pack_read_stream)",
        "TARGET_VERIFY_GRAPH": f"{FMB}.FlashInferMLAAttnBackend.init_cuda_graph_state -> "
                               "init_forward_metadata_out_graph(in_capture=True) -> replay: init_forward_metadata_out_graph "
                               "-> FlashInferMLAAttnBackend._apply_cuda_graph_metadata (is_target_verify) -> "
                               "FlashInferMLAIndicesUpdaterPrefill.update -> call_begin_forward -> "
                               "sglang.srt.speculative.eagle_info.EagleVerifyInput.generate_attn_arg_prefill "
                               "(KVIndexTranslator.pack_read_stream) -> fast_mla_prefill_plan into the capture-bound "
                               "wrapper",
        "TARGET_VERIFY_EAGER": "sglang.srt.model_executor.runner.eager_runner (extend_prefix_lens is None on a verify "
                               "batch: no attn_dcp_metadata) -> "
                               f"{FMB}.FlashInferMLAAttnBackend.init_forward_metadata -> FlashInferMLAIndicesUpdaterPrefill."
                               "update -> call_begin_forward -> sglang.srt.speculative.eagle_info.EagleVerifyInput."
                               "generate_attn_arg_prefill (KVIndexTranslator.pack_read_stream)",
    },
}


@functools.cache
def read_builder(module: str = FMB) -> str:
    """The function this release's flashinfer backend (MLA by default; ``flashinfer_backend`` for a dense draft)
    builds its paged read ids with, from its own source:
    0.5.22 on ``KVIndexTranslator.pack_read_stream``; 0.5.20/0.5.21 ``KVIndexTranslator.fill_packed_read_stream``;
    0.5.19 ``KVIndexTranslator.index_table_for_batch`` + ``create_flashinfer_kv_indices_triton``; 0.5.18
    ``create_flashinfer_kv_indices_triton`` over ``req_to_token`` (no translator)."""
    import importlib

    src = source(importlib.import_module(module))
    for name in ("pack_read_stream", "fill_packed_read_stream"):
        if f"translator.{name}" in src:
            return f"{TR}.{name}"
    if "index_table_for_batch" in src:
        return f"{TR}.index_table_for_batch -> create_flashinfer_kv_indices_triton"
    return "create_flashinfer_kv_indices_triton over req_to_token_pool.req_to_token"


@functools.cache
def nextn_where() -> dict:
    """``W["NEXTN"]`` (the 0.5.23 chains) with the names this release's code calls put in their place."""
    import importlib

    fmb = importlib.import_module(FMB)
    out = dict(W["NEXTN"])
    builder = read_builder()
    decode_src = source(fmb.FlashInferMLAIndicesUpdaterDecode)
    planner_src = source(importlib.import_module("sglang.srt.layers.dcp.planner"))
    try:
        from sglang.srt.speculative.eagle_info import EagleVerifyInput

        verify_src = source(EagleVerifyInput.generate_attn_arg_prefill)
    except ImportError:
        verify_src = ""
    verify_builder = (f"{TR}.pack_read_stream" if "pack_read_stream" in verify_src else
                      "create_flashinfer_kv_indices_triton over req_to_token")
    for p, text in out.items():
        text = text.replace("generate_attn_arg_prefill (KVIndexTranslator.pack_read_stream)",
                            f"generate_attn_arg_prefill ({verify_builder})")
        text = text.replace("KVIndexTranslator.pack_read_stream", builder)
        if "translate_dcp_read_ids" not in decode_src:
            text = text.replace(", KVIndexTranslator.translate_dcp_read_ids", "")
        if "translate_dcp_read_ids" not in planner_src:  # 0.5.18/0.5.19: the prefix gather is not translated
            text = text.replace(" (KVIndexTranslator.translate_dcp_read_ids on the rank's prefix)", "")
        out[p] = text
    return out


def write_nextn(target, draft, req: Request) -> None:
    """The prefix and the window through the MLA door, into the target's pool and the NextN draft's."""
    import torch

    locs = torch.tensor(req.locs(req.S + len(req.window)))
    harness.write_mla(target, locs)
    harness.write_mla(draft, locs)


def nextn_round_trip(ops, target, draft, req: Request, dcp: int) -> Callable[[], None]:
    """NEXTN's HiCache round trip: the draft packed into the target's host pool, the window rewritten after it."""
    def rewrite_window():
        harness.write_mla(target, req.window)
        harness.write_mla(draft, req.window)

    return lambda: hicache_round_trip(ops, target, draft, req, dcp, draft_kind="mla", sidecar=False,
                                      rewrite_window=rewrite_window)


def nextn_case(dcp: int, rank: int) -> tuple[Case, dict]:
    case = Case("NEXTN", "DeepseekV3ForCausalLMNextN", "mla", "flashinfer_mla", "flashinfer_mla", dcp, rank)
    passes: dict = {}
    with on_rank(dcp, rank) as ops:
        _, target, draft = pools("NEXTN", "mla")
        req = Request(dcp)
        tr_t = translator_for(target, req.req_to_token, draft=False)
        tr_d = translator_for(draft, req.req_to_token, draft=True)

        write_nextn(target, draft, req)
        striped_t = is_striped("mla", target, req.prefix, dcp, rank)
        striped_d = is_striped("mla", draft, req.prefix, dcp, rank)
        w = nextn_where()

        def run_all():
            return {
                "EXTEND": run_pass(lambda: pass_extend_mla(draft, req, dcp, rank, striped_d, draft=True, tr=tr_d,
                                                           target_tr=tr_t), w["EXTEND"]),
                "DRAFT_DECODE_GRAPH": run_pass(lambda: pass_draft_decode_graph(draft, req, dcp, rank, striped_d,
                                                                               tr_d=tr_d, tr_t=tr_t),
                                               w["DRAFT_DECODE_GRAPH"]),
                "DRAFT_DECODE_EAGER": run_pass(lambda: pass_draft_decode_eager(draft, req, dcp, rank, striped_d,
                                                                               tr_d=tr_d, tr_t=tr_t),
                                               w["DRAFT_DECODE_EAGER"]),
                "DRAFT_EXTEND": run_pass(lambda: pass_draft_extend_v2(draft, req, dcp, rank, striped_d, tr_d=tr_d,
                                                                      tr_t=tr_t), w["DRAFT_EXTEND"]),
                "TARGET_VERIFY_GRAPH": run_pass(lambda: pass_target_verify_graph(target, req, dcp, rank, striped_t,
                                                                                 algorithm="NEXTN", tr_t=tr_t),
                                                w["TARGET_VERIFY_GRAPH"]),
                "TARGET_VERIFY_EAGER": run_pass(lambda: pass_target_verify(target, req, dcp, rank, striped_t,
                                                                           algorithm="NEXTN", tr_t=tr_t),
                                                w["TARGET_VERIFY_EAGER"]),
            }

        passes = with_after_hicache(run_all(), run_all, nextn_round_trip(ops, target, draft, req, dcp))
    return case, passes
