"""sglang's real HiCache data path, driven in-process for one simulated DCP rank.

What is sglang's own: ``HiRadixCache`` (which builds the target's
``MLATokenToKVPoolHost`` and its ``HiCacheController``), the DCP-striped
target ``MLATokenToKVPool``, the ``PagedTokenToKVPoolAllocator`` over logical
locs with the widened page, the draft device pool (MLA or MHA, replicated,
indexed by logical locs) and the draft registration of the imported tree, with
the draft host pool it builds. On the sidecar path (``Case.draft_path ==
"sidecar"``: 0.5.18 and the PR parent under ``SGLANG_ENABLE_UNIFIED_RADIX_TREE``,
and every HiCache launch of 0.5.23) the cache is instead the tree's
``UnifiedRadixCache``, built by sglang's own registry factory, with its
``HybridCacheController`` over a ``HostPoolGroup``; the registration then puts
the draft in that group as a sidecar (``hybrid_pool_assembler.build_full_draft_pools``).

What stands in for a scheduler: a 1-rank gloo process group (in :mod:`ranks`,
the gloo world of a real multi-process DCP group, with sglang's own DCP
``GroupCoordinator`` over it), sglang's own
``get_parallel().override(...)`` for the DCP rank, ``server_args`` as a
namespace of the fields these objects read, and on the sidecar path the
registry's build context (a namespace: the model flags, and a ``tp_worker``
whose only duty here, registering the layer counter with a model runner, has no
model runner to go to) and a request stand-in for ``init_load_back`` (the
fields it reads). The only substitutions are in :mod:`substitutions`.

The draft's HiCache plan and device layout (``Case.draft_plan``,
``Case.draft_layout``; sglang 0.5.23 on the sidecar path, see
docs/draft-layouts.md): SIDECAR (its own host pool, as above) or PACKED (the
draft pool handed to the tree as ``CacheInitParams.mtp_draft_device_pools``, as
``kv_cache_builder.build_kv_cache`` does for NEXTN/MTP, so that its layers are
tail layers of the target's ``MLATokenToKVPoolHost`` and no sidecar is
registered); written REPLICATED (every loc at row = loc: an MLA draft directly, a dense
draft through ``MHATokenToKVPool.set_kv_buffer`` as DSPARK's ``write_target_hidden_kv`` does) or
STRIPED (through the draft pool's own ``MLATokenToKVPool.set_mla_kv_buffer``,
whose DCP owner rule keeps loc L at row L // N on rank L % N). With
``Case.forward_read`` every load-back is also checked through the draft
attention's own read path (:meth:`HiCacheRun.check_reads`). A draft whose
bytes come back on rows other than those the check reads raises
:class:`DraftRowsWrong`.

Where releases moved an API, the difference is handled here, in
:func:`_registration_kwargs`, :func:`_runtime_overrides`, :func:`_unified_cache`
and the small adapters of :class:`HiCacheRun`, so the scenarios and the tests
read the same on every tree.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import traceback
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import torch

from .matrix import DRAFT_KINDS, LAYOUT_IO_PAIRS  # noqa: F401 - re-exported for callers
from .substitutions import ReferenceOps, RowOutOfBounds, substituted, triton_interpreted

TARGET, DRAFT = "target", "draft"


def dspark_context_write(pool, layer: int, locs: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """``MHATokenToKVPool.set_kv_buffer`` as ``write_target_hidden_kv`` calls it for one draft layer.

    The locs go in as the draft pool's own ids: a plain tensor where the
    release's ``write_target_hidden_kv`` passes one (0.5.17), a
    ``KVWriteLoc(loc, physical=True)`` where its write-location record has that
    field (0.5.23). No scales: the draft's KV is bf16.
    """
    import inspect

    from sglang.srt.mem_cache import memory_pool

    attention = SimpleNamespace(layer_id=layer, is_cross_attention=False, k_scale=None, v_scale=None)
    record = getattr(memory_pool, "KVWriteLoc", None)
    physical = record is not None and "physical" in inspect.signature(record).parameters
    where = record(locs, physical=True) if physical else locs
    pool.set_kv_buffer(attention, where, k, v, None, None)


@dataclass(frozen=True)
class Case:
    """One simulated rank's HiCache geometry. Small by default: a case builds and runs in tens of ms."""

    dcp_size: int = 2
    dcp_rank: int = 0
    layout: str = "layer_first"
    io_backend: str = "direct"
    draft: str = "mla"  # replicated draft device pool: "mla" (MLATokenToKVPool) or "mha" (MHATokenToKVPool)
    # "default": 0.5.17's one path; "legacy": 0.5.18 / the PR parent's HiRadixCache path;
    # "sidecar": UnifiedRadixCache + HostPoolGroup (0.5.18, the PR parent, 0.5.23)
    draft_path: str = "default"
    page_size: int = 4  # physical page per rank; the allocator's and the tree's page is page_size * dcp_size
    device_pages: int = 8  # target device pages per rank
    host_ratio: float = 2.0  # --hicache-ratio
    hicache_size: float = 0  # --hicache-size in GB; 0: the host pools are sized by host_ratio
    target_layers: int = 2
    draft_layers: int = 1
    kv_lora_rank: int = 24
    qk_rope_head_dim: int = 8
    mha_heads: int = 2
    mha_head_dim: int = 8
    device: str = "cpu"
    # --hicache-draft-backup (0.5.23 + upstream-next): "replicated" (every rank backs up the whole
    # draft) or "sharded" (each rank its DCP stripe; needs the rank's real DCP group: ranks.py)
    draft_backup: str = "replicated"
    # The draft's HiCache plan on the sidecar path (0.5.23's HiCacheDraftMode): "sidecar" (its own
    # host pool) or "packed" (tail layers of the target host pool: mtp_draft_device_pools; 0.5.23 only).
    draft_plan: str = "sidecar"
    # Where the draft's forward puts loc L on this rank: "replicated" (row L, every loc, written
    # directly) or "striped" (row L // N if L % N == rank, written through the MLA draft pool's own
    # set_mla_kv_buffer under the rank's runtime context; 0.5.23 only).
    draft_layout: str = "replicated"
    # After every load-back, also check the rows the draft attention's own read path reads.
    forward_read: bool = False

    @property
    def logical_page(self) -> int:
        return self.page_size * self.dcp_size

    @property
    def device_rows(self) -> int:
        return self.page_size * self.device_pages

    def label(self) -> str:
        path = "" if self.draft_path == "default" else f" {self.draft_path}"
        backup = "" if self.draft_backup == "replicated" else f" {self.draft_backup} backup"
        budget = f" --hicache-size {self.hicache_size:g}" if self.hicache_size else ""
        pair = "" if (self.draft_plan, self.draft_layout) == ("sidecar", "replicated") else \
            f" ({self.draft_plan} plan, {self.draft_layout} draft)"
        return (
            f"dcp{self.dcp_size} rank{self.dcp_rank} {self.layout}/{self.io_backend} "
            f"{self.draft} draft{path}{pair}{backup}{budget}"
        )


