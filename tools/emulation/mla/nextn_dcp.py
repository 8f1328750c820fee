"""Numbers for the NextN draft's own passes under DCP on flashinfer MLA: N ranks merged against one rank, on CPU.

DeepSeek-V3's MTP layer as draft (``--speculative-algorithm NEXTN``, its
public ``config.json``: ``num_nextn_predict_layers`` 1, the same MLA latent as
the target's, kv_lora_rank 512 + rope 64) keeps its KV striped over the ranks
as the target does. Its two passes of its own, each run by the release's own
flashinfer MLA code on every rank of a DCP group, as
:mod:`emulation.mla.verify_dcp` runs the verify:

- the **draft decode** (``FlashInferMLAMultiStepDraftBackend``, topk 1, 3
  steps): one query per request per step, eager
  (``init_forward_metadata``) or as a CUDA graph (capture, then replay with
  the live batch: ``init_forward_metadata_out_graph``); each step's backend
  runs ``forward_decode``, which returns ``(out, lse)`` under DCP;
- the **draft extend** (``DRAFT_EXTEND_V2``, EAGLE v2's
  ``prepare_for_draft_extend``): the verified tokens as queries, each reading
  the keys up to its own position, its own KV written by the pass; eager (the
  backend has no graph form of it).

The ranks' partials are merged by sglang's ``cp_lse_ag_out_rs_mla``, as the
model merges a DCP decode phase (the plugin's ``forward_mla`` hook counts the
draft extend it planned split as one), and each rank's heads compared with the
same pass on one rank, to 1e-5 (fp32). What one rank reads for the decode is
what sglang's eager draft decode plans: the request's committed prefix.

With the fix (``--fix plugin``: the plugin's flashinfer MLA and ``forward_mla``
hooks; or a tree with upstream-next 0017, ``--fix none``) every case must
match; stock sglang reads other rows in the draft decode graph and returns no
LSE from the draft extend. Controls that must be caught: ``draft-id-off-by-one``
(each id the draft hands the kernel one row on) and ``draft-bound-off-by-one``
(each query reads one position past its own).

What the draft decode costs a GPU (``--cost``, ``--cost-markdown``): rank 0
of dcp 8, its CUDA-graph form, against stock's target decode under DCP on the
same backend, counted while sglang's code runs (:mod:`emulation.mla.launches`):
one layer's launches and full passes, and a replay's metadata (launches, and
which plans it makes).

Usage: PYTHONPATH=build/trees/sglang-X .venv/bin/python tools/emulation/mla/nextn_dcp.py [--fix plugin|none]
       [--control none,draft-id-off-by-one,draft-bound-off-by-one] [--cases a,b] [--dcp 2,4,8]
       [--json | --markdown | --cost | --cost-markdown]
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import dataclass

from emulation.mla import verify_dcp as V
from emulation.passmap import harness

STEPS = 3  # --speculative-num-steps 3, topk 1: the chain the verify checks as draft tokens 4 (verify_dcp's EAGLE)
PASSES = ("draft-decode", "draft-extend")
MODES = {"draft-decode": ("eager", "graph"), "draft-extend": ("eager",)}
CONTROLS = ("draft-id-off-by-one", "draft-bound-off-by-one")


@dataclass(frozen=True)
class DraftShape(V.Shape):
    """One draft batch: a verify shape (prefixes, tokens, page) and the draft pass it runs. ``draft_tokens`` is the
    draft extend's queries per request (the verified tokens), and the decode's window."""

    pass_name: str = "draft-decode"

    @property
    def what(self) -> str:
        kind = ("NextN draft decode, 3 steps" if self.pass_name == "draft-decode"
                else f"NextN draft extend of {self.draft_tokens}")
        prefixes = ", ".join(f"{h:,}" for h in self.prefixes)
        return f"{kind}, prefixes {prefixes}, page {self.page_size}" + (", after a HiCache load-back" if self.hicache
                                                                        else "")


SHAPES = (
    # The decode's prefixes are at least N long: sglang's own DCP decode plan (the target's too) hands a rank that
    # holds no key of a request a row of length zero, which the oracle refuses (see verify_dcp's filler slots).
    DraftShape("nextn-decode-page1", "NEXTN", (37, 13, 130), STEPS + 1, 1, pass_name="draft-decode"),
    DraftShape("nextn-decode-page64", "NEXTN", (29, 130), STEPS + 1, 64, pass_name="draft-decode"),
    DraftShape("nextn-extend-page1", "NEXTN", (37, 5, 130), STEPS + 1, 1, pass_name="draft-extend"),
    DraftShape("nextn-extend-page64", "NEXTN", (29, 130), STEPS + 1, 64, pass_name="draft-extend"),
    # Shorter than N: at dcp 8 some ranks hold no key of a request's prefix, or of a token's window.
    DraftShape("nextn-extend-short", "NEXTN", (3, 1), STEPS + 1, 1, pass_name="draft-extend"),
    # At the page size the data path's host stack is built with (4): the prefix backed up, evicted, loaded back.
    DraftShape("nextn-decode-after-load-back", "NEXTN", (37, 70), STEPS + 1, 4, hicache=True, pass_name="draft-decode"),
    DraftShape("nextn-extend-after-load-back", "NEXTN", (37, 70), STEPS + 1, 4, hicache=True, pass_name="draft-extend"),
)
DCP_SIZES = V.DCP_SIZES
FMB = V.FMB


def _backend_module():
    import importlib

    fmb = importlib.import_module(FMB)
    harness.stub_flashinfer(fmb)
    fmb.BatchMLAPagedAttentionWrapper = V.oracle_wrapper_class()
    return fmb


def _runner(pool, layout: V.Layout):
    from types import SimpleNamespace

    translator = harness.translator_for(pool, layout.req_to_token, draft=True)
    runner = V.model_runner(pool, layout, translator)
    runner.server_args = SimpleNamespace(page_size=layout.shape.page_size)  # 0.5.18's multi-step backend reads it
    runner.is_draft_worker = True
    return runner


def draft_input(shape: DraftShape):
    import torch
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    bs = len(shape.prefixes)
    spec = EagleDraftInput(topk_p=torch.ones(bs, 1), topk_index=torch.zeros(bs, 1, dtype=torch.long),
                           hidden_states=torch.zeros(bs, 8))
    spec.num_tokens_per_req = shape.draft_tokens
    return spec


def decode_batch(shape: DraftShape, *, capture: bool = False, bound: int = 0):
    """``prepare_for_draft``'s draft decode batch: one query per request at its committed length; a capture's
    lengths are the runner's fill (1). ``bound`` widens every request's length (the bound control)."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    bs = len(shape.prefixes)
    lens = torch.tensor([1] * bs if capture else [h + bound for h in shape.prefixes], dtype=torch.int64)
    return harness.fb(forward_mode=ForwardMode.DECODE, batch_size=bs, req_pool_indices=torch.arange(bs),
                      seq_lens=lens, seq_lens_sum=int(lens.sum()), seq_lens_cpu=lens.clone(), positions=lens.clone(),
                      input_ids=torch.zeros(bs, dtype=torch.long), spec_info=draft_input(shape),
                      out_cache_loc=torch.zeros(bs * STEPS, dtype=torch.int64))


