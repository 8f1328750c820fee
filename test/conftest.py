"""Fixtures shared by every test: the installed sglang tree, copies of it, the tiny MLA model."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

import pytest

import tree_table
from sglang_dcp_dspark.core.compat import SglangTree, locate_tree

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[1]

# make test's runs set it (tools/tree_table.py): "only" in the tree-free run, "skip" in every other run, so that a
# test that imports no sglang runs once. Unset (pytest by hand), every test asked for runs.
TREE_FREE = os.environ.get(tree_table.TREE_FREE_ENV)
if TREE_FREE == "skip":
    collect_ignore = [str(REPO / path) for path in tree_table.TREE_FREE_TESTS]


def pytest_sessionfinish(session, exitstatus):
    """The tree-free run fails if anything it ran imported sglang: a test that does belongs to a tree's run."""
    if TREE_FREE != "only":
        return
    imported = sorted(name for name in sys.modules if name == "sglang" or name.startswith("sglang."))
    if imported:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        print(f"\nerror: the tree-free run imported sglang ({len(imported)} modules, first {imported[0]}); expected "
              f"none: its tests are patches/trees.json's tree_free; fix: move the test that imports it out of that "
              f"list, into a tree's run", file=sys.stderr)


@pytest.fixture(autouse=True)
def _environment_as_found():
    """Each test sees the process environment the run started with: sglang's argument resolution writes variables for
    the servers it would start (0.5.23 sets SGLANG_USE_CUDA_IPC_TRANSPORT), and one test's resolution would otherwise
    reach the next as the operator's own setting."""
    before = dict(os.environ)
    yield
    if dict(os.environ) != before:
        os.environ.clear()
        os.environ.update(before)


@pytest.fixture(scope="session")
def tiny_mla_model() -> Path:
    """A DeepseekV2 (MLA) config.json with no weights: enough for argument resolution."""
    return DATA / "tiny-mla"


@pytest.fixture(scope="session")
def installed_tree() -> SglangTree:
    return locate_tree(None)


@pytest.fixture
def tree_copy(installed_tree: SglangTree, tmp_path: Path) -> SglangTree:
    """A full copy of the installed sglang package, laid out as an installed tree."""
    root = tmp_path / "site-packages"
    shutil.copytree(installed_tree.package, root / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    return locate_tree(root)


@pytest.fixture
def halved_draft_host_pool(monkeypatch):
    """Deliberately wrong sizing: every draft host pool gets half the rows it asks for."""
    from sglang.srt.mem_cache.pool_host import mla

    class HalfDraft(mla.MLATokenToKVPoolHost):
        def __init__(self, device_pool, host_to_device_ratio, *args, **kwargs):
            if kwargs.get("pool_label") == "draft":
                host_to_device_ratio /= 2
            super().__init__(device_pool, host_to_device_ratio, *args, **kwargs)

    # The registration imports the class when it runs, so it builds this one.
    monkeypatch.setattr(mla, "MLATokenToKVPoolHost", HalfDraft)


def tree_digest(tree: SglangTree) -> dict[str, str]:
    """sha256 of every file in the tree's package, keyed by relative path."""
    return {
        str(p.relative_to(tree.package)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(tree.package.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }
