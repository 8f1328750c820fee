"""What the target verify under DCP costs a GPU: four designs in one run, per layer and per step, at dcp 8.

The designs: stock sglang's verify at dcp 1 (the baseline: it cannot run under
DCP), the per-row design (one row per draft token over all its keys, no merge;
re-implemented here), the split verify as it first shipped (an unfused on-rank
merge, and a full flashinfer ``plan()`` of both wrappers at every graph replay),
and the split now (one Triton merge, and the native scheduler alone at a replay).

Per layer and rank (the first table):

- ``launches`` and ``full passes`` (launches that read or write a tensor the
  size of the attention output), and the ``replay plans`` of a graph replay,
  counted by ``tools/emulation/mla/verify_dcp.py --cost`` while sglang 0.5.23's
  own code runs one layer's verify (``emulation.mla.launches``), run here as a
  subprocess; a figure that differs between eager and graph shows as
  ``eager/graph``. The per-row design has no runtime left to count: its figures
  are derived from its design (the KV write and one run, as stock's);
- ``merge MB``: what the on-rank merge reads plus what it writes, at 128 heads
  (DeepSeek-V3's, q all-gathered over the DCP group) x 512 in bf16, for batch
  1, 8 and 64. The merge is run on one request of the shape, each kernel it
  launches counted: a torch op reads its tensor arguments and writes its
  outputs (an in-place op reads and writes its target), a Triton kernel the
  distinct addresses its loads and stores touch, masked-out lanes left out.
  The kernels counted must be the harness's, in order; a batch is that many
  such requests. Stock and the per-row design have no merge;
- ``graph MB``: the CUDA-graph buffers at max batch 64 and context 160K
  (DeepSeek-V3's): stock's own ``cuda_graph_kv_indices`` in its row, and what
  each other design adds to it, read off the buffers the step table binds.

The NextN draft decode under DCP (the second table), rank 0 of dcp 8 in its
CUDA-graph form, with the plugin's hooks, against stock's target decode under
DCP on the same backend, counted by ``tools/emulation/mla/nextn_dcp.py
--cost``: a layer's launches and full passes, and a replay's metadata (the
step backends it plans, its launches, its plans).

Per step (the third table), one rank's planning of a graph replay, at batch
1, 8 and 64 x committed context 4K, 32K and 128K:

- ``KV x``: KV tokens handed to the kernel over all 8 ranks' plans (stock's one
  rank), filler slots included, over the tokens they hold;
- ``H2D``: bytes the step copies host to device;
- ``host ms``: the step on the host, median of its repeats, torch on one
  thread (the three fast designs interleaved, so they share the machine's
  moments). Stock: its host arrays and sglang's ``fast_mla_prefill_plan``.
  Per-row: its host plan, the copies of its gather and flags, one full
  ``plan()`` over its rows. As shipped: ``plan_split``, the pack and its copy,
  a full ``plan()`` of each wrapper. Now: ``plan_split``, the pack and its
  copy, ``dcp_verify.replan`` of each wrapper (the native scheduler alone).
  The ids themselves are built on the device in every design, apart from the
  plan, and are not in it;
- ``plans``: the full ``plan()`` calls or, where none, the native-scheduler
  calls of the step; ``clones``, ``cloned MB``: device tensors the step clones;
  ``alloc MB``: device memory the step allocates (its clones included);
  ``pinned MB``: pinned host memory it allocates.

flashinfer's ``plan()`` is the real one, from the wheel sglang 0.5.23 pins
(``flashinfer_python==0.7.2``), installed for this bench alone under
``build/bench/flashinfer`` (``make bench`` and ``make bench-smoke`` install it)
and run on the CPU: its native scheduler is stubbed (a stand-in that returns a
plan_info and does no work, in every design alike); its device queries answer
as an H100 (SM 9.0, 132 SMs); the device tensors are on torch's meta device (a
copy or a clone costs the host its dispatch only, as an asynchronous launch
would; its overlap check keys a meta storage by identity, a meta storage having
no address); and an allocation it asks pinned is made unpinned and counted. The
output says so.

The last lines check the claims: the split now makes no full plan at a replay,
allocates and clones nothing per replay, its host planning at batch 64 grows at
most 1.5x from 4K to 128K context, and its host-to-device bytes do not grow with
context at all.

    PYTHONPATH=build/trees/sglang-0.5.23:tools python bench/verify_cost.py [--smoke] [--json]

``--smoke`` runs the smallest shape only, once. Needs a tree with sglang's DCP
index builder (0.5.20 and later) and ``tools`` on PYTHONPATH (the harness);
Triton's interpreter is turned on here. Ratios come from one run; nothing here
is a test.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
import types
import warnings
from functools import partial
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
DCP = 8
BATCHES = (1, 8, 64)
CONTEXTS = (4096, 32768, 131072)
DRAFTS = (("DSPARK", 7), ("EAGLE", 4))
MAX_BS = 64  # the largest verify graph: sglang sizes its buffers for it
MAX_CONTEXT = 163840  # DeepSeek-V3's context length: cuda_graph_kv_indices is MAX_BS x this
HEADS = 128  # DeepSeek-V3: heads / attn_tp x dcp on a rank, q all-gathered over the DCP group
KV_LORA_RANK, ROPE = 512, 64
SCALE = (KV_LORA_RANK // 4 + ROPE) ** -0.5  # 1 / sqrt(qk_nope + qk_rope), DeepSeek-V3's 128 + 64
GROWTH_BOUND = 1.5  # the split's host planning at GROWTH_BATCH, 128K over 4K context
GROWTH_BATCH = 64
FAST_REPEATS = 101
# What make bench installs under build/bench/flashinfer for this bench alone: the flashinfer-python sglang 0.5.23
# pins, and the one package its MLA wrapper imports past the venv.
REQUIREMENTS = REPO / "requirements" / "bench-flashinfer.txt"
BENCH_PACKAGES = tuple(line.strip() for line in REQUIREMENTS.read_text(encoding="utf-8").splitlines()
                       if line.strip() and not line.startswith("#"))
FLASHINFER = next(p.split("==")[1] for p in BENCH_PACKAGES if p.startswith("flashinfer-python=="))
FLASHINFER_DIR = REPO / "build" / "bench" / "flashinfer"
# What flashinfer's device queries answer on the CPU: an H100 SXM's.
H100 = SimpleNamespace(major=9, minor=0, multi_processor_count=132, shared_memory_per_multiprocessor=233472,
                       shared_memory_per_block_optin=232448, name="NVIDIA H100 80GB HBM3")
DESIGNS = (("stock", "stock, dcp 1", "stock"), ("per_row", "per-row", "per-row"),
           ("shipped", "split as shipped", "as shipped"), ("now", "split now", "now"))
MB = 1e6


# ---------------------------------------------------------------- the per-row design, as it was before the split


def per_row_plan(qo_indptr, kv_indptr, dcp_size: int, dcp_rank: int):
    """The per-row plan 0012 and the plugin shipped before the split: one row per draft token over every key of
    this rank up to the token's position, the gather built on the host (one int64 per row and key)."""
    import torch

    from sglang_dcp_dspark.plugin.dcp_verify import owned_count

    qo, kv = qo_indptr.to(torch.int64), kv_indptr.to(torch.int64)
    q_len, kv_len = qo[1:] - qo[:-1], kv[1:] - kv[:-1]
    request = torch.repeat_interleave(torch.arange(len(q_len)), q_len)
    j = torch.arange(int(q_len.sum())) - torch.repeat_interleave(qo[:-1], q_len)
    count = owned_count((kv_len - q_len)[request] + j + 1, dcp_size, dcp_rank)
    slots = torch.clamp(count, min=1)
    row_of = torch.repeat_interleave(torch.arange(len(slots)), slots)
    first = torch.zeros(len(slots) + 1, dtype=torch.int64)
    first[1:] = torch.cumsum(slots, 0)
    k = torch.arange(int(first[-1])) - first[:-1][row_of]
    gather = kv[:-1][request][row_of] + dcp_rank + dcp_size * k
    gather = torch.where(count[row_of] > 0, gather, torch.full_like(gather, -1))
    return SimpleNamespace(qo_indptr=torch.arange(len(slots) + 1, dtype=torch.int32), kv_indptr=first.to(torch.int32),
                           kv_len=slots.to(torch.int32), gather=gather, empty=count == 0)