def extend_batch(shape: DraftShape, layout: V.Layout):
    """``prepare_for_draft_extend``'s batch: the verified tokens over the committed prefix, written by the pass;
    ``seq_lens`` the post-write lengths ("forward sees post-write length")."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    bs, n = len(shape.prefixes), shape.draft_tokens
    prefix = torch.tensor(shape.prefixes, dtype=torch.int64)
    lens = prefix + n
    b = harness.fb(forward_mode=ForwardMode.DRAFT_EXTEND_V2, batch_size=bs, req_pool_indices=torch.arange(bs),
                   seq_lens=lens, seq_lens_sum=int(lens.sum()), seq_lens_cpu=lens.clone(), spec_info=draft_input(shape),
                   extend_prefix_lens=prefix.int(), extend_prefix_lens_cpu=shape.prefixes,
                   extend_seq_lens=torch.full((bs,), n, dtype=torch.int32), extend_seq_lens_cpu=[n] * bs,
                   positions=torch.cat([torch.arange(h, h + n) for h in shape.prefixes]),
                   out_cache_loc=torch.cat([layout.locs(r, h, h + n) for r, h in enumerate(shape.prefixes)]))
    b.out_cache_loc_is_physical = True
    b.attn_attend_prefix_cache = None
    return b


def rank_partial(shape: DraftShape, layout: V.Layout, kv, q, mode: str, *, ops=None, bound: int = 0) -> list:
    """One rank's draft pass: its pool (the prefix written through the draft's MLA door, loaded back after a
    HiCache round trip where the shape says), its backend's metadata and forward. Returns, per step (the decode)
    or once (the extend), what the model unpacks: ``(out, lse)`` under DCP, the output alone on one rank."""
    import torch

    pool = V.pool_for(layout)
    V.write_prefix(pool, layout, kv)
    if shape.hicache:
        V.load_back(ops, pool, layout)
    fmb = _backend_module()
    runner = _runner(pool, layout)
    tr = runner.kv_index_translator
    bs = len(shape.prefixes)
    if shape.pass_name == "draft-extend":
        be = fmb.FlashInferMLAAttnBackend(runner, skip_prefill=False)
        live = extend_batch(shape, layout)
        harness.bind_own(live, tr)
        be.init_forward_metadata(live)
        n = shape.draft_tokens
        window_c = torch.cat([kv[r][0][h:h + n] for r, h in enumerate(shape.prefixes)])
        window_k = torch.cat([kv[r][1][h:h + n] for r, h in enumerate(shape.prefixes)])
        with _forward_context(be):
            out = be.forward(q[0].clone(), window_c[:, None, :], window_c[:, None, :], V.LAYER, live,
                             save_kv_cache=True, q_rope=q[1].clone(), k_rope=window_k[:, None, :])
            if layout.dcp > 1 and not merged_by_the_model(live, layout.dcp):
                raise ValueError("the model does not count this draft extend as a DCP decode phase: its q is not "
                                 "gathered and the ranks' partials are not merged")
        return [_unpacked(out, layout)]
    multi = fmb.FlashInferMLAMultiStepDraftBackend(runner, topk=1, speculative_num_steps=STEPS)
    live = decode_batch(shape, bound=bound)
    harness.bind_own(live, tr)
    if mode == "eager":
        multi.init_forward_metadata(live)
        wrappers = [b.forward_metadata.decode_wrapper for b in multi.attn_backends]
    else:
        multi.init_cuda_graph_state(bs, bs)
        cap = decode_batch(shape, capture=True)
        harness.bind_runner_slots(cap, tr)
        multi.init_forward_metadata_out_graph(cap, in_capture=True)
        multi.init_forward_metadata_out_graph(live, in_capture=False)
        wrappers = [b.decode_cuda_graph_metadata[bs] for b in multi.attn_backends]  # a replay runs the capture's
    results = []
    for be, wrapper in zip(multi.attn_backends, wrappers, strict=True):
        be.forward_metadata = fmb.DecodeMetadata(wrapper)
        with _forward_context(be):
            out = be.forward(q[0][:bs].clone(), None, None, V.LAYER, live, save_kv_cache=False,
                             q_rope=q[1][:bs].clone(), k_rope=None)
        results.append(_unpacked(out, layout))
    return results


def _unpacked(result, layout: V.Layout):
    if layout.dcp == 1:
        return result.view(-1, V.HEADS, V.KV_LORA_RANK), None
    if not isinstance(result, tuple):
        raise ValueError("under DCP the pass returned no LSE: the model has nothing to merge the ranks' partials by")
    return result


@contextlib.contextmanager
def _forward_context(backend):
    """The model reads its attention backend off the forward context (the plugin's ``forward_mla`` hook asks it
    whether the draft extend was planned split)."""
    from types import SimpleNamespace

    from sglang.srt.model_executor import forward_context

    prev = forward_context.set_forward_context(SimpleNamespace(attn_backend=backend))
    try:
        yield
    finally:
        forward_context.set_forward_context(prev)


@contextlib.contextmanager
def control(name: str | None):
    """``draft-id-off-by-one``: every id the draft pass hands the kernel is one row on (the decode's translated
    ids, the extend's built ids); ``draft-bound-off-by-one``: each query reads one position past its own (the
    decode's lengths one longer, the extend's window bound one token on, as verify_dcp's window control)."""
    import importlib

    if name is None or name == "draft-bound-off-by-one":
        with V.control("window-off-by-one" if name else None):
            yield
        return
    if name != "draft-id-off-by-one":
        raise ValueError(f"unknown control {name!r}; expected one of {', '.join(CONTROLS)}")
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator

    saved = []
    real_translate = KVIndexTranslator.translate_dcp_read_ids
    KVIndexTranslator.translate_dcp_read_ids = lambda self, ids: real_translate(self, ids) + 1
    saved.append((KVIndexTranslator, "translate_dcp_read_ids", real_translate))
    for module_name, attr in V.ID_BUILDERS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        real = getattr(module, attr, None)
        if real is None:
            continue

        def shifted(plan, source, req_pool_indices, prefix_out, window_out, meta, *args, _real=real, **kwargs):
            _real(plan, source, req_pool_indices, prefix_out, window_out, meta, *args, **kwargs)
            prefix_out[: int(plan.prefix_kv_indptr[-1])] += 1
            window_out[: int(plan.window_kv_indptr[-1])] += 1

        setattr(module, attr, shifted)
        saved.append((module, attr, real))
    try:
        yield
    finally:
        for owner, attr, real in reversed(saved):
            setattr(owner, attr, real)


def reference_for(shape: DraftShape) -> list:
    """The pass on one rank (no DCP): stock's own, which is right there."""
    kv, q = V.values(shape)
    with harness.on_rank(1, 0) as ops:
        return [out for out, _ in rank_partial(shape, V.Layout(shape, 1), kv, q, "eager", ops=ops)]


def run_case(shape: DraftShape, dcp: int, *, fix: str = "none", control_name: str | None = None,
             reference=None) -> dict:
    """Per mode: max |error| of the merged pass (every decode step) against one rank, over every rank's heads;
    or what raised."""
    import math

    kv, q = V.values(shape)
    reference = reference_for(shape) if reference is None else reference
    bound = 1 if control_name == "draft-bound-off-by-one" and shape.pass_name == "draft-decode" else 0
    results = {}
    for mode in MODES[shape.pass_name]:
        layout = V.Layout(shape, dcp)
        try:
            with V.fix_in_effect(fix), _phase_hook(fix), control(control_name):
                per_rank = []
                for rank in range(dcp):
                    with harness.on_rank(dcp, rank) as ops, V.attention_tp(dcp):
                        per_rank.append(rank_partial(shape, layout, kv, q, mode, ops=ops, bound=bound))
                merged = [V.merge([steps[i] for steps in per_rank]) for i in range(len(per_rank[0]))]
        except Exception as exc:  # a pass that raises is a finding
            first = str(exc).splitlines()[0][:200] if str(exc) else ""
            results[mode] = {"outcome": "raises", "detail": f"{type(exc).__name__}: {first}"}
            continue
        per = V.HEADS // dcp
        error = max(float((step[r].reshape(-1, per, V.KV_LORA_RANK) - ref[:, r * per:(r + 1) * per]).abs().max())
                    for step, ref in zip(merged, reference, strict=True) for r in range(dcp))
        ok = math.isfinite(error) and error <= V.TOLERANCE
        results[mode] = {"outcome": "matches" if ok else "differs", "error": error}
    return results


@contextlib.contextmanager
def _phase_hook(fix: str):
    """With the plugin, its ``forward_mla`` hook too, applied as the plugin applies it: the model asks it whether
    the draft extend is a DCP decode phase (:func:`merged_by_the_model`)."""
    if fix != "plugin":
        yield
        return
    from sglang_dcp_dspark.plugin import hooks
    from sglang_dcp_dspark.plugin.hooks import forward_mla

    with hooks.in_effect(forward_mla.MODULE):
        yield


def merged_by_the_model(forward_batch, dcp: int) -> bool:
    """Does the DeepSeek MLA layer (its ``is_dcp_mla_decode_phase``, as this tree or the plugin has it) gather q
    and merge the ranks' partials for this batch? Asked in the pass's forward context."""
    import importlib
    from types import SimpleNamespace

    mixin = importlib.import_module(
        "sglang.srt.models.deepseek_common.attention_forward_methods.forward_mla").DeepseekMLAForwardMixin
    return bool(mixin.is_dcp_mla_decode_phase(SimpleNamespace(dcp_size=dcp, use_dsa=False), forward_batch))


def measure(*, fix: str, control_name: str | None = None, names: list[str] | None = None,
            dcp_sizes=DCP_SIZES) -> list[dict]:
    out = []
    for shape in SHAPES:
        if names and shape.name not in names:
            continue
        reference = reference_for(shape)
        for dcp in dcp_sizes:
            results = run_case(shape, dcp, fix=fix, control_name=control_name, reference=reference)
            out.extend({"case": shape.name, "pass": shape.pass_name, "dcp": dcp, "mode": mode, **results[mode]}
                       for mode in results)
    return out


def markdown(rows: list[dict]) -> str:
    """One row per case: its worst error at each N (eager, graph where the pass has a graph form), or what raised."""
    shapes = {shape.name: shape for shape in SHAPES}
    by_case: dict = {}
    for row in rows:
        by_case.setdefault(row["case"], {}).setdefault(row["dcp"], []).append(row)
    sizes = sorted({row["dcp"] for row in rows})
    out = [f"| case | what it runs | modes | max error, N = {' / '.join(str(n) for n in sizes)} |", "|---|---|---|---|"]
    for case, at in by_case.items():
        errors = []
        for n in sizes:
            group = at.get(n, [])
            bad = next((r for r in group if r["outcome"] != "matches"), None)
            errors.append(bad["outcome"] if bad else f"{max(r['error'] for r in group):.1e}")
        modes = ", ".join(MODES[shapes[case].pass_name])
        out.append(f"| {case} | {shapes[case].what} | {modes} | {' / '.join(errors)} |")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- what the draft decode costs a GPU


def _decode_batch_plain(shape: DraftShape, *, capture: bool = False):
    """The target's own decode batch at the same lengths: no draft input (stock's DCP decode)."""
    b = decode_batch(shape, capture=capture)
    b.spec_info = None
    return b


def decode_cost(fix: str, dcp: int = 8, name: str = "nextn-decode-page64") -> list[dict]:
    """Rank 0 of ``dcp``, CUDA-graph form, counted while sglang's own code runs (:mod:`emulation.mla.launches`):
    stock's target decode under DCP (one backend, no draft input) and the NextN draft decode (every per-step
    backend of the multi-step draft backend). Per design: ``layer_launches`` and ``layer_full_passes``, one layer's
    forward on one step's backend; ``replay_launches`` and ``replay_plans``, the replay's metadata of a step
    (every per-step backend for the draft, and the draft kernel's id build); ``host_lengths``, the host lengths
    that metadata plans with, per backend."""
    import importlib

    from emulation.mla import launches

    shape = {s.name: s for s in SHAPES}[name]
    kv, q = V.values(shape)
    bs = len(shape.prefixes)
    rows = []
    with V.fix_in_effect(fix), _phase_hook(fix), harness.on_rank(dcp, 0), V.attention_tp(dcp):
        layout = V.Layout(shape, dcp)
        for design in ("target decode", "draft decode"):
            pool = V.pool_for(layout)
            V.write_prefix(pool, layout, kv)
            fmb = _backend_module()
            runner = _runner(pool, layout)
            tr = runner.kv_index_translator
            wrapper = importlib.import_module(FMB).BatchMLAPagedAttentionWrapper

            def count(pool=pool, wrapper=wrapper):
                return launches.counting(full_numel=bs * V.HEADS * V.KV_LORA_RANK,
                                         pools=[pool.get_key_buffer(V.LAYER.layer_id)], wrapper_classes=[wrapper])

            # The target's decode graph is one backend's; the draft's, the multi-step backend's over its steps.
            if design == "target decode":
                graph, batch = fmb.FlashInferMLAAttnBackend(runner, skip_prefill=True), _decode_batch_plain
            else:
                graph = fmb.FlashInferMLAMultiStepDraftBackend(runner, topk=1, speculative_num_steps=STEPS)
                batch = decode_batch
            graph.init_cuda_graph_state(bs, bs)
            cap, live = batch(shape, capture=True), batch(shape)
            harness.bind_runner_slots(cap, tr)
            harness.bind_own(live, tr)
            graph.init_forward_metadata_out_graph(cap, in_capture=True)
            with count() as replay:
                graph.init_forward_metadata_out_graph(live, in_capture=False)
            backends = getattr(graph, "attn_backends", [graph])
            be = backends[0]
            be.forward_metadata = fmb.DecodeMetadata(be.decode_cuda_graph_metadata[bs])
            with _forward_context(be), count() as layer:
                be.forward(q[0][:bs].clone(), None, None, V.LAYER, live, save_kv_cache=False,
                           q_rope=q[1][:bs].clone(), k_rope=None)
            rows.append({"design": design, "dcp": dcp, "case": name, "bs": bs, "backends": len(backends),
                         "layer_launches": layer.n_launches, "layer_full_passes": layer.full_passes,
                         "layer_kernels": layer.names(), "replay_launches": replay.n_launches,
                         "replay_kernels": replay.names(), "replay_plans": list(replay.plans)})
    return rows


def cost_markdown(rows: list[dict]) -> str:
    out = ["| design | per layer: launches, full passes | a step's graph replay: backends, launches, plans |",
           "|---|---|---|"]
    for r in rows:
        plans = ", ".join(r["replay_plans"]) or "-"
        out.append(f"| {r['design']}, dcp {r['dcp']}, rank 0 | {r['layer_launches']}, {r['layer_full_passes']} | "
                   f"{r['backends']}, {r['replay_launches']}, {plans} |")
    return "\n".join(out) + "\n"


def series() -> str:
    """" + upstream-next (0017)" on a tree whose backend carries the NextN draft's fix, else ""."""
    import importlib

    fmb = importlib.import_module(FMB)
    return " + upstream-next (0017)" if hasattr(fmb.FlashInferMLAAttnBackend, "dcp_draft_extend_planned") else ""


def main(argv: list[str]) -> int:
    os.environ["TRITON_INTERPRET"] = "1"  # before sglang (and Triton) import: sglang's kernels in the interpreter
    harness.prepare()

    def option(name: str, default=None):
        return argv[argv.index(name) + 1] if name in argv else default

    fix = option("--fix", "none")
    names = option("--cases").split(",") if "--cases" in argv else None
    dcp_sizes = tuple(int(x) for x in option("--dcp").split(",")) if "--dcp" in argv else DCP_SIZES
    controls = [None if c == "none" else c for c in option("--control").split(",")] if "--control" in argv else [None]
    if "--cost" in argv or "--cost-markdown" in argv:
        rows = decode_cost(fix)
        print(json.dumps({"release": V.release(), "fix": fix, "rows": rows}) if "--cost" in argv
              else cost_markdown(rows), end="" if "--cost-markdown" in argv else "\n")
        return 0
    runs = {name: measure(fix=fix, control_name=name, names=names, dcp_sizes=dcp_sizes) for name in controls}
    if "--json" in argv:
        print(json.dumps({"release": V.release(), "fix": fix, "runs": {str(k): v for k, v in runs.items()}}))
        return 0
    for name, rows in runs.items():
        if "--markdown" in argv:
            print(f"sglang {V.release()}{series()}, {'the plugin' if fix == 'plugin' else 'the tree as it is'}"
                  + (f", control {name}" if name else "") + ":\n")
            print(markdown(rows))
            continue
        if name is not None:
            print(f"control {name}:")
        for row in rows:
            shown = f"{row['error']:.2e}" if "error" in row else row.get("detail", "")
            print(f"{row['case']:30} dcp {row['dcp']} {row['mode']:5} {row['outcome']:8} {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
