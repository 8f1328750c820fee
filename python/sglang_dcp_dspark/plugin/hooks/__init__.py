"""The plugin's hooks, one module per patched sglang module, and the one table of them.

vllm-ascend's layout. For sglang 0.5.17: ``server_args`` (the resolver),
``kv_cache_builder`` (the draft registration and its check-only guard hook),
``scheduler`` (the host-memory budget). For the draft sidecar of 0.5.19 and
later: ``hybrid_pool_assembler`` (the budget and the guard) and
``hicache_auto_size`` (the auto-size estimate). For speculative decoding
under DCP: ``speculative_hook`` (the argument check the pass map drives) and,
on 0.5.22 and 0.5.23, ``flashinfer_mla_backend`` (the target verify planned
split, the prefix once and the window per draft token, which the check then
counts on).

Each carrier declares its entries at its foot, by reference as sglang's own
HookRegistry takes them (the judge and the hook are functions, not names),
with what vllm-ascend's patch index carries for each: the target, why it is
needed, where it stands upstream and when to drop it. docs/patches.md's hook
index is generated from them (``tools/hook_index.py``). The carriers import
nothing of sglang at module level: sglang is read when a judge runs, which
is when sglang imports the module a hook targets. Every entry is judged on
the code it would patch, so a release gets only the hooks its code needs.

:data:`HOOKS` is read by :func:`plugin.register`, which
registers each entry with sglang's HookRegistry when its module is imported,
and by preflight, which evaluates a launch through the same entries
(:meth:`Hook.wrap`, :func:`in_effect`): a hook added here reaches both.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator


class Hook:
    """One table entry. A plain class: ``plugin.register`` imports this table in every sglang process."""

    __slots__ = ("module", "target", "judge", "hook", "does", "why", "upstream", "drop_when", "series_patch",
                 "check_only_if", "on_install")

    def __init__(self, *, module: str, target: str, judge: Callable, hook: Callable, does: str, why: str, upstream: str,
                 drop_when: str, series_patch: str, check_only_if: Callable | None = None,
                 on_install: Callable | None = None) -> None:
        self.module = module  # the sglang module whose import decides this hook
        self.target = target  # dotted path, as sglang's HookRegistry takes it
        self.judge = judge  # (original | None) -> Finding: does the code need the hook?
        self.hook = hook  # AROUND hook, installed on NEEDS_FIX
        self.does = does  # what the hook changes, for the decision log and docs
        self.why = why  # what is wrong in sglang's code without it
        self.upstream = upstream  # where the same change stands upstream
        self.drop_when = drop_when  # when the entry can go
        self.series_patch = series_patch  # the series patch that carries the same change
        self.check_only_if = check_only_if  # () -> AROUND hook | None, installed when the judge cannot tell
        self.on_install = on_install  # () -> None, run once when the hook is registered (what the patch adds beside it)

    def __repr__(self) -> str:
        return f"Hook({self.target})"

    @property
    def carrier(self) -> str:
        """The module under hooks/ that holds the judge and the hook."""
        return self.hook.__module__.rsplit(".", 1)[1]

    def check_only(self) -> Callable | None:
        return self.check_only_if() if self.check_only_if else None

    def installed(self) -> None:
        if self.on_install:
            self.on_install()

    def judged(self, original: Callable | None = None):
        from ._common import by_version

        try:
            return self.judge(original) if original is not None else self.judge()
        except Exception as exc:  # a probe never breaks sglang's import
            return by_version(self.target, f"probe raised {type(exc).__name__}: {exc}")

    def wrap(self, original: Callable, *, check_only: bool = True):
        """``original`` as the plugin would leave it: hooked, checked, or untouched; with the verdict."""
        from ._common import unhooked

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
# The first release whose flashinfer MLA verify the plugin's split-verify hooks apply to (its code has 0.5.23's
# shape from 0.5.22 on; upstream-next 0012 is written against 0.5.23).
VERIFY_FIX_SINCE = "0.5.22"

# The carriers, imported after what they import from here (Hook, the release literals). In the table's order:
# sglang 0.5.17's gate, draft registration and scheduler budget; the draft sidecar of 0.5.19 to 0.5.23
# (patches/upstream-next 0001-0003, 0009); every release the pass map covers (the speculative check); and the
# flashinfer MLA verify planned split on 0.5.22 and 0.5.23 (0012).
from . import (  # noqa: E402
    flashinfer_mla_backend,
    hicache_auto_size,
    hybrid_pool_assembler,
    kv_cache_builder,
    overrides,
    scheduler,
    server_args,
    speculative_hook,
)

HOOKS: tuple[Hook, ...] = (
    *server_args.HOOKS, *kv_cache_builder.HOOKS, *scheduler.HOOKS, *hybrid_pool_assembler.HOOKS,
    *hicache_auto_size.HOOKS, *overrides.HOOKS, *speculative_hook.HOOKS, *flashinfer_mla_backend.HOOKS,
)
BY_TARGET = {hook.target: hook for hook in HOOKS}
# The sglang modules the table's callers name (SIDECAR_CARRIES below, preflight's adapters, the tests): each
# carrier's own.
ASSEMBLER = hybrid_pool_assembler.MODULE
AUTO_SIZE = hicache_auto_size.MODULE
FLASHINFER_MLA = flashinfer_mla_backend.MODULE

# What a judge reaches, for callers of the table (preflight), so they need not reach into _common.
from ._common import Finding, Verdict  # noqa: E402

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


@contextlib.contextmanager
def without_pass_check() -> Iterator[None]:
    """The plugin's argument-time pass check off for the block (preflight sizes a launch it refuses, as if
    admitted); its other hooks as they are."""
    from ...core import swap

    with swap.attribute(speculative_hook, "check_passes_under_dcp", lambda server_args: None):
        yield


def verify_fix(plugin_on: bool) -> str | None:
    """Who plans this release's flashinfer MLA verify split under DCP: "upstream-next" where its code
    carries 0012, "plugin" where the plugin is on and its hooks apply, else None (the release's own verify)."""
    from .flashinfer_mla_backend import verify_fix_in_effect

    return verify_fix_in_effect(plugin_on=plugin_on)
