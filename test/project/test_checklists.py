"""docs/layout.md's checklists (add a release, add a hook, change a verdict): every file each names exists.

A checklist item starts with the file it touches, in backquotes; ``<release>`` and ``<carrier>`` stand for any
release or hook carrier, and must match at least one file now. Adding a release stays within 6 files, and the
releases the package covers (its pass tables) are the releases of the trees that measure the pass map, so the
checklist's first and fourth files cannot drift apart.
"""

from __future__ import annotations

import re
import subprocess
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


# -- The newest release is named only where the checklist says ------------------------------------------------------
# Adding a release edits the checklist's files and no other: so no other file may say which release is the newest.
# A file says it by a range that ends there ("0.5.17 to N", "0.5.19-N", "up to N"), by calling N the newest, latest
# or today's, or by comparing with the last of a list of releases. Prose says "the newest release the package
# covers", or reads the release table; a fact of one release ("N builds its host pools in the hybrid assembler")
# names that release and stays true when another is added.


def _version(release: str) -> tuple[int, ...]:
    return tuple(map(int, release.split(".")))


NEWEST = max(passes.releases(), key=_version)


def newest_claims(text: str, newest: str) -> list[str]:
    """Each line of ``text`` that names ``newest`` as the newest release, as 'line N: text'."""
    n = re.escape(newest)
    claims = (
        rf"\b\d+\.\d+\.\d+\s*(?:to|through|-|–|—|\.\.)\s*(?:sglang\s+)?{n}(?![\d.]*\d)",
        rf"\b(?:up to|until|till)\s+(?:sglang\s+)?{n}(?![\d.]*\d)",
        rf"\b(?:newest|latest|today)\b.*\b{n}(?![\d.]*\d)",
        rf"\b{n}(?![\d.]*\d).*\b(?:newest|latest|today)\b",
        rf"\[-1\]\s*==\s*['\"]{n}['\"]",
    )
    pattern = re.compile("|".join(f"(?:{c})" for c in claims), re.I)
    return [f"line {i}: {line.strip()}" for i, line in enumerate(text.splitlines(), 1) if pattern.search(line)]


def checklist_files() -> set[str]:
    """The files the release checklist names, with ``<release>`` read as every release (repository paths)."""
    named = checklists(LAYOUT.read_text(encoding="utf-8"))["Add a release"]
    out = set()
    for item in named:
        pattern = re.sub(r"<[a-z]+>", "*", item)
        out |= {str(p.relative_to(REPO)) for p in REPO.glob(pattern)} if "*" in pattern else {item}
    return out


def tracked_text_files() -> dict[str, str]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\n")
    out = {}
    for name in filter(None, listed):
        path = REPO / name
        if path.is_file():
            try:
                out[name] = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:  # a compressed table: no prose
                continue
    return out


def test_no_file_outside_the_release_checklist_names_the_newest_release():
    allowed = checklist_files()
    found = {name: claims for name, text in sorted(tracked_text_files().items()) if name not in allowed
             and (claims := newest_claims(text, NEWEST))}
    listing = "; ".join(f"{name} {c}" for name, claims in found.items() for c in claims)
    assert not found, (f"{len(found)} files outside docs/layout.md's release checklist name {NEWEST} as the newest "
                       f"release: {listing}; expected only the checklist's files to; fix: say 'the newest release "
                       "the package covers' (or read the release table), or name the file in the checklist")


def test_the_newest_release_planted_outside_the_checklist_is_caught():
    # Control: the scan sees each way of saying it, in a file the checklist does not name, and only there.
    for planted in (f"every release from 0.5.17 to {NEWEST} works", f"sglang 0.5.19-{NEWEST}: the sidecar",
                    f"{NEWEST} is what pip gives today", f'assert releases[-1] == "{NEWEST}"',
                    f"supported up to sglang {NEWEST}."):
        assert newest_claims(f"# docs\n\n{planted}\n", NEWEST) == [f"line 3: {planted}"], planted
    # A fact of one release, or a longer version number, is not a claim about the newest.
    for fact in (f"{NEWEST} builds its host pools in the hybrid assembler", f"0.5.17 to {NEWEST}1",
                 f"build/trees/sglang-{NEWEST}-next", f"0.5.22 and {NEWEST}"):
        assert newest_claims(fact, NEWEST) == [], fact
    assert "docs/operator-guide.md" not in checklist_files() and "patches/trees.json" in checklist_files()
