"""tools/suite.py: the table of a suite's runs from their JUnit files and records, the report's verdict, and the
harness records that name a harness run twice on the same sglang files (emulation.imports)."""

from __future__ import annotations

import json

import pytest

import suite
from emulation import imports


def _junit(path, cases, time="12.5") -> None:
    body = "".join(f'<testcase classname="test.m" name="{name}" time="{t}">{inner}</testcase>'
                   for name, t, inner in cases)
    path.write_text(f'<testsuites><testsuite name="pytest" time="{time}">{body}</testsuite></testsuites>',
                    encoding="utf-8")


@pytest.fixture
def runs(tmp_path):
    _junit(tmp_path / "a.xml", [("test_slow", "9.0", ""), ("test_skip", "0.1", '<skipped type="pytest.skip"/>'),
                                ("test_defect", "2.0", '<skipped type="pytest.xfail"/>')])
    (tmp_path / "a.json").write_text(json.dumps({"label": "a", "exit": 0, "wall_s": 30.4}), encoding="utf-8")
    _junit(tmp_path / "b.xml", [("test_broken", "4.0", '<failure message="boom"/>')], time="7")
    return tmp_path


def test_the_table_has_each_runs_wall_time_and_counts_the_slowest_tests_and_a_closing_line(runs):
    results = [suite.Result.read("a", runs), suite.Result.read("b", runs), suite.Result.read("c", runs)]
    text = suite.table(results, slowest=2)
    lines = text.splitlines()
    assert lines[1].split() == ["a", "30", "3", "1", "0", "1", "1"]  # the record's wall time, not pytest's
    assert lines[2].split() == ["b", "7", "1", "0", "1", "0", "0"]  # no record: pytest's own time, failed
    assert lines[3].split() == ["c", "-", "not", "run"]
    assert "9.0  a / test.m::test_slow" in text and "4.0  b / test.m::test_broken" in text
    assert "test_defect" not in text  # only the 2 slowest
    assert lines[-1] == "suite: 2 passed, 1 failed, 1 skipped"  # the xfail counts as passed, as it asserts
    assert [r.passed for r in results] == [True, False, False]


def test_a_run_that_did_not_finish_says_how_to_run_it(runs):
    line = suite.Result.read("c", runs).line()
    assert "DID NOT RUN" in line and line.endswith("fix: make test-c")


def test_a_bad_command_is_one_line_and_exit_2(capsys):
    assert suite.main(["run", "no-such-run"]) == 2
    assert suite.main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and all(line.startswith("error: ") for line in err.splitlines())


def test_a_harness_run_twice_on_the_same_files_is_named():
    one = {"command": ["decode_dcp.py", "--dcp", "2"], "files": 812, "digest": "d1"}
    records = {"stock": [one], "plugin": [dict(one)], "next-stock": [dict(one, digest="d2")]}
    assert imports.repeated(records) == ["decode_dcp.py --dcp 2 ran on stock and on plugin with the same 812 sglang files"]
    # other files, or another command, is another measurement
    assert imports.repeated({"stock": [one], "next-stock": [dict(one, digest="d2")]}) == []
    assert imports.repeated({"stock": [one], "plugin": [dict(one, command=["decode_dcp.py", "--dcp", "8"])]}) == []
