"""preflight.result: the typed report one judgement returns, and its ``--json`` form.

The renderer and ``--json`` read the same object; the JSON keys and their
order are the command's output that scripts read, so they are pinned here.
Judged on the installed sglang (the unit tier: stock 0.5.17), on the embedded
default and two launches that end elsewhere: without HiCache, and refused.
"""

from __future__ import annotations

import json

import pytest

from sglang_dcp_dspark.preflight import check, report, result, sweep
from sglang_dcp_dspark.preflight.verdict import BAD_INPUT, Verdict

PASSING_KEYS = ["release", "launch", "node", "plugin", "stock", "with_plugin", "passed", "message", "sglang_warnings",
                "attention_backends", "passes", "resolved", "sizing", "startup_stops", "verdict"]
SIZING_KEYS = ["device_rows", "device_rows_note", "device_rows_estimated", "device_rows_max", "dcp_size", "page_size",
               "logical_page_size", "target_kv", "draft_kv", "draft_architecture", "ranks_per_node", "draft_plan",
               "draft_path", "hicache_ratio", "auto_sized_from", "target_hicache_size", "pools", "stock_pools",
               "stock_startup_error", "draft_coverage", "draft_coverage_stock", "backups", "variants", "host_ram",
               "startup_stops"]
MODEL = str(check.DEFAULT_MODEL)


@pytest.fixture(scope="module")
def default() -> result.Report:
    return check.run([], check.default_node())


def test_a_judgement_is_typed_all_the_way_down(default):
    assert isinstance(default, result.Report) and isinstance(default.verdict, Verdict)
    assert isinstance(default.sizing, result.Sizing) and isinstance(default.sizing.target, result.Pool)
    assert default.sizing.device_rows == check.DEFAULT_DEVICE_ROWS
    assert default.sizing.device_rows_note.startswith("the default launch's figure")
    assert default.startup_stops == default.sizing.startup_stops == tuple(default.sizing.host_ram.stops)


def test_the_json_keys_are_the_commands_output(default):
    out = default.as_dict()
    assert list(out) == PASSING_KEYS
    assert list(out["sizing"]) == SIZING_KEYS
    assert list(out["verdict"]) == ["code", "outcome", "line"]
    assert list(out["attention_backends"]) == ["prefill", "decode", "from", "draft"]
    assert out["verdict"] == {"code": default.verdict.code, "outcome": default.verdict.outcome,
                              "line": default.verdict.line}
    json.dumps(out)  # every value is JSON's own


def test_the_text_report_reads_the_same_verdict(default):
    lines = report.render(default).splitlines()
    assert lines[-1] == default.verdict.line
    assert f"{default.sizing.target.logical_slots:,} logical slots" in report.render(default)


def test_a_launch_without_hicache_has_no_pools_to_size():
    judged = check.run(["--model-path", MODEL, "--tp", "8"], check.default_node(), device_rows=1024)
    assert isinstance(judged.sizing, result.NoPools) and judged.startup_stops == ()
    assert judged.as_dict()["sizing"] == {"skipped": judged.sizing.skipped}
    assert "host pools: HiCache is off" in report.render(judged)


def test_a_refused_launch_ends_at_its_verdict():
    # 0.5.17 refuses speculative decoding under DCP + HiCache for every algorithm but DSPARK, plugin or not
    judged = check.run(["--model-path", MODEL, "--tp", "8", "--dcp-size", "8", "--enable-hierarchical-cache",
                        "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", MODEL],
                       check.default_node(), device_rows=1024)
    assert not judged.passed and judged.resolved is None and judged.sizing is None
    out = judged.as_dict()
    assert list(out) == [k for k in PASSING_KEYS if k not in ("resolved", "sizing", "startup_stops")]
    assert judged.verdict.outcome == "REJECTED"


def test_a_sweep_keeps_its_rows_typed_and_its_worst_verdict():
    refused = result.Refused(Verdict(BAD_INPUT, "no"))
    assert refused.as_dict() == {"verdict": {"code": 2, "outcome": "BAD INPUT", "line": "verdict: BAD INPUT (exit 2): no"}}
    swept = sweep.sweep([], check.default_node(), None, "tp=8,3")
    assert [r.value for r in swept.rows] == ["8", "3"]
    assert isinstance(swept.rows[1].report, result.Refused) and swept.verdict == swept.rows[1].report.verdict
    assert swept.rows[1].variants == {} and swept.rows[0].variants
    out = swept.as_dict()
    assert list(out) == ["sweep", "flag", "release", "launch", "rows", "verdict"]
    assert list(out["rows"][0]) == ["value", "report", "variants"]
