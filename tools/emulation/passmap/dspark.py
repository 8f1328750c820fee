"""DSPARK: a dense draft over a replicated context, its block forward on each ``--speculative-draft-attention-backend``.

The target (flashinfer MLA, or fa3) writes through the MLA door; the draft's context is written through the MHA
door ``models/dspark.py::write_target_hidden_kv`` uses. The draft block is read on the real flashinfer and
trtllm_mha backend objects (eager and as a CUDA graph) and, for the other draft backends, on their read-id
builders; ``dspark_case`` runs the passes on one rank, before and after a HiCache round trip (the draft a sidecar).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from types import SimpleNamespace

from emulation.passmap import harness
from emulation.passmap.fa3 import (
    FAB,
    fa3_driven,
    fa3_kernels_stubbed,
    fa3_not_run,
    fa3_pass_extend,
    fa3_pass_verify,
    fa3_rows,
    fa3_spec,
    fa3_where,
)
from emulation.passmap.harness import (
    DSPARK_BLOCK,
    HEADS,
    MHA_HEAD_DIM,
    MHA_KV_HEADS,
    PASSES,
    Batch,
    Case,
    ReleaseArgs,
    Request,
    bind_plan,
    bind_runner_slots,
    default_draft_backend,
    dspark_window_plan,
    fb,
    hicache_round_trip,
    is_striped,
    judge,
    model_runner,
    on_rank,
    pools,
    raised,
    run_pass,
    seqs,
    source,
    spec_algorithm,
    stub_flashinfer_mha,
    translator_for,
    verify_input,
    with_after_hicache,
    with_plan,
    worse_of,
    write_mha_triton,
)
from emulation.passmap.nextn import nextn_where, pass_extend_mla, pass_target_verify, pass_target_verify_graph

# Draft attention backends to try for a DSPARK dense draft (--speculative-draft-attention-backend); None: default.
DSPARK_DRAFT_BACKENDS = (None, "fa3", "fa4", "flashinfer", "triton", "trtllm_mha")
ATT = "sglang.srt.layers.attention"
TRANSLATOR = "sglang.srt.mem_cache.kv_index_translator.KVIndexTranslator"
DSPARK_DRAFT_WHERE = {
    "flashinfer": f"{ATT}.flashinfer_backend.FlashInferAttnBackend.init_forward_metadata (TARGET_VERIFY) and, as a "
                  "CUDA graph, init_cuda_graph_state + init_forward_metadata_out_graph (capture, replay) -> "
                  "sglang.srt.speculative.dflash_info.DFlashVerifyInput.generate_attn_arg_prefill "
                  f"({TRANSLATOR}.pack_read_stream)",
    "fa3": f"{ATT}.flashattention_backend.FlashAttentionBackend.init_forward_metadata (TARGET_VERIFY, page_table) -> "
           f"{TRANSLATOR}.read_table",
    "fa4": f"{ATT}.attention_registry.create_flashattention_v4_backend -> FlashAttentionBackend(fa_impl_ver=4)"
           f".init_forward_metadata (TARGET_VERIFY, page_table) -> {TRANSLATOR}.read_table",
    "triton": f"{ATT}.triton_backend.TritonAttnBackend.init_forward_metadata (TARGET_VERIFY) -> "
              f"TritonAttnBackend._fill_kv_indptr_and_indices ({TRANSLATOR}.pack_read_stream)",
    "trtllm_mha": f"{ATT}.trtllm_mha_backend.TRTLLMHAAttnBackend.init_forward_metadata (TARGET_VERIFY: "
                  f"{TRANSLATOR}.read_table, else _fill_page_table_device over req_to_token) and, as a CUDA graph, "
                  "init_forward_metadata_out_graph + init_forward_metadata_in_graph (_apply_cuda_graph_metadata)",
}
DSPARK_DRAFT_FORWARD = ("sglang.srt.speculative.dspark_components.dspark_draft.DraftBlockProposer._run_forward "
                        "(ForwardMode.TARGET_VERIFY on the draft runner) -> ")


def dspark_draft_where(backend: str) -> str:
    """``DSPARK_DRAFT_WHERE`` (0.5.22 on) with the read-id builders a release before KVLocPlan calls."""
    import inspect

    text = DSPARK_DRAFT_WHERE[backend]
    try:
        from sglang.srt.speculative.dflash_info import DFlashVerifyInput

        new_api = "translator" in inspect.signature(DFlashVerifyInput.generate_attn_arg_prefill).parameters
    except ImportError:
        new_api = True
    if new_api:
        return text
    if backend == "flashinfer":
        return text.replace(f"({TRANSLATOR}.pack_read_stream)", "(create_flashinfer_kv_indices_triton over req_to_token)")
    if backend in ("fa3", "fa4"):
        return text.replace(f"-> {TRANSLATOR}.read_table", "(topk 1: page_table = req_to_token_pool.req_to_token"
                            "[req_pool_indices, :max_seq_len_k], no unified pool)")
    if backend == "triton":
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

        params = list(inspect.signature(TritonAttnBackend._fill_kv_indptr_and_indices).parameters)
        via = (f"{TRANSLATOR}.index_table_for_batch -> create_flashinfer_kv_indices_triton" if "index_table" in params
               else "create_flashinfer_kv_indices_triton over req_to_token")
        return text.replace(f"({TRANSLATOR}.pack_read_stream)", f"({via})")
    return text


def draft_backend_choices() -> list[str] | None:
    try:
        from sglang.srt.arg_groups.choices import DRAFT_ATTENTION_BACKEND_CHOICES
    except ImportError:
        return None
    return list(DRAFT_ATTENTION_BACKEND_CHOICES)


def pass_dspark_draft(backend: str, pool, req: Request, dcp: int, rank: int, *, tr_t=None) -> dict:
    """The plan: ``alloc_verify_window``'s (target translator), bound to the draft block's batch with the draft's
    translator, columns [0, query_token_num) (``DraftBlockProposer``)."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    tr = translator_for(pool, req.req_to_token, draft=True)
    plan, where = dspark_window_plan(tr_t, req)
    b = fb(forward_mode=ForwardMode.TARGET_VERIFY, **seqs(req.S), positions=torch.arange(req.S, req.S + DSPARK_BLOCK))
    bind_plan(plan, b, tr, cols=slice(0, DSPARK_BLOCK))
    where += ", bound to the draft block's batch, columns [0, query_token_num)"
    if backend in DRAFT_OBJECTS:
        try:
            be = draft_backend_object(backend, pool, req, tr)
        except Exception as exc:  # a release whose __init__ reads what the stand-in runner lacks
            built = f"its backend object could not be built on CPU ({raised(exc)['detail']})"
            if backend == "trtllm_mha":
                return with_plan({"verdict": "not-run", "detail": f"trtllm_mha: {built}"}, where)
            out = _pass_dspark_draft(backend, pool, req, dcp, rank, tr, b.kv_loc_plan)
            return with_plan(dict(out, detail=f"{out['detail']} (the read-id builder alone: {built})"), where)
        return with_plan(_pass_dspark_draft_object(backend, be, pool, req, tr, plan), where)
    return with_plan(_pass_dspark_draft(backend, pool, req, dcp, rank, tr, b.kv_loc_plan), where)