class DraftRowsWrong(AssertionError):
    """The draft's bytes are not on the rows its forward reads: HiCache moved other rows than the layout's.

    Raised by the draft's byte check (:meth:`HiCacheRun.check_device`) and the
    forward-read check (:meth:`HiCacheRun.check_reads`) only when the last
    load-back wrote draft device rows other than the rows the check reads for
    the loaded locs; the message names both. Bytes that are wrong on the
    right rows (a corrupted copy) stay a plain AssertionError.
    """


class DraftHostOverflow(AssertionError):
    """The draft's host buffer was written or read past its end: the defect this project fixes."""


@contextlib.contextmanager
def overflow_as_assertion() -> Iterator[None]:
    """Turn the reference ops' out-of-bounds error on the draft host pool into DraftHostOverflow.

    Any other out-of-bounds error (the target, a device pool) stays an
    IndexError, so a strict xfail that expects DraftHostOverflow does not
    accept it.
    """
    try:
        yield
    except RowOutOfBounds as exc:
        if exc.pool != f"{DRAFT}/host":
            raise
        # The sglang frames that led to the copy name the path (start_writing -> the draft
        # host pool's backup); the chained traceback itself is dropped, since pytest
        # formatting ~40 sglang frames per expected failure costs half a second each.
        path = " -> ".join(
            f"{Path(f.filename).stem}.{f.name}" for f in traceback.extract_tb(exc.__traceback__)
            if f"{os.sep}sglang{os.sep}srt{os.sep}" in f.filename
        )
        raise DraftHostOverflow(f"draft host pool overflow: {exc} (via {path})") from None


# ---------------------------------------------------------------- tree adapters


def sglang_version() -> str:
    import sglang

    return getattr(sglang, "__version__", "?")


def _server_args(case: Case) -> SimpleNamespace:
    # The fields HiRadixCache, its controller and the draft registration read.
    return SimpleNamespace(
        hicache_ratio=case.host_ratio,
        hicache_size=case.hicache_size,
        hicache_mem_layout=case.layout,
        hicache_io_backend=case.io_backend,
        hicache_write_policy="write_through",
        hicache_storage_backend=None,
        hicache_storage_backend_extra_config=None,
        hicache_storage_prefetch_policy="best_effort",
        served_model_name="datapath-harness",
        extra_metric_labels=None,
        enable_multi_layer_eagle=False,
        enable_hierarchical_cache=True,
        dcp_size=case.dcp_size,
        tp_size=case.dcp_size,
        pp_size=1,
        nnodes=1,
    )


