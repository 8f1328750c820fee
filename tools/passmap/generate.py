"""The pass map: for each speculative pass under DCP, are the rows a pass READS the rows the write door WROTE?

For one sglang release (the tree on ``PYTHONPATH``), on CPU, with small pools:

1. tagged rows are written through the write door the backend really uses
   (``MLATokenToKVPool.set_mla_kv_buffer`` for an MLA target or NextN draft,
   ``MHATokenToKVPool.set_kv_buffer`` for a dense DSPARK draft's context, as
   ``models/dspark.py::write_target_hidden_kv`` does; ``TritonAttnBackend._set_kv_buffer``
   for the block tokens of a Triton draft);
2. for each pass, sglang's own metadata builders build the KV indices (the real
   attention backend object, built by its own ``__init__`` on a stand-in model
   runner, and its own ``init_forward_metadata*``). The only things replaced are
   the GPU pieces: the flashinfer wrapper classes are recorders (their ``plan``
   keeps the indices handed to the kernel; a CUDA-graph wrapper reads its bound
   buffer, as flashinfer's does), tensors asked for on ``cuda`` are made on CPU,
   and Triton kernels run in Triton's interpreter (``TRITON_INTERPRET=1``);
3. each index the kernel would read is mapped to the physical row it touches,
   and the tag found there is compared with the tags of the tokens the pass
   must attend to (on a striped pool: this rank's share);
4. after a HiCache backup, scrub and load-back through the controller's own
   transfer pieces (``test/datapath/layouts.py::host_stack`` and the
   ``HybridCacheController`` transfer lists), the reads are repeated.

Target backends: flashinfer MLA (``FlashInferMLAAttnBackend``, ``--attention-backend flashinfer`` on an MLA model)
and fa3 (``FlashAttentionBackend`` in its MLA mode, its rows = ``page_table`` x ``cache_seqlens``; ``sgl_kernel`` is
a stand-in module whose kernels raise if called). Releases 0.5.17-0.5.23: pools, write doors, read-id builders and
HiCache pieces are each release's own, called with the signatures that release has (see docs/spec-under-dcp.md).

Drafts: NEXTN (the target's own MLA layer), DSPARK's dense draft on each draft-backend flag (the flashinfer and
trtllm_mha draft blocks on the real backend objects, eager and as a CUDA graph), and external EAGLE / EAGLE3
dense drafts (``tools/passmap/eagle.py``). Probes: launches the release refuses before any pass runs, by its
own check (``probes``).

A plain launch's target passes (EXTEND, DECODE eager and CUDA graph, with the LSE the DCP merge needs) are
``tools/passmap/plain.py``'s, recorded under "plain".

Verdicts: "consistent", "wrong-rows", "raises", "not-admitted", "not-run".
Nothing is hard-coded: every verdict is what the run found.

Usage: PYTHONPATH=build/trees/sglang-X python tools/passmap/generate.py [--write | --check | --json]
       [--control shift-write,no-translate,shift-mha-write [--check]]  (the negative controls, and the check, as
       one JSON line)
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]
for path in (REPO / "tools", REPO / "test", REPO / "python"):  # this package, datapath (layouts, substitutions), ours
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

DATA = HERE.parent / "spec_passes.json"  # the full map; the package ships it compacted (compact.py)
DOC = REPO / "docs" / "spec-under-dcp.md"
BEGIN, END = "<!-- passmap:begin -->", "<!-- passmap:end -->"
GENERATED_BY = "python tools/passmap/generate.py --write (on each tree: PYTHONPATH=build/trees/sglang-X)"
PASSES = ("EXTEND", "DRAFT_DECODE_GRAPH", "DRAFT_DECODE_EAGER", "DRAFT_EXTEND", "TARGET_VERIFY_GRAPH",
          "TARGET_VERIFY_EAGER")
DCP_SIZES = (1, 2, 4, 8)

# Geometry (small): a rank's target pool has PAGES pages of PAGE rows; the logical page is PAGE * dcp.
PAGE, PAGES = 4, 8
KV_LORA_RANK, QK_ROPE_HEAD_DIM = 16, 8
MHA_KV_HEADS, MHA_HEAD_DIM = 2, 8
HEADS = 16
# The request: its committed prefix fills logical pages PREFIX_PAGES; its speculative window (draft steps,
# verify tokens, the DSPARK block) lies at the start of logical page WINDOW_PAGE. HiCache loads the prefix
# back into logical pages LOAD_PAGES (page 0 holds loc 0, the padded slot).
PREFIX_PAGES, WINDOW_PAGE, LOAD_PAGES = (1, 3), 5, (6, 2)
STEPS, DRAFT_TOKENS = 3, 4  # EAGLE: --speculative-num-steps 3, topk 1, --speculative-num-draft-tokens 4
DSPARK_BLOCK = 4  # DSPARK query_token_num (gamma + 1) kept small

# Draft attention backends to try for a DSPARK dense draft (--speculative-draft-attention-backend); None: default.
DSPARK_DRAFT_BACKENDS = (None, "fa3", "fa4", "flashinfer", "triton", "trtllm_mha")


# ---------------------------------------------------------------- GPU stand-ins (the only mocks)


class RecordingWrapper:
    """Stands in for a flashinfer wrapper class: keeps what ``plan`` hands the kernel.

    A CUDA-graph wrapper (``use_cuda_graph=True``) is bound to buffers at
    construction: flashinfer's ``plan`` copies the indices into the bound
    ``kv_indices`` buffer, and the kernel reads that buffer, so that is what
    :meth:`kernel_ids` returns for it. sglang's sync-free replay plans
    (``fast_mla_decode_plan``) call ``_cached_module.plan`` with host indptrs
    only: recorded as the indptr the kernel then uses over the bound buffer.
    """

    def __init__(self, *args, use_cuda_graph: bool = False, kv_indices=None, kv_indptr=None, qo_indptr=None,
                 kv_len_arr=None, **kwargs) -> None:
        import torch

        self.use_cuda_graph = use_cuda_graph
        self.bound_indices, self.bound_indptr = kv_indices, kv_indptr
        self.kv_indptr = self.kv_indices = None
        self.plans = 0
        self._float_workspace_buffer = self._int_workspace_buffer = torch.empty(0)
        self._pin_memory_int_workspace_buffer = torch.empty(0)
        wrapper = self

        class _Module:
            def plan(self, float_ws, int_ws, pin_ws, qo_indptr, kv_indptr, kv_len_arr, *rest):
                wrapper.kv_indptr = kv_indptr.clone()
                wrapper.kv_indices = wrapper.bound_indices
                wrapper.plans += 1

        self._cached_module = _Module()
        # fast_mla_prefill_plan copies into these
        self._qo_indptr_buf, self._kv_indptr_buf, self._kv_len_arr_buf = qo_indptr, kv_indptr, kv_len_arr
        self._kv_indices_buf = kv_indices

    def plan(self, *args, **kwargs):
        if "kv_indptr" in kwargs:  # flashinfer MHA wrappers take keywords (paged_kv_indptr ...)
            indptr, indices = kwargs["kv_indptr"], kwargs.get("kv_indices")
        elif "paged_kv_indptr" in kwargs or len(args) < 3:
            indptr = kwargs.get("paged_kv_indptr", args[1] if len(args) > 1 else None)
            indices = kwargs.get("paged_kv_indices", args[2] if len(args) > 2 else None)
        else:
            indptr, indices = args[1], args[2]
        self.kv_indptr = None if indptr is None else indptr.clone()
        if self.use_cuda_graph and self.bound_indices is not None and indices is not None:
            if indices.data_ptr() != self.bound_indices.data_ptr():
                self.bound_indices[: len(indices)].copy_(indices)
            self.kv_indices = self.bound_indices
        else:
            self.kv_indices = None if indices is None else indices.clone()
        self.plans += 1

    begin_forward = plan

    def kernel_ids(self, lane: int = 0) -> list[int]:
        if self.kv_indices is None or self.kv_indptr is None:
            return []
        lo, hi = int(self.kv_indptr[lane]), int(self.kv_indptr[lane + 1])
        return [int(x) for x in self.kv_indices[lo:hi].tolist()]


@contextlib.contextmanager
def cuda_tensors_on_cpu() -> Iterator[None]:
    """Tensors sglang asks for on ``cuda`` (or pinned) are made on CPU: there is no device here."""
    import torch

    names = ("zeros", "empty", "ones", "arange", "full", "tensor", "zeros_like", "empty_like", "full_like",
             "ones_like", "randn", "rand")
    saved = {n: getattr(torch, n) for n in names}

    def wrap(f):
        @functools.wraps(f)
        def g(*a, **k):
            d = k.get("device")
            if d is not None and str(d).startswith("cuda"):
                k["device"] = "cpu"
            k.pop("pin_memory", None)
            return f(*a, **k)

        return g

    for n, f in saved.items():
        setattr(torch, n, wrap(f))
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(torch, n, f)


def stub_flashinfer(module) -> None:
    """The flashinfer wrapper names a backend module binds only when flashinfer imports: recorders."""
    for name in ("BatchMLAPagedAttentionWrapper", "BatchPrefillWithRaggedKVCacheWrapper",
                 "BatchPrefillWithPagedKVCacheWrapper", "BatchDecodeWithPagedKVCacheWrapper"):
        if not hasattr(module, name) or isinstance(getattr(module, name), type):
            setattr(module, name, RecordingWrapper)


class _MHARecorder:
    """Stands in for a flashinfer MHA wrapper class: keeps what ``plan`` hands the kernel.

    flashinfer's paged wrappers, built with ``use_cuda_graph=True``, are bound to their ``paged_kv_indptr`` /
    ``paged_kv_indices`` buffers: ``plan`` copies into them and the kernel reads them; flashinfer's
    ``fast_decode_plan`` (installed by sglang after capture) copies nothing, the kernel reads what sglang wrote
    into the bound buffers. Without a graph the kernel reads the tensors handed to ``plan``. :meth:`kernel_ids`
    returns, per lane, the ids the kernel would read.
    """

    def __init__(self, workspace=None, kv_layout="NHD", *, use_cuda_graph: bool = False, backend: str = "auto",
                 use_tensor_cores: bool = False, paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None,
                 paged_kv_last_page_len_buffer=None, paged_kv_indptr_buf=None, paged_kv_indices_buf=None,
                 paged_kv_last_page_len_buf=None, qo_indptr_buf=None, custom_mask_buf=None, mask_indptr_buf=None,
                 **_unused) -> None:
        import torch

        self.is_cuda_graph_enabled = use_cuda_graph
        self.use_tensor_cores = use_tensor_cores
        self._backend = "fa2" if backend == "auto" else backend
        self._paged_kv_indptr_buf = paged_kv_indptr_buffer if paged_kv_indptr_buffer is not None else paged_kv_indptr_buf
        self._paged_kv_indices_buf = (paged_kv_indices_buffer if paged_kv_indices_buffer is not None
                                      else paged_kv_indices_buf)
        self._paged_kv_last_page_len_buf = (paged_kv_last_page_len_buffer if paged_kv_last_page_len_buffer is not None
                                            else paged_kv_last_page_len_buf)
        self._qo_indptr_buf, self._custom_mask_buf, self._mask_indptr_buf = qo_indptr_buf, custom_mask_buf, mask_indptr_buf
        self._fixed_batch_size = (len(self._paged_kv_last_page_len_buf)
                                  if self._paged_kv_last_page_len_buf is not None else None)
        self._float_workspace_buffer = self._int_workspace_buffer = torch.empty(0)
        self._pin_memory_int_workspace_buffer = torch.empty(0)
        self._max_total_num_rows = None
        self.device = torch.device("cpu")
        self.kv_indptr = self.kv_indices = None
        self.plans = 0
        wrapper = self

        class _Module:  # sglang's sync-free plans (fast_prefill_plan) end in _cached_module.plan: host data only
            def plan(self, *args):
                wrapper.plans += 1

        self._cached_module = _Module()

    def _record(self, indptr, indices) -> None:
        if self.is_cuda_graph_enabled:  # flashinfer's plan copies into the bound buffers; the kernel reads those
            if indptr is not None and indptr.data_ptr() != self._paged_kv_indptr_buf.data_ptr():
                self._paged_kv_indptr_buf[: len(indptr)].copy_(indptr)
            if indices is not None and indices.data_ptr() != self._paged_kv_indices_buf.data_ptr():
                self._paged_kv_indices_buf[: len(indices)].copy_(indices)
        else:
            self.kv_indptr = None if indptr is None else indptr.clone()
            self.kv_indices = None if indices is None else indices.clone()
        self.plans += 1

    def kernel_ids(self, lane: int = 0) -> list[int]:
        indptr, indices = ((self._paged_kv_indptr_buf, self._paged_kv_indices_buf) if self.is_cuda_graph_enabled
                           else (self.kv_indptr, self.kv_indices))
        if indptr is None or indices is None:
            return []
        lo, hi = int(indptr[lane]), int(indptr[lane + 1])
        return [int(x) for x in indices[lo:hi].tolist()]

    def forward(self, *a, **k):  # never called: only the metadata builders run
        raise RuntimeError("flashinfer kernel stand-in: not run on CPU")

    forward_return_lse = forward


class DecodeRecorder(_MHARecorder):
    """``BatchDecodeWithPagedKVCacheWrapper``: ``plan(indptr, indices, last_page_len, ...)``."""

    def plan(self, indptr, indices, last_page_len=None, *args, **kwargs) -> None:
        self._record(indptr, indices)

    begin_forward = plan


class PrefillRecorder(_MHARecorder):
    """``BatchPrefillWithPagedKVCacheWrapper``: ``plan(qo_indptr, paged_kv_indptr, paged_kv_indices, ...)``."""

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, *args, **kwargs) -> None:
        self._record(paged_kv_indptr, paged_kv_indices)

    begin_forward = plan


class RaggedRecorder(_MHARecorder):
    """``BatchPrefillWithRaggedKVCacheWrapper``: attends to the forward's own K/V, reads no cache rows."""

    def plan(self, *args, **kwargs) -> None:
        self.plans += 1

    begin_forward = plan


