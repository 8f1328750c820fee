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
                "attention_backends", "passes", "resolved", "sizing", "startup_stops", "sizing_if_admitted", "verdict"]
VERDICT_KEYS = ["code", "outcome", "line", "detail", "reason", "host", "why", "checked", "unchecked", "evidence", "todo",
                "advice", "change", "message", "details"]
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
    assert default.startup_stops == default.sizing.startup_stops == ()  # it starts


def test_the_json_keys_are_the_commands_output(default):
    out = default.as_dict()
    assert list(out) == PASSING_KEYS
    assert list(out["sizing"]) == SIZING_KEYS
    assert list(out["verdict"]) == VERDICT_KEYS
    assert list(out["attention_backends"]) == ["prefill", "decode", "from", "draft", "picked_by"]
    assert {k: out["verdict"][k] for k in ("code", "outcome", "line")} == {
        "code": default.verdict.code, "outcome": default.verdict.outcome, "line": default.verdict.line}
    assert out["sizing_if_admitted"] is False
    json.dumps(out)  # every value is JSON's own


def test_the_text_report_reads_the_same_verdict(default):
    """The report ends with the verdict line and the block beneath it."""
    lines = report.render(default).splitlines()
    block = default.verdict.block()
    assert block and lines[-len(block):] == block and lines[-len(block) - 1] == default.verdict.line
    assert f"{default.sizing.target.logical_slots:,} logical slots" in report.render(default)


def test_a_launch_without_hicache_has_no_pools_to_size():
    judged = check.run(["--model-path", MODEL, "--tp", "8"], check.default_node(), device_rows=1024)
    assert isinstance(judged.sizing, result.NoPools) and judged.startup_stops == ()
    assert judged.as_dict()["sizing"] == {"skipped": judged.sizing.skipped}
    assert "host pools: HiCache is off" in report.render(judged)


def test_a_launch_refused_by_sglang_alone_ends_at_its_verdict():
    # 0.5.17 refuses speculative decoding under DCP + HiCache for every algorithm but DSPARK, plugin or not
    judged = check.run(["--model-path", MODEL, "--tp", "8", "--dcp-size", "8", "--enable-hierarchical-cache",
                        "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", MODEL],
                       check.default_node(), device_rows=1024)
    assert not judged.passed and judged.resolved is None and judged.sizing is None
    out = judged.as_dict()
    assert list(out) == [k for k in PASSING_KEYS if k not in ("resolved", "sizing", "startup_stops", "sizing_if_admitted")]
    assert judged.verdict.outcome == "REJECTED"


def test_a_launch_the_plugin_refuses_is_sized_if_admitted():
    """DSPARK on fa3 under DCP: the plugin refuses it, and the report still says what it would pin."""
    judged = check.run(["--model-path", MODEL, "--tp", "8", "--dcp-size", "8", "--enable-hierarchical-cache",
                        "--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", str(check.DEFAULT_DRAFT),
                        "--attention-backend", "fa3"], check.Node.of_part("NVIDIA H200"), device_rows=100_000)
    assert not judged.passed and not judged.admitted and isinstance(judged.sizing, result.Sizing)
    out = judged.as_dict()
    assert out["sizing_if_admitted"] is True and out["sizing"]["host_ram"]["needed_per_node"] > 0
    assert "if admitted" in judged.verdict.host and "if admitted" in report.render(judged)


def test_a_sweep_keeps_its_rows_typed_and_its_worst_verdict():
    refused = result.Refused(Verdict(BAD_INPUT, "no"))
    assert refused.as_dict()["verdict"]["line"] == "verdict: BAD INPUT (exit 2): no"
    assert list(refused.as_dict()["verdict"]) == VERDICT_KEYS
    swept = sweep.sweep([], check.default_node(), None, "tp=8,3")
    assert [r.value for r in swept.rows] == ["8", "3"]
    assert isinstance(swept.rows[1].report, result.Refused) and swept.verdict == swept.rows[1].report.verdict
    assert swept.rows[1].variants == {} and swept.rows[0].variants
    out = swept.as_dict()
    assert list(out) == ["sweep", "flag", "release", "launch", "rows", "verdict"]
    assert list(out["rows"][0]) == ["value", "report", "variants"]


def test_a_judgement_reports_what_the_plugins_hooks_decided_on_it_alone():
    """One adapter judges many launches (a sweep, the advice): each judgement keeps its own record, so a launch
    without HiCache judged after one that builds the host pools reports none of the pool hooks' decisions."""
    node = check.default_node()
    release, argv, configs = check.prepare([], node, 1024)
    first = check.judge(release, argv, node, 1024, configs, advise=False)
    plain = check.judge(release, ["--model-path", MODEL, "--tp", "8"], node, 1024, configs, advise=False)
    pools = {t for t in first.plugin.hooks if "init_memory_pools" in t or "maybe_register_hicache_draft" in t}
    assert pools, first.plugin.hooks  # the first judgement did decide them
    assert not pools & set(plain.plugin.hooks), plain.plugin.hooks
