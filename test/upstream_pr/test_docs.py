"""docs/upstreaming.md's coverage blocks, on the tree each was made on: fresh, and legacy gives the same figures."""

from __future__ import annotations

import docblocks
import tree_table
from sglang_dcp_dspark.__main__ import main

from .conftest import TREE

# label -> the docs block its coverage must equal. Stock 0.5.18 is byte-identical
# to the re-patched parent in the series' files, so it must give that block too.
BLOCKS = {
    "upstream-base": "coverage-pr-base",
    "upstream-base-patched": "coverage-pr-patched",
    "upstream-0.5.18": "coverage-pr-patched",
}


def coverage_table(capsys, draft_path: str) -> str:
    """`sglang-dcp-dspark coverage --draft-path X | tail -n +2`, in this process (which imports the tree already)."""
    assert main(["coverage", "--draft-path", draft_path]) == 0
    return "".join(capsys.readouterr().out.splitlines(keepends=True)[1:])


def test_each_block_is_checked_on_the_tree_its_command_names():
    for name in set(BLOCKS.values()):
        command = docblocks.block(name).command
        (label,) = [label for label in BLOCKS if f"PYTHONPATH={tree_table.TREES[label].make_path} " in command]
        assert BLOCKS[label] == name, (name, command)


def test_coverage_block_is_fresh_and_legacy_matches_it(capsys):
    block = docblocks.block(BLOCKS[TREE])
    sidecar = coverage_table(capsys, "sidecar")
    docblocks.check(block.name, sidecar)
    # The docs say "the same figures with --draft-path legacy".
    assert coverage_table(capsys, "legacy") == sidecar