def fast_decode_plan(self, indptr, indices, last_page_len, *args, global_override_indptr_cpu=None, **kwargs) -> None:
    """flashinfer's ``fast_decode_plan``: under a CUDA graph it copies nothing (sglang wrote the bound buffers);
    without one it takes the tensors handed to it as its buffers."""
    if self.is_cuda_graph_enabled:
        if len(indices) > len(self._paged_kv_indices_buf):
            raise ValueError("The size of indices should be less than or equal to the allocated buffer")
        self.plans += 1
    else:
        self._record(indptr, indices)


def stub_flashinfer_mha(module) -> None:
    """The flashinfer names ``flashinfer_backend`` binds only when flashinfer imports: recorders."""
    for name, stand_in in (("BatchDecodeWithPagedKVCacheWrapper", DecodeRecorder),
                           ("BatchPrefillWithPagedKVCacheWrapper", PrefillRecorder),
                           ("BatchPrefillWithRaggedKVCacheWrapper", RaggedRecorder)):
        if not hasattr(module, name) or isinstance(getattr(module, name), type):
            setattr(module, name, stand_in)
    if not hasattr(module, "fast_decode_plan") or module.fast_decode_plan is not fast_decode_plan:
        module.fast_decode_plan = fast_decode_plan


# ---------------------------------------------------------------- tags