# The draft backends whose real object the harness builds for DSPARK's block forward (eager and CUDA-graph form);
# the others are judged on their read-id builder (fa3's read_table, triton's _fill_kv_indptr_and_indices).
DRAFT_OBJECTS = {"flashinfer": f"{ATT}.flashinfer_backend.FlashInferAttnBackend",
                 "trtllm_mha": f"{ATT}.trtllm_mha_backend.TRTLLMHAAttnBackend"}


def draft_runner(pool, req: Request, tr, backend: str):
    """The stand-in draft model runner, with what the MHA backends' ``__init__`` reads of a dense draft."""
    # the server-args fields these __init__s read (0.5.18 reads them off model_runner.server_args), at their defaults
    import importlib

    import torch

    args = SimpleNamespace(dllm_algorithm=None, enable_mis=False, enable_deterministic_inference=False)
    if "server_args.get_attention_backends()" in source(importlib.import_module(f"{ATT}.flashinfer_backend")):
        # 0.5.17 asks the server args which backends the launch resolved: the release's own method, on its defaults
        args = ReleaseArgs(**vars(args), attention_backend=backend)
    mr = model_runner(pool, req.req_to_token, tr, server_args=args)
    mc = mr.model_config
    mc.get_num_kv_heads = lambda *tp_and_dcp: MHA_KV_HEADS  # (attn_tp_size[, attn_dcp_size]) by release
    mc.get_max_num_attention_heads = lambda *a: HEADS
    mc.hidden_size = HEADS * MHA_HEAD_DIM
    mr.prefill_attention_backend_str = mr.decode_attention_backend_str = backend
    mr.model, mr.max_running_requests, mr.is_draft_worker = torch.nn.Module(), 4, True
    mr.spec_algorithm = spec_algorithm("DSPARK")
    return mr


