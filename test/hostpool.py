"""Test scaffolding around the plugin's probe pools: the scheduler's HiCache start-up, and touching every draft row.

The pool builders themselves are the plugin's (``sglang_dcp_dspark.core.probes``,
re-exported here so tests name one module); what only tests need lives here,
out of the wheel.
"""

from __future__ import annotations

from collections.abc import Callable

from sglang_dcp_dspark.core.probes import (  # re-exported for the tests
    DEVICE_ROWS as DEVICE_ROWS,
)
from sglang_dcp_dspark.core.probes import (
    DRAFT_LAYERS as DRAFT_LAYERS,
)
from sglang_dcp_dspark.core.probes import (
    HOST_RATIO as HOST_RATIO,
)
from sglang_dcp_dspark.core.probes import (
    KV_LORA_RANK as KV_LORA_RANK,
)
from sglang_dcp_dspark.core.probes import (
    MLA_LAYOUTS as MLA_LAYOUTS,
)
from sglang_dcp_dspark.core.probes import (
    PAGE_SIZE as PAGE_SIZE,
)
from sglang_dcp_dspark.core.probes import (
    QK_ROPE_HEAD_DIM as QK_ROPE_HEAD_DIM,
)
from sglang_dcp_dspark.core.probes import (
    TARGET_LAYERS as TARGET_LAYERS,
)
from sglang_dcp_dspark.core.probes import (
    ControllerStandIn as ControllerStandIn,
)
from sglang_dcp_dspark.core.probes import (
    Geometry as Geometry,
)
from sglang_dcp_dspark.core.probes import (
    PoolPair as PoolPair,
)
from sglang_dcp_dspark.core.probes import (
    build_draft_device_pool as build_draft_device_pool,
)
from sglang_dcp_dspark.core.probes import (
    build_pools as build_pools,
)
from sglang_dcp_dspark.core.probes import (
    build_target_host_pool as build_target_host_pool,
)
from sglang_dcp_dspark.core.probes import (
    draft_registration_args as draft_registration_args,
)
from sglang_dcp_dspark.core.probes import (
    scheduler_stand_in as scheduler_stand_in,
)
from sglang_dcp_dspark.core.probes import (
    server_args_for as server_args_for,
)
from sglang_dcp_dspark.core.probes import (
    unpinned_host_memory as unpinned_host_memory,
)


def touch_draft_rows(pair: PoolPair) -> None:
    """Index the real draft buffer with every slot the target can allocate.

    Raises IndexError where the draft host pool is too small: on CPU that
    is the out-of-bounds write that a GPU reports as an invalid argument.
    """
    draft = pair.draft_host_pool
    rows = pair.draft_rows_for(pair.allocatable_slots())
    if hasattr(draft, "head_num"):  # a dense draft's MHATokenToKVPoolHost: K and V first
        if draft.layout == "layer_first":  # [k/v, layer, row, head, dim]
            draft.kv_buffer[:, :, rows]
        elif draft.layout == "page_first":  # [k/v, row, layer, head, dim]
            draft.kv_buffer[:, rows]
        else:
            raise NotImplementedError(f"touch_draft_rows: MHA layout {draft.layout}")
        return
    if draft.layout == "layer_first":  # [layer, row, 1, dim]
        draft.kv_buffer[:, rows]
    elif draft.layout == "page_first":  # [row, layer, 1, dim]
        draft.kv_buffer[rows]
    else:  # page_first_direct: [page, layer, row in page, 1, dim]
        draft.kv_buffer[rows // draft.page_size, :, rows % draft.page_size]


def start_hicache(g: Geometry, *, init_memory_pools: Callable | None = None, register: Callable | None = None):
    """The scheduler's HiCache start-up on real pools: memory pools, target host pool, draft registration.

    ``init_memory_pools`` and ``register`` default to the imported sglang's
    ``Scheduler.init_memory_pools`` and ``maybe_register_hicache_draft``,
    looked up at call time, so a patched tree or the plugin's hooks run.
    Returns the pools and the server args as the scheduler left them.
    """
    if init_memory_pools is None:
        from sglang.srt.managers.scheduler import Scheduler

        init_memory_pools = Scheduler.init_memory_pools
    if register is None:
        from sglang.srt.mem_cache import kv_cache_builder

        register = kv_cache_builder.maybe_register_hicache_draft
    scheduler = scheduler_stand_in(g)
    init_memory_pools(scheduler)
    args = scheduler.server_args
    target = build_target_host_pool(
        g, device_pool=scheduler.tp_worker.model_runner.token_to_kv_pool, hicache_size_gb=args.hicache_size
    )
    kwargs = draft_registration_args(target, g, scheduler.draft_worker.draft_worker.draft_runner.token_to_kv_pool)
    kwargs["server_args"] = args
    with unpinned_host_memory():
        register(**kwargs)
    return PoolPair(g, target, kwargs["tree_cache"].cache_controller.mem_pool_host_draft), args