def tag_values(kind: str, locs, head_num: int = MHA_KV_HEADS, head_dim: int = MHA_HEAD_DIM):
    """Row values carrying ``loc + 1`` exactly in bf16 (two elements: high and low 7 bits)."""
    import torch

    t = (locs.long() + 1)
    hi, lo = (t // 128).float(), (t % 128).float()
    if kind == "mla":
        nope = torch.zeros(len(locs), 1, KV_LORA_RANK)
        nope[:, 0, 0], nope[:, 0, 1] = hi, lo
        return nope.bfloat16(), torch.zeros(len(locs), 1, QK_ROPE_HEAD_DIM).bfloat16()
    k = torch.zeros(len(locs), head_num, head_dim)
    k[:, :, 0], k[:, :, 1] = hi[:, None], lo[:, None]
    return k.bfloat16(), k.clone().bfloat16()


def row_tags(kind: str, pool, layer: int = 0) -> list[int]:
    """The tag (loc + 1) every physical row of ``layer`` holds; 0: nothing written."""
    buf = pool.kv_buffer[layer] if kind == "mla" else pool.k_buffer[layer]
    flat = buf.reshape(buf.shape[0], -1).float()
    return [int(v) for v in (flat[:, 0] * 128 + flat[:, 1]).round().long().tolist()]


def scrub(kind: str, pool) -> None:
    for buf in (pool.kv_buffer if kind == "mla" else [*pool.k_buffer, *pool.v_buffer]):
        buf.zero_()


def span(rows: list[int], n: int = 4) -> str:
    shown = ", ".join(map(str, rows[:n]))
    return shown + (", …" if len(rows) > n else "") if rows else "none"


def judge(kind: str, pool, read_rows: list[int], want_locs: list[int], *, note: str = "") -> dict:
    """Compare the tags at the rows read with the tags of the tokens the pass must read.

    ``want_locs``: the logical locs whose KV this rank's kernel must see for the pass.
    """
    tags = row_tags(kind, pool)
    where = {}
    for row, t in enumerate(tags):
        if t:
            where.setdefault(t - 1, row)
    rows_total = len(tags)
    want = [L + 1 for L in want_locs]
    got = [tags[r] if 0 <= r < rows_total else None for r in read_rows]
    wanted = set(want)
    bad = [i for i, g in enumerate(got) if g is None or g not in wanted]
    past = [read_rows[i] for i in bad if got[i] is None]
    if not bad and sorted(got) == sorted(want):
        return {"verdict": "consistent", "detail": f"reads {len(read_rows)} rows, each holding a token it attends to"
                + (f"; {note}" if note else "")}
    if not bad:
        missing = sorted(wanted - set(got))
        missing_locs = [m - 1 for m in missing]
        return {"verdict": "consistent",
                "detail": f"every row read holds a token it attends to, but it reads {len(set(got))} of the "
                          f"{len(wanted)} tokens (locs {span(missing_locs)} not planned)" + (f"; {note}" if note else "")}
    bad_rows = [read_rows[i] for i in bad]
    written = []
    for i in bad:
        # the token this index stands for: the kernel's i-th id against the i-th wanted token when lengths agree
        loc = want_locs[i] if i < len(want_locs) else None
        if loc is not None and loc in where:
            written.append(where[loc])
    held = []
    for i in bad[:4]:
        g = got[i]
        held.append("past the pool" if g is None else ("nothing" if g == 0 else f"loc {g - 1}"))
    detail = (f"reads rows {span(bad_rows)} (holding {', '.join(held)}{', …' if len(bad) > 4 else ''})"
              + (f" written at {span(written)}" if written else "")
              + f"; {len(bad)} of {len(read_rows)} ids wrong")
    if past:
        detail += f"; {len(past)} ids past the pool's {rows_total} rows (first {past[0]})"
    if note:
        detail += f"; {note}"
    return {"verdict": "wrong-rows", "detail": detail}


def raised(exc: BaseException) -> dict:
    """A 'raises' verdict naming the exception and the innermost sglang frame."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/sglang/" in f.filename]
    where = ""
    if frames:
        f = frames[-1]
        where = f" at {f.filename[f.filename.rindex('/sglang/') + 1:]}:{f.lineno}"
    msg = " ".join(str(exc).split())[:160]
    return {"verdict": "raises", "detail": f"{type(exc).__name__}: {msg}{where}"}


# ---------------------------------------------------------------- sglang context per rank


def release() -> str:
    import sglang

    return sglang.__version__


@contextlib.contextmanager
def on_rank(dcp: int, rank: int):
    """sglang's runtime context for one DCP rank (layouts.on_rank) plus the GPU stand-ins."""
    from sglang.srt.runtime_context import get_parallel

    from datapath import layouts

    with layouts.on_rank(dcp, rank) as ops, cuda_tensors_on_cpu(), contextlib.ExitStack() as stack:
        try:
            _ = get_parallel().attn_tp_size
        except (AssertionError, RuntimeError):  # 0.5.18/0.5.19: the sidecar context leaves attention TP unset: TP 1
            stack.enter_context(get_parallel().override(attn_tp_size=1))
        try:
            _ = get_parallel().attn_cp_size
        except (AssertionError, RuntimeError, AttributeError):
            # 0.5.18: the flashinfer backends size their CUDA-graph buffers by get_parallel().attn_cp_size, which the
            # sidecar context leaves without a group: 1, no attention context parallelism in these launches
            stack.enter_context(get_parallel().override(attn_cp_size=1))
        yield ops


def model_runner(pool, req_to_token, translator, *, dtype=None, heads: int = HEADS, server_args=None):
    import torch

    mc = SimpleNamespace(
        context_len=req_to_token.shape[1], num_attention_heads=heads, kv_lora_rank=KV_LORA_RANK,
        qk_nope_head_dim=KV_LORA_RANK, qk_rope_head_dim=QK_ROPE_HEAD_DIM, v_head_dim=KV_LORA_RANK, scaling=1.0,
        head_dim=MHA_HEAD_DIM, is_encoder_decoder=False, attention_chunk_size=None, is_hybrid_swa=False,
        is_multimodal=False, hf_config=SimpleNamespace(architectures=["X"]),
        get_num_kv_heads=lambda tp: MHA_KV_HEADS, num_hidden_layers=1, is_local_attention_model=False,
    )
    return SimpleNamespace(
        model_config=mc, device="cpu", req_to_token_pool=SimpleNamespace(size=req_to_token.shape[0],
                                                                          req_to_token=req_to_token),
        token_to_kv_pool=pool, kv_index_translator=translator, page_size=PAGE, dtype=dtype or torch.bfloat16,
        kv_cache_dtype=torch.bfloat16, sliding_window_size=None, is_hybrid_swa=False,
        server_args=server_args, attention_chunk_size=None, is_draft_worker=False,
        token_to_kv_pool_allocator=SimpleNamespace(page_size=PAGE, get_kvcache=lambda: pool),
    )


def translator_for(pool, req_to_token, *, draft: bool):
    """``ModelRunner.init_kv_index_translator``'s ``KVIndexTranslator`` (0.5.19 on; ``is_draft_worker`` 0.5.22 on);
    None on a release without one (0.5.18: the backends read ``req_to_token`` themselves)."""
    import inspect

    try:
        from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    except ImportError:
        return None
    kw = dict(req_to_token=req_to_token, token_to_kv_pool_allocator=None, token_to_kv_pool=pool,
              page_size=pool.page_size, device="cpu")
    if "is_draft_worker" in inspect.signature(KVIndexTranslator.__init__).parameters:
        kw["is_draft_worker"] = draft
    return KVIndexTranslator(**kw)


# ---------------------------------------------------------------- the request


class Request:
    """One request's locs: its committed prefix and its speculative window, in req_to_token row 0."""

    def __init__(self, dcp: int, prefix_pages=PREFIX_PAGES) -> None:
        import torch

        page = PAGE * dcp
        self.dcp = dcp
        self.prefix = torch.cat([torch.arange(p * page, (p + 1) * page) for p in prefix_pages])
        self.window = torch.arange(WINDOW_PAGE * page, WINDOW_PAGE * page + max(STEPS + 1, DRAFT_TOKENS, DSPARK_BLOCK))
        self.req_to_token = torch.zeros((2, 12 * page), dtype=torch.int32)
        self.set_prefix(self.prefix)

    def set_prefix(self, prefix) -> None:
        self.prefix = prefix
        S = len(prefix)
        self.req_to_token[0, :S] = prefix.int()
        self.req_to_token[0, S:S + len(self.window)] = self.window.int()

    @property
    def S(self) -> int:
        return len(self.prefix)

    def locs(self, n: int) -> list[int]:
        """The first ``n`` positions' locs (prefix then window)."""
        return [int(x) for x in self.req_to_token[0, :n].tolist()]


def owned(locs: list[int], striped: bool, dcp: int, rank: int) -> list[int]:
    return [L for L in locs if not striped or dcp == 1 or L % dcp == rank]


# ---------------------------------------------------------------- the passes


class Batch(SimpleNamespace):
    """A forward batch stand-in that can be weakly referenced (0.5.19's ``index_table_for_batch`` memoizes by
    ``weakref.ref(forward_batch)``)."""


def fb(**kw):
    """A forward batch: the fields the backends' metadata builders read."""
    import torch

    base = dict(batch_size=1, req_pool_indices=torch.tensor([0]), kv_loc_plan=None, attn_dcp_metadata=None,
                encoder_lens=None, spec_info=None, extend_prefix_lens=None, extend_prefix_lens_cpu=None,
                extend_seq_lens=None, extend_seq_lens_cpu=None, seq_lens_cpu=None, positions=None,
                input_ids=None, out_cache_loc=None, num_token_non_padded=None, mrope_positions=None)
    base.update(kw)
    ns = Batch(**base)
    ns.forward_mode = kw["forward_mode"]
    return ns


def seqs(n: int):
    import torch

    # int64, as ScheduleBatch makes them (an int32 seq_lens would alias the kv_lens the DCP planner rewrites)
    return dict(seq_lens=torch.tensor([n], dtype=torch.int64), seq_lens_sum=n,
                seq_lens_cpu=torch.tensor([n], dtype=torch.int64))


# ---------------------------------------------------------------- the iteration's KVLocPlan, as the release builds it

TR = "KVIndexTranslator"


def has_plans(tr) -> bool:
    """The release binds a ``KVLocPlan`` to each forward (0.5.22 on); before that ``kv_loc_plan`` does not exist."""
    return tr is not None and hasattr(tr, "own_plan")


def bind_own(batch, tr) -> str:
    """``ForwardBatch.init_new`` with no plan handed in: ``translator.own_plan(ret)`` then ``plan.bind(ret, translator)``."""
    if not has_plans(tr):
        return "no KVLocPlan in this release"
    tr.own_plan(batch).bind(batch, tr)
    return f"{TR}.own_plan + KVLocPlan.bind (ForwardBatch.init_new)"


def bind_runner_slots(batch, tr) -> str:
    """A graph runner's capture batch over its own buffers: ``KVIndexTranslator.bind_runner_slots``."""
    if not has_plans(tr):
        return "no KVLocPlan in this release"
    tr.bind_runner_slots(batch)
    return f"capture: {TR}.bind_runner_slots"


def bind_plan(plan, batch, tr, cols=None) -> None:
    if plan is not None:
        plan.bind(batch, tr, cols=cols)


def eagle_window_plan(target_tr, req: Request):
    """``eagle_worker_common.prepare_for_draft`` (topk 1, num_draft_tokens > num_steps): the iteration's window
    planned by the TARGET's translator, ``target_translator.plan(..., write_virtual=out_cache_loc,
    read_extent=num_draft_tokens)``; draft decode binds columns [0, num_steps), draft extend and verify the whole."""
    import torch

    if not has_plans(target_tr):
        return None, "no KVLocPlan in this release"
    S = req.S
    out = torch.tensor(req.locs(S + DRAFT_TOKENS)[S:], dtype=torch.int64)
    plan = target_tr.plan(req_pool_indices=torch.tensor([0]), seq_lens=torch.tensor([S], dtype=torch.int64),
                          seq_lens_cpu=torch.tensor([S], dtype=torch.int64), write_virtual=out,
                          read_extent=DRAFT_TOKENS)
    return plan, f"eagle_worker_common.prepare_for_draft: target {TR}.plan (the iteration's window)"


def dspark_window_plan(target_tr, req: Request):
    """``dspark_planner.alloc_verify_window``, the release's own function: the window the draft block, the
    verify and the target-hidden KV writes share, planned by the target's translator."""
    import torch

    if not has_plans(target_tr):
        return None, "no KVLocPlan in this release"
    from sglang.srt.speculative.dspark_components.dspark_planner import alloc_verify_window

    S, n = req.S, DSPARK_BLOCK
    batch = SimpleNamespace(seq_lens=torch.tensor([S], dtype=torch.int64), req_pool_indices=torch.tensor([0]))
    runner = SimpleNamespace(kv_index_translator=target_tr,
                             req_to_token_pool=SimpleNamespace(req_to_token=req.req_to_token))
    from unittest import mock

    from sglang.kernels.ops.speculative import cache_locs

    # The window's locs come from a Triton kernel sglang launches only on a GPU platform (its CPU branch returns
    # nothing): run that kernel in Triton's interpreter, as on CUDA.
    with mock.patch.object(cache_locs, "_is_cuda", True):
        window = alloc_verify_window(batch=batch, bs=1, device="cpu", verify_num_draft_tokens=n,
                                     block_pos_offsets=torch.arange(n)[None], model_runner=runner,
                                     seq_lens_cpu=torch.tensor([S], dtype=torch.int64))
    builder = "plan_uniform_extend" if hasattr(target_tr, "plan_uniform_extend") else "plan"
    return window.kv_loc_plan, f"dspark_planner.alloc_verify_window: target {TR}.{builder}"


def with_plan(out: dict, plan_where: str) -> dict:
    out = dict(out)
    out["plan"] = plan_where
    return out


class Case:
    """One (algorithm, draft, backends, dcp, rank) case on the current release."""

    def __init__(self, algorithm: str, draft_class: str, draft_kind: str, target_backend: str, draft_backend: str,
                 dcp: int, rank: int, *, draft_backend_flag: str | None = None) -> None:
        self.algorithm, self.draft_class, self.draft_kind = algorithm, draft_class, draft_kind
        self.target_backend, self.draft_backend = target_backend, draft_backend
        self.draft_backend_flag = draft_backend_flag
        self.dcp, self.rank = dcp, rank

    def key(self) -> tuple:
        return (self.algorithm, self.draft_class, self.draft_backend, self.dcp, self.rank)

    def record(self, passes: dict) -> dict:
        return {"release": release(), "algorithm": self.algorithm, "draft_class": self.draft_class,
                "draft_kind": self.draft_kind, "target_backend": self.target_backend,
                "draft_backend": self.draft_backend, "draft_backend_flag": self.draft_backend_flag,
                "target_kind": "mla", "dcp": self.dcp, "rank": self.rank, "passes": passes}


def run_pass(fn: Callable[[], dict], where: str) -> dict:
    try:
        out = fn()
    except AttributeError as exc:
        if "'types.SimpleNamespace' object" in str(exc) or "'Batch' object" in str(exc):  # a stand-in's gap
            out = {"verdict": "not-run", "detail": f"the harness's stand-in lacks a field this release reads: "
                   f"{raised(exc)['detail']}"}
        else:
            out = raised(exc)
    except Exception as exc:  # a pass that raises is a finding
        out = raised(exc)
    out = dict(out)
    plan = out.pop("plan", None)
    out.setdefault("where", where + (f" [plan: {plan}]" if plan else ""))
    return out


# ---------------------------------------------------------------- pools and writes (0.5.19 on: the configurator)


LAYER = SimpleNamespace(layer_id=0, is_cross_attention=False, tp_k_head_num=MHA_KV_HEADS, tp_v_head_num=MHA_KV_HEADS,
                        head_dim=MHA_HEAD_DIM, v_head_dim=MHA_HEAD_DIM, k_scale=None, v_scale=None, sliding_window_size=-1,
                        scaling=1.0, qk_head_dim=MHA_HEAD_DIM, logit_cap=0.0, is_cross=False, attn_type=None)


def spec_algorithm(name: str):
    """``--speculative-algorithm NAME`` as the release resolves it: ``speculative_hook.
    _resolve_speculative_algorithm_alias`` (NEXTN -> EAGLE; on 0.5.18/0.5.19 NEXTN is no ``SpeculativeAlgorithm``
    name, only an alias), then ``SpeculativeAlgorithm.from_string``."""
    from sglang.srt.arg_groups import speculative_hook
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    resolve = getattr(speculative_hook, "_resolve_speculative_algorithm_alias", None)
    return SpeculativeAlgorithm.from_string(resolve(name, None) if resolve else name)


def configurator(launch, *, draft: bool, layers: int, architecture: str):
    """This release's ``KVCacheConfigurator``, with only the fields its pool builders read set by hand, and only
    those the release's class has (``kv_shard_rank`` / ``kv_shard_spec`` / ``kv_shard_group`` are 0.5.22's; 0.5.21
    has ``attn_dp_size`` / ``pp_size``, 0.5.18-0.5.20 ``ps``). Its own ``loc_space_scale``, ``pool_page_size``,
    ``_derive_pool_sizes`` and ``_build_token_to_kv_pool`` then decide the pool, as the release builds it."""
    import torch
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator

    from datapath import layouts

    heads = SimpleNamespace(get_total_num_kv_heads=lambda: MHA_KV_HEADS, is_draft_model=draft)

    def kv_heads(tp, dcp=1):
        try:
            return ModelConfig.get_num_kv_heads(heads, tp, dcp)
        except TypeError:  # the release's get_num_kv_heads takes no dcp
            return ModelConfig.get_num_kv_heads(heads, tp)

    model_config = SimpleNamespace(
        kv_lora_rank=KV_LORA_RANK, qk_rope_head_dim=QK_ROPE_HEAD_DIM, head_dim=MHA_HEAD_DIM, v_head_dim=MHA_HEAD_DIM,
        hf_config=SimpleNamespace(architectures=[architecture]), num_nextn_predict_layers=launch.nextn_layers,
        get_num_kv_heads=kv_heads,
    )
    # 0.5.17 reads the launch's dcp_size off its server args (``loc_space_scale``); later releases off the runtime
    # context. Only where the release asks: an object there would change what a later release's builders decide.
    server_args = None
    scale = getattr(KVCacheConfigurator, "loc_space_scale", None)
    if isinstance(scale, property) and "self.server_args" in _source(scale.fget):
        server_args = ReleaseArgs()
    slots = set()
    for klass in KVCacheConfigurator.__mro__:
        slots |= set(getattr(klass, "__slots__", ()))
    cfg = object.__new__(KVCacheConfigurator)  # a slots dataclass: the fields below are its own slots
    for name, value in dict(
        device="cpu", is_draft_worker=draft, use_mla_backend=not draft or launch.kind == "mla",
        is_hybrid_swa=False, is_hybrid_swa_compress=False, mambaish_config=None, hybrid_gdn_config=None,
        is_inkling_mtp_draft=False, kv_cache_dtype=torch.bfloat16, kv_cache_dtype_str="auto",
        post_capture_kv_active=False, kv_shard_rank=None, kv_shard_spec=None, kv_shard_group=None,
        token_to_kv_pool_allocator=None, sliding_window_size=None, page_size=layouts.PAGE, server_args=server_args,
        spec_algorithm=spec_algorithm(launch.algorithm), model_config=model_config, draft_model_idx=None,
        attn_dp_size=1, pp_size=1, req_to_token_pool=None, memory_pool_config=None,
        layer_info=SimpleNamespace(num_effective_layers=layers, start_layer=0, end_layer=layers),
    ).items():
        if name in slots:
            setattr(cfg, name, value)
    return cfg


class ReleaseArgs:
    """Server args as the release's own ``ServerArgs`` defaults them, for the builders that read a few fields
    (0.5.17's configurator reads ``dcp_size`` and ``attention_backend``, its draft backends
    ``get_attention_backends()``): ``dcp_size`` is the rank being run's, ``fields`` set the rest by hand, and its
    methods are the release's own, bound to this record."""

    def __init__(self, **fields) -> None:
        vars(self).update(fields)

    @property
    def dcp_size(self) -> int:
        from sglang.srt.runtime_context import get_parallel

        return get_parallel().attn_dcp_size

    def __getattr__(self, name: str):
        import dataclasses
        import types

        from sglang.srt.server_args import ServerArgs

        for f in dataclasses.fields(ServerArgs):
            if f.name == name:
                if f.default is not dataclasses.MISSING:
                    return f.default
                if f.default_factory is not dataclasses.MISSING:
                    return f.default_factory()
        member = getattr(ServerArgs, name, None)
        if callable(member) and not name.startswith("__"):
            return types.MethodType(member, self)
        raise AttributeError(name)


def pools(algorithm: str, draft_kind: str):
    """The target pool (2 MLA layers) and the draft pool, built by this release's ``KVCacheConfigurator``."""
    from datapath import layouts

    launch = next(launch for launch in layouts.launches()
                  if launch.algorithm == ("NEXTN" if algorithm == "NEXTN" else "DSPARK") and not launch.replicated)
    target = layouts.build_pool(configurator(launch, draft=False, layers=layouts.TARGET_LAYERS,
                                             architecture="DeepseekV3ForCausalLM"))
    draft = layouts.build_pool(configurator(launch, draft=True, layers=1, architecture=launch.architecture))
    return launch, target, draft


def write_loc(locs):
    """A ``KVWriteLoc`` of physical locs (0.5.22 on marks them ``physical``; before, every loc is)."""
    import dataclasses

    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    if any(f.name == "physical" for f in dataclasses.fields(KVWriteLoc)):
        return KVWriteLoc(locs, physical=True)
    return KVWriteLoc(locs)


def write_mla(pool, locs) -> None:
    """``MLATokenToKVPool.set_mla_kv_buffer``: the MLA door (striped under DCP)."""
    pool.set_mla_kv_buffer(LAYER, mla_loc(pool, locs), *tag_values("mla", locs))


def mla_loc(pool, locs):
    """What ``set_mla_kv_buffer`` takes: a ``KVWriteLoc`` from 0.5.22 on, the bare ``cache_loc`` tensor before
    (its parameter is ``loc: torch.Tensor``, as flashinfer_mla_backend.forward_* hands it)."""
    import inspect

    params = list(inspect.signature(type(pool).set_mla_kv_buffer).parameters)
    return write_loc(locs) if "loc_info" in params else locs


def write_mha(pool, locs) -> None:
    """``MHATokenToKVPool.set_kv_buffer`` at the locs as given: ``write_target_hidden_kv``'s door."""
    pool.set_kv_buffer(LAYER, write_loc(locs), *tag_values("mha", locs, pool.head_num, pool.head_dim))


def write_mha_triton(pool, locs, positions) -> None:
    """``TritonAttnBackend._set_kv_buffer``: the door a Triton draft's forward writes its own tokens through."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    from datapath import layouts

    batch = SimpleNamespace(out_cache_loc=locs, out_cache_loc_is_physical=True, positions=positions, dcp_kv_mask=None)
    loc = KVWriteLoc.for_batch(batch) if hasattr(KVWriteLoc, "for_batch") else KVWriteLoc(locs)  # 0.5.22 on / before
    TritonAttnBackend._set_kv_buffer(layouts._backend(pool, None), batch, LAYER, loc,
                                     *tag_values("mha", locs, pool.head_num, pool.head_dim))


def is_striped(kind: str, pool, locs, dcp: int, rank: int) -> bool:
    """Measured: does this rank hold loc L at row L // N (owned only), rather than at row L?"""
    if dcp == 1:
        return False
    tags = row_tags(kind, pool)
    L = int(locs[0])
    return len(tags) <= L or tags[L] != L + 1


# ---------------------------------------------------------------- HiCache round trip


def hicache_round_trip(ops, target, draft, req: Request, dcp: int, *, draft_kind: str, sidecar: bool,
                       rewrite_window: Callable[[], None]) -> None:
    """Back the prefix up (target + draft, as ``start_writing`` does), scrub both device pools, load it back
    into LOAD_PAGES (``start_loading``), then point the request at the new locs.

    The host stack and the transfer lists are sglang's (``layouts.host_stack``: ``build_kv_only_stack`` with
    the draft packed or as a sidecar; ``HybridCacheController._l2_transfers`` / ``_l2_load_transfers`` /
    ``_resolve_device_transfers``; ``L2TransferEngine``); the ops are the data-path reference ops.
    """
    import torch
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController as HCC
    from sglang.srt.mem_cache.l2_transfer import L2TransferEngine

    from datapath import layouts

    plan = SimpleNamespace(device_pools=[draft]) if sidecar else None
    group, _, extra_pools = host_stack("SIDECAR" if sidecar else "PACKED", plan, () if sidecar else [draft],
                                               target, dcp)
    ops.register_pool("target/device", target)
    ops.register_pool("draft/device", draft)
    for entry in group.entries:
        ops.register_pool("target/host" if entry is group.anchor_entry else "draft/host", entry.host_pool)
    # The controller fields its transfer lists read: layer_num (the target's transfer layers; a packed draft's
    # host layers follow them), and on 0.5.18 the MTP draft pools ``set_mtp_draft_pools`` registers.
    packed_pools = () if sidecar else (draft,)
    ctl = SimpleNamespace(mem_pool_host=group, transfer_layer_id_max=layouts.TARGET_LAYERS,
                          layer_num=layouts.TARGET_LAYERS, has_draft=False, mtp_draft_device_pools=packed_pools,
                          has_mtp_draft=bool(packed_pools))
    for name in ("_l2_transfers", "_resolve_pool_transfers_allocation"):
        if hasattr(HCC, name):
            setattr(ctl, name, functools.partial(getattr(HCC, name), ctl))
    engine = L2TransferEngine(layouts.IO_BACKEND)
    locs = req.prefix.clone()
    host = group.alloc(len(locs))
    if hasattr(group, "resolve_host_transfers"):  # 0.5.19 on: HostPoolGroup resolves the extra pools' transfers
        transfers = group.resolve_host_transfers(extra_pools(), primary_device_indices=locs, primary_host_indices=host)
    else:  # 0.5.18: HybridCacheController.write -> _resolve_pool_transfers_allocation(alloc_host=True)
        transfers = HCC._resolve_pool_transfers_allocation(ctl, extra_pools() or [], alloc_host=True,
                                                           kv_device_indices=locs, kv_host_indices=host)
    engine.submit_device_to_host(HCC._l2_transfers(ctl, host, locs, transfers))
    scrub("mla", target)
    scrub(draft_kind, draft)
    page = PAGE * dcp
    locs2 = torch.cat([torch.arange(p * page, (p + 1) * page) for p in LOAD_PAGES])
    if hasattr(HCC, "_resolve_device_transfers"):
        loads = HCC._resolve_device_transfers(ctl, extra_pools(), kv_device_indices=locs2, kv_host_indices=host)
    else:  # 0.5.18: HybridCacheController.load -> _resolve_pool_transfers_allocation(alloc_host=False)
        loads = HCC._resolve_pool_transfers_allocation(ctl, extra_pools() or [], alloc_host=False,
                                                       kv_device_indices=locs2, kv_host_indices=host)
    import inspect

    kw = ({"transfer_layer_id_max": layouts.TARGET_LAYERS}
          if "transfer_layer_id_max" in inspect.signature(engine.submit_host_to_device).parameters
          else {"layer_num": layouts.TARGET_LAYERS})  # 0.5.18-0.5.20 take the layer count
    engine.submit_host_to_device(HCC._l2_load_transfers(ctl, host, locs2, loads), **kw)
    # The tags still name the locs they were written for: relabel the restored rows with the new locs, so a
    # read of a restored row is judged against the loc the request now holds there.
    relabel(target, "mla", locs, locs2)
    relabel(draft, draft_kind, locs, locs2)
    req.set_prefix(locs2)
    rewrite_window()


def hicache_failed(exc: BaseException) -> dict:
    """A round trip that stops inside sglang is a finding ('raises'); one that stops because the release lacks a
    piece the harness drives (an import, an attribute, a signature) is 'not-run', naming what is missing."""
    frames = traceback.extract_tb(exc.__traceback__)
    in_sglang = bool(frames) and "/sglang/" in frames[-1].filename
    if in_sglang and not isinstance(exc, (ImportError, AttributeError, TypeError)):
        return raised(exc)
    r = raised(exc)
    return {"verdict": "not-run", "detail": f"the HiCache round trip could not be driven on this release: {r['detail']}"}


def with_after_hicache(passes: dict, run_all: Callable[[], dict], round_trip: Callable[[], None]) -> dict:
    """Each pass's reading again after ``round_trip`` (a HiCache backup, scrub and load-back), under
    ``after_hicache``; a round trip that stops is each pass's finding (``hicache_failed``)."""
    try:
        round_trip()
        after = run_all()
    except Exception as exc:
        after = {p: hicache_failed(exc) for p in PASSES}
    for p in PASSES:
        passes[p]["after_hicache"] = {k: after[p][k] for k in ("verdict", "detail")}
    return passes


def host_stack(plan_name, plan, packed, target, dcp):
    """``layouts.host_stack``; on a release whose ``build_kv_only_stack`` still takes ``server_args`` (0.5.18),
    with the HiCache server args it reads (``hicache_size``, ``hicache_mem_layout``, ``hicache_write_policy``,
    ``hicache_io_backend`` ...) answered by the runtime context's memory view, which later releases read instead."""
    import inspect
    from unittest import mock

    from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as hpa

    from datapath import layouts

    build = hpa.build_kv_only_stack
    if "server_args" not in inspect.signature(build).parameters:
        return layouts.host_stack(plan_name, plan, packed, target, dcp)
    from sglang.srt.runtime_context import get_memory

    class MemoryArgs:
        def __getattr__(self, name):
            return getattr(get_memory(), name, None)

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(hpa, "build_kv_only_stack",
                                              functools.partial(build, server_args=MemoryArgs())))
        sidecars = getattr(hpa, "build_hicache_draft_sidecars", None)
        if sidecars is not None and "server_args" in inspect.signature(sidecars).parameters:
            stack.enter_context(mock.patch.object(hpa, "build_hicache_draft_sidecars",
                                                  functools.partial(sidecars, server_args=MemoryArgs())))
        return layouts.host_stack(plan_name, plan, packed, target, dcp)


