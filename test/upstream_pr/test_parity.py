"""The series is what upstream shipped: index lines and files match stock 0.5.18 byte for byte."""

from __future__ import annotations

import hashlib
import re
import subprocess

import pytest

from .conftest import STOCK_0_5_18, TREE, expect_fixed

_INDEX_RE = re.compile(r"^diff --git a/(\S+) b/\S+\n(?:.*\n)*?index ([0-9a-f]{40})\.\.([0-9a-f]{40})", re.M)


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def source_hunks(series):
    """(patch, file, pre-image blob id, post-image blob id) for every python/sglang file."""
    for patch in series.patches:
        for name, before, after in _INDEX_RE.findall(patch.path.read_text(encoding="utf-8")):
            if name.startswith("python/sglang/"):
                yield patch, name, before, after


def test_every_source_file_is_touched_once(series):
    names = [name for _, name, _, _ in source_hunks(series)]
    assert sorted(names) == sorted(set(names)) and len(names) == 3, names


def test_index_lines_name_this_trees_blobs(series, tree):
    """Pre-image blobs are the parent's files, post-image blobs are 0.5.18's."""
    for patch, name, before, after in source_hunks(series):
        want = after if expect_fixed() else before
        got = git_blob_id(tree.path_of(name).read_bytes())
        assert got == want, f"{patch.name}: {name} on {TREE} is blob {got}, the patch says {want}"


@pytest.mark.skipif(TREE != "upstream-0.5.18", reason="reverse-applies on the stock release only")
def test_source_hunks_reverse_apply_on_stock_0_5_18(series, tree):
    """Plain git apply -R --check of the whole series on the untouched 0.5.18 tree."""
    result = subprocess.run(
        ["git", "apply", "-R", "--check", "-p2", "--include=sglang/*", *[str(p.path) for p in reversed(series.patches)]],
        cwd=tree.root,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def package_digest(root):
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((root / "sglang").rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_tree_differs_from_stock_0_5_18_only_in_the_series_files(series, tree):
    """The base is 0.5.18 with the series reversed and nothing else; re-patched, it is 0.5.18."""
    stock = package_digest(STOCK_0_5_18)
    here = package_digest(tree.root)
    assert stock.keys() == here.keys()
    differing = sorted(k for k in stock if stock[k] != here[k])
    touched = sorted(name.removeprefix("python/") for _, name, _, _ in source_hunks(series))
    assert differing == ([] if expect_fixed() else touched)
