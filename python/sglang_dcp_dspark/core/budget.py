"""Count the replicated draft in HiCache's host-memory budget, and refuse launches that cannot fit.

With the fix, the DSPARK draft host pool has one row per *logical* slot of the
target host pool: dcp_size rows for every target row, pinned on every rank.
sglang 0.5.17 sizes only the target from ``--hicache-size`` and pins the draft
on top, so a launch that passes validation can pin several times its budget and
be OOM-killed after the weights load. The plugin runs :func:`fit_hicache_size`
right after the scheduler allocates its device pools (both the target's and the
draft's exist then, and no host pool does yet):

- with ``--hicache-size``, the target's share shrinks to t / (t + dcp_size * d)
  of it, so target plus draft fit the budget;
- with ``--hicache-ratio`` only, the pinned total and the draft's share are
  logged once, after the draft registers (:func:`log_pinned`);
- when not even a host pool that mirrors the device pool once fits this rank's
  share of free RAM, startup stops with the numbers.

``SGLANG_HICACHE_SIZE_EXCLUDES_DRAFT=1`` restores sglang's unbudgeted sizing
(the same switch as the 0.5.17 series' patch 0004; patches/upstream-next has
none, as upstream has no such switch: :func:`unbudgeted_sizing` turns its
split off where preflight prices sglang's own sizing).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

from . import rules
from .errors import StartupError
from .rules import GB, BudgetSplit
from .sizing import host_bytes_per_token

logger = logging.getLogger(__name__)

UNBUDGETED_ENV = "SGLANG_HICACHE_SIZE_EXCLUDES_DRAFT"


class HostMemoryTooSmall(StartupError):
    """Raised while the scheduler starts, before any host pool is pinned."""


def unbudgeted() -> bool:
    """Is the budget switched off? Read through sglang's own ``envs`` entry where the release has one, as the series does."""
    field = _env_field()
    if field is not None:
        return bool(field.get())
    return os.environ.get(UNBUDGETED_ENV, "").strip().lower() in ("1", "true", "yes", "on")


# patches/upstream-next 0001's split of --hicache-size, in sglang's module where the tree carries it.
SERIES_SPLIT = ("sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler", "_target_hicache_size")


@contextlib.contextmanager
def unbudgeted_sizing() -> Iterator[None]:
    """Inside the block every carrier sizes the target from the whole --hicache-size, as stock sglang does: the
    switch for the plugin and the 0.5.17 series, and upstream-next 0001's split answering "nothing to split"
    (it has no switch)."""
    import importlib

    from . import swap

    with contextlib.ExitStack() as stack:
        stack.enter_context(swap.environ(**{UNBUDGETED_ENV: "1"}))
        module_name, name = SERIES_SPLIT
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # a release without the module has no such split
            module = None
        if module is not None and hasattr(module, name):
            stack.enter_context(swap.attribute(module, name, swap.returning(None)))
        yield


def _env_field():
    import sys

    environ = sys.modules.get("sglang.srt.environ")
    return getattr(getattr(environ, "Envs", None), UNBUDGETED_ENV, None)


def declare_env() -> None:
    """Give sglang's ``envs`` the switch upstream-next 0001 adds, so sglang lists and exports it like its own."""
    from sglang.srt import environ

    if getattr(environ.Envs, UNBUDGETED_ENV, None) is not None:
        return
    field = environ.EnvBool(False)
    # sglang names its fields through __set_name__, closed once the class is built; the name is all it sets.
    field.name = UNBUDGETED_ENV
    setattr(environ.Envs, UNBUDGETED_ENV, field)


def local_ranks(server_args) -> int:
    """Ranks that share this host's RAM: the launcher spreads tp x pp evenly over nnodes."""
    return rules.ranks_per_node(
        getattr(server_args, "tp_size", 1), getattr(server_args, "pp_size", 1), getattr(server_args, "nnodes", 1)
    )


def rank_share_of_free_ram(server_args, available_bytes: int | None = None) -> int:
    """This rank's share of free host RAM after sglang's own reserve (:func:`rules.rank_share_of_free_ram`)."""
    import psutil
    from sglang.srt.mem_cache.pool_host.base import HICACHE_HOST_MEMORY_RESERVE_BYTES

    if available_bytes is None:
        available_bytes = psutil.virtual_memory().available
    return rules.rank_share_of_free_ram(available_bytes, HICACHE_HOST_MEMORY_RESERVE_BYTES, local_ranks(server_args))