def relabel(pool, kind: str, old, new) -> None:
    """Rows holding the tag of old[i] get the tag of new[i] (HiCache moved bytes of the token, not of a loc)."""
    import torch

    m = {int(a) + 1: int(b) + 1 for a, b in zip(old.tolist(), new.tolist(), strict=True)}
    bufs = pool.kv_buffer if kind == "mla" else [*pool.k_buffer, *pool.v_buffer]
    for buf in bufs[:1]:
        flat = buf.reshape(buf.shape[0], -1)
        tags = (flat[:, 0].float() * 128 + flat[:, 1].float()).round().long()
        for row, t in enumerate(tags.tolist()):
            if t in m:
                nt = m[t]
                flat[row, 0], flat[row, 1] = float(nt // 128), float(nt % 128)
    _ = torch


# ---------------------------------------------------------------- flashinfer-MLA passes (NEXTN target & draft)


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


def eagle_draft_input(bs: int = 1):
    import torch
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    spec = EagleDraftInput(topk_p=torch.ones(bs, 1), topk_index=torch.zeros(bs, 1, dtype=torch.long),
                           hidden_states=torch.zeros(bs, 8))
    spec.num_tokens_per_req = DRAFT_TOKENS
    spec.num_correct_drafts = torch.full((bs,), DRAFT_TOKENS - 1, dtype=torch.int32)
    return spec


def _multistep(pool, req, dcp, tr):
    import importlib

    fmb = importlib.import_module(FMB)
    stub_flashinfer(fmb)
    return fmb.FlashInferMLAMultiStepDraftBackend(model_runner(pool, req.req_to_token, tr, server_args=FI_ARGS), topk=1,
                                                  speculative_num_steps=STEPS)


def _decode_batch(req, *, seq_len: int | None = None, out_cache_loc=None):
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    n = req.S if seq_len is None else seq_len
    return fb(forward_mode=ForwardMode.DECODE, **seqs(n), positions=torch.tensor([n]),
              input_ids=torch.zeros(1, dtype=torch.long), spec_info=eagle_draft_input(),
              out_cache_loc=out_cache_loc)


def steps_verdict(results: list[dict]) -> dict:
    """One verdict for the draft decode's steps: the first step that is not consistent, else all of them."""
    if not results:
        return {"verdict": "not-run", "detail": "the multi-step backend built no per-step backends"}
    for i, r in enumerate(results):
        if r["verdict"] != "consistent":
            return {"verdict": r["verdict"], "detail": f"step {i}: {r['detail']}"}
    return {"verdict": "consistent", "detail": "; ".join(f"step {i}: {r['detail']}" for i, r in enumerate(results))}


def step_want(req, i: int, striped: bool, dcp: int, rank: int) -> list[int]:
    """Step i of the draft decode attends to the prefix and the i + 1 draft tokens written so far."""
    return owned(req.locs(req.S + i + 1), striped, dcp, rank)


def _judge_steps(pool, wrappers, req, striped, dcp, rank, *, kind: str = "mla") -> dict:
    """Each step's wrapper read against what that step attends to."""
    return steps_verdict([judge(kind, pool, w.kernel_ids(), step_want(req, i, striped, dcp, rank))
                          for i, w in enumerate(wrappers)])


def _live_decode_batch(req, tr_d, tr_t):
    """The draft-decode batch ``prepare_for_draft`` builds: the worker's window plan, columns [0, num_steps)."""
    b = _decode_batch(req)
    plan, where = eagle_window_plan(tr_t, req)
    bind_plan(plan, b, tr_d, cols=slice(0, STEPS))
    return b, plan, where


def pass_draft_decode_eager(pool, req, dcp, rank, striped, *, tr_d, tr_t) -> dict:
    multi = _multistep(pool, req, dcp, tr_d)
    b, _, where = _live_decode_batch(req, tr_d, tr_t)
    multi.init_forward_metadata(b)
    return with_plan(_judge_steps(pool, [x.decode_wrapper for x in multi.attn_backends], req, striped, dcp, rank),
                     where + ", columns [0, num_steps)")


def pass_draft_decode_graph(pool, req, dcp, rank, striped, *, tr_d, tr_t) -> dict:
    import torch

    multi = _multistep(pool, req, dcp, tr_d)
    multi.init_cuda_graph_state(1, 1)
    # capture: the runner's own buffers (seq_lens filled with 1, its out_cache_loc buffer)
    cap = _decode_batch(req, seq_len=1, out_cache_loc=torch.zeros(STEPS, dtype=torch.int64))
    cap_where = bind_runner_slots(cap, tr_d)
    multi.init_forward_metadata_out_graph(cap, in_capture=True)
    live, _, where = _live_decode_batch(req, tr_d, tr_t)  # replay: the live batch (its plan) is handed over
    multi.init_forward_metadata_out_graph(live, in_capture=False)
    return with_plan(_judge_steps(pool, [x.decode_cuda_graph_metadata[1] for x in multi.attn_backends], req,
                                  striped, dcp, rank),
                     f"{cap_where}; replay: {where}, columns [0, num_steps)")


def pass_draft_extend_v2(pool, req, dcp, rank, striped, *, tr_d, tr_t) -> dict:
    """EAGLE v2's draft extend (``prepare_for_draft_extend``): ForwardMode.DRAFT_EXTEND_V2, planned by the draft
    backend's ``init_forward_metadata`` straight away (no ``attn_dcp_metadata``: that is built by the eager runner).
    Its plan: the iteration's (``verify_input.kv_loc_plan``, handed to ``ForwardBatch.init_new``)."""

    be, _ = fi_mla_backend(pool, req, draft=True, tr=tr_d)
    b, where = draft_extend_batch(req, tr_d, tr_t)
    be.init_forward_metadata(b)
    return with_plan(judge("mla", pool, be.prefill_wrapper_paged.kernel_ids(),
                           owned(req.locs(req.S + DRAFT_TOKENS), striped, dcp, rank)), where)


def draft_extend_batch(req, tr_d, tr_t, *, mode=None, **extra):
    """``prepare_for_draft_extend``'s batch: ``mode`` (DRAFT_EXTEND_V2 by default) over the committed prefix with
    num_draft_tokens new tokens, the iteration's window plan bound with the draft's translator, then the post-write
    ``seq_lens``. Returns the batch and where its plan came from."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    S, n = req.S, DRAFT_TOKENS
    b = fb(forward_mode=mode or ForwardMode.DRAFT_EXTEND_V2, **seqs(S),
           extend_prefix_lens=torch.tensor([S], dtype=torch.int32), extend_prefix_lens_cpu=[S],
           extend_seq_lens=torch.tensor([n], dtype=torch.int32), extend_seq_lens_cpu=[n], spec_info=eagle_draft_input(),
           **extra)
    plan, where = eagle_window_plan(tr_t, req)
    bind_plan(plan, b, tr_d)
    # "Forward sees post-write length": forward_batch.seq_lens += num_draft_tokens after init_new
    b.seq_lens, b.seq_lens_cpu, b.seq_lens_sum = b.seq_lens + n, b.seq_lens_cpu + n, S + n
    return b, where


def verify_input(algorithm: str):
    import torch

    if algorithm == "DSPARK":
        from sglang.srt.speculative.draft_worker_common import make_draft_block_spec_info

        return make_draft_block_spec_info(draft_token_num=DRAFT_TOKENS, device="cpu")
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    n = DRAFT_TOKENS
    return EagleVerifyInput(
        draft_token=torch.zeros(n, dtype=torch.long), custom_mask=torch.ones(64 * n, dtype=torch.bool),
        positions=torch.arange(n), retrieve_index=torch.arange(n)[None], retrieve_next_token=torch.full((1, n), -1),
        retrieve_next_sibling=torch.full((1, n), -1), retrieve_cum_len=None, spec_steps=STEPS, topk=1,
        draft_token_num=n, capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=0, seq_lens_cpu=None)


def _verify_plan(algorithm, req, tr_t):
    return dspark_window_plan(tr_t, req) if algorithm == "DSPARK" else eagle_window_plan(tr_t, req)


def _verify_batch(req, spec, *, seq_len=None, out_cache_loc=None):
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    n = req.S if seq_len is None else seq_len
    # A verify ForwardBatch carries extend_prefix_lens=None: ForwardBatch.init_new sets it only for extend modes
    # other than TARGET_VERIFY, so the eager runner builds no attn_dcp_metadata for it.
    return fb(forward_mode=ForwardMode.TARGET_VERIFY, **seqs(n), spec_info=spec,
              positions=torch.arange(n, n + DRAFT_TOKENS), out_cache_loc=out_cache_loc)


def judge_verify(pool, wrapper, req, dcp, rank, striped) -> dict:
    """The verify's reads: one lane for the request (stock: every draft token reads the request's whole run), or,
    under DCP with the verify split (upstream-next 0012, the plugin's flashinfer MLA hooks), the prefix lane (one
    per request, all draft tokens) and a window lane per draft token: token j must read this rank's share of
    positions 0 .. S + j over the two, a side the plan flags empty (its filler slot) reading nothing."""
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
    b = _verify_batch(req, spec)
    plan, where = _verify_plan(algorithm, req, tr_t)
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
    cap = _verify_batch(req, cap_spec, seq_len=1, out_cache_loc=torch.zeros(n, dtype=torch.int64))
    cap_where = bind_runner_slots(cap, tr_t)
    be.init_forward_metadata_out_graph(cap, in_capture=True)
    spec = verify_input(algorithm)
    live = _verify_batch(req, spec)
    plan, where = _verify_plan(algorithm, req, tr_t)
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


def _source(obj) -> str:
    import inspect

    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


@functools.cache
def read_builder(module: str = FMB) -> str:
    """The function this release's flashinfer backend (MLA by default; ``flashinfer_backend`` for a dense draft)
    builds its paged read ids with, from its own source:
    0.5.22 on ``KVIndexTranslator.pack_read_stream``; 0.5.20/0.5.21 ``KVIndexTranslator.fill_packed_read_stream``;
    0.5.19 ``KVIndexTranslator.index_table_for_batch`` + ``create_flashinfer_kv_indices_triton``; 0.5.18
    ``create_flashinfer_kv_indices_triton`` over ``req_to_token`` (no translator)."""
    import importlib

    src = _source(importlib.import_module(module))
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
    decode_src = _source(fmb.FlashInferMLAIndicesUpdaterDecode)
    planner_src = _source(importlib.import_module("sglang.srt.layers.dcp.planner"))
    try:
        from sglang.srt.speculative.eagle_info import EagleVerifyInput

        verify_src = _source(EagleVerifyInput.generate_attn_arg_prefill)
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
    write_mla(target, locs)
    write_mla(draft, locs)


def nextn_round_trip(ops, target, draft, req: Request, dcp: int) -> Callable[[], None]:
    """NEXTN's HiCache round trip: the draft packed into the target's host pool, the window rewritten after it."""
    def rewrite_window():
        write_mla(target, req.window)
        write_mla(draft, req.window)

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


# ---------------------------------------------------------------- fa3 target (FlashAttentionBackend, MLA mode)

FAB = "sglang.srt.layers.attention.flashattention_backend"


@contextlib.contextmanager
def fa3_kernels_stubbed() -> Iterator[None]:
    """``sgl_kernel`` (``merge_state_v2``, ``sgl_kernel.flash_attn``) is CUDA-only and not installed here: the module
    names FlashAttentionBackend imports are stand-ins whose kernels raise if called (only the metadata builders
    run); ``get_scheduler_metadata`` (the FA3 split planner, a kernel too) answers None."""
    import types

    if "sgl_kernel" in sys.modules and not getattr(sys.modules["sgl_kernel"], "_passmap_stub", False):
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
    saved = {n: sys.modules.get(n) for n in ("sgl_kernel", "sgl_kernel.flash_attn")}
    sys.modules.update({"sgl_kernel": sk, "sgl_kernel.flash_attn": fl})
    try:
        yield
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m


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
        init = _source(importlib.import_module(FAB).FlashAttentionBackend.__init__)
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
        cap = _decode_batch(req, seq_len=1, out_cache_loc=torch.zeros(STEPS, dtype=torch.int64))
        cap_where = bind_runner_slots(cap, tr_d) + "; replay: "
        multi.init_forward_metadata_out_graph(cap, in_capture=True)
    b, _, where = _live_decode_batch(req, tr_d, tr_t)
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
        cap = _verify_batch(req, verify_input(algorithm), seq_len=1, out_cache_loc=torch.zeros(n, dtype=torch.int64))
        cap_where = bind_runner_slots(cap, tr_t) + "; replay: "
        be.init_forward_metadata_out_graph(cap, in_capture=True)
    spec = verify_input(algorithm)
    live = _verify_batch(req, spec)
    plan, where = _verify_plan(algorithm, req, tr_t)
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
        src = _source(importlib.import_module(FAB))
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


# ---------------------------------------------------------------- DSPARK (dense draft, replicated context)


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
    if "server_args.get_attention_backends()" in _source(importlib.import_module(f"{ATT}.flashinfer_backend")):
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


def worse_of(forms: dict) -> dict:
    """One verdict for a pass run in several forms: the worst one run (SEVERITY), each form's in the detail."""
    ran = {k: v for k, v in forms.items() if v["verdict"] != "not-run"} or forms
    verdict = min((v["verdict"] for v in ran.values()), key=lambda x: SEVERITY[x])
    return {"verdict": verdict, "detail": "; ".join(f"{k}: {v['detail']}" for k, v in forms.items())}


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
        source = _source(builder)
        if not source:
            return {"verdict": "not-run", "detail": "fa4: FlashAttentionBackend.init_forward_metadata's source cannot "
                    "be read here, so whether fa3's reading stands for it is not known"}
        if "fa_impl_ver" in source:
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
                write_mla(target, torch.tensor(req.locs(req.S)))
                write_mha(draft, req.prefix)  # write_target_hidden_kv: the committed context
            write_mla(target, req.window)
            if draft_backend == "triton":  # the block's own tokens, through the draft backend's forward
                write_mha_triton(draft, block, torch.arange(req.S, req.S + len(block)))
            else:
                write_mha(draft, block)

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


