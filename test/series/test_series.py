"""The 0.5.17 series and its tooling: inspect, apply, revert, git am, and every way they can fail."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess

import pytest

from conftest import tree_digest
from sglang_dcp_dspark import series as series_mod
from sglang_dcp_dspark.__main__ import main
from sglang_dcp_dspark.core.compat import locate_tree
from sglang_dcp_dspark.series import patching
from sglang_dcp_dspark.series.patching import State

SERIES = "sglang-0.5.17"


@pytest.fixture(scope="module")
def backport():
    return series_mod.load_series(SERIES)


@pytest.fixture
def sparse_tree(installed_tree, backport, tmp_path):
    """Just the files the series touches, plus what version detection reads: fast to copy and compare."""
    root = tmp_path / "sparse"
    for rel in ["__init__.py", "_version.py", *[f.removeprefix("python/sglang/") for f in backport.files]]:
        dest = root / "sglang" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(installed_tree.package / rel, dest)
    return locate_tree(root)


def cli(*argv: str) -> int:
    return main(list(argv))


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def test_series_lists_its_patches_in_order(backport):
    names = [p.name for p in backport.patches]
    assert names == sorted(names) and len(names) >= 2
    assert names[0].startswith("0001-server_args") and names[1].startswith("0002-kv_cache_builder")
    assert backport.fixed_upstream == "0.5.18"
    assert backport.targets("0.5.17") and not backport.targets("0.5.18")


def test_every_patch_carries_its_dep3_header(backport):
    for patch in backport.patches:
        text = patch.path.read_text()
        for field in ("Description:", "Origin:", "Forwarded:", "Last-Update:"):
            assert f"\n{field}" in text, f"{patch.name} lacks {field}"
        assert text.startswith("From 0000000000000000000000000000000000000000 "), "export must zero the commit id"
        assert all(f.startswith(("python/sglang/", "test/")) for f in patch.files)


def test_round_trip_on_a_copy_of_the_installed_tree(tree_copy, backport, capsys):
    before = tree_digest(tree_copy)
    target = str(tree_copy.root)

    assert cli("status", "--target", target) == 0
    assert f"{SERIES:<22} applicable" in capsys.readouterr().out

    assert cli("apply", "--target", target) == 0
    assert f"applied {len(backport.patches)} patch(es)" in capsys.readouterr().out
    changed = {k for k, v in tree_digest(tree_copy).items() if before[k] != v}
    assert changed == {f.removeprefix("python/sglang/") for f in backport.files}
    assert "host_to_device_ratio=primary.logical_size / pool.size" in (
        tree_copy.package / "srt/mem_cache/kv_cache_builder.py"
    ).read_text()

    assert cli("status", "--target", target) == 0
    assert f"{SERIES:<22} applied" in capsys.readouterr().out

    patched = tree_digest(tree_copy)
    assert cli("apply", "--target", target) == 0
    assert "already applied" in capsys.readouterr().out
    assert tree_digest(tree_copy) == patched

    assert cli("revert", "--target", target) == 0
    assert "reverted" in capsys.readouterr().out
    assert tree_digest(tree_copy) == before


def test_git_am_on_a_checkout_built_from_the_installed_tree(installed_tree, backport, tmp_path, sparse_tree):
    repo = tmp_path / "checkout"
    shutil.copytree(installed_tree.package, repo / "python" / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    run = lambda *a: subprocess.run(["git", *a], cwd=repo, env=env, check=True, capture_output=True, text=True)  # noqa: E731
    run("init", "-q")
    run("add", "-A")
    run("commit", "-qm", "sglang v0.5.17")
    run("am", *[str(p.path) for p in backport.patches])
    log = run("log", "--format=%s").stdout.splitlines()
    assert len(log) == len(backport.patches) + 1

    checkout = locate_tree(repo)
    assert checkout.layout == "checkout"
    assert patching.inspect(checkout, backport).state is State.APPLIED
    # git am and our apply produce the same bytes.
    patching.apply(sparse_tree, backport)
    for name in backport.files:
        assert checkout.path_of(name).read_bytes() == sparse_tree.path_of(name).read_bytes()


def test_fixed_upstream_tree_is_reported_and_left_alone(sparse_tree, backport, capsys):
    version_file = sparse_tree.package / "_version.py"
    version_file.write_text(version_file.read_text().replace("'0.5.17'", "'0.5.18'"))
    tree = locate_tree(sparse_tree.root)
    # Same bytes as stock 0.5.17 otherwise: the series still applies, so only a
    # tree whose content no longer matches can read as fixed upstream.
    (tree.package / "srt/server_args.py").write_text(
        (tree.package / "srt/server_args.py").read_text().replace(
            "does not support speculative", "only supports DSPARK speculative"
        )
    )
    before = tree_digest(tree)
    assert patching.inspect(tree, backport).state is State.FIXED_UPSTREAM
    assert cli("apply", "--target", str(tree.root)) == 0
    assert "already carries the fix" in capsys.readouterr().out
    assert tree_digest(tree) == before


def test_wrong_version_is_refused_and_tree_untouched(sparse_tree, capsys):
    version_file = sparse_tree.package / "_version.py"
    version_file.write_text(version_file.read_text().replace("'0.5.17'", "'0.5.16'"))
    before = tree_digest(sparse_tree)
    assert cli("apply", "--target", str(sparse_tree.root)) == 2
    err = one_error_line(capsys)
    assert "0.5.16" in err and "==0.5.17" in err and "pip install" in err
    assert tree_digest(sparse_tree) == before


def test_conflicting_tree_names_the_patch_and_is_untouched(sparse_tree, capsys):
    builder = sparse_tree.package / "srt/mem_cache/kv_cache_builder.py"
    builder.write_text(builder.read_text().replace("primary = tree_cache", "primary  = tree_cache"))
    before = tree_digest(sparse_tree)
    assert patching.inspect(sparse_tree, series_mod.load_series(SERIES)).state is State.CONFLICT
    assert cli("apply", "--target", str(sparse_tree.root)) == 2
    err = one_error_line(capsys)
    assert "0002-kv_cache_builder" in err and "0.5.17" in err and "--force-reinstall" in err
    assert tree_digest(sparse_tree) == before


def test_half_applied_series_is_completed_or_undone_whole(sparse_tree, backport, capsys):
    stock = tree_digest(sparse_tree)
    subprocess.run(
        ["git", "apply", "-p2", "--include=sglang/*", str(backport.patches[0].path)],
        cwd=sparse_tree.root, check=True,
    )
    status = patching.inspect(sparse_tree, backport)
    assert (status.state, status.applied) == (State.PARTIAL, 1)
    assert cli("status", "--target", str(sparse_tree.root)) == 0
    assert "partially applied" in capsys.readouterr().out

    assert cli("revert", "--target", str(sparse_tree.root)) == 0
    assert tree_digest(sparse_tree) == stock

    subprocess.run(
        ["git", "apply", "-p2", "--include=sglang/*", str(backport.patches[0].path)],
        cwd=sparse_tree.root, check=True,
    )
    assert cli("apply", "--target", str(sparse_tree.root)) == 0
    assert patching.inspect(sparse_tree, backport).state is State.APPLIED


def test_write_failure_midway_rolls_back(sparse_tree, monkeypatch, capsys):
    """The second file fails to move (an I/O error): the first is moved back and the journal goes."""
    before = tree_digest(sparse_tree)
    real_replace = os.replace
    calls = []

    def failing_replace(src, dst, *args, **kwargs):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(errno.EIO, "Input/output error", str(dst))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", failing_replace)
    assert cli("apply", "--target", str(sparse_tree.root)) == 2
    monkeypatch.undo()
    err = one_error_line(capsys)
    assert "Input/output error" in err and "put back as it was" in err
    assert tree_digest(sparse_tree) == before
    assert sorted(p.name for p in sparse_tree.root.iterdir()) == ["sglang"]


@pytest.fixture
def read_only(sparse_tree):
    """Make the tree unwritable for this process, as a root-owned site-packages is for an operator.

    root writes through permission bits, so as root the files are made
    immutable instead (chattr +i), which the kernel refuses to root as well.
    """
    paths = [sparse_tree.root, *sparse_tree.root.rglob("*")]
    if os.geteuid() == 0:
        chattr = shutil.which("chattr")
        if chattr is None or subprocess.run([chattr, "+i", *map(str, paths)], capture_output=True).returncode:
            pytest.skip("running as root on a filesystem without chattr +i: cannot make the tree read-only")
        yield sparse_tree
        subprocess.run([chattr, "-i", *map(str, paths)], check=True)
    else:
        for path in paths:
            path.chmod(0o555 if path.is_dir() else 0o444)
        yield sparse_tree
        for path in paths:
            path.chmod(0o755 if path.is_dir() else 0o644)


def test_read_only_tree_is_refused_and_untouched(read_only, capsys):
    before = tree_digest(read_only)
    assert cli("apply", "--target", str(read_only.root)) == 2
    err = one_error_line(capsys)
    assert "read-only" in err and "fix:" in err
    assert tree_digest(read_only) == before


def test_missing_git_is_a_one_line_error(sparse_tree, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    before = tree_digest(sparse_tree)
    assert cli("apply", "--target", str(sparse_tree.root)) == 2
    assert "git was not found" in one_error_line(capsys)
    assert tree_digest(sparse_tree) == before


def test_no_sglang_tree_at_target(tmp_path, capsys):
    assert cli("status", "--target", str(tmp_path)) == 2
    assert "no sglang tree" in one_error_line(capsys)


def test_unknown_series(sparse_tree, capsys):
    assert cli("apply", "--target", str(sparse_tree.root), "--series", "nope") == 2
    assert "unknown series 'nope'" in one_error_line(capsys)


def test_applied_to_names_the_series_a_tree_carries(sparse_tree, monkeypatch):
    """What preflight names as "applied" on a tree: the backport after apply, nothing before; a series whose
    applies-to excludes the tree's release is not asked of git (apply refuses such a tree)."""
    asked = []
    inspect = patching.inspect
    monkeypatch.setattr(patching, "inspect", lambda tree, s: asked.append(s.name) or inspect(tree, s))
    assert series_mod.applied_to(sparse_tree) == []
    assert asked == [SERIES]  # upstream-next (==0.5.23) and upstream-pr-35221 (0.5.18) target other releases
    patching.apply(sparse_tree, series_mod.load_series(SERIES))
    assert series_mod.applied_to(sparse_tree) == [SERIES]