@contextlib.contextmanager
def device_probes_answered() -> Iterator[None]:
    """trtllm_mha's ``__init__`` sizes a workspace counter with ``flashinfer.utils`` device probes (the SM count, the
    trtllm-gen counter size), read in ``trtllm_mla_backend``: answered here, as for an H100-sized part."""
    import importlib

    mla = importlib.import_module(f"{ATT}.trtllm_mla_backend")
    probes = SimpleNamespace(utils=SimpleNamespace(get_device_sm_count=lambda device: 132,
                                                   get_trtllm_gen_multi_ctas_kv_counter_bytes=lambda *a, **k: 64))
    saved = getattr(mla, "flashinfer", None)
    mla.flashinfer = probes
    try:
        yield
    finally:
        if saved is None:
            del mla.flashinfer
        else:
            mla.flashinfer = saved


def draft_backend_object(backend: str, pool, req: Request, tr):
    """The draft runner's attention backend, built by its own ``__init__`` (flashinfer's wrappers are recorders)."""
    import importlib

    module, _, name = DRAFT_OBJECTS[backend].rpartition(".")
    stub_flashinfer_mha(importlib.import_module(f"{ATT}.flashinfer_backend"))
    with fa3_spec("DSPARK"), (device_probes_answered() if backend == "trtllm_mha" else contextlib.nullcontext()):
        return getattr(importlib.import_module(module), name)(draft_runner(pool, req, tr, backend))


def _block_batch(req: Request, tr, plan, be, *, seq_len: int | None = None):
    """``DraftBlockProposer._run_forward``'s batch: TARGET_VERIFY with ``seq_lens`` the committed prefix, and host
    lengths prefix + ``query_token_num`` (None where the backend says ``needs_cpu_seq_lens = False``), the block's
    tokens, ``make_draft_block_spec_info``'s spec input, the window plan bound to columns [0, query_token_num)."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    S, n = (req.S if seq_len is None else seq_len), DSPARK_BLOCK
    spec = verify_input("DSPARK")
    spec.draft_token_num = n
    lens = seqs(S)
    if getattr(be, "needs_cpu_seq_lens", True):
        lens.update(seq_lens_cpu=lens["seq_lens_cpu"] + n, seq_lens_sum=S + n)
    else:
        lens.update(seq_lens_cpu=None, seq_lens_sum=None)
    b = fb(forward_mode=ForwardMode.TARGET_VERIFY, **lens, positions=torch.arange(S, S + n), spec_info=spec,
           input_ids=torch.zeros(n, dtype=torch.long),
           out_cache_loc=None if seq_len is None else torch.zeros(n, dtype=torch.int64))
    if seq_len is None:
        bind_plan(plan, b, tr, cols=slice(0, n))
    else:
        bind_runner_slots(b, tr)
    return b


def _draft_object_rows(backend: str, be, *, graph: bool) -> list[int]:
    """The ids the kernel reads for the block: flashinfer's verify wrapper (eager) or the one bound at capture
    (graph); trtllm_mha's page table over ``cache_seqlens``."""
    if backend == "trtllm_mha":
        return fa3_rows(be.forward_metadata)
    wrapper = be.prefill_cuda_graph_metadata[1][0] if graph else be.prefill_wrappers_verify[0]
    return wrapper.kernel_ids()


