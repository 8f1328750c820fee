"""Where each speculative draft's KV lies under DCP on sglang 0.5.23, and whether HiCache moves those rows.

For every draft layout (NEXTN, EAGLE3, EAGLE with an external MLA or MHA
draft, DSPARK) at dcp 1, 2, 4 and 8, this probe asks sglang's own code, on
CPU with small pools:

1. the HiCache draft plan: ``BaseSpecWorker._build_hicache_draft_plan`` on
   stand-ins for the workers (``releases.draft_plan``);
2. the draft device pool: ``KVCacheConfigurator`` itself (``loc_space_scale``,
   ``pool_page_size``, ``_derive_pool_sizes``, ``_build_token_to_kv_pool``) on
   an instance whose fields are set by hand, for a draft worker;
3. the draft's device layout, measured: known bytes are written for a set of
   logical locs through the write path the draft's forward takes (the pool's
   own door, or the attention backend's method that calls it), as rank 0 and
   as the last rank, and the buffers are then read directly; the read path
   the draft's attention takes is run too and compared with what was written;
4. the host pool that holds the draft: ``build_kv_only_stack`` with
   ``mtp_draft_device_pools`` (PACKED) or ``build_hicache_draft_sidecars``
   (SIDECAR), inside the runtime context of that rank;
5. a backup and a load-back to other locs through the controller's own
   pieces (``HybridCacheController._l2_transfers`` / ``_l2_load_transfers`` /
   ``_resolve_device_transfers``, ``HostPoolGroup.resolve_host_transfers``,
   ``L2TransferEngine``), logging the device rows each draft copy read or
   wrote, and the read path run again at the new locs: the verdict.

A counterfactual launch rebuilds the NextN draft pool with
``dcp_replicated=True`` (which 0.5.23 sets only for a DSA draft), to show
what a fix that replicates the draft instead of translating its indices meets.
DSPARK is measured with the dense draft sglang ships (``DSparkDraftModel``,
the geometry of ``data/kimi-k3-dspark-draft``); its write door is
``set_kv_buffer``, the one ``write_target_hidden_kv`` takes.

Why the write and read paths are called rather than assumed: under DCP a
draft pool is sized over the widened logical loc space (``loc_space_scale``),
yet whether a rank stores loc L at row L (replicated) or at row L // N
(striped, like the target) is decided by the write door the forward uses, and
HiCache's indices are right only for one of the two.

What could not be sglang's: the CUDA transfer ops (``sgl_kernel.kvcacheio``)
are the data-path harness's reference ops (``substitutions.py``), and the
Triton kernels on the paths (the DCP-masked MHA write, the DCP read-index
kernels) run in Triton's interpreter (``TRITON_INTERPRET=1``, set before
sglang is imported). The MLA write takes sglang's own torch scatter
(``set_mla_kv_buffer_naive``), which sglang dispatches to on a platform
without Triton.

Usage: PYTHONPATH=build/trees/sglang-0.5.23 python tools/emulation/datapath/layouts.py [--write | --json]
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "draft-layouts.md"
COMMAND = "PYTHONPATH=build/trees/sglang-0.5.23 python tools/emulation/datapath/layouts.py"
BEGIN, END = f"<!-- draft-layouts:begin ({COMMAND}) -->", "<!-- draft-layouts:end -->"
DATA = REPO / "python" / "sglang_dcp_dspark" / "preflight" / "data"

DCP_SIZES = (1, 2, 4, 8)
COUNTERFACTUAL_DCP = (2, 8)
# Small geometry: a rank's target device pool of PAGES pages of PAGE rows; the draft's is sized by sglang.
PAGE, PAGES = 4, 8
TARGET_LAYERS = 2
KV_LORA_RANK, QK_ROPE_HEAD_DIM = 16, 8
MHA_KV_HEADS, MHA_HEAD_DIM = 2, 8
# Logical pages (page * dcp tokens each) the probe writes, then loads back into; page 0 holds loc 0,
# the padded slot a MLA write drops (reserved_skip_index).
WRITE_PAGES, LOAD_PAGES = (1, 3), (5, 2)
IO_BACKEND, LAYOUT = "direct", "layer_first"

# The write and read paths, as the draft's forward takes them (file:function of sglang 0.5.23).
WRITE_PATHS = {
    "mla": "memory_pool.py::MLATokenToKVPool.set_mla_kv_buffer (the MLA door under DCP)",
    "mha-triton": "triton_backend.py::TritonAttnBackend._set_kv_buffer (loc // N, dcp_kv_mask)",
    "mha-plain": "memory_pool.py::MHATokenToKVPool.set_kv_buffer at out_cache_loc "
                 "(flashattention_backend.py / flashinfer_backend.py forward_*)",
}
READ_PATHS = {
    "mla": "kv_index_translator.py::KVIndexTranslator.pack_read_stream, dcp/planner.py::plan_dcp_decode_metadata, "
           "KVIndexTranslator.translate_dcp_read_ids (flashinfer_mla_backend.py)",
    "mha-triton": "triton_backend.py::TritonAttnBackend._dcp_kv_indices",
    "mha-plain": "kv_index_translator.py::KVIndexTranslator.read_source (req_to_token passthrough)",
}


def _config(name: str) -> dict:
    return json.loads((DATA / name / "config.json").read_text(encoding="utf-8"))


@dataclass(frozen=True)
class DraftLaunch:
    """One draft layout: what the plan and the configurator read, and the paths its forward takes."""

    label: str
    algorithm: str  # --speculative-algorithm as given; sglang's SpeculativeAlgorithm.from_string reads it
    kind: str  # "mla" or "mha": the draft's attention (use_mla_backend of its configurator)
    architecture: str  # the draft config's architectures[0]
    nextn_layers: int  # the draft config's num_nextn_predict_layers (0: absent)
    path: str  # key of WRITE_PATHS / READ_PATHS
    source: str  # where the config fields come from
    # Counterfactual: the draft pool rebuilt with MLATokenToKVPool(dcp_replicated=True), which 0.5.23's
    # configurator sets only for a DSA draft (_build_dsa_kv_pool): what a "replicate the draft" fix would meet.
    replicated: bool = False
    dcp_sizes: tuple[int, ...] = DCP_SIZES


def launches() -> tuple[DraftLaunch, ...]:
    """The layouts of the brief; MHA drafts twice, since the attention backend picks their write door."""
    target, dspark = _config("deepseek-v3"), _config("kimi-k3-dspark-draft")
    nextn = int(target.get("num_nextn_predict_layers") or 0)
    stand_in = "stand-in config (no external draft is shipped)"
    return (
        DraftLaunch("NEXTN (MLA NextN layer)", "NEXTN", "mla", target["architectures"][0], nextn, "mla",
                    "data/deepseek-v3/config.json"),
        DraftLaunch("EAGLE3, Llama MHA draft, triton", "EAGLE3", "mha", "LlamaForCausalLMEagle3", 0, "mha-triton",
                    stand_in),
        DraftLaunch("EAGLE3, Llama MHA draft, fa3/flashinfer", "EAGLE3", "mha", "LlamaForCausalLMEagle3", 0,
                    "mha-plain", stand_in),
        DraftLaunch("EAGLE, external MLA draft", "EAGLE", "mla", "DeepseekV3ForCausalLM", 0, "mla", stand_in),
        DraftLaunch("EAGLE, external MHA draft, triton", "EAGLE", "mha", "LlamaForCausalLMEagle", 0, "mha-triton",
                    stand_in),
        DraftLaunch("EAGLE, external MHA draft, fa3/flashinfer", "EAGLE", "mha", "LlamaForCausalLMEagle", 0,
                    "mha-plain", stand_in),
        # Every DSPARK draft sglang ships is dense (DSparkDraftModel and its kin, built on DFlash).
        DraftLaunch("DSPARK, dense DSparkDraftModel, fa3/flashinfer", "DSPARK", "mha", dspark["architectures"][0], 0,
                    "mha-plain", "data/kimi-k3-dspark-draft/config.json"),
        DraftLaunch("counterfactual: NEXTN, draft pool dcp_replicated=True", "NEXTN", "mla", target["architectures"][0],
                    nextn, "mla", "data/deepseek-v3/config.json", replicated=True, dcp_sizes=COUNTERFACTUAL_DCP),
    )


# ---------------------------------------------------------------- results


@dataclass
class RankResult:
    """What one rank measured for one launch at one dcp."""

    rank: int
    layout: str = "?"  # "row = loc", "striped", "replicated", "raises: ..." or "other"
    read_ok: bool = False  # the read path returned the written bytes
    restored_ok: bool = False  # after backup + load-back to other locs, the rows the write path uses there hold them
    round_trip_ok: bool = False  # ... and the read path at those locs returns them
    locs: int = 0  # locs written (and backed up by the controller)
    backed_up: int = 0  # draft rows this rank's backup copied
    backup_device_rows: list[int] = field(default_factory=list)  # draft rows the backup read (first page)
    load_device_rows: list[int] = field(default_factory=list)  # draft rows the load-back wrote (first page)
    forward_rows: list[int] = field(default_factory=list)  # rows the forward wrote the backed-up locs to
    read_rows: list[int] = field(default_factory=list)  # rows the read path reads at the load-back locs
    load_layout_rows: list[int] = field(default_factory=list)  # rows the write layout puts the load-back locs at
    backup_indices: str = "?"  # "translated" (row s // N of owned s) or "untranslated" (row = slot / loc)
    mla_set_kv_buffer: str = ""  # MLA only: what the combined-row door does under this rank's DCP
    error: str | None = None


@dataclass
class Row:
    """One launch at one dcp: what sglang built (the same on every rank), and each end rank's measurements."""

    launch: str
    algorithm: str  # as sglang resolves it (SpeculativeAlgorithm)
    dcp: int
    gate: str  # resolve_hicache_dcp_compatibility's answer
    gate_fixed: str  # the same gate with the plugin's hook (upstream-next 0020 answers the same)
    plan: str
    pool_class: str
    pool_rows: int
    pool_page: int
    dcp_replicated: bool | None
    loc_space_scale: int
    host_pool: str
    host_rows: int
    host_logical: int
    host_dcp_size: int
    ranks: list[RankResult] = field(default_factory=list)

    @property
    def layout(self) -> str:
        found = sorted({r.layout for r in self.ranks})
        return found[0] if len(found) == 1 else " / ".join(r.layout for r in self.ranks)

    @property
    def fits(self) -> bool:
        return all(r.read_ok and r.restored_ok and r.round_trip_ok for r in self.ranks)


