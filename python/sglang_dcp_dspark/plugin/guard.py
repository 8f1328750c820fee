"""Fail-fast check that the draft HiCache host pool can hold every logical slot of the target's.

The replicated DSPARK draft host pool is indexed with the target host pool's
logical slots, one to one. If it has fewer rows than the target has logical
slots, L1 eviction writes past its end: on a GPU that is a crash or silent
corruption long after startup. Checking the two sizes right after
registration turns it into one clear error while the scheduler starts.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping

from ..core import rules
from ..core.errors import StartupError
from ..core.sizing import logical_slots
from . import switch


class Remedy(enum.Enum):
    """Why the draft host pool came out short, which decides the fix to print."""

    PLUGIN_OFF = "plugin_off"  # sglang skipped the plugin or it was switched off
    NOT_INSTALLED = "not_installed"  # on by the environment, but sglang cannot find its entry point
    SHADOWED = "shadowed"  # the plugin's sizing hook ran, but something under it sized the pool
    SERIES_MISSING = "series_missing"  # the plugin does not recognise this registration: only the series fixes it


SERIES_FIX = "run `sglang-dcp-dspark apply` (the series for sglang 0.5.17) or upgrade to sglang>=0.5.18"

REMEDY = {
    Remedy.PLUGIN_OFF: f"fix: turn the dcp_dspark plugin on ({switch.TURN_ON}), or {SERIES_FIX}",
    Remedy.NOT_INSTALLED: (
        "fix: pip install --no-deps a checkout of sglang-dcp-dspark (it is not on the package index) into the "
        "Python environment sglang runs in (sglang finds plugins "
        f"through installed entry points only), or {SERIES_FIX}"
    ),
    Remedy.SHADOWED: (
        "fix: another hook or edit replaced maybe_register_hicache_draft under the dcp_dspark plugin's hook "
        "(see sglang's 'Applied N hook(s) to ...maybe_register_hicache_draft' log line); remove it, or " + SERIES_FIX
    ),
    Remedy.SERIES_MISSING: f"fix: the dcp_dspark plugin does not recognise this sglang's draft registration; {SERIES_FIX}",
}


def remedy_for(environ: Mapping[str, str] = os.environ, installed: bool | None = None) -> Remedy:
    """The likely case when the caller does not know it: plugin off, plugin not installed, else only the series would do."""
    if not switch.plugin_state(environ).enabled:
        return Remedy.PLUGIN_OFF
    # A source checkout on PYTHONPATH imports this package but never loads as a plugin.
    if not (switch.entry_point_installed() if installed is None else installed):
        return Remedy.NOT_INSTALLED
    return Remedy.SERIES_MISSING


class DraftHostPoolTooSmall(StartupError):
    """Raised while the scheduler starts, so the launch stops before serving."""


def check_draft_host_pool(target_host_pool, draft_host_pool, remedy: Remedy | None = None) -> None:
    """Raise DraftHostPoolTooSmall unless the draft rows cover the target's logical slots."""
    need = logical_slots(target_host_pool)
    have = int(draft_host_pool.size)
    if rules.covers(have, need):
        return
    dcp = int(getattr(target_host_pool, "dcp_size", 1))
    raise DraftHostPoolTooSmall(
        f"draft HiCache host pool has {have} rows but the target host pool addresses {need} logical slots "
        f"({target_host_pool.size} rows x dcp_size {dcp}); expected at least {need} draft rows, "
        f"else L1 eviction writes past the draft buffer; {REMEDY[remedy or remedy_for()]}"
    )


def check_cache_controller(cache_controller, remedy: Remedy | None = None) -> None:
    """The same check on a HiCacheController after ``set_draft_kv_pool``; no draft, nothing to check."""
    draft = getattr(cache_controller, "mem_pool_host_draft", None)
    if draft is not None:
        check_draft_host_pool(cache_controller.mem_pool_host, draft, remedy)
