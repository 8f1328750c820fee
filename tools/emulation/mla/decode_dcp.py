"""Numbers for Blackwell's MLA backends under DCP: cutedsl_mla and trtllm_mla, N ranks merged against one rank.

The flashinfer verify's harness (``emulation.mla.verify_dcp``) gives the batch, its locs and values, the rank's
pool and the HiCache load-back; this module drives the two backends sglang runs on a B200 with DCP:

- ``cutedsl_mla`` (``CuteDslMLABackend``): DECODE and TARGET_VERIFY, both through ``_run_decode_kernel`` into
  flashinfer's cute-dsl kernel with ``enable_dcp``;
- ``trtllm_mla`` (``TRTLLMMLABackend``): DECODE through ``_forward_decode_dcp`` (the trtllm-gen kernel over the
  rank's own table); its TARGET_VERIFY under DCP raises by design (and its startup refuses speculative decoding
  under DCP, ``attention_registry.py``), recorded as such.

Per rank, on the sglang tree on ``PYTHONPATH``: the release's own backend object (its ``__init__`` on a stand-in
model runner), its own metadata (``init_forward_metadata``, or a CUDA-graph capture then replay through
``init_forward_metadata_out_graph``: the DCP block table from ``create_mla_kv_page_table_for_dcp`` in Triton's
interpreter, the local and global lengths), its own ``forward`` (the KV write through ``set_mla_kv_buffer``, the
query concat, heads x dcp). Replaced, as needing a GPU: the kernel by ``decode_oracle.DecodeMLAOracle`` (its
documented contract, strict where silent), ``fixup_zero_kv_rows`` by what its docstring says it does, and the
trtllm workspace and its multi-CTA counter. The ranks' ``(out, lse)`` are merged by sglang's own
``cp_lse_ag_out_rs_mla`` with the LSE base the release's model picks for the backend
(``forward_mla.py``: ``is_mla_dcp_lse_base_on_e`` / ``_is_mla_dcp_lse_base_on_e``), and each rank's heads are
compared with the same batch on one rank (no DCP).

Controls, each of which must be caught: ``shift-write`` (each prefix token one row off), ``flipped-bound`` (the
kernel's per-query bound mirrored), ``lse-base`` (the kernel's LSE in the other base from the one the release's
merge reads), ``no-fixup`` (an empty rank's rows left as the kernel wrote them).

Usage: PYTHONPATH=build/trees/sglang-X .venv/bin/python -m emulation.mla.decode_dcp [--backends a,b]
       [--passes DECODE,TARGET_VERIFY] [--cases a,b] [--dcp 2,4,8] [--modes eager,graph]
       [--control none,NAME,...] [--json | --markdown]   (each control a run of its own; none: without one)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import sys
from types import SimpleNamespace

from emulation.mla import verify_dcp as V
from emulation.mla.decode_oracle import DecodeMLAOracle
from emulation.passmap import harness

BACKENDS = ("cutedsl_mla", "trtllm_mla")
PASSES = ("DECODE", "TARGET_VERIFY")
CONTROLS = ("shift-write", "flipped-bound", "lse-base", "no-fixup")
TOLERANCE = V.TOLERANCE
# The cases, in the flashinfer verify's terms (``verify_dcp.Shape``); a DECODE takes each shape's prefixes and one
# new token per request.
# cute-dsl pages by 32 or 64 (sglang's overrides force it; flashinfer refuses page 1), so every shape is paged so.
SHAPES = (
    V.Shape("dspark-block7-page64", "DSPARK", (37, 5, 130), 7, 64),  # three requests of different lengths
    V.Shape("eagle-chain4-page32", "EAGLE", (29, 11), 4, 32),
    V.Shape("short-prefixes", "DSPARK", (1, 6), 7, 64),  # shorter than N: some ranks hold no key of a request
    V.Shape("no-prefix-key", "DSPARK", (3, 1), 7, 64),  # at dcp 8 ranks 4-7 hold no key of either request at all
    V.Shape("after-load-back", "DSPARK", (37, 70), 7, 64, hicache=True),
)
TRTLLM = "sglang.srt.layers.attention.trtllm_mla_backend"
CUTEDSL = "sglang.srt.layers.attention.cutedsl_mla_backend"
CURRENT: dict = {}


def fixup_zero_kv_rows(out, lse, kv_lens, cum_seq_lens, max_seq_len) -> None:
    """What sglang's ``fixup_zero_kv_rows`` docstring says its CUDA kernel does: a request with no KV gets output 0
    and LSE -inf on all its query rows."""
    if CURRENT.get("control") == "no-fixup":
        return
    for i, n in enumerate(kv_lens.tolist()):
        if n == 0:
            a, b = int(cum_seq_lens[i]), int(cum_seq_lens[i + 1])
            out[a:b] = 0
            lse[a:b] = float("-inf")


def lse_base_on_e(backend: str) -> bool:
    """The base the release's MLA forward tells sglang's DCP merge the backend's LSE is in."""
    fm = importlib.import_module("sglang.srt.models.deepseek_common.attention_forward_methods.forward_mla")
    pick = getattr(fm, "is_mla_dcp_lse_base_on_e", None) or fm._is_mla_dcp_lse_base_on_e
    return bool(pick(backend))


