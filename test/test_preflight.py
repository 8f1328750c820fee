"""preflight: sglang's own argument resolution on an emulated node, the report, and its exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sglang_dcp_dspark.__main__ import main
from sglang_dcp_dspark.preflight import DEFAULT_MODEL

GATE = "HiCache with --dcp-size > 1"


def launch(model, algorithm="DSPARK", *extra):
    return ["--", "--model-path", str(model), "--tp", "8", "--dcp-size", "8", "--enable-hierarchical-cache",
            "--speculative-algorithm", algorithm, "--speculative-draft-model-path", str(model), *extra]


def test_default_run_from_the_command_line():
    """No arguments: the embedded tiny MLA model at DCP8 + HiCache + DSPARK, in a fresh process."""
    done = subprocess.run([sys.executable, "-m", "sglang_dcp_dspark", "preflight", "--device-rows", "1024"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "launch PASSES" in out
    assert "stock sglang  rejected: NotImplementedError: " + GATE in out
    assert "with plugin   passes" in out
    assert "page size       1 physical, 8 logical" in out
    assert "draft, stock sizing" in out and "draft, with fix" in out


def test_json_report_geometry(capsys):
    assert main(["preflight", "--json", "--device-rows", "1024", "--host-ram-gib", "2048"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and not report["stock"]["passed"] and GATE in report["stock"]["message"]
    g = report["sizing"]["geometry"]
    assert g["dcp_size"] == 8 and g["device_rows"] == 1024
    assert g["target"]["logical_slots"] == 8 * g["target"]["rows"]
    assert g["coverage_stock"] < 0.2 <= 1.0 <= g["coverage_fixed"]
    ram = report["sizing"]["host_ram"]
    assert ram["needed_per_rank"] == g["target"]["bytes"] + g["draft_fixed"]["bytes"]
    assert ram["needed_per_node"] == 8 * ram["needed_per_rank"] and ram["fits"]


@pytest.mark.parametrize("unbudgeted", [False, True])
def test_hicache_size_is_shared_with_the_draft(capsys, monkeypatch, unbudgeted):
    """With --hicache-size, target + draft fit it; SGLANG_HICACHE_SIZE_EXCLUDES_DRAFT=1 shows sglang's own sizing."""
    if unbudgeted:
        monkeypatch.setenv("SGLANG_HICACHE_SIZE_EXCLUDES_DRAFT", "1")
    argv = ["preflight", "--json", "--device-rows", "1024", "--host-ram-gib", "2048",
            *launch(DEFAULT_MODEL, "DSPARK", "--hicache-size", "2")]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    ram, g = report["sizing"]["host_ram"], report["sizing"]["geometry"]
    assert g["coverage_fixed"] >= 1.0
    if unbudgeted:
        assert ram["target_share"] is None and ram["needed_per_rank"] > 2e9
    else:
        assert ram["needed_per_rank"] <= ram["budget_per_rank"] == 2e9
        assert ram["target_share"] < ram["target_share_without_dcp"]


def test_host_ram_too_small_for_the_plugins_startup_check(capsys):
    """The same numbers the plugin's start-up check uses: device rows x (t + dcp d) against the rank's RAM share."""
    assert main(["preflight", "--json", "--device-rows", "400000", "--host-ram-gib", "12"]) == 0
    ram = json.loads(capsys.readouterr().out)["sizing"]["host_ram"]
    assert not ram["starts"] and ram["smallest_per_rank"] > ram["share_per_rank"]
    assert main(["preflight", "--device-rows", "400000", "--host-ram-gib", "12"]) == 0
    assert "startup         STOPS with the plugin" in capsys.readouterr().out
    assert main(["preflight", "--json", "--device-rows", "1024", "--host-ram-gib", "2048"]) == 0
    assert json.loads(capsys.readouterr().out)["sizing"]["host_ram"]["starts"]


def test_device_rows_estimate_is_labelled(capsys):
    assert main(["preflight", "--json"]) == 0
    assert "estimate" in json.loads(capsys.readouterr().out)["sizing"]["device_rows_note"]


def test_eagle_is_rejected_with_sglangs_message(capsys):
    assert main(["preflight", *launch(DEFAULT_MODEL, "EAGLE")]) == 1
    out = capsys.readouterr().out
    assert "launch REJECTED" in out and GATE in out


def test_plugin_switched_off_reports_the_stock_result(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_PLUGINS", "some_other_plugin")
    assert main(["preflight", "--device-rows", "1024"]) == 1
    assert "plugin off" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,reason",
    [
        (["--", "--model-path", "/nonexistent-model-dir"], "has no config.json"),
        (launch(DEFAULT_MODEL, "DSPARK", "--no-such-flag"), "unrecognized arguments: --no-such-flag"),
        (launch(DEFAULT_MODEL, "DSPARK", "--hicache-ratio", "-1"), "nonsense sizes"),
        (["--gpus", "0"], "nonsense sizes"),
        (["--device-rows", "0"], "nonsense sizes"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, argv, reason):
    assert main(["preflight", *argv]) == 2
    err = capsys.readouterr().err
    assert reason in err and err.count("\n") == 1 and "fix:" in err
