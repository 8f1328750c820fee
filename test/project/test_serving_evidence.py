"""tools/serving_evidence.py (pending a GPU node): its plan, its reading of sglang's outputs, and its report.

Nothing here runs a server. The plan is checked flag by flag; the readers are
checked against the lines sglang 0.5.23's own tools print (read from the
tree, so a release that renames them fails here); the report is checked on
results written here, with each way a DCP 8 run can fail against its twin.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import serving_evidence as ev
import tree_table

STOCK = tree_table.TREES["next-stock"].path
SCRIPT = ["tools/serving_evidence.py"]


def _args(*argv):
    return ev.parse(["--model-path", "deepseek-ai/DeepSeek-V3", *argv])


def test_the_plan_pairs_every_dcp8_run_with_its_dcp1_twin():
    runs = ev.plan(_args("--nextn", "--dspark-draft", "D", "--eagle3-draft", "E", "--hicache"))
    assert [r.name for r in runs][:4] == ["dspark-dcp1-graph", "dspark-dcp8-graph", "dspark-dcp1-eager",
                                          "dspark-dcp8-eager"]
    assert len(runs) == 12 and {r.draft for r in runs} == {"DSPARK", "EAGLE3", "NEXTN"}
    for run in runs:
        launch = " ".join(run.launch)
        assert f"--tp 8 --dcp-size {run.dcp} --attention-backend flashinfer" in launch
        assert ("--disable-cuda-graph" in run.launch) == (run.graph == "eager")
        assert "--enable-hierarchical-cache" in run.launch
        assert f"--speculative-algorithm {run.draft}" in launch
    nextn = next(r for r in runs if r.draft == "NEXTN")
    assert "--speculative-draft-model-path" not in nextn.launch  # the model's own MTP layer
    assert "--enable-hierarchical-cache" not in ev.plan(_args("--nextn"))[0].launch


def test_the_commands_are_sglangs_own_tools(tmp_path):
    run = ev.plan(_args("--nextn"))[1]
    cmds = ev.commands(run, _args("--nextn", "--gsm8k-data", "g.jsonl"), 31000, tmp_path)
    assert cmds["server"][1:3] == ["-m", "sglang.launch_server"] and cmds["server"][-2:] == ["--port", "31000"]
    assert cmds["gsm8k"][1:3] == ["-m", "sglang.test.few_shot_gsm8k"] and "--data-path" in cmds["gsm8k"]
    assert cmds["tpot"][1:3] == ["-m", "sglang.benchmark.serving"]
    assert cmds["tpot"][-1] == str(tmp_path / "nextn-dcp8-graph.jsonl")


@pytest.mark.trees
def test_the_readers_read_what_sglang_0_5_23_prints():
    """The lines the readers parse are the ones sglang 0.5.23's tools write (read from the tree)."""
    gsm8k = (STOCK / "sglang" / "test" / "few_shot_gsm8k.py").read_text(encoding="utf-8")
    assert 'print(f"Accuracy: {acc:.3f}")' in gsm8k
    serving = (STOCK / "sglang" / "benchmark" / "serving.py").read_text(encoding="utf-8")
    assert '"median_tpot_ms": metrics.median_tpot_ms' in serving and '"accept_length": accept_length' in serving


def test_the_readers_parse_those_lines_and_refuse_others(tmp_path):
    assert ev.read_accuracy("Accuracy: 0.951\nInvalid: 0.000\n") == 0.951
    record = tmp_path / "r.jsonl"
    record.write_text(json.dumps({"median_tpot_ms": 21.5, "accept_length": 3.1}) + "\n", encoding="utf-8")
    assert ev.read_tpot(record) == (21.5, 3.1)
    with pytest.raises(ev.EvidenceError, match="no 'Accuracy:' line"):
        ev.read_accuracy("Traceback ...")
    with pytest.raises(ev.EvidenceError, match="no record of sglang.benchmark.serving"):
        ev.read_tpot(tmp_path / "missing.jsonl")


GOOD = {"nextn-dcp1-graph": {"accuracy": 0.95, "median_tpot_ms": 20.0, "accept_length": 3.0},
        "nextn-dcp8-graph": {"accuracy": 0.94, "median_tpot_ms": 24.0, "accept_length": 2.95}}


@pytest.mark.parametrize("change,code,said", [
    ({}, 0, "nextn-dcp8-graph: holds: GSM8K 0.940 (dcp 1 0.950), accept length 2.95 (3.00), TPOT x1.20"),
    ({"accuracy": 0.90}, 1, "nextn-dcp8-graph: FAILS: GSM8K 0.900 (dcp 1 0.950)"),
    ({"accept_length": 2.0}, 1, "nextn-dcp8-graph: FAILS: GSM8K 0.940 (dcp 1 0.950), accept length 2.00 (3.00)"),
    ({"error": "the server exited with 1 before /health answered"}, 1, "not compared (the server exited"),
])
def test_the_report_judges_each_dcp8_run_against_its_twin(change, code, said, tmp_path):
    results = json.loads(json.dumps(GOOD))
    results["nextn-dcp8-graph"].update(change)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results), encoding="utf-8")
    done = subprocess.run([sys.executable, *SCRIPT, "--report", str(path)], capture_output=True, text=True)
    assert done.returncode == code, done.stdout + done.stderr
    assert said in done.stdout
    assert all(len(line) <= 100 for line in done.stdout.splitlines())


@pytest.mark.parametrize("argv,said", [
    (["--plan", "--model-path", "m"], "error: no draft to run; expected --dspark-draft DIR"),
    (["--plan", "--nextn"], "error: no --model-path; expected the target model"),
    (["--report", "missing.json"], "expected a readable results.json; fix: pass the file --out wrote"),
])
def test_bad_input_is_one_line_and_exit_2(argv, said, tmp_path):
    done = subprocess.run([sys.executable, *SCRIPT, *argv], capture_output=True, text=True, cwd=None)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and said in done.stderr, done.stderr


def test_the_plan_reads_at_100_columns():
    done = subprocess.run([sys.executable, *SCRIPT, "--plan", "--model-path", "deepseek-ai/DeepSeek-V3", "--nextn"],
                          capture_output=True, text=True)
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[0].startswith("nextn-dcp1-graph: python -m sglang.launch_server")
    assert all(len(line) <= 100 for line in lines)
