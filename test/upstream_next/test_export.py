"""upstream-next on a copy of stock sglang 0.5.23: apply and revert (its DEP-3 fields and re-export: test/cli/test_export.py)."""

from __future__ import annotations

import hashlib
import shutil

from sglang_dcp_dspark.core.compat import locate_tree
from sglang_dcp_dspark.series import patching

from .conftest import TREE_DIRS, series_only

pytestmark = series_only("applying and reverting patches/upstream-next is the series' own check")

STOCK = TREE_DIRS["next-stock"][0]


def test_apply_and_revert_on_a_copy_of_the_release(series, tmp_path):
    copy = tmp_path / "site-packages"
    shutil.copytree(STOCK / "sglang", copy / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(next(STOCK.glob("sglang-*.dist-info")), copy / "sglang-0.5.23.dist-info")
    tree = locate_tree(copy)

    def digest():
        return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(tree.package.rglob("*.py"))}

    before = digest()
    patching.apply(tree, series)
    assert patching.inspect(tree, series).state is patching.State.APPLIED
    # A file the series creates (pool_host/dcp_draft.py) counts as changed; revert removes it again.
    changed = {str(p.relative_to(tree.package)) for p, h in digest().items() if before.get(p) != h}
    # The installed tree has no test/ directory: only the source patches land.
    assert changed == {f.removeprefix("python/sglang/") for f in series.files if f.startswith("python/sglang/")}
    patching.revert(tree, series)
    assert digest() == before
