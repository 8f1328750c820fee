"""preflight's verdict on a launch: its exit code, its outcome, and the one line that says why.

The model layer decides it (:mod:`check` from sglang's resolution,
:mod:`hostram` for what stops startup); :mod:`report` only renders it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .hostram import gib

# Exit codes: the verdict on the launch as it will run.
# 4 is the command line's internal error (``__main__``); 5: sglang admits the launch, and the
# pass map shows one of its passes under DCP crashing or reading other tokens' KV; 6: sglang admits it
# and it will start, but under DCP the map has not checked its passes on the backend (or release) it runs.
# So 0 is said only where every pass the launch runs under DCP was checked, or there is no DCP.
PASSES, REJECTED, BAD_INPUT, STOPS, BROKEN_PASS, UNCHECKED = 0, 1, 2, 3, 5, 6
OUTCOMES = {PASSES: "PASSES", REJECTED: "REJECTED", BAD_INPUT: "BAD INPUT", STOPS: "STOPS AT STARTUP",
            BROKEN_PASS: "BROKEN PASS", UNCHECKED: "PASSES, UNCHECKED"}


# Worst last: a sweep exits with its worst row's code. An unchecked pass is better than any refusal or break.
SEVERITY = (PASSES, UNCHECKED, REJECTED, BAD_INPUT, STOPS, BROKEN_PASS)


def worst(codes) -> int:
    return max(codes, key=lambda c: SEVERITY.index(c) if c in SEVERITY else len(SEVERITY))


@dataclass(frozen=True)
class Verdict:
    code: int
    detail: str

    @property
    def outcome(self) -> str:
        return OUTCOMES.get(self.code, "ERROR")

    @property
    def line(self) -> str:
        return f"verdict: {self.outcome} (exit {self.code}): {self.detail}"

    def as_dict(self) -> dict:
        return {"code": self.code, "outcome": self.outcome, "line": self.line}


def checked_clause(judged) -> str:
    """What the pass map checked of the launch under DCP (a :class:`passes.Judgement`), for a verdict line that says
    PASSES."""
    if judged.dcp <= 1:
        return "no DCP, so no pass reads another rank's layout"
    consistent = [f for f in judged.findings if f.verdict == "consistent"]
    names = ", ".join(f.name for f in consistent)
    backends = ", ".join(sorted({f.backend for f in consistent}))
    evidence = f" ({judged.evidence})" if judged.evidence else ""
    return f"under DCP the pass map checked {names} on {backends}: each reads the rows it wrote{evidence}"


def passes_detail(release, stock, plugin, judged, sizing, node, unchecked: str | None = None) -> str:
    """Why a launch that will start passes: what stock does, what the fix does, what the pass map checked under DCP
    (``unchecked``: what it could not), whether the node fits. The arguments are the report's parts
    (:mod:`result`): the release, stock's outcome, the plugin, the pass judgement, the sizing and the node."""
    # A patched tree is not stock sglang: name what the tree carries.
    base = f"sglang {release.sglang} with {', '.join(release.series_applied)} applied" if release.series_applied else "stock sglang"
    said = f"{base} passes it too" if stock.passed else f"{base} rejects it"
    if stock.passed and getattr(sizing, "stock_startup_error", None):
        said = f"{base} passes its validation but stops at startup"
    checked = unchecked or checked_clause(judged)
    fix = "with the plugin it passes" if plugin.enabled else "the plugin is off"
    ram = getattr(sizing, "host_ram", None)
    if ram is None:
        return f"{said}; {fix}; {checked}; no HiCache host pools to pin: it will start"
    if sizing.draft_coverage is not None:
        coverage = sizing.draft_coverage
        fix += f" and the draft host pool covers {'all' if coverage >= 1 else f'{coverage:.3f}'} of the target's logical slots"
    return (f"{said}; {fix}; {checked}; its host pools pin {gib(ram.needed_per_node)} per node, within the "
            f"{gib(ram.available)} of the {node.gpus} x {node.gpu_name} node ({ram.available_from}): "
            f"it will start (judged by sglang {release.sglang})")