@contextlib.contextmanager
def _runtime_overrides(case: Case, server_args, dcp_group=None) -> Iterator[None]:
    """This process as one DCP rank, through sglang's own runtime context.

    ``dcp_group``: the rank's real DCP ``GroupCoordinator`` (ranks.py), which a
    sharded draft backup all-gathers over; without one, no DCP group is set.
    """
    from sglang.srt import runtime_context

    with contextlib.ExitStack() as stack:
        get_context = getattr(runtime_context, "get_context", None)
        if get_context is not None and hasattr(get_context(), "override_server_args"):
            # 0.5.18+ read the HiCache sizing fields from the published config bags.
            backup = {} if case.draft_backup == "replicated" else {"hicache_draft_backup": case.draft_backup}
            stack.enter_context(get_context().override_server_args(
                hicache_ratio=case.host_ratio, hicache_size=case.hicache_size, hicache_mem_layout=case.layout,
                hicache_io_backend=case.io_backend, hicache_write_policy="write_through",
                hicache_storage_backend=None, dcp_size=case.dcp_size, tp_size=case.dcp_size, **backup,
            ))
        group = {} if dcp_group is None else {"dcp_group": dcp_group}
        stack.enter_context(runtime_context.get_parallel().override(
            dcp_enabled=case.dcp_size > 1, dcp_size=case.dcp_size, dcp_rank=case.dcp_rank,
            attn_dcp_size=case.dcp_size, attn_dcp_rank=case.dcp_rank, **group,
        ))
        yield


def _process_group():
    """The group HiRadixCache all-reduces its ready counts over: WORLD of a multi-rank run (ranks.py), else 1 rank."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return dist.group.WORLD


def _mla_pool(case: Case, rows: int, page: int, layers: int):
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    return MLATokenToKVPool(
        size=rows, page_size=page, dtype=torch.bfloat16, kv_lora_rank=case.kv_lora_rank,
        qk_rope_head_dim=case.qk_rope_head_dim, layer_num=layers, device=case.device,
        enable_memory_saver=False,
    )


def _draft_device_pool(case: Case):
    # Replicated: every rank holds the draft KV of every logical loc, with the widened page.
    rows, page = case.device_rows * case.dcp_size, case.logical_page
    if case.draft == "mla":
        return _mla_pool(case, rows, page, case.draft_layers)
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    return MHATokenToKVPool(
        size=rows, page_size=page, dtype=torch.bfloat16, head_num=case.mha_heads, head_dim=case.mha_head_dim,
        layer_num=case.draft_layers, device=case.device, enable_memory_saver=False,
    )


def _registration_kwargs(register: Callable, tree_cache, draft_pool, server_args, case: Case) -> dict:
    """Keyword arguments for the tree's ``maybe_register_hicache_draft``, whichever release it is."""
    params = inspect.signature(register).parameters
    if "draft_plan" in params:  # PR #35221's parent, 0.5.18 (with server_args, page_size); 0.5.23 (without)
        from sglang.srt.speculative.base_spec_worker import HiCacheDraftMode, HiCacheDraftPlan

        mode = HiCacheDraftMode.PACKED if case.draft_plan == "packed" else HiCacheDraftMode.SIDECAR
        kwargs = dict(
            tree_cache=tree_cache, draft_plan=HiCacheDraftPlan(mode=mode, device_pools=(draft_pool,)),
            server_args=server_args, page_size=case.logical_page,
        )
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return kwargs
        return {k: v for k, v in kwargs.items() if k in params}
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    runner = SimpleNamespace(token_to_kv_pool=draft_pool)
    return dict(  # 0.5.17
        tree_cache=tree_cache,
        draft_worker=SimpleNamespace(draft_worker=SimpleNamespace(draft_runner=runner)),
        spec_algorithm=SpeculativeAlgorithm.DSPARK, server_args=server_args,
        enable_hierarchical_cache=True, page_size=case.logical_page,
    )


def _unified_cache(case: Case, server_args, params, draft_pool):
    """The tree's UnifiedRadixCache with HiCache attached, through sglang's own registry factory."""
    from sglang.srt.mem_cache import registry

    if case.draft_plan == "packed":  # 0.5.23's build_kv_cache for a PACKED plan: the draft layers ride the anchor
        params.mtp_draft_device_pools = (draft_pool,)
    elif hasattr(params, "sidecar_draft_device_pools"):  # 0.5.23: build_kv_cache hands the sidecar pools over
        params.sidecar_draft_device_pools = (draft_pool,)
    ctx = SimpleNamespace(  # registry.TreeCacheBuildContext's fields, for a plain MLA model with HiCache
        server_args=server_args, params=params, is_hybrid_swa=False, is_hybrid_ssm=False, is_dsa=False,
        full_tokens_per_layer=None, enable_hierarchical_cache=True, disable_radix_cache=False,
        effective_chunked_prefill_size=None, model_config=None, tp_size=case.dcp_size, tp_rank=case.dcp_rank,
        tp_group=None, tp_worker=SimpleNamespace(register_hicache_layer_transfer_counter=lambda counter: None),
    )
    create = getattr(registry, "create_unified_radix_cache", None)
    if create is not None:  # 0.5.23
        return create(ctx)
    return registry._create_unified_radix_cache(ctx, server_args, params)  # 0.5.18, the PR parent


