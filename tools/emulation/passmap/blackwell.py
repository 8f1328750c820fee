"""The pass map's rows for Blackwell's MLA backends under DCP, cutedsl_mla and trtllm_mla: judged by their reads
and by numbers.

Both hand their DCP reads to one flashinfer kernel, ``trtllm_batch_decode_with_kv_cache_mla``, which needs a GPU.
So these rows run on the numerics harness (``emulation.mla.decode_dcp``): the release's own backend, metadata and
forward on each rank, the kernel replaced by the oracle of its documented contract
(``emulation.mla.decode_oracle``), which records the cache rows each query attends. A pass is judged twice:

- **by its reads**: every row a query of request ``r`` reads on rank ``k`` of ``N`` must hold, in key order, the
  tokens of ``r`` it attends to that rank ``k`` holds (global positions ``p <= its own``, ``p % N == k``). What a
  row holds is read back from the rank's pool: each token's latent vector is distinct, so a row names its token.
- **by numbers**: the ranks' ``(out, lse)`` merged by sglang's ``cp_lse_ag_out_rs_mla`` (with the LSE base the
  release's model picks for the backend) against the same batch on one rank, within ``decode_dcp.TOLERANCE``.

The passes:

- DECODE_EAGER / DECODE_GRAPH (plain DCP) on both backends: ``init_forward_metadata``, or a CUDA-graph capture then
  replay, then ``forward``;
- TARGET_VERIFY_EAGER / _GRAPH for DSPARK (a block of 7) and EAGLE3 (a chain of 4): cutedsl_mla's verify through
  ``_run_decode_kernel``; trtllm_mla's raises under DCP by design (and its factory refuses speculative decoding
  under DCP on the releases that say so at startup: the map's probes);
- EXTEND: under DCP the prefill reads the pool only through the model's prefix gather
  (``prepare_decode_context_parallel_metadata`` with the backend in the forward context, its
  ``dcp_local_prefix_kv_indices`` read by ``all_gather_kv_cache_for_mha_extend``); the MHA prefill kernel reads
  the gathered buffer, not the pool. Its rows are judged by what they hold, and the backend's own prefill
  metadata (``init_forward_metadata`` on the extend batch) must build.

The speculative cases take the draft's passes from the flashinfer_mla case of the same algorithm and flag: the
draft runs its own backend (the release resolves DSPARK's and EAGLE3's to flashinfer for either target), which
the target's backend does not change. With HiCache, each target pass is read again on a batch whose prefix was
backed up, evicted and loaded back (``decode_dcp``'s after-load-back shapes); on a release without the load-back
API the harness drives, that reading is "not-run" and says why.
"""

from __future__ import annotations

import contextlib
import functools
import math
from types import SimpleNamespace

from emulation.mla import decode_dcp as D
from emulation.mla import verify_dcp as V
from emulation.mla.decode_oracle import DecodeContractError
from emulation.passmap import harness

BACKENDS = D.BACKENDS
SPEC_ALGORITHMS = ("DSPARK", "EAGLE3")
# The batch each pass runs on, and the one read after a HiCache round trip (its prefix loaded back elsewhere).
SHAPE = {"DECODE": D.SHAPES[0], "DSPARK": D.SHAPES[0], "EAGLE3": D.SHAPES[1]}
AFTER = {"DSPARK": D.SHAPES[4],
         "EAGLE3": V.Shape("eagle-after-load-back", "EAGLE", (29, 40), 4, 32, hicache=True)}
MODES = {"EAGER": "eager", "GRAPH": "graph"}
EXTEND_PAGE = 64


def extend_shape(dcp: int, *, hicache: bool = False):
    """An EXTEND's batch: sglang matches a cached prefix by whole logical pages (page_size x dcp slots: the planner
    slices the concatenated prefix ids rank by rank on that promise), so each prefix is one or two of them."""
    page = EXTEND_PAGE * dcp
    return V.Shape(f"extend-{'after-load-back' if hicache else 'page-aligned'}", "DSPARK", (page, 2 * page), 7,
                   EXTEND_PAGE, hicache=hicache)