def oracle_options(backend: str) -> dict:
    control = CURRENT.get("control")
    if control == "flipped-bound":
        return {"flip_bound": True}
    if control == "lse-base":
        return {"lse_other_base": True}
    return {}


@contextlib.contextmanager
def gpu_pieces(backend: str):
    """The kernel, the zero-KV fixup, the workspace and the multi-CTA counter: the GPU pieces of both modules."""
    tm, cm = importlib.import_module(TRTLLM), importlib.import_module(CUTEDSL)
    harness.stub_flashinfer(importlib.import_module(V.FMB))
    oracle = DecodeMLAOracle(**oracle_options(backend))
    kernel = SimpleNamespace(decode=SimpleNamespace(trtllm_batch_decode_with_kv_cache_mla=oracle))
    patches = [(tm, "flashinfer", kernel), (cm, "flashinfer", kernel), (tm, "fixup_zero_kv_rows", fixup_zero_kv_rows),
               (cm, "fixup_zero_kv_rows", fixup_zero_kv_rows), (tm, "DEFAULT_WORKSPACE_SIZE_MB", 1)]
    if hasattr(tm, "_jit_fixup_module"):
        patches.append((tm, "_jit_fixup_module", lambda dtype: None))
    if hasattr(tm, "make_persistent_multi_ctas_kv_counter_buffer"):
        patches.append((tm, "make_persistent_multi_ctas_kv_counter_buffer", lambda *a, **k: None))
    with contextlib.ExitStack() as stack:
        for module, name, value in patches:
            stack.enter_context(_patched(module, name, value))
        yield oracle


@contextlib.contextmanager
def _patched(module, name, value):
    had, old = hasattr(module, name), getattr(module, name, None)
    setattr(module, name, value)
    try:
        yield
    finally:
        if had:
            setattr(module, name, old)
        else:
            delattr(module, name)


def backend_for(backend: str, pool, layout, shape):
    tm, cm = importlib.import_module(TRTLLM), importlib.import_module(CUTEDSL)
    translator = harness.translator_for(pool, layout.req_to_token, draft=False)
    runner = V.model_runner(pool, layout, translator)
    runner.max_running_requests = len(shape.prefixes)
    cls = cm.CuteDslMLABackend if backend == "cutedsl_mla" else tm.TRTLLMMLABackend
    return cls(runner, skip_prefill=False)


@contextlib.contextmanager
def spec_settings(shape):
    """What the backends read of the speculative settings: the verify's draft tokens, topk 1."""
    from sglang.srt.runtime_context import get_spec

    with get_spec().override(speculative_num_draft_tokens=shape.draft_tokens, speculative_eagle_topk=1):
        yield


def decode_batch(shape, layout, *, capture: bool = False):
    """One decode step: each request's next token at position = its prefix, its loc the window's first."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    bs = len(shape.prefixes)
    lens = torch.tensor([1] * bs if capture else [h + 1 for h in shape.prefixes], dtype=torch.int64)
    loc = (torch.zeros(bs, dtype=torch.int64) if capture
           else torch.cat([layout.locs(r, h, h + 1) for r, h in enumerate(shape.prefixes)]))
    b = harness.fb(forward_mode=ForwardMode.DECODE, batch_size=bs, req_pool_indices=torch.arange(bs), seq_lens=lens,
                   seq_lens_sum=int(lens.sum()), seq_lens_cpu=lens.clone(), spec_info=None, positions=lens - 1,
                   out_cache_loc=loc)
    b.out_cache_loc_is_physical = True
    return b


def batch_for(pass_name: str, shape, layout, *, capture: bool = False):
    if pass_name == "DECODE":
        return decode_batch(shape, layout, capture=capture)
    return V.verify_batch(shape, layout, V.spec_input(shape), capture=capture)


def new_tokens(pass_name: str, shape) -> int:
    return 1 if pass_name == "DECODE" else shape.draft_tokens


def queries(pass_name: str, shape, q):
    """The pass's queries: the verify's draft tokens, or each request's first one for a decode."""
    if pass_name == "TARGET_VERIFY":
        return q
    n = shape.draft_tokens
    return tuple(t.view(len(shape.prefixes), n, *t.shape[1:])[:, 0].contiguous() for t in q)