# ---------------------------------------------------------------- all cases, the JSON, the doc


TARGET_BACKENDS = ("flashinfer_mla", "fa3")  # --attention-backend flashinfer / fa3 on the MLA target


def cases() -> list[tuple]:
    """(algorithm, --speculative-draft-attention-backend, target backend), each at every dcp, as rank 0 and the last
    rank; None: the flag left unset (NEXTN's draft runs the target's backend; DSPARK's resolves to the release
    default). The fa3 target runs with the draft flag unset."""
    return ([("NEXTN", None, "flashinfer_mla")] + [("DSPARK", b, "flashinfer_mla") for b in DSPARK_DRAFT_BACKENDS]
            + [(a, None, "flashinfer_mla") for a in EXTERNAL_DRAFTS]
            + [("NEXTN", None, "fa3"), ("DSPARK", None, "fa3")])


# External dense drafts (LlamaForCausalLMEagle / LlamaForCausalLMEagle3): tools/passmap/eagle.py
EXTERNAL_DRAFTS = ("EAGLE", "EAGLE3")


def external_draft_case(algorithm: str, dcp: int, rank: int):
    # One harness module, whether this file runs as a script or is imported: eagle imports passmap.generate.
    sys.modules.setdefault("passmap.generate", sys.modules[__name__])
    from passmap import eagle as passmap_eagle

    return passmap_eagle.eagle_case(algorithm, dcp, rank)