WRONG_OUTPUT = "wrong-output"
CTX = f"{D.CUTEDSL}.CuteDslMLABackend"
TTX = f"{D.TRTLLM}.TRTLLMMLABackend"
KERNEL = "flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla (emulation.mla.decode_oracle)"
WHERE = {
    ("cutedsl_mla", "DECODE_EAGER"): f"{CTX}.init_forward_metadata (DECODE) -> forward -> forward_decode -> "
                                     f"_run_decode_kernel (cute-dsl, enable_dcp) -> {KERNEL}",
    ("cutedsl_mla", "DECODE_GRAPH"): f"{CTX}.init_cuda_graph_state -> init_forward_metadata_out_graph (capture, "
                                     f"replay) -> forward -> forward_decode -> _run_decode_kernel -> {KERNEL}",
    ("cutedsl_mla", "TARGET_VERIFY_EAGER"): f"{CTX}.init_forward_metadata (TARGET_VERIFY) -> forward -> "
                                            f"_run_decode_kernel (cute-dsl, enable_dcp) -> {KERNEL}",
    ("cutedsl_mla", "TARGET_VERIFY_GRAPH"): f"{CTX}.init_cuda_graph_state -> init_forward_metadata_out_graph "
                                            f"(capture, replay) -> forward -> _run_decode_kernel -> {KERNEL}",
    ("trtllm_mla", "DECODE_EAGER"): f"{TTX}.init_forward_metadata (DECODE) -> forward -> forward_decode -> "
                                    f"_forward_decode_dcp (trtllm-gen) -> {KERNEL}",
    ("trtllm_mla", "DECODE_GRAPH"): f"{TTX}.init_cuda_graph_state -> init_forward_metadata_out_graph (capture, "
                                    f"replay) -> forward -> forward_decode -> _forward_decode_dcp -> {KERNEL}",
    ("trtllm_mla", "TARGET_VERIFY_EAGER"): f"{TTX}.init_forward_metadata (TARGET_VERIFY) -> forward -> "
                                           "forward_extend",
    ("trtllm_mla", "TARGET_VERIFY_GRAPH"): f"{TTX}.init_cuda_graph_state -> init_forward_metadata_out_graph "
                                           "(capture, replay) -> forward -> forward_extend",
}
EXTEND_WHERE = ("sglang.srt.layers.dcp.planner.prepare_decode_context_parallel_metadata (the backend in the forward "
                "context: dcp_local_prefix_kv_indices, which all_gather_kv_cache_for_mha_extend reads) -> "
                "{cls}.init_forward_metadata (EXTEND)")


# ---------------------------------------------------------------- what a row holds


def holders(pool, kv) -> dict:
    """Each pool row's token ``(request, position)`` by its latent vector; rows holding none are absent."""
    names = {tuple(c[p, :4].tolist()): (r, p) for r, (c, _) in enumerate(kv) for p in range(c.shape[0])}
    buf = pool.get_key_buffer(V.LAYER.layer_id)
    return {row: names[key] for row in range(buf.shape[0])
            if (key := tuple(buf[row].reshape(-1)[:4].tolist())) in names}


def held(rows, by_row: dict) -> list:
    return [by_row.get(int(x)) for x in rows]


def wanted(r: int, last: int, dcp: int, rank: int) -> list:
    """The tokens of request ``r`` up to global position ``last`` that ``rank`` of ``dcp`` holds, in order."""
    return [(r, p) for p in range(last + 1) if p % dcp == rank]


def first_wrong(seen: list, want: list, rows) -> str:
    """One line on the first difference between the tokens read and those wanted."""
    def name(t):
        return "nothing" if t is None else f"request {t[0]} position {t[1]}"
    for i in range(max(len(seen), len(want))):
        got = seen[i] if i < len(seen) else "no row"
        should = want[i] if i < len(want) else "no row"
        if got != should:
            row = int(rows[i]) if i < len(rows) else None
            got_s = got if isinstance(got, str) else name(got)
            should_s = should if isinstance(should, str) else name(should)
            return f"key {i} reads row {row} holding {got_s}, not {should_s}"
    return ""


def judge_kernel_reads(pass_name: str, shape, dcp: int, rank: int, pool, kv, reads: list) -> str:
    """"" where every query's rows hold what it attends to on this rank, else the first difference."""
    if not reads:
        return "the backend did not call the decode kernel"
    by_row = holders(pool, kv)
    n = D.new_tokens(pass_name, shape)
    for call in reads:
        for r, (queries, h) in enumerate(zip(call, shape.prefixes, strict=True)):
            for j, rows in enumerate(queries):
                last = h + (j if pass_name == "TARGET_VERIFY" else 0)
                seen, want = held(rows, by_row), wanted(r, last, dcp, rank)
                if seen != want:
                    return f"request {r} query {j} of {n}: {first_wrong(seen, want, rows)}"
    return ""


# ---------------------------------------------------------------- a pass on every rank, judged per rank


