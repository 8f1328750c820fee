"""What differs between sglang releases, for preflight: one adapter per release family.

preflight asks every release the same two questions, and each release
answers them with its own code:

1. How does it resolve this launch? (:meth:`Release.resolve`, :meth:`Release.launch`):
   sglang's own parser and resolution, and the resolved values read back the
   way that release stores them.
2. Which HiCache host pools does it build for rank 0, and how big are they?
   (:meth:`Release.build`): its own pool builders, on the meta device.

Each family is one module, named after its first release, that states what
changed there and since when (:attr:`Release.changes`), so that a new release
needs one new adapter rather than edits across preflight:

- :mod:`.sglang_0_5_17`: fields resolved in ``__post_init__``; the target host
  pool from ``HiRadixCache``; the draft from ``maybe_register_hicache_draft``.
- :mod:`.sglang_0_5_18`: ``hicache_ratio`` may be left for a decode server to
  resolve; pools read a published runtime context; the draft's legacy path.
- :mod:`.sglang_0_5_19`: resolution is ``resolve_once()`` and is read through
  ``resolution_result``; every pool comes from ``hybrid_pool_assembler`` (the
  sidecar path); sglang's draft plans decide the draft.
- :mod:`.sglang_0_5_21`: auto-sizing from ``--hicache-host-memory-fraction``;
  one host-memory budget books every pool.

:func:`installed` picks the adapter by asking the imported code, newest
family first; the version only names it.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING

from ...core.errors import DcpDsparkError
from ...core.sidecar import optional_module
from ...core.sizing import MHAKV, MLAKV, HostPoolSize
from ..models import Models

if TYPE_CHECKING:
    from ..launch import Launch

from ...core.meta import on_meta

FAMILIES = ("sglang_0_5_21", "sglang_0_5_19", "sglang_0_5_18", "sglang_0_5_17")


@dataclass(frozen=True)
class Pinned:
    """One host pool the release builds, named as the report names it."""

    name: str  # "target KV", "draft sidecar", "DSA indexer", ...
    role: str  # "target", "draft" or "extra"
    built_by: str  # the sglang function or class that built it
    size: HostPoolSize


@dataclass
class Built:
    """Rank 0's host pools for one launch, as the release builds them (stock, hooked or patched)."""

    pools: list[Pinned] = field(default_factory=list)
    draft_plan: str | None = None  # sglang's HiCacheDraftMode, or "registration" before plans existed
    draft_path: str | None = None  # the function that built the draft's host pool
    hicache_ratio: float | None = None  # the ratio the pools were built at, after any auto-sizing
    auto_sized_from: float | None = None  # the ratio auto-sizing started from, when it ran
    target_hicache_size: float | None = None  # GB the target got, where something split --hicache-size
    startup_error: str | None = None  # what sglang raised while building: the launch stops there
    notes: list[str] = field(default_factory=list)

    def pool(self, role: str) -> Pinned | None:
        return next((p for p in self.pools if p.role == role), None)

    @property
    def target(self) -> HostPoolSize | None:
        p = self.pool("target")
        return p.size if p else None

    @property
    def draft(self) -> HostPoolSize | None:
        p = self.pool("draft")
        return p.size if p else None

    @property
    def bytes(self) -> int:
        return sum(p.size.bytes for p in self.pools)