def rank_partial(backend: str, pass_name: str, shape, layout, kv, q, mode: str, *, ops=None):
    """One rank's pass through the backend's own metadata and forward: ``(out, lse)`` under DCP, else the output."""
    import torch

    pool = V.pool_for(layout)
    CURRENT["pool"] = pool  # what the rank holds, for a caller that judges the kernel's reads (run_ranks' observe)
    V.write_prefix(pool, layout, kv, 1 if CURRENT.get("control") == "shift-write" else 0)
    if shape.hicache:
        V.load_back(ops, pool, layout)
    be = backend_for(backend, pool, layout, shape)
    live = batch_for(pass_name, shape, layout)
    translator = getattr(be, "kv_index_translator", None)  # 0.5.17's backends read req_to_token themselves
    harness.bind_own(live, translator)
    bs = len(shape.prefixes)
    if mode == "eager":
        be.init_forward_metadata(live)
    else:
        be.init_cuda_graph_state(bs, bs * shape.draft_tokens)
        cap = batch_for(pass_name, shape, layout, capture=True)
        harness.bind_runner_slots(cap, translator)
        be.init_forward_metadata_out_graph(cap, in_capture=True)
        be.init_forward_metadata_out_graph(live, in_capture=False)
    n = new_tokens(pass_name, shape)
    window_c = torch.cat([kv[r][0][h:h + n] for r, h in enumerate(shape.prefixes)])
    window_k = torch.cat([kv[r][1][h:h + n] for r, h in enumerate(shape.prefixes)])
    qn, qr = queries(pass_name, shape, q)
    result = be.forward(qn.clone(), window_c[:, None, :], window_c[:, None, :], V.LAYER, live, save_kv_cache=True,
                        q_rope=qr.clone(), k_rope=window_k[:, None, :])
    if layout.dcp == 1:
        return (result[0] if isinstance(result, tuple) else result).reshape(-1, V.HEADS, V.KV_LORA_RANK), None
    out, lse = result  # forward_mla.py at a DCP phase: ``attn_output, lse = self.attn_mqa_for_dcp_decode(...)``
    return out, lse


def run_ranks(backend: str, pass_name: str, shape, dcp: int, mode: str, kv, q, *, observe=None):
    """Every rank's ``(out, lse)``; ``observe(rank, pool, reads)``, where given, sees each rank's pool after its
    pass and the rows the kernel read there (``DecodeMLAOracle.reads``)."""
    layout = V.Layout(shape, dcp)
    partials = []
    for rank in range(dcp):
        with harness.on_rank(dcp, rank) as ops, spec_settings(shape), V.attention_tp(dcp), gpu_pieces(backend) as k:
            partials.append(rank_partial(backend, pass_name, shape, layout, kv, q, mode, ops=ops))
            if observe is not None:
                observe(rank, CURRENT.pop("pool"), k.reads)
    return partials


def dense(pass_name: str, shape, kv, q):
    """The pass written out as softmax attention over each request's positions, causal on global positions."""
    import torch

    n = new_tokens(pass_name, shape)
    qn, qr = queries(pass_name, shape, q)
    out = []
    for r, h in enumerate(shape.prefixes):
        keys = torch.cat([kv[r][0][: h + n], kv[r][1][: h + n]], -1).double()
        qs = torch.cat([qn[r * n:(r + 1) * n], qr[r * n:(r + 1) * n]], -1).double()
        score = torch.einsum("qhd,kd->qhk", qs, keys) * V.SM_SCALE
        visible = torch.arange(h + n)[None, :] <= (h + torch.arange(n))[:, None]
        score = score.masked_fill(~visible[:, None, :], float("-inf"))
        out.append(torch.softmax(score, -1) @ keys[:, : V.KV_LORA_RANK])
    return torch.cat(out)


def run_case(backend: str, pass_name: str, shape, dcp: int, modes=V.MODES, *, control_name: str | None = None,
             reference=None) -> dict:
    """Per mode: max |error| of the merged pass against one rank, over every rank's heads; or what raised."""
    kv, q = V.values(shape)
    results = {}
    for mode in modes:
        CURRENT.clear()
        try:
            if reference is None:
                reference = run_ranks(backend, pass_name, shape, 1, "eager", kv, q)[0][0]
            CURRENT["control"] = control_name
            partials = run_ranks(backend, pass_name, shape, dcp, mode, kv, q)
            merged = merge(partials, lse_base_on_e(backend))
        except Exception as exc:  # a pass that raises is a finding
            first = str(exc).splitlines()[0][:200] if str(exc) else ""
            results[mode] = {"outcome": "raises", "detail": f"{type(exc).__name__}: {first}"}
            continue
        finally:
            CURRENT.clear()
        per = V.HEADS // dcp
        error = max(float((merged[r].reshape(-1, per, V.KV_LORA_RANK)
                           - reference[:, r * per:(r + 1) * per]).abs().max()) for r in range(dcp))
        outcome = "matches" if math.isfinite(error) and error <= TOLERANCE else "differs"
        results[mode] = {"outcome": outcome, "error": error}
    return results


