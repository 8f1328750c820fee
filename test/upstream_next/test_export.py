"""upstream-next as files: git am-able onto stock sglang 0.5.23, re-exported byte for byte, DEP-3 fields, apply and revert."""

from __future__ import annotations

import hashlib
import shutil

from trees import assert_reexports

from sglang_dcp_dspark import series as series_mod
from sglang_dcp_dspark.compat import locate_tree

from .conftest import TREE_DIRS

STOCK = TREE_DIRS["next-stock"][0]
DEP3 = ("Description:", "Origin: vendor (this project)", "Forwarded: not yet (proposed upstream, see docs/upstreaming.md)",
        "Last-Update:")


def test_series_git_ams_onto_the_release_and_reexports_byte_for_byte(series, tmp_path):
    """CI's freshness check: the committed files are exactly what export makes of them."""
    assert_reexports(series, locate_tree(STOCK), tmp_path)


def test_headers_and_dep3_fields(series):
    assert str(series.applies_to) == "==0.5.23"
    assert series.fixed_upstream is None  # nothing upstream carries it yet
    for patch in series.patches:
        text = patch.path.read_text(encoding="utf-8")
        for field in DEP3:
            assert f"\n{field}" in text, f"{patch.name} lacks {field}"
        assert all(f.startswith(("python/sglang/", "test/registered/")) for f in patch.files)


def test_apply_and_revert_on_a_copy_of_the_release(series, tmp_path):
    copy = tmp_path / "site-packages"
    shutil.copytree(STOCK / "sglang", copy / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(next(STOCK.glob("sglang-*.dist-info")), copy / "sglang-0.5.23.dist-info")
    tree = locate_tree(copy)

    def digest():
        return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(tree.package.rglob("*.py"))}

    before = digest()
    series_mod.apply(tree, series)
    assert series_mod.inspect(tree, series).state is series_mod.State.APPLIED
    changed = {str(p.relative_to(tree.package)) for p, h in digest().items() if before[p] != h}
    # The installed tree has no test/ directory: only the source patches land.
    assert changed == {f.removeprefix("python/sglang/") for f in series.files if f.startswith("python/sglang/")}
    series_mod.revert(tree, series)
    assert digest() == before
