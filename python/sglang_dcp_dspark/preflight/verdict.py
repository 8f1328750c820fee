"""preflight's verdict on a launch: decided once, from typed facts, by :func:`decide`; and every sentence of it.

:mod:`check` gathers the facts (:class:`Facts`: the resolutions, the refusal
as :class:`Refusal`, the pass judgement, the pools and the RAM) and hands
:func:`decide` the search for a change (:mod:`advice`). :func:`decide` picks
the exit code (:func:`outcome`), asks for the smallest change that passes,
and writes the verdict:

- one line, at most :data:`LINE_WIDTH` columns and never cut: the outcome,
  the exit code and the reason in an operator's words;
- beneath it, each entry wrapped at a word boundary within :data:`BLOCK_WIDTH`:
  the change that works with the verdict preflight gave that changed launch,
  the host memory, why, the refusal's own message whole, what was checked and
  what was not, the evidence, what to do, and the pass-by-pass details.

Pass names, the pass map and file paths stay out of the line and out of the
first line of every entry but ``details`` and ``message`` (the refusal quoted
whole). Text, ``--json`` and the docs' tables all render this one object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import passes as passes_mod
from ..core.exits import BAD_INPUT, BROKEN_PASS, INTERNAL_ERROR, OUTCOMES, PASSES, REJECTED, STOPS, UNCHECKED
from .hostram import gib, stop_sentence
from .result import PREFIX, Advice, Change, NoPools, Refusal, Release, Sizing, Verdict

if TYPE_CHECKING:
    from .hostram import Stop
    from .launch import Node

__all__ = ["BAD_INPUT", "BROKEN_PASS", "INTERNAL_ERROR", "PASSES", "REJECTED", "STOPS", "UNCHECKED", "Advice",
           "Change", "Facts", "Refusal", "Verdict", "decide", "of_error", "outcome", "worst"]

LINE_WIDTH = 100  # the verdict line, whole (BLOCK_WIDTH: each line beneath it)

# Worst last: a sweep exits with its worst row's code. An unchecked pass is better than any refusal or break.
SEVERITY = (PASSES, UNCHECKED, REJECTED, BAD_INPUT, STOPS, BROKEN_PASS)


def worst(codes) -> int:
    return max(codes, key=lambda c: SEVERITY.index(c) if c in SEVERITY else len(SEVERITY))


# ---------------------------------------------------------------- the facts


@dataclass(frozen=True)
class Facts:
    """What :mod:`check` found of one launch. ``admitted``: the sizing is the launch as it runs (False: as it
    would run if the refusing side admitted it). ``stock_judged``: the passes as stock sglang runs the launch
    (the plugin off), where stock admits it. ``refused``: the refusal of the launch as it runs, if any."""

    release: Release
    node: Node
    plugin_on: bool
    stock_passed: bool
    plugin_passed: bool
    judged: passes_mod.Judgement
    refused: Refusal | None = None
    stock_refused: Refusal | None = None
    sizing: Sizing | NoPools | None = None
    admitted: bool = True
    stock_judged: passes_mod.Judgement | None = None
    backend: str | None = None  # the target's decode backend as the launch runs
    backend_picked: str = ""  # who picked it where the launch names none ("the plugin")
    warnings: tuple[str, ...] = field(default_factory=tuple)

    @property
    def passed(self) -> bool:
        return self.plugin_passed if self.plugin_on else self.stock_passed

    @property
    def ram(self):
        return getattr(self.sizing, "host_ram", None)


def outcome(facts: Facts) -> tuple[int, Stop | passes_mod.PassFinding | None]:
    """The exit code of the judged launch, and what stops it where it stops at startup."""
    if not facts.passed:
        return REJECTED, None
    stops = facts.ram.stops if facts.ram is not None else ()
    if stops:
        return STOPS, stops[0]
    judged = facts.judged
    refusing = [f for f in judged.broken if refuses_at_startup(f)]
    if refusing:
        return STOPS, refusing[0]
    if judged.broken:
        return BROKEN_PASS, None
    if judged.dcp > 1 and not judged.mapped:
        return UNCHECKED, None
    return PASSES, None


# ---------------------------------------------------------------- the verdict


def of_error(code: int, message: str) -> Verdict:
    """Bad input (2) or an internal error (4): the error's one line is the reason."""
    return Verdict(code, message, why=(message,))