def _failure(exc: BaseException) -> dict:
    if isinstance(exc, DecodeContractError) and "outside a cache" in str(exc):
        return {"verdict": "wrong-rows", "detail": f"the kernel is handed a page past the rank's cache: {exc} (on a "
                "GPU, another request's rows or an illegal access)"}
    if isinstance(exc, DecodeContractError):
        return {"verdict": "raises", "detail": f"the kernel's documented contract refuses the call: {exc}"}
    return harness.raised(exc)


@functools.cache
def reference(backend: str, pass_name: str, shape):
    """The batch on one rank (no DCP), eager: what the merged ranks must give."""
    kv, q = V.values(shape)
    return D.run_ranks(backend, pass_name, shape, 1, "eager", kv, q)[0][0]


def _missing(shape) -> str:
    """Why a HiCache reading cannot run on this release, or ""."""
    if not shape.hicache:
        return ""
    gone = D.hicache_missing()
    return f"the HiCache load-back needs {gone}, which this release lacks" if gone else load_back_gap()


@functools.cache
def load_back_gap() -> str:
    """"" where the numerics harness's load-back (``verify_dcp.load_back``, written to the controller API of 0.5.21 on)
    drives this release's HiCache; else why not. A gap of the harness is no finding of the release."""
    shape = AFTER["DSPARK"]
    layout = V.Layout(shape, 2)
    try:
        with harness.on_rank(2, 0) as ops, V.attention_tp(2):
            V.load_back(ops, V.pool_for(layout), layout)
    except Exception as exc:
        return (f"the harness's HiCache load-back (written to the controller API of 0.5.21 on) does not drive this release's: "
                f"{harness.raised(exc)['detail']}")
    return ""


@functools.cache
def ranks_run(backend: str, pass_name: str, shape, dcp: int, mode: str, control: str | None = None) -> dict:
    """{rank: verdict} for one pass on every rank of ``dcp``, eager or as a CUDA graph."""
    missing = _missing(shape)
    if missing:
        return dict.fromkeys(range(dcp), {"verdict": "not-run", "detail": missing})
    kv, q = V.values(shape)
    bad_reads: dict[int, str] = {}
    counts: dict[int, int] = {}

    def observe(rank, pool, reads):
        counts[rank] = sum(len(rows) for call in reads[:1] for queries in call for rows in queries[-1:])
        found = judge_kernel_reads(pass_name, shape, dcp, rank, pool, kv, reads)
        if found:
            bad_reads[rank] = found

    D.CURRENT.clear()
    try:
        if dcp == 1:  # no merge: the one rank against the pass written out as softmax attention
            ref = D.dense(pass_name, shape, kv, q)
            D.CURRENT["control"] = control
            merged = [D.run_ranks(backend, pass_name, shape, 1, mode, kv, q, observe=observe)[0][0].double()]
        else:
            ref = reference(backend, pass_name, shape)
            D.CURRENT["control"] = control
            partials = D.run_ranks(backend, pass_name, shape, dcp, mode, kv, q, observe=observe)
            merged = D.merge(partials, D.lse_base_on_e(backend))
    except Exception as exc:  # a pass that raises on a rank is that pass's finding on every rank
        out = _failure(exc)
        return dict.fromkeys(range(dcp), dict(out, detail=f"on a rank of {dcp}: {out['detail']}"))
    finally:
        D.CURRENT.clear()
    per = V.HEADS // dcp
    error = max(float((merged[k].reshape(-1, per, V.KV_LORA_RANK) - ref[:, k * per:(k + 1) * per]).abs().max())
                for k in range(dcp))
    numbers_ok = math.isfinite(error) and error <= D.TOLERANCE
    if dcp == 1:
        merged_words = (f"within {D.TOLERANCE:.0e} of the pass written out as softmax attention" if numbers_ok else
                        f"{_magnitude(error)} off the pass written out as softmax attention")
    else:
        merged_words = (f"merged over {dcp} ranks by cp_lse_ag_out_rs_mla, within {D.TOLERANCE:.0e} of one rank"
                        if numbers_ok else
                        f"merged over {dcp} ranks by cp_lse_ag_out_rs_mla it is {_magnitude(error)} off one rank")
    out = {}
    for rank in range(dcp):
        if rank in bad_reads:
            out[rank] = {"verdict": "wrong-rows", "detail": f"{bad_reads[rank]}; {merged_words}"}
        elif not numbers_ok:
            out[rank] = {"verdict": WRONG_OUTPUT, "detail": f"each query reads the rows it attends to, yet "
                         f"{merged_words}"}
        else:
            out[rank] = {"verdict": "consistent", "detail": f"reads {counts.get(rank, 0)} rows for its last query, "
                         f"each holding a token it attends to on this rank; {merged_words}"}
    return out


