"""The plugin's hooks, one module per patched sglang module, and the one table of them.

vllm-ascend's layout: ``server_args`` (the resolver), ``kv_cache_builder``
(the draft registration and its check-only guard hook), ``scheduler`` (the
host-memory budget). :data:`HOOKS` is read by :func:`plugin.register`, which
registers each entry with sglang's HookRegistry when its module is imported,
and by preflight, which evaluates a launch through the same entries
(:meth:`Hook.wrap`, :func:`in_effect`): a hook added here reaches both.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ._common import Finding, Verdict, by_version


@dataclass(frozen=True)
class Hook:
    module: str  # the sglang module whose import decides this hook
    target: str  # dotted path, as sglang's HookRegistry takes it
    carrier: str  # the module under hooks/ that holds judge and hook
    judge_name: str  # (original | None) -> Finding: does the code need the hook?
    hook_name: str  # AROUND hook, installed on NEEDS_FIX
    does: str  # what the hook changes, for the decision log and docs
    series_patch: str  # the series patch that carries the same change
    check_only_name: str | None = None  # () -> AROUND hook | None, installed when the judge cannot tell

    def _attr(self, name: str):
        # Looked up at call time, so a test that replaces a hook sees it used everywhere.
        return getattr(importlib.import_module(f"{__name__}.{self.carrier}"), name)

    @property
    def judge(self) -> Callable[..., Finding]:
        return self._attr(self.judge_name)

    @property
    def hook(self) -> Callable:
        return self._attr(self.hook_name)

    def check_only(self) -> Callable | None:
        return self._attr(self.check_only_name)() if self.check_only_name else None

    def judged(self, original: Callable | None = None) -> Finding:
        try:
            return self.judge(original) if original is not None else self.judge()
        except Exception as exc:  # a probe never breaks sglang's import
            return by_version(self.target, f"probe raised {type(exc).__name__}: {exc}")

    def wrap(self, original: Callable, *, check_only: bool = True) -> tuple[Finding, Callable]:
        """``original`` as the plugin would leave it: hooked, checked, or untouched; with the verdict."""
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


HOOKS: tuple[Hook, ...] = (
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
)
BY_TARGET = {hook.target: hook for hook in HOOKS}


@contextlib.contextmanager
def in_effect(module: str) -> Iterator[dict[str, Finding]]:
    """The hooks on ``module``'s targets applied for the duration, as the plugin would apply them.

    For a caller that must run sglang both ways in one process (preflight
    resolves a launch stock and with the plugin), so nothing goes through
    sglang's HookRegistry, whose hooks stay for the life of the process.
    """
    import pkgutil
    from unittest import mock

    findings: dict[str, Finding] = {}
    with contextlib.ExitStack() as stack:
        for hook in HOOKS:
            if hook.module != module:
                continue
            owner_path, name = hook.target.rsplit(".", 1)
            owner = pkgutil.resolve_name(owner_path)
            original = getattr(owner, name, None)
            if original is None:
                continue
            findings[hook.target], hooked = hook.wrap(original)
            if hooked is not original:
                stack.enter_context(mock.patch.object(owner, name, hooked))
        yield findings