def _draft_device_pool(scheduler):
    from sglang.srt.mem_cache.kv_cache_builder import get_draft_kv_pool
    from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool

    pool = get_draft_kv_pool(
        draft_worker=scheduler.draft_worker,
        spec_algorithm=scheduler.spec_algorithm,
        server_args=scheduler.server_args,
    )
    if isinstance(pool, HybridLinearKVPool):
        pool = pool.full_kv_pool
    return pool


def fit_hicache_size(scheduler, *, available_bytes: int | None = None) -> BudgetSplit | None:
    """Shrink ``server_args.hicache_size`` to the target's share; returns the split applied.

    Called once per scheduler process after ``Scheduler.init_memory_pools``;
    HiRadixCache reads ``hicache_size`` when it builds the target host pool
    right after, and the draft registration sizes from the target, not from it.
    """
    server_args = scheduler.server_args
    if not getattr(server_args, "enable_hierarchical_cache", False) or scheduler.draft_worker is None:
        return None
    draft_pool = _draft_device_pool(scheduler)
    if draft_pool is None:
        return None
    target_pool = scheduler.tp_worker.model_runner.token_to_kv_pool
    dcp = int(getattr(server_args, "dcp_size", 1) or 1)
    t, d = host_bytes_per_token(target_pool), host_bytes_per_token(draft_pool)
    share = rank_share_of_free_ram(server_args, available_bytes)

    # The smallest useful host pool mirrors the device pool once (a smaller L2
    # holds less than L1 and sglang warns that it is of little use).
    smallest = rules.smallest_host_bytes(target_pool.size, t, d, dcp)
    if smallest > share:
        raise HostMemoryTooSmall(
            f"HiCache needs at least {smallest / GB:.2f} GB pinned per rank (target {target_pool.size} rows x "
            f"{t} B + draft {target_pool.size * dcp} rows x {d} B at dcp_size {dcp}) but this rank's share of free "
            f"host RAM is {share / GB:.2f} GB ({local_ranks(server_args)} ranks per host, after sglang's reserve); "
            "fix: free host RAM, run fewer ranks per host, or launch without --enable-hierarchical-cache"
        )

    if server_args.hicache_size and server_args.hicache_size > 0 and not unbudgeted():
        split = BudgetSplit(int(server_args.hicache_size * GB), t, d, dcp, int(target_pool.page_size))
        logger.info(
            "HiCache budget %s GB per rank counts the draft at dcp_size %d: target %.2f GB (%d rows) + "
            "draft %.2f GB (%d rows); %s=1 restores the unbudgeted sizing",
            server_args.hicache_size, dcp, split.target_budget_bytes / GB, split.target_rows,
            split.draft_budget_bytes / GB, split.draft_rows, UNBUDGETED_ENV,
        )
        if split.target_rows < target_pool.size:
            logger.warning(
                "HiCache budget leaves the target host pool (%d rows) smaller than its device pool (%d rows); "
                "raise --hicache-size to at least %.2f GB for a full L2 mirror",
                split.target_rows, target_pool.size, smallest / GB,
            )
        server_args.hicache_size = split.target_hicache_size_gb
        return split

    if not server_args.hicache_size:
        planned = int(target_pool.size * server_args.hicache_ratio) * rules.bytes_per_target_row(t, d, dcp)
        if planned > share:
            logger.warning(
                "HiCache at --hicache-ratio %s will pin about %.2f GB per rank (draft included at dcp_size %d), "
                "more than this rank's %.2f GB share of free host RAM; set --hicache-size %.0f to stay within it",
                server_args.hicache_ratio, planned / GB, dcp, share / GB, share // GB,
            )
    return None


def log_pinned(cache_controller) -> None:
    """One line per rank at startup: what HiCache pins, and how much of it is the draft."""
    target = cache_controller.mem_pool_host
    draft = getattr(cache_controller, "mem_pool_host_draft", None)
    if draft is None:
        return
    target_bytes = int(target.size) * int(target.size_per_token)
    draft_bytes = int(draft.size) * int(draft.size_per_token)
    total = target_bytes + draft_bytes
    logger.info(
        "HiCache pins %.2f GB per rank: target %.2f GB (%d rows) + draft %.2f GB (%d rows, %.0f%% of the total) "
        "at dcp_size %d",
        total / GB, target_bytes / GB, target.size, draft_bytes / GB, draft.size,
        100 * draft_bytes / total if total else 0, getattr(target, "dcp_size", 1),
    )
