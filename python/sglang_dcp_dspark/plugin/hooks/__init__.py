"""The plugin's hooks, one module per patched sglang module, and the one table of them.

vllm-ascend's layout. For sglang 0.5.17: ``server_args`` (the resolver),
``kv_cache_builder`` (the draft registration and its check-only guard hook),
``scheduler`` (the host-memory budget). For the draft sidecar of 0.5.19 and
later: ``hybrid_pool_assembler`` (the budget and the guard) and
``hicache_auto_size`` (the auto-size estimate); on 0.5.23 ``hicache_hook``
(the HiCache gate under DCP, deciding a draft by the layout its host pool
fits). For speculative decoding
under DCP: ``speculative_hook`` (the argument check the pass map drives) and,
on 0.5.22 and 0.5.23, ``flashinfer_mla_backend`` (the target verify planned
split, the prefix once and the window per draft token, which the check then
counts on, and a NextN draft's decode and extend) with ``forward_mla`` (that
draft extend merged across ranks as a decode is).

Each carrier declares its entries at its foot (:class:`entry.Hook`), by
reference as sglang's own HookRegistry takes them (the judge and the hook are
functions, not names), with what vllm-ascend's patch index carries for each:
the target, why it is needed, where it stands upstream, when to drop it, and
the stage of a launch its target runs in. docs/patches.md's hook index is
generated from them (``tools/hook_index.py``). The carriers import nothing of
sglang at module level: sglang is read when a judge runs, which is when sglang
imports the module a hook targets. Every entry is judged on the code it would
patch, so a release gets only the hooks its code needs.

The layers, each importing only those before it: :mod:`.common` (the
verdicts, quiet probes), :mod:`.entry` (the entry type, the release literals
and :meth:`Hook.decide`, the one decision on an entry), the carriers, and this
module, which assembles the table from the carriers.

:data:`HOOKS` is read by :func:`plugin.register`, which registers what
:meth:`Hook.decide` says of each entry with sglang's HookRegistry when its
module is imported, and by preflight, which evaluates a launch through the same
decision (:func:`in_effect`, :meth:`Hook.wrap`; the argument-time entries
through :func:`modules` of :data:`RESOLUTION_STAGE`): a hook added here reaches both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

# The carriers. HOOKS below takes their entries in the table's order: sglang 0.5.17's gate, draft registration
# and scheduler budget; the draft sidecar of 0.5.19 on (patches/upstream-next 0001-0003, 0009); the HiCache gate
# under DCP on 0.5.23 (0020); every release the pass map covers (the speculative check); and the flashinfer MLA
# verify planned split on 0.5.22 and 0.5.23 (0012), with the NextN draft's decode and extend.
from . import (
    flashinfer_mla_backend,
    forward_mla,
    hicache_auto_size,
    hicache_hook,
    hybrid_pool_assembler,
    kv_cache_builder,
    overrides,
    scheduler,
    server_args,
    speculative_hook,
)

# What a judge reaches and the entry type, for callers of the table (preflight, status, the tests), so they need
# not reach into the modules the carriers build on.
from .common import Finding, Verdict
from .entry import (
    FIXED_UPSTREAM_IN,
    FORWARD_STAGE,
    POOLS_STAGE,
    RESOLUTION_STAGE,
    STAGES,
    VERIFY_FIX_SINCE,
    WRITTEN_FOR,
    Decision,
    Hook,
)

__all__ = [
    "ASSEMBLER", "AUTO_SIZE", "BY_TARGET", "FIXED_UPSTREAM_IN", "FLASHINFER_MLA", "FORWARD_STAGE", "HOOKS",
    "POOLS_STAGE", "RESOLUTION_STAGE", "SIDECAR_CARRIES", "STAGES", "VERIFY_FIX_SINCE", "WRITTEN_FOR", "Decision",
    "Finding", "Hook", "Verdict", "hicache_gate_fix", "in_effect", "modules", "shipped_budget_verdict", "verify_fix",
    "without_pass_check",
]

HOOKS: tuple[Hook, ...] = (
    *server_args.HOOKS, *kv_cache_builder.HOOKS, *scheduler.HOOKS, *hybrid_pool_assembler.HOOKS,
    *hicache_auto_size.HOOKS, *hicache_hook.HOOKS, *overrides.HOOKS, *speculative_hook.HOOKS, *flashinfer_mla_backend.HOOKS,
    *forward_mla.HOOKS,
)
BY_TARGET = {hook.target: hook for hook in HOOKS}
# The budget verdict on a scheduler as its wheel ships it, read off the wheel's RECORD (preflight's 0.5.17 adapter).
shipped_budget_verdict = scheduler.shipped_budget_verdict


def modules(stage: str | None = None) -> tuple[str, ...]:
    """The sglang modules the table's entries sit on, in table order; with ``stage``, those of its entries only
    (preflight's resolution step applies the entries of ``modules(RESOLUTION_STAGE)``)."""
    return tuple(dict.fromkeys(hook.module for hook in HOOKS if stage is None or hook.stage == stage))


# The sglang modules the table's callers name (SIDECAR_CARRIES below, preflight's adapters, the tests): each
# carrier's own.
ASSEMBLER = hybrid_pool_assembler.MODULE
AUTO_SIZE = hicache_auto_size.MODULE
FLASHINFER_MLA = flashinfer_mla_backend.MODULE

# What the sidecar entries carry from the release where their sglang code first needs them, in the order
# ``status`` names them: (first release, the entry, what it does there, why a release before it has nothing of it).
# The per-release plugin tests hold this to the judges (test/releases/test_plugin_decisions.py).
SIDECAR_CARRIES: tuple[tuple[str, str, str, str], ...] = (
    ("0.5.23", f"{ASSEMBLER}.build_kv_only_stack", "counts the draft sidecar in --hicache-size",
     "the budget needs 0.5.23's CacheInitParams"),
    ("0.5.21", f"{AUTO_SIZE}._draft_bytes", "prices the draft sidecar in auto-sizing", "no auto-sizing before 0.5.21"),
    ("0.5.19", f"{ASSEMBLER}.build_full_draft_pools", "stops a short draft sidecar at startup", ""),
    ("0.5.23", f"{ASSEMBLER}.build_kv_only_stack", "checks each draft plan against its DCP layout", ""),
)


@contextlib.contextmanager
def in_effect(module: str) -> Iterator[dict]:
    """The hooks on ``module``'s targets applied for the duration, as the plugin would apply them.

    For a caller that must run sglang both ways in one process (preflight
    resolves a launch stock and with the plugin), so nothing goes through
    sglang's HookRegistry, whose hooks stay for the life of the process.
    """
    import pkgutil

    from ...core import swap

    findings: dict = {}
    wrapped = []
    # Every entry is judged before any is patched: a judge that reads a
    # neighbour (the estimate's follows _draft_bytes) must see sglang's code,
    # as under sglang's HookRegistry, where unhooked() sees through the hooks.
    for hook in HOOKS:
        if hook.module != module:
            continue
        owner_path, name = hook.target.rsplit(".", 1)
        try:
            owner = pkgutil.resolve_name(owner_path)
        except (ImportError, AttributeError):  # a module this release does not have
            continue
        original = getattr(owner, name, None)
        if original is None:
            continue
        decision = hook.decide(original)
        findings[hook.target] = decision.finding
        if decision.around is not None:
            wrapped.append((owner, name, decision.applied(original)))
    with contextlib.ExitStack() as stack:
        for owner, name, hooked in wrapped:
            stack.enter_context(swap.attribute(owner, name, hooked))
        yield findings


@contextlib.contextmanager
def without_pass_check() -> Iterator[None]:
    """The plugin's argument-time pass check off for the block (preflight sizes a launch it refuses, as if
    admitted); its other hooks as they are."""
    from ...core import swap

    with swap.attribute(speculative_hook, "check_passes_under_dcp", lambda server_args: None):
        yield


def hicache_gate_fix(plugin_on: bool) -> str | None:
    """Who decides the HiCache + DCP gate on EAGLE-family drafts by their layout: "upstream-next" where the
    release's code carries 0020, "plugin" where the plugin is on and its hook applies, else None (sglang's gate)."""
    return hicache_hook.gate_fix_in_effect(plugin_on=plugin_on)


def verify_fix(plugin_on: bool) -> str | None:
    """Who plans this release's flashinfer MLA verify split under DCP: "upstream-next" where its code
    carries 0012, "plugin" where the plugin is on and its hooks apply, else None (the release's own verify)."""
    return flashinfer_mla_backend.verify_fix_in_effect(plugin_on=plugin_on)
