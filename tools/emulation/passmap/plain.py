"""The pass map's non-speculative passes: a plain DCP launch's target EXTEND and DECODE, per MLA backend.

The other case modules (``nextn``, ``fa3``, ``dspark``, ``eagle``) map the speculative passes. A launch without
speculative decoding runs the target's EXTEND (its prefix gathered under DCP) and DECODE, eager and as a CUDA
graph; this module maps those, on the same pools, tags and stand-ins (``harness``), for each MLA target backend the
harness can drive on CPU:

- ``flashinfer_mla`` (``FlashInferMLAAttnBackend``): the rows its decode wrapper is planned over;
- ``fa3`` (``FlashAttentionBackend`` in MLA mode): ``page_table`` x ``cache_seqlens``.

A decode under DCP has a second contract besides its rows. Each rank attends with every head over its own share
of the KV, so the model needs the rank's log-sum-exp to merge the partial outputs: DeepSeek's MLA forward calls
``attn_mqa_for_dcp_decode`` (through ``RadixAttention`` and the backend's ``forward``, as any decode) and unpacks
``attn_output, lse`` from it. So each DECODE pass also runs the backend's own ``forward`` on the decode batch, with
stand-in kernels that answer with zeros of the shapes the real kernels return (and an LSE only where the backend
asks the kernel for one), and unpacks the result as the model does. A backend that returns no LSE is "raises",
with the model's line; the rows are judged only when the contract holds.

Blackwell's ``trtllm_mla`` and ``cutedsl_mla`` hand their DCP reads to one flashinfer kernel: they run on that
kernel's oracle, judged by their reads and by numbers (``blackwell``). flashmla and triton are recorded
"not-run": their reads are planned by their kernels or not driven here, and preflight says their passes are
unchecked.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

from emulation.passmap import blackwell, fa3, harness, nextn

PLAIN_PASSES = ("EXTEND", "DECODE_EAGER", "DECODE_GRAPH")
DRIVEN = ("flashinfer_mla", "fa3")
# Blackwell's MLA backends, on the oracle of their one kernel: emulation.passmap.blackwell
KERNEL_ORACLE = blackwell.BACKENDS
NOT_DRIVEN = {
    "flashmla": "its metadata is planned by the FlashMLA kernel (get_mla_metadata), which needs a GPU",
    "triton": "the harness does not drive the Triton MLA backend's decode",
}
MODEL_UNPACK = "attn_output, lse = self.attn_mqa_for_dcp_decode("


@functools.cache
def model_line() -> str:
    """Where this release's DeepSeek MLA forward unpacks the DCP decode's ``(attn_output, lse)``, as path:line."""
    import sglang.srt.models as models

    root = Path(models.__path__[0])
    for path in sorted(root.rglob("*.py")):
        if "rocm" in path.name:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if MODEL_UNPACK in line:
                return f"sglang/srt/models/{path.relative_to(root).as_posix()}:{n}"
    return "sglang/srt/models (no attn_mqa_for_dcp_decode in this release)"


def mqa_layer(dcp: int):
    """``attn_mqa_for_dcp_decode``: HEADS x dcp query heads (the gathered heads of the DCP group), one latent KV head."""
    heads = harness.HEADS * max(dcp, 1)
    return SimpleNamespace(
        layer_id=0, tp_q_head_num=heads, tp_k_head_num=1, tp_v_head_num=1, head_dim=harness.KV_LORA_RANK + harness.QK_ROPE_HEAD_DIM,
        qk_head_dim=harness.KV_LORA_RANK + harness.QK_ROPE_HEAD_DIM, v_head_dim=harness.KV_LORA_RANK, scaling=1.0, logit_cap=0.0,
        k_scale=None, v_scale=None, k_scale_float=None, v_scale_float=None, sliding_window_size=-1,
        is_cross_attention=False, attn_type=None, is_cross=False, use_irope=False, sinks=None)


def decode_inputs(dcp: int):
    """q (latent part), k, v and the rope parts of one decode token, as ``forward_absorb_core`` hands them."""
    import torch

    heads = harness.HEADS * max(dcp, 1)
    q = torch.zeros(1, heads, harness.KV_LORA_RANK, dtype=torch.bfloat16)
    q_rope = torch.zeros(1, heads, harness.QK_ROPE_HEAD_DIM, dtype=torch.bfloat16)
    k = torch.zeros(1, 1, harness.KV_LORA_RANK, dtype=torch.bfloat16)
    k_rope = torch.zeros(1, 1, harness.QK_ROPE_HEAD_DIM, dtype=torch.bfloat16)
    return q, k, q_rope, k_rope


def contract(result, heads: int) -> dict | None:
    """The model's unpack of the decode's result, in our words: None when it yields an (output, LSE) pair whose LSE
    has one value per token and head; else the finding."""
    import torch

    try:
        out, lse = result
    except (TypeError, ValueError) as exc:
        shape = list(result.shape) if isinstance(result, torch.Tensor) else type(result).__name__
        return {"verdict": "raises", "detail": f"{type(exc).__name__}: {exc} at {model_line()} (the backend's decode "
                f"returns {shape} and no LSE; a batch of exactly 2 tokens would unpack its two rows as output and "
                "LSE instead)"}
    if not isinstance(lse, torch.Tensor) or lse.dim() < 2 or lse.shape[-1] != heads:
        return {"verdict": "raises", "detail": f"the decode's second value is not an LSE per token and head "
                f"({getattr(lse, 'shape', type(lse).__name__)}); {model_line()} merges the ranks' outputs with it"}
    return None


def decode_batch(req, n: int | None = None, out_cache_loc=None):
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    n = req.S + 1 if n is None else n
    loc = torch.tensor([req.locs(req.S + 1)[req.S]], dtype=torch.int64) if out_cache_loc is None else out_cache_loc
    return harness.fb(forward_mode=ForwardMode.DECODE, **harness.seqs(n), positions=torch.tensor([n - 1]),
                 input_ids=torch.zeros(1, dtype=torch.long), out_cache_loc=loc)


def decode_want(req, striped: bool, dcp: int, rank: int) -> list[int]:
    """A decode attends to the prefix and the token it decodes (written before the attention)."""
    return harness.owned(req.locs(req.S + 1), striped, dcp, rank)


class LseWrapper(harness.RecordingWrapper):
    """The flashinfer MLA wrapper stand-in with a ``run`` that answers as ``BatchMLAPagedAttentionWrapper.run``:
    the output, and the LSE only when ``return_lse`` asks for it."""

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse: bool = False, **kwargs):
        import torch

        o = torch.zeros_like(q_nope) if out is None else out
        if return_lse:
            return o, torch.zeros(q_nope.shape[0], q_nope.shape[1], dtype=torch.float32)
        return o


def fi_backend(pool, req, tr):
    fmb = importlib.import_module(nextn.FMB)
    harness.stub_flashinfer(fmb)
    for name in dir(fmb):  # the MLA wrapper classes the backend builds: recorders that also answer run()
        if getattr(fmb, name) is harness.RecordingWrapper:
            setattr(fmb, name, LseWrapper)
    return fmb.FlashInferMLAAttnBackend(harness.model_runner(pool, req.req_to_token, tr, server_args=nextn.FI_ARGS))


def fi_decode(pool, req, dcp, rank, striped, *, tr, graph: bool) -> dict:
    import torch

    be = fi_backend(pool, req, tr)
    cap_where = ""
    if graph:
        be.init_cuda_graph_state(1, 1)
        cap = decode_batch(req, n=1, out_cache_loc=torch.zeros(1, dtype=torch.int64))
        cap_where = harness.bind_runner_slots(cap, tr) + "; replay: "
        be.init_forward_metadata_out_graph(cap, in_capture=True)
    b = decode_batch(req)
    where = harness.bind_own(b, tr)
    if graph:
        be.init_forward_metadata_out_graph(b, in_capture=False)
        wrapper = be.decode_cuda_graph_metadata[1]
    else:
        be.init_forward_metadata(b)
        wrapper = be.forward_metadata.decode_wrapper
    ids = wrapper.kernel_ids()
    q, k, q_rope, k_rope = decode_inputs(dcp)
    if dcp > 1:
        found = contract(be.forward(q, k, k, mqa_layer(dcp), b, save_kv_cache=False, q_rope=q_rope, k_rope=k_rope),
                         harness.HEADS * dcp)
        if found is not None:
            return harness.with_plan(found, cap_where + where)
    return harness.with_plan(harness.judge("mla", pool, ids, decode_want(req, striped, dcp, rank)), cap_where + where)


@contextlib.contextmanager
def fa3_kernel_answers(be) -> Iterator[None]:
    """``flash_attn_with_kvcache`` answers as sgl_kernel's does: the output (latent width), and with
    ``return_softmax_lse`` the LSE too; only for the contract check, and only in the backend's module (the globals
    its ``forward_decode`` reads: the module the object was built from)."""
    import torch

    def kernel(q, k_cache=None, v_cache=None, *args, return_softmax_lse: bool = False, qv=None, **kwargs):
        width = qv.shape[-1] if qv is not None else v_cache.shape[-1]
        out = torch.zeros(*q.shape[:-1], width, dtype=q.dtype)
        if return_softmax_lse:
            return out, torch.zeros(q.shape[0], q.shape[1], dtype=torch.float32)
        return out

    with mock.patch.dict(type(be).forward_decode.__globals__, {"flash_attn_with_kvcache": kernel}):
        yield


def fa3_decode(pool, req, dcp, rank, striped, *, tr, graph: bool) -> dict:
    import torch

    be = fa3.fa3_backend(pool, req, tr)
    cap_where = ""
    if graph:
        be.init_cuda_graph_state(1, 1)
        cap = decode_batch(req, n=1, out_cache_loc=torch.zeros(1, dtype=torch.int64))
        cap_where = harness.bind_runner_slots(cap, tr) + "; replay: "
        be.init_forward_metadata_out_graph(cap, in_capture=True)
    b = decode_batch(req)
    where = harness.bind_own(b, tr)
    if graph:
        be.init_forward_metadata_out_graph(b, in_capture=False)
    else:
        be.init_forward_metadata(b)
    rows = fa3.fa3_rows(be.forward_metadata)
    if dcp > 1:
        q, k, q_rope, k_rope = decode_inputs(dcp)
        with fa3.fa3_kernels_stubbed(), fa3_kernel_answers(be):
            result = be.forward(q, k, k, mqa_layer(dcp), b, save_kv_cache=False, q_rope=q_rope, k_rope=k_rope)
        found = contract(result, harness.HEADS * dcp)
        if found is not None:
            return harness.with_plan(found, cap_where + where)
    return harness.with_plan(harness.judge("mla", pool, rows, decode_want(req, striped, dcp, rank),
                                 note="page_table x cache_seqlens rows"), cap_where + where)


WHERE = {
    ("flashinfer_mla", "EXTEND"): f"{nextn.FMB}.FlashInferMLAAttnBackend.init_forward_metadata (EXTEND) after "
                                  "sglang.srt.layers.dcp.planner.prepare_decode_context_parallel_metadata (the prefix "
                                  "gather: dcp_local_prefix_kv_indices, then dcp_kv_indices over the gathered buffer)",
    ("flashinfer_mla", "DECODE_EAGER"): f"{nextn.FMB}.FlashInferMLAAttnBackend.init_forward_metadata (DECODE) -> "
                                        "forward -> forward_decode (decode_wrapper.run, return_lse as the backend asks)",
    ("flashinfer_mla", "DECODE_GRAPH"): f"{nextn.FMB}.FlashInferMLAAttnBackend.init_cuda_graph_state -> "
                                        "init_forward_metadata_out_graph (capture, replay: decode_cuda_graph_metadata) "
                                        "-> forward -> forward_decode",
    ("fa3", "EXTEND"): fa3.FA_EXTEND,
    ("fa3", "DECODE_EAGER"): f"{fa3.FAB}.FlashAttentionBackend.init_forward_metadata (DECODE: page_table, "
                             "cache_seqlens) -> forward -> forward_decode (flash_attn_with_kvcache)",
    ("fa3", "DECODE_GRAPH"): f"{fa3.FAB}.FlashAttentionBackend.init_cuda_graph_state -> init_forward_metadata_out_graph"
                             " (capture, replay) -> forward -> forward_decode (flash_attn_with_kvcache)",
}


def plain_case(backend: str, dcp: int, rank: int) -> dict:
    if backend in KERNEL_ORACLE:
        return blackwell.plain_record(backend, dcp, rank)
    record = {"release": harness.release(), "algorithm": None, "target_backend": backend, "target_kind": "mla",
              "dcp": dcp, "rank": rank}
    if backend not in DRIVEN:
        msg = {"verdict": "not-run", "detail": f"not mapped: {NOT_DRIVEN[backend]}", "where": "tools/emulation/passmap/plain.py"}
        return dict(record, passes={p: dict(msg) for p in PLAIN_PASSES})
    try:
        with harness.on_rank(dcp, rank), (fa3.fa3_spec("NEXTN") if backend == "fa3" else contextlib.nullcontext()):
            _, target, draft = harness.pools("NEXTN", "mla")
            req = harness.Request(dcp)
            tr = harness.translator_for(target, req.req_to_token, draft=False)
            nextn.write_nextn(target, draft, req)
            striped = harness.is_striped("mla", target, req.prefix, dcp, rank)
            if backend == "flashinfer_mla":
                runs = {
                    "EXTEND": lambda: nextn.pass_extend_mla(target, req, dcp, rank, striped, draft=False, tr=tr,
                                                         target_tr=tr),
                    "DECODE_EAGER": lambda: fi_decode(target, req, dcp, rank, striped, tr=tr, graph=False),
                    "DECODE_GRAPH": lambda: fi_decode(target, req, dcp, rank, striped, tr=tr, graph=True),
                }
            else:
                runs = {
                    "EXTEND": lambda: fa3.fa3_pass_extend(target, req, dcp, rank, striped, tr=tr, target_tr=tr,
                                                         draft=False),
                    "DECODE_EAGER": lambda: fa3_decode(target, req, dcp, rank, striped, tr=tr, graph=False),
                    "DECODE_GRAPH": lambda: fa3_decode(target, req, dcp, rank, striped, tr=tr, graph=True),
                }
            passes = {p: harness.run_pass(runs[p], WHERE[(backend, p)]) for p in PLAIN_PASSES}
    except Exception as exc:  # the release lacks an API the harness drives
        msg = {"verdict": "not-run", "detail": f"the harness could not build this release's pools/backends on CPU: "
               f"{harness.raised(exc)['detail']}", "where": "tools/emulation/passmap/plain.py (set-up)"}
        passes = {p: dict(msg) for p in PLAIN_PASSES}
    return dict(record, passes=passes)


def measure(dcp_sizes=harness.DCP_SIZES) -> list[dict]:
    return [plain_case(backend, dcp, rank) for backend in (*DRIVEN, *KERNEL_ORACLE, *NOT_DRIVEN) for dcp in dcp_sizes
            for rank in sorted({0, dcp - 1})]


def sort_key(c: dict) -> tuple:
    return (tuple(int(x) for x in c["release"].split(".")[:3]), c["target_backend"], c["dcp"], c["rank"])


def markdown(records: list[dict]) -> list[str]:
    out = ["Without speculative decoding (the target's own passes; worst over the ranks run):", "",
           "| target backend | dcp | " + " | ".join(PLAIN_PASSES) + " |", "|---|---|" + "---|" * len(PLAIN_PASSES)]
    for c in records:
        if c["rank"] != 0 or c["dcp"] not in (1, 8):
            continue
        peers = [d for d in records if (d["target_backend"], d["dcp"]) == (c["target_backend"], c["dcp"])]
        cells = [min((d["passes"][p]["verdict"] for d in peers), key=harness.SEVERITY.get) for p in PLAIN_PASSES]
        out.append(f"| {c['target_backend']} | {c['dcp']} | " + " | ".join(cells) + " |")
    out += ["", "Details (dcp 8, last rank):", ""]
    for c in records:
        if c["dcp"] == 8 and c["rank"] == 7:
            out.append(f"- {c['target_backend']}:")
            out += [f"  - {p}: **{q['verdict']}**: {q['detail']}. Where: `{q['where']}`" for p, q in c["passes"].items()]
    return out
