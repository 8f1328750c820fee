"""One entry of the hook table, and the one decision every caller of the table takes on it.

An entry (:class:`Hook`) names an sglang target, the judge that asks the code
whether it needs the hook, and the AROUND hook, with what vllm-ascend's patch
index carries for each (why, upstream, when to drop it). :meth:`Hook.decide`
is the whole lifecycle of an entry on one release, and its only copy:

- a target this release lacks: OUT_OF_SCOPE, "has no X in this release";
- the judge's finding (a probe that raises is judged by the release,
  :func:`by_version`: fixed upstream, else UNRECOGNISED);
- NEEDS_FIX: the entry's hook; UNRECOGNISED: the entry's check-only hook,
  where it has one for this release; FIXED, OUT_OF_SCOPE: nothing.

Its two callers only act on the :class:`Decision`: ``plugin.register``
registers ``decision.around`` with sglang's HookRegistry and logs
``decision.line``; preflight (``hooks.in_effect``, :meth:`Hook.wrap`) wraps the
function it holds for one block.

Carriers import this module and :mod:`.common`; ``hooks/__init__.py``
assembles the table from the carriers. Nothing here imports a carrier or the
table, so no module imports back a module that imports it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from .common import Finding, Verdict, unhooked

# The releases the table is written against: the one the 0.5.17 hooks were written for and tested on, and the
# first that carries PR #35221 upstream. Release literals live here and in releases/ only.
WRITTEN_FOR = "0.5.17"
FIXED_UPSTREAM_IN = "0.5.18"
# The first release whose flashinfer MLA verify the plugin's split-verify hooks apply to (its code has 0.5.23's
# shape from 0.5.22 on; upstream-next 0012 is written against 0.5.23).
VERIFY_FIX_SINCE = "0.5.22"

# Where in a launch an entry's code runs, which is where preflight evaluates it: sglang's argument resolution
# (preflight's resolution step applies these entries' hooks), the host pools' build, the forward pass.
RESOLUTION_STAGE = "resolution"
POOLS_STAGE = "pools"
FORWARD_STAGE = "forward"
STAGES = (RESOLUTION_STAGE, POOLS_STAGE, FORWARD_STAGE)


def by_version(target: str, why: str) -> Finding:
    """Behaviour was inconclusive: a release that carries the fix upstream is fine, anything else is unknown."""
    from ...core.compat import installed_sglang_version, version_at_least

    version = installed_sglang_version()
    if version_at_least(version, FIXED_UPSTREAM_IN):
        return Finding(target, Verdict.FIXED, f"sglang {version} carries the fix upstream ({why})")
    return Finding(target, Verdict.UNRECOGNISED, f"sglang {version or 'of unknown version'}: {why}")


class Decision:
    """What the plugin does with one entry on this release: the finding, and the AROUND hook to install (or None)."""

    __slots__ = ("hook", "finding", "around")

    def __init__(self, hook: Hook, finding: Finding, around: Callable | None = None) -> None:
        self.hook = hook  # the table entry decided on
        self.finding = finding
        self.around = around  # the entry's hook (NEEDS_FIX), its check-only hook (UNRECOGNISED), or None

    @classmethod
    def raised(cls, hook: Hook, exc: BaseException) -> Decision:
        """The decision on an entry whose deciding raised: not recognised, nothing installed."""
        return cls(hook, Finding(hook.target, Verdict.UNRECOGNISED, f"{type(exc).__name__}: {exc}"))

    def __repr__(self) -> str:
        return f"Decision({self.hook.target}, {self.finding.verdict.name}, around={getattr(self.around, '__name__', None)})"

    @property
    def hooked(self) -> bool:
        """The entry's own hook goes in (the code needs the fix)."""
        return self.around is not None and self.finding.verdict is Verdict.NEEDS_FIX

    @property
    def check_only(self) -> bool:
        """The entry's check-only hook goes in (the code was not recognised)."""
        return self.around is not None and self.finding.verdict is not Verdict.NEEDS_FIX

    @property
    def line(self) -> tuple[int, str]:
        """The decision line sglang's log shows, without the plugin's name, and its level: each wording's one place."""
        target, finding = self.hook.target, self.finding
        if self.hooked:
            return logging.INFO, f"hooked {target}: {finding.detail}; the hook {self.hook.does}"
        if finding.verdict in (Verdict.FIXED, Verdict.OUT_OF_SCOPE):
            return logging.INFO, f"left {target} alone ({finding.verdict.value}): {finding.detail}"
        if self.check_only:
            return logging.WARNING, (f"code not recognised, check-only hook on {target}: sglang's own sizing runs and "
                                     f"startup stops if the draft host pool is short: {finding.detail}")
        return logging.WARNING, f"code not recognised, left {target} alone: {finding.detail}"

    def applied(self, original: Callable) -> Callable:
        """``original`` as the decision leaves it: behind the AROUND hook, or itself."""
        around = self.around
        if around is None:
            return original

        @functools.wraps(original)
        def hooked(*args, **kwargs):
            return around(original, *args, **kwargs)

        return hooked