def _pass_dspark_draft_object(backend: str, be, pool, req: Request, tr, plan) -> dict:
    """The block forward on the real backend object, in both forms the draft runner takes: eager
    (``init_forward_metadata``) and CUDA graph (``init_cuda_graph_state``, a capture on the runner's own slots,
    then the replay's ``init_forward_metadata_out_graph`` and, for trtllm_mha, its in-graph metadata kernel
    ``init_forward_metadata_in_graph``), as ``DraftBlockProposer._run_forward`` runs it through the draft runner's
    ``decode_cuda_graph_runner`` when ``can_run_graph``."""
    want = req.locs(req.S + DSPARK_BLOCK)  # the block's K/V are read back from the cache, after the prefix
    be.init_forward_metadata(_block_batch(req, tr, plan, be))
    eager = judge("mha", pool, _draft_object_rows(backend, be, graph=False), want)
    graph_be = draft_backend_object(backend, pool, req, tr)
    graph_be.init_cuda_graph_state(1, DSPARK_BLOCK)
    graph_be.init_forward_metadata_out_graph(_block_batch(req, tr, plan, graph_be, seq_len=1), in_capture=True)
    live = _block_batch(req, tr, plan, graph_be)
    graph_be.init_forward_metadata_out_graph(live, in_capture=False)
    if hasattr(graph_be, "init_forward_metadata_in_graph"):
        graph_be.init_forward_metadata_in_graph(live)
    graph = judge("mha", pool, _draft_object_rows(backend, graph_be, graph=True), want)
    return worse_of({"CUDA graph": graph, "eager": eager})