def _draft_paths(case: Case) -> SimpleNamespace:
    """The write and read paths of layouts.py (its ``DraftLaunch.kind`` / ``.path``) this case's draft takes.

    An MLA draft: ``MLATokenToKVPool.set_mla_kv_buffer`` and the MLA read path
    (layouts.py's NEXTN and external-EAGLE MLA rows); an MHA draft: the
    fa3/flashinfer paths, ``set_kv_buffer`` at the loc and the ``req_to_token``
    passthrough (its "fa3/flashinfer" rows).
    """
    return SimpleNamespace(kind=case.draft, path="mla" if case.draft == "mla" else "mha-plain")


def _check_draft_case(case: Case, params) -> None:
    """The plan and layout pairs the harness can build on this tree, or a clear error."""
    if case.draft_plan not in ("sidecar", "packed") or case.draft_layout not in ("replicated", "striped"):
        raise ValueError(f"{case.label()}: unknown draft plan {case.draft_plan!r} or layout {case.draft_layout!r}")
    if case.draft_plan == "packed" and (case.draft_path != "sidecar" or not hasattr(params, "mtp_draft_device_pools")):
        raise NotImplementedError(f"sglang {sglang_version()}: no PACKED draft plan on the {case.draft_path} path "
                                  "(CacheInitParams.mtp_draft_device_pools is sglang 0.5.23's)")
    if case.draft_layout == "striped" and (case.draft != "mla" or not hasattr(params, "mtp_draft_device_pools")):
        raise NotImplementedError(f"sglang {sglang_version()}: a striped draft is an MLA draft on sglang 0.5.23, "
                                  "written through MLATokenToKVPool.set_mla_kv_buffer")
    if case.forward_read and not hasattr(params, "mtp_draft_device_pools"):
        raise NotImplementedError(f"sglang {sglang_version()}: the forward-read check is sglang 0.5.23's read path")


def _span(rows: list[int]) -> str:
    """Rows as the messages quote them: the first few, '...' when there are more."""
    head = ", ".join(map(str, rows[:4]))
    return f"{head}, ... ({len(rows)} rows)" if len(rows) > 4 else head or "none"


def default_register() -> Callable:
    """The imported tree's registration, looked up at call time so a patched tree or a plugin hook runs."""
    from sglang.srt.mem_cache import kv_cache_builder

    return kv_cache_builder.maybe_register_hicache_draft


# ---------------------------------------------------------------- content oracle