# ---------------------------------------------------------------- sglang on stand-ins


@contextlib.contextmanager
def on_rank(dcp: int, rank: int) -> Iterator[object]:
    """sglang's runtime context for one DCP rank, real CPU host buffers, the reference transfer ops (yielded).

    ``sidecar.on_rank`` publishes the rank as the project does (attn_dcp_size,
    attn_dcp_rank); the DCP read-index code reads ``dcp_size`` and ``dcp_rank``
    too (``layers/dcp/planner.py``), so those are stated as well.
    """
    from sglang.srt.runtime_context import get_parallel

    from emulation.datapath.substitutions import substituted
    from sglang_dcp_dspark.core import sidecar

    r = sidecar.Rank(
        dcp_size=dcp, dcp_rank=rank, device_rows=PAGE * PAGES, page_size=PAGE, target_layers=TARGET_LAYERS,
        kv_lora_rank=KV_LORA_RANK, qk_rope_head_dim=QK_ROPE_HEAD_DIM, layout=LAYOUT, meta_buffers=False,
        extra={"enable_hierarchical_cache": True, "hicache_io_backend": IO_BACKEND, "page_size": PAGE},
    )
    ops = _transfer_log()
    with sidecar.on_rank(r), get_parallel().override(dcp_size=dcp, dcp_rank=rank), substituted(ops):
        yield ops