def _pass_dspark_draft(backend: str, pool, req: Request, dcp: int, rank: int, tr, plan) -> dict:
    """The DSPARK draft's block forward (ForwardMode.TARGET_VERIFY on the draft runner): the ids its backend's
    metadata builder hands the kernel, over the replicated context (and the block, where the kernel reads it
    from the cache)."""
    import torch

    S, n = req.S, DSPARK_BLOCK
    rpi = torch.tensor([0])
    seq_lens = torch.tensor([S], dtype=torch.int64)
    import inspect

    if backend == "flashinfer":
        spec = verify_input("DSPARK")
        spec.draft_token_num = n
        if "translator" in inspect.signature(spec.generate_attn_arg_prefill).parameters:  # 0.5.22 on
            kv_indices, kv_indptr, _, _ = spec.generate_attn_arg_prefill(
                req_pool_indices=rpi, paged_kernel_lens=seq_lens, paged_kernel_lens_sum=S, translator=tr, plan=plan)
        else:  # 0.5.18-0.5.21: straight from req_to_token
            kv_indices, kv_indptr, _, _ = spec.generate_attn_arg_prefill(rpi, seq_lens, S, req.req_to_token)
        ids = [int(x) for x in kv_indices[int(kv_indptr[0]):int(kv_indptr[1])].tolist()]
        return judge("mha", pool, ids, req.locs(S + n))
    if backend == "fa4":  # attention_registry's "fa4": FlashAttentionBackend(runner, fa_impl_ver=4)
        import importlib

        with fa3_kernels_stubbed():  # the module imports sgl_kernel, CUDA-only
            builder = importlib.import_module(FAB).FlashAttentionBackend.init_forward_metadata
        text = source(builder)
        if not text:
            return {"verdict": "not-run", "detail": "fa4: FlashAttentionBackend.init_forward_metadata's source cannot "
                    "be read here, so whether fa3's reading stands for it is not known"}
        if "fa_impl_ver" in text:
            return {"verdict": "not-run", "detail": "fa4: FlashAttentionBackend.init_forward_metadata branches on "
                    "fa_impl_ver in this release, so fa3's reading does not stand for it"}
        out = _pass_dspark_draft("fa3", pool, req, dcp, rank, tr, plan)
        return dict(out, detail=f"{out['detail']}; FlashAttentionBackend.init_forward_metadata has no fa_impl_ver "
                    "branch in this release: fa4's ids are fa3's")
    if backend == "fa3":
        if tr is not None and hasattr(tr, "read_table"):  # 0.5.22 on
            table = tr.read_table(plan if plan is not None else SimpleNamespace(req_pool_indices=rpi), rows=1)
            ids = [int(x) for x in table.ids[table.row_ids[0], :S + n].tolist()]  # cache_seqlens = seq_lens + n
        else:  # 0.5.18-0.5.21, topk 1, no unified pool: page_table = req_to_token[req_pool_indices, :max_seq_len_k]
            ids = [int(x) for x in req.req_to_token[rpi, :S + n][0].tolist()]
        return judge("mha", pool, ids, req.locs(S + n), note="page_table rows as the kernel indexes them (row = id)")
    if backend == "triton":
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

        be = SimpleNamespace(kv_index_translator=tr, kv_indptr=torch.zeros(2, dtype=torch.int32),
                             req_to_token=req.req_to_token)
        kv_indices = torch.empty(S, dtype=torch.int64)
        params = list(inspect.signature(TritonAttnBackend._fill_kv_indptr_and_indices).parameters)
        if params[1] == "plan":  # 0.5.22 on
            kv_indptr = TritonAttnBackend._fill_kv_indptr_and_indices(be, plan, 1, seq_lens, rpi, kv_indices)
        elif "index_table" in params:  # 0.5.19: the translator's per-batch index table
            table = tr.index_table_for_batch(Batch(req_pool_indices=rpi, seq_lens=seq_lens, seq_lens_sum=S,
                                                             seq_lens_cpu=seq_lens, batch_size=1))
            kv_indptr = TritonAttnBackend._fill_kv_indptr_and_indices(be, 1, seq_lens, table, kv_indices)
        else:  # 0.5.18, 0.5.20, 0.5.21
            kv_indptr = TritonAttnBackend._fill_kv_indptr_and_indices(be, 1, seq_lens, rpi, kv_indices)
        ids = [int(x) for x in kv_indices[int(kv_indptr[0]):int(kv_indptr[1])].tolist()]
        # extend_attention_fwd takes the block's own K/V from the forward; the cache read is the prefix
        return judge("mha", pool, ids, req.locs(S), note="the block's K/V come from the forward, not the cache")
    return {"verdict": "not-run", "detail": f"{backend}: its backend object needs sglang's resolved server args "
                                            "(get_exec/get_spec) and flashinfer's trtllm kernels to build; not driven on CPU"}


@functools.cache
def dense_drafts_note() -> str:
    """The dense DSPARK draft classes this release ships whose context write is the mapped one: each
    ``EntryClass`` of a ``sglang.srt.models`` module named for DSPARK whose ``write_target_hidden_kv`` is
    ``DSparkDraftModel``'s own function (inherited, not overridden); the others are named as having their own."""
    import importlib
    import pkgutil

    import sglang.srt.models as models
    from sglang.srt.models.dspark import DSparkDraftModel

    door = DSparkDraftModel.write_target_hidden_kv
    same, own = [], []
    for info in pkgutil.iter_modules(models.__path__):
        if "dspark" not in info.name:
            continue
        try:
            module = importlib.import_module(f"sglang.srt.models.{info.name}")
        except Exception:  # a model module that does not import on CPU says nothing here
            continue
        entries = getattr(module, "EntryClass", None)
        for cls in entries if isinstance(entries, (list, tuple)) else [entries]:
            if cls is None or cls is DSparkDraftModel or not hasattr(cls, "write_target_hidden_kv"):
                continue
            (same if cls.write_target_hidden_kv is door else own).append(cls.__name__)
    note = f"; the same {door.__qualname__} in {', '.join(sorted(same))}" if same else ""
    return note + (f"; its own in {', '.join(sorted(own))}" if own else "")


