"""Fail-fast check that the draft HiCache host pool can hold every logical slot of the target's.

The replicated DSPARK draft host pool is indexed with the target host pool's
logical slots, one to one. If it has fewer rows than the target has logical
slots, L1 eviction writes past its end: on a GPU that is a crash or silent
corruption long after startup. Checking the two sizes right after
registration turns it into one clear error while the scheduler starts.
"""

from __future__ import annotations

from .errors import DcpDsparkError
from .sizing import logical_slots

REMEDY = (
    "fix: pip install sglang-dcp-dspark and keep its plugin on "
    "(unset SGLANG_PLUGINS or add dcp_dspark to it), or run `sglang-dcp-dspark apply`"
)


class DraftHostPoolTooSmall(DcpDsparkError):
    """Raised while the scheduler starts, so the launch stops before serving."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=1)


def check_draft_host_pool(target_host_pool, draft_host_pool) -> None:
    """Raise DraftHostPoolTooSmall unless the draft rows cover the target's logical slots."""
    need = logical_slots(target_host_pool)
    have = int(draft_host_pool.size)
    if have >= need:
        return
    dcp = int(getattr(target_host_pool, "dcp_size", 1))
    raise DraftHostPoolTooSmall(
        f"draft HiCache host pool has {have} rows but the target host pool addresses {need} logical slots "
        f"({target_host_pool.size} rows x dcp_size {dcp}); expected at least {need} draft rows, "
        f"else L1 eviction writes past the draft buffer; {REMEDY}"
    )


def check_cache_controller(cache_controller) -> None:
    """The same check on a HiCacheController after ``set_draft_kv_pool``; no draft, nothing to check."""
    draft = getattr(cache_controller, "mem_pool_host_draft", None)
    if draft is not None:
        check_draft_host_pool(cache_controller.mem_pool_host, draft)
