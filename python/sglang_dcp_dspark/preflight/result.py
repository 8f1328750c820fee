"""What one judgement finds, as types: the report :func:`check.judge` returns and :mod:`report` and ``--json`` read.

Each class holds what the model decided and nothing more; ``as_dict`` is the
``--json`` form, whose keys and their order are the output scripts read
(test/preflight/test_result.py pins them), so a script written against an
earlier release reads this one unchanged. Nothing reads a verdict back out of
that form.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, fields

from ..core.exits import OUTCOMES
from ..passes import Judgement
from .hostram import HostRam
from .launch import Node

PREFIX = "verdict: "  # the verdict line's first word: what an operator (and a script) looks for
BLOCK_WIDTH = 100  # each line beneath the verdict line
LABEL = 10  # the block's label column


@dataclass(frozen=True)
class Change:
    """A change to the launch: options set (with their values), options dropped, the plugin switched on.

    ``words``: the change as an operator reads it ("drop --enable-hierarchical-cache")."""

    words: str
    add: tuple[str, ...] = ()  # options with their values, set (replacing any old value)
    drop: tuple[str, ...] = ()  # option names dropped with their values
    drop_flags: tuple[str, ...] = ()  # options without a value, dropped
    drop_prefix: str = ""  # every option that starts with this, dropped with its value (--speculative-)
    plugin_on: bool = False


@dataclass(frozen=True)
class Refusal:
    """Who refuses the launch at argument time, and what, as facts (never read back out of the message).

    ``what`` is in an operator's words, short enough for the verdict line; ``message`` the refusal whole;
    ``backend`` the attention backend it turns on; ``fixes`` the changes the refusal itself names, tried first;
    ``todo`` a fix preflight cannot judge (a path only the operator knows, the names to choose from)."""

    who: str
    what: str
    message: str
    backend: str | None = None
    fixes: tuple[Change, ...] = ()
    todo: str = ""
    words: str = ""  # the refusal's own sentence where it is one short sentence (no exception type): quoted whole


@dataclass(frozen=True)
class Advice:
    """A change preflight judged itself on the same node and release, and the verdict it gave that launch."""

    change: Change
    removed: tuple[str, ...]  # the launch's own tokens the change takes out
    code: int
    line: str
    reason: str
    env: tuple[str, ...] = ()
    evidence: str = ""  # what proves the changed launch's fixed passes (its verdict's evidence), if any

    def as_dict(self) -> dict:
        return {"change": self.change.words, "add": list(self.change.add), "remove": list(self.removed),
                "env": list(self.env), "verdict": self.code, "line": self.line, "evidence": self.evidence or None,
                "reason": self.reason}


@dataclass(frozen=True)
class Verdict:
    """What preflight says of a launch: the line, then each entry of the block beneath it."""

    code: int
    reason: str
    host: str = ""
    advice: Advice | None = None
    why: tuple[str, ...] = ()
    message: str = ""
    checked: str = ""
    unchecked: str = ""
    evidence: str = ""
    todo: tuple[str, ...] = ()
    details: tuple[str, ...] = ()

    @property
    def outcome(self) -> str:
        return OUTCOMES.get(self.code, "ERROR")

    @property
    def line(self) -> str:
        return f"{PREFIX}{self.outcome} (exit {self.code}): {self.reason}"

    @property
    def change(self) -> str:
        """The entry beneath the line: the change that works and the verdict preflight gave that launch."""
        if self.advice is None:
            return ""
        a = self.advice
        return f"{a.change.words}: {OUTCOMES.get(a.code, 'ERROR')} (exit {a.code}), {a.reason}"

    @property
    def detail(self) -> str:
        """The whole reason in one string (``--json``'s ``detail``)."""
        return "; ".join(self.why) if self.why else self.reason

    def entries(self) -> list[tuple[str, str]]:
        return [("change", self.change), ("host", self.host), *(("why", w) for w in self.why),
                ("message", self.message), ("checked", self.checked), ("unchecked", self.unchecked),
                ("evidence", self.evidence), *(("to do", t) for t in self.todo),
                *(("details", d) for d in self.details)]

    def block(self, width: int = BLOCK_WIDTH) -> list[str]:
        """The lines beneath the verdict line, read in order, each wrapped at a word boundary within ``width``."""
        out, last = [], None
        for label, text in self.entries():
            if not text:
                continue
            head = f"  {label if label != last else '':<{LABEL}}"
            out += textwrap.wrap(" ".join(text.split()), width=width, initial_indent=head,
                                 subsequent_indent=" " * len(head), break_on_hyphens=False, break_long_words=True)
            last = label
        return out

    def as_dict(self) -> dict:
        return {"code": self.code, "outcome": self.outcome, "line": self.line, "detail": self.detail,
                "reason": self.reason, "host": self.host or None, "why": list(self.why), "checked": self.checked or None,
                "unchecked": self.unchecked or None, "evidence": self.evidence or None, "todo": list(self.todo),
                "advice": None if self.advice is None else self.advice.as_dict(), "change": self.change or None,
                "message": self.message or None, "details": list(self.details)}



@dataclass(frozen=True)
class Release:
    """The sglang that judged the launch: its version, the adapter chosen by asking its code, and any series applied."""

    sglang: str
    adapter: str
    family_since: str
    changes: tuple[str, ...]
    series_applied: tuple[str, ...]

    def as_dict(self) -> dict:
        return {"sglang": self.sglang, "adapter": self.adapter, "family_since": self.family_since,
                "changes": list(self.changes), "series_applied": list(self.series_applied)}


@dataclass(frozen=True)
class Plugin:
    """Would sglang's load_plugins() run the plugin, why, and what each of its hooks decided on this release."""

    enabled: bool
    reason: str
    hooks: dict[str, str]

    def as_dict(self) -> dict:
        return {"enabled": self.enabled, "reason": self.reason, "hooks": dict(self.hooks)}


@dataclass(frozen=True)
class Outcome:
    """One resolution's answer: sglang admits the launch, or the message it refuses it with."""

    passed: bool
    message: str | None

    def as_dict(self) -> dict:
        return {"passed": self.passed, "message": self.message}


@dataclass(frozen=True)
class Backends:
    """The target's attention backends on the emulated node, where they come from, and the draft's if named."""

    prefill: str | None
    decode: str | None
    source: str  # each side's backend and where it comes from, in words
    draft: str | None
    picked_by: str = ""  # who picked the decode backend where the launch names none and sglang's own choice was not kept

    def as_dict(self) -> dict:
        return {"prefill": self.prefill, "decode": self.decode, "from": self.source, "draft": self.draft,
                "picked_by": self.picked_by or None}


@dataclass(frozen=True)
class Pool:
    """One host pool of rank 0, as the release's builder made it, and what all ranks of a node pin for it."""

    name: str
    role: str
    built_by: str
    rows: int
    logical_slots: int
    page_size: int
    bytes_per_token: int
    bytes: int
    per_node_bytes: int

    @classmethod
    def of(cls, built, ranks: int) -> tuple[Pool, ...]:
        """The pools of a release adapter's ``Built``, for ``ranks`` ranks on a node."""
        return tuple(cls(p.name, p.role, p.built_by, p.size.rows, p.size.logical_slots, p.size.page_size,
                         p.size.bytes_per_token, p.size.bytes, p.size.bytes * ranks) for p in built.pools)

    def as_dict(self) -> dict:
        return dict(vars(self))


@dataclass(frozen=True)
class Backup:
    """The pools of one ``--hicache-draft-backup`` mode, beside the other (a tree with upstream-next 0005)."""

    pools: tuple[Pool, ...]
    per_rank: int
    per_node: int
    target_logical_slots: int | None
    startup_error: str | None

    def as_dict(self) -> dict:
        return {"pools": [p.as_dict() for p in self.pools], "per_rank": self.per_rank, "per_node": self.per_node,
                "target_logical_slots": self.target_logical_slots, "startup_error": self.startup_error}


@dataclass(frozen=True)
class Setup:
    """Pinned bytes per node of one of the sweep chart's setups (report.SETUPS), and where the figure comes from."""

    per_node: int | None
    source: str
    startup_error: str | None

    def as_dict(self) -> dict:
        return {"per_node": self.per_node, "from": self.source, "startup_error": self.startup_error}


@dataclass(frozen=True)
class Sizing:
    """Rank 0's host pools as the launch runs them, as stock sglang would build them, and the node's RAM."""

    device_rows: int
    device_rows_note: str
    device_rows_estimated: bool
    device_rows_max: int
    dcp_size: int
    page_size: int
    logical_page_size: int
    target_kv: dict
    draft_kv: dict | None
    draft_architecture: str | None
    ranks_per_node: int
    draft_plan: str | None
    draft_path: str | None
    hicache_ratio: float | None
    auto_sized_from: float | None
    target_hicache_size: float | None
    pools: tuple[Pool, ...]
    stock_pools: tuple[Pool, ...] | None  # None where stock sglang builds exactly what runs
    stock_startup_error: str | None
    draft_coverage: float | None
    draft_coverage_stock: float | None
    backups: dict[str, Backup] | None
    variants: dict[str, Setup] | None
    host_ram: HostRam

    @property
    def target(self) -> Pool | None:
        return next((p for p in self.pools if p.role == "target"), None)

    @property
    def startup_stops(self) -> tuple[str, ...]:
        """Why startup stops in the host pools, in the verdict's words (empty: it does not)."""
        from .hostram import stop_sentence

        return tuple(stop_sentence(s, estimated=self.device_rows_estimated) for s in self.host_ram.stops)

    def as_dict(self) -> dict:
        """Every field in its order, each typed one in its own JSON form, then the stops it leads to."""
        out = {f.name: _json(getattr(self, f.name)) for f in fields(self)}
        out["startup_stops"] = list(self.startup_stops)
        return out


def _json(value):
    """A field in the ``--json`` form: a typed value's own ``as_dict``, its pools and setups likewise."""
    if hasattr(value, "as_dict"):
        return value.as_dict()
    if isinstance(value, tuple):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class NoPools:
    """A launch without HiCache: no host pools to size, and why."""

    skipped: str

    def as_dict(self) -> dict:
        return {"skipped": self.skipped}


@dataclass(frozen=True)
class Report:
    """One judged launch. ``resolved`` and ``sizing`` are set where some resolution passes sglang's validation:
    the launch as run, or, where that one is refused (``admitted`` False), the other one (stock's where the plugin
    refuses), so that a refused launch still shows what it would pin if admitted."""

    release: Release
    launch: tuple[str, ...]
    node: Node
    plugin: Plugin
    stock: Outcome
    with_plugin: Outcome
    sglang_warnings: tuple[str, ...]
    attention_backends: Backends
    passes: Judgement
    verdict: Verdict
    resolved: dict | None = None
    sizing: Sizing | NoPools | None = None

    @property
    def as_run(self) -> Outcome:
        """The resolution the launch runs as: with the plugin where sglang's load_plugins() runs it, else stock."""
        return self.with_plugin if self.plugin.enabled else self.stock

    @property
    def passed(self) -> bool:
        return self.as_run.passed

    @property
    def message(self) -> str | None:
        return self.as_run.message

    @property
    def admitted(self) -> bool:
        """The sizing is the launch as it runs (False: as it would run if the refusing side admitted it)."""
        return self.as_run.passed

    @property
    def startup_stops(self) -> tuple[str, ...]:
        return self.sizing.startup_stops if isinstance(self.sizing, Sizing) else ()

    def as_dict(self) -> dict:
        out = {"release": self.release.as_dict(), "launch": list(self.launch),
               "node": vars(self.node) | {"capability": list(self.node.capability)},
               "plugin": self.plugin.as_dict(), "stock": self.stock.as_dict(), "with_plugin": self.with_plugin.as_dict(),
               "passed": self.passed, "message": self.message, "sglang_warnings": list(self.sglang_warnings),
               "attention_backends": self.attention_backends.as_dict(), "passes": self.passes.as_dict()}
        if self.resolved is not None:
            out["resolved"] = dict(self.resolved)
            out["sizing"] = self.sizing.as_dict()
            out["startup_stops"] = list(self.startup_stops)
            out["sizing_if_admitted"] = not self.admitted
        out["verdict"] = self.verdict.as_dict()
        return out


@dataclass(frozen=True)
class Refused:
    """A sweep's value that preflight refused as input (or failed on): its verdict alone."""

    verdict: Verdict

    def as_dict(self) -> dict:
        return {"verdict": self.verdict.as_dict()}


@dataclass(frozen=True)
class SweepRow:
    value: str
    report: Report | Refused

    @property
    def sizing(self) -> Sizing | None:
        """The row's host pools, where its launch was judged and has some."""
        sizing = self.report.sizing if isinstance(self.report, Report) else None
        return sizing if isinstance(sizing, Sizing) else None

    @property
    def variants(self) -> dict[str, Setup]:
        return (self.sizing.variants if self.sizing is not None else None) or {}

    def as_dict(self) -> dict:
        return {"value": self.value, "report": self.report.as_dict(),
                "variants": {k: v.as_dict() for k, v in self.variants.items()}}


@dataclass(frozen=True)
class Sweep:
    """One judgement per value of one launch option; its verdict is its worst row's."""

    sweep: str
    flag: str
    release: str
    launch: tuple[str, ...]
    rows: tuple[SweepRow, ...]
    verdict: Verdict
    plot: str | None = None

    def as_dict(self) -> dict:
        out = {"sweep": self.sweep, "flag": self.flag, "release": self.release, "launch": list(self.launch),
               "rows": [r.as_dict() for r in self.rows]}
        if self.plot is not None:
            out["plot"] = self.plot
        out["verdict"] = self.verdict.as_dict()
        return out