class Release:
    """One release family. Subclasses override only what changed at their first release."""

    first = "?"  # the family's first release
    changes: tuple[str, ...] = ()  # what changed at ``first``, and since when

    def __init__(self, version: str | None) -> None:
        self.version = version or "unknown"
        self.findings: dict = {}  # the plugin's verdict on each hook target it judged while this adapter worked

    def record(self) -> dict:
        """A fresh record of what the plugin's hooks decide, for one judgement: what they decide from here on is
        written there, and a judgement reads its own record, not what an earlier one left."""
        self.findings = {}
        return self.findings

    @staticmethod
    def decisions(found: dict) -> dict[str, str]:
        """What the plugin's hooks decided (a :meth:`record`), target by target."""
        return {target: f"{f.verdict.name}: {f.detail}" for target, f in found.items()}

    @property
    def name(self) -> str:
        return f"sglang {self.version}"

    @classmethod
    def matches(cls) -> bool:
        """Does the imported sglang have this family's code? Asked of the code, never of the version."""
        raise NotImplementedError

    # ---------------------------------------------------------------- resolution

    def resolve(self, argv: list[str], *, hooked: bool = False):
        """sglang's own parse and resolution of ``argv``; raises whatever sglang raises to refuse it.

        ``hooked``: with the plugin's hooks on ``server_args`` in effect.
        """
        from sglang.srt.server_args import prepare_server_args

        with self.resolution_hooks(hooked):
            return prepare_server_args(list(argv))

    def value(self, args, name: str, default=None):
        """A resolved field."""
        return getattr(args, name, default)

    def launch(self, args) -> Launch:
        from ..launch import Launch, dcp_size

        v = self.value
        return Launch(
            model_path=v(args, "model_path"), draft_model_path=v(args, "speculative_draft_model_path"),
            tp_size=int(v(args, "tp_size", 1) or 1), pp_size=int(v(args, "pp_size", 1) or 1),
            nnodes=int(v(args, "nnodes", 1) or 1), dcp_size=dcp_size(v(args, "dcp_size")),
            page_size=_int_or(v(args, "page_size"), 1),
            enable_hierarchical_cache=bool(v(args, "enable_hierarchical_cache", False)),
            hicache_ratio=v(args, "hicache_ratio"), hicache_size=float(v(args, "hicache_size", 0) or 0),
            hicache_mem_layout=v(args, "hicache_mem_layout", "layer_first"),
            hicache_io_backend=v(args, "hicache_io_backend"),
            hicache_host_memory_mode=v(args, "hicache_host_memory_mode"),
            hicache_host_memory_fraction=v(args, "hicache_host_memory_fraction"),
            hicache_storage_backend=v(args, "hicache_storage_backend"),
            speculative_algorithm=v(args, "speculative_algorithm"),
            disaggregation_mode=v(args, "disaggregation_mode"),
            mem_fraction_static=v(args, "mem_fraction_static"),
            kv_cache_dtype=str(v(args, "kv_cache_dtype", "auto")),
            hicache_draft_backup=v(args, "hicache_draft_backup"),
            attention_backends=self.attention_backends(args),
            speculative_draft_attention_backend=v(args, "speculative_draft_attention_backend"),
            record=args,
        )

    def attention_backends(self, args) -> tuple:
        """The target's (prefill, decode) attention backends as the release resolved them: its own reader where it
        has one (``attention_backends_of`` over the resolved view, 0.5.19 on; ``get_attention_backends``, 0.5.17),
        else the fields."""
        try:
            from sglang.srt.arg_groups.overrides import attention_backends_of, resolved_view

            return tuple(attention_backends_of(resolved_view(args)))
        except (ImportError, AttributeError, TypeError):
            pass
        get = getattr(args, "get_attention_backends", None)
        if callable(get):
            return tuple(get())
        backend = self.value(args, "attention_backend")
        return (self.value(args, "prefill_attention_backend") or backend,
                self.value(args, "decode_attention_backend") or backend)

    # ---------------------------------------------------------------- pools

    def build(self, launch: Launch, models: Models, device_rows: int, *, hooked: bool,
              host_ram: int, backup: str | None = None) -> Built:
        """Rank 0's host pools on the meta device.

        ``hooked``: with the plugin's hooks in effect, judged as the plugin
        judges them. ``host_ram``: the node's available host RAM in bytes;
        sglang's own check against free RAM is answered from it the way the
        release asks it (the whole node per pool, or this rank's share).
        ``backup``: ``--hicache-draft-backup`` where the tree has it.
        """
        raise NotImplementedError

    # ---------------------------------------------------------------- shared helpers

    def model_layers(self, model_config, *, draft: bool) -> int:
        """KV layers a worker of this model builds: sglang's own count (``layer_setup``), given no loaded model.

        A draft with NextN layers counts those (``num_nextn_predict_layers``),
        any other model the larger of its hidden and attention layers.
        """
        layer_setup = optional_module("sglang.srt.model_executor.model_runner_components.layer_setup")
        count = getattr(layer_setup, "_compute_model_num_layers", None)
        if count is not None:
            return int(count(model=SimpleNamespace(), model_config=model_config, is_draft_worker=draft))
        nextn = model_config.num_nextn_predict_layers or 0
        return int(nextn if draft and nextn > 0 else max(model_config.num_hidden_layers, model_config.num_attention_layers))

    def attention_tp_size(self, launch: Launch) -> int:
        """The attention TP width the KV heads are split over (DCP does not narrow it), as sglang derives it."""
        import inspect

        from sglang.srt.layers import dp_attention

        v, args = self.value, launch.record
        tp = launch.tp_size
        dp = int(v(args, "dp_size", 1) or 1) if v(args, "enable_dp_attention", False) else 1
        cp = int(v(args, "attn_cp_size", 1) or 1)
        compute = dp_attention.compute_dp_attention_world_info
        # Up to 0.5.22 it takes enable_dp_attention and dp_size; 0.5.23 takes the attention DP width itself.
        if "enable_dp_attention" in inspect.signature(compute).parameters:
            return int(compute(dp > 1, 0, tp, dp, cp)[1])
        return int(compute(0, tp, dp, cp)[1])

    @staticmethod
    def resolution_modules() -> tuple[str, ...]:
        """The sglang modules whose hooks judge a launch's arguments, in the plugin table's order: its entries of
        the resolution stage (0.5.17's resolver and default backend, the default backend of 0.5.19 on, the
        speculative gate)."""
        from ...plugin import hooks

        return hooks.modules(hooks.RESOLUTION_STAGE)

    @contextlib.contextmanager
    def resolution_hooks(self, hooked: bool):
        with contextlib.ExitStack() as stack:
            for module in self.resolution_modules():
                if optional_module(module) is not None:
                    stack.enter_context(self.hooks_on(module, hooked))
            yield

    @contextlib.contextmanager
    def hooks_on(self, module: str, hooked: bool):
        """The plugin's table entries on ``module`` in effect for the block, judged as the plugin judges them."""
        if not hooked:
            yield {}
            return
        from ...plugin import hooks

        with hooks.in_effect(module) as found:
            self.findings.update(found)
            yield found