class Hook:
    """One table entry. A plain class: ``plugin.register`` imports this table in every sglang process."""

    __slots__ = ("module", "target", "judge", "hook", "does", "why", "upstream", "drop_when", "series_patch",
                 "check_only_if", "on_install", "stage")

    def __init__(self, *, module: str, target: str, judge: Callable, hook: Callable, does: str, why: str, upstream: str,
                 drop_when: str, series_patch: str, check_only_if: Callable | None = None,
                 on_install: Callable | None = None, stage: str | None = None) -> None:
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
        self.stage = stage  # one of STAGES: where in a launch the target runs, and preflight evaluates the entry

    def __repr__(self) -> str:
        return f"Hook({self.target})"

    def replace(self, **changes) -> Hook:
        """A copy with some fields changed (a test's judge, a stand-in target)."""
        fields = {name: getattr(self, name) for name in self.__slots__}
        fields.update(changes)
        return Hook(**fields)

    @property
    def carrier(self) -> str:
        """The module under hooks/ that holds the judge and the hook."""
        return self.hook.__module__.rsplit(".", 1)[1]

    def check_only(self) -> Callable | None:
        return self.check_only_if() if self.check_only_if else None

    def installed(self) -> None:
        if self.on_install:
            self.on_install()

    def exists(self) -> bool:
        """Does this release define the target (its module imported, or importable)?"""
        import pkgutil

        try:
            pkgutil.resolve_name(self.target)
        except Exception:
            return False
        return True

    def judged(self, original: Callable | None = None) -> Finding:
        """The judge's finding; a probe that raises is judged by the release (:func:`by_version`), never raised."""
        try:
            return self.judge(original) if original is not None else self.judge()
        except Exception as exc:  # a probe never breaks sglang's import
            return by_version(self.target, f"probe raised {type(exc).__name__}: {exc}")

    def decide(self, original: Callable | None = None, *, check_only: bool = True) -> Decision:
        """The one decision on this entry: the finding, and the AROUND hook to install (or None).

        ``original``: the target as the caller holds it (preflight), judged as
        it is; None: the plugin's path, where the target is looked up here and
        the judge reads sglang's code itself. ``check_only``: False where the
        caller reports a short draft itself rather than stopping on it.
        """
        if original is None:
            if not self.exists():
                # Nothing to hook, and nothing a check-only hook could sit on: said without running the judge.
                owner, name = self.target.rsplit(".", 1)
                return Decision(self, Finding(self.target, Verdict.OUT_OF_SCOPE,
                                              f"{owner} has no {name} in this release; nothing to hook"))
        elif unhooked(original) is not original:
            # sglang's HookRegistry wraps it already: the plugin was loaded in this process. A judge
            # that follows a neighbour sees through those wrappers and would hook it a second time.
            return Decision(self, Finding(self.target, Verdict.FIXED, "hooked already in this process (load_plugins)"))
        finding = self.judged(original)
        if finding.verdict is Verdict.NEEDS_FIX:
            return Decision(self, finding, self.hook)
        if finding.verdict is Verdict.UNRECOGNISED and check_only:
            try:
                return Decision(self, finding, self.check_only())
            except Exception as exc:  # as a probe: never out of sglang's import
                return Decision.raised(self, exc)
        return Decision(self, finding)

    def wrap(self, original: Callable, *, check_only: bool = True) -> tuple[Finding, Callable]:
        """``original`` as the plugin would leave it: hooked, checked, or untouched; with the verdict."""
        decision = self.decide(original, check_only=check_only)
        return decision.finding, decision.applied(original)