def plain_module():
    """tools/passmap/plain.py: the non-speculative passes (one harness module, as for passmap_eagle)."""
    sys.modules.setdefault("passmap.generate", sys.modules[__name__])
    from passmap import plain as passmap_plain

    return passmap_plain


DEFAULT_RESOLVER = "sglang.srt.arg_groups.speculative_hook._resolve_dflash_draft_attention_backend"


@functools.cache
def default_draft_backend(target_backend: str = "flashinfer_mla") -> str:
    """What the release resolves DSPARK's draft backend to with the flag unset, on CUDA, for this map's target
    (attention backend flashinfer_mla): ``_handle_dspark`` calls ``_resolve_dflash_draft_attention_backend``, run
    here with the server args' resolution views standing in (the target's backends as ``attention_backends_of``
    reports them)."""
    from unittest import mock

    from sglang.srt.arg_groups import overrides
    from sglang.srt.arg_groups import speculative_hook as sh

    args = SimpleNamespace(speculative_draft_attention_backend=None)
    backends = lambda view: (target_backend, target_backend)  # noqa: E731
    same = lambda a: a  # noqa: E731
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(overrides, "attention_backends_of", backends))
        stack.enter_context(mock.patch.object(overrides, "resolved_view", same))
        for name, value in (("attention_backends_of", backends), ("resolved_view", same), ("resolving_view", same),
                            ("declare_resolution", lambda a, who, **kw: vars(a).update(kw))):
            if hasattr(sh, name):
                stack.enter_context(mock.patch.object(sh, name, value))
        sh._resolve_dflash_draft_attention_backend(args)
    return args.speculative_draft_attention_backend


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


def set_up_failed(algorithm, flag, dcp, rank, exc, target_backend: str = "flashinfer_mla") -> tuple[Case, dict]:
    kind = "mla" if algorithm == "NEXTN" else "mha"
    draft_class = {"NEXTN": "DeepseekV3ForCausalLMNextN", "EAGLE": "LlamaForCausalLMEagle",
                   "EAGLE3": "LlamaForCausalLMEagle3"}.get(algorithm, "DSparkDraftModel")
    if algorithm == "NEXTN":
        backend = target_backend
    elif algorithm in EXTERNAL_DRAFTS:
        backend = "flashinfer"
    else:
        try:
            backend = flag if flag is not None else default_draft_backend(target_backend)
        except Exception:
            backend = flag
    case = Case(algorithm, draft_class, kind, target_backend, backend, dcp, rank, draft_backend_flag=flag)
    r = raised(exc)
    msg = {"verdict": "not-run", "detail": f"the harness could not build this release's pools/backends on CPU: "
           f"{r['detail']}", "where": "tools/passmap/generate.py (set-up)"}
    return case, {p: dict(msg, after_hicache={"verdict": "not-run", "detail": msg["detail"]}) for p in PASSES}


# ---------------------------------------------------------------- probes: launches refused before any pass runs

REGISTRY = "sglang.srt.layers.attention.attention_registry"


def probe_trtllm_mla_target(dcp: int = 8) -> dict:
    """``--attention-backend trtllm_mla`` on the MLA target, speculative decoding on, at ``dcp``: the release's own
    backend factory (``ATTENTION_BACKENDS["trtllm_mla"]``), with the decode backend it resolves standing in for
    the resolved server args. (At dcp 1 the check must let it through: the probe's own control.)"""
    import importlib
    from unittest import mock

    from sglang.srt.runtime_context import get_spec

    reg = importlib.import_module(REGISTRY)
    # 0.5.18 asks the server args themselves (speculative_algorithm, get_attention_backends())
    # (0.5.17 reads dcp_size off them too; later releases the runtime context)
    args = SimpleNamespace(speculative_algorithm="EAGLE", get_attention_backends=lambda: ("trtllm_mla", "trtllm_mla"),
                           dcp_size=dcp)
    runner = SimpleNamespace(use_mla_backend=True, server_args=args)
    out = {"probe": f"--attention-backend trtllm_mla on the MLA target, speculative decoding, dcp {dcp}",
           "where": f"{REGISTRY}.create_trtllm_mla_backend (ATTENTION_BACKENDS['trtllm_mla'])"}
    with on_rank(dcp, 0), get_spec().override(speculative_algorithm="EAGLE"), contextlib.ExitStack() as stack:
        for name, value in (("attention_backends_of", lambda view: ("trtllm_mla", "trtllm_mla")),
                            ("resolved_view", lambda a: a)):
            if hasattr(reg, name):
                stack.enter_context(mock.patch.object(reg, name, value))
        try:
            reg.ATTENTION_BACKENDS["trtllm_mla"](runner)
        except ValueError as exc:
            return dict(out, verdict="not-admitted", detail=f"ValueError: {exc}")
        except Exception as exc:  # past the check: building the backend itself needs the GPU
            return dict(out, verdict="not-run", detail=f"the factory admits it; building it here stopped at "
                        f"{raised(exc)['detail']}")
    return dict(out, verdict="not-run", detail="the factory admits it; its passes are not mapped")