def _int_or(value, default: int) -> int:
    """A resolved integer field; ``default`` only where sglang left it unset (0 stays 0, for the checks to see)."""
    return default if value is None else int(value)


def _device_pool(kv: MLAKV | MHAKV, rows: int, page_size: int, *, dsa_index_head_dim: int | None = None):
    """sglang's MLA (or DSA) or dense MHA device pool, on the meta device but for the reduced-scale cross-checks."""
    from ...core import pools

    return pools.device_pool(kv, rows, page_size, meta=on_meta(), dsa_index_head_dim=dsa_index_head_dim)


def device_pools(launch: Launch, models: Models, device_rows: int) -> SimpleNamespace:
    """The target's device pool on this rank, and the draft's over the logical locs (loc_space_scale).

    The draft, MLA or dense, spans the widened logical loc space on every DCP
    rank (``KVCacheConfigurator.loc_space_scale``).
    """
    target = _device_pool(models.target, device_rows, launch.page_size, dsa_index_head_dim=models.dsa_index_head_dim)
    draft = None
    if models.draft is not None:
        draft = _device_pool(models.draft, device_rows * launch.dcp_size, launch.page_size * launch.dcp_size)
    return SimpleNamespace(target=target, draft=draft)


def installed() -> Release:
    """The adapter for the sglang this interpreter imports: the newest family whose code it has."""
    from ...core.compat import installed_sglang_version
    from ..launch import about_this_machine_quiet

    version = installed_sglang_version()
    with about_this_machine_quiet():  # the checks import sglang's cache modules
        for name in FAMILIES:
            module = importlib.import_module(f"{__name__}.{name}")
            if module.Adapter.matches():
                return module.Adapter(version)
    # The releases the project covers are the ones the pass map has a table for (docs/layout.md, "add a release").
    from ... import passes

    known = passes.releases()
    raise DcpDsparkError(
        f"preflight does not recognise the code of sglang {version or 'of unknown version'} (none of its release "
        f"adapters, {', '.join(f.replace('sglang_', '').replace('_', '.') for f in FAMILIES)}, matches it); expected "
        f"sglang {known[0]} to {known[-1]}; fix: pip install sglang=={known[-1]}, or add an adapter in "
        "sglang_dcp_dspark/preflight/releases"
    )


