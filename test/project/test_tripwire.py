"""When the 0.5.17 code may go, and the one place the sglang versions are written (vllm-spyre's tripwire).

patches/trees.json's ``versions`` holds the three sglang releases this project
is about: the base the backport and the plugin's hooks are written for, the
release that fixed it upstream, and the newest release upstream-next targets.
Everything else that names them (pyproject's lower bound, the series headers,
the plugin, the CLI's default series, the trees) is held to the table here, so
the tripwire below watches the real numbers.
"""

from __future__ import annotations

import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

import tree_table
from sglang_dcp_dspark import series as series_mod
from sglang_dcp_dspark.cli.common import DEFAULT_SERIES
from sglang_dcp_dspark.plugin import hooks

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
VERSIONS = tree_table.VERSIONS
BACKPORT = f"sglang-{VERSIONS['base']}"


def lowest_installable_sglang() -> Version:
    """The lowest sglang pip may pair with this package: the ``>=`` bound of pyproject's sglang dependency."""
    block = re.search(r"^dependencies = \[(.*?)^\]", PYPROJECT.read_text(encoding="utf-8"), re.S | re.M).group(1)
    (sglang,) = [Requirement(r) for r in re.findall(r'"([^"]+)"', block) if Requirement(r).name == "sglang"]
    (lower,) = [Version(s.version) for s in sglang.specifier if s.operator == ">="]
    return lower


def tripped(lowest: Version) -> str | None:
    """What to delete once ``lowest`` is the lowest sglang a user can install, or None while it lacks the fix."""
    fixed = Version(VERSIONS["fixed_upstream"])
    if lowest < fixed:
        return None
    return (
        f"pyproject.toml now requires sglang>={lowest}, which carries the fix (since {fixed}): "
        f"drop the {VERSIONS['base']} hooks and patches/{BACKPORT} (and their rows in patches/trees.json)"
    )


def test_drop_the_0_5_17_code_once_no_user_can_install_0_5_17():
    """Fails the day pyproject stops admitting a release without the fix: that is when the compat code goes."""
    message = tripped(lowest_installable_sglang())
    assert message is None, message


def test_the_tripwire_trips_at_the_fixed_release():
    assert "drop the 0.5.17 hooks and patches/sglang-0.5.17" in tripped(Version(VERSIONS["fixed_upstream"]))


def test_pyproject_admits_the_base_release():
    assert lowest_installable_sglang() == Version(VERSIONS["base"])


def test_series_headers_name_the_table_versions():
    backport, nxt = series_mod.load_series(BACKPORT), series_mod.load_series("upstream-next")
    assert backport.targets(VERSIONS["base"]) and not backport.targets(VERSIONS["fixed_upstream"])
    assert backport.fixed_upstream == VERSIONS["fixed_upstream"]
    assert nxt.targets(VERSIONS["next"])
    assert series_mod.load_series("upstream-pr-35221").fixed_upstream == VERSIONS["fixed_upstream"]


def test_plugin_and_cli_name_the_table_versions():
    assert VERSIONS["base"] == hooks.WRITTEN_FOR
    assert VERSIONS["fixed_upstream"] == hooks.FIXED_UPSTREAM_IN
    assert DEFAULT_SERIES == BACKPORT


def test_every_tree_is_one_of_the_table_releases():
    """A tree's release is the base, the fixed release, one between it and next, or next; nothing else is tested."""
    releases = {VERSIONS["base"], VERSIONS["fixed_upstream"], VERSIONS["next"], *VERSIONS["between"].split()}
    assert {t.sglang for t in tree_table.TREES.values()} == releases
    for tree in tree_table.TREES.values():
        if tree.build["how"] == "copy":
            assert tree.sglang == tree_table.TREES[tree.build["from"]].sglang, tree.label