def _magnitude(error: float) -> str:
    if not math.isfinite(error):
        return "not finite (NaN or inf)"
    return f"about 1e{math.floor(math.log10(error)):+d}" if error > 0 else "0"


def kernel_pass(backend: str, pass_name: str, shape, dcp: int, rank: int, mode: str, control: str | None = None):
    return dict(ranks_run(backend, pass_name, shape, dcp, mode, control)[rank],
                where=WHERE[(backend, f"{pass_name}_{mode.upper()}")])


# ---------------------------------------------------------------- EXTEND: the prefix gather


@contextlib.contextmanager
def _forward_context(be):
    from sglang.srt.model_executor import forward_context

    prev = forward_context.set_forward_context(SimpleNamespace(attn_backend=be))
    try:
        yield
    finally:
        forward_context.set_forward_context(prev)


def extend_pass(backend: str, shape, dcp: int, rank: int, control: str | None = None) -> dict:
    """One rank's EXTEND over the cached prefixes: the prefix gather's rows, then the backend's prefill metadata."""
    import torch
    from sglang.srt.layers.dcp import planner
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.runner.eager_runner import create_chunked_prefix_cache_kv_indices

    cls = CTX if backend == "cutedsl_mla" else TTX
    where = EXTEND_WHERE.format(cls=cls)
    missing = _missing(shape)
    if missing:
        return {"verdict": "not-run", "detail": missing, "where": where}
    if dcp == 1:
        return {"verdict": "not-run", "detail": "without DCP the prefill gathers no prefix; the map judges the "
                "gather under DCP", "where": where}
    kv, _ = V.values(shape)
    layout = V.Layout(shape, dcp)
    n, prefixes = shape.draft_tokens, list(shape.prefixes)
    D.CURRENT.clear()
    try:
        with harness.on_rank(dcp, rank) as ops, D.spec_settings(shape), V.attention_tp(dcp), D.gpu_pieces(backend):
            pool = V.pool_for(layout)
            V.write_prefix(pool, layout, kv, 1 if control == "shift-write" else 0)
            if shape.hicache:
                V.load_back(ops, pool, layout)
            be = D.backend_for(backend, pool, layout, shape)
            lens = torch.tensor([h + n for h in prefixes], dtype=torch.int32)
            pre = torch.tensor(prefixes, dtype=torch.int32)
            ext = torch.full((len(prefixes),), n, dtype=torch.int32)
            with _forward_context(be):
                md = planner.prepare_decode_context_parallel_metadata(
                    seq_lens=lens, extend_prefix_lens=pre, extend_prefix_lens_cpu=prefixes, extend_seq_lens=ext,
                    req_pool_indices=torch.arange(len(prefixes)), req_to_token=layout.req_to_token,
                    seq_lens_sum=int(lens.sum()),
                    kv_buffer_shape=pool.get_kv_buffer_shape()[0] if hasattr(pool, "get_kv_buffer_shape")
                    else pool.kv_buffer[0].shape, kv_cache_dtype=torch.float32, kv_cache_device="cpu",
                    create_chunked_prefix_cache_kv_indices_fn=create_chunked_prefix_cache_kv_indices)
            rows = [int(x) for x in md.dcp_local_prefix_kv_indices.tolist()]
            window = torch.cat([layout.locs(r, h, h + n) for r, h in enumerate(prefixes)])
            b = harness.fb(forward_mode=ForwardMode.EXTEND, batch_size=len(prefixes),
                           req_pool_indices=torch.arange(len(prefixes)), seq_lens=lens.long(),
                           seq_lens_sum=int(lens.sum()), seq_lens_cpu=lens.long(), extend_prefix_lens=pre,
                           extend_prefix_lens_cpu=prefixes, extend_seq_lens=ext, extend_seq_lens_cpu=[n] * len(prefixes),
                           attn_dcp_metadata=md, out_cache_loc=window, positions=None)
            harness.bind_own(b, getattr(be, "kv_index_translator", None))
            be.init_forward_metadata(b)
            by_row = holders(pool, kv)
    except Exception as exc:  # a gather or a metadata build that raises is the pass's finding
        return dict(harness.raised(exc), where=where)
    seen = held(rows, by_row)
    want = [t for r, h in enumerate(prefixes) for t in wanted(r, h - 1, dcp, rank)]
    if seen != want:
        return {"verdict": "wrong-rows", "detail": f"the prefix gather: {first_wrong(seen, want, rows)}",
                "where": where}
    return {"verdict": "consistent", "detail": f"the prefix gather reads {len(rows)} rows, each holding a prefix "
            "token this rank holds, in position order; the prefill kernel reads the gathered buffer", "where": where}