KIMI_K3_HOOK = "sglang.srt.arg_groups.kimi_k3_hook.apply_kimi_k3_spec_backend_defaults"


@functools.cache
def kimi_k3_draft_backend() -> str | None:
    """What the release's Kimi-K3 hook sets ``--speculative-draft-attention-backend`` to for a DSPARK launch with
    the flag unset, on an SM100 part (the platform probe, a device probe, answered as SM100): run here with the
    server args' resolution views standing in, as ``default_draft_backend`` does."""
    from unittest import mock

    from sglang.srt.arg_groups import kimi_k3_hook as hook

    args = SimpleNamespace(speculative_algorithm="DSPARK", speculative_draft_attention_backend=None,
                           linear_attn_verify_backend="set")  # the verify pin is another flag's business
    sm100 = SimpleNamespace(is_sm100=True)
    with contextlib.ExitStack() as stack:
        for name, value in (("resolving_view", lambda a: a), ("get_platform", lambda: sm100),
                            ("declare_resolution", lambda a, who, **kw: vars(a).update(kw))):
            if hasattr(hook, name):
                stack.enter_context(mock.patch.object(hook, name, value))
        from sglang.srt import utils  # 0.5.18/0.5.19 ask sglang.srt.utils.is_sm100_supported inside the hook

        if hasattr(utils, "is_sm100_supported"):
            stack.enter_context(mock.patch.object(utils, "is_sm100_supported", lambda *a: True))
        hook.apply_kimi_k3_spec_backend_defaults(args)
    return args.speculative_draft_attention_backend


def kimi_k3_note() -> str:
    try:
        chosen = kimi_k3_draft_backend()
    except Exception as exc:
        return f"; {KIMI_K3_HOOK} could not be run here: {raised(exc)['detail']}"
    return f"; {KIMI_K3_HOOK} (a Kimi hybrid DSPARK launch on SM100, flag unset) sets the draft backend to {chosen}"