def _transfer_log():
    """The harness's reference ops, logging rows; the class is made here so that importing this module imports no torch."""
    from emulation.datapath.substitutions import ReferenceOps

    class _TransferLog(ReferenceOps):
        """The harness's reference transfer ops, logging which rows each copy read and wrote."""

        def __init__(self) -> None:
            super().__init__()
            self.rows: list[tuple[str, str, list[int], list[int]]] = []

        def _copy(self, op, src, src_idx, dst, dst_idx, **kwargs):
            self.rows.append((self.name_of(src), self.name_of(dst), src_idx.tolist(), dst_idx.tolist()))
            return super()._copy(op, src, src_idx, dst, dst_idx, **kwargs)

    return _TransferLog()


def configurator(launch: DraftLaunch, *, draft: bool, layers: int, architecture: str):
    """A real ``KVCacheConfigurator`` with only the fields its pool builders read set by hand.

    Its own properties and methods then decide the pool: ``loc_space_scale``
    (dcp for a draft worker), ``pool_page_size``, ``_derive_pool_sizes`` and the
    dispatch of ``_build_token_to_kv_pool`` (MLA -> ``_build_mla_kv_pool``, MHA ->
    ``_build_mha_kv_pool``). The model config is a stand-in; its KV head count
    is answered by ``ModelConfig.get_num_kv_heads`` itself (drafts ignore dcp).
    """
    import torch
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    heads = SimpleNamespace(get_total_num_kv_heads=lambda: MHA_KV_HEADS, is_draft_model=draft)
    model_config = SimpleNamespace(
        kv_lora_rank=KV_LORA_RANK, qk_rope_head_dim=QK_ROPE_HEAD_DIM, head_dim=MHA_HEAD_DIM, v_head_dim=MHA_HEAD_DIM,
        hf_config=SimpleNamespace(architectures=[architecture]), num_nextn_predict_layers=launch.nextn_layers,
        get_num_kv_heads=lambda tp, dcp=1: ModelConfig.get_num_kv_heads(heads, tp, dcp),
    )
    cfg = object.__new__(KVCacheConfigurator)  # a slots dataclass: the fields below are its own slots
    for name, value in dict(
        device="cpu", is_draft_worker=draft, use_mla_backend=not draft or launch.kind == "mla",
        is_hybrid_swa=False, mambaish_config=None, kv_cache_dtype=torch.bfloat16, kv_cache_dtype_str="auto",
        post_capture_kv_active=False, kv_shard_rank=None, kv_shard_spec=None, kv_shard_group=None,
        token_to_kv_pool_allocator=None, sliding_window_size=None, page_size=PAGE, server_args=None,
        spec_algorithm=SpeculativeAlgorithm.from_string(launch.algorithm), model_config=model_config,
        layer_info=SimpleNamespace(num_effective_layers=layers, start_layer=0, end_layer=layers),
    ).items():
        setattr(cfg, name, value)
    return cfg


def build_pool(cfg):
    """The configurator's own sizes and pool for a target with PAGES * PAGE rows on this rank."""
    from sglang.srt.model_executor.pool_configurator import MemoryPoolConfig

    sizes = cfg._derive_pool_sizes(config=MemoryPoolConfig(max_total_num_tokens=PAGE * PAGES, max_running_requests=4))
    return cfg._build_token_to_kv_pool(sizes=sizes, is_dsa_model=False, is_dsv4_model=False, req_to_token_pool=None)


def replicated_twin(pool):
    """The same MLA draft pool (rows, page, geometry) with ``dcp_replicated=True``: the counterfactual rows."""
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    return MLATokenToKVPool(
        pool.size, page_size=pool.page_size, dtype=pool.dtype, kv_lora_rank=pool.kv_lora_rank,
        qk_rope_head_dim=pool.qk_rope_head_dim, layer_num=pool.layer_num, device="cpu", enable_memory_saver=False,
        start_layer=pool.start_layer, end_layer=pool.end_layer, dcp_replicated=True,
    )


