"""Every series of patches/trees.json as files: DEP-3 headers, re-exported byte for byte; the maintainers' verbs.

The re-export is Electron's check-patches: a series is git am'ed onto the tree
the table names for it, exported again, and must come out byte-identical to
what is committed. base, workbench and export are checked on upstream-pr-35221.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

import tree_table
from sglang_dcp_dspark import series as series_mod
from sglang_dcp_dspark.core.compat import locate_tree
from sglang_dcp_dspark.core.errors import DcpDsparkError
from sglang_dcp_dspark.series import maintain, patching
from trees import assert_reexports

SERIES = "upstream-pr-35221"
STOCK = tree_table.TREES["upstream-0.5.18"].path
BASE = tree_table.TREES["upstream-base"].path
DEP3_ALWAYS = ("Description", "Last-Update")


def need(tree_dir: Path):
    if not (tree_dir / "sglang" / "__init__.py").is_file():
        target = next(t.make_target for t in tree_table.TREES.values() if t.path == tree_dir)
        pytest.fail(f"{tree_dir} is missing; expected the trees of make {target}; fix: make {target}")
    return locate_tree(tree_dir)


def reexport_tree(name: str):
    """The tree patches/trees.json re-exports ``name`` on: the venv's sglang for a label without a directory."""
    tree = tree_table.TREES[tree_table.SERIES[name]["reexport_on"]]
    return need(tree.path) if tree.path else locate_tree(None)


def dep3_fields(text: str) -> dict[str, str]:
    """The DEP-3 fields of a format-patch message: ``Field: value`` lines before the first diff."""
    fields = {}
    for line in text.split("\ndiff --git ", 1)[0].splitlines():
        field, sep, value = line.partition(": ")
        if sep and field in ("Description", "Origin", "Forwarded", "Applied-Upstream", "Last-Update", "Bug"):
            fields[field] = value
    return fields


@pytest.mark.parametrize("name", list(tree_table.SERIES))
def test_series_headers_match_the_table(name):
    """The series file's applies-to and fixed-upstream headers say what patches/trees.json says."""
    row, series = tree_table.SERIES[name], series_mod.load_series(name)
    assert str(series.applies_to) == str(SpecifierSet(row["applies_to"]))
    assert series.fixed_upstream == row["fixed_upstream"]
    assert sorted(tree_table.SERIES) == series_mod.available_series(), "every shipped series is in the table"


@pytest.mark.parametrize("name", list(tree_table.SERIES))
def test_every_patch_carries_its_dep3_header(name):
    """DEP-3 on every patch of every series: the table says which Origin and Forwarded values each may have."""
    row, series = tree_table.SERIES[name], series_mod.load_series(name)
    for patch in series.patches:
        text = patch.path.read_text(encoding="utf-8")
        assert text.startswith("From 0000000000000000000000000000000000000000 "), "export must zero the commit id"
        fields = dep3_fields(text)
        for field in DEP3_ALWAYS:
            assert fields.get(field), f"{patch.name} lacks {field}"
        for field, allowed in row["dep3"].items():
            assert fields.get(field, "").startswith(tuple(allowed)), f"{patch.name}: {field}: {fields.get(field)!r} is not one of {allowed}"
        if fields["Origin"].startswith(("upstream", "backport")):
            # Taken from upstream: say which release carries it, the release the tripwire watches.
            assert fields.get("Applied-Upstream", "").startswith(f"{row['fixed_upstream']}, "), f"{patch.name} lacks Applied-Upstream"
        assert all(f.startswith(tuple(row["files_under"])) for f in patch.files), patch.files


def _on_its_tree(name: str):
    """The series' name, marked ``trees`` where the tree it is re-exported on is one make test builds."""
    built = tree_table.TREES[tree_table.SERIES[name]["reexport_on"]].dir is not None
    return pytest.param(name, marks=[pytest.mark.trees] if built else [])


@pytest.mark.parametrize("name", [_on_its_tree(name) for name in tree_table.SERIES])
def test_series_git_ams_onto_its_tree_and_reexports_byte_for_byte(name, tmp_path):
    """CI's freshness check, for every series on the tree the table names: the committed files are exactly what export makes of them."""
    assert_reexports(series_mod.load_series(name), reexport_tree(name), tmp_path)


@pytest.fixture(scope="module")
def series():
    return series_mod.load_series(SERIES)


