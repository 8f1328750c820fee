"""The command modules (``sglang_dcp_dspark.cli``): each one's parser, its place in ``--help``, and its bad input.

One module per command, ``add_parser(sub)`` and ``run(args) -> int``. What a
command does is tested with the job it fronts (series, plugin, preflight);
here: that each module registers its own command and dispatches to its own
``run``, and that each refuses bad input with one ``error:`` line that says
the fix, exit 2, touching no file. Fresh trees only (tmp_path), so nothing an
sglang installation holds can change.
"""

from __future__ import annotations

import argparse
import json

import pytest

from sglang_dcp_dspark import __main__ as entry
from sglang_dcp_dspark import cli
from sglang_dcp_dspark.cli import apply, base, common, coverage, export, preflight, revert, status, workbench

# The order sglang-dcp-dspark --help lists them in: the users' commands, the maintainers', the diagnostics.
ORDER = ["status", "apply", "revert", "export", "coverage", "base", "workbench", "preflight"]
MODULES = {"status": status, "apply": apply, "revert": revert, "export": export, "coverage": coverage, "base": base,
           "workbench": workbench, "preflight": preflight}


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_each_module_registers_its_own_command_in_help_order():
    assert [m.__name__.rsplit(".", 1)[1] for m in cli.PARSERS] == ORDER
    subs = _subcommands(entry.build_parser())
    assert list(subs) == ORDER
    for name, parser in subs.items():
        # the parser a module adds dispatches to that module's run, not a neighbour's
        assert parser.get_default("func") is MODULES[name].run, name


def test_a_misplaced_command_would_be_caught():
    """Control: a table that lists one module twice fails the check above."""
    broken = (status, apply, apply, export, coverage, base, workbench, preflight)
    assert [m.__name__.rsplit(".", 1)[1] for m in broken] != ORDER


def _tree_bytes(root) -> dict:
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# One bad input per command, each with the words its error line must carry. Every one is refused before any
# sglang tree is read or written.
BAD = {
    "status": (["status", "--target", "{tmp}/no-such-tree"], "no-such-tree"),
    "apply": (["apply", "--target", "{tmp}/tree", "--series", "no-such-series"], "no-such-series"),
    "revert": (["revert", "--target", "{tmp}/tree", "--series", "sglang-0.5.17", "--series-dir", "{tmp}"],
               "--series and --series-dir"),
    "export": (["export", "--repo", "{tmp}/tree"], "--base"),
    "coverage": (["coverage", "--layout", "sideways"], "sideways"),
    "base": (["base", "--series", "upstream-pr-35221", "--out", "{tmp}/out"], "--from"),
    "workbench": (["workbench", "--series", "upstream-pr-35221", "--repo", "{tmp}/repo"], "--from"),
    "preflight": (["preflight", "--gpus", "eight"], "--gpus 'eight' is not an integer"),
}


@pytest.mark.parametrize("name", ORDER)
def test_bad_input_is_one_line_with_its_fix_and_no_file_changes(name, tmp_path, capsys):
    tree = tmp_path / "tree" / "sglang"
    tree.mkdir(parents=True)
    (tree / "__init__.py").write_text("# a tree that must not change\n")
    before = _tree_bytes(tmp_path)
    argv, words = BAD[name]
    code = entry.main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, (name, err)
    assert len(err) == 1 and err[0].startswith("error: ") and "fix:" in err[0] and words in err[0], err
    assert _tree_bytes(tmp_path) == before


def test_preflight_json_error_is_the_verdict_object(capsys):
    """--json: a refused option still prints one JSON object whose verdict is BAD INPUT (exit 2)."""
    assert entry.main(["preflight", "--json", "--gpu-memory-gib", "lots"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"]["code"] == 2 and out["verdict"]["outcome"] == "BAD INPUT"
    assert "--gpu-memory-gib 'lots' is not a number" in out["error"]


def test_series_arguments_name_one_series():
    """``--series`` and ``--series-dir`` together are refused; ``--series`` alone reads the package's series."""
    p = argparse.ArgumentParser()
    common.add_series_choice(p, "")
    assert common.chosen_series(p.parse_args(["--series", "sglang-0.5.17"]), None).name == "sglang-0.5.17"
    assert common.chosen_series(p.parse_args([]), None) is None
    with pytest.raises(Exception, match="name a series twice"):
        common.chosen_series(p.parse_args(["--series", "a", "--series-dir", "b"]), None)
