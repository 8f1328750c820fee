"""upstream-pr-35221 as files: git am-able onto its rebuilt base, re-exported byte for byte, base and apply verbs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from trees import assert_reexports

from sglang_dcp_dspark import series as series_mod
from sglang_dcp_dspark.compat import locate_tree
from sglang_dcp_dspark.errors import DcpDsparkError

SERIES = "upstream-pr-35221"
TREES = Path(__file__).resolve().parents[1] / "build" / "trees"
STOCK = TREES / "sglang-0.5.18"
BASE = TREES / f"{SERIES}-base"


def need(tree_dir: Path):
    if not (tree_dir / "sglang" / "__init__.py").is_file():
        pytest.fail(f"{tree_dir} is missing; expected the trees of make upstream-trees; fix: make upstream-trees")
    return locate_tree(tree_dir)


@pytest.fixture(scope="module")
def series():
    return series_mod.load_series(SERIES)


def test_series_git_ams_onto_its_base_and_reexports_byte_for_byte(series, tmp_path):
    """CI's freshness check: the committed files are exactly what export makes of them."""
    assert_reexports(series, need(BASE), tmp_path)


def test_workbench_refuses_a_tree_the_series_does_not_am_onto(series, tmp_path):
    with pytest.raises(DcpDsparkError, match="does not git-am onto") as err:
        series_mod.workbench(need(STOCK), series, tmp_path / "repo")
    assert "\n" not in str(err.value) and "fix: sglang-dcp-dspark base" in str(err.value)


def test_base_is_the_release_with_exactly_the_series_reversed(series, tmp_path):
    stock = need(STOCK)
    series_mod.reconstruct_base(stock, series, tmp_path / "base")
    base = locate_tree(tmp_path / "base")
    assert series_mod.inspect(base, series).state is series_mod.State.APPLICABLE
    sources = [f for f in series.files if f.startswith("python/sglang/")]
    assert len(sources) == 3
    for name in sources:
        assert base.path_of(name).read_bytes() != stock.path_of(name).read_bytes(), name
        assert base.path_of(name).read_bytes() == need(BASE).path_of(name).read_bytes(), name


def test_base_refuses_a_tree_without_the_fix(series, tmp_path):
    with pytest.raises(DcpDsparkError, match="does not reverse-apply") as err:
        series_mod.reconstruct_base(need(BASE), series, tmp_path / "base")
    assert "\n" not in str(err.value) and "fix: pip install --no-deps --target DIR 'sglang==0.5.18'" in str(err.value)
    assert not (tmp_path / "base").exists()


def test_base_refuses_a_non_empty_out(series, tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "keep").write_text("x")
    with pytest.raises(DcpDsparkError, match="is not empty"):
        series_mod.reconstruct_base(need(STOCK), series, tmp_path / "base")
    assert (tmp_path / "base" / "keep").read_text() == "x"


def test_apply_on_the_base_gives_the_release_and_revert_takes_it_back(series, tmp_path):
    """A full apply of a series in upstream's form reads as "fixed upstream", and that is success.

    The tree then reads exactly like the release, so only the record apply
    leaves at the tree root tells revert that the fix is ours to take back.
    """
    root = tmp_path / "site-packages"
    shutil.copytree(need(BASE).package, root / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    tree = locate_tree(root)
    base_bytes = {name: tree.path_of(name).read_bytes() for name in series.tree_files(tree)}
    assert "applied 4 patch(es)" in series_mod.apply(tree, series)
    status = series_mod.inspect(tree, series)
    assert status.state is series_mod.State.FIXED_UPSTREAM and status.applied == len(series.patches)
    assert status.recorded and "revert undoes it" in status.line()
    for name in series.files:
        if name.startswith("python/sglang/"):
            assert tree.path_of(name).read_bytes() == need(STOCK).path_of(name).read_bytes(), name
    assert "reverted 4 patch(es)" in series_mod.revert(tree, series)
    assert {name: tree.path_of(name).read_bytes() for name in base_bytes} == base_bytes
    assert not (root / series_mod.RECORD).exists()


def test_stock_release_reads_fixed_upstream_and_apply_leaves_it(series):
    stock = need(STOCK)
    status = series_mod.inspect(stock, series)
    assert status.state is series_mod.State.FIXED_UPSTREAM and not status.recorded
    assert "already carries the fix" in series_mod.apply(stock, series)
    assert "nothing of ours to revert" in series_mod.revert(stock, series)


def test_export_removes_only_the_patches_its_listing_named(tmp_path):
    """--out may hold other .patch files: only those the old series listing names are replaced."""
    repo = tmp_path / "repo"
    run = lambda *a: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=repo, check=True, capture_output=True)  # noqa: E731
    repo.mkdir()
    run("init", "-q")
    (repo / "f").write_text("a\n")
    run("add", "f")
    run("commit", "-qm", "base")
    (repo / "f").write_text("b\n")
    run("commit", "-qam", "change f")
    out = tmp_path / "out"
    out.mkdir()
    (out / "series").write_text("0001-old.patch\n")
    (out / "0001-old.patch").write_text("stale")
    (out / "mine.patch").write_text("not the series'")
    written = series_mod.export(repo, "HEAD~1", "sglang-0.5.17", out_dir=out)
    assert sorted(p.name for p in out.iterdir()) == sorted(["mine.patch", "series", *(p.name for p in written[:-1])])
    assert (out / "mine.patch").read_text() == "not the series'"


def test_export_takes_a_series_name_not_a_path(tmp_path):
    decoy = tmp_path / "elsewhere"
    decoy.mkdir()
    (decoy / "keep.patch").write_text("x")
    with pytest.raises(DcpDsparkError, match="is not a series name"):
        series_mod.export(tmp_path, "HEAD", f"../../{decoy}")
    assert (decoy / "keep.patch").read_text() == "x"


def test_backport_series_reexports_byte_for_byte(installed_tree, tmp_path):
    """The same freshness check for patches/sglang-0.5.17, on a workbench built from the installed 0.5.17."""
    assert_reexports(series_mod.load_series("sglang-0.5.17"), installed_tree, tmp_path)
