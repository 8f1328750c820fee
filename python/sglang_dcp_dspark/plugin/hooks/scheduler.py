"""Hook on ``sglang.srt.managers.scheduler``: ``--hicache-size`` holds the draft too (series patch 0004).

The rule itself (the target's share t / (t + dcp_size * d)) is in
:mod:`rules`; :mod:`budget` applies it to the scheduler's pools.
"""

from __future__ import annotations

from collections.abc import Callable

from .common import Finding, Verdict, first_call, probing
from .entry import FIXED_UPSTREAM_IN, POOLS_STAGE, WRITTEN_FOR, Hook

MODULE = "sglang.srt.managers.scheduler"
INIT_MEMORY_POOLS = f"{MODULE}.Scheduler.init_memory_pools"
TARGET_ALONE = "--hicache-size sizes the target host pool alone"


def budget_verdict(init_memory_pools: Callable | None = None) -> Finding:
    """Does the scheduler count the draft host pool in --hicache-size?

    Asked of the real ``Scheduler.init_memory_pools`` on a stand-in scheduler
    around tiny device pools: one that already fits the budget (the 0.5.17
    series' patch 0004) changes ``hicache_size``, stock 0.5.17 does not. The
    hook is written against 0.5.17's scheduler; newer releases size their host
    pools elsewhere (patches/upstream-next carries the budget for them).
    """
    from ...core import probes
    from ...core.compat import installed_sglang_version, version_at_least

    version = installed_sglang_version()
    if version_at_least(version, FIXED_UPSTREAM_IN):
        return Finding(INIT_MEMORY_POOLS, Verdict.OUT_OF_SCOPE, f"the budget hook is for sglang {WRITTEN_FOR}, found {version}")
    if init_memory_pools is None:
        from sglang.srt.managers.scheduler import Scheduler

        init_memory_pools = getattr(Scheduler, "init_memory_pools", None)
    if init_memory_pools is None:
        return Finding(INIT_MEMORY_POOLS, Verdict.UNRECOGNISED, "Scheduler has no init_memory_pools")
    probe = probes.Geometry(dcp_size=2, device_rows=64, page_size=16, target_layers=1, hicache_size_gb=1.0)
    try:
        # The stand-in builds real device pools: a pool signature from another
        # release fails here, and must fail into a verdict, not out of an import.
        with probing():
            scheduler = probes.scheduler_stand_in(probe)
            init_memory_pools(scheduler)
    except Exception as exc:
        return Finding(INIT_MEMORY_POOLS, Verdict.UNRECOGNISED, f"budget probe failed: {type(exc).__name__}: {exc}")
    if scheduler.server_args.hicache_size != probe.hicache_size_gb:
        return Finding(INIT_MEMORY_POOLS, Verdict.FIXED, "init_memory_pools already counts the draft in --hicache-size")
    return Finding(INIT_MEMORY_POOLS, Verdict.NEEDS_FIX, TARGET_ALONE)


# What budget_verdict finds on the scheduler as each release's wheel ships it (test/plugin/test_plugin.py judges the
# real function on the stock tree and holds the two equal). preflight reads it off a file byte-identical to the
# wheel's instead of importing sglang's scheduler (about 0.4 s, a tenth of a judgement); a file changed in any
# byte, or a tree without its wheel's RECORD, is judged on the real function.
SHIPPED = {"0.5.17": Verdict.NEEDS_FIX}
SCHEDULER_FILE = "sglang/srt/managers/scheduler.py"


def shipped_budget_verdict() -> Finding | None:
    """budget_verdict's finding where the scheduler is the one a release's wheel shipped, else None."""
    from ...core.compat import as_shipped, locate_tree
    from ...core.errors import DcpDsparkError

    try:
        tree = locate_tree(None)
    except DcpDsparkError:
        return None
    if tree.version not in SHIPPED or not as_shipped(tree, SCHEDULER_FILE):
        return None
    return Finding(INIT_MEMORY_POOLS, SHIPPED[tree.version], TARGET_ALONE)


def count_draft_in_budget(original: Callable, scheduler, *args, **kwargs):
    """AROUND hook for ``Scheduler.init_memory_pools``: device pools first, then the host budget."""
    from ...core import budget

    first_call()
    result = original(scheduler, *args, **kwargs)
    budget.fit_hicache_size(scheduler)
    return result


# The table's entry (plugin/hooks/__init__.py collects it; docs/patches.md is generated from it).
HOOKS = (
    Hook(
        module=MODULE, target=INIT_MEMORY_POOLS, judge=budget_verdict, hook=count_draft_in_budget,
        stage=POOLS_STAGE,
        does="counts the replicated draft in --hicache-size and stops a launch whose host pools cannot fit",
        why="--hicache-size budgets the target host pool alone; the replicated draft pins dcp_size draft rows per "
            "target row on top of it, past the budget the operator set",
        upstream="not in sglang; PR #35875 (open) splits the budget t / (t + d), without the dcp factor",
        drop_when="with the rest of the 0.5.17 series, on 0.5.18 and later (the upstream-next entries carry it there)",
        series_patch="sglang-0.5.17/0004",
    ),
)
