"""Hook on ``sglang.srt.mem_cache.hicache_auto_size``: auto-sizing prices the draft sidecar at its logical rows (0.5.21+).

``--hicache-host-memory-fraction`` (#40135) picks the HiCache ratio from an
estimate of the host bytes each unit of ratio costs. sglang prices a full
draft sidecar at ``draft bytes x target.size / draft.size``, one host row per
*physical* target row, while the sidecar gets one row per *logical* slot:
dcp_size times as many under DCP. The estimate then undercounts the draft by
dcp_size, and the ratio it picks overshoots the host-memory fraction.
patches/upstream-next 0002 scales it; the AROUND hook here hands sglang's own
``_draft_bytes`` a view of the target whose ``size`` is its logical rows, which
is the same product. SWA drafts follow the target's SWA slots, which never
widen, and are left as they are; so are packed draft layers (the NextN draft
under DCP, 0009), which live in the target's own rows: a second hook, on
``_estimate_hicache_bytes``, tells ``_draft_bytes`` which drafts of the
estimate are sidecars.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable

from .common import Finding, Overlay, Verdict, first_call, probing, unhooked
from .entry import POOLS_STAGE, Hook

MODULE = "sglang.srt.mem_cache.hicache_auto_size"
DRAFT_BYTES = f"{MODULE}._draft_bytes"
ESTIMATE = f"{MODULE}._estimate_hicache_bytes"

# The draft pools the estimate being made prices as sidecars; None outside an estimate (a sidecar, as before).
_sidecars: contextvars.ContextVar[frozenset[int] | None] = contextvars.ContextVar("dcp_dspark_sidecars", default=None)


def _is_swa(pool) -> bool:
    from sglang.srt.mem_cache.base_swa_memory_pool import BaseSWAKVPool

    return isinstance(pool, BaseSWAKVPool)


def auto_size_verdict(draft_bytes: Callable | None = None) -> Finding:
    """Does the estimate price a full draft sidecar at dcp_size rows per target row?

    Asked of the real ``_draft_bytes`` on tiny MLA device pools at dcp 2.
    """
    import importlib

    from ...core import sidecar

    if draft_bytes is None:
        draft_bytes = unhooked(getattr(importlib.import_module(MODULE), "_draft_bytes", None))
    if draft_bytes is None:
        return Finding(DRAFT_BYTES, Verdict.OUT_OF_SCOPE, "hicache_auto_size has no _draft_bytes")
    rank = sidecar.Rank(dcp_size=2, device_rows=64, page_size=16, target_layers=1)
    try:
        with probing(), sidecar.on_rank(rank):
            pools = sidecar.device_pools(rank)
            got = draft_bytes(pools.target_device, pools.draft_device)
            draft = pools.draft_device.get_kv_size_bytes()
            draft = sum(draft) if isinstance(draft, tuple) else draft
    except Exception as exc:
        return Finding(DRAFT_BYTES, Verdict.UNRECOGNISED, f"auto-size probe failed: {type(exc).__name__}: {exc}")
    physical = draft * pools.target_device.size // pools.draft_device.size
    if got == physical * 2:
        return Finding(DRAFT_BYTES, Verdict.FIXED, "the estimate already prices the draft sidecar at its logical rows")
    if got == physical:
        return Finding(DRAFT_BYTES, Verdict.NEEDS_FIX,
                       f"the estimate prices the draft sidecar at the target's physical rows ({got} bytes for 2x as many at dcp 2)")
    return Finding(DRAFT_BYTES, Verdict.UNRECOGNISED, f"unexpected draft estimate {got} bytes (physical rows: {physical})")


def _attn_dcp_size() -> int:
    """This rank's DCP width; 1 where no parallel config is published (sizing outside a launch, as in unit tests), as in 0002."""
    from sglang.srt.runtime_context import get_context, get_parallel

    if not get_context().is_config_namespace_published("parallel"):
        return 1
    return get_parallel().attn_dcp_size


def price_logical_rows(original: Callable, target, draft, *args, **kwargs):
    """AROUND hook for ``_draft_bytes(target, draft)``."""
    first_call()
    sidecars = _sidecars.get()
    if _is_swa(draft) or (sidecars is not None and id(draft) not in sidecars):
        # SWA drafts follow the target's SWA slots; packed layers live in the target's own rows.
        return original(target, draft, *args, **kwargs)
    dcp = _attn_dcp_size()
    if dcp <= 1:
        return original(target, draft, *args, **kwargs)
    return original(Overlay(target, size=target.size * dcp), draft, *args, **kwargs)


def estimate_verdict(estimate: Callable | None = None) -> Finding:
    """The estimate hook tells a packed draft from a sidecar for the _draft_bytes hook: needed exactly where that one is."""
    draft_bytes = auto_size_verdict()
    return Finding(ESTIMATE, draft_bytes.verdict, f"follows _draft_bytes: {draft_bytes.detail}")


def note_sidecar_drafts(original: Callable, params, draft_plan=None, *args, **kwargs):
    """AROUND hook for ``_estimate_hicache_bytes(params, draft_plan)``: which drafts are sidecars, for this estimate."""
    first_call()
    mode = str(getattr(getattr(draft_plan, "mode", None), "value", getattr(draft_plan, "mode", ""))).lower()
    pools = tuple(getattr(draft_plan, "device_pools", ()) or ()) if mode == "sidecar" else ()
    token = _sidecars.set(frozenset(id(p) for p in pools))
    try:
        return original(params, draft_plan, *args, **kwargs)
    finally:
        _sidecars.reset(token)


# The table's entries (plugin/hooks/__init__.py collects them; docs/patches.md is generated from them).
HOOKS = (
    Hook(
        module=MODULE, target=DRAFT_BYTES, judge=auto_size_verdict, hook=price_logical_rows,
        stage=POOLS_STAGE,
        does="prices the draft sidecar at dcp_size rows per target row in the auto-size estimate",
        why="sglang's auto-sizing prices the draft sidecar at one row per target row; under DCP it pins dcp_size, "
            "so the estimate admits host pools the node cannot hold",
        upstream="not yet sent (patches/upstream-next 0002)",
        drop_when="upstream's estimate counts the sidecar at logical rows",
        series_patch="upstream-next/0002",
    ),
    Hook(
        module=MODULE, target=ESTIMATE, judge=estimate_verdict, hook=note_sidecar_drafts,
        stage=POOLS_STAGE,
        does="tells the _draft_bytes hook which drafts are sidecars: packed layers stay at one row per target row",
        why="only a sidecar draft spans the logical slots; a draft packed into the target's layout keeps one row "
            "per target row, and the _draft_bytes hook cannot tell the two apart",
        upstream="not yet sent (patches/upstream-next 0009)",
        drop_when="with the _draft_bytes entry",
        series_patch="upstream-next/0009",
    ),
)
