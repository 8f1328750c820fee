"""The pass map's shared machinery: what every case module (``nextn``, ``fa3``, ``dspark``, ``eagle``, ``plain``)
builds its passes from.

The GPU stand-ins (flashinfer wrapper recorders, CPU tensors for ``cuda``), the tags and the judge, sglang's
context per DCP rank, the request, the passes' forward batches and the iteration's ``KVLocPlan``, the pools and
the write doors (each release's own ``KVCacheConfigurator``), and the HiCache round trip. The package's docstring
(``emulation.passmap``) says what the map measures and how.

The write doors ``write_mla`` and ``write_mha`` are called through this module (``harness.write_mla(...)``, never
imported by name): the negative controls (``controls.py``) swap them here, and every caller must see the swap.
"""

from __future__ import annotations

import contextlib
import functools
import os
import traceback
from collections.abc import Callable, Iterator
from types import SimpleNamespace

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


# ---------------------------------------------------------------- verdicts

# wrong-output: each query reads the rows it should, yet the merged attention is off (Blackwell's kernel rows).
SEVERITY = {"raises": 0, "wrong-rows": 1, "wrong-output": 2, "not-admitted": 3, "consistent": 4, "not-run": 5}


def worse_of(forms: dict) -> dict:
    """One verdict for a pass run in several forms: the worst one run (SEVERITY), each form's in the detail."""
    ran = {k: v for k, v in forms.items() if v["verdict"] != "not-run"} or forms
    verdict = min((v["verdict"] for v in ran.values()), key=lambda x: SEVERITY[x])
    return {"verdict": verdict, "detail": "; ".join(f"{k}: {v['detail']}" for k, v in forms.items())}


def worst_cell(ps: list[dict]) -> str:
    v = min((p["verdict"] for p in ps), key=SEVERITY.get)
    h = min((p.get("after_hicache", p)["verdict"] for p in ps), key=SEVERITY.get)
    return v if v == h else f"{v} / after HiCache: {h}"


# ---------------------------------------------------------------- sglang context per rank


def prepare() -> None:
    """Before sglang is imported: Triton's interpreter (its kernels are decorated at import), quiet logs."""
    os.environ["TRITON_INTERPRET"] = "1"
    # A kernel launch the run already interpreted with the same inputs replays its writes (emulation.triton_memo).
    from emulation import imports, triton_memo

    triton_memo.install()
    # Under make test: which sglang files this process imported, for tools/suite.py's report (emulation.imports).
    imports.write_at_exit()
    # The flashinfer/trtllm workspace is the kernels' scratch (512 MiB by default, zero-filled for trtllm_mha); only
    # the metadata builders run here, so each backend object gets a small one.
    os.environ.setdefault("SGLANG_FLASHINFER_WORKSPACE_SIZE", str(1 << 20))
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)


def release() -> str:
    import sglang

    return sglang.__version__


def source(obj) -> str:
    import inspect

    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


@contextlib.contextmanager
def on_rank(dcp: int, rank: int):
    """sglang's runtime context for one DCP rank (layouts.on_rank) plus the GPU stand-ins."""
    from sglang.srt.runtime_context import get_parallel

    from emulation.datapath import layouts

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


# ---------------------------------------------------------------- the passes' batches (the same on every backend)


def eagle_draft_input(bs: int = 1):
    import torch
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    spec = EagleDraftInput(topk_p=torch.ones(bs, 1), topk_index=torch.zeros(bs, 1, dtype=torch.long),
                           hidden_states=torch.zeros(bs, 8))
    spec.num_tokens_per_req = DRAFT_TOKENS
    spec.num_correct_drafts = torch.full((bs,), DRAFT_TOKENS - 1, dtype=torch.int32)
    return spec


def draft_decode_batch(req, *, seq_len: int | None = None, out_cache_loc=None):
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    n = req.S if seq_len is None else seq_len
    return fb(forward_mode=ForwardMode.DECODE, **seqs(n), positions=torch.tensor([n]),
              input_ids=torch.zeros(1, dtype=torch.long), spec_info=eagle_draft_input(),
              out_cache_loc=out_cache_loc)


def live_draft_decode_batch(req, tr_d, tr_t):
    """The draft-decode batch ``prepare_for_draft`` builds: the worker's window plan, columns [0, num_steps)."""
    b = draft_decode_batch(req)
    plan, where = eagle_window_plan(tr_t, req)
    bind_plan(plan, b, tr_d, cols=slice(0, STEPS))
    return b, plan, where


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


def judge_steps(pool, wrappers, req, striped, dcp, rank, *, kind: str = "mla") -> dict:
    """Each step's wrapper read against what that step attends to."""
    return steps_verdict([judge(kind, pool, w.kernel_ids(), step_want(req, i, striped, dcp, rank))
                          for i, w in enumerate(wrappers)])


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


def verify_plan(algorithm, req, tr_t):
    return dspark_window_plan(tr_t, req) if algorithm == "DSPARK" else eagle_window_plan(tr_t, req)


def verify_batch(req, spec, *, seq_len=None, out_cache_loc=None):
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    n = req.S if seq_len is None else seq_len
    # A verify ForwardBatch carries extend_prefix_lens=None: ForwardBatch.init_new sets it only for extend modes
    # other than TARGET_VERIFY, so the eager runner builds no attn_dcp_metadata for it.
    return fb(forward_mode=ForwardMode.TARGET_VERIFY, **seqs(n), spec_info=spec,
              positions=torch.arange(n, n + DRAFT_TOKENS), out_cache_loc=out_cache_loc)


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


def configurator(launch, *, draft: bool, layers: int, architecture: str):
    """This release's ``KVCacheConfigurator``, with only the fields its pool builders read set by hand, and only
    those the release's class has (``kv_shard_rank`` / ``kv_shard_spec`` / ``kv_shard_group`` are 0.5.22's; 0.5.21
    has ``attn_dp_size`` / ``pp_size``, 0.5.18-0.5.20 ``ps``). Its own ``loc_space_scale``, ``pool_page_size``,
    ``_derive_pool_sizes`` and ``_build_token_to_kv_pool`` then decide the pool, as the release builds it."""
    import torch
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator

    from emulation.datapath import layouts

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
    if isinstance(scale, property) and "self.server_args" in source(scale.fget):
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
    from emulation.datapath import layouts

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

    from emulation.datapath import layouts

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

    from emulation.datapath import layouts

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

    from emulation.datapath import layouts

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