def fitting(*reasons: str, outcome_word: str, code: int) -> str:
    """The first of ``reasons`` (longest first) that fits the line whole: a shorter one drops a clause the block
    says anyway, never part of a word."""
    room = LINE_WIDTH - len(f"{PREFIX}{outcome_word} (exit {code}): ")
    for reason in reasons:
        if reason and len(reason) <= room:
            return reason
    raise AssertionError(f"no reason of {reasons!r} fits {room} columns")


def decide(facts: Facts, advise=None) -> Verdict:
    """The verdict on a judged launch: its exit code, reason, the change that works (``advise(code)`` searches
    for it: ``(Advice | None, what it tried)``) and every entry beneath."""
    code, stop = outcome(facts)
    # A refusal whose fix only the operator can make (a checkpoint path, one of the names) is not searched past.
    plain = code == REJECTED and facts.refused is not None and facts.refused.todo
    advice, tried = advise(code) if advise is not None and code != PASSES and not plain else (None, ())
    words = {REJECTED: _rejected, STOPS: _stops, BROKEN_PASS: _broken, UNCHECKED: _unchecked, PASSES: _passes}[code]
    reason, why, extra = words(facts, stop)
    todo = _todo(facts, code, advice, tried)
    return Verdict(code, fitting(*reason, outcome_word=OUTCOMES[code], code=code), host_clause(facts), advice,
                   tuple(w for w in why if w) + host_warnings(facts), todo=todo, details=details_of(facts),
                   **extra)


# ---------------------------------------------------------------- the words of each outcome


def _rejected(facts: Facts, stop):
    refused = facts.refused
    assert refused is not None, "a rejected launch has its refusal"
    why = []
    if refused.who == "the plugin":
        why.append(stock_clause(facts))
    elif not facts.plugin_on and facts.plugin_passed:
        why.append("the plugin is off; with it on, sglang admits the launch")
    judged = facts.judged
    said = refused.who == "the plugin" and facts.stock_judged is not None and facts.stock_judged.broken == judged.broken
    if judged.broken and not said:
        why.append(f"if admitted, {broken_clause(judged)}")
    unchecked = unmapped_clause(judged) if judged.dcp > 1 and not judged.mapped and not judged.broken else ""
    reasons = (f"{refused.who} refuses {refused.what}" if refused.what else "",
               f"{refused.who} refuses it: {refused.words}" if refused.words else "",
               f"{refused.who} refuses the launch (its message is below)")
    return reasons, why, {"message": refused.message, "unchecked": unchecked}


def _stops(facts: Facts, stop):
    estimated = getattr(facts.sizing, "device_rows_estimated", False)
    if isinstance(stop, passes_mod.PassFinding):
        kind = kind_of(facts.judged)
        reasons = (f"{stop.backend} refuses {kind} under DCP as it starts", f"{stop.backend} refuses it as it starts")
        why, message = [f"the {stop.backend} attention backend refuses it as the server starts"], stop.detail
    else:
        reasons = stop_reasons(stop, estimated=estimated)
        why, message = [stop_sentence(stop, estimated=estimated)], ""
    why.append(stock_clause(facts) if facts.plugin_on else "the plugin is off")
    return reasons, why, {"message": f"{stop.backend}: {message}" if message else ""}


def _broken(facts: Facts, stop):
    judged = facts.judged
    first = judged.broken[0]
    who = "the draft" if first.name in passes_mod.DRAFT_PASSES else "the target"
    effect = ("crashes" if first.verdict == passes_mod.RAISES else
              "merges the ranks wrongly" if first.verdict == passes_mod.WRONG_OUTPUT else "reads other tokens' KV")
    reasons = (f"under DCP on {first.backend}, {who} {effect}", f"under DCP, {who} {effect}")
    why = [broken_clause(judged)]
    if facts.plugin_on:  # with the plugin off, the launch as run is stock's: its passes are the ones above
        why.append(stock_clause(facts))
    return reasons, why, {"checked": checked_clause(judged) if judged.consistent else ""}


def _unchecked(facts: Facts, stop):
    judged = facts.judged
    backend = facts.backend or "its backend"
    kind = "DCP" if judged.algorithm == passes_mod.PLAIN else f"{judged.algorithm} under DCP"
    reasons = (f"{kind} is not checked on {backend}", "its passes under DCP are not checked")
    return reasons, [stock_clause(facts), plugin_clause(facts)], {"unchecked": unmapped_clause(judged)}


