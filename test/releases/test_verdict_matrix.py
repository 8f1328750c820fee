"""preflight's verdicts over a matrix of launches: each line fits a terminal, and no verdict contradicts itself.

96 launches per tree (two nodes, six backend choices, four launch kinds, the plugin on and off), judged in this
process on stock 0.5.17, stock 0.5.23 and 0.5.23 with patches/upstream-next. Each verdict is held to:

- its line is at most 160 characters, and each line of the block beneath it at most 100;
- it names backends by their --attention-backend values, never by a class;
- a launch that passes (0 or 6) never says that no backend runs it;
- "stock sglang admits it too" only where stock sglang, judged the same way with the plugin off, does not reject it
  nor break a pass;
- "stops at startup" (or "as it starts") in the line only with exit 3;
- where the plugin is on and stock sglang admits the launch, a refusal is the plugin's, never "sglang rejects";
- advice never names the backend the launch already runs on, and the launch it advises gets exit 0 or 6 when
  preflight judges it, the code the advice states.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from sglang_dcp_dspark.preflight.check import DEFAULT_DRAFT, DEFAULT_MODEL
from sglang_dcp_dspark.preflight.verdict import BLOCK_WIDTH, LINE_WIDTH
from trees import TREE

from .conftest import preflight

MATRIX_TREES = ("stock", "next-stock", "next-patched")
pytestmark = pytest.mark.skipif(TREE not in MATRIX_TREES, reason=f"the verdict matrix runs on {', '.join(MATRIX_TREES)}")

EAGLE3_DRAFT = Path(__file__).parents[1] / "data" / "public" / "kimi-k2.5-eagle3"  # a published EAGLE3 draft's shape
NODES = ("NVIDIA H200", "NVIDIA B200")
BACKENDS = (None, "fa3", "flashinfer", "cutedsl_mla", "trtllm_mla", "triton")
BASE = ["--model-path", str(DEFAULT_MODEL), "--tp", "8", "--dcp-size", "8"]
KINDS = {
    "DSPARK": [*BASE, "--enable-hierarchical-cache", "--speculative-algorithm", "DSPARK",
               "--speculative-draft-model-path", str(DEFAULT_DRAFT)],
    "EAGLE3": [*BASE, "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(EAGLE3_DRAFT),
               "--speculative-eagle-topk", "1", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4"],
    "NEXTN": [*BASE, "--speculative-algorithm", "NEXTN"],
    "plain": [*BASE, "--enable-hierarchical-cache"],
}
OFF = {"SGLANG_ENABLE_DCP_DSPARK_PLUGIN": "0"}
LAUNCHES = list(itertools.product(NODES, BACKENDS, KINDS, (True, False)))


def judged(node: str, argv: list[str], plugin: bool) -> tuple[int, dict]:
    code, report, _ = preflight("--gpu-name", node, "--device-rows", "200000", "--", *argv, env=None if plugin else OFF)
    return code, report


def argv_of(kind: str, backend: str | None) -> list[str]:
    return KINDS[kind] + (["--attention-backend", backend] if backend else [])


def advised(argv: list[str], advice: dict) -> list[str]:
    """The launch the advice names: its removed flags dropped, its added ones put in."""
    out, removed, i = [], list(advice["remove"]), 0
    while i < len(argv):
        if argv[i: i + 2] == removed[:2] and removed:
            removed, i = removed[2:], i + 2
            continue
        out.append(argv[i])
        i += 1
    add = list(advice["add"])
    if add[:1] == ["--dcp-size"]:
        out = [a for j, a in enumerate(out) if a != "--dcp-size" and (j == 0 or out[j - 1] != "--dcp-size")]
    return out + add


def contradictions(node: str, kind: str, backend: str | None, plugin: bool) -> list[str]:
    argv = argv_of(kind, backend)
    code, report = judged(node, argv, plugin)
    verdict = report["verdict"]
    line = verdict["line"]
    text = " ".join([line, *(verdict.get("why") or []), verdict.get("checked") or "", verdict.get("unchecked") or "",
                     *(verdict.get("todo") or [])])
    found = []
    if len(line) > LINE_WIDTH:
        found.append(f"a line of {len(line)} characters")
    by_class = re.search(r"\b[A-Z]\w*Backend\b", line)
    if by_class:
        found.append(f"a backend named by its class ({by_class.group()}), not its value")
    if code == 2:
        return found
    if code in (0, 6) and ("none runs" in text or "runs it correctly" in text):
        found.append("a passing launch said to run nowhere")
    if "admits it too" in text:
        stock_code, _ = judged(node, argv, False)
        if stock_code in (1, 5):
            found.append(f"'stock sglang admits it too' where stock gets exit {stock_code}")
    at_startup = ("stops at startup", "as it starts", "as the server starts")
    if any(words in line for words in at_startup) and code != 3:
        found.append(f"exit 3's words ({', '.join(w for w in at_startup if w in line)}) under exit {code}")
    if code == 1 and plugin and report["stock"]["passed"] and "sglang" in line and "rejects" in line:
        found.append("'sglang rejects' where the plugin refuses")
    advice = verdict.get("advice")
    if advice:
        named = report["attention_backends"]["decode"]
        if advice["add"][:1] == ["--attention-backend"] and advice["add"][1] == named:
            found.append(f"advice to use {named}, which the launch already runs on")
        again, report2 = judged(node, advised(argv, advice), True if advice["env"] else plugin)
        if again not in (0, 6) or again != advice["verdict"]:
            found.append(f"advice {advice['add'] or advice['env']} gets exit {again}, not {advice['verdict']}: "
                         f"{report2['verdict']['line']}")
    return found


def test_the_matrix_is_at_least_sixty_launches():
    assert len(LAUNCHES) >= 60


@pytest.mark.parametrize("node", NODES)
def test_no_verdict_contradicts_itself(node):
    bad = {}
    for _, backend, kind, plugin in (launch for launch in LAUNCHES if launch[0] == node):
        found = contradictions(node, kind, backend, plugin)
        if found:
            bad[(kind, backend, "plugin on" if plugin else "plugin off")] = found
    assert not bad, "\n".join(f"{k}: {v}" for k, v in bad.items())


def test_the_block_beneath_fits_a_terminal():
    from sglang_dcp_dspark.preflight import check
    from sglang_dcp_dspark.preflight.launch import Node

    for kind in KINDS:
        report = check.run(argv_of(kind, None), Node.of_part("NVIDIA H200"), 200_000)
        assert all(len(line) <= BLOCK_WIDTH for line in report.verdict.block()), report.verdict.block()


def test_a_contradiction_is_caught(monkeypatch):
    """Control: a verdict line that advises the backend the launch already runs on is reported."""
    from sglang_dcp_dspark.preflight import verdict

    real = verdict.Verdict.as_dict

    def advise_the_same(self):
        out = real(self)
        out["advice"] = {"change": "--attention-backend flashinfer", "add": ["--attention-backend", "flashinfer"],
                         "remove": [], "env": [], "verdict": 0, "line": ""}
        return out

    monkeypatch.setattr(verdict.Verdict, "as_dict", advise_the_same)
    assert any("already runs on" in f for f in contradictions("NVIDIA H200", "plain", "flashinfer", True))