def gate(launch: DraftLaunch, dcp: int) -> str:
    """0.5.23's HiCache + DCP gate (``arg_groups/hicache_hook.py::resolve_hicache_dcp_compatibility``) for an MLA target."""
    from sglang.srt.arg_groups.hicache_hook import resolve_hicache_dcp_compatibility
    from sglang.srt.configs.model_config import AttentionArch

    record = SimpleNamespace(
        dcp_size=dcp, enable_hierarchical_cache=True, hicache_storage_backend=None, hicache_host_memory_mode=None,
        speculative_algorithm=launch.algorithm, enable_lmcache=False, enable_hisparse=False,
        _model_config=SimpleNamespace(attention_arch=AttentionArch.MLA),
    )
    try:
        resolve_hicache_dcp_compatibility(record)
    except NotImplementedError:
        return "refused"
    return "admitted"


def gate_with_fix(launch: DraftLaunch, dcp: int) -> str:
    """The same gate as the plugin runs it on stock 0.5.23 (its hook applied by ``hooks.in_effect``), which decides an
    EAGLE-family draft by its layout (patches/upstream-next 0020 decides the same): the launch's own NextN layer
    or an external draft, the draft's attention backend (triton where it is named, else the target's
    flashinfer), and whether the draft checkpoint is MLA (its kind here, not a config read)."""
    import contextlib

    import sglang.srt.arg_groups.hicache_hook as module
    import sglang.srt.arg_groups.speculative_hook as spec_module
    from sglang.srt.configs.model_config import AttentionArch

    from sglang_dcp_dspark.core import swap
    from sglang_dcp_dspark.plugin import hooks
    from sglang_dcp_dspark.plugin.hooks import hicache_hook, speculative_hook

    own_layer = launch.algorithm == "NEXTN"
    record = SimpleNamespace(
        dcp_size=dcp, enable_hierarchical_cache=True, hicache_storage_backend=None, hicache_host_memory_mode=None,
        speculative_algorithm=launch.algorithm, enable_lmcache=False, enable_hisparse=False,
        _model_config=SimpleNamespace(attention_arch=AttentionArch.MLA), model_path="target",
        speculative_draft_model_path=None if own_layer else "draft",
        speculative_draft_attention_backend="triton" if launch.path == "mha-triton" else None,
        attention_backend="flashinfer", prefill_attention_backend=None, decode_attention_backend=None,
    )
    is_mla = lambda cfg: launch.kind == "mla"  # noqa: E731
    with contextlib.ExitStack() as stack:
        stack.enter_context(hooks.in_effect(hicache_hook.MODULE))
        stack.enter_context(swap.attribute(speculative_hook, "draft_uses_mla", is_mla))
        if hasattr(spec_module, speculative_hook.DRAFT_USES_MLA):  # declared there by the plugin or the series
            stack.enter_context(swap.attribute(spec_module, speculative_hook.DRAFT_USES_MLA, is_mla))
        try:
            module.resolve_hicache_dcp_compatibility(record)
        except NotImplementedError:
            return "refused"
    return "admitted"


# ---------------------------------------------------------------- the draft's forward: write and read


LAYER = SimpleNamespace(layer_id=0, is_cross_attention=False)  # what the pools read of a RadixAttention


def _values(launch: DraftLaunch, pool, n: int, seed: int):
    """Distinct random KV per token: MLA (nope, rope); MHA (k, v), in the pool's own head geometry."""
    import torch

    g = torch.Generator().manual_seed(seed)
    if launch.kind == "mla":
        return (torch.randn(n, 1, KV_LORA_RANK, generator=g).bfloat16(),
                torch.randn(n, 1, QK_ROPE_HEAD_DIM, generator=g).bfloat16())
    shape = (n, pool.head_num, pool.head_dim)
    return torch.randn(shape, generator=g).bfloat16(), torch.randn(shape, generator=g).bfloat16()


def _stored(values):
    """What a token's row holds once written: MLA nope then rope; MHA K then V (compared together)."""
    import torch

    return torch.cat(values, -1)


def _rows(launch: DraftLaunch, pool, rows):
    """The draft layer's bytes at physical ``rows``, read straight from the pool's buffers."""
    import torch

    if launch.kind == "mla":
        return pool.kv_buffer[0][rows]
    return torch.cat([pool.k_buffer[0][rows], pool.v_buffer[0][rows]], -1)


def _scrub(launch: DraftLaunch, pool) -> None:
    for buf in (pool.kv_buffer if launch.kind == "mla" else [*pool.k_buffer, *pool.v_buffer]):
        buf.zero_()