def _passes(facts: Facts, stop):
    judged = facts.judged
    extra = {}
    # Each reason says what was not checked too: the passes run on CPU, never yet on a GPU.
    if judged.dcp <= 1:
        reasons = ("no DCP (preflight checks passes only under DCP)",)
    else:
        backends = ", ".join(sorted({f.backend for f in judged.consistent}))
        fixer = FIXERS.get(judged.fixed_by, judged.fixed_by)
        fixed = "its verify and draft" if judged.fixes_draft else "its verify"
        base = f"DCP passes checked on {backends}, CPU only"
        # Who fixes what, shortened to who where the line is full; the evidence entry says what, whole.
        fixes = (f"; {fixer} fixes {fixed}", f"; fixed by {fixer}") if judged.fixed_by else ()
        reasons = (*(base + fix for fix in fixes), base, "DCP passes checked, CPU only")
        extra = {"checked": checked_clause(judged), "evidence": judged.evidence}
    return reasons, [stock_clause(facts), plugin_clause(facts)], extra


# ---------------------------------------------------------------- clauses


# Who fixes the verify (``Judgement.fixed_by``), in the line's words.
FIXERS = {"plugin": "the plugin", "upstream-next": "upstream-next"}


def kind_of(judged) -> str:
    """The launch kind in the operator's words: the algorithm as launched (NEXTN stays NEXTN) or DCP alone."""
    return "a plain launch" if judged.algorithm == passes_mod.PLAIN else judged.algorithm


def refuses_at_startup(found) -> bool:
    """A pass finding that is the backend refusing the launch while it starts (its factory, or the pass itself)."""
    return found.name == passes_mod.BACKEND_INIT or found.verdict == passes_mod.NOT_ADMITTED


def effect_of(found) -> str:
    """What a broken pass does, in an operator's words (its name is in ``details``)."""
    if refuses_at_startup(found):
        return f"{found.backend} refuses it as the server starts"
    side = "the draft" if found.name in passes_mod.DRAFT_PASSES else "the target"
    if found.verdict == passes_mod.RAISES:
        return f"{side} on {found.backend} crashes"
    if found.name in passes_mod.DRAFT_PASSES:
        return f"{side} on {found.backend} reads other tokens' KV (acceptance collapses)"
    return f"{side} on {found.backend} reads other tokens' KV (wrong tokens)"


def broken_clause(judged) -> str:
    """The broken passes as their effects, each once: the pass names are in ``details``."""
    effects = list(dict.fromkeys(effect_of(f) for f in judged.broken))
    return "under DCP " + "; ".join(effects)


def checked_clause(judged) -> str:
    consistent = judged.consistent
    backends = ", ".join(sorted({f.backend for f in consistent}))
    text = f"under DCP each pass it runs on {backends} reads the rows it wrote"
    if judged.kernel_checked:
        text += ", and the ranks' merged output is within 1e-5 of one rank"
    return text


def unmapped_clause(judged) -> str:
    return f"its passes under DCP are not checked: {judged.why_unmapped}"


def stock_clause(facts: Facts) -> str:
    """What stock sglang does with the launch: rejects it, admits it with broken passes, or admits it and runs."""
    applied = facts.release.series_applied
    base = f"sglang {facts.release.sglang} with {', '.join(applied)} applied" if applied else "stock sglang"
    if not facts.stock_passed:
        refused = facts.stock_refused
        too = "" if facts.passed else " too"
        return f"{base} rejects it{too}" + (f" ({refused.what})" if refused is not None and refused.what else "")
    stock = facts.stock_judged
    if stock is not None and stock.broken:
        return f"{base} admits it, but {broken_clause(stock)}"
    stop = getattr(facts.sizing, "stock_startup_error", None)
    if stop:
        return f"{base} admits it but stops at startup ({stop})"
    return f"{base} admits it too"


def plugin_clause(facts: Facts) -> str:
    if not facts.plugin_on:
        return "the plugin is off"
    coverage = getattr(facts.sizing, "draft_coverage", None)
    if coverage is None:
        return "with the plugin it passes"
    return (f"with the plugin it passes and the draft host pool covers "
            f"{'all' if coverage >= 1 else f'{coverage:.3f}'} of the target's logical slots")


