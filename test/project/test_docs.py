"""Generated blocks in README.md and docs/: each is what its command prints now, and none goes unchecked.

tools/docblocks.py finds the blocks. The one slow command here (bench/host_memory.py,
mostly an sglang import) starts when this module is collected and runs while
the rest of the session does; the coverage blocks are checked in-process by
the runs on their own trees (test/upstream_pr/test_docs.py).
"""

from __future__ import annotations

import re

import pytest

import docblocks
import tree_table
from report_text import below_verdict, verdict_line

# block name -> the test file that checks it is fresh
FRESHNESS = {
    "host-memory": "test/project/test_docs.py",
    "coverage-pr-base": "test/upstream_pr/test_docs.py",
    "coverage-pr-patched": "test/upstream_pr/test_docs.py",
    "pr-trees": "test/project/test_docs.py",
    "next-trees": "test/project/test_docs.py",
    "series-parts": "test/project/test_docs.py",
    "matrix": "test/datapath/test_docs.py",
    "preflight": "test/preflight/test_check.py",
    "demo-verdict": "test/preflight/test_check.py",
    "exit-codes": "test/project/test_docs.py",
    "sweep-dcp": "test/preflight/test_check.py",
    "releases": "test/releases/test_docs.py",
    "draft-layouts": "test/datapath/test_layouts.py",
    "auto-size": "test/project/test_docs.py",
    "hook-index": "test/project/test_docs.py",
    "verify-numbers-plugin": "test/numerics/test_verify_dcp.py",
    "nextn-numbers-plugin": "test/numerics/test_nextn_dcp.py",
    "nextn-numbers-series": "test/numerics/test_nextn_dcp.py",
    "verify-numbers-series": "test/numerics/test_verify_dcp.py",
    "verify-pr-numbers": "test/numerics/test_verify_dcp.py",
    "recipes": "test/releases/test_docs.py",
    "blackwell-numbers-next": "test/numerics/test_decode_dcp.py",
    "blackwell-numbers-base": "test/numerics/test_decode_dcp.py",
}
# Commands that import sglang: started at collection, checked at the end. A command on a tree under build/trees
# (PYTHONPATH=build/trees/...) reads a tree make test builds: marked trees, left out of make check, and not started
# where the tree is not built (it would run on the venv's sglang and print another release's figures).
SLOW = ("host-memory", "auto-size")
ON_A_TREE = {name for name in SLOW if "build/trees/" in docblocks.block(name).command}
docblocks.start(docblocks.block(name).command for name in SLOW
                if name not in ON_A_TREE or (docblocks.REPO / "build" / "trees").is_dir())
# "N passed", "N xfailed"...: a count that is stale the day a test is added.
TEST_COUNT = re.compile(r"\b\d+ (passed|failed|xfailed|xpassed|skipped|errors?|deselected)\b")


def test_every_generated_block_has_a_freshness_test():
    found = docblocks.blocks()
    assert found, "no generated blocks found in the docs"
    for block in found:
        checker = FRESHNESS.get(block.name)
        assert checker, f"{block.doc.name}: block {block.name} has no freshness test; add it to FRESHNESS here"
        assert block.name in (docblocks.REPO / checker).read_text(encoding="utf-8"), (block.name, checker)
    assert sorted(b.name for b in found) == sorted(set(b.name for b in found)), "block names must be unique"


@pytest.mark.parametrize("name,series", [("pr-trees", "upstream-pr-35221"), ("next-trees", "upstream-next")])
def test_tree_tables_are_fresh(name, series):
    """The docs' tree tables are patches/trees.json's (the states themselves: test/project/test_tree_table.py)."""
    docblocks.check(name, tree_table.markdown(series))


def test_the_series_parts_are_the_pr_map():
    """docs/series.md's list of upstream-next's PRs is its PR map (prs.json), over the patches it has."""
    import pr_map

    docblocks.check("series-parts", pr_map.markdown("upstream-next"))


def test_the_hook_index_is_the_tables():
    """docs/patches.md's hook index is what the carriers declare now (tools/hook_index.py)."""
    import hook_index
    from sglang_dcp_dspark.plugin import hooks

    docblocks.check("hook-index", hook_index.markdown(hooks.HOOKS))
    # It can fail: an entry whose reason changes makes the committed block stale.
    changed = list(hooks.HOOKS)
    first = changed[0]
    changed[0] = hooks.Hook(module=first.module, target=first.target, judge=first.judge, hook=first.hook, does=first.does,
                            why=first.why + " (changed)", upstream=first.upstream, drop_when=first.drop_when,
                            series_patch=first.series_patch)
    with pytest.raises(AssertionError, match="hook-index block is stale"):
        docblocks.check("hook-index", hook_index.markdown(changed))


@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.trees] if name in ON_A_TREE else [])
                                  for name in SLOW])
def test_command_output_blocks_are_fresh(name):
    docblocks.check(name)


def test_the_exit_codes_are_written_once():
    """The README's table is the one table of core/exits.py; the help and the docs point to it."""
    from sglang_dcp_dspark.__main__ import build_parser
    from sglang_dcp_dspark.core import exits

    docblocks.check("exit-codes", exits.markdown())
    assert exits.help_text() in build_parser().format_help()
    guide = (docblocks.REPO / "docs" / "operator-guide.md").read_text(encoding="utf-8")
    assert not re.search(r"^ *\| 5 \|", guide, re.M), "docs/operator-guide.md restates the exit codes"


def test_no_test_counts_in_the_docs():
    for doc in docblocks.DOCS:
        text = doc.read_text(encoding="utf-8")
        counts = [m.group(0) for m in TEST_COUNT.finditer(text)]
        assert counts == [], f"{doc.name} quotes test counts {counts}; say what the tests check instead"


def test_the_readmes_preflight_command_runs_and_reads_as_it_says():
    """The README's first command, on the models the package ships (MODEL and DRAFT are the operator's): it reaches
    a verdict, and its last line reads as the README's "Read the verdict" says, with an exit code from its table."""
    readme = (docblocks.REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Run preflight on your launch", 1)[1].split("\n## ", 1)[0]
    command = re.search(r"```sh\n(.*?)```", section, re.S).group(1).strip()
    assert command.startswith("sglang-dcp-dspark preflight ") and " MODEL " in command and " DRAFT" in command
    data = "python/sglang_dcp_dspark/preflight/data"
    command = command.replace(" MODEL ", f" {data}/deepseek-v3 ").replace(" DRAFT", f" {data}/kimi-k3-dspark-draft")
    table = readme.split("## Read the verdict", 1)[1].split("\n## ", 1)[0]
    codes = {int(m) for m in re.findall(r"^\| (\d) \|", table, re.M)}
    assert codes == {0, 1, 2, 3, 4, 5, 6}
    out = docblocks.run(command)  # asserts the exit code is a verdict
    line = verdict_line(out)
    assert re.match(r"verdict: [A-Z ,]+ \(exit [01356]\): ", line) and len(line) <= 100, line
    block = below_verdict(out)
    # "a block beneath it": the change where there is one, then the host memory
    assert block and re.match(r"  (change|host) ", block[0]), block
    assert max(len(row) for row in out.splitlines()) <= 100