def probe_flashinfer_mla_topk() -> dict:
    """``--speculative-eagle-topk 2`` with a flashinfer-MLA draft: the release's own multi-step draft backend."""
    import importlib

    fmb = importlib.import_module(FMB)
    out = {"probe": "--speculative-eagle-topk 2 with a flashinfer-MLA draft (NEXTN)",
           "where": f"{FMB}.FlashInferMLAMultiStepDraftBackend.__init__"}
    try:
        fmb.FlashInferMLAMultiStepDraftBackend(SimpleNamespace(), topk=2, speculative_num_steps=STEPS)
    except ValueError as exc:
        return dict(out, verdict="not-admitted", detail=f"ValueError: {exc}")
    except Exception as exc:
        return dict(out, verdict="not-run", detail=f"topk 2 passes the check; building it here stopped at "
                    f"{raised(exc)['detail']}")
    return dict(out, verdict="not-run", detail="topk 2 is admitted; its passes are not mapped")


def probes() -> list[dict]:
    records = []
    for probe in (probe_trtllm_mla_target, probe_flashinfer_mla_topk):
        try:
            r = probe()
        except Exception as exc:  # the release lacks what the probe drives
            r = {"probe": probe.__name__, "where": "tools/passmap/generate.py", "verdict": "not-run",
                 "detail": f"the harness could not run this probe: {raised(exc)['detail']}"}
        records.append(dict(r, release=release()))
    return records


def measure(dcp_sizes=DCP_SIZES, only: list | None = None) -> list[dict]:
    records = []
    for algorithm, backend, *rest in (only or cases()):
        target = rest[0] if rest else "flashinfer_mla"
        for dcp in dcp_sizes:
            for rank in sorted({0, dcp - 1}):
                try:
                    if algorithm == "NEXTN":
                        case, passes = nextn_case(dcp, rank) if target == "flashinfer_mla" else nextn_fa3_case(dcp, rank)
                    elif algorithm in EXTERNAL_DRAFTS:
                        case, passes = external_draft_case(algorithm, dcp, rank)
                    else:
                        case, passes = dspark_case(backend, dcp, rank, target)
                except Exception as exc:  # the release lacks an API the harness drives
                    case, passes = set_up_failed(algorithm, backend, dcp, rank, exc, target)
                records.append(case.record({p: passes[p] for p in PASSES}))
    return records


def sort_key(c: dict) -> tuple:
    return (tuple(int(x) for x in c["release"].split(".")[:3]), c["target_backend"] != "flashinfer_mla",
            c["target_backend"], c["algorithm"], c.get("draft_backend_flag") or "",
            c["draft_backend"] or "", c["dcp"], c["rank"])


def merge(old: dict | None, records: list[dict], probe_records: list[dict], rel: str,
          plain_records: list[dict] = ()) -> dict:
    plain = plain_module()
    kept = [c for c in (old or {}).get("cases", []) if c["release"] != rel]
    kept_probes = [r for r in (old or {}).get("probes", []) if r["release"] != rel]
    kept_plain = [r for r in (old or {}).get("plain", []) if r["release"] != rel]
    return {"generated_by": GENERATED_BY, "passes": list(PASSES), "plain_passes": list(plain.PLAIN_PASSES),
            "cases": sorted(kept + records, key=sort_key), "probes": sorted(kept_probes + probe_records, key=probe_key),
            "plain": sorted(kept_plain + list(plain_records), key=plain.sort_key),
            "verify_fixed": (old or {}).get("verify_fixed", [])}


# ---------------------------------------------------------------- the verify with the fix (upstream-next 0012)

# Who carries the per-draft-token verify on flashinfer MLA: the plugin's hooks on stock sglang, or the series.
FIXES = ("plugin", "upstream-next")
VERIFY_PASSES = ("TARGET_VERIFY_GRAPH", "TARGET_VERIFY_EAGER")
PLAN_HOOK = f"{FMB}.FlashInferMLAAttnBackend.init_forward_metadata"
# The kernel check each carrier runs before its first verify under DCP: the map runs no kernel (its wrappers record
# what they are handed), so the check is left to tools/mla/verify_dcp.py, which runs the oracle.
KERNEL_CHECKS = (("sglang_dcp_dspark.plugin.kernel_check", "ensure"),
                 ("sglang.srt.layers.dcp.split_verify", "ensure_dcp_verify_kernel_checked"))


@contextlib.contextmanager
def verify_fix(name: str) -> Iterator[None]:
    """The fix in effect: the plugin's flashinfer MLA hooks, applied through its hook table as the plugin applies
    them (and only where they judge this release's code needs them), or the series' own code on this tree; the
    carriers' kernel checks off (``KERNEL_CHECKS``)."""
    import importlib

    from sglang_dcp_dspark.core import swap

    with contextlib.ExitStack() as stack:
        for module_name, attr in KERNEL_CHECKS:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            if hasattr(module, attr):
                stack.enter_context(swap.attribute(module, attr, lambda *args, **kwargs: None))
        if name == "plugin":
            from sglang_dcp_dspark.plugin import hooks

            findings = stack.enter_context(hooks.in_effect(FMB))
            found = findings.get(PLAN_HOOK)
            if found is None or found.verdict.name != "NEEDS_FIX":
                raise SystemExit(f"error: the plugin's verify hooks do not apply to sglang {release()} "
                                 f"({found.detail if found else 'no flashinfer MLA backend'}); fix: run --fix plugin on "
                                 "a stock 0.5.22 or 0.5.23 tree (PYTHONPATH=build/trees/sglang-0.5.23)")
        elif name == "upstream-next":
            if not hasattr(importlib.import_module(FMB), "plan_dcp_split_verify"):
                raise SystemExit("error: this tree does not carry upstream-next 0012; fix: "
                                 "PYTHONPATH=build/trees/sglang-0.5.23-next (make next-trees)")
        else:
            raise SystemExit(f"error: --fix {name}: expected one of {', '.join(FIXES)}")
        yield


def fixed_records(fix: str) -> list[dict]:
    """The flashinfer MLA cases' verify readings with ``fix`` in effect (every other pass is untouched by it)."""
    with verify_fix(fix):
        records = measure(dcp_sizes=tuple(n for n in DCP_SIZES if n > 1),
                          only=[c for c in cases() if c[2] == "flashinfer_mla"])
    # Only under DCP (measured above): at dcp 1 nothing is planned split, and the judge reads dcp > 1 alone.
    return [{"release": r["release"], "fix": fix, "algorithm": r["algorithm"], "draft_class": r["draft_class"],
             "draft_backend_flag": r["draft_backend_flag"], "dcp": r["dcp"], "rank": r["rank"],
             "passes": {p: {**r["passes"][p], "where": fixed_where(fix, p, r["passes"][p].get("where", ""))}
                        for p in VERIFY_PASSES}} for r in records if r["dcp"] > 1]


def fixed_where(fix: str, name: str, stock: str) -> str:
    """The path the verify takes with ``fix`` in effect, which the stock case's ``where`` does not describe: the
    split plan from the hooked (or patched) metadata entry down to the two wrappers' plans. The plan the batch is
    bound to (the ``[plan: ...]`` tail) stays the stock case's."""
    plan = stock[stock.rindex(" [plan: "):] if " [plan: " in stock else ""
    entry = (f"{FMB}.FlashInferMLAAttnBackend.init_cuda_graph_state -> init_forward_metadata_out_graph(in_capture=True)"
             " -> replay: init_forward_metadata_out_graph" if name == "TARGET_VERIFY_GRAPH"
             else "sglang.srt.model_executor.runner.eager_runner -> "
                  f"{FMB}.FlashInferMLAAttnBackend.init_forward_metadata")
    if fix == "plugin":
        body = (" (the plugin's AROUND hook) -> sglang_dcp_dspark.plugin.hooks.flashinfer_mla_backend."
                "plan_split_verify -> dcp_verify.plan_split (host lengths) and dcp_verify.build_ids")
    else:
        body = (" -> FlashInferMLAAttnBackend._plan_dcp_split_verify -> sglang.srt.layers.dcp.split_verify."
                "plan_dcp_split_verify (host lengths) and build_dcp_split_verify_ids")
    return (entry + body + " (sglang.kernels.ops.attention.dcp_kernels.create_triton_kv_indices_for_dcp_triton over "
            "req_to_token) -> the prefix wrapper's plan (a row per request) and the window wrapper's (a row per draft "
            "token)" + plan)


def fixed_key(r: dict) -> tuple:
    return (tuple(int(x) for x in r["release"].split(".")[:3]), r["fix"], r["algorithm"],
            r.get("draft_backend_flag") or "", r["dcp"], r["rank"])


def fixed_markdown(records: list[dict]) -> list[str]:
    """The verify with the fix, per launch kind: worst over the ranks and dcp sizes run."""
    out = ["### The verify planned split (upstream-next 0012, the plugin's flashinfer MLA hooks)", "",
           "TARGET_VERIFY on flashinfer MLA with the fix in effect (worst over dcp 2, 4, 8, first and last rank; "
           f"`{GENERATED_FIX}`). The numbers behind it: docs/verify-under-dcp.md.", "",
           "| sglang | fix | algorithm | draft-backend flag | " + " | ".join(VERIFY_PASSES) + " |",
           "|---|---|---|---|---|---|"]
    groups: dict = {}
    for r in records:
        if r["dcp"] > 1:
            groups.setdefault((r["release"], r["fix"], r["algorithm"], r.get("draft_backend_flag")), []).append(r)
    for (rel, fix, algorithm, flag), rows in groups.items():
        out.append(f"| {rel} | {fix} | {algorithm} | {flag or 'default'} | "
                   + " | ".join(worst_cell([r["passes"][p] for r in rows]) for p in VERIFY_PASSES) + " |")
    return out + [""]


GENERATED_FIX = ("python tools/passmap/generate.py --fix plugin --write (stock 0.5.22 and 0.5.23), --fix upstream-next "
                 "--write (0.5.23 + upstream-next)")


def probe_key(r: dict) -> tuple:
    return tuple(int(x) for x in r["release"].split(".")[:3]), r["probe"]


def load() -> dict | None:
    return json.loads(DATA.read_text(encoding="utf-8")) if DATA.exists() else None


def cell(p: dict) -> str:
    v, hc = p["verdict"], p.get("after_hicache", {}).get("verdict", "?")
    return v if hc == v else f"{v} / after HiCache: {hc}"


def flag_name(c: dict) -> str:
    flag = c.get("draft_backend_flag")
    return f"{flag}" if flag else f"default ({c['draft_backend']})"


SEVERITY = {"raises": 0, "wrong-rows": 1, "not-admitted": 2, "consistent": 3, "not-run": 4}


def worst_cell(ps: list[dict]) -> str:
    v = min((p["verdict"] for p in ps), key=SEVERITY.get)
    h = min((p.get("after_hicache", p)["verdict"] for p in ps), key=SEVERITY.get)
    return v if v == h else f"{v} / after HiCache: {h}"