def details_of(facts: Facts) -> tuple[str, ...]:
    """The pass-by-pass facts behind the verdict, by their pass-map names: for whoever reads further."""
    judged = facts.judged
    if judged.dcp <= 1 or not judged.algorithm:
        return ()
    out = [f"{f.name} on {f.backend} (dcp {f.dcp}, rank {f.rank}"
           f"{', after a HiCache load-back' if f.after_hicache else ''}): {f.effect}" for f in judged.broken]
    if judged.consistent and not judged.broken:
        out.append("consistent under DCP: " + ", ".join(f.name for f in judged.consistent))
    if judged.note:
        out.append(judged.note)
    return tuple(out)


def host_clause(facts: Facts) -> str:
    """The GiB pinned per node: with whether it fits, "estimate" where the device rows are one, and "if
    admitted" where the launch as run does not get that far."""
    ram = facts.ram
    if ram is None:
        return "no HiCache host pools" if facts.sizing is not None else ""
    fits = (f"fits {gib_short(ram.available)}" if ram.fits
            else f"over the {(ram.available - ram.reserve) / 2**30:,.0f} GiB left")
    what = "host" if facts.admitted else "host if admitted"
    estimate = " (estimate)" if facts.sizing.device_rows_estimated else ""
    return f"{ram.needed_per_node / 2**30:,.0f} GiB/node {what}{estimate}, {fits}"


def gib_short(n: int) -> str:
    """Whole GiB, or TiB to one place from 1 TiB: a figure for the line, the exact one is in the report."""
    return f"{n / 2**40:,.1f} TiB" if n >= 2**40 else f"{n / 2**30:,.0f} GiB"


def gib_apart(a: int, b: int) -> tuple[str, str]:
    """Two figures a reader compares (needed, left): short, but never the same words for different numbers
    (2,060 GiB and 2,038 GiB are both "2.0 TiB")."""
    for fmt in (gib_short, lambda n: f"{n / 2**30:,.0f} GiB", gib):
        if fmt(a) != fmt(b) or a == b:
            return fmt(a), fmt(b)
    return gib(a), gib(b)


def stop_reasons(stop, *, estimated: bool = False) -> tuple[str, ...]:
    """The stop's reasons for the line, longest first; on estimated device rows, first with that said."""
    if stop.kind == "pool-build":
        error = " ".join(str(stop.error).split())
        reasons = (f"building the host pools fails: {error}", "building the host pools fails (its error is below)",
                   "building the host pools fails")
    elif stop.kind == "coverage":
        reasons = (f"the draft host pool covers {stop.coverage:.3f} of the logical slots",)
    else:
        needed, left = gib_apart(stop.needed, stop.left)
        reasons = (f"host pools need {needed}/node; the node has {left} left", "host pools exceed the node's RAM")
    if estimated:
        return tuple(f"on estimated rows, {r}" for r in reasons) + reasons
    return reasons


def host_warnings(facts: Facts) -> tuple[str, ...]:
    """What the host pools are short of without stopping startup (sglang only warns)."""
    ram = facts.ram
    if ram is None or ram.host_rows is None or ram.device_rows is None or ram.host_rows > ram.device_rows:
        return ()
    return (f"the target host pool ({ram.host_rows:,} rows) is smaller than the device pool ({ram.device_rows:,} "
            "rows): sglang only warns, and L2 holds less than L1, so HiCache barely helps; raise --hicache-ratio "
            "(or --hicache-size, or the node's RAM)",)


def _todo(facts: Facts, code: int, advice: Advice | None, tried: tuple[str, ...]) -> tuple[str, ...]:
    out = []
    refused = facts.refused if code == REJECTED else None
    if refused is not None and refused.todo:
        out.append(refused.todo)
    if advice is not None:
        if advice.removed or advice.env:
            took = f"drops {' '.join(advice.removed)}" if advice.removed else ""
            how = "; ".join(advice.env)
            out.append(f"the change above {'; '.join(p for p in (took, how) if p)}")
        return tuple(out)
    if code == UNCHECKED:
        out.append("it runs as it is; no change preflight tried is checked under DCP on this node and release")
    elif code != PASSES and tried and not out:
        out.append(f"no change passes on this node and release; preflight tried: {', '.join(tried)}")
    return tuple(out)
