"""The plugin's hooks, one module per patched sglang module, and the one table of them.

vllm-ascend's layout. For sglang 0.5.17: ``server_args`` (the resolver),
``kv_cache_builder`` (the draft registration and its check-only guard hook),
``scheduler`` (the host-memory budget). For the draft sidecar of 0.5.19 and
later: ``hybrid_pool_assembler`` (the budget and the guard) and
``hicache_auto_size`` (the auto-size estimate). For speculative decoding
under DCP: ``speculative_hook`` (the argument check the pass map drives) and,
on 0.5.22 and 0.5.23, ``flashinfer_mla_backend`` (the target verify planned
per draft token, which the check then counts on).
Every entry is judged on the
code it would patch, so a release gets only the hooks its code needs, and
the carriers are imported only when their sglang module is.

:data:`HOOKS` is read by :func:`plugin.register`, which
registers each entry with sglang's HookRegistry when its module is imported,
and by preflight, which evaluates a launch through the same entries
(:meth:`Hook.wrap`, :func:`in_effect`): a hook added here reaches both.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterator


class Hook:
    """One table entry. A plain class: ``plugin.register`` imports this table in every sglang process."""

    __slots__ = ("module", "target", "carrier", "judge_name", "hook_name", "does", "series_patch", "check_only_name",
                 "installed_name")

    def __init__(self, *, module: str, target: str, carrier: str, judge_name: str, hook_name: str, does: str,
                 series_patch: str, check_only_name: str | None = None, installed_name: str | None = None) -> None:
        self.module = module  # the sglang module whose import decides this hook
        self.target = target  # dotted path, as sglang's HookRegistry takes it
        self.carrier = carrier  # the module under hooks/ that holds judge and hook
        self.judge_name = judge_name  # (original | None) -> Finding: does the code need the hook?
        self.hook_name = hook_name  # AROUND hook, installed on NEEDS_FIX
        self.does = does  # what the hook changes, for the decision log and docs
        self.series_patch = series_patch  # the series patch that carries the same change
        self.check_only_name = check_only_name  # () -> AROUND hook | None, installed when the judge cannot tell
        self.installed_name = installed_name  # () -> None, run once when the hook is registered (what the patch adds beside it)

    def __repr__(self) -> str:
        return f"Hook({self.target})"

    def _attr(self, name: str):
        # Looked up at call time, so a test that replaces a hook sees it used everywhere.
        return getattr(importlib.import_module(f"{__name__}.{self.carrier}"), name)

    @property
    def judge(self) -> Callable:
        return self._attr(self.judge_name)

    @property
    def hook(self) -> Callable:
        return self._attr(self.hook_name)

    def check_only(self) -> Callable | None:
        return self._attr(self.check_only_name)() if self.check_only_name else None

    def installed(self) -> None:
        if self.installed_name:
            self._attr(self.installed_name)()

    def judged(self, original: Callable | None = None):
        from ._common import by_version

        try:
            return self.judge(original) if original is not None else self.judge()
        except Exception as exc:  # a probe never breaks sglang's import
            return by_version(self.target, f"probe raised {type(exc).__name__}: {exc}")

    def wrap(self, original: Callable, *, check_only: bool = True):
        """``original`` as the plugin would leave it: hooked, checked, or untouched; with the verdict."""
        from ._common import Finding, Verdict, unhooked

        if unhooked(original) is not original:
            # sglang's HookRegistry wraps it already: the plugin was loaded in this process. A judge
            # that follows a neighbour sees through those wrappers and would hook it a second time.
            return Finding(self.target, Verdict.FIXED, "hooked already in this process (load_plugins)"), original
        finding = self.judged(original)
        around = None
        if finding.verdict is Verdict.NEEDS_FIX:
            around = self.hook
        elif check_only and finding.verdict is Verdict.UNRECOGNISED:
            around = self.check_only()
        if around is None:
            return finding, original

        @functools.wraps(original)
        def hooked(*args, **kwargs):
            return around(original, *args, **kwargs)

        return finding, hooked


# The releases the table is written against: the one the 0.5.17 hooks were written for and tested on, and the
# first that carries PR #35221 upstream. Release literals live here and in releases/ only.
WRITTEN_FOR = "0.5.17"
FIXED_UPSTREAM_IN = "0.5.18"
# The first release whose flashinfer MLA verify the plugin's per-draft-token hooks apply to (its code has 0.5.23's
# shape from 0.5.22 on; upstream-next 0012 is written against 0.5.23).
VERIFY_FIX_SINCE = "0.5.22"

ASSEMBLER = "sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler"
AUTO_SIZE = "sglang.srt.mem_cache.hicache_auto_size"
SPECULATIVE_MODULE = "sglang.srt.arg_groups.speculative_hook"
FLASHINFER_MLA = "sglang.srt.layers.attention.flashinfer_mla_backend"

HOOKS: tuple[Hook, ...] = (
    # sglang 0.5.17: the gate, the draft registration and the scheduler's budget.
    Hook(
        module="sglang.srt.server_args",
        target="sglang.srt.server_args.ServerArgs._resolve_hicache_dcp_compatibility",
        carrier="server_args",
        judge_name="resolver_verdict",
        hook_name="admit_dspark",
        does="admits DSPARK through the HiCache + DCP gate; other algorithms are refused in the series' words",
        series_patch="sglang-0.5.17/0001",
    ),
    Hook(
        module="sglang.srt.mem_cache.kv_cache_builder",
        target="sglang.srt.mem_cache.kv_cache_builder.maybe_register_hicache_draft",
        carrier="kv_cache_builder",
        judge_name="registration_verdict",
        hook_name="size_draft_from_logical",
        does="sizes the draft host pool from the target's logical_size, then stops startup if it is short",
        series_patch="sglang-0.5.17/0002, 0003",
        check_only_name="check_only_if_needed",
    ),
    Hook(
        module="sglang.srt.managers.scheduler",
        target="sglang.srt.managers.scheduler.Scheduler.init_memory_pools",
        carrier="scheduler",
        judge_name="budget_verdict",
        hook_name="count_draft_in_budget",
        does="counts the replicated draft in --hicache-size and stops a launch whose host pools cannot fit",
        series_patch="sglang-0.5.17/0004",
    ),
    # sglang 0.5.19 to 0.5.23, the draft sidecar: what patches/upstream-next 0001-0003 change.
    Hook(
        module=ASSEMBLER,
        target=f"{ASSEMBLER}.build_kv_only_stack",
        carrier="hybrid_pool_assembler",
        judge_name="budget_verdict",
        hook_name="count_sidecar_in_budget",
        does="gives the target t / (t + dcp_size * d) of --hicache-size, so target and draft sidecar fit it, after "
             "checking each draft's plan against its DCP layout",
        series_patch="upstream-next/0001, 0009",
        installed_name="declare_env",
    ),
    Hook(
        module=ASSEMBLER,
        target=f"{ASSEMBLER}.build_kv_only_group",
        carrier="hybrid_pool_assembler",
        judge_name="group_verdict",
        hook_name="size_target_from_share",
        does="builds the target host pool at that share (the host_size argument upstream-next 0001 passes)",
        series_patch="upstream-next/0001",
    ),
    Hook(
        module=ASSEMBLER,
        target=f"{ASSEMBLER}.build_full_draft_pools",
        carrier="hybrid_pool_assembler",
        judge_name="guard_verdict",
        hook_name="guard_sidecar",
        does="stops startup if the draft sidecar misses logical slots, and logs what HiCache pins per rank",
        series_patch="upstream-next/0003",
    ),
    Hook(
        module=AUTO_SIZE,
        target=f"{AUTO_SIZE}._draft_bytes",
        carrier="hicache_auto_size",
        judge_name="auto_size_verdict",
        hook_name="price_logical_rows",
        does="prices the draft sidecar at dcp_size rows per target row in the auto-size estimate",
        series_patch="upstream-next/0002",
    ),
    Hook(
        module=AUTO_SIZE,
        target=f"{AUTO_SIZE}._estimate_hicache_bytes",
        carrier="hicache_auto_size",
        judge_name="estimate_verdict",
        hook_name="note_sidecar_drafts",
        does="tells the _draft_bytes hook which drafts are sidecars: packed layers stay at one row per target row",
        series_patch="upstream-next/0009",
    ),
    # Every release the pass map covers: speculative launches whose passes crash or read other rows under DCP.
    Hook(
        module=SPECULATIVE_MODULE,
        target=f"{SPECULATIVE_MODULE}.handle_speculative_decoding",
        carrier="speculative_hook",
        judge_name="passes_verdict",
        hook_name="refuse_broken_passes",
        does="refuses under DCP, at argument time, each launch whose passes the map shows crashing or reading other rows",
        series_patch="upstream-next/0008",
        installed_name="declare_check",
    ),
    # sglang 0.5.22 and 0.5.23: the target verify under DCP on flashinfer MLA, planned per draft token (what 0012
    # changes).
    Hook(
        module=FLASHINFER_MLA,
        target=f"{FLASHINFER_MLA}.FlashInferMLAIndicesUpdaterPrefill.call_begin_forward",
        carrier="flashinfer_mla_backend",
        judge_name="verify_verdict",
        hook_name="plan_verify_per_row",
        does="plans a verify under DCP with one row per draft token over this rank's keys up to its position, "
             "heads x dcp, no causal mask",
        series_patch="upstream-next/0012",
    ),
    Hook(
        module=FLASHINFER_MLA,
        target=f"{FLASHINFER_MLA}.FlashInferMLAAttnBackend.init_forward_metadata_out_graph",
        carrier="flashinfer_mla_backend",
        judge_name="same_verdict",
        hook_name="capture_verify_rows",
        does="captures a verify graph under DCP on a wrapper bound to one row per draft token",
        series_patch="upstream-next/0012",
    ),
    Hook(
        module=FLASHINFER_MLA,
        target=f"{FLASHINFER_MLA}.FlashInferMLAAttnBackend.forward_extend",
        carrier="flashinfer_mla_backend",
        judge_name="same_verdict",
        hook_name="verify_with_lse",
        does="returns a verify's (out, lse) under DCP, the neutral partial for a row this rank holds no key of",
        series_patch="upstream-next/0012",
    ),
)
BY_TARGET = {hook.target: hook for hook in HOOKS}

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
        findings[hook.target], hooked = hook.wrap(original)
        if hooked is not original:
            wrapped.append((owner, name, hooked))
    with contextlib.ExitStack() as stack:
        for owner, name, hooked in wrapped:
            stack.enter_context(swap.attribute(owner, name, hooked))
        yield findings


def verify_fix(plugin_on: bool) -> str | None:
    """Who plans this release's flashinfer MLA verify per draft token under DCP: "upstream-next" where its code
    carries 0012, "plugin" where the plugin is on and its hooks apply, else None (the release's own verify)."""
    from .flashinfer_mla_backend import verify_fix_in_effect

    return verify_fix_in_effect(plugin_on=plugin_on)


def __getattr__(name: str):
    """``Finding`` and ``Verdict``, what a judge reaches, for callers of the table (preflight): from the table, so
    they need not reach into ``_common``, which loads with the first carrier, not with the plugin."""
    if name in ("Finding", "Verdict"):
        from . import _common

        return getattr(_common, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
