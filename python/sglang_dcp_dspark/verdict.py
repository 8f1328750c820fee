"""preflight's verdict on a launch: its exit code, its outcome, and the one line that says why.

The model layer decides it (:mod:`preflight` from sglang's resolution,
:mod:`hostram` for what stops startup); :mod:`report` only renders it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .hostram import gib

# Exit codes: the verdict on the launch as it will run.
# 4 is the command line's internal error (``__main__``); 5: sglang admits the launch, and the
# pass map shows one of its speculative passes crashing or reading other tokens' KV under DCP.
PASSES, REJECTED, BAD_INPUT, STOPS, BROKEN_PASS = 0, 1, 2, 3, 5
OUTCOMES = {PASSES: "PASSES", REJECTED: "REJECTED", BAD_INPUT: "BAD INPUT", STOPS: "STOPS AT STARTUP",
            BROKEN_PASS: "BROKEN PASS"}


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


def passes_detail(report: dict) -> str:
    """Why a launch that will start passes: what stock does, what the fix does, whether the node fits."""
    release = report["release"]["sglang"]
    stock = "stock sglang passes it too" if report["stock"]["passed"] else "stock sglang rejects it"
    if report["stock"]["passed"] and (report.get("sizing") or {}).get("stock_startup_error"):
        stock = "stock sglang passes its validation but stops at startup"
    fix = "with the plugin it passes" if report["plugin"]["enabled"] else "the plugin is off"
    sizing = report.get("sizing") or {}
    if "host_ram" not in sizing:
        return f"{stock}; {fix}; no HiCache host pools to pin: it will start"
    coverage = sizing.get("draft_coverage")
    if coverage is not None:
        fix += f" and the draft host pool covers {'all' if coverage >= 1 else f'{coverage:.3f}'} of the target's logical slots"
    ram, node = sizing["host_ram"], report["node"]
    return (f"{stock}; {fix}; its host pools pin {gib(ram['needed_per_node'])} per node, within the "
            f"{gib(ram['available'])} of the {node['gpus']} x {node['gpu_name']} node ({ram['available_from']}): "
            f"it will start (judged by sglang {release})")
