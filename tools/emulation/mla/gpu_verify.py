"""`make gpu-check-verify`: the verify under DCP on flashinfer's own MLA kernel, on one CUDA GPU (never in CI).

docs/verify-under-dcp.md proves the split verify on CPU, against a reference of
flashinfer's wrapper (``oracle.py``). This script runs the plugin's plan on the
real wrapper (flashinfer 0.7.2, the one sglang 0.5.23 pins) at DeepSeek-V3's
attention shape (128 heads after the all-gather, latent 512 + rope 64, bf16),
in four parts, each under its own time limit (``LIMITS``: the whole run stays
under 8 minutes on one H100 or H200):

1. ``kernel``: the plugin's kernel check (``plugin/kernel_check.py``) on
   flashinfer's wrapper; then rows of 4K and 16K keys, long enough that
   flashinfer splits a row's keys across CTAs, against attention written out
   in fp32 (one query and 7 queries per row, and a causal row);
2. ``split``: one verify batch (8 requests, a DSpark block of 7, prefixes
   about 16K) at dcp 8 simulated on the one GPU: every rank's plan runs one
   after another, each rank's pool cut from one latent cache by the owner rule
   (position p on rank p % 8). The plugin's ``plan_split``, ``build_ids``
   (sglang's DCP index builder) and ``merge`` on flashinfer's wrappers, eager
   and captured in a CUDA graph (prefix run + window run + merge), then planned
   again with new lengths the way the hook's replay plans (flashinfer's native
   scheduler into the capture's buffers) and replayed. The ranks are merged by
   their LSE in torch and compared with one rank's attention over all keys.
   Two negative controls replay at other lengths, one with nothing refreshed
   (stale buffers), one with the ids and lengths refreshed but not re-planned
   (a stale schedule): each must differ;
3. ``timing``: one layer of rank 0's split verify (two runs + merge) against
   one flashinfer run over the same rank's keys (stock's single causal run, as
   at dcp 1), 61 layers in a row, each layer its own KV pool, timed with CUDA
   events, eager and as one CUDA graph: the median of several repeats;
4. ``profile``: the kernels ``torch.profiler`` sees in one layer of each, and
   in one step's re-plan of the split (what each replay adds per rank).

The report is at most 100 columns wide; its JSON goes to ``--json`` (default
``$OUT/gpu_verify.json`` when OUT is set, else build/gpu/logs/gpu_verify.json),
rewritten after each part. Exit status: 0 when every part passes, 1 when one
fails or runs out of time, 2 when there is no GPU, flashinfer or sglang's index
builder. ``tools/emulation/mla/gpu_verify_run.sh`` runs it on a bare GPU machine
from ``make gpu-bundle-verify``'s build/gpu-verify.

``--rehearse`` runs the same parts on CPU, with the oracle in flashinfer's
place, at small shapes, Triton in its interpreter: the script's own logic, not
the kernel (``test/numerics/test_gpu_verify.py``). CUDA graphs are then calls
replayed as they are, and the oracle, which plans from its bound buffers at
each run, has no schedule to leave stale: the no-replan control is reported,
not required.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PARTS = ("kernel", "split", "timing", "profile")
# Seconds per part, 425 in all. The kernel part includes flashinfer's first build of its MLA kernel (nvcc, three
# files); the build is cached on disk, so a second run on the same machine starts from it.
LIMITS = {"kernel": 240, "split": 80, "timing": 70, "profile": 35}
WIDTH = 100
FLASHINFER = "0.7.2"  # sglang 0.5.23's pin
BUILDER = "sglang.kernels.ops.attention.dcp_kernels"
# Per dtype: a result's max |error| over the reference's max |value|, and the LSE's max |error| (base 2). bf16 as
# the kernel check allows it (plugin/kernel_check.py); every control breaks it by far more.
TOLERANCE = {"bfloat16": (2e-2, 5e-2), "float32": (1e-4, 1e-4)}
# Scores of standard deviation 2.5: a 16K-key row's softmax weighs a few dozen keys, so a key missed or added
# moves the result well past the tolerance, and the result is not an average that hides it.
SCORE_STD = 2.5
# DeepSeek-V3's softmax scale: qk head dim 192 (128 nope + 64 rope), times YaRN's mscale squared (factor 40).
DSV3_SM_SCALE = 192 ** -0.5 * (0.1 * math.log(40.0) + 1.0) ** 2


@dataclass
class Shape:
    heads: int = 128
    ckv: int = 512
    kpe: int = 64
    bs: int = 8
    draft: int = 7
    prefix: int = 16384
    dcp: int = 8
    layers: int = 61
    repeats: int = 5
    long_rows: tuple = (4096, 16384)
    sm_scale: float = DSV3_SM_SCALE
    seed: int = 20261207


REHEARSAL = dict(heads=4, ckv=16, kpe=8, bs=2, draft=3, prefix=40, dcp=4, layers=2, repeats=1, long_rows=(64, 256))


class PartTimeout(BaseException):
    """A part past its limit: a BaseException, so that no ``except Exception`` inside the part swallows it."""


class Skip(Exception):
    """A part that cannot run here: its line says why."""


# ----------------------------------------------------------------------------------------------- pure helpers


def owner_layout(torch, lengths, dcp: int, *, page_size: int = 1, generator=None):
    """Where each request's positions sit: ``req_to_token`` ([bs, max_len] int32 locs) and the loc count. Locs
    come in logical pages of ``page_size * dcp`` slots handed out shuffled, so position ``p`` sits at a loc
    ``L`` with ``L % dcp == p % dcp`` (the owner rule: rank ``L % dcp``, row ``L // dcp``). Page 0 is never
    handed out, as sglang keeps loc 0 for padding: a filler slot's row 0 holds no request's key."""
    slots = page_size * dcp
    pages = [-(-int(n) // slots) for n in lengths]
    order = (torch.randperm(sum(pages), generator=generator) + 1).tolist()
    table = torch.zeros(len(pages), max(pages) * slots, dtype=torch.int64)
    at = 0
    for r, n in enumerate(pages):
        mine = torch.tensor(order[at: at + n], dtype=torch.int64)
        at += n
        table[r, : n * slots] = (mine[:, None] * slots + torch.arange(slots)[None, :]).reshape(-1)
    return table.to(torch.int32), (sum(pages) + 1) * slots


def rank_pool(cache_by_loc, dcp: int, rank: int):
    """Rank ``rank``'s pool cut from a cache indexed by loc: its row ``i`` is loc ``i * dcp + rank``."""
    return cache_by_loc[rank::dcp].contiguous()


def rank_rows(req_to_token, lengths, dcp: int, rank: int):
    """Per request, the pool rows of the positions ``rank`` holds among ``0 .. length - 1``, in position order:
    the keys a single run over the rank's keys reads (stock's one run at dcp 1, over this rank's share)."""
    return [req_to_token[r, rank: int(n): dcp].long() // dcp for r, n in enumerate(lengths)]


def dense_attention(torch, q, keys, ckv: int, sm_scale: float, visible=None):
    """Softmax attention written out in fp32: ``q`` [n, heads, ckv + kpe] over ``keys`` [k, ckv + kpe], the values
    the keys' first ``ckv`` dims (MLA's). ``visible`` [n, k] masks keys per query. Returns (out [n, heads, ckv],
    LSE base 2 [n, heads]); a query with no visible key gets (0, -inf)."""
    q, keys = q.float(), keys.float()
    score = torch.einsum("qhd,kd->qhk", q, keys) * sm_scale
    if visible is not None:
        score = score.masked_fill(~visible[:, None, :], float("-inf"))
    lse = torch.logsumexp(score, -1)
    weights = torch.nan_to_num(torch.exp(score - lse[..., None]), nan=0.0)
    return torch.einsum("qhk,kd->qhd", weights, keys[:, :ckv]), lse / math.log(2.0)


def merge_ranks(torch, outs, lses):
    """The ranks' partials merged by their base-2 LSE, in fp32: what the model's DCP merge computes. A rank with
    LSE -inf weighs zero."""
    lse = torch.stack([x.float() for x in lses])
    top = lse.max(0).values
    shift = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weight = torch.exp2(lse - shift)
    total = weight.sum(0)
    out = (torch.stack([x.float() for x in outs]) * weight[..., None]).sum(0)
    out = out / torch.where(total > 0, total, torch.ones_like(total))[..., None]
    return out, torch.where(total > 0, shift + torch.log2(total), torch.full_like(total, float("-inf")))


def compare(got_out, want_out, got_lse=None, want_lse=None) -> dict:
    """Max |error| of an output over the reference's max |value| (``rel``), and the LSE's max |error|."""
    err = float((got_out.float() - want_out.float()).abs().max())
    scale = float(want_out.float().abs().max())
    out = {"max_err": err, "scale": scale, "rel": err / scale if scale > 0 else (0.0 if err == 0 else math.inf)}
    if got_lse is not None:
        diff = (got_lse.float() - want_lse.float()).abs()
        both_inf = (~diff.isfinite()) & (got_lse.float() == want_lse.float())
        out["lse_err"] = float(diff.masked_fill(both_inf, 0.0).max())
    for key, value in out.items():
        if not math.isfinite(value):
            out[key] = math.inf
    return out


def within(c: dict, dtype_name: str) -> bool:
    rel_tol, lse_tol = TOLERANCE[dtype_name]
    return c["rel"] <= rel_tol and c.get("lse_err", 0.0) <= lse_tol


def describe(c: dict) -> str:
    lse = f", lse {c['lse_err']:.1e}" if "lse_err" in c else ""
    return f"rel err {c['rel']:.1e} (max {c['max_err']:.1e} of {c['scale']:.2f}){lse}"


# ----------------------------------------------------------------------------------------------- environment


@dataclass
class Env:
    torch: Any
    device: str
    wrapper_class: Any
    dtype: Any
    shape: Shape
    rehearse: bool
    workspace: Any = None
    broken: str | None = None  # why the kernel cannot run at all: the later parts skip
    batch: Any = None
    info: dict = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def wrapper(self, **bound):
        if bound:
            return self.wrapper_class(self.workspace, use_cuda_graph=True, backend="auto", **bound)
        return self.wrapper_class(self.workspace, backend="auto")


def _builder_import(torch) -> None:
    """sglang's DCP index builder, which ``build_ids`` launches. Its package's imports are made with CUDA hidden,
    as gpu_check.py imports sglang: on a GPU sglang's modules import CUDA-only kernels at import time, which a
    machine without sglang's kernel wheel lacks. The builder is a Triton kernel and runs on CUDA all the same."""
    import importlib
    from unittest import mock

    with mock.patch.object(torch.cuda, "is_available", return_value=False):
        importlib.import_module(BUILDER)


def _version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"


def setup(args) -> tuple[Env | None, str | None]:
    """The environment, or the one line that says why there is none."""
    if args.rehearse:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported: the plugin's merge and the builder
    try:
        import torch
    except ImportError as exc:
        return None, f"gpu_verify: needs torch with CUDA; torch does not import ({exc}); fix: run it where torch is"
    shape = Shape(**{k: v for k, v in vars(args).items() if k in Shape.__dataclass_fields__ and v is not None})
    if args.rehearse:
        from emulation.mla.oracle import OracleMLAWrapper

        env = Env(torch, "cpu", OracleMLAWrapper, torch.float32, shape, True)
        env.info.update(device="cpu (rehearsal: the MLA oracle in flashinfer's place)", kernel="oracle")
    else:
        if not torch.cuda.is_available():
            return None, "gpu_verify: needs one CUDA GPU, and torch sees none; run it on a GPU machine (make gpu-check-verify)"
        try:
            from flashinfer.mla import BatchMLAPagedAttentionWrapper
        except Exception as exc:  # one line whatever flashinfer's import raises
            return None, (f"gpu_verify: needs flashinfer {FLASHINFER} (sglang 0.5.23's pin); it does not import "
                          f"({type(exc).__name__}: {str(exc)[:120]}); fix: make gpu-bundle-verify, then bash "
                          f"tools/emulation/mla/gpu_verify_run.sh")
        env = Env(torch, "cuda", BatchMLAPagedAttentionWrapper, torch.bfloat16, shape, False)
        props = torch.cuda.get_device_properties(0)
        env.info.update(device=f"{torch.cuda.get_device_name()} (sm {props.major}.{props.minor}, "
                               f"{props.multi_processor_count} SMs)",
                        flashinfer=_version("flashinfer-python"), nvcc=_nvcc())
        torch.backends.cuda.matmul.allow_tf32 = False  # the references in true fp32
    try:
        _builder_import(torch)
    except Exception as exc:
        return None, (f"gpu_verify: needs sglang's DCP index builder ({BUILDER}, sglang 0.5.23); it does not "
                      f"import ({type(exc).__name__}: {str(exc)[:100]}); fix: put sglang, or build/gpu-verify/sglang "
                      f"from make gpu-bundle-verify, on PYTHONPATH")
    import triton

    env.info.update(torch=torch.__version__, triton=triton.__version__, sglang=_version("sglang"))
    # flashinfer's workspace as sglang sizes it (SGLANG_FLASHINFER_WORKSPACE_SIZE), shared by every wrapper
    env.workspace = torch.empty((384 << 20) if env.cuda else 1, dtype=torch.uint8, device=env.device)
    return env, None


def _nvcc() -> str:
    """Whether flashinfer can build its kernel here: it compiles with nvcc, from CUDA_HOME or the PATH (no path is
    printed: the report may be committed)."""
    import shutil

    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and Path(home, "bin", "nvcc").exists():
        return "in CUDA_HOME"
    return "on PATH" if shutil.which("nvcc") else "not found (flashinfer's JIT build needs it)"


# ----------------------------------------------------------------------------------------------- the batch


@dataclass
class Batch:
    """One verify batch: ``q`` [tokens, heads, ckv + kpe] (the all-gathered q every rank holds), one latent cache by
    loc, the request table, each rank's pool, and three sets of committed lengths: ``a`` (the capture's), ``b``
    (the next step's: a few more tokens accepted) and ``c`` (the controls': about half)."""

    q: Any
    cache_by_loc: Any
    req_to_token: Any
    pools: list
    lengths: dict
    source: Any
    wants: dict = field(default_factory=dict)


@dataclass
class Source:
    """What ``build_ids`` reads ids from (the translator's read source under DCP): ``req_to_token`` itself."""

    ids: Any
    row_ids: Any
    row_stride: int


def make_batch(env: Env) -> Batch:
    torch, s = env.torch, env.shape
    g = torch.Generator().manual_seed(s.seed)
    spread = max(1, s.prefix // 16)
    a = torch.randint(s.prefix - spread, s.prefix + spread + 1, (s.bs,), generator=g).clamp(min=1)
    b = a + torch.randint(1, s.draft + 2, (s.bs,), generator=g)
    c = (a // 2).clamp(min=1)
    room = a + 2 * s.draft + 2
    req_to_token, locs = owner_layout(torch, room.tolist(), s.dcp, generator=g)
    dim = s.ckv + s.kpe
    q_std = SCORE_STD / (s.sm_scale * math.sqrt(dim))
    dg = torch.Generator(device=env.device).manual_seed(s.seed + 1)
    cache = torch.randn(locs, dim, generator=dg, device=env.device, dtype=env.dtype)
    q = (torch.randn(s.bs * s.draft, s.heads, dim, generator=dg, device=env.device) * q_std).to(env.dtype)
    pools = [rank_pool(cache, s.dcp, r)[:, None, :] for r in range(s.dcp)]
    ids = req_to_token.to(env.device)
    source = Source(ids, torch.arange(s.bs, dtype=torch.int32, device=env.device), int(ids.stride(0)))
    return Batch(q, cache, ids, pools, {"a": a, "b": b, "c": c}, source)


def verify_reference(env: Env, batch: Batch, name: str):
    """One rank over all keys: draft token j of request r attends to positions 0 .. H_r + j."""
    if name in batch.wants:
        return batch.wants[name]
    torch, s = env.torch, env.shape
    outs, lses = [], []
    for r, h in enumerate(batch.lengths[name].tolist()):
        n = h + s.draft
        keys = batch.cache_by_loc[batch.req_to_token[r, :n].long()]
        visible = torch.arange(n, device=env.device)[None, :] <= (h + torch.arange(s.draft, device=env.device))[:, None]
        out, lse = dense_attention(torch, batch.q[r * s.draft: (r + 1) * s.draft], keys, s.ckv, s.sm_scale, visible)
        outs.append(out)
        lses.append(lse)
    batch.wants[name] = (torch.cat(outs), torch.cat(lses))
    return batch.wants[name]


# ----------------------------------------------------------------------------------------------- one rank's verify


class RankVerify:
    """One rank's split verify, as the plugin's hook runs it (``plugin/hooks/flashinfer_mla_backend.py``): eager,
    fresh ids and a full ``plan()`` per step; for a CUDA graph, wrappers bound to views of one device pack and to
    id buffers, a full plan at capture and, at each replay, the pack copied, the ids built into the bound buffers
    and the native scheduler run into the capture's workspaces (:func:`replan`)."""

    def __init__(self, env: Env, batch: Batch, rank: int, *, graph: bool) -> None:
        from sglang_dcp_dspark.plugin import dcp_verify

        torch, s = env.torch, env.shape
        self.env, self.batch, self.rank, self.graph = env, batch, rank, graph
        self.pool = batch.pools[rank]
        self.tokens = s.bs * s.draft
        self.plan = self.meta = None
        self.prefix = self.window = None
        if graph:
            capacity = s.bs * (batch.req_to_token.shape[1] // s.dcp + 1)
            self.pack = torch.zeros(dcp_verify.pack_size(s.bs, self.tokens), dtype=torch.int32, device=env.device)
            self.prefix_ids = torch.zeros(capacity, dtype=torch.int32, device=env.device)
            self.window_ids = torch.zeros(self.tokens * dcp_verify.window_capacity(s.draft, s.dcp),
                                          dtype=torch.int32, device=env.device)
            self.meta = dcp_verify.unpack(self.pack, s.bs, self.tokens)
            m = self.meta
            self.prefix = env.wrapper(qo_indptr=m.prefix_qo_indptr, kv_indptr=m.prefix_kv_indptr,
                                      kv_indices=self.prefix_ids, kv_len_arr=m.prefix_kv_len)
            self.window = env.wrapper(qo_indptr=m.window_qo_indptr, kv_indptr=m.window_kv_indptr,
                                      kv_indices=self.window_ids, kv_len_arr=m.window_kv_len)

    def step(self, lengths, *, refresh: bool = True, replan: bool = True) -> None:
        """Plan one step at committed ``lengths``. A graph's ``refresh=False`` leaves every buffer as it was (the
        stale-buffers control); ``replan=False`` refreshes the pack and the ids but not the schedule (the
        no-replan control)."""
        from sglang_dcp_dspark.plugin import dcp_verify

        env, s, torch = self.env, self.env.shape, self.env.torch
        plan = dcp_verify.plan_split(lengths, torch.full((s.bs,), s.draft), dcp_size=s.dcp, dcp_rank=self.rank)
        if self.graph and not refresh:
            return
        pack = plan.device_pack()
        if self.graph:
            if plan.prefix_ids > self.prefix_ids.numel() or plan.window_ids > self.window_ids.numel():
                raise ValueError(f"rank {self.rank}: {plan.prefix_ids} prefix and {plan.window_ids} window ids "
                                 f"exceed the graph's buffers")
            self.pack[: pack.numel()].copy_(pack, non_blocking=True)
            meta, prefix_ids, window_ids = self.meta, self.prefix_ids, self.window_ids
        else:
            meta = dcp_verify.unpack(pack.to(env.device, non_blocking=True), plan.bs, plan.tokens)
            prefix_ids = torch.empty(plan.prefix_ids, dtype=torch.int32, device=env.device)
            window_ids = torch.empty(plan.window_ids, dtype=torch.int32, device=env.device)
            self.prefix, self.window = env.wrapper(), env.wrapper()
        src = self.batch.source
        dcp_verify.build_ids(plan, src, src.row_ids, prefix_ids, window_ids, meta)
        sides = ((self.prefix, plan.prefix_qo_indptr, plan.prefix_kv_indptr, prefix_ids[: plan.prefix_ids],
                  plan.prefix_kv_len),
                 (self.window, plan.window_qo_indptr, plan.window_kv_indptr, window_ids[: plan.window_ids],
                  plan.window_kv_len))
        for wrapper, qo_indptr, kv_indptr, ids, kv_len in sides:
            if self.graph and self.plan is not None:
                if replan:
                    replan_native(wrapper, qo_indptr, kv_indptr, kv_len, s.heads, s.ckv)
            else:
                wrapper.plan(qo_indptr, kv_indptr, ids, kv_len, s.heads, s.ckv, s.kpe, 1, False, s.sm_scale,
                             env.dtype, env.dtype)
        self.plan, self.meta = plan, meta

    def run(self, pool=None, out=None):
        """Both sides and their merge, as the hook's ``forward_extend`` runs them; ``(out, lse)``, base 2. ``out``:
        preallocated (prefix out, prefix lse, window out, window lse) to write into."""
        from sglang_dcp_dspark.plugin import dcp_verify

        s, q = self.env.shape, self.batch.q
        pool = self.pool if pool is None else pool
        q_nope, q_pe, ckv, kpe = q[..., : s.ckv], q[..., s.ckv:], pool[..., : s.ckv], pool[..., s.ckv:]
        if out is None:
            p_out, p_lse = self.prefix.run(q_nope, q_pe, ckv, kpe, out=q_nope.new_empty(q_nope.shape), return_lse=True)
            w_out, w_lse = self.window.run(q_nope, q_pe, ckv, kpe, out=q_nope.new_empty(q_nope.shape), return_lse=True)
        else:
            p_out, p_lse = self.prefix.run(q_nope, q_pe, ckv, kpe, out=out[0], lse=out[1], return_lse=True)
            w_out, w_lse = self.window.run(q_nope, q_pe, ckv, kpe, out=out[2], lse=out[3], return_lse=True)
        return dcp_verify.merge(p_out, p_lse, w_out, w_lse, self.meta)


def replan_native(wrapper, qo_indptr, kv_indptr, kv_len, heads: int, head_dim_ckv: int) -> None:
    """A replay's plan of a graph wrapper planned at capture, as the hook's replay plans it (``_replan`` in
    ``plugin/hooks/flashinfer_mla_backend.py``, after sglang's ``fast_mla_prefill_plan``): flashinfer's native
    scheduler on the host lengths, into the capture's workspaces. The pack's copy and the builder already
    refreshed the bound buffers. Written out here because the hook's is private to the plugin: keep the two alike."""
    wrapper._cached_module.plan(wrapper._float_workspace_buffer, wrapper._int_workspace_buffer,
                                wrapper._pin_memory_int_workspace_buffer, qo_indptr, kv_indptr, kv_len, heads,
                                head_dim_ckv, False)


class Captured:
    """``fn`` captured in a CUDA graph (warmed up first on a side stream, as torch asks), replayed on demand. On
    CPU (the rehearsal) a replay calls ``fn`` again: the oracle's graph wrappers read their bound buffers at each
    run, as a replayed kernel does."""

    def __init__(self, env: Env, fn) -> None:
        self.env, self.fn, self.graph, self.outputs = env, fn, None, None
        if env.cuda:
            torch = env.torch
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.outputs = fn()

    def replay(self):
        if self.graph is None:
            self.outputs = self.fn()
        else:
            self.graph.replay()
        return self.outputs


# ----------------------------------------------------------------------------------------------- the parts


def part_kernel(env: Env, rec: dict) -> bool:
    from sglang_dcp_dspark.plugin import kernel_check

    torch, s = env.torch, env.shape
    started = time.perf_counter()
    try:
        kernel_check.check(env.wrapper_class, workspace=env.workspace, device=env.device, num_heads=s.heads,
                           head_dim_ckv=s.ckv, head_dim_kpe=s.kpe, sm_scale=s.sm_scale, q_dtype=env.dtype,
                           kv_dtype=env.dtype)
        verdict, ok = f"passes ({', '.join(kernel_check.CHECKS)})", True
    except kernel_check.KernelCheckFailed as exc:
        verdict, ok = f"STOPS: {exc}", False
    except PartTimeout:
        env.broken = ("the kernel check did not finish in time; flashinfer builds its kernel on first use and caches "
                      "the build, so a second run on the same machine starts from it")
        raise
    except Exception as exc:  # flashinfer did not build or run its kernel: nothing later can run either
        env.broken = f"{type(exc).__name__}: {str(exc)[:160]}"
        raise
    rec["check"] = {"verdict": verdict, "seconds": round(time.perf_counter() - started, 1)}
    line(rec, f"the plugin's kernel check: {verdict}")

    # Long rows: one batch of non-causal rows (7 queries and 1 query per length), and a causal row of 7 queries.
    dim = s.ckv + s.kpe
    rows = [(q_len, keys) for keys in s.long_rows for q_len in (s.draft, 1)]
    total = sum(k for _, k in rows) + s.long_rows[-1] + 1
    g = torch.Generator(device=env.device).manual_seed(s.seed + 2)
    cache = torch.randn(total, 1, dim, generator=g, device=env.device, dtype=env.dtype)
    q_std = SCORE_STD / (s.sm_scale * math.sqrt(dim))
    order = torch.randperm(total - 1, generator=g, device=env.device).to(torch.int32) + 1  # scattered rows
    results = []
    for causal, batch_rows in ((False, rows), (True, [(s.draft, s.long_rows[-1])])):
        n_q = sum(q for q, _ in batch_rows)
        q = (torch.randn(n_q, s.heads, dim, generator=g, device=env.device) * q_std).to(env.dtype)
        qo, kv, ids, at = [0], [0], [], 0
        for q_len, keys in batch_rows:
            qo.append(qo[-1] + q_len)
            kv.append(kv[-1] + keys)
            ids.append(order[at: at + keys])
            at += keys
        i32 = torch.int32
        qo_t, kv_t = torch.tensor(qo, dtype=i32), torch.tensor(kv, dtype=i32)
        lens = torch.tensor([k for _, k in batch_rows], dtype=i32)
        wrapper = env.wrapper()
        wrapper.plan(qo_t, kv_t, torch.cat(ids), lens, s.heads, s.ckv, s.kpe, 1, causal, s.sm_scale, env.dtype,
                     env.dtype)
        out, lse = wrapper.run(q[..., : s.ckv], q[..., s.ckv:], cache[..., : s.ckv], cache[..., s.ckv:],
                               out=q.new_empty(n_q, s.heads, s.ckv), return_lse=True)
        rec.setdefault("backend", "the oracle" if env.rehearse else str(getattr(wrapper, "_backend", "?")))
        work = _work_items(env, [q for q, _ in batch_rows], [k for _, k in batch_rows], causal)
        for i, (q_len, keys) in enumerate(batch_rows):
            sel = slice(qo[i], qo[i + 1])
            visible = None
            if causal:
                last = torch.arange(q_len, device=env.device) + keys - q_len
                visible = torch.arange(keys, device=env.device)[None, :] <= last[:, None]
            want_out, want_lse = dense_attention(torch, q[sel], cache[ids[i].long(), 0], s.ckv, s.sm_scale, visible)
            c = compare(out[sel], want_out, lse[sel], want_lse)
            c.update(queries=q_len, keys=keys, causal=causal, ok=within(c, env.dtype_name))
            results.append(c)
            ok &= c["ok"]
            what = f"{q_len} {'query' if q_len == 1 else 'queries'} x {keys} keys{', causal' if causal else ''}"
            line(rec, f"row of {what}: {describe(c)} {'ok' if c['ok'] else 'FAIL'}")
        if work is not None:
            line(rec, f"  flashinfer's schedule for these {len(batch_rows)} rows: {work} work items")
            rec.setdefault("work_items", []).append({"causal": causal, "rows": len(batch_rows), "work_items": work})
    rec["rows"] = results
    line(rec, f"backend planned: {rec['backend']}")
    return ok


def _work_items(env: Env, q_lens, kv_lens, causal: bool):
    """How many work items flashinfer's FA scheduler cuts these rows into (more than the rows' query tiles: a
    row's keys are split across CTAs), from flashinfer's own count; None where it has none (the oracle)."""
    if env.rehearse:
        return None
    try:
        from flashinfer.mla._batch_mla._backends._fa_common import _fa_plan_work_count
        from flashinfer.utils import get_device_sm_count

        return int(_fa_plan_work_count(q_lens, kv_lens, env.shape.heads, get_device_sm_count(env.torch.device(
            "cuda")), causal))
    except Exception:
        return None


def part_split(env: Env, rec: dict) -> bool:
    from sglang_dcp_dspark.plugin import dcp_verify

    torch, s = env.torch, env.shape
    batch = env.batch = env.batch or make_batch(env)
    lengths = batch.lengths
    rec["lengths"] = {k: v.tolist() for k, v in lengths.items()}
    held = int((lengths["a"] + s.draft).sum())
    line(rec, f"batch {s.bs} x {s.draft} draft tokens, prefixes {int(lengths['a'].min())}..{int(lengths['a'].max())}, "
              f"dcp {s.dcp} simulated, {s.heads} heads")
    ok = True

    def check(name: str, outs, want_key: str, *, must_differ: bool = False, required: bool = True) -> None:
        nonlocal ok
        out, lse = merge_ranks(torch, [o for o, _ in outs], [x for _, x in outs])
        want_out, want_lse = verify_reference(env, batch, want_key)
        c = compare(out, want_out, lse, want_lse)
        good = within(c, env.dtype_name)
        passed = (not good) if must_differ else good
        verdict = ("caught" if passed else "NOT CAUGHT") if must_differ else ("ok" if passed else "FAIL")
        if not required:
            verdict += " (not required here)"
        c.update(ok=passed, required=required)
        rec.setdefault("checks", {})[name] = c
        ok &= passed or not required
        line(rec, f"{name:<26} {describe(c)} {verdict}")

    # Eager: each rank planned with fresh ids and flashinfer's full plan(), as the hook's eager verify.
    eager = []
    handed = 0
    for rank in range(s.dcp):
        rv = RankVerify(env, batch, rank, graph=False)
        rv.step(lengths["a"])
        handed += dcp_verify.kv_handed(rv.plan)
        out, lse = rv.run()
        eager.append((out.clone(), lse.clone()))
    rec["kv_handed_over_held"] = handed / held
    line(rec, f"KV handed to the kernel over all ranks / held: {handed / held:.3f}x")
    check("eager", eager, "a")

    # CUDA graph: capture at a, replay; re-plan at b, replay; the controls at c; re-plan at c, replay.
    ranks = [RankVerify(env, batch, rank, graph=True) for rank in range(s.dcp)]
    graphs = []
    for rv in ranks:
        rv.step(lengths["a"])
        graphs.append(Captured(env, rv.run))

    def replay_all():
        got = []
        for captured in graphs:
            out, lse = captured.replay()
            got.append((out.clone(), lse.clone()))
        return got

    check("graph at capture lengths", replay_all(), "a")
    for rv in ranks:
        rv.step(lengths["b"])
    check("graph re-planned (next)", replay_all(), "b")
    for rv in ranks:
        rv.step(lengths["c"], refresh=False)
    check("control: stale buffers", replay_all(), "c", must_differ=True)
    for rv in ranks:
        rv.step(lengths["c"], replan=False)
    check("control: no re-plan", replay_all(), "c", must_differ=True, required=not env.rehearse)
    for rv in ranks:
        rv.step(lengths["c"])
    check("graph re-planned (half)", replay_all(), "c")
    return ok


def _layer_pools(env: Env, rows: int):
    """One KV pool per layer, as a model has, so that 61 layers do not read one pool from cache."""
    torch, s = env.torch, env.shape
    g = torch.Generator(device=env.device).manual_seed(s.seed + 3)
    return torch.randn(s.layers, rows, 1, s.ckv + s.kpe, generator=g, device=env.device, dtype=env.dtype)


def _stock_run(env: Env, batch: Batch, rank: int):
    """One flashinfer run over rank ``rank``'s keys, as stock's verify plans one (one row per request, its draft
    tokens as the row's queries, causal bottom-right): the single run the split's two runs and merge replace."""
    torch, s = env.torch, env.shape
    rows = rank_rows(batch.req_to_token, (batch.lengths["a"] + s.draft).tolist(), s.dcp, rank)
    lens = torch.tensor([len(r) for r in rows], dtype=torch.int32)
    kv_indptr = torch.zeros(s.bs + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(lens, 0)
    qo_indptr = torch.arange(s.bs + 1, dtype=torch.int32) * s.draft
    wrapper = env.wrapper()
    wrapper.plan(qo_indptr, kv_indptr, torch.cat(rows).to(torch.int32), lens, s.heads, s.ckv, s.kpe, 1, True,
                 s.sm_scale, env.dtype, env.dtype)
    return wrapper


def _layers(env: Env, batch: Batch):
    """Rank 0's split layer and stock's run layer, each on layer ``l``'s pool, into preallocated outputs."""
    torch, s = env.torch, env.shape
    rv = RankVerify(env, batch, 0, graph=False)
    rv.step(batch.lengths["a"])
    stock = _stock_run(env, batch, 0)
    pools = _layer_pools(env, batch.pools[0].shape[0])
    tokens = s.bs * s.draft
    outs = [torch.empty(tokens, s.heads, s.ckv, dtype=env.dtype, device=env.device) for _ in range(3)]
    lses = [torch.empty(tokens, s.heads, dtype=torch.float32, device=env.device) for _ in range(2)]
    q = batch.q

    def split_layer(layer: int):
        return rv.run(pools[layer], (outs[0], lses[0], outs[1], lses[1]))

    def stock_layer(layer: int):
        pool = pools[layer]
        return stock.run(q[..., : s.ckv], q[..., s.ckv:], pool[..., : s.ckv], pool[..., s.ckv:], out=outs[2])

    return rv, split_layer, stock_layer


def _timed(env: Env, fn, repeats: int, warmup: int = 2) -> list[float]:
    """Milliseconds per call of ``fn``: CUDA events on a GPU, the host clock in the rehearsal."""
    torch = env.torch
    for _ in range(warmup):
        fn()
    env.sync()
    times = []
    for _ in range(repeats):
        if env.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return times


def part_timing(env: Env, rec: dict) -> bool:
    s = env.shape
    batch = env.batch = env.batch or make_batch(env)
    _, split_layer, stock_layer = _layers(env, batch)
    layers = range(s.layers)
    figures = {}
    for mode in ("graph", "eager"):
        for name, layer in (("split", split_layer), ("stock", stock_layer)):
            def all_layers(layer=layer):
                for i in layers:
                    layer(i)
            fn = Captured(env, all_layers).replay if mode == "graph" else all_layers
            times = _timed(env, fn, s.repeats)
            figures[f"{mode}/{name}"] = {"median_ms": statistics.median(times), "ms": times}
        split, stock = (figures[f"{mode}/{n}"]["median_ms"] for n in ("split", "stock"))
        per = 1e3 / s.layers
        line(rec, f"{mode:<5} per layer: split {split * per:8.1f} us, stock run {stock * per:8.1f} us: "
                  f"{split / stock if stock else math.inf:.2f}x; {s.layers} layers {split:.3f} vs {stock:.3f} ms")
    rec["figures"] = figures
    line(rec, f"median of {s.repeats}, rank 0, each layer its own KV pool; "
              f"{'CUDA events' if env.cuda else 'host clock (rehearsal)'}")
    return True


def _profiled(env: Env, fn) -> dict:
    """What ``torch.profiler`` sees on the device while ``fn`` runs once: kernels, copies, fills, by name."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    env.sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if env.cuda else [])
    with profile(activities=activities) as prof:
        fn()
        env.sync()
    counts = {"kernel": 0, "memcpy": 0, "memset": 0}
    names: dict[str, int] = {}
    for event in prof.events():
        if getattr(event, "device_type", None) != DeviceType.CUDA:
            continue
        kind = "memcpy" if event.name.startswith("Memcpy") else "memset" if event.name.startswith("Memset") else "kernel"
        counts[kind] += 1
        short = event.name.split("(")[0].split("<")[0].strip()[:48]
        names[f"{kind}: {short}"] = names.get(f"{kind}: {short}", 0) + 1
    return {**counts, "names": names}


def part_profile(env: Env, rec: dict) -> bool:
    batch = env.batch = env.batch or make_batch(env)
    _, split_layer, stock_layer = _layers(env, batch)
    graph_rank = RankVerify(env, batch, 0, graph=True)
    graph_rank.step(batch.lengths["a"])
    found = {"split layer": _profiled(env, lambda: split_layer(0)),
             "stock layer": _profiled(env, lambda: stock_layer(0)),
             "split step re-plan": _profiled(env, lambda: graph_rank.step(batch.lengths["b"]))}
    for name, f in found.items():
        line(rec, f"{name:<19} {f['kernel']} kernels, {f['memcpy']} copies, {f['memset']} fills")
        for what, n in sorted(f["names"].items()):
            line(rec, f"  {n} x {what}")
    rec["profile"] = found
    if not env.cuda:
        line(rec, "(rehearsal: no device, so no kernel to count)")
    return True


RUNNERS = {"kernel": part_kernel, "split": part_split, "timing": part_timing, "profile": part_profile}


# ----------------------------------------------------------------------------------------------- report


def line(rec: dict, text: str) -> None:
    text = f"[{rec['name']}] {text}"
    for chunk in _wrap(text):
        print(chunk, flush=True)
        rec.setdefault("lines", []).append(chunk)


def _wrap(text: str) -> list[str]:
    out = []
    while len(text) > WIDTH:
        cut = text.rfind(" ", 0, WIDTH)
        cut = cut if cut > WIDTH // 2 else WIDTH
        out.append(text[:cut])
        text = "    " + text[cut:].lstrip()
    return [*out, text]


# ----------------------------------------------------------------------------------------------- the bundle

# What make gpu-bundle-verify leaves out of flashinfer's wheel: the sources of its other kernels, each in its own
# folder under data/csrc (the MLA kernel's are the folder's own files: batch_mla_*.cu, tvm_ffi_utils.h), and
# CUTLASS's examples. The wheel is about 62 MiB, past what travels to a GPU machine beside the repository.
SLIM_DROP = ("flashinfer/data/csrc/*/", "flashinfer/data/cutlass/examples/")


def slim_drops(name: str) -> bool:
    for prefix in SLIM_DROP:
        if prefix.endswith("*/"):
            head = prefix[:-2]
            if name.startswith(head) and "/" in name[len(head):]:
                return True
        elif name.startswith(prefix):
            return True
    return False


def slim_wheel(source: Path, folder: Path) -> Path:
    """``source`` (a wheel) rewritten into ``folder`` under its own name without what :data:`SLIM_DROP` names,
    its RECORD without their lines."""
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    target = folder / source.name
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            if slim_drops(item.filename):
                continue
            data = src.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                kept = [row for row in data.decode("utf-8").splitlines() if not slim_drops(row.split(",")[0])]
                data = ("\n".join(kept) + "\n").encode("utf-8")
            dst.writestr(item, data)
    return target


def _alarm(signum, frame):
    raise PartTimeout()


def run_part(env: Env, name: str, limit: int) -> dict:
    """One part under its time limit (SIGALRM: it stops at the next Python line; gpu_verify_run.sh's timeout
    bounds the whole run)."""
    rec = {"name": name, "limit_s": limit}
    started = time.perf_counter()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(limit)
    try:
        if env.broken and name != "kernel":
            raise Skip(f"flashinfer's MLA kernel did not run in the kernel part ({env.broken})")
        rec["status"] = "pass" if RUNNERS[name](env, rec) else "FAIL"
    except PartTimeout:
        rec["status"] = "TIMEOUT"
        line(rec, f"ran out of its {limit} s")
    except Skip as exc:
        rec["status"] = "skipped"
        line(rec, f"skipped: {exc}")
    except Exception as exc:  # one line per part, then the next part
        rec["status"] = "ERROR"
        rec["error"] = f"{type(exc).__name__}: {exc}"
        line(rec, f"ERROR {type(exc).__name__}: {str(exc)[:300]}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    rec["seconds"] = round(time.perf_counter() - started, 1)
    line(rec, f"{rec['status']} in {rec['seconds']} s (limit {limit} s)")
    return rec


def default_json() -> Path:
    out = os.environ.get("OUT")
    return Path(out) / "gpu_verify.json" if out else Path("build") / "gpu" / "logs" / "gpu_verify.json"


def parse(argv: list[str] | None):
    parser = argparse.ArgumentParser(prog="gpu_verify", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="The parts: " + "; ".join(f"{p} (limit {LIMITS[p]} s)" for p in PARTS))
    parser.add_argument("--parts", default=",".join(PARTS), help="which parts, comma-separated (default: all)")
    parser.add_argument("--json", type=Path, default=None, help="where the JSON goes (default: $OUT/gpu_verify.json "
                                                                 "when OUT is set, else build/gpu/logs/)")
    parser.add_argument("--rehearse", action="store_true",
                        help="on CPU, the MLA oracle in flashinfer's place, small shapes (the CPU test's mode)")
    for name, kind in (("heads", int), ("ckv", int), ("kpe", int), ("bs", int), ("draft", int), ("prefix", int),
                       ("dcp", int), ("layers", int), ("repeats", int)):
        parser.add_argument(f"--{name}", type=kind, default=None,
                            help=f"default {getattr(Shape, name)} ({REHEARSAL[name]} when rehearsing)")
    parser.add_argument("--long-rows", default=None, help="keys per long row, comma-separated (default 4096,16384)")
    parser.add_argument("--slim-wheel", nargs=2, type=Path, metavar=("WHEEL", "FOLDER"),
                        help="make gpu-bundle-verify's step: flashinfer's wheel into FOLDER without the sources of "
                             "its other kernels, then exit")
    args = parser.parse_args(argv)
    if args.long_rows is not None:
        args.long_rows = tuple(int(x) for x in args.long_rows.split(","))
    if args.rehearse:
        for name, value in REHEARSAL.items():
            if getattr(args, name) is None:
                setattr(args, name, value)
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part {', '.join(unknown)}; expected some of {', '.join(PARTS)}")
    return args, parts


def main(argv: list[str] | None = None) -> int:
    args, parts = parse(argv)
    if args.slim_wheel:
        wheel, folder = args.slim_wheel
        target = slim_wheel(wheel, folder)
        print(f"gpu_verify: {target.name}: {wheel.stat().st_size / 2**20:.1f} -> {target.stat().st_size / 2**20:.1f} MiB")
        return 0
    env, why = setup(args)
    if env is None:
        print(why)
        return 2
    warnings.simplefilter("ignore", DeprecationWarning)  # flashinfer 0.7.2 on its flat, positional plan() and run()
    s = env.shape
    head = ", ".join(f"{k} {v}" for k, v in env.info.items())
    report = {"env": env.info, "shape": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(s).items()},
              "rehearsal": env.rehearse, "parts": {}}
    out_path = args.json or default_json()
    top = {"name": "gpu_verify"}
    line(top, head)
    line(top, f"shape: {s.heads} heads, latent {s.ckv} + rope {s.kpe}, {env.dtype_name}, sm_scale {s.sm_scale:.4f}; "
              f"batch {s.bs} x {s.draft} draft tokens, prefixes ~{s.prefix}, dcp {s.dcp}, {s.layers} layers")
    for name in parts:
        report["parts"][name] = run_part(env, name, LIMITS[name])
        _write(out_path, report)
    failed = [n for n, r in report["parts"].items() if r["status"] != "pass"]
    report["result"] = "pass" if not failed else f"not passed: {', '.join(failed)}"
    line(top, f"{len(parts) - len(failed)} of {len(parts)} parts pass{'' if not failed else ': ' + ', '.join(failed)}"
              f"; JSON: {out_path.name}")
    _write(out_path, report)
    return 1 if failed else 0


def _write(path: Path, report: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")
    except OSError as exc:
        print(f"gpu_verify: could not write {path.name}: {exc}")


if __name__ == "__main__":
    sys.exit(main())