def _backend(pool, req_to_token):
    """A stand-in for the TritonAttnBackend fields its DCP write and read methods read (set as its __init__ does)."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.runtime_context import get_parallel

    be = SimpleNamespace(dcp_size=get_parallel().attn_dcp_size, dcp_rank=get_parallel().attn_dcp_rank,
                         token_to_kv_pool=pool, req_to_token=req_to_token, device="cpu")
    be._dcp_lens = functools.partial(TritonAttnBackend._dcp_lens, be)
    return be


def write(launch: DraftLaunch, pool, locs, values, layer=LAYER) -> None:
    """The draft forward's KV write for one request at widened logical ``locs``, positions 0..n-1.

    ``layer``: what the pool reads of the draft's RadixAttention (its ``layer_id``); layer 0 by default.
    The data-path harness (``harness.HiCacheRun``, a striped draft) writes its drafts through here too.
    """
    import torch
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    if launch.path == "mla":
        pool.set_mla_kv_buffer(layer, KVWriteLoc(locs, physical=True), *values)
    elif launch.path == "mha-plain":
        pool.set_kv_buffer(layer, KVWriteLoc(locs, physical=True), *values)
    else:
        batch = SimpleNamespace(out_cache_loc=locs, out_cache_loc_is_physical=True,
                                positions=torch.arange(len(locs)), dcp_kv_mask=None)
        TritonAttnBackend._set_kv_buffer(_backend(pool, None), batch, layer, KVWriteLoc.for_batch(batch), *values)


def read(launch: DraftLaunch, pool, locs):
    """The draft attention's read for one request at ``locs``: (the positions it reads, the rows it reads them at).

    Without DCP every backend packs ``req_to_token`` through the translator
    (``pack_read_stream``). Under DCP flashinfer-MLA selects this rank's ids
    and collapses them (``plan_dcp_decode_metadata``, ``translate_dcp_read_ids``),
    Triton builds them with ``_dcp_kv_indices``, and the DCP-unaware MHA
    backends read the ``req_to_token`` passthrough (``read_source``).
    """
    import torch
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.layers.dcp.planner import plan_dcp_decode_metadata
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    from sglang.srt.runtime_context import get_parallel

    n = len(locs)
    req_to_token = torch.zeros((2, max(2 * PAGE * PAGES * max(DCP_SIZES), n)), dtype=torch.int32)
    req_to_token[0, :n] = locs
    req_pool_indices = torch.tensor([0])
    seq_lens = torch.tensor([n], dtype=torch.int32)
    indptr = torch.zeros(2, dtype=torch.int32)
    positions = torch.arange(n)
    parallel = get_parallel()
    owned = positions[positions % parallel.attn_dcp_size == parallel.attn_dcp_rank]
    translator = KVIndexTranslator(req_to_token=req_to_token, token_to_kv_pool_allocator=None, token_to_kv_pool=pool,
                                   page_size=pool.page_size, device="cpu", is_draft_worker=True)
    if launch.path == "mha-plain":
        table = translator.read_source(None, req_pool_indices=req_pool_indices, bs=1)
        return positions, table.ids[table.row_ids[0], :n].long()
    if launch.path == "mha-triton" and parallel.attn_dcp_size > 1:
        _, ids, _ = TritonAttnBackend._dcp_kv_indices(_backend(pool, req_to_token), req_pool_indices, seq_lens, indptr)
        return owned, ids.long()
    indptr[1:] = torch.cumsum(seq_lens, 0)
    ids = torch.empty(n, dtype=torch.int32)
    translated = translator.pack_read_stream(None, req_pool_indices=req_pool_indices, seq_lens=seq_lens,
                                             indptr=indptr, out=ids)
    if not parallel.dcp_enabled:
        return positions, ids.long()
    count = plan_dcp_decode_metadata(seq_lens.clone(), indptr, ids, False, {}, 1)
    ids = ids[:count]
    if not translated and count and translator.needs_read_translate:
        ids = translator.translate_dcp_read_ids(ids)
    return owned, ids.long()


def reads_back(launch: DraftLaunch, pool, locs, values) -> tuple[bool, list[int]]:
    """Does the read path at ``locs`` return the bytes written for those positions? And the rows it read."""
    import torch

    positions, rows = read(launch, pool, locs)
    return bool(torch.equal(_rows(launch, pool, rows), _stored(values)[positions])), rows.tolist()


def layout_rows(layout: str, locs, dcp: int, rank: int):
    """(positions, rows) the measured write layout puts ``locs`` at on this rank: all at row L, or owned at L // N."""
    import torch

    positions = torch.arange(len(locs))
    if layout == "striped":
        owned = positions[locs % dcp == rank]
        return owned, locs[owned] // dcp
    return positions, locs