@contextlib.contextmanager
def host_pools_on_meta(available: int) -> Iterator[None]:
    """Pre-0.5.19 host pools at full geometry that allocate nothing; sglang's free-RAM check sees ``available``.

    From 0.5.19 :mod:`sidecar` does the same inside the runtime context.
    """
    import torch

    from ...core.meta import on_meta_mode
    from ...core.sidecar import stand_in_host_memory

    def on_meta_device(sglangs_alloc):
        return lambda dims, dtype: torch.empty(dims, dtype=dtype, device="meta")

    meta = on_meta()
    with contextlib.ExitStack() as stack:
        stand_in_host_memory(stack, lambda: available, on_meta_device if meta else None)
        if meta:
            stack.enter_context(on_meta_mode())
        yield





# ---------------------------------------------------------------- sglang's own decisions, asked on stand-ins


def draft_plan(launch: Launch, models: Models, draft_device_pool):
    """The HiCacheDraftPlan the release's own ``BaseSpecWorker._build_hicache_draft_plan`` picks (0.5.18 on).

    Asked inside a published runtime context, on stand-ins for the workers:
    the target runner, and draft runners that carry the draft device pool
    and the draft config's architecture and NextN layer count.
    """
    from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algorithm = SpeculativeAlgorithm.from_string(launch.speculative_algorithm)
    runner = SimpleNamespace(
        token_to_kv_pool=draft_device_pool, req_to_token_pool=SimpleNamespace(),
        model_config=SimpleNamespace(num_nextn_predict_layers=models.draft_nextn_layers,
                                     hf_config=SimpleNamespace(architectures=[models.draft_architecture or ""])),
    )
    worker = SimpleNamespace(
        target_worker=SimpleNamespace(model_runner=SimpleNamespace(spec_algorithm=algorithm, req_to_token_pool=SimpleNamespace())),
        draft_worker=SimpleNamespace(model_runner=runner, draft_runners=[runner]),
    )
    worker._draft_model_runners = lambda: BaseSpecWorker._draft_model_runners(worker)
    plan = BaseSpecWorker._build_hicache_draft_plan(worker)
    return plan, tuple(worker.target_worker.model_runner.mtp_draft_device_pools or ())


def plan_name(plan) -> str | None:
    mode = getattr(plan, "mode", None)
    return None if mode is None else str(getattr(mode, "name", mode)).upper()


def decode_ratio(launch: Launch, target_device_pool) -> None:
    """A decode server's HiCache ratio, as ``kv_cache_builder.resolve_decode_retraction_backup`` resolves it.

    Needs the built KV pool, so sglang resolves it after the arguments; run
    here inside the published runtime context, on a stand-in for the TP worker.
    """
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache import kv_cache_builder

    tp_worker = SimpleNamespace(
        get_memory_pool=lambda: (None, SimpleNamespace(get_kvcache=lambda: target_device_pool)),
        is_hybrid_swa=False, get_tokens_per_layer_info=lambda: (None, None),
        model_runner=SimpleNamespace(mtp_draft_device_pools=(), spec_algorithm=_algorithm(launch),
                                     # The model's own config, as sglang loads it: some releases ask it whether
                                     # the model keeps recurrent state beside its KV.
                                     model_config=ModelConfig.from_server_args(launch.record)),
    )
    kv_cache_builder.resolve_decode_retraction_backup(tp_worker=tp_worker)


def _algorithm(launch: Launch):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return SpeculativeAlgorithm.from_string(launch.speculative_algorithm)


def memory_pool_host_indexer(launch, dsa_pool, anchor) -> Pinned:
    """A DSA model's indexer host pool where ``memory_pool_host`` builds it (0.5.17 and 0.5.18)."""
    from sglang.srt.mem_cache import memory_pool_host
    from sglang.srt.mem_cache.pool_host.common import get_allocator_type

    from ...core.sizing import HostPoolSize

    storage = SimpleNamespace(hicache_storage_backend=launch.hicache_storage_backend,
                              hicache_storage_backend_extra_config=None)
    pool = memory_pool_host.DSAIndexerPoolHost(dsa_pool, anchor, launch.hicache_mem_layout,
                                               allocator_type=get_allocator_type(storage))
    return Pinned("DSA indexer", "extra", "memory_pool_host.DSAIndexerPoolHost", HostPoolSize.of(pool))
