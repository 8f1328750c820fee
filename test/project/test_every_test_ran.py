"""test/every_test_ran.py, on JUnit files written here: it names a test no tree passes, and only such a test."""

from __future__ import annotations

import every_test_ran


def _junit(path, cases) -> None:
    body = "".join(
        f'<testcase classname="test.m" name="{name}">{inner}</testcase>' for name, inner in cases
    )
    path.write_text(f'<testsuites><testsuite name="pytest">{body}</testsuite></testsuites>', encoding="utf-8")


SKIP = '<skipped type="pytest.skip" message="not on this tree"/>'
XFAIL = '<skipped type="pytest.xfail" message="the defect"/>'
FAIL = '<failure message="boom"/>'


def test_a_test_skipped_or_failing_on_every_tree_is_named(tmp_path, capsys):
    _junit(tmp_path / "a.xml", [("test_ok", ""), ("test_skipped", SKIP), ("test_broken", FAIL), ("test_defect", XFAIL)])
    _junit(tmp_path / "b.xml", [("test_ok", SKIP), ("test_skipped", SKIP), ("test_broken", SKIP), ("test_defect", "")])
    assert every_test_ran.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "never passed on any tree: test.m::test_skipped (a: skipped, b: skipped)" in out
    assert "test.m::test_broken" in out and "test_ok" not in out.split("\n")[0] and "test_defect (" not in out
    assert "2 of 4 tests passed" in out


def test_an_empty_parametrization_is_judged_by_the_cases_of_its_function(tmp_path, capsys):
    _junit(tmp_path / "a.xml", [("test_p[none]", SKIP), ("test_q[none]", SKIP)])
    _junit(tmp_path / "b.xml", [("test_p[dcp2]", ""), ("test_q[dcp2]", SKIP)])
    assert every_test_ran.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "test.m::test_p[none]" not in out and "test.m::test_q[none]" in out


def test_no_results_is_one_line_and_exit_2(tmp_path, capsys):
    assert every_test_ran.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