class Oracle:
    """The KV a token carries is a function of its whole prefix, so shared prefixes share KV.

    Each token's prefix hashes to a row of a random table (fixed seed); the
    target's and the draft's KV for that token are that row of their tables.
    """

    SLOTS = 4093

    def __init__(self, target_shape: tuple[int, ...], draft_shape: tuple[int, ...], seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.target = torch.randn((self.SLOTS, *target_shape), generator=g).to(torch.bfloat16)
        self.draft = torch.randn((self.SLOTS, *draft_shape), generator=g).to(torch.bfloat16)

    @staticmethod
    def slots(tokens: list[int]) -> torch.Tensor:
        out, h = [], 1469598103934665603
        for t in tokens:
            h = ((h ^ (t + 1)) * 1099511628211) & 0xFFFFFFFFFFFF
            out.append(h % Oracle.SLOTS)
        return torch.tensor(out, dtype=torch.int64)


class _Matched:
    """A MatchResult that lacks ``device_indices`` (0.5.23), with them attached."""

    def __init__(self, result, device_indices: torch.Tensor) -> None:
        self._result, self.device_indices = result, device_indices

    def __getattr__(self, name: str):
        return getattr(self._result, name)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


# ---------------------------------------------------------------- the run


@dataclass
class Counts:
    requests: int = 0
    tokens_written: int = 0
    tokens_loaded: int = 0
    tokens_checked: int = 0
    load_backs: int = 0
    host_evictions: int = 0  # host pages freed by sglang's evict_host: the host pool wrapped
    tokens_read_checked: int = 0  # tokens whose rows the draft attention's read path reads were checked


class HiCacheRun:
    """One rank's real HiRadixCache with a registered draft; use as a context manager.

    ``register`` is called with the tree's registration keywords; it defaults
    to the imported tree's ``maybe_register_hicache_draft`` (looked up at
    enter time, so the plugin's hook or the series is what runs).
    """

    def __init__(self, case: Case, *, register: Callable | None = None, ops: ReferenceOps | None = None,
                 seed: int = 0, cuda: bool = False, kernel_ops: object | None = None, dcp_group=None,
                 on_built: Callable[[HiCacheRun], None] | None = None, draft_byte_check: bool = True) -> None:
        self.case = case
        # False: check_device checks the target only (a negative control of the forward read, check_reads).
        self.draft_byte_check = draft_byte_check
        self.dcp_group = dcp_group
        self.on_built = on_built  # called once the pools exist: a multi-rank run's observers and sabotage
        self.register = register
        self.ops = ops if ops is not None else ReferenceOps()
        self.seed = seed
        self.cuda = cuda
        self.kernel_ops = kernel_ops
        self.counts = Counts()
        self._stack = contextlib.ExitStack()

    # -------------------------------------------------------------- build

    def __enter__(self) -> HiCacheRun:
        try:
            self._build()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def _build(self) -> None:
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams

        case = self.case
        self._stack.enter_context(substituted(self.ops, cuda=self.cuda, kernel_ops=self.kernel_ops))
        self.server_args = _server_args(case)
        self._stack.enter_context(_runtime_overrides(case, self.server_args, self.dcp_group))
        group = _process_group()

        self.target_device = _mla_pool(case, case.device_rows, case.page_size, case.target_layers)
        self.allocator = PagedTokenToKVPoolAllocator(
            case.device_rows * case.dcp_size, page_size=case.logical_page, dtype=torch.bfloat16,
            device=case.device, kvcache=self.target_device, need_sort=False,
        )
        params = CacheInitParams(
            disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=self.allocator,
            page_size=case.logical_page, tp_cache_group=group, pp_cache_group=None,
        )
        _check_draft_case(case, params)
        self.draft_device = _draft_device_pool(case)
        self.unified = case.draft_path == "sidecar"
        if self.unified:
            self.tree = _unified_cache(case, self.server_args, params, self.draft_device)
        else:
            from sglang.srt.mem_cache.hiradix_cache import HiRadixCache

            self.tree = HiRadixCache(params, self.server_args)
        self._stack.callback(self._shutdown)
        self.controller = self.tree.cache_controller

        register = self.register or default_register()
        if case.draft_path == "legacy":
            from sglang.srt.mem_cache import kv_cache_builder

            # HiRadixCache is not a UnifiedRadixCache, so maybe_register_hicache_draft takes this path.
            if not hasattr(kv_cache_builder, "_register_legacy_hicache_draft"):
                raise AssertionError(f"sglang {sglang_version()} has no legacy draft path")
        register(**_registration_kwargs(register, self.tree, self.draft_device, self.server_args, case))
        if self.unified:
            from sglang.srt.mem_cache.hicache_storage import PoolName

            host_group = self.controller.mem_pool_host  # HostPoolGroup: the anchor (target) and its sidecars
            self.target_host = host_group.entry_map[PoolName.KV].host_pool
            entry = host_group.entry_map.get(PoolName.DRAFT)
            self.draft_host = entry.host_pool if entry is not None else None
            if case.draft_plan == "packed":
                self.draft_host = self._packed_draft_host(entry)
        else:
            self.target_host = self.controller.mem_pool_host
            self.draft_host = self.controller.mem_pool_host_draft
        if self.draft_host is None:
            raise AssertionError(f"{getattr(register, '__name__', register)} registered no draft host pool")

        pools = [(f"{TARGET}/device", self.target_device), (f"{TARGET}/host", self.target_host),
                 (f"{DRAFT}/device", self.draft_device)]
        if self.draft_host is not self.target_host:  # packed: the draft's host layers are the target pool's tail
            pools.append((f"{DRAFT}/host", self.draft_host))
        for name, pool in pools:
            self.ops.register_pool(name, pool)
        self.last_load: tuple[torch.Tensor, list[list[int]]] | None = None  # (loaded locs, draft device rows written)
        self._count_host_evictions()

        self.oracle = Oracle(self._target_row_shape(), self._draft_row_shape(), self.seed)
        if self.on_built is not None:
            self.on_built(self)

    def _packed_draft_host(self, sidecar_entry):
        """PACKED: no sidecar, and the target host pool carries the draft's layers after its own."""
        if sidecar_entry is not None:
            raise AssertionError(f"{self.case.label()}: a packed draft got a sidecar host pool")
        host, case = self.target_host, self.case
        layers = (getattr(host, "target_layer_num", None), host.layer_num)
        if layers != (case.target_layers, case.target_layers + case.draft_layers):
            raise AssertionError(
                f"{case.label()}: the target host pool has (target, all) layers {layers}, not "
                f"({case.target_layers}, {case.target_layers + case.draft_layers}): the draft was not packed"
            )
        return host

    def _shutdown(self) -> None:
        # HiRadixCache registers an atexit hook; nothing else outlives the run.
        with contextlib.suppress(Exception):
            self.tree.shutdown()

    def _count_host_evictions(self) -> None:
        # Observation only: sglang's own evict_host runs unchanged. HiRadixCache asks its
        # controller to free host slots; UnifiedRadixCache drives host eviction itself.
        owner, counts = (self.tree if self.unified else self.controller), self.counts
        evict_host = owner.evict_host

        def counted(*args, **kwargs):
            freed = evict_host(*args, **kwargs)
            counts.host_evictions += int(freed)
            return freed

        owner.evict_host = counted

    # -------------------------------------------------------------- buffers

    def _target_row_shape(self) -> tuple[int, ...]:
        layer = self.target_device.kv_buffer[0]
        return (self.case.target_layers, *layer.shape[1:])

    def _draft_row_shape(self) -> tuple[int, ...]:
        if self.case.draft == "mla":
            layer = self.draft_device.kv_buffer[0]
            return (self.case.draft_layers, *layer.shape[1:])
        layer = self.draft_device.k_buffer[0]
        return (2, self.case.draft_layers, *layer.shape[1:])

    def _draft_layers(self) -> list[torch.Tensor]:
        if self.case.draft == "mla":
            return list(self.draft_device.kv_buffer)
        return list(self.draft_device.k_buffer) + list(self.draft_device.v_buffer)

    def _owned(self, locs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(positions, rows) of the locs this rank stores: loc % dcp == rank, at row loc // dcp."""
        locs = locs.cpu().to(torch.int64)
        mine = (locs % self.case.dcp_size == self.case.dcp_rank).nonzero().flatten()
        return mine, locs[mine] // self.case.dcp_size

    def _write_device(self, tokens: list[int], locs: torch.Tensor, start: int) -> None:
        """Store the oracle's KV for tokens[start:] at their freshly allocated device locs."""
        slots = Oracle.slots(tokens)[start:]
        pos, rows = self._owned(locs)
        target = self.oracle.target[slots[pos]]  # [n, layer, ...]
        for layer, buf in enumerate(self.target_device.kv_buffer):
            buf[rows.to(buf.device)] = target[:, layer].to(buf.device)
        draft = self.oracle.draft[slots]
        if self.case.draft_layout == "striped":
            if len(locs):  # sglang's naive MLA scatter cannot reshape an empty batch
                self._write_draft_striped(locs, draft)
            return
        all_locs = locs.cpu().to(torch.int64)
        if self.case.draft == "mha":
            # A dense DSPARK draft (DSparkDraftModel): its context KV goes in through the door
            # models/dspark.py::write_target_hidden_kv takes, the pool's own set_kv_buffer at the locs.
            device = self.draft_device.k_buffer[0].device
            for layer in range(self.case.draft_layers):
                dspark_context_write(self.draft_device, layer, all_locs.to(device), draft[:, 0, layer].to(device),
                                     draft[:, 1, layer].to(device))
            return
        for layer, buf in enumerate(self._draft_layers()):
            buf[all_locs.to(buf.device)] = draft[:, layer].to(buf.device)

    def _write_draft_striped(self, locs: torch.Tensor, draft: torch.Tensor) -> None:
        """The MLA draft forward's write, one draft layer at a time: layouts.py's, sglang's set_mla_kv_buffer.

        ``draft``: [n, layer, 1, kv_lora_rank + qk_rope_head_dim]. The pool's DCP
        owner rule (under this rank's runtime context) decides the rows.
        """
        from . import layouts

        rank = self.case.kv_lora_rank
        device = self.draft_device.kv_buffer[0].device
        for layer in range(self.case.draft_layers):
            values = (draft[:, layer, :, :rank].to(device), draft[:, layer, :, rank:].to(device))
            attention = SimpleNamespace(layer_id=layer, is_cross_attention=False)  # what the pool reads of it
            layouts.write(_draft_paths(self.case), self.draft_device, locs.to(device), values, layer=attention)

    def _draft_layout_rows(self, locs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(positions, rows) where the draft's forward keeps ``locs`` on this rank: the device layout."""
        if self.case.draft_layout == "striped":
            return self._owned(locs)
        all_locs = locs.cpu().to(torch.int64)
        return torch.arange(len(all_locs)), all_locs

    def _draft_read_rows(self, locs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(positions, rows) the draft attention reads for a request at ``locs``: its own read path (layouts.read)."""
        from . import layouts

        with triton_interpreted():
            positions, rows = layouts.read(_draft_paths(self.case), self.draft_device, locs.cpu().to(torch.int32))
        return positions.to(torch.int64), rows.cpu().to(torch.int64)

    def check_device(self, tokens: list[int], locs: torch.Tensor) -> None:
        """The device KV at ``locs`` is byte for byte what ``tokens`` were written with.

        The target on this rank's stripe; the draft where its device layout
        keeps each loc (every loc at row = loc, or this rank's stripe at row loc // dcp).
        """
        slots = Oracle.slots(tokens)[: len(locs)]
        pos, rows = self._owned(locs)
        want = self.oracle.target[slots[pos]]
        for layer, buf in enumerate(self.target_device.kv_buffer):
            got = buf[rows.to(buf.device)].cpu()
            bad = (_bits(got) != _bits(want[:, layer])).flatten(1).any(1)
            if bad.any():
                raise AssertionError(
                    f"{self.case.label()}: target layer {layer} differs at {int(bad.sum())} of {len(rows)} "
                    f"rows of this rank's stripe, first at token {int(pos[bad.nonzero()[0]])}"
                )
        if self.draft_byte_check:
            positions, rows = self._draft_layout_rows(locs)
            self._check_draft_rows(tokens, locs, positions, rows, what="draft buffer {layer}",
                                   where="the draft's forward keeps them at rows")
        self.counts.tokens_checked += len(locs)

    def check_reads(self, tokens: list[int], locs: torch.Tensor) -> None:
        """The rows the draft attention reads for a request at ``locs`` hold what ``tokens`` were written with.

        The rows come from the draft pool's own read path (layouts.read): for an
        MLA draft ``KVIndexTranslator.pack_read_stream``, then under DCP
        ``plan_dcp_decode_metadata`` (this rank's share) and
        ``KVIndexTranslator.translate_dcp_read_ids``; for an MHA draft the
        ``req_to_token`` passthrough (``KVIndexTranslator.read_source``).
        """
        positions, rows = self._draft_read_rows(locs)
        self._check_draft_rows(tokens, locs, positions, rows, what="the draft attention's read of draft buffer {layer}",
                               where="the draft attention's read path reads them at rows")
        self.counts.tokens_read_checked += len(positions)

    def _check_draft_rows(self, tokens, locs, positions, rows, *, what: str, where: str) -> None:
        """The draft's bytes at ``rows`` (those of the tokens at ``positions``) are what ``tokens`` were written with."""
        slots = Oracle.slots(tokens)[: len(locs)]
        draft = self.oracle.draft[slots[positions]]
        flat = draft if self.case.draft == "mla" else draft.flatten(1, 2)  # [n, k/v * layer, ...]
        for layer, buf in enumerate(self._draft_layers()):
            got = buf[rows.to(buf.device)].cpu()
            bad = (_bits(got) != _bits(flat[:, layer])).flatten(1).any(1)
            if bad.any():
                first = int(bad.nonzero()[0])
                message = (f"{self.case.label()}: {what.format(layer=layer)} differs at {int(bad.sum())} of "
                           f"{len(rows)} tokens, first at token {int(positions[first])} (row {int(rows[first])})")
                wrong = self._wrong_rows(locs, positions, rows, bad, where)
                if wrong:
                    raise DraftRowsWrong(f"{message}; {wrong}")
                raise AssertionError(message)

    def _wrong_rows(self, locs, positions, rows, bad, where: str) -> str:
        """Why the draft rows are wrong, when the last load-back wrote other rows than those checked; else ''.

        Only the tokens that load-back brought in count, and only with the
        replicated backup (a sharded one writes a stripe and all-gathers the rest).
        """
        if self.last_load is None or self.case.draft_backup != "replicated":
            return ""
        loaded, written = self.last_load
        index = {int(L): i for i, L in enumerate(locs.cpu().tolist())}
        first = index.get(int(loaded[0])) if len(loaded) else None
        if first is None or any(index.get(int(L)) != first + k for k, L in enumerate(loaded.tolist())):
            return ""  # the bad tokens were not the ones just loaded back
        mine = (positions >= first) & (positions < first + len(loaded))
        if not bool((bad & mine).any()):
            return ""
        checked = rows[mine].tolist()
        moved = [copy for copy in written if sorted(copy) != sorted(checked)]
        if not moved:
            return ""
        return (f"wrong rows: the load-back wrote draft rows {_span(moved[0])} for locs {_span(loaded.tolist())}, "
                f"{where} {_span(checked)}")

    def scrub_device(self) -> None:
        """NaN over every device buffer, so nothing that was not loaded back can pass the check."""
        for buf in list(self.target_device.kv_buffer) + self._draft_layers():
            buf.fill_(float("nan"))

    # -------------------------------------------------------------- sglang ops

    def _key(self, tokens: list[int]):
        from sglang.srt.mem_cache.radix_cache import RadixKey

        return RadixKey(array("q", tokens))  # 0.5.23's tree core requires int64 items (typecode q)

    def sync(self) -> None:
        """One scheduler round's event check: acks of finished writes and loads."""
        if self.cuda:
            torch.cuda.synchronize()
        self.tree.check_hicache_events()

    def match(self, tokens: list[int]):
        """sglang's match, with ``device_indices`` (the matched prefix's device locs) on every tree."""
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

        result = self.tree.match_prefix(MatchPrefixParams(key=self._key(tokens)))
        if hasattr(result, "device_indices"):
            return result
        # 0.5.23's MatchResult carries only the length; the locs lie on the path to last_device_node.
        path = self.tree.path_device_indices(result.last_device_node)
        return _Matched(result, path[: result.device_prefix_len])

    def load_back(self, tokens: list[int]):
        """Bring the host-only part of ``tokens``' cached prefix back to the device; the match of the whole prefix."""
        self.last_load = None
        result = self.match(tokens)
        if result.host_hit_length > 0:
            on_device = len(result.device_indices)
            self.ops.log = []  # which draft device rows this load-back writes (the reference ops log them)
            try:
                result = self._load_host_part(tokens, result)
            finally:
                log, self.ops.log = self.ops.log, None
            self.last_load = (result.device_indices[on_device:].cpu().to(torch.int64),
                              [dst_rows for _, dst, _, dst_rows in log if dst == f"{DRAFT}/device"])
        return result

    def _load_host_part(self, tokens: list[int], result):
        """``init_load_back`` for a match with a host hit, as a scheduler runs it; the match once the load has landed."""
        from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams

        extra = {}
        if self.unified:  # UnifiedRadixCache reads the request's match state: a stand-in with those fields
            extra["req"] = SimpleNamespace(
                last_node=result.last_device_node, swa_host_hit_length=0, mamba_host_hit_length=0,
                host_hit_length=result.host_hit_length, rid=f"harness-{self.counts.load_backs}",
                mamba_pool_idx=None, kv=SimpleNamespace(mamba_pool_idx=None),  # 0.5.23 moved it under req.kv
            )
        loaded, _node = self.tree.init_load_back(InitLoadBackParams(
            best_match_node=result.best_match_node, host_hit_length=result.host_hit_length,
            mem_quota=self.case.device_rows * self.case.dcp_size, **extra,
        ))
        # The loaded device indices; 0.5.23 returns their count instead.
        n = 0 if loaded is None else loaded if isinstance(loaded, int) else len(loaded)
        if n:
            self.tree.ready_to_load_host_cache()
            self.counts.load_backs += 1
            self.counts.tokens_loaded += n
        self.sync()
        return self.match(tokens)

    def _alloc(self, n: int) -> torch.Tensor:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        locs = self.allocator.alloc(n)
        if locs is None:
            self.sync()
            self.tree.evict(EvictParams(num_tokens=n))
            locs = self.allocator.alloc(n)
        if locs is None:
            raise AssertionError(f"{self.case.label()}: no device room for {n} tokens after eviction")
        return locs

    def write(self, tokens: list[int]) -> torch.Tensor:
        """Serve ``tokens`` as a request does: reuse the cached prefix, compute the rest, insert (write-through)."""
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams

        assert len(tokens) % self.case.logical_page == 0, "requests are whole logical pages"
        match = self.load_back(tokens)
        prefix = match.device_indices
        if len(prefix):
            self.check_device(tokens, prefix)
            if self.case.forward_read:
                self.check_reads(tokens, prefix)
        # The request holds its prefix while it computes the rest, as a scheduler's lock does.
        locked = self.tree.inc_lock_ref(match.last_device_node)
        try:
            fresh = self._alloc(len(tokens) - len(prefix)) if len(tokens) > len(prefix) else prefix[:0]
            self._write_device(tokens, fresh, len(prefix))
            locs = torch.cat([prefix.to(fresh.device), fresh])
            # prev_prefix_len: the part of ``locs`` the request already holds from the tree (a
            # scheduler's cache_protected_len); UnifiedRadixCache frees duplicates past it only.
            self.tree.insert(InsertParams(key=self._key(tokens), value=locs, prev_prefix_len=len(prefix)))
        finally:
            if hasattr(locked, "to_dec_params"):  # UnifiedRadixCache releases what its lock took
                self.tree.dec_lock_ref(match.last_device_node, locked.to_dec_params())
            else:
                self.tree.dec_lock_ref(match.last_device_node)
        self.sync()
        self.counts.requests += 1
        self.counts.tokens_written += len(fresh)
        return locs

    def evict_device(self, n: int | None = None) -> int:
        """L1 eviction through sglang: backed-up nodes keep their host copy."""
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        self.sync()
        n = self.tree.evictable_size() if n is None else n
        return self.tree.evict(EvictParams(num_tokens=n)).num_tokens_evicted

    @property
    def host_logical_slots(self) -> int:
        return self.target_host.logical_size

    @property
    def draft_host_bytes(self) -> int:
        """Bytes the draft host pool allocated: its buffers' storages, each counted once.

        A packed draft has no pool of its own: this is then the whole target host pool, draft layers included.
        """
        storages = {}
        for attr in ("kv_buffer", "k_buffer", "v_buffer"):
            value = getattr(self.draft_host, attr, None)
            for t in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(t, torch.Tensor):
                    storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return sum(storages.values())


def case_from(planned, **changes) -> Case:
    """A Case for one entry of matrix.py's plans."""
    fields = {k: getattr(planned, k)
              for k in ("dcp_size", "dcp_rank", "layout", "io_backend", "draft", "draft_path", "hicache_size",
                        "draft_plan", "draft_layout", "forward_read")}
    return replace(Case(**fields), **changes)
