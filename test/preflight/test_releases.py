"""preflight.releases: the adapter is chosen by asking the installed sglang's code, never its version string.

Runs on whichever tree the suite is on (the unit tier: stock 0.5.17; the
per-tree suites in test/releases run every release). Each family says when it
begins (``first``) and what changed there; ``installed()`` asks the families,
newest first, whether the code has their shape (``matches()``), and takes the
first that does. No family newer than the installed release may match.
"""

from __future__ import annotations

import importlib

import pytest

from sglang_dcp_dspark.core.compat import installed_sglang_version, version_at_least
from sglang_dcp_dspark.core.errors import DcpDsparkError
from sglang_dcp_dspark.preflight import releases
from sglang_dcp_dspark.preflight.releases import sglang_0_5_17, sglang_0_5_18, sglang_0_5_19, sglang_0_5_21

CHAIN = (sglang_0_5_17, sglang_0_5_18, sglang_0_5_19, sglang_0_5_21)


def test_the_families_are_asked_newest_first():
    assert [m.__name__.rsplit(".", 1)[1] for m in CHAIN] == list(reversed(releases.FAMILIES))
    for older, newer in zip(CHAIN, CHAIN[1:], strict=False):
        assert issubclass(newer.Adapter, releases.Release)
        assert version_at_least(newer.Adapter.first, older.Adapter.first) and newer.Adapter.first != older.Adapter.first
        assert newer.Adapter.changes, f"{newer.__name__} says nothing of what changed at {newer.Adapter.first}"


def test_the_installed_release_gets_its_own_family():
    version = installed_sglang_version()
    own = [m.Adapter.first for m in CHAIN if version_at_least(version, m.Adapter.first)][-1]
    # a family newer than the release finds none of its code's shape there
    assert not [m.Adapter.first for m in CHAIN if not version_at_least(version, m.Adapter.first) and m.Adapter.matches()]
    adapter = releases.installed()
    assert adapter.first == own and adapter.version == version


def test_code_no_family_recognises_is_one_line_with_the_fix(monkeypatch):
    for name in releases.FAMILIES:
        monkeypatch.setattr(importlib.import_module(f"{releases.__name__}.{name}").Adapter, "matches",
                            classmethod(lambda cls: False))
    with pytest.raises(DcpDsparkError) as exc:
        releases.installed()
    line = str(exc.value)
    assert "\n" not in line and "does not recognise the code of sglang" in line and "fix: pip install sglang==" in line