def classify(launch: DraftLaunch, pool, locs, values, dcp: int, rank: int) -> str:
    """Which physical row got which loc's bytes: every loc at row L, or only this rank's at row L // N."""
    import torch

    want = _stored(values)
    at_loc = [bool(torch.equal(_rows(launch, pool, L), want[i])) for i, L in enumerate(locs.tolist())]
    at_div = [bool(torch.equal(_rows(launch, pool, L // dcp), want[i])) for i, L in enumerate(locs.tolist())]
    mine = [L % dcp == rank for L in locs.tolist()]
    if dcp == 1:
        return "row = loc" if all(at_loc) else "other"
    if all(at_loc):
        return "replicated"
    if at_div == mine and not any(a and not m for a, m in zip(at_loc, mine, strict=True)):
        return "striped"
    return "other"


def mla_combined_door(pool, locs, values) -> str:
    """``MLATokenToKVPool.set_kv_buffer``, the door ``models/dspark.py::write_target_hidden_kv`` writes through."""
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    try:
        pool.set_kv_buffer(LAYER, KVWriteLoc(locs, physical=True), _stored(values), None)
    except AssertionError:
        return "AssertionError"
    return "writes"


# ---------------------------------------------------------------- host pools, backup and load-back


def host_stack(plan_name: str, plan, packed, target, dcp: int):
    """The target's HostPoolGroup with the draft where the plan puts it: (group, the draft's host pool, extra pools).

    PACKED: ``build_kv_only_stack`` with ``params.mtp_draft_device_pools`` (the
    pools ``_build_hicache_draft_plan`` set on the target runner), as
    ``kv_cache_builder.build_kv_cache`` passes them. SIDECAR:
    ``build_hicache_draft_sidecars`` on the plan's device pools, the entry added
    to the group as ``UnifiedRadixCache.register_sidecar_pool`` does (through
    ``HybridCacheController.register_host_pool_entry``); ``extra pools`` makes
    the sidecar's transfer as the tree does, from its ``SidecarPoolSpec``.
    """
    from sglang.srt.mem_cache.hicache_storage import PoolTransfer
    from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as hpa

    from sglang_dcp_dspark.core import sidecar

    sidecars = tuple(plan.device_pools) if plan_name == "SIDECAR" else ()
    params = sidecar.cache_params(SimpleNamespace(rank=SimpleNamespace(page_size=PAGE, dcp_size=dcp), draft_device=None),
                                  mtp_draft_device_pools=packed, sidecar_draft_device_pools=sidecars)
    params.token_to_kv_pool_allocator = SimpleNamespace(get_kvcache=lambda: target)
    group, _ = hpa.build_kv_only_stack(
        params=params, kv_pool=target, full_layer_mapping={i: i for i in range(TARGET_LAYERS)},
        load_cache_event=None, storage_backend=None, use_mla=True,
    )
    if not sidecars:
        return group, group.anchor_entry.host_pool, lambda: None
    tree_cache = SimpleNamespace(cache_controller=SimpleNamespace(
        mem_pool_host=group, page_size=PAGE * dcp, transfer_layer_id_max=TARGET_LAYERS))
    specs, entries = hpa.build_hicache_draft_sidecars(draft_device_pools=sidecars, tree_cache=tree_cache)
    for entry in entries:
        group.add_entry(entry)
    return group, entries[0].host_pool, lambda: [
        PoolTransfer(name=spec.pool_name, indices_from_pool=spec.indices_from_pool) for spec in specs
    ]


def round_trip(launch: DraftLaunch, group, draft_pool, extra_pools, ops, locs, locs2, values, result: RankResult):
    """Back the written locs up, scrub the draft, load them back at ``locs2``, read them there.

    The indices travel as the controller hands them over: host slots from the
    target host allocator (``HostPoolGroup.alloc``), a sidecar's derived from
    the anchor's (``HostPoolGroup.resolve_host_transfers``,
    ``HybridCacheController._resolve_device_transfers``), the transfer lists from
    ``_l2_transfers`` / ``_l2_load_transfers`` (which adds the packed draft
    layer), moved by ``L2TransferEngine`` as ``start_writing`` /
    ``start_loading`` submit them. The log of the reference ops says which
    draft device rows each copy read or wrote.
    """
    import torch
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController as HCC
    from sglang.srt.mem_cache.l2_transfer import L2TransferEngine
    from sglang.srt.runtime_context import get_parallel

    dcp, rank = get_parallel().attn_dcp_size, get_parallel().attn_dcp_rank
    ctl = SimpleNamespace(mem_pool_host=group, transfer_layer_id_max=TARGET_LAYERS)
    ctl._l2_transfers = functools.partial(HCC._l2_transfers, ctl)
    engine = L2TransferEngine(IO_BACKEND)

    host = group.alloc(len(locs))
    transfers = group.resolve_host_transfers(extra_pools(), primary_device_indices=locs, primary_host_indices=host)
    ops.rows.clear()
    engine.submit_device_to_host(HCC._l2_transfers(ctl, host, locs, transfers))
    backup = next((src_rows for src, _, src_rows, _ in ops.rows if src == "draft/device"), [])
    striped = [L // dcp for L in locs.tolist() if L % dcp == rank]
    result.locs, result.backed_up = len(locs), len(backup)
    result.backup_device_rows = backup[:PAGE]
    result.forward_rows = layout_rows(result.layout, locs, dcp, rank)[1].tolist()[:PAGE]
    if dcp == 1:
        result.backup_indices = "row = slot" if backup == locs.tolist() else "other"
    else:
        result.backup_indices = {tuple(striped): "translated", tuple(locs.tolist()): "untranslated"}.get(
            tuple(backup), "other")

    _scrub(launch, draft_pool)
    loads = HCC._resolve_device_transfers(ctl, extra_pools(), kv_device_indices=locs2, kv_host_indices=host)
    ops.rows.clear()
    engine.submit_host_to_device(HCC._l2_load_transfers(ctl, host, locs2, loads), transfer_layer_id_max=TARGET_LAYERS)
    result.load_device_rows = next((dst_rows for _, dst, _, dst_rows in ops.rows if dst == "draft/device"), [])[:PAGE]
    positions, rows = layout_rows(result.layout, locs2, dcp, rank)
    result.load_layout_rows = rows.tolist()[:PAGE]
    result.restored_ok = bool(torch.equal(_rows(launch, draft_pool, rows), _stored(values)[positions]))
    result.round_trip_ok, rows = reads_back(launch, draft_pool, locs2, values)
    result.read_rows = rows[:PAGE]


def _launch_record(launch: DraftLaunch, dcp: int):
    """The resolved-launch record ``releases.draft_plan`` reads (only its algorithm matters there)."""
    from sglang_dcp_dspark.preflight.launch import Launch

    return Launch(
        model_path="target", draft_model_path="draft", tp_size=dcp, pp_size=1, nnodes=1, dcp_size=dcp,
        page_size=PAGE, enable_hierarchical_cache=True, hicache_ratio=2.0, hicache_size=0, hicache_mem_layout=LAYOUT,
        hicache_io_backend=IO_BACKEND, hicache_host_memory_mode=None, hicache_host_memory_fraction=None,
        hicache_storage_backend=None, speculative_algorithm=launch.algorithm, disaggregation_mode=None,
        mem_fraction_static=None, kv_cache_dtype="auto",
    )


def measure_rank(launch: DraftLaunch, dcp: int, rank: int) -> tuple[Row, RankResult]:
    """Everything one rank measures for one launch: pools, plan, layout, read, host stack, round trip."""
    import torch
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_dcp_dspark.core.sizing import MLAKV
    from sglang_dcp_dspark.preflight.releases import Models, draft_plan, plan_name

    result = RankResult(rank=rank)
    with on_rank(dcp, rank) as ops:
        target = build_pool(configurator(launch, draft=False, layers=TARGET_LAYERS, architecture="DeepseekV3ForCausalLM"))
        draft_cfg = configurator(launch, draft=True, layers=1, architecture=launch.architecture)
        draft = build_pool(draft_cfg)
        if launch.replicated:
            draft = replicated_twin(draft)
        mla = MLAKV(1, KV_LORA_RANK, QK_ROPE_HEAD_DIM)
        models = Models(target=MLAKV(TARGET_LAYERS, KV_LORA_RANK, QK_ROPE_HEAD_DIM), draft=mla,
                        draft_architecture=launch.architecture, draft_nextn_layers=launch.nextn_layers)
        plan, packed = draft_plan(_launch_record(launch, dcp), models, draft)
        name = plan_name(plan)
        group, draft_host, extra_pools = host_stack(name, plan, packed, target, dcp)
        row = Row(
            launch=launch.label, algorithm=SpeculativeAlgorithm.from_string(launch.algorithm).name, dcp=dcp,
            gate=gate(launch, dcp), gate_fixed=gate_with_fix(launch, dcp), plan=name,
            pool_class=type(draft).__name__, pool_rows=draft.size,
            pool_page=draft.page_size, dcp_replicated=getattr(draft, "dcp_replicated", None),
            loc_space_scale=draft_cfg.loc_space_scale, host_pool=type(draft_host).__name__,
            host_rows=draft_host.size, host_logical=draft_host.logical_size, host_dcp_size=draft_host.dcp_size,
        )
        ops.register_pool("target/device", target)
        ops.register_pool("draft/device", draft)
        for entry in group.entries:  # the anchor (with a packed draft layer, if any), then a sidecar
            ops.register_pool("target/host" if entry is group.anchor_entry else "draft/host", entry.host_pool)

        page = PAGE * dcp  # the allocator's and the tree's page: whole logical pages
        locs = torch.cat([torch.arange(p * page, (p + 1) * page) for p in WRITE_PAGES])
        locs2 = torch.cat([torch.arange(p * page, (p + 1) * page) for p in LOAD_PAGES])
        values = _values(launch, draft, len(locs), seed=1000 * dcp + rank)
        try:
            write(launch, draft, locs, values)
        except Exception as exc:  # a door that refuses is a finding: recorded as the layout
            result.layout = f"raises {type(exc).__name__}"
            result.error = " ".join(str(exc).split())[:200]
            return row, result
        result.layout = classify(launch, draft, locs, values, dcp, rank)
        result.read_ok, _ = reads_back(launch, draft, locs, values)
        round_trip(launch, group, draft, extra_pools, ops, locs, locs2, values, result)
        if launch.kind == "mla":
            result.mla_set_kv_buffer = mla_combined_door(draft, locs, values)
    return row, result


def measure() -> list[Row]:
    """Every launch at every dcp, as rank 0 and as the last rank (the pools and the plan are the same on both)."""
    rows = []
    for launch in launches():
        for dcp in launch.dcp_sizes:
            measured = [measure_rank(launch, dcp, rank) for rank in sorted({0, dcp - 1})]
            row = measured[0][0]
            row.ranks = [result for _, result in measured]
            rows.append(row)
    return rows


# ---------------------------------------------------------------- the table


def _yes(flag: bool) -> str:
    return "yes" if flag else "**no**"


def _span(rows: list[int]) -> str:
    if len(rows) > 2 and all(b - a == rows[1] - rows[0] for a, b in zip(rows, rows[1:], strict=False)):
        return f"{rows[0]}, {rows[1]}, ..."
    return ", ".join(map(str, rows)) or "none"


def indices(row: Row) -> str:
    kinds = {r.backup_indices for r in row.ranks}
    kind = kinds.pop() if len(kinds) == 1 else " / ".join(r.backup_indices for r in row.ranks)
    return {"translated": "translated (row s // N, L // N; owned only)",
            "untranslated": "untranslated (row s, row L)"}.get(kind, kind)


def verdict(row: Row) -> str:
    """"fits", or what goes wrong, from the round trip measured on the last rank."""
    if row.fits:
        return "fits"
    last = row.ranks[-1]
    if last.error:
        return f"write refused ({last.layout})"
    share = f" ({last.backed_up} of {last.locs} locs)" if last.backed_up != last.locs else ""
    wrong = (f"**WRONG ROWS**: backup reads rows {_span(last.backup_device_rows)}{share}, the forward wrote those "
             f"locs at {_span(last.forward_rows)}; load-back writes {_span(last.load_device_rows)}")
    reads = f"the read path reads rows {_span(last.read_rows)}"
    if not last.read_ok:  # the device layout is inconsistent before HiCache moves anything
        elsewhere = f"{reads}, not the rows the forward writes ({_span(last.load_layout_rows)})"
        return f"HiCache restores the written rows, but {elsewhere}" if last.restored_ok else f"{wrong}; and {elsewhere}"
    return f"{wrong}, {reads}"


def host_cell(row: Row) -> str:
    owner = "the target's" if row.plan == "PACKED" else "own"
    return f"{owner} {row.host_pool}, {row.host_rows} (logical {row.host_logical}, dcp_size {row.host_dcp_size})"


def markdown(rows: list[Row]) -> str:
    lines = [
        "| launch | dcp | 0.5.23 gate | gate with the fix | plan | draft device pool (class, rows, page) "
        "| device layout (measured) "
        "| read path returns the written bytes (rank 0 / last) | draft host pool (rows) "
        "| backup / load-back indices (measured) | verdict (measured round trip) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        repl = "" if row.dcp_replicated is None else f", dcp_replicated={row.dcp_replicated}"
        reads = " / ".join("n/a" if r.error else _yes(r.read_ok) for r in row.ranks)
        lines.append(
            f"| {row.launch} | {row.dcp} | {row.gate} | {row.gate_fixed} | {row.plan} | "
            f"{row.pool_class}, {row.pool_rows}, "
            f"{row.pool_page}{repl} | {row.layout} | {reads} | {host_cell(row)} | {indices(row)} | {verdict(row)} |"
        )
    doors = sorted({r.mla_set_kv_buffer for row in rows if row.dcp > 1 for r in row.ranks if r.mla_set_kv_buffer})
    lines += [
        "",
        "Write and read paths (sglang 0.5.23): "
        + "; ".join(f"{label}: writes {WRITE_PATHS[key]}, reads {READ_PATHS[key]}" for label, key in (
            ("MLA drafts", "mla"), ("MHA drafts, triton", "mha-triton"), ("MHA drafts, fa3/flashinfer", "mha-plain")))
        + ". MLA drafts at dcp > 1 through the combined-row door (`MLATokenToKVPool.set_kv_buffer`, the one "
        f"`models/dspark.py::write_target_hidden_kv` uses): {', '.join(doors) or 'not measured'}.",
        "",
        f"Geometry: the target has {PAGE * PAGES} rows per rank, page {PAGE} (the tree's page: {PAGE} x dcp), "
        f"{TARGET_LAYERS} MLA layers; the draft has one layer. Each rank writes logical pages {WRITE_PAGES}, backs them "
        f"up, scrubs the draft and loads them back into logical pages {LOAD_PAGES}; the verdict quotes the last rank's "
        f"first rows. Host pools: --hicache-ratio 2, {LAYOUT}, io backend {IO_BACKEND}. 'row = loc': dcp 1, where "
        "striped and replicated coincide. s: a host slot, L: a device loc, N: dcp; owned: s % N == rank. "
        "0.5.23 gate: `arg_groups/hicache_hook.py::resolve_hicache_dcp_compatibility` on that launch; gate with the "
        "fix: the same gate with the plugin's hook (`plugin/hooks/hicache_hook.py`; upstream-next 0020 decides the "
        "same), the draft's backend triton where the row says so, else the target's flashinfer (the counterfactual "
        "row's replicated pool is then stopped at cache build by the plan check, 0009). Draft configs: "
        + "; ".join(dict.fromkeys(
            f"{launch.algorithm} {launch.architecture} (num_nextn_predict_layers {launch.nextn_layers}): {launch.source}"
            for launch in launches())) + ".",
    ]
    return "\n".join(lines)


def to_json(rows: list[Row]) -> dict:
    return {"table": markdown(rows),
            "rows": [dict(asdict(r), layout=r.layout, fits=r.fits, verdict=verdict(r)) for r in rows]}


def committed_table(doc: Path = DOC) -> str:
    text = doc.read_text(encoding="utf-8")
    return text[text.index(BEGIN) + len(BEGIN): text.index(END)].strip("\n")


def write_doc(table: str, doc: Path = DOC) -> None:
    text = doc.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}", encoding="utf-8")


def main(argv: list[str]) -> int:
    # Before sglang is imported: its Triton kernels (the DCP-masked MHA write, the DCP read-index kernels)
    # are decorated at import, and on a machine without a GPU only Triton's interpreter runs them.
    os.environ["TRITON_INTERPRET"] = "1"
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)  # sglang's CPU notices (no timing events, no CUDA) are not findings
    rows = measure()
    if "--json" in argv:
        print(json.dumps(to_json(rows)))
        return 0
    table = markdown(rows)
    print(table)
    if "--write" in argv:
        write_doc(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