@pytest.mark.trees  # sglang 0.5.18 and the PR's parent, under build/trees
def test_workbench_refuses_a_tree_the_series_does_not_am_onto(series, tmp_path):
    with pytest.raises(DcpDsparkError, match="does not git-am onto") as err:
        maintain.workbench(need(STOCK), series, tmp_path / "repo")
    assert "\n" not in str(err.value) and "fix: sglang-dcp-dspark base" in str(err.value)


@pytest.mark.trees  # sglang 0.5.18 and the PR's parent, under build/trees
def test_base_is_the_release_with_exactly_the_series_reversed(series, tmp_path):
    stock = need(STOCK)
    maintain.reconstruct_base(stock, series, tmp_path / "base")
    base = locate_tree(tmp_path / "base")
    assert patching.inspect(base, series).state is patching.State.APPLICABLE
    sources = [f for f in series.files if f.startswith("python/sglang/")]
    assert len(sources) == 3
    for name in sources:
        assert base.path_of(name).read_bytes() != stock.path_of(name).read_bytes(), name
        assert base.path_of(name).read_bytes() == need(BASE).path_of(name).read_bytes(), name


@pytest.mark.trees  # sglang 0.5.18 and the PR's parent, under build/trees
def test_base_refuses_a_tree_without_the_fix(series, tmp_path):
    with pytest.raises(DcpDsparkError, match="does not reverse-apply") as err:
        maintain.reconstruct_base(need(BASE), series, tmp_path / "base")
    assert "\n" not in str(err.value) and "fix: pip install --no-deps --target DIR 'sglang==0.5.18'" in str(err.value)
    assert not (tmp_path / "base").exists()


@pytest.mark.trees  # sglang 0.5.18 and the PR's parent, under build/trees
def test_base_refuses_a_non_empty_out(series, tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "keep").write_text("x")
    with pytest.raises(DcpDsparkError, match="is not empty"):
        maintain.reconstruct_base(need(STOCK), series, tmp_path / "base")
    assert (tmp_path / "base" / "keep").read_text() == "x"


@pytest.mark.trees  # sglang 0.5.18 and the PR's parent, under build/trees
def test_apply_on_the_base_gives_the_release_and_revert_takes_it_back(series, tmp_path):
    """A full apply of a series in upstream's form reads as "fixed upstream", and that is success.

    The tree then reads exactly like the release, so only the record apply
    leaves at the tree root tells revert that the fix is ours to take back.
    """
    root = tmp_path / "site-packages"
    shutil.copytree(need(BASE).package, root / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    tree = locate_tree(root)
    base_bytes = {name: tree.path_of(name).read_bytes() for name in series.tree_files(tree)}
    assert "applied 4 patch(es)" in patching.apply(tree, series).line
    status = patching.inspect(tree, series)
    assert status.state is patching.State.FIXED_UPSTREAM and status.applied == len(series.patches)
    assert status.recorded and "revert undoes it" in status.line()
    for name in series.files:
        if name.startswith("python/sglang/"):
            assert tree.path_of(name).read_bytes() == need(STOCK).path_of(name).read_bytes(), name
    assert "reverted 4 patch(es)" in patching.revert(tree, series).line
    assert {name: tree.path_of(name).read_bytes() for name in base_bytes} == base_bytes
    assert not (root / series_mod.RECORD).exists()


@pytest.mark.trees  # sglang 0.5.18 and the PR's parent, under build/trees
def test_stock_release_reads_fixed_upstream_and_apply_leaves_it(series):
    stock = need(STOCK)
    status = patching.inspect(stock, series)
    assert status.state is patching.State.FIXED_UPSTREAM and not status.recorded
    assert "already carries the fix" in patching.apply(stock, series).line
    assert "nothing of ours to revert" in patching.revert(stock, series).line


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
    written = maintain.export(repo, "HEAD~1", "sglang-0.5.17", out_dir=out)
    assert sorted(p.name for p in out.iterdir()) == sorted(["mine.patch", "series", *(p.name for p in written[:-1])])
    assert (out / "mine.patch").read_text() == "not the series'"


def test_export_takes_a_series_name_not_a_path(tmp_path):
    decoy = tmp_path / "elsewhere"
    decoy.mkdir()
    (decoy / "keep.patch").write_text("x")
    with pytest.raises(DcpDsparkError, match="is not a series name"):
        maintain.export(tmp_path, "HEAD", f"../../{decoy}")
    assert (decoy / "keep.patch").read_text() == "x"