def markdown(data: dict) -> str:
    out = []
    releases = sorted({c["release"] for c in data["cases"]}, key=lambda r: tuple(int(x) for x in r.split(".")[:3]))
    for rel in releases:
        rows = [c for c in data["cases"] if c["release"] == rel]
        out += [f"### sglang {rel}", "", "Summary (worst over the ranks run; NEXTN and DSPARK at dcp 1 and 8):", "",
                "| algorithm | target backend | draft-backend flag (backend) | dcp | " + " | ".join(PASSES) + " |",
                "|---|---|---|---|" + "---|" * len(PASSES)]
        for c in rows:
            if c["rank"] != 0 or c["dcp"] not in (1, 8):
                continue
            peers = [d for d in rows if (d["algorithm"], d["target_backend"], d.get("draft_backend_flag"), d["dcp"])
                     == (c["algorithm"], c["target_backend"], c.get("draft_backend_flag"), c["dcp"])]
            out.append(f"| {c['algorithm']} | {c['target_backend']} | {flag_name(c)} | {c['dcp']} | "
                       + " | ".join(worst_cell([d["passes"][p] for d in peers]) for p in PASSES) + " |")
        plain_rows = [r for r in data.get("plain", []) if r["release"] == rel]
        if plain_rows:
            out += ["", *plain_module().markdown(plain_rows)]
        probe_rows = [r for r in data.get("probes", []) if r["release"] == rel]
        if probe_rows:
            out += ["", "Launches refused before any pass runs (probes):", "", "| launch | verdict | detail | where |",
                    "|---|---|---|---|"]
            out += [f"| {r['probe']} | {r['verdict']} | {r['detail']} | `{r['where']}` |" for r in probe_rows]
        out += ["", "| algorithm | draft (kind) | target / draft backend (flag) | dcp | rank | "
                + " | ".join(PASSES) + " |", "|---|---|---|---|---|" + "---|" * len(PASSES)]
        for c in rows:
            out.append(f"| {c['algorithm']} | {c['draft_class']} ({c['draft_kind']}) | {c['target_backend']} / "
                       f"{flag_name(c)} | {c['dcp']} | {c['rank']} | "
                       + " | ".join(cell(c["passes"][p]) for p in PASSES) + " |")
        out += ["", "Details (the largest dcp, last rank, of each case):", ""]
        seen = set()
        for c in reversed(rows):
            k = (c["algorithm"], c["target_backend"], c.get("draft_backend_flag"))
            if k in seen:
                continue
            seen.add(k)
            out.append(f"- {c['algorithm']} / target {c['target_backend']} / {flag_name(c)}, dcp {c['dcp']} "
                       f"rank {c['rank']}:")
            for p in PASSES:
                q = c["passes"][p]
                out.append(f"  - {p}: **{q['verdict']}**: {q['detail']} (after HiCache: "
                           f"{q['after_hicache']['verdict']}: {q['after_hicache']['detail']}). Where: `{q['where']}`")
        out.append("")
    if data.get("verify_fixed"):
        out += fixed_markdown(sorted(data["verify_fixed"], key=fixed_key))
    return "\n".join(out).rstrip() + "\n"


def write_doc(data: dict) -> None:
    text = DOC.read_text(encoding="utf-8") if DOC.exists() else f"# Speculative passes under DCP\n\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{markdown(data)}{END}{tail}", encoding="utf-8")


def committed_for(rel: str) -> list[dict]:
    return [c for c in (load() or {}).get("cases", []) if c["release"] == rel]


def committed_probes_for(rel: str) -> list[dict]:
    return [r for r in (load() or {}).get("probes", []) if r["release"] == rel]


def fresh(records: list[dict], probe_records: list[dict], rel: str, plain_records: list[dict] = ()) -> bool:
    key = plain_module().sort_key
    committed_plain = [r for r in (load() or {}).get("plain", []) if r["release"] == rel]
    return (sorted(records, key=sort_key) == sorted(committed_for(rel), key=sort_key)
            and sorted(probe_records, key=probe_key) == sorted(committed_probes_for(rel), key=probe_key)
            and sorted(plain_records, key=key) == sorted(committed_plain, key=key))


def prepare() -> None:
    """Before sglang is imported: Triton's interpreter (its kernels are decorated at import), quiet logs."""
    os.environ["TRITON_INTERPRET"] = "1"
    # The flashinfer/trtllm workspace is the kernels' scratch (512 MiB by default, zero-filled for trtllm_mha); only
    # the metadata builders run here, so each backend object gets a small one.
    os.environ.setdefault("SGLANG_FLASHINFER_WORKSPACE_SIZE", str(1 << 20))
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)


CONTROLS = ("shift-write", "no-translate", "shift-mha-write", "no-lse")
# The cases each control runs (at dcp 2 and 8): NEXTN's MLA passes, or DSPARK's dense draft block on the backend
# objects the harness builds (the default flashinfer, and trtllm_mha).
CONTROL_CASES = {"shift-write": [("NEXTN", None)], "no-translate": [("NEXTN", None)],
                 "shift-mha-write": [("DSPARK", None), ("DSPARK", "trtllm_mha")], "no-lse": []}
# The plain (non-speculative) target each control runs too: flashinfer MLA, whose map reads consistent.
PLAIN_CONTROLS = ("shift-write", "no-lse")


@contextlib.contextmanager
def control(name: str) -> Iterator[None]:
    """Negative controls: a one-row shift in the MLA write door, or no DCP read translation in the eager decode
    (``KVIndexTranslator.translate_dcp_read_ids`` an identity from 0.5.20 on; before that, where the decode's only DCP
    read step is ``planner.plan_dcp_decode_metadata``, that step a no-op)."""
    saved = {}
    this = sys.modules[__name__]
    if name == "shift-write":
        real = this.write_mla

        def shifted(pool, locs):  # each loc's tag lands one physical row further (loc + dcp -> row + 1)
            import torch
            from sglang.srt.runtime_context import get_parallel

            n = max(1, get_parallel().attn_dcp_size)
            pool.set_mla_kv_buffer(LAYER, this.mla_loc(pool, locs + n), *tag_values("mla", locs))
            _ = (real, torch)

        saved["write_mla"] = real
        this.write_mla = shifted
    elif name == "shift-mha-write":  # each loc's tag one row further in the dense draft's replicated pool
        import torch

        def shifted_mha(pool, locs):
            locs = torch.as_tensor(locs)
            pool.set_kv_buffer(LAYER, this.write_loc(locs + 1), *tag_values("mha", locs, pool.head_num, pool.head_dim))

        saved["write_mha"] = this.write_mha
        this.write_mha = shifted_mha
    elif name == "no-translate":
        try:
            from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
        except ImportError:  # no translator in this release: nothing to remove
            KVIndexTranslator = None
        if KVIndexTranslator is not None and hasattr(KVIndexTranslator, "translate_dcp_read_ids"):  # 0.5.20 on
            saved["translate"] = KVIndexTranslator.translate_dcp_read_ids
            KVIndexTranslator.translate_dcp_read_ids = lambda self, ids: ids
        else:  # 0.5.18/0.5.19: the decode's DCP read translation is plan_dcp_decode_metadata (share + loc // N)
            import importlib

            fmb = importlib.import_module(FMB)
            saved["plan_dcp"] = fmb.plan_dcp_decode_metadata
            fmb.plan_dcp_decode_metadata = lambda *args, **kwargs: None
    elif name == "no-lse":  # the flashinfer MLA decode kernel answers without the LSE the backend asked for
        plain = plain_module()
        saved["run"] = plain.LseWrapper.run
        plain.LseWrapper.run = lambda self, q_nope, *args, out=None, **kwargs: (q_nope if out is None else out)
    else:
        raise ValueError(name)
    try:
        yield
    finally:
        if "write_mla" in saved:
            this.write_mla = saved["write_mla"]
        if "write_mha" in saved:
            this.write_mha = saved["write_mha"]
        if "translate" in saved:
            from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator

            KVIndexTranslator.translate_dcp_read_ids = saved["translate"]
        if "run" in saved:
            plain_module().LseWrapper.run = saved["run"]
        if "plan_dcp" in saved:
            import importlib

            importlib.import_module(FMB).plan_dcp_decode_metadata = saved["plan_dcp"]


def main(argv: list[str]) -> int:
    prepare()
    if "--fix" in argv:  # the verify with the fix in effect: written under "verify_fixed", or checked against it
        fix = argv[argv.index("--fix") + 1]
        records, rel = fixed_records(fix), release()
        data = load() or {}
        kept = [r for r in data.get("verify_fixed", []) if (r["release"], r["fix"]) != (rel, fix)]
        committed = sorted([r for r in data.get("verify_fixed", []) if (r["release"], r["fix"]) == (rel, fix)],
                           key=fixed_key)
        if "--json" in argv:
            print(json.dumps({"release": rel, "fix": fix, "verify_fixed": records, "matches": committed == sorted(
                records, key=fixed_key)}))
            return 0
        if "--check" in argv:
            ok = committed == sorted(records, key=fixed_key)
            print(f"sglang {rel} with {fix}: {'matches' if ok else 'DIFFERS FROM'} {DATA.relative_to(REPO)}")
            return 0 if ok else 1
        data["verify_fixed"] = sorted(kept + records, key=fixed_key)
        if "--write" in argv:
            write_data(data)
        print("\n".join(fixed_markdown(data["verify_fixed"])))
        return 0
    if "--control" in argv:  # negative controls (comma-separated) on NEXTN at dcp 2 and 8: {name: records}
        out, plain_out = {}, {}
        for name in argv[argv.index("--control") + 1].split(","):
            with control(name):
                out[name] = measure(dcp_sizes=(2, 8), only=CONTROL_CASES[name]) if CONTROL_CASES[name] else []
                if name in PLAIN_CONTROLS:
                    plain = plain_module()
                    plain_out[name] = [plain.plain_case("flashinfer_mla", dcp, rank) for dcp in (2, 8)
                                       for rank in (0, dcp - 1)]
        result = {"release": release(), "controls": out, "plain_controls": plain_out,
                  "probe_control": probe_trtllm_mla_target(dcp=1)}
        if "--check" in argv:  # the freshness check in the same process (one sglang import for both)
            result["check"] = fresh(measure(), probes(), release(), plain_module().measure())
        print(json.dumps(result))
        return 0
    records, probe_records, plain_records = measure(), probes(), plain_module().measure()
    rel = release()
    if "--json" in argv:
        print(json.dumps({"cases": records, "probes": probe_records, "plain": plain_records}, indent=1))
        return 0
    if "--check" in argv:
        ok = fresh(records, probe_records, rel, plain_records)
        print(f"sglang {rel}: {'matches' if ok else 'DIFFERS FROM'} {DATA.relative_to(REPO)}")
        return 0 if ok else 1
    data = merge(load(), records, probe_records, rel, plain_records)
    if "--write" in argv:
        write_data(data)
    print(markdown({"cases": records, "probes": probe_records, "plain": plain_records}))
    return 0


def write_data(data: dict) -> None:
    """The full map, the package's per-release tables compacted from it, and the document."""
    from passmap import compact

    DATA.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    compact.write(DATA)
    write_doc(data)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
