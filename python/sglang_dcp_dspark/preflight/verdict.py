"""preflight's verdict on a launch, every sentence of it: the exit code, the one line, the block beneath, the advice.

This module owns the verdict's words. :mod:`check` decides *which* verdict a
launch gets and hands the facts over as types (the resolutions, the pass
judgement, the host-RAM model, the advised launch it judged itself); the
functions here turn them into

- one line, at most :data:`LINE_WIDTH` characters: the outcome and exit
  code, the one reason, the one change that works on this node and release
  (only where preflight judged that launch and it passes), and the host
  memory pinned per node;
- a short block beneath it, read in order: why, what was checked, what was
  not, the evidence, what to do;
- ``advice``, the same change as data: the flags to add and remove.

Because every clause is built here from the same facts, the clauses cannot
disagree with each other or with the exit code: "stops at startup" is said
only with exit 3, "sglang rejects" only where sglang itself does, "passes"
only where the launch passes.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field

from .. import passes as passes_mod
from .hostram import gib

# Exit codes: the verdict on the launch as it will run.
# 4 is the command line's internal error (``__main__``); 5: sglang admits the launch, and the
# pass map shows one of its passes under DCP crashing or reading other tokens' KV; 6: sglang admits it
# and it will start, but under DCP the map has not checked its passes on the backend (or release) it runs.
# So 0 is said only where every pass the launch runs under DCP was checked, or there is no DCP.
PASSES, REJECTED, BAD_INPUT, STOPS, BROKEN_PASS, UNCHECKED = 0, 1, 2, 3, 5, 6
OUTCOMES = {PASSES: "PASSES", REJECTED: "REJECTED", BAD_INPUT: "BAD INPUT", STOPS: "STOPS AT STARTUP",
            BROKEN_PASS: "BROKEN PASS", UNCHECKED: "PASSES, UNCHECKED"}
LINE_WIDTH = 160  # the verdict line, whole
BLOCK_WIDTH = 100  # each line of the block beneath it
PREFIX = "verdict: "  # the verdict line's first word: what an operator (and a script) looks for
REASON_WIDTH = 90  # a reason quoted from sglang, in the line (the whole of it is in the block)

# Worst last: a sweep exits with its worst row's code. An unchecked pass is better than any refusal or break.
SEVERITY = (PASSES, UNCHECKED, REJECTED, BAD_INPUT, STOPS, BROKEN_PASS)


def worst(codes) -> int:
    return max(codes, key=lambda c: SEVERITY.index(c) if c in SEVERITY else len(SEVERITY))


# ---------------------------------------------------------------- the types


@dataclass(frozen=True)
class Advice:
    """A change to the launch that preflight judged itself on the same node and release, and its verdict there."""

    add: tuple[str, ...] = ()  # flags (with values) to add, replacing their old values
    remove: tuple[str, ...] = ()  # flags (with values) the change drops
    env: tuple[str, ...] = ()  # environment changes, e.g. "unset SGLANG_ENABLE_DCP_DSPARK_PLUGIN"
    code: int = PASSES  # the advised launch's own exit code: 0 or 6
    line: str = ""  # the advised launch's own verdict line
    evidence: str = ""  # what proves the advised launch's fixed passes (its verdict's evidence), if any

    @property
    def change(self) -> str:
        """The change in a few words: ``--attention-backend flashinfer``, ``--dcp-size 1``, ``the dcp_dspark plugin``
        (switched on: ``env`` says how)."""
        if self.env:
            return "the dcp_dspark plugin"
        return " ".join(self.add)

    def as_dict(self) -> dict:
        return {"change": self.change, "add": list(self.add), "remove": list(self.remove), "env": list(self.env),
                "verdict": self.code, "line": self.line, "evidence": self.evidence or None}


@dataclass(frozen=True)
class Verdict:
    """What preflight says of a launch. ``reason`` is the one reason, short; ``why`` the whole of it."""

    code: int
    reason: str
    host: str = ""  # "1,258 GiB/node host, fits 2,048 GiB"
    advice: Advice | None = None
    why: tuple[str, ...] = ()
    checked: str = ""
    unchecked: str = ""
    evidence: str = ""
    todo: tuple[str, ...] = ()

    @property
    def outcome(self) -> str:
        return OUTCOMES.get(self.code, "ERROR")

    @property
    def line(self) -> str:
        """At most :data:`LINE_WIDTH` characters: where the parts do not fit, the host figure loses its "fits"
        clause first, then the reason is clipped (its whole is in the block)."""
        head = f"{PREFIX}{self.outcome} (exit {self.code}): "
        for host in (self.host, self.host.split(", ")[0]):
            tail = "".join(f"; {part}" for part in (self._advised(), host) if part)
            room = LINE_WIDTH - len(head) - len(tail)
            if len(self.reason) <= room or host == self.host.split(", ")[0]:
                return head + clip(self.reason, max(room, 24)) + tail
        raise AssertionError("unreachable")

    def _advised(self) -> str:
        if self.advice is None:
            return ""
        return f"{'use' if self.code not in (PASSES, UNCHECKED) else 'or'} {self.advice.change} (exit {self.advice.code})"

    @property
    def detail(self) -> str:
        """The whole reason in one string (``--json``'s ``detail``)."""
        return "; ".join(self.why) if self.why else self.reason

    def block(self, width: int = BLOCK_WIDTH) -> list[str]:
        """The lines beneath the verdict line, read in order, none wider than ``width``."""
        rows = [("why", "; ".join(self.why)), ("checked", self.checked), ("unchecked", self.unchecked),
                ("evidence", self.evidence), ("to do", "; ".join(self.todo))]
        out = []
        for label, text in rows:
            if not text:
                continue
            out += textwrap.wrap(text, width=width, initial_indent=f"  {label:<10}", subsequent_indent=" " * 12,
                                 break_on_hyphens=False, break_long_words=True)
        return out

    def as_dict(self) -> dict:
        return {"code": self.code, "outcome": self.outcome, "line": self.line, "detail": self.detail,
                "reason": self.reason, "host": self.host or None, "why": list(self.why), "checked": self.checked or None,
                "unchecked": self.unchecked or None, "evidence": self.evidence or None, "todo": list(self.todo),
                "advice": None if self.advice is None else self.advice.as_dict()}


def clip(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1].rstrip(" ,;:(") + "…"


def of_error(code: int, message: str) -> Verdict:
    """Bad input (2) or an internal error (4): the error's one line is the reason."""
    return Verdict(code, message, why=(message,))


# ---------------------------------------------------------------- the parts of a verdict


@dataclass(frozen=True)
class Facts:
    """What :mod:`check` found of one launch, for the sentences here. ``admitted``: the sizing is the launch as it
    runs (False: as it would run if the refusing side admitted it). ``stock_judged``: the pass judgement of the launch
    as stock sglang runs it (the plugin off), where stock admits it."""

    release: object  # result.Release
    node: object  # launch.Node
    plugin_on: bool
    stock_passed: bool
    stock_message: str | None
    plugin_passed: bool
    plugin_message: str | None
    judged: object  # passes.Judgement
    sizing: object | None = None  # result.Sizing | result.NoPools | None
    admitted: bool = True
    stock_judged: object | None = None
    backend: str | None = None  # the target's decode backend as the launch runs
    backend_picked: str = ""  # who picked it where the launch names none ("sglang", "the plugin")
    warnings: tuple[str, ...] = field(default_factory=tuple)


def host_clause(facts: Facts) -> str:
    """The GiB pinned per node, for the line: with whether it fits, "estimate" where the device rows are one, and
    "if admitted" where the launch as run does not get that far."""
    sizing = facts.sizing
    ram = getattr(sizing, "host_ram", None)
    if ram is None:
        return "no HiCache host pools" if sizing is not None else ""
    # Over the RAM: the figure left in the needed figure's unit, so that the two compare at a glance.
    fits = f"fits {gib_short(ram.available)}" if ram.fits else f"over the {(ram.available - ram.reserve) / 2**30:,.0f} GiB left"
    what = "host" if facts.admitted else "if admitted"
    estimate = " (estimate)" if sizing.device_rows_estimated else ""
    return f"{ram.needed_per_node / 2**30:,.0f} GiB/node {what}{estimate}, {fits}"


def gib_short(n: int) -> str:
    """Whole GiB, or TiB to one place from 1 TiB: a figure for the line, the exact one is in the report."""
    return f"{n / 2**40:,.1f} TiB" if n >= 2**40 else f"{n / 2**30:,.0f} GiB"


def gib_apart(a: int, b: int) -> tuple[str, str]:
    """Two figures in the line that a reader compares (needed, left): short, but never the same words for
    different numbers (2,060 GiB and 2,038 GiB are both "2.0 TiB")."""
    for fmt in (gib_short, lambda n: f"{n / 2**30:,.0f} GiB", gib):
        if fmt(a) != fmt(b) or a == b:
            return fmt(a), fmt(b)
    return gib(a), gib(b)


def stop_sentence(stop, *, estimated: bool) -> str:
    """One stop at startup (a :class:`hostram.Stop`), in words."""
    caveat = "; device rows are an upper-bound estimate, pass --device-rows for a firm verdict" if estimated else ""
    if stop.kind == "pool-build":
        return f"startup stops while the host pools are built: {stop.error}{caveat}"
    if stop.kind == "coverage":
        return (f"the draft host pool covers {stop.coverage:.3f} of the target's logical slots (the capacity guard stops "
                "startup; without it L1 eviction writes past the draft buffer)")
    if stop.kind == "ram":
        return (f"host pools need {gib(stop.needed)} per node, more than the {gib(stop.left)} left after sglang's "
                f"reserve (sglang's host-memory check refuses them){caveat}")
    raise ValueError(f"unknown stop {stop.kind!r}")


def stop_reason(stop) -> str:
    if stop.kind == "pool-build":
        return f"building the host pools fails: {stop.error}"
    if stop.kind == "coverage":
        return f"the draft host pool covers {stop.coverage:.3f} of the logical slots (capacity guard)"
    needed, left = gib_apart(stop.needed, stop.left)
    return f"host pools need {needed}/node, {left} left after sglang's reserve"


def host_warnings(facts: Facts) -> tuple[str, ...]:
    """What the host pools are short of without stopping startup (sglang only warns)."""
    ram = getattr(facts.sizing, "host_ram", None)
    if ram is None or ram.host_rows is None or ram.device_rows is None or ram.host_rows > ram.device_rows:
        return ()
    return (f"the target host pool ({ram.host_rows:,} rows) is smaller than the device pool ({ram.device_rows:,} "
            "rows): sglang only warns, and L2 holds less than L1, so HiCache barely helps; raise --hicache-ratio "
            "(or --hicache-size, or the node's RAM)",)


def pass_effect(found) -> str:
    """A broken pass's consequence in a few words (never "stops at startup": that is exit 3's)."""
    from .. import passes as passes_mod

    if refuses_at_startup(found):
        return "refuses it as the server starts"
    if found.verdict == passes_mod.RAISES:
        return "crashes"
    if found.name in passes_mod.DRAFT_PASSES:
        return "the draft reads other tokens' KV (acceptance collapses)"
    return "the target reads other tokens' KV (wrong tokens)"


def pass_effect_short(found) -> str:
    """:func:`pass_effect` for the line: what happens, without its consequence (that is in the block)."""
    from .. import passes as passes_mod

    if refuses_at_startup(found):
        return "refuses it as the server starts"
    return "crashes" if found.verdict == passes_mod.RAISES else "reads other tokens' KV"


def refuses_at_startup(found) -> bool:
    """A pass finding that is the backend refusing the launch while it starts (its factory, or the pass itself)."""
    from .. import passes as passes_mod

    return found.name == passes_mod.BACKEND_INIT or found.verdict == passes_mod.NOT_ADMITTED


def kind_of(judged) -> str:
    """The launch kind in the operator's words: the algorithm as launched (NEXTN stays NEXTN) or a plain launch."""
    from .. import passes as passes_mod

    return "a plain launch" if judged.algorithm == passes_mod.PLAIN else judged.algorithm


def checked_clause(judged) -> str:
    """What the pass map checked of the launch under DCP, for a launch that passes."""
    if judged.dcp <= 1:
        return "no DCP, so no pass reads another rank's layout"
    consistent = [f for f in judged.findings if f.verdict == "consistent"]
    backends = ", ".join(sorted({f.backend for f in consistent}))
    text = (f"under DCP the pass map checked {', '.join(f.name for f in consistent)} on {backends}: each reads the rows "
            "it wrote")
    if passes_mod.kernel_checked(consistent):
        text += ", and the ranks' merged output is within 1e-5 of one rank"
    return f"{text} ({judged.note})" if judged.note else text


def unmapped_clause(judged) -> str:
    return f"under DCP its passes are not checked: {judged.why_unmapped}"


def stock_clause(facts: Facts) -> str:
    """What stock sglang does with the launch: rejects it, admits it with broken passes, or admits it and runs."""
    applied = facts.release.series_applied
    base = f"sglang {facts.release.sglang} with {', '.join(applied)} applied" if applied else "stock sglang"
    if not facts.stock_passed:
        return f"{base} rejects it ({facts.stock_message})"
    stock = facts.stock_judged
    if stock is not None and stock.broken:
        return f"{base} admits it, but {findings_clause(stock.broken)}"
    stop = getattr(facts.sizing, "stock_startup_error", None)
    if stop:
        return f"{base} admits it but stops at startup ({stop})"
    return f"{base} admits it too"


def findings_clause(broken) -> str:
    """Broken passes in words: a backend refusing at startup as that, the others as what their pass does."""
    at_start = sorted({f.backend for f in broken if refuses_at_startup(f)})
    rest = [f"{f.name} on {f.backend} {pass_effect(f)}" for f in broken if not refuses_at_startup(f)]
    parts = [f"{b} refuses it as the server starts" for b in at_start]
    if rest:
        parts.append("under DCP " + "; ".join(rest))
    return "; ".join(parts)


def evidence_of(judged) -> str:
    return judged.evidence or ""


def backend_note(facts: Facts) -> str:
    if facts.backend and facts.backend_picked:
        return f"{facts.backend}, picked by {facts.backend_picked}"
    return facts.backend or ""


# ---------------------------------------------------------------- the verdicts


def rejected(facts: Facts, advice: Advice | None) -> Verdict:
    """sglang, or sglang with the plugin's hooks in it, refuses the launch at argument time."""
    applied = facts.release.series_applied
    as_run_passed, message = ((facts.plugin_passed, facts.plugin_message) if facts.plugin_on
                              else (facts.stock_passed, facts.stock_message))
    # The plugin refuses where its hooks make the difference: stock admits the launch, or refuses it otherwise.
    plugin_refuses = facts.plugin_on and (facts.stock_passed or facts.stock_message != facts.plugin_message)
    judged = facts.judged
    # A refusal of a launch kind on a backend under DCP (the plugin's check, the series' words) is named by what
    # it refuses; any other is sglang's own message, quoted.
    on = re.search(r" on (\S+) MLA is not supported|is not supported on (\S+) MLA", str(message))
    kind = (f"{kind_of(judged)}{refused_draft(str(message))} on {on.group(1) or on.group(2)} under DCP"
            if on and judged.dcp > 1 else "")
    if plugin_refuses and judged.refused_kv:
        # Decided from the launch's facts (passes.kv_cache_refusal, the plugin's own check, first of its refusals):
        # a split verify on flashinfer MLA over a quantized KV pool.
        kind = f"{kind_of(judged)} ({judged.refused_kv} KV) on flashinfer under DCP"
    if plugin_refuses:
        who = "the plugin refuses"
    elif applied:
        who = f"sglang {facts.release.sglang} with {', '.join(applied)} rejects"
    else:
        who = f"sglang {facts.release.sglang} rejects"
    reason = f"{who} {kind}" if kind else f"{who} it: {clip(message_core(message), REASON_WIDTH)}"
    why = [f"{who} it: {message}"]
    if plugin_refuses:
        why.append(stock_clause(facts))
    elif not facts.plugin_on and facts.plugin_passed:
        why.append("the plugin is off; with it on, sglang admits it")
    unchecked = unmapped_clause(judged) if judged.dcp > 1 and not judged.mapped else ""
    # What its passes would do if admitted, unless the stock clause above has said it already.
    stock = facts.stock_judged
    said = plugin_refuses and stock is not None and stock.broken == judged.broken
    if judged.broken and not said:
        why.append(f"the pass map: {findings_clause(judged.broken)}")
    why.extend(host_warnings(facts))
    return Verdict(REJECTED, reason, host_clause(facts), advice, tuple(why), "", unchecked,
                   evidence_of(judged) if not judged.broken else "", _todo(facts, advice, REJECTED))


def refused_draft(message: str) -> str:
    """What of the draft a refusal on flashinfer MLA turns on, in a few words (its message says it at length)."""
    if "own NextN layer as draft" in message:
        return " (own NextN layer as draft)"
    if "an MLA draft checkpoint" in message:
        return " (MLA draft)"
    topk = re.search(r"--speculative-eagle-topk (\d+)", message)
    return f" (topk {topk.group(1)})" if topk else ""


def stops(facts: Facts, stop, advice: Advice | None) -> Verdict:
    """Validation passes, startup does not: the host pools, or the attention backend refusing as it starts."""
    estimated = getattr(facts.sizing, "device_rows_estimated", False)
    if hasattr(stop, "backend"):  # a pass finding: the backend refusing the launch as it starts
        reason, why = f"{stop.backend} refuses {kind_of(facts.judged)} under DCP as it starts", [backend_refusal(stop)]
    else:
        reason, why = stop_reason(stop), [stop_sentence(stop, estimated=estimated)]
    # With the plugin off the launch as run is stock's: the clause would say the same again.
    why.append(stock_clause(facts) if facts.plugin_on else "the plugin is off")
    return Verdict(STOPS, f"{reason}", host_clause(facts), advice, tuple(why) + host_warnings(facts), "", "",
                   "", _todo(facts, advice, STOPS))


def backend_refusal(found) -> str:
    return f"the {found.backend} attention backend refuses it as it starts ({found.detail})"


def broken(facts: Facts, advice: Advice | None) -> Verdict:
    """sglang admits it and it starts, but under DCP a pass crashes or reads other tokens' KV."""
    judged = facts.judged
    first = judged.broken[0]
    # A pass broken in both its CUDA-graph and eager forms is one pass to the operator; the block lists both.
    def one_pass(found) -> str:
        return re.sub(r"_(GRAPH|EAGER)$", "", found.name)

    name = one_pass(first)
    others = {one_pass(f) for f in judged.broken} - {name}
    more = f" (+{len(others)} more)" if others else ""
    reason = f"under DCP {name} on {first.backend} {pass_effect_short(first)}{more}"
    why = [f.line() for f in judged.broken]
    if judged.note:
        why.append(judged.note)
    if facts.plugin_on:  # with the plugin off, the launch as run is stock's: its passes are the ones above
        why.append(stock_clause(facts))
    ok = [f.name for f in judged.findings if f.verdict == "consistent"]
    checked = (f"consistent under DCP: {', '.join(ok)}" if ok else "")
    return Verdict(BROKEN_PASS, reason, host_clause(facts), advice, tuple(why) + host_warnings(facts), checked, "",
                   "", _todo(facts, advice, BROKEN_PASS))


def unchecked(facts: Facts, advice: Advice | None) -> Verdict:
    """It will start, but under DCP the map has not checked its passes on the backend it runs."""
    judged = facts.judged
    backend = facts.backend or "its backend"
    reason = f"{kind_of(judged)} under DCP not checked on {backend}"
    why = [stock_clause(facts), _plugin_clause(facts)] + list(host_warnings(facts))
    return Verdict(UNCHECKED, reason, host_clause(facts), advice, tuple(w for w in why if w), "",
                   unmapped_clause(judged), "", _todo(facts, advice, UNCHECKED))


def passes(facts: Facts) -> Verdict:
    """It will start, and every pass it runs under DCP was checked (or there is no DCP)."""
    judged = facts.judged
    if judged.dcp <= 1:
        reason = "no DCP"
    else:
        backends = ", ".join(sorted({f.backend for f in judged.findings if f.verdict == "consistent"}))
        reason = f"passes checked on {backends}"
        if facts.backend_picked and facts.backend:
            reason += f", picked by {facts.backend_picked}"
        if "TARGET_VERIFY on flashinfer MLA fixed" in judged.evidence:
            reason += f"; verify: {verify_source(judged.evidence)}, proven on CPU"
        if passes_mod.KERNEL_EVIDENCE in judged.evidence:
            reason += "; CPU, against the kernel's documented contract; not yet run on a GPU"
    why = [stock_clause(facts), _plugin_clause(facts)] + list(host_warnings(facts))
    return Verdict(PASSES, reason, host_clause(facts), None, tuple(w for w in why if w),
                   checked_clause(judged) if judged.dcp > 1 else "", "", evidence_of(judged), ())


def of(code: int, facts: Facts, stop=None, advice: Advice | None = None) -> Verdict:
    """The verdict of a judged launch whose exit code is ``code``; ``stop``: what stops it at startup (exit 3)."""
    if code == REJECTED:
        return rejected(facts, advice)
    if code == STOPS:
        return stops(facts, stop, advice)
    if code == BROKEN_PASS:
        return broken(facts, advice)
    if code == UNCHECKED:
        return unchecked(facts, advice)
    return passes(facts)


def verify_source(evidence: str) -> str:
    if "upstream-next" in evidence:
        return "upstream-next 0012"
    return "plugin fix"


def _plugin_clause(facts: Facts) -> str:
    if not facts.plugin_on:
        return "the plugin is off"
    coverage = getattr(facts.sizing, "draft_coverage", None)
    if coverage is None:
        return "with the plugin it passes"
    return (f"with the plugin it passes and the draft host pool covers "
            f"{'all' if coverage >= 1 else f'{coverage:.3f}'} of the target's logical slots")


def _todo(facts: Facts, advice: Advice | None, code: int) -> tuple[str, ...]:
    if advice is not None:
        removed = f" (drop {' '.join(advice.remove)})" if advice.remove else ""
        how = f" ({'; '.join(advice.env)})" if advice.env else ""
        proof = f"; {advice.evidence}" if advice.evidence else ""
        return (f"{advice.change}{removed}{how}; preflight judged that launch on this node: "
                f"{advice.line.removeprefix(PREFIX)}{proof}",)
    if code == UNCHECKED:
        return ("it runs as it is, its passes under DCP unchecked: the pass map has checked no other backend that "
                "passes it on this node and release",)
    if facts.judged.dcp > 1 and code in (REJECTED, BROKEN_PASS):
        return ("preflight found no change that passes on this node and release (it tried the checked "
                "--attention-backend values, --dcp-size 1 and the plugin on)",)
    return ()


def message_core(message: str | None) -> str:
    """sglang's refusal without its exception type and its advice sentence."""
    text = " ".join(str(message or "").split())
    head, sep, rest = text.partition(": ")
    if sep and head.replace("_", "").isalnum() and head[:1].isupper() and " " not in head:
        text = rest
    # Its first clause: what is refused, not why (the why is in the block).
    for cut in (": ", " (", ". ", "; "):
        if cut in text:
            text = text[: text.index(cut)]
    return text.rstrip(".")