# ---------------------------------------------------------------- per layer: the harness's counts


def start_harness() -> subprocess.Popen:
    """One layer's verify counted by the numerics harness on this tree, stock and the split with and without the
    as-shipped control, in a process of its own (it patches sglang's backend module). Started first: it runs while
    this process imports and counts the merges, and is waited for before anything is timed."""
    command = [sys.executable, str(REPO / "tools" / "emulation" / "mla" / "verify_dcp.py"), "--fix", "plugin",
               "--control", "none,as-shipped", "--cost"]
    return subprocess.Popen(command, env=dict(os.environ, TRITON_INTERPRET="1"), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def start_draft_harness() -> subprocess.Popen:
    """The NextN draft decode under DCP counted the same way (``tools/emulation/mla/nextn_dcp.py --cost``), against
    stock's target decode under DCP on the same backend, rank 0 of dcp 8, CUDA-graph form."""
    command = [sys.executable, str(REPO / "tools" / "emulation" / "mla" / "nextn_dcp.py"), "--fix", "plugin", "--cost"]
    return subprocess.Popen(command, env=dict(os.environ, TRITON_INTERPRET="1"), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def draft_table(draft: dict) -> list[str]:
    """One row per design: a layer's launches and full passes, and a step's graph replay (the step backends it
    plans, its launches and its plans)."""
    out = ["NextN draft decode under DCP, rank 0 of dcp 8, CUDA graph (tools/emulation/mla/nextn_dcp.py --cost):",
           "design          layer launches  layer full passes  replay: backends  launches  plans"]
    for r in draft["rows"]:
        out.append(f"{r['design']:15} {r['layer_launches']:14} {r['layer_full_passes']:18} {r['backends']:17} "
                   f"{r['replay_launches']:9}  {'+'.join(r['replay_plans']) or 'none'}")
    return out


def harness_counts(process: subprocess.Popen) -> dict:
    stdout, stderr = process.communicate()
    lines = stdout.strip().splitlines()
    if process.returncode or not lines:
        raise RuntimeError(f"the harness failed ({' '.join(process.args[1:])}): {stderr.strip()[-2000:]}")
    return json.loads(lines[-1])


def layer_designs(counts: dict, algorithm: str) -> dict:
    """Per design: launches and full passes (eager, graph), the graph replay's plans, the merge's kernels."""
    rows = [r for r in counts["rows"] if r["algorithm"] == algorithm]

    def pick(design: str, control):
        found = {r["mode"]: r for r in rows if r["design"] == design and r["control"] == control}
        if set(found) != {"eager", "graph"}:
            raise RuntimeError(f"the harness counted no eager and graph {design} ({control}) for {algorithm}")
        kernels = found["graph"]["kernels"]
        runs = [i for i, k in enumerate(kernels) if k.startswith("mla:run")]
        return {"launches": (found["eager"]["launches"], found["graph"]["launches"]),
                "full_passes": (found["eager"]["full_passes"], found["graph"]["full_passes"]),
                "replay_plans": found["graph"].get("replay_plans", []), "kernels": kernels,
                "merge_kernels": [k.rstrip("*") for k in kernels[runs[-1] + 1:]] if runs else [], "derived": False}

    stock = pick("stock", None)
    # The per-row design: the step's KV write and one run over its rows, nothing after it. Derived, not counted.
    per_row = {"launches": stock["launches"], "full_passes": stock["full_passes"], "replay_plans": [],
               "kernels": [k for k in stock["kernels"]], "merge_kernels": [], "derived": True}
    return {"stock": stock, "per_row": per_row, "shipped": pick("split", "as-shipped"), "now": pick("split", None)}


# ---------------------------------------------------------------- per layer: the bytes the merge moves


class _Bytes:
    """Per kernel launched inside :func:`merge_bytes_counted`: (kind, name, bytes read, bytes written)."""

    def __init__(self) -> None:
        self.kernels: list[tuple[str, str, int, int]] = []
        self.inside = 0
        self.loads: dict[int, list] = {}
        self.stores: dict[int, list] = {}


def _tensors(values):
    import torch

    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _tensors(v)
        elif isinstance(v, dict):
            yield from _tensors(list(v.values()))


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


@contextlib.contextmanager
def merge_bytes_counted():
    """Count what each kernel launched inside reads and writes (see the module's docstring), on this thread."""
    import numpy as np
    from torch.utils._python_dispatch import TorchDispatchMode
    from triton.runtime import interpreter

    from emulation.mla.launches import NO_KERNEL

    count = _Bytes()

    def noted(into):
        def note(ptrs, mask):
            size = ptrs.get_element_ty().primitive_bitwidth // 8
            addresses = np.broadcast_to(ptrs.data, np.shape(mask.data))[np.asarray(mask.data, dtype=bool)]
            into.setdefault(size, []).append(np.asarray(addresses, dtype=np.uint64).ravel())
        return note

    def distinct(touched: dict) -> int:
        return sum(size * len(np.unique(np.concatenate(parts))) for size, parts in touched.items() if parts)

    builder = interpreter.InterpreterBuilder
    real_load, real_store, real_run = builder.create_masked_load, builder.create_masked_store, \
        interpreter.InterpretedFunction.run

    def load(self, ptrs, mask, *rest, **kwargs):
        noted(count.loads)(ptrs, mask)
        return real_load(self, ptrs, mask, *rest, **kwargs)

    def store(self, ptrs, value, mask, *rest, **kwargs):
        noted(count.stores)(ptrs, mask)
        return real_store(self, ptrs, value, mask, *rest, **kwargs)

    def run(self, *args, **kwargs):
        count.loads, count.stores = {}, {}
        count.inside += 1
        try:
            return real_run(self, *args, **kwargs)
        finally:
            count.inside -= 1
            count.kernels.append(("triton", getattr(self.fn, "__name__", "kernel"), distinct(count.loads),
                                  distinct(count.stores)))

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            result = func(*args, **kwargs)
            name = func.overloadpacket.__name__
            if count.inside or name in NO_KERNEL or name.startswith("_assert"):
                return result
            if name == "copy_" and args[0].data_ptr() == args[1].data_ptr():
                return result
            written = [a for a, spec in zip(args, func._schema.arguments, strict=False)
                       if spec.alias_info is not None and spec.alias_info.is_write]
            read = sum(_nbytes(t) for t in _tensors([args, kwargs]))
            wrote = sum(_nbytes(t) for t in (written or list(_tensors([result]))))
            count.kernels.append(("torch", name, read, wrote))
            return result

    builder.create_masked_load, builder.create_masked_store = load, store
    interpreter.InterpretedFunction.run = run
    try:
        with Ops():
            yield count
    finally:
        builder.create_masked_load, builder.create_masked_store = real_load, real_store
        interpreter.InterpretedFunction.run = real_run


def merge_bytes(draft_tokens: int) -> dict:
    """Per design with a merge: the kernels it launches for one request of ``draft_tokens`` draft tokens, each
    with the bytes it reads and writes; the same at every context of the sweep (checked)."""
    import torch

    from emulation.mla.verify_dcp import unfused_merge
    from sglang_dcp_dspark.plugin import dcp_verify

    def flags(context):
        plan = dcp_verify.plan_split(torch.tensor([context]), torch.tensor([draft_tokens]), dcp_size=DCP, dcp_rank=0)
        return plan, (plan.prefix_empty.tolist(), plan.window_empty.tolist())

    plan, pattern = flags(CONTEXTS[0])
    if any(flags(c)[1] != pattern for c in CONTEXTS[1:]):
        raise RuntimeError("rank 0's empty sides differ between the sweep's contexts: count the merge per context")
    g = torch.Generator().manual_seed(5)
    shape = (draft_tokens, HEADS, KV_LORA_RANK)

    def side():
        return (torch.randn(shape, generator=g).to(torch.bfloat16),
                torch.randn(shape[:2], generator=g, dtype=torch.float32) * 4 + 10)

    out = {}
    for key, merge in (("shipped", unfused_merge), ("now", dcp_verify.merge)):
        (prefix_out, prefix_lse), (window_out, window_lse) = side(), side()
        meta = dcp_verify.unpack(plan.device_pack(), plan.bs, plan.tokens)
        with merge_bytes_counted() as count:
            merge(prefix_out, prefix_lse, window_out, window_lse, meta)
        out[key] = [list(k) for k in count.kernels]
    return out


def merge_per_request(counted: dict, designs: dict) -> dict:
    """Bytes read and written per request by each design's merge, its kernels checked against the harness's."""
    out = {"stock": 0, "per_row": 0}
    for key, kernels in counted.items():
        names = [f"{kind}:{name}" for kind, name, _, _ in kernels]
        if names != designs[key]["merge_kernels"]:
            raise RuntimeError(f"{key}: the merge counted here launches {names}, the harness counted "
                               f"{designs[key]['merge_kernels']}")
        designs[key]["merge_kernels_bytes"] = kernels
        out[key] = sum(r + w for _, _, r, w in kernels)
    return out


# ---------------------------------------------------------------- flashinfer's plan() on the CPU


class _Host:
    """What the stubs see: pinned allocations asked for, native-scheduler calls, full plan() calls."""

    pinned_count = pinned_bytes = native_plans = full_plans = 0

    @classmethod
    def reset(cls) -> None:
        cls.pinned_count = cls.pinned_bytes = cls.native_plans = cls.full_plans = 0


class NativeSchedulerStub:
    """Stands in for the module flashinfer's ``get_batch_mla_module`` builds (JIT-compiled CUDA): its ``plan``
    returns a plan_info and does no work."""

    PLAN_INFO = [0] * 18

    def plan(self, *args):
        _Host.native_plans += 1
        return list(self.PLAN_INFO)

    def plan_with_staged_workspace_bytes(self, *args):
        return self.plan(*args), 0

    def run(self, *args):
        raise RuntimeError("the bench plans only: no MLA kernel runs on the CPU")


class _TorchUnpinned(types.ModuleType):
    """torch, as one flashinfer module sees it: ``torch.empty(..., pin_memory=True)`` (which needs CUDA) allocates
    unpinned and is counted."""

    def __getattr__(self, name):
        import torch

        return getattr(torch, name)

    def empty(self, *args, pin_memory: bool = False, **kwargs):
        import torch

        tensor = torch.empty(*args, **kwargs)
        if pin_memory:
            _Host.pinned_count += 1
            _Host.pinned_bytes += _nbytes(tensor)
        return tensor


def _storage_interval(tensor):
    """flashinfer's (storage, start, end) for its overlap check, a meta storage keyed by identity (it has no
    address)."""
    start = tensor.storage_offset() * tensor.element_size()
    storage = tensor.untyped_storage()
    key = ("meta", storage._cdata) if tensor.device.type == "meta" else storage.data_ptr()
    return key, start, start + _nbytes(tensor)


def flashinfer_missing(where: Path = FLASHINFER_DIR) -> str | None:
    """Why the bench's flashinfer cannot be imported, or None."""
    installed = sorted(p.name for p in where.glob("flashinfer_python-*.dist-info")) if where.is_dir() else []
    if installed == [f"flashinfer_python-{FLASHINFER}.dist-info"]:
        return None
    return (f"flashinfer-python {FLASHINFER} is not installed for the bench under build/bench/flashinfer (found "
            f"{installed or 'nothing'}); fix: make bench-smoke installs it, or pip install --no-deps --target "
            "build/bench/flashinfer -r requirements/bench-flashinfer.txt")


def flashinfer_on_cpu(where: Path = FLASHINFER_DIR):
    """flashinfer 0.7.2's MLA wrapper class, importable on the CPU with the stubs the module's docstring lists."""
    warnings.filterwarnings("ignore")
    import flashinfer

    if not Path(flashinfer.__file__).resolve().is_relative_to(where.resolve()):
        raise RuntimeError(f"imported another flashinfer than the bench's: {flashinfer.__file__}")
    from flashinfer.mla._batch_mla import _auto_policy, _wrapper
    from flashinfer.mla._batch_mla._backends import _fa_common, fa2_backend, fa3_backend

    native = NativeSchedulerStub()
    device = {"get_compute_capability": lambda d: (H100.major, H100.minor),
              "_get_compute_capability": lambda d: (H100.major, H100.minor),
              "is_sm90a_supported": lambda d: True, "is_sm120a_supported": lambda d: False,
              "is_sm121a_supported": lambda d: False, "get_device_properties": lambda d: H100,
              "get_device_sm_count": lambda d: H100.multi_processor_count,
              "get_batch_mla_module": lambda *key: native}
    for module in (_wrapper, _auto_policy, _fa_common, fa2_backend, fa3_backend):
        for name, stub in device.items():
            if hasattr(module, name):
                setattr(module, name, stub)
    _fa_common.torch = _TorchUnpinned("torch")
    _fa_common._BatchMLAGeneratedFaMechanics._storage_interval = staticmethod(_storage_interval)
    wrapper = _wrapper.BatchMLAPagedAttentionWrapper
    real_plan = wrapper.plan

    def full_plan(self, *args, **kwargs):
        _Host.full_plans += 1
        return real_plan(self, *args, **kwargs)

    wrapper.plan = full_plan
    return wrapper


class _Step:
    """Per step, on this thread: device tensors cloned and allocated, bytes copied host to device."""

    def __init__(self) -> None:
        self.clones = self.cloned = self.allocated = self.h2d = self.d2d = 0


@contextlib.contextmanager
def step_counted():
    from torch.utils._python_dispatch import TorchDispatchMode

    step = _Step()

    def key(t):
        return t.device.type, t.untyped_storage()._cdata

    def same_view(a, b):
        return key(a) == key(b) and a.storage_offset() == b.storage_offset() and a.shape == b.shape

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            result = func(*args, **kwargs)
            name = func.overloadpacket.__name__
            inputs = list(_tensors([args, kwargs]))
            held = {key(t) for t in inputs}
            for t in _tensors([result]):
                if t.device.type == "meta" and key(t) not in held:
                    step.allocated += t.untyped_storage().nbytes()
                    if name == "clone":
                        step.clones += 1
                        step.cloned += _nbytes(t)
            if name in ("copy_", "_to_copy"):
                target = args[0] if name == "copy_" else next(_tensors([result]))
                source = args[1] if name == "copy_" else args[0]
                if target.device.type == "meta" and source.device.type == "cpu":
                    step.h2d += _nbytes(source)
                elif target.device.type == "meta" and source.device.type == "meta" and not same_view(target, source):
                    step.d2d += _nbytes(source)
            return result

    _Host.reset()
    with Ops():
        yield step


# ---------------------------------------------------------------- one shape: the four designs' replays


class Backend:
    """One rank's graph buffers for a draft length, as sglang and each design size them (max batch 64 x 160K),
    on the meta device, and the wrappers of one graph (one batch size) per design."""

    def __init__(self, wrapper_class, draft_tokens: int) -> None:
        import torch

        from sglang_dcp_dspark.plugin import dcp_verify

        meta, i32 = torch.device("meta"), torch.int32
        self.wrapper_class, self.n = wrapper_class, draft_tokens
        self.workspace = torch.empty(128 << 20, dtype=torch.uint8, device=meta)
        # Stock's (init_cuda_graph_state), which the split's prefix side binds too.
        self.kv_indices = torch.zeros(MAX_BS * MAX_CONTEXT, dtype=i32, device=meta)
        self.qo_indptr = torch.zeros(MAX_BS + 1, dtype=i32, device=meta)
        self.kv_indptr = torch.zeros(MAX_BS + 1, dtype=i32, device=meta)
        self.kv_lens = torch.ones(MAX_BS, dtype=i32, device=meta)
        self.fast_qo = torch.zeros(MAX_BS + 1, dtype=i32)  # the host arrays of stock's fast replay plan
        self.fast_kv_indptr = torch.zeros(MAX_BS + 1, dtype=i32)
        self.fast_kv_len = torch.zeros(MAX_BS, dtype=i32)
        tokens = MAX_BS * draft_tokens
        capacity = dcp_verify.window_capacity(draft_tokens, DCP)
        pack = dcp_verify.pack_size(MAX_BS, tokens)
        # The split as shipped: the window's own indptrs, lengths and ids, and the pack.
        self.shipped = SimpleNamespace(
            qo_indptr=torch.arange(tokens + 1, dtype=i32, device=meta),
            kv_indptr=torch.zeros(tokens + 1, dtype=i32, device=meta),
            kv_len=torch.ones(tokens, dtype=i32, device=meta),
            kv_indices=torch.zeros(tokens * capacity, dtype=i32, device=meta),
            pack=torch.zeros(pack, dtype=i32, device=meta))
        # The split now: the window's ids and the pack, whose views both sides bind.
        self.now = SimpleNamespace(kv_indices=torch.zeros(tokens * capacity, dtype=i32, device=meta),
                                   pack=torch.zeros(pack, dtype=i32, device=meta))
        # The per-row design: one row per draft token, of at most ceil(context / dcp) keys and the token's own.
        keys = -(-MAX_CONTEXT // DCP) + 1
        self.per_row = SimpleNamespace(
            qo_indptr=torch.arange(tokens + 1, dtype=i32, device=meta),
            kv_indptr=torch.zeros(tokens + 1, dtype=i32, device=meta),
            kv_len=torch.ones(tokens, dtype=i32, device=meta),
            kv_indices=torch.zeros(tokens * keys, dtype=i32, device=meta),
            gather=torch.zeros(tokens * keys, dtype=torch.int64, device=meta),
            empty=torch.zeros(tokens, dtype=torch.bool, device=meta))

    def graph_bytes(self) -> dict:
        def total(space):
            return sum(_nbytes(t) for t in vars(space).values())

        return {"stock": _nbytes(self.kv_indices), "per_row": total(self.per_row), "shipped": total(self.shipped),
                "now": total(self.now)}

    def wrapper(self, qo_indptr, kv_indptr, kv_indices, kv_len):
        return self.wrapper_class(self.workspace, use_cuda_graph=True, qo_indptr=qo_indptr, kv_indptr=kv_indptr,
                                  kv_indices=kv_indices, kv_len_arr=kv_len, backend="auto")

    def steps(self, bs: int, context: int) -> dict:
        """Each design's replay at this shape, its graph captured first (a full plan, not timed)."""
        import torch
        from sglang.srt.layers.attention.flashinfer_mla_backend import fast_mla_prefill_plan

        from sglang_dcp_dspark.plugin import dcp_verify

        n, tokens, bf16 = self.n, bs * self.n, torch.bfloat16
        split_dims = (HEADS, KV_LORA_RANK, ROPE, 1, False, SCALE, bf16, bf16)
        prefix = torch.full((bs,), context, dtype=torch.int64)  # host_prefix_lens
        seq_lens_cpu = torch.full((bs,), context, dtype=torch.int64)

        # Stock at dcp 1: the host arrays _apply_cuda_graph_metadata builds, then sglang's fast_mla_prefill_plan.
        stock = self.wrapper(self.qo_indptr[: bs + 1], self.kv_indptr[: bs + 1], self.kv_indices, self.kv_lens[:bs])
        stock_ids = self.kv_indices[: bs * (context + n)]  # written in place on the device (kv_indices_buf)

        def stock_step():
            self.fast_qo[: bs + 1] = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32)
            self.fast_kv_len[:bs] = seq_lens_cpu[:bs] + n
            self.fast_kv_indptr[1: bs + 1] = torch.cumsum(self.fast_kv_len[:bs], dim=0)
            stock.plan(self.fast_qo[: bs + 1], self.fast_kv_indptr[: bs + 1], stock_ids, self.fast_kv_len[:bs],
                       HEADS, KV_LORA_RANK, ROPE, 1, True, SCALE, bf16, bf16)

        stock_step()  # the capture: flashinfer's plan()
        stock.plan = partial(fast_mla_prefill_plan, stock)  # what sglang installs for the replays

        # The per-row design: its host plan, its gather and flags copied, one plan() over its rows.
        rows_buffers = self.per_row
        per_row = self.wrapper(rows_buffers.qo_indptr[: tokens + 1], rows_buffers.kv_indptr[: tokens + 1],
                               rows_buffers.kv_indices, rows_buffers.kv_len[:tokens])
        qo = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32)
        kv = torch.arange(0, (bs + 1) * (context + n), context + n, dtype=torch.int32)

        def per_row_step():
            rows = per_row_plan(qo, kv, DCP, 0)
            rows_buffers.gather[: rows.gather.numel()].copy_(rows.gather, non_blocking=True)
            rows_buffers.empty[:tokens].copy_(rows.empty, non_blocking=True)
            per_row.plan(rows.qo_indptr, rows.kv_indptr, rows_buffers.kv_indices[: int(rows.kv_indptr[-1])],
                         rows.kv_len, *split_dims)

        # The split as shipped: both wrappers planned in full at every replay, bound to their own buffers.
        ship = self.shipped
        shipped_prefix = self.wrapper(self.qo_indptr[: bs + 1], self.kv_indptr[: bs + 1], self.kv_indices,
                                      self.kv_lens[:bs])
        shipped_window = self.wrapper(ship.qo_indptr[: tokens + 1], ship.kv_indptr[: tokens + 1], ship.kv_indices,
                                      ship.kv_len[:tokens])

        def shipped_step():
            plan = dcp_verify.plan_split(prefix, torch.full((bs,), n), dcp_size=DCP, dcp_rank=0)
            pack = plan.device_pack()
            on_device = ship.pack[: pack.numel()]
            on_device.copy_(pack, non_blocking=True)
            dcp_verify.unpack(on_device, plan.bs, plan.tokens)
            shipped_prefix.plan(plan.prefix_qo_indptr, plan.prefix_kv_indptr, self.kv_indices[: plan.prefix_ids],
                                plan.prefix_kv_len, *split_dims)
            shipped_window.plan(plan.window_qo_indptr, plan.window_kv_indptr, ship.kv_indices[: plan.window_ids],
                                plan.window_kv_len, *split_dims)
            return plan

        # The split now: both sides bound to the pack's views; a replay copies the pack and runs the scheduler.
        now = self.now
        views = dcp_verify.unpack(now.pack, bs, tokens)
        now_prefix = self.wrapper(views.prefix_qo_indptr, views.prefix_kv_indptr, self.kv_indices,
                                  views.prefix_kv_len)
        now_window = self.wrapper(views.window_qo_indptr, views.window_kv_indptr, now.kv_indices,
                                  views.window_kv_len)

        def now_capture():
            plan = dcp_verify.plan_split(prefix, torch.full((bs,), n), dcp_size=DCP, dcp_rank=0)
            now_prefix.plan(plan.prefix_qo_indptr, plan.prefix_kv_indptr, self.kv_indices[: plan.prefix_ids],
                            plan.prefix_kv_len, *split_dims)
            now_window.plan(plan.window_qo_indptr, plan.window_kv_indptr, now.kv_indices[: plan.window_ids],
                            plan.window_kv_len, *split_dims)

        def now_step():
            plan = dcp_verify.plan_split(prefix, torch.full((bs,), n), dcp_size=DCP, dcp_rank=0)
            pack = plan.device_pack()
            now.pack[: pack.numel()].copy_(pack, non_blocking=True)
            dcp_verify.replan(now_prefix, plan.prefix_qo_indptr, plan.prefix_kv_indptr, plan.prefix_kv_len, HEADS,
                    KV_LORA_RANK)
            dcp_verify.replan(now_window, plan.window_qo_indptr, plan.window_kv_indptr, plan.window_kv_len, HEADS,
                    KV_LORA_RANK)
            return plan

        per_row_step()
        shipped_step()
        now_capture()
        return {"stock": stock_step, "per_row": per_row_step, "shipped": shipped_step, "now": now_step}


def kv_ratios(bs: int, context: int, draft_tokens: int) -> dict:
    """KV tokens handed to the kernel over all ranks' plans (stock's one rank), over the tokens they hold."""
    import torch

    from sglang_dcp_dspark.plugin import dcp_verify

    held = bs * (context + draft_tokens)
    qo = torch.arange(0, (bs + 1) * draft_tokens, draft_tokens, dtype=torch.int32)
    kv = torch.arange(0, (bs + 1) * (context + draft_tokens), context + draft_tokens, dtype=torch.int32)
    prefix, q_lens = torch.full((bs,), context), torch.full((bs,), draft_tokens)
    split = sum(dcp_verify.kv_handed(dcp_verify.plan_split(prefix, q_lens, dcp_size=DCP, dcp_rank=r))
                for r in range(DCP))
    rows = sum(int(per_row_plan(qo, kv, DCP, r).kv_len.sum()) for r in range(DCP))
    return {"stock": 1.0, "per_row": rows / held, "shipped": split / held, "now": split / held}


def measure(backend: Backend, bs: int, context: int, algorithm: str, repeats: int, fast_repeats: int) -> dict:
    steps = backend.steps(bs, context)
    row = {"algorithm": algorithm, "draft_tokens": backend.n, "bs": bs, "context": context, "designs": {}}
    ratios = kv_ratios(bs, context, backend.n)
    for key, step in steps.items():
        with step_counted() as counted:
            step()
        row["designs"][key] = {"kv_ratio": ratios[key], "h2d_bytes": counted.h2d, "d2d_bytes": counted.d2d,
                               "clones": counted.clones, "cloned_bytes": counted.cloned,
                               "device_alloc_bytes": counted.allocated, "pinned_allocs": _Host.pinned_count,
                               "pinned_bytes": _Host.pinned_bytes, "full_plans": _Host.full_plans,
                               "native_plans": _Host.native_plans}
    gc.collect()
    # The fast designs interleaved, so that they share the machine's moments; the per-row design apart.
    times: dict[str, list] = {key: [] for key in steps}
    for _ in range(fast_repeats):
        for key in ("stock", "shipped", "now"):
            t0 = time.perf_counter()
            steps[key]()
            times[key].append((time.perf_counter() - t0) * 1e3)
    for _ in range(repeats):
        t0 = time.perf_counter()
        steps["per_row"]()
        times["per_row"].append((time.perf_counter() - t0) * 1e3)
    for key, values in times.items():
        row["designs"][key]["host_ms"] = statistics.median(values)
    return row


# ---------------------------------------------------------------- the report


def size(n: float) -> str:
    if n >= 0.1 * MB:
        return f"{n / MB:,.1f} MB"
    return f"{n / 1e3:,.1f} kB" if n >= 1e3 else f"{int(n)} B"


def pair(values) -> str:
    eager, graph = values
    return str(eager) if eager == graph else f"{eager}/{graph}"


def layer_table(layers: dict) -> list[str]:
    merge_head = "merge MB at bs " + " / ".join(str(b) for b in BATCHES)
    out = [f"per layer and rank, counted by the harness on sglang {layers['release']} (rank 0 of dcp {DCP}; stock at "
           "dcp 1)",
           f"{'':<57}{merge_head:>29}",
           f"{'draft':<9} {'design':<18}{'launches':>9}{'full passes':>13}  {'replay plans':<13}"
           + "".join(f"{b:>7}" for b in BATCHES) + f"{'graph MB':>10}"]
    for algorithm, draft_tokens in DRAFTS:
        entry = layers["drafts"][algorithm]
        for i, (key, label, _) in enumerate(DESIGNS):
            d = entry["designs"][key]
            shape = f"{algorithm} {draft_tokens}" if i == 0 else ""
            name = label + (" (derived)" if d["derived"] else "")
            plans = ", ".join(d["replay_plans"]) or "-"
            merge = "".join(f"{b * entry['merge_bytes_per_request'][key] / MB:>7.1f}" for b in BATCHES)
            out.append(f"{shape:<9} {name:<18}{pair(d['launches']):>9}{pair(d['full_passes']):>13}  {plans:<13}"
                       f"{merge}{entry['graph_bytes'][key] / MB:>10.2f}")
    return out + [
        "launches, full passes (launches over a tensor the size of the attention output): one layer's verify,",
        "its KV write to its merge (tools/emulation/mla/verify_dcp.py --cost), eager/graph where they differ.",
        f"merge MB: what the on-rank merge reads and writes, bf16 [tokens, {HEADS} heads, {KV_LORA_RANK}], the "
        "kernels",
        "counted on one request and checked against the harness's. graph MB: stock's own",
        f"cuda_graph_kv_indices at max batch {MAX_BS} x {MAX_CONTEXT // 1024}K; the others': the CUDA-graph buffers "
        "they add to it.",
        "per-row (derived): no runtime left to count; its figures are its design's (the KV write and one run",
        "over its rows, as stock's)."]


def step_table(rows: list[dict]) -> list[str]:
    out = [f"per step: one rank's planning of a graph replay, dcp {DCP} (stock: dcp 1), flashinfer's plan() in it",
           f"{'draft':<9}{'bs':>3}{'ctx':>5} {'design':<11}{'KV x':>7}{'H2D':>10}{'host ms':>9}{'plans':>8}"
           f"{'clones':>7}{'cloned MB':>10}{'alloc MB':>9}{'pinned MB':>10}"]
    for r in rows:
        shape = f"{r['algorithm'] + ' ' + str(r['draft_tokens']):<9}{r['bs']:>3}{r['context'] // 1024:>4}K"
        for i, (key, _, short) in enumerate(DESIGNS):
            d = r["designs"][key]
            plans = f"full {d['full_plans']}" if d["full_plans"] else f"fast {d['native_plans']}"
            out.append(f"{shape if i == 0 else '':<17} {short:<11}{d['kv_ratio']:>6.2f}x{size(d['h2d_bytes']):>10}"
                       f"{d['host_ms']:>9.2f}{plans:>8}{d['clones']:>7}{d['cloned_bytes'] / MB:>10.2f}"
                       f"{d['device_alloc_bytes'] / MB:>9.2f}{d['pinned_bytes'] / MB:>10.2f}")
    return out + [
        "KV x: KV tokens handed to the kernel by all ranks' plans over those held. H2D: bytes copied host to",
        "device. host ms: median of repeats, torch on one thread. plans: full = flashinfer's plan(), fast =",
        "its native scheduler alone. clones, cloned MB, alloc MB (clones included): device memory the step",
        "clones and allocates; pinned MB: pinned host memory it allocates. per-row: its host plan, the copy",
        "of its gather, one plan() over its rows. The ids are built on the device in every design, apart",
        "from the plan."]


def notes(release: str, pin: str | None) -> list[str]:
    pinned = f"the version sglang {release} pins" if pin == FLASHINFER else f"sglang {release} pins {pin}"
    return [f"flashinfer-python {FLASHINFER} ({pinned}) runs on this CPU, for the bench",
            "only: its native scheduler stubbed (it returns a plan_info and does no work, in every design), its",
            "device queries answered as an H100's, device tensors on torch's meta device (a copy or a clone costs",
            "the host its dispatch only, as an asynchronous launch would), pin_memory=True allocations made",
            "unpinned and counted (pinned MB)."]


def claims(layers: dict, rows: list[dict]) -> tuple[list[str], bool]:
    out, ok = [], True

    def line(text: str, good: bool) -> None:
        nonlocal ok
        ok &= good
        out.append(f"{text} -> {'met' if good else 'NOT MET'}")

    harness = {a: layers["drafts"][a]["designs"]["now"]["replay_plans"] for a, _ in DRAFTS}
    steps_full = sum(r["designs"]["now"]["full_plans"] for r in rows)
    line("split now, a replay's plans counted by the harness: " + ", ".join(f"{a} {'+'.join(p) or 'none'}"
                                                                        for a, p in harness.items()),
         all(p and set(p) == {"fast"} for p in harness.values()))
    line(f"split now, full plans at a replay in the bench's {len(rows)} shape{'s' if len(rows) > 1 else ''}: "
         f"{steps_full}", steps_full == 0)
    spent = {k: sum(r["designs"]["now"][k] for r in rows)
             for k in ("clones", "cloned_bytes", "device_alloc_bytes", "pinned_bytes")}
    line(f"split now, per replay, every shape: {spent['clones']} clones, {spent['device_alloc_bytes']} B device "
         f"and {spent['pinned_bytes']} B pinned allocated", not any(spent.values()))
    for algorithm, _ in DRAFTS:
        at = {r["context"]: r for r in rows if r["algorithm"] == algorithm and r["bs"] == GROWTH_BATCH}
        if CONTEXTS[0] not in at or CONTEXTS[-1] not in at:
            continue
        growth = {k: at[CONTEXTS[-1]]["designs"][k]["host_ms"] / at[CONTEXTS[0]]["designs"][k]["host_ms"]
                  for k in ("now", "shipped", "per_row")}
        line(f"{algorithm} bs {GROWTH_BATCH}: split now host ms 128K/4K {growth['now']:.2f}x (bound {GROWTH_BOUND}x; "
             f"as shipped {growth['shipped']:.2f}x, per-row {growth['per_row']:.1f}x)",
             growth["now"] <= GROWTH_BOUND)
    for algorithm, _ in DRAFTS:
        h2d = {bs: sorted({r["designs"]["now"]["h2d_bytes"] for r in rows
                           if r["algorithm"] == algorithm and r["bs"] == bs}) for bs in BATCHES
               if sum(1 for r in rows if r["algorithm"] == algorithm and r["bs"] == bs) > 1}
        if h2d:
            line(f"{algorithm}: split now H2D the same at every context: "
                 + ", ".join(f"bs {bs} " + "/".join(f"{b:,} B" for b in seen) for bs, seen in h2d.items()),
                 all(len(seen) == 1 for seen in h2d.values()))
    return out, ok


def sglang_pin() -> str | None:
    """The flashinfer-python version the sglang on the path pins (its dist-info), or None."""
    import sglang

    for info in Path(sglang.__file__).resolve().parents[1].glob("sglang-*.dist-info/METADATA"):
        for text in info.read_text(encoding="utf-8").splitlines():
            if text.startswith("Requires-Dist: flashinfer_python") and "==" in text:
                return text.split("==")[1].split(";")[0].strip()
    return None


def main(argv: list[str]) -> int:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton imports: sglang's kernels on the CPU
    warnings.filterwarnings("ignore")
    fix = "fix: PYTHONPATH=build/trees/sglang-0.5.23:tools python bench/verify_cost.py"
    problem = flashinfer_missing()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    smoke = "--smoke" in argv
    harness, draft_harness = start_harness(), start_draft_harness()
    try:
        try:
            importlib.import_module("sglang.kernels.ops.attention.dcp_kernels")
        except ImportError as exc:
            print(f"error: sglang's DCP index builder is not importable ({exc}); expected a tree of 0.5.20 or "
                  f"later; {fix}", file=sys.stderr)
            return 2
        try:
            importlib.import_module("emulation.mla.launches")
        except ImportError:
            print(f"error: the numerics harness is not importable (tools is not on PYTHONPATH); {fix}",
                  file=sys.stderr)
            return 2
        import torch

        # One intra-op thread: the planning ops are tiny, and on a busy machine a thread pool's wake-ups cost more
        # than the ops (milliseconds for a repeat_interleave of 448 elements on two shared cores).
        torch.set_num_threads(1)
        wrapper_class = flashinfer_on_cpu()
        merges = {algorithm: merge_bytes(draft_tokens) for algorithm, draft_tokens in DRAFTS}
        importlib.import_module("sglang.srt.layers.attention.flashinfer_mla_backend")  # stock's fast replay plan
        counts = harness_counts(harness)  # waited for before anything is timed
        draft = harness_counts(draft_harness)
    finally:
        for process in (harness, draft_harness):
            if process.poll() is None:
                process.kill()
                process.communicate()
    layers = {"release": counts["release"], "drafts": {}}
    for algorithm, draft_tokens in DRAFTS:
        designs = layer_designs(counts, algorithm)
        layers["drafts"][algorithm] = {"designs": designs,
                                       "merge_bytes_per_request": merge_per_request(merges[algorithm], designs),
                                       "graph_bytes": Backend(wrapper_class, draft_tokens).graph_bytes()}
    shapes = [(b, c, a, w) for a, w in DRAFTS for b in BATCHES for c in CONTEXTS]
    if smoke:
        shapes = [(BATCHES[0], CONTEXTS[0], *DRAFTS[0])]
    backends = {w: Backend(wrapper_class, w) for _, w in DRAFTS}
    rows = [measure(backends[w], b, c, a, repeats=1 if smoke else (3 if b * c > 2**21 else 7),
                    fast_repeats=1 if smoke else FAST_REPEATS) for b, c, a, w in shapes]
    lines, ok = claims(layers, rows)
    by = {r["design"]: r for r in draft["rows"]}
    target, nextn = by["target decode"], by["draft decode"]
    # A layer: at most stock's DCP decode + 2 launches. A replay: stock's decode replay per step backend, plus the
    # draft kernel's own id build once, and the native scheduler alone.
    layer = nextn["layer_launches"] <= target["layer_launches"] + 2
    replay = (set(nextn["replay_plans"]) == {"fast"}
              and nextn["replay_launches"] <= nextn["backends"] * target["replay_launches"] + 1)
    lines.append(f"NextN draft decode, a layer: {nextn['layer_launches']} launches (stock's DCP decode: "
                 f"{target['layer_launches']}, bound +2) -> {'met' if layer else 'NOT MET'}")
    lines.append(f"NextN draft decode, a replay: {nextn['replay_launches']} launches, {nextn['backends']} step "
                 f"backends (stock's decode: {target['replay_launches']} each), "
                 f"{'+'.join(nextn['replay_plans'])} -> {'met' if replay else 'NOT MET'}")
    ok &= layer and replay
    pin = sglang_pin()
    if "--json" in argv:
        print(json.dumps({"dcp": DCP, "heads": HEADS, "flashinfer": FLASHINFER, "sglang_pins_flashinfer": pin,
                          "notes": notes(layers["release"], pin), "layers": layers, "steps": rows,
                          "draft_decode": draft["rows"],
                          "claims": lines, "claims_met": ok}))
    else:
        print("\n".join(layer_table(layers) + [""] + draft_table(draft) + [""] + step_table(rows)
                        + notes(layers["release"], pin) + [""] + lines))
    return 0 if ok or smoke else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
