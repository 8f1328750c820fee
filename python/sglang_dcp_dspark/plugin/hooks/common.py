"""What every hook module shares: the verdict a probe reaches, the view it hands sglang, quiet probes.

Imports nothing of the package at module level: the table's entry type (:mod:`.entry`) and every carrier build
on it.
"""

from __future__ import annotations

import contextlib
import enum
import logging
from collections.abc import Callable, Iterator


class Verdict(enum.Enum):
    NEEDS_FIX = "needs the fix"
    FIXED = "already fixed"
    UNRECOGNISED = "not recognised"
    OUT_OF_SCOPE = "not for this release"


class Finding:
    """What a judge found about one target. A plain class: it is built inside every sglang process's load_plugins()."""

    __slots__ = ("target", "verdict", "detail")

    def __init__(self, target: str, verdict: Verdict, detail: str) -> None:
        self.target, self.verdict, self.detail = target, verdict, detail

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Finding) and (self.target, self.verdict, self.detail) == (other.target, other.verdict, other.detail)

    def __hash__(self) -> int:
        return hash((self.target, self.verdict, self.detail))

    def __repr__(self) -> str:
        return f"Finding({self.target!r}, {self.verdict}, {self.detail!r})"


class Overlay:
    """Another object, seen with a few attributes replaced.

    Reads of other attributes and every write go to the real object, so code
    that is handed an overlay changes the real one. ``__class__`` reports the
    real class, so sglang's isinstance checks see through it.
    """

    def __init__(self, target: object, **replaced: object) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_replaced", replaced)

    @property
    def __class__(self):  # isinstance() consults this
        return type(object.__getattribute__(self, "_target"))

    def __getattr__(self, name: str):
        replaced = object.__getattribute__(self, "_replaced")
        if name in replaced:
            return replaced[name]
        return getattr(object.__getattribute__(self, "_target"), name)

    def __setattr__(self, name: str, value: object) -> None:
        setattr(object.__getattribute__(self, "_target"), name, value)


@contextlib.contextmanager
def probing() -> Iterator[None]:
    """Keep sglang's log lines about the probe's tiny pools out of the log.

    Lines like "KV Cache is allocated ... #tokens: 64" would read as the real
    pools' in the launcher. The probe's outcome is reported by the decision
    line instead; so is the budget line the plugin's own hooks write when a
    probe runs through them. Probes run single-threaded inside an import or
    load_plugins().
    """
    quiet = [logging.getLogger(name) for name in ("sglang", "sglang_dcp_dspark.core.budget")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level in zip(quiet, levels, strict=True):
            lg.setLevel(level)


def first_call() -> None:
    """Every hook's first line: write the plugin's held decision lines if sglang's logging is up (see decisions)."""
    from .. import decisions

    decisions.first_call()


def carrier(judge: Callable[[], Finding], plugin_on: bool) -> str | None:
    """Who carries a fix the series carries too, by its judge's finding on the release's code: "upstream-next"
    where the code has it already (FIXED), "plugin" where the plugin is on and its hook applies (NEEDS_FIX), else
    None. A judge that raises is read as the release's own code: a probe never breaks a launch."""
    try:
        finding = judge()
    except Exception:
        return None
    if finding.verdict is Verdict.FIXED:
        return "upstream-next"
    if finding.verdict is Verdict.NEEDS_FIX and plugin_on:
        return "plugin"
    return None


def unhooked(fn):
    """``fn`` as sglang defines it, under any wrappers sglang's HookRegistry put around it.

    A judge that follows another entry's verdict may run after that entry's
    hook was applied (a module's entries are decided and applied in table
    order); it must judge sglang's code, not the plugin's.
    """
    # The wrappers carry the original's name (functools.wraps); their code is HookRegistry's own.
    while fn is not None and hasattr(fn, "__wrapped__") and _is_registry_wrapper(fn):
        fn = fn.__wrapped__
    return fn


def _is_registry_wrapper(fn) -> bool:
    code = getattr(fn, "__code__", None)
    return code is not None and code.co_filename.replace("\\", "/").endswith("/plugins/hook_registry.py")