# ---------------------------------------------------------------- the records


def plain_passes(backend: str, dcp: int, rank: int, control: str | None = None) -> dict:
    shape = SHAPE["DECODE"]
    return {"EXTEND": extend_pass(backend, extend_shape(dcp), dcp, rank, control),
            "DECODE_EAGER": kernel_pass(backend, "DECODE", shape, dcp, rank, "eager", control),
            "DECODE_GRAPH": kernel_pass(backend, "DECODE", shape, dcp, rank, "graph", control)}


def spec_passes(backend: str, algorithm: str, dcp: int, rank: int, control: str | None = None) -> dict:
    """The target's passes of one speculative case, each with its reading after a HiCache round trip."""
    out = {}
    for shape, after in ((SHAPE[algorithm], False), (AFTER[algorithm], True)):
        got = {"EXTEND": extend_pass(backend, extend_shape(dcp, hicache=after), dcp, rank, control)}
        for mode in MODES:
            got[f"TARGET_VERIFY_{mode}"] = kernel_pass(backend, "TARGET_VERIFY", shape, dcp, rank, MODES[mode], control)
        for name, reading in got.items():
            if after:
                out[name]["after_hicache"] = {k: reading[k] for k in ("verdict", "detail")}
            else:
                out[name] = reading
    return out


def spec_records(flashinfer_records: list[dict], control: str | None = None) -> list[dict]:
    """A case per Blackwell backend beside each flashinfer_mla DSPARK (flag unset) and EAGLE3 case: the target's
    passes run here, the draft's taken from that case."""
    out = []
    for rec in flashinfer_records:
        if (rec["target_backend"] != "flashinfer_mla" or rec["algorithm"] not in SPEC_ALGORITHMS
                or rec["draft_backend_flag"] is not None or rec["dcp"] < 2):
            continue
        for backend in BACKENDS:
            target = spec_passes(backend, rec["algorithm"], rec["dcp"], rec["rank"], control)
            passes = {}
            for name in harness.PASSES:
                if name in target:
                    passes[name] = target[name]
                else:
                    draft = dict(rec["passes"][name])
                    draft["where"] = f"{draft['where']} (the draft's pass, as in the flashinfer_mla case: the draft " \
                                     "runs its own backend)"
                    passes[name] = draft
            out.append(dict(rec, target_backend=backend, passes=passes))
    return out


def plain_record(backend: str, dcp: int, rank: int) -> dict:
    return {"release": harness.release(), "algorithm": None, "target_backend": backend, "target_kind": "mla",
            "dcp": dcp, "rank": rank, "passes": plain_passes(backend, dcp, rank)}


CONTROLS = D.CONTROLS


def control_run(control: str | None, dcp: int = 2) -> dict:
    """Every Blackwell pass at ``dcp`` on rank 0, with one of ``decode_dcp``'s controls in effect (None: none):
    ``{backend: {pass: verdict}}``, the speculative passes of DSPARK under ``DSPARK:``."""
    out = {}
    for backend in BACKENDS:
        got = {name: p["verdict"] for name, p in plain_passes(backend, dcp, 0, control).items()}
        got |= {f"DSPARK:{name}": p["verdict"] for name, p in spec_passes(backend, "DSPARK", dcp, 0, control).items()}
        out[backend] = got
    return out


def main(argv: list[str]) -> int:
    """``python -m emulation.passmap.blackwell [--dcp N] [--control none,NAME,...]``: the verdicts as one JSON line,
    per control (the pass map's own run is ``python -m emulation.passmap``)."""
    import argparse
    import json

    harness.prepare()
    p = argparse.ArgumentParser(prog="python -m emulation.passmap.blackwell", description=main.__doc__.splitlines()[0])
    p.add_argument("--dcp", type=int, default=2)
    p.add_argument("--control", default="none")
    a = p.parse_args(argv)
    names = a.control.split(",")
    unknown = sorted(set(names) - {"none", *CONTROLS})
    if unknown:
        p.error(f"unknown control {', '.join(unknown)}; expected none or one of {', '.join(CONTROLS)}")
    print(json.dumps({"release": harness.release(),
                      "runs": {n: control_run(None if n == "none" else n, a.dcp) for n in names}}))
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
