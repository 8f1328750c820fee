"""The wheel a user installs the plugin from: built from this checkout, installed, and what sglang and preflight need is in it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import tree_table

REPO = Path(__file__).resolve().parents[2]
# The releases the package covers, oldest and newest, as the checkout's own table lists them (patches/trees.json):
# adding a release edits that table, not this file.
COVERED = sorted({t.sglang for t in tree_table.TREES.values()}, key=lambda r: tuple(map(int, r.split("."))))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # pip fetches the build backend (hatchling) from the package index, as a user's pip wheel does.
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(REPO)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (found,) = out.glob("sglang_dcp_dspark-*.whl")
    return found


def test_the_wheel_carries_the_entry_points_the_series_and_the_default_configs(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(z.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "[sglang.srt.plugins]\ndcp_dspark = sglang_dcp_dspark.plugin:register" in entry_points
    assert "sglang-dcp-dspark = sglang_dcp_dspark.__main__:main" in entry_points
    for path in ("sglang_dcp_dspark/preflight/data/deepseek-v3/config.json", "sglang_dcp_dspark/preflight/data/kimi-k3-dspark-draft/config.json",
                 "sglang_dcp_dspark/patches/sglang-0.5.17/series", "sglang_dcp_dspark/patches/upstream-next/series",
                 "sglang_dcp_dspark/patches/trees.json", f"sglang_dcp_dspark/passes/data/{COVERED[-1]}.json.gz"):
        assert path in names, path
    assert not any(n.startswith(("test/", "tools/", "sglang_dcp_dspark/test", "sglang_dcp_dspark/tools")) for n in names)
    # the pass map ships as its compact per-release tables; the full map is the generator's
    assert not any(n.endswith("spec_passes.json") for n in names)


def test_the_installed_wheel_finds_its_default_launch_and_series(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    probe = ("import json, sglang_dcp_dspark as p, sglang_dcp_dspark.preflight.check as f, sglang_dcp_dspark.series as s,"
             " sglang_dcp_dspark.passes as m;"
             "print(json.dumps([p.__file__, str(f.DEFAULT_DRAFT), f.DEFAULT_DRAFT.joinpath('config.json').is_file(),"
             f" s.available_series(), m.releases(), len(m.load('{COVERED[-1]}')['cases'])]))")
    env = dict(os.environ, PYTHONPATH=str(site))
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True, check=True)
    package, draft, has_config, series, releases, cases = json.loads(out.stdout)
    assert Path(package).is_relative_to(site) and Path(draft).is_relative_to(site) and has_config
    assert releases[0] == COVERED[0] and releases[-1] == COVERED[-1] and cases > 0  # the pass map's tables, from the wheel
    assert {"sglang-0.5.17", "upstream-next", "upstream-pr-35221"} <= set(series)


def _beside(where: Path, *packages) -> None:
    """``packages`` (imported modules) installed in ``where`` as pip installs them: the package and its
    dist-info, linked from this environment, nothing else of it."""
    where.mkdir(parents=True, exist_ok=True)
    for module in packages:
        home = Path(module.__file__).parent
        (where / home.name).symlink_to(home)
        for info in home.parent.glob(f"{home.name}-*.dist-info"):
            (where / info.name).symlink_to(info)


def test_the_wheel_installed_no_deps_in_a_fresh_venv_beside_sglang_says_what_is_missing_in_one_line(wheel, tmp_path):
    """As the install docs once read: a fresh venv, sglang installed ``--no-deps``, the wheel ``--no-deps``. A
    declared dependency missing (packaging) is one line naming it and the pip command, exit 2, for ``status`` and
    ``preflight --help``; installed beside, both work."""
    import packaging
    import sglang

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    beside = tmp_path / "beside"
    _beside(beside, sglang)
    (site / "beside.pth").write_text(f"{beside}\n")
    tool = venv / "bin" / "sglang-dcp-dspark"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for argv in (["status"], ["preflight", "--help"]):
        out = subprocess.run([str(tool), *argv], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 2, (argv, out.stdout, out.stderr)
        assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
        assert "'packaging'" in out.stderr and "fix: pip install 'packaging>=23'" in out.stderr, out.stderr
    _beside(beside, packaging)
    for argv in (["status"], ["preflight", "--help"]):
        out = subprocess.run([str(tool), *argv], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, (argv, out.stderr[-2000:])
    assert "sglang " + sglang.__version__ in subprocess.run([str(tool), "status"], capture_output=True, text=True,
                                                            env=env, timeout=300).stdout
