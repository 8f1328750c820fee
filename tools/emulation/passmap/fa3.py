"""The fa3 target: ``FlashAttentionBackend`` in its MLA mode, its rows ``page_table`` x ``cache_seqlens``.

``sgl_kernel`` (CUDA-only) is a stand-in module whose kernels raise if called: only the metadata builders run.
``nextn_fa3_case`` runs NEXTN's passes on it; DSPARK's fa3 target (``dspark``) and the plain target (``plain``)
use its passes too.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from unittest import mock

from emulation.passmap.harness import (
    DRAFT_TOKENS,
    DSPARK_BLOCK,
    HEADS,
    PAGE,
    PASSES,
    STEPS,
    TR,
    Case,
    ReleaseArgs,
    Request,
    bind_own,
    bind_plan,
    bind_runner_slots,
    default_draft_backend,
    draft_decode_batch,
    draft_extend_batch,
    fb,
    has_plans,
    is_striped,
    judge,
    live_draft_decode_batch,
    model_runner,
    on_rank,
    owned,
    pools,
    release,
    run_pass,
    seqs,
    source,
    step_want,
    steps_verdict,
    translator_for,
    verify_batch,
    verify_input,
    verify_plan,
    with_after_hicache,
    with_plan,
)
from emulation.passmap.nextn import nextn_round_trip, write_nextn

FAB = "sglang.srt.layers.attention.flashattention_backend"


@contextlib.contextmanager
def fa3_kernels_stubbed() -> Iterator[None]:
    """``sgl_kernel`` (``merge_state_v2``, ``sgl_kernel.flash_attn``) is CUDA-only and not installed here: the module
    names FlashAttentionBackend imports are stand-ins whose kernels raise if called (only the metadata builders
    run); ``get_scheduler_metadata`` (the FA3 split planner, a kernel too) answers None. The stand-ins are put in
    ``sys.modules`` for the block only (``mock.patch.dict`` restores it), and not over a real ``sgl_kernel``."""
    import types

    installed = sys.modules.get("sgl_kernel")
    if installed is not None and not getattr(installed, "_passmap_stub", False):
        yield
        return

    def kernel(*args, **kwargs):
        raise RuntimeError("an FA3 kernel: not run on CPU (only the metadata is read)")

    sk = types.ModuleType("sgl_kernel")
    sk.__path__, sk._passmap_stub, sk.merge_state_v2 = [], True, kernel
    fl = types.ModuleType("sgl_kernel.flash_attn")
    fl.flash_attn_varlen_func = fl.flash_attn_with_kvcache = kernel
    fl.get_scheduler_metadata = lambda *args, **kwargs: None
    sk.flash_attn = fl
    # sgl_kernel is a GPU-only package: a legitimate mock of the module, the module dict restored on leaving
    with mock.patch.dict(sys.modules, {"sgl_kernel": sk, "sgl_kernel.flash_attn": fl}):
        yield


@contextlib.contextmanager
def fa3_spec(algorithm: str):
    """The speculative settings FlashAttentionBackend reads from ``get_spec()`` (topk 1, the map's draft tokens)."""
    from sglang.srt.runtime_context import get_spec

    with get_spec().override(speculative_eagle_topk=1, speculative_num_draft_tokens=DRAFT_TOKENS if algorithm ==
                             "NEXTN" else DSPARK_BLOCK, speculative_num_steps=STEPS,
                             speculative_algorithm="EAGLE" if algorithm == "NEXTN" else "DSPARK"):
        yield


def fa3_runner(pool, req, tr, *, draft: bool):
    import importlib

    from sglang.srt.configs.model_config import AttentionArch

    mr = model_runner(pool, req.req_to_token, tr)
    with fa3_kernels_stubbed():
        init = source(importlib.import_module(FAB).FlashAttentionBackend.__init__)
    if "model_runner.server_args" in init:  # 0.5.17 reads the topk off the server args; later releases get_spec()
        mr.server_args = ReleaseArgs(speculative_eagle_topk=1)
    mr.model_config.attention_arch = AttentionArch.MLA
    mr.model_config.hf_text_config = SimpleNamespace(num_attention_heads=HEADS)
    mr.kv_cache_dtype_str = "auto"
    mr.is_draft_worker = draft
    # no attention context parallelism (what 0.5.21 reads as model_runner.attn_cp_size, 0.5.18-0.5.20 as
    # model_runner.ps.attn_cp_size; 0.5.22 on asks get_parallel())
    mr.attn_cp_size, mr.ps = 1, SimpleNamespace(attn_cp_size=1, tp_size=1)
    return mr


def fa3_backend(pool, req, tr, *, draft: bool = False):
    import importlib

    with fa3_kernels_stubbed():
        fab = importlib.import_module(FAB)
        return fab.FlashAttentionBackend(fa3_runner(pool, req, tr, draft=draft))


def fa3_multistep(pool, req, tr):
    import importlib

    with fa3_kernels_stubbed():
        fab = importlib.import_module(FAB)
        return fab.FlashAttentionMultiStepBackend(fa3_runner(pool, req, tr, draft=True), topk=1,
                                                  speculative_num_steps=STEPS)


def fa3_rows(m, page: int = PAGE, lane: int = 0) -> list[int]:
    """The rows the FA3 paged kernel reads for one request: token j of its ``cache_seqlens`` at
    ``page_table[lane, j // page] * page + j % page``."""
    n = int(m.cache_seqlens_int32[lane])
    pt = m.page_table[lane]
    return [int(pt[j // page]) * page + j % page for j in range(n)]


def fa3_judge(pool, m, want, *, note: str = "") -> dict:
    return judge("mla", pool, fa3_rows(m), want, note=("page_table x cache_seqlens rows" + (f"; {note}" if note else "")))


def fa3_pass_extend(pool, req, dcp, rank, striped, *, tr, target_tr, draft: bool) -> dict:
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    be = fa3_backend(pool, req, tr, draft=draft)
    S, E = req.S, DRAFT_TOKENS

    def batch():
        return fb(forward_mode=ForwardMode.EXTEND, **seqs(S + E), extend_prefix_lens=torch.tensor([S], dtype=torch.int32),
                  extend_prefix_lens_cpu=[S], extend_seq_lens=torch.tensor([E], dtype=torch.int32),
                  extend_seq_lens_cpu=[E], out_cache_loc=torch.tensor(req.locs(S + E)[S:], dtype=torch.int64))
    b = batch()
    if draft and has_plans(target_tr):
        target_tr.own_plan(batch()).bind(b, tr)
        where = f"the target prefill's {TR}.own_plan, bound to the draft batch (eagle_worker_v2)"
    else:
        where = bind_own(b, tr)
    be.init_forward_metadata(b)
    return with_plan(fa3_judge(pool, be.forward_metadata, owned(req.locs(S + E), striped, dcp, rank)), where)


def fa3_pass_draft_decode(pool, req, dcp, rank, striped, *, tr_d, tr_t, graph: bool) -> dict:
    import torch

    multi = fa3_multistep(pool, req, tr_d)
    cap_where = ""
    if graph:
        multi.init_cuda_graph_state(1, 1)
        cap = draft_decode_batch(req, seq_len=1, out_cache_loc=torch.zeros(STEPS, dtype=torch.int64))
        cap_where = bind_runner_slots(cap, tr_d) + "; replay: "
        multi.init_forward_metadata_out_graph(cap, in_capture=True)
    b, _, where = live_draft_decode_batch(req, tr_d, tr_t)
    results = []
    for i, be in enumerate(multi.attn_backends):
        if graph:
            be.init_forward_metadata_out_graph(
                __import__("sglang.srt.model_executor.forward_batch_info", fromlist=["x"]).build_inner_fb_view(
                    b, bs=1, forward_mode=b.forward_mode, encoder_lens=None), in_capture=False)
        else:
            be.init_forward_metadata(b)
        results.append(fa3_judge(pool, be.forward_metadata, step_want(req, i, striped, dcp, rank)))
    return with_plan(steps_verdict(results), cap_where + where + ", columns [0, num_steps)")


def fa3_pass_draft_extend(pool, req, dcp, rank, striped, *, tr_d, tr_t) -> dict:

    be = fa3_backend(pool, req, tr_d, draft=True)
    b, where = draft_extend_batch(req, tr_d, tr_t)
    be.init_forward_metadata(b)
    return with_plan(fa3_judge(pool, be.forward_metadata, owned(req.locs(req.S + DRAFT_TOKENS), striped, dcp, rank)),
                     where)


def fa3_pass_verify(pool, req, dcp, rank, striped, *, algorithm: str, tr_t, graph: bool) -> dict:
    import torch

    be = fa3_backend(pool, req, tr_t)
    S, n = req.S, DRAFT_TOKENS
    cap_where = ""
    if graph:
        be.init_cuda_graph_state(1, n)
        cap = verify_batch(req, verify_input(algorithm), seq_len=1, out_cache_loc=torch.zeros(n, dtype=torch.int64))
        cap_where = bind_runner_slots(cap, tr_t) + "; replay: "
        be.init_forward_metadata_out_graph(cap, in_capture=True)
    spec = verify_input(algorithm)
    live = verify_batch(req, spec)
    plan, where = verify_plan(algorithm, req, tr_t)
    spec.kv_loc_plan = plan
    bind_plan(plan, live, tr_t)
    if graph:
        be.init_forward_metadata_out_graph(live, in_capture=False)
    else:
        be.init_forward_metadata(live)
    return with_plan(fa3_judge(pool, be.forward_metadata, owned(req.locs(S + n), striped, dcp, rank)),
                     cap_where + where)


FA_EXTEND = f"{FAB}.FlashAttentionBackend.init_forward_metadata (EXTEND: page_table, cache_seqlens = seq_lens)"
W_FA3 = {
    "EXTEND": FA_EXTEND,
    "DRAFT_DECODE_GRAPH": f"{FAB}.FlashAttentionMultiStepBackend.init_cuda_graph_state -> capture -> replay: "
                          "FlashAttentionBackend.init_forward_metadata_out_graph -> _init_full_cg_decode_metadata -> "
                          "_apply_cuda_graph_metadata (draft decode page_table, cache_seqlens)",
    "DRAFT_DECODE_EAGER": f"{FAB}.FlashAttentionMultiStepBackend.init_forward_metadata -> "
                          "FlashAttentionBackend.init_forward_metadata (DECODE with a draft spec_info: page_table, "
                          "cache_seqlens = seq_lens + step + 1)",
    "DRAFT_EXTEND": "sglang.srt.speculative.eagle_worker_common.prepare_for_draft_extend (DRAFT_EXTEND_V2) -> "
                    f"{FAB}.FlashAttentionBackend.init_forward_metadata (page_table, cache_seqlens)",
    "TARGET_VERIFY_GRAPH": f"{FAB}.FlashAttentionBackend.init_cuda_graph_state -> init_forward_metadata_out_graph"
                           "(in_capture=True) -> replay: init_forward_metadata_out_graph -> _init_full_cg_decode_metadata"
                           " -> _apply_cuda_graph_metadata (is_target_verify: target_verify_metadata page_table, "
                           "cache_seqlens = seq_lens + num_draft_tokens)",
    "TARGET_VERIFY_EAGER": f"{FAB}.FlashAttentionBackend.init_forward_metadata (TARGET_VERIFY, topk 1: page_table, "
                           "cache_seqlens = seq_lens + num_draft_tokens)",
}
FA3_RELEASES = ((0, 5, 17),)  # every mapped release


@functools.cache
def fa3_page_source() -> str:
    """Where this release's FlashAttentionBackend takes its page_table rows from, for a plain (non-unified) pool."""
    import importlib

    with fa3_kernels_stubbed():
        src = source(importlib.import_module(FAB))
    if "translator.read_table" in src or "translator.copy_page_table" in src:
        return f"page_table: {TR}.read_table / copy_page_table"
    if "translator.build_index_table" in src:
        return (f"page_table: req_to_token_pool.req_to_token[req_pool_indices] // page_size ({TR}.build_index_table "
                "only when is_translating, a unified pool)")
    return "page_table: req_to_token_pool.req_to_token[req_pool_indices] // page_size (no translator)"


def fa3_where(name: str) -> str:
    return f"{W_FA3[name]} [{fa3_page_source()}; no DCP read step in FlashAttentionBackend]"


def fa3_driven() -> bool:
    return tuple(int(x) for x in release().split(".")[:3]) >= FA3_RELEASES[0]


def fa3_not_run(algorithm: str, flag, dcp: int, rank: int) -> tuple[Case, dict]:
    kind = "mla" if algorithm == "NEXTN" else "mha"
    draft_class = "DeepseekV3ForCausalLMNextN" if algorithm == "NEXTN" else "DSparkDraftModel"
    backend = "fa3" if algorithm == "NEXTN" else (flag or default_draft_backend())
    case = Case(algorithm, draft_class, kind, "fa3", backend, dcp, rank, draft_backend_flag=flag)
    msg = {"verdict": "not-run", "detail": "the fa3 MLA target (FlashAttentionBackend) is mapped from 0.5.17 on; "
           "not driven on this release", "where": f"{FAB}.FlashAttentionBackend"}
    return case, {p: dict(msg, after_hicache={"verdict": "not-run", "detail": msg["detail"]}) for p in PASSES}


def nextn_fa3_case(dcp: int, rank: int) -> tuple[Case, dict]:
    if not fa3_driven():
        return fa3_not_run("NEXTN", None, dcp, rank)
    case = Case("NEXTN", "DeepseekV3ForCausalLMNextN", "mla", "fa3", "fa3", dcp, rank)
    with on_rank(dcp, rank) as ops, fa3_spec("NEXTN"):
        _, target, draft = pools("NEXTN", "mla")
        req = Request(dcp)
        tr_t = translator_for(target, req.req_to_token, draft=False)
        tr_d = translator_for(draft, req.req_to_token, draft=True)
        write_nextn(target, draft, req)
        st_t = is_striped("mla", target, req.prefix, dcp, rank)
        st_d = is_striped("mla", draft, req.prefix, dcp, rank)

        def run_all():
            return {
                "EXTEND": run_pass(lambda: fa3_pass_extend(draft, req, dcp, rank, st_d, tr=tr_d, target_tr=tr_t,
                                                           draft=True), fa3_where("EXTEND")),
                "DRAFT_DECODE_GRAPH": run_pass(lambda: fa3_pass_draft_decode(draft, req, dcp, rank, st_d, tr_d=tr_d,
                                                                             tr_t=tr_t, graph=True),
                                               fa3_where("DRAFT_DECODE_GRAPH")),
                "DRAFT_DECODE_EAGER": run_pass(lambda: fa3_pass_draft_decode(draft, req, dcp, rank, st_d, tr_d=tr_d,
                                                                             tr_t=tr_t, graph=False),
                                               fa3_where("DRAFT_DECODE_EAGER")),
                "DRAFT_EXTEND": run_pass(lambda: fa3_pass_draft_extend(draft, req, dcp, rank, st_d, tr_d=tr_d,
                                                                       tr_t=tr_t), fa3_where("DRAFT_EXTEND")),
                "TARGET_VERIFY_GRAPH": run_pass(lambda: fa3_pass_verify(target, req, dcp, rank, st_t, algorithm="NEXTN",
                                                                        tr_t=tr_t, graph=True),
                                                fa3_where("TARGET_VERIFY_GRAPH")),
                "TARGET_VERIFY_EAGER": run_pass(lambda: fa3_pass_verify(target, req, dcp, rank, st_t, algorithm="NEXTN",
                                                                        tr_t=tr_t, graph=False),
                                                fa3_where("TARGET_VERIFY_EAGER")),
            }

        passes = with_after_hicache(run_all(), run_all, nextn_round_trip(ops, target, draft, req, dcp))
    return case, passes
