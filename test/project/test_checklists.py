"""docs/layout.md's checklists (add a release, add a hook, change a verdict): every file each names exists.

A checklist item starts with the file it touches, in backquotes; ``<release>`` and ``<carrier>`` stand for any
release or hook carrier, and must match at least one file now. Adding a release stays within 6 files, and the
releases the package covers (its pass tables) are the releases of the trees that measure the pass map, so the
checklist's first and fourth files cannot drift apart.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import tree_table
from sglang_dcp_dspark import passes

REPO = Path(__file__).resolve().parents[2]
LAYOUT = REPO / "docs" / "layout.md"
CHECKLISTS = ("Add a release", "Add a hook", "Change a verdict")
RELEASE_FILES_AT_MOST = 6
_ITEM = re.compile(r"^\d+\. `([^`]+)`", re.M)


def checklists(text: str) -> dict[str, list[str]]:
    """Each checklist's title -> the files its numbered items name, in order."""
    section = text.split("\n## Checklists\n", 1)[1]
    out = {}
    for part in section.split("\n### ")[1:]:
        title, _, body = part.partition("\n")
        out[title.strip()] = _ITEM.findall(body)
    return out


def exists(named: str) -> bool:
    pattern = re.sub(r"<[a-z]+>", "*", named)
    return any(REPO.glob(pattern)) if "*" in pattern else (REPO / pattern).exists()


def test_the_three_checklists_are_there():
    found = checklists(LAYOUT.read_text(encoding="utf-8"))
    assert list(found) == list(CHECKLISTS), (
        f"docs/layout.md's checklists are {list(found)}; expected {list(CHECKLISTS)}; fix: one '### ' section each")
    for title, files in found.items():
        assert files, f"the checklist {title!r} names no file; fix: one numbered item per file, the file first"


@pytest.mark.parametrize("title", CHECKLISTS)
def test_every_file_a_checklist_names_exists(title):
    files = checklists(LAYOUT.read_text(encoding="utf-8"))[title]
    missing = [f for f in files if not exists(f)]
    assert not missing, (f"docs/layout.md's checklist {title!r} names files that do not exist: {missing}; fix: name "
                         "the file the change really touches")


def test_adding_a_release_touches_at_most_six_files():
    files = checklists(LAYOUT.read_text(encoding="utf-8"))["Add a release"]
    assert len(files) <= RELEASE_FILES_AT_MOST, files
    assert len(set(files)) == len(files), files


def test_the_package_covers_the_releases_whose_pass_map_is_measured():
    # Items 1 and 4: a tree that runs test/spec measures its release's map, and the package ships a table for it.
    measured = {t.sglang for label, t in tree_table.TREES.items() if label == "stock" or "test/spec" in t.test_dirs}
    assert set(passes.releases()) == measured


def test_a_missing_file_is_caught(tmp_path):
    # Control: a checklist naming a file that is not there, and one with a placeholder nothing matches.
    text = "# x\n\n## Checklists\n\n### Add a release\n\n1. `patches/trees.json`: the tree.\n2. `docs/nowhere.md`: x.\n"
    files = checklists(text)["Add a release"]
    assert files == ["patches/trees.json", "docs/nowhere.md"]
    assert [f for f in files if not exists(f)] == ["docs/nowhere.md"]
    assert exists("python/sglang_dcp_dspark/passes/data/<release>.json.gz")
    assert not exists("python/sglang_dcp_dspark/passes/data/<release>.json.zst")