def dspark_case(flag: str | None, dcp: int, rank: int, target_backend: str = "flashinfer_mla") -> tuple[Case, dict]:
    fa3 = target_backend == "fa3"
    if fa3 and not fa3_driven():
        return fa3_not_run("DSPARK", flag, dcp, rank)
    draft_backend = flag if flag is not None else default_draft_backend(target_backend)
    case = Case("DSPARK", "DSparkDraftModel", "mha", target_backend, draft_backend, dcp, rank, draft_backend_flag=flag)
    choices = draft_backend_choices()
    if choices is not None and draft_backend not in choices:
        msg = {"verdict": "not-admitted", "detail": f"--speculative-draft-attention-backend {draft_backend} is not in "
               "sglang.srt.arg_groups.choices.DRAFT_ATTENTION_BACKEND_CHOICES", "where": "arg_groups/choices.py"}
        return case, {p: dict(msg, after_hicache=dict(msg)) for p in PASSES}
    with on_rank(dcp, rank) as ops, (fa3_spec("DSPARK") if fa3 else contextlib.nullcontext()):
        _, target, draft = pools("DSPARK", "mha")
        req = Request(dcp)
        tr_t = translator_for(target, req.req_to_token, draft=False)

        def write_all(window_only: bool = False):
            import torch

            block = req.window[:DSPARK_BLOCK]
            if not window_only:
                harness.write_mla(target, torch.tensor(req.locs(req.S)))
                harness.write_mha(draft, req.prefix)  # write_target_hidden_kv: the committed context
            harness.write_mla(target, req.window)
            if draft_backend == "triton":  # the block's own tokens, through the draft backend's forward
                write_mha_triton(draft, block, torch.arange(req.S, req.S + len(block)))
            else:
                harness.write_mha(draft, block)

        write_all()
        striped_t = is_striped("mla", target, req.prefix, dcp, rank)
        not_run = {"verdict": "not-run", "detail": "DSPARK has no draft decode: the draft runs one block forward per "
                   "step (DraftBlockProposer._run_forward, ForwardMode.TARGET_VERIFY), recorded as DRAFT_EXTEND",
                   "where": "sglang.srt.speculative.dspark_components.dspark_draft.DraftBlockProposer._run_forward"}

        def run_all():
            if fa3:
                return {
                    "EXTEND": run_pass(lambda: fa3_pass_extend(target, req, dcp, rank, striped_t, tr=tr_t,
                                                               target_tr=tr_t, draft=False),
                                       fa3_where("EXTEND") + " (the target's prefill)"),
                    "DRAFT_DECODE_GRAPH": dict(not_run),
                    "DRAFT_DECODE_EAGER": dict(not_run),
                    "DRAFT_EXTEND": run_pass(lambda: pass_dspark_draft(draft_backend, draft, req, dcp, rank, tr_t=tr_t),
                                             DSPARK_DRAFT_FORWARD + dspark_draft_where(draft_backend)),
                    "TARGET_VERIFY_GRAPH": run_pass(lambda: fa3_pass_verify(target, req, dcp, rank, striped_t,
                                                                            algorithm="DSPARK", tr_t=tr_t, graph=True),
                                                    fa3_where("TARGET_VERIFY_GRAPH") + " (DFlashVerifyInput)"),
                    "TARGET_VERIFY_EAGER": run_pass(lambda: fa3_pass_verify(target, req, dcp, rank, striped_t,
                                                                            algorithm="DSPARK", tr_t=tr_t, graph=False),
                                                    fa3_where("TARGET_VERIFY_EAGER") + " (DFlashVerifyInput)"),
                }
            return {
                "EXTEND": run_pass(lambda: pass_extend_mla(target, req, dcp, rank, striped_t, draft=False, tr=tr_t,
                                                           target_tr=tr_t),
                                   nextn_where()["EXTEND"] + " (the target's prefill; the draft has no extend of its "
                                   "own: models.dspark.DSparkDraftModel.write_target_hidden_kv writes its context"
                                   f"{dense_drafts_note()})"),
                "DRAFT_DECODE_GRAPH": dict(not_run),
                "DRAFT_DECODE_EAGER": dict(not_run),
                "DRAFT_EXTEND": run_pass(lambda: pass_dspark_draft(draft_backend, draft, req, dcp, rank, tr_t=tr_t),
                                         DSPARK_DRAFT_FORWARD + dspark_draft_where(draft_backend)
                                         + (kimi_k3_note() if draft_backend == "trtllm_mha" else "")),
                "TARGET_VERIFY_GRAPH": run_pass(lambda: pass_target_verify_graph(target, req, dcp, rank, striped_t,
                                                                                 algorithm="DSPARK", tr_t=tr_t),
                                                nextn_where()["TARGET_VERIFY_GRAPH"].replace(
                                                    "eagle_info.EagleVerifyInput", "dflash_info.DFlashVerifyInput")
                                                .replace("fast_mla_prefill_plan", "the wrapper's own plan (no fast "
                                                         "plan for DFLASH_VERIFY)")),
                "TARGET_VERIFY_EAGER": run_pass(lambda: pass_target_verify(target, req, dcp, rank, striped_t,
                                                                           algorithm="DSPARK", tr_t=tr_t),
                                                nextn_where()["TARGET_VERIFY_EAGER"].replace(
                                                    "eagle_info.EagleVerifyInput", "dflash_info.DFlashVerifyInput")),
            }

        passes = with_after_hicache(run_all(), run_all, lambda: hicache_round_trip(
            ops, target, draft, req, dcp, draft_kind="mha", sidecar=True,
            rewrite_window=lambda: write_all(window_only=True)))
    return case, passes