def merge(partials: list, base_on_e: bool) -> list:
    return V.merge(partials, is_lse_base_on_e=base_on_e)


def one_rank_error(backend: str, pass_name: str, shape) -> float:
    """The one-rank reference itself against the dense form: the reference is only as good as this."""
    kv, q = V.values(shape)
    got = run_ranks(backend, pass_name, shape, 1, "eager", kv, q)[0][0]
    return float((got.double() - dense(pass_name, shape, kv, q)).abs().max())


def measure(*, backends=BACKENDS, passes=PASSES, names=None, dcp_sizes=V.DCP_SIZES, modes=V.MODES,
            control_name: str | None = None) -> list[dict]:
    rows = []
    for backend in backends:
        for pass_name in passes:
            for shape in SHAPES:
                if names and shape.name not in names:
                    continue
                kv, q = V.values(shape)
                missing = shape.hicache and hicache_missing()
                reference = None
                if missing:
                    detail = f"the load-back needs {missing}, which this release lacks"
                else:
                    try:
                        reference = run_ranks(backend, pass_name, shape, 1, "eager", kv, q)[0][0]
                    except Exception as exc:
                        detail = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                for dcp in dcp_sizes:
                    if missing:
                        res = {m: {"outcome": "not-run", "detail": detail} for m in modes}
                    elif reference is None:
                        res = {m: {"outcome": "raises", "detail": f"one rank: {detail}"} for m in modes}
                    else:
                        res = run_case(backend, pass_name, shape, dcp, modes, control_name=control_name,
                                       reference=reference)
                    rows.extend({"backend": backend, "pass": pass_name, "case": shape.name, "dcp": dcp, "mode": m,
                                 **res[m]} for m in modes)
    return rows


def hicache_missing() -> str:
    """The module the flashinfer verify's load-back drives (``verify_dcp.load_back``), if this release lacks it:
    0.5.17's HiCache moves pages through another controller API, which that load-back does not drive."""
    import importlib.util

    name = "sglang.srt.mem_cache.l2_transfer"
    return "" if importlib.util.find_spec(name) else name


def release() -> str:
    return harness.release()


def markdown(rows: list[dict], *, control_name: str | None) -> str:
    what = f", control {control_name}" if control_name else ""
    out = [f"sglang {release()}{what}:", "", "| backend | pass | case | dcp | outcome | max error (eager, graph), or what stopped it |",
           "|---|---|---|---|---|---|"]
    keyed: dict = {}
    for r in rows:
        keyed.setdefault((r["backend"], r["pass"], r["case"], r["dcp"]), []).append(r)
    for (backend, pass_name, case, dcp), group in keyed.items():
        outcomes = sorted({g["outcome"] for g in group})
        details = sorted({g["detail"] for g in group if "error" not in g})
        cells = ", ".join(f"{g['error']:.1e}" for g in group if "error" in g) or details[0][:72]
        out.append(f"| {backend} | {pass_name} | {case} | {dcp} | {'/'.join(outcomes)} | {cells} |")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    harness.prepare()
    p = argparse.ArgumentParser(prog="python -m emulation.mla.decode_dcp", description=__doc__.splitlines()[0])
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--passes", default=",".join(PASSES))
    p.add_argument("--cases", default="")
    p.add_argument("--dcp", default=",".join(map(str, V.DCP_SIZES)))
    p.add_argument("--modes", default=",".join(V.MODES))
    p.add_argument("--control", default="none",
                   help=f"comma-separated, from none,{','.join(CONTROLS)}: each a run of its own, in one process")
    p.add_argument("--json", action="store_true")
    p.add_argument("--markdown", action="store_true")
    a = p.parse_args(argv)
    controls = a.control.split(",")
    unknown = sorted(set(controls) - {"none", *CONTROLS})
    if unknown:
        p.error(f"unknown control {', '.join(unknown)}; expected none or one of {', '.join(CONTROLS)}")
    out, text = [], []
    for control_name in controls:
        control_name = None if control_name == "none" else control_name
        rows = measure(backends=a.backends.split(","), passes=a.passes.split(","),
                       names=[c for c in a.cases.split(",") if c], dcp_sizes=[int(d) for d in a.dcp.split(",")],
                       modes=a.modes.split(","), control_name=control_name)
        out.extend(dict(r, control=control_name) for r in rows)
        text.append(markdown(rows, control_name=control_name))
    print(json.dumps(out) if a.json else "\n".join(text), end="\n" if a.json else "")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
