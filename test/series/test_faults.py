"""Faults, with real signals in real child processes: a kill at every operation on a target file, random kills, full disks, and a table of hostile inputs."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

import fault_child
from sglang_dcp_dspark import series as series_mod
from sglang_dcp_dspark.__main__ import main
from sglang_dcp_dspark.core.compat import locate_tree
from sglang_dcp_dspark.series import journal, patching

SERIES = "sglang-0.5.17"
RECORD = series_mod.RECORD
# Tallies for the closing summary (printed with -s or on failure): cases per row.
TALLY: dict[str, int] = {}


def tally(row: str, n: int = 1) -> None:
    TALLY[row] = TALLY.get(row, 0) + n


# ---------------------------------------------------------------- trees


def root_state(root: Path) -> dict[str, str]:
    """sha256 of every file under the tree root, hidden ones (journal, record, temporaries) included."""
    return {
        str(p.relative_to(root)): "-> " + os.readlink(p) if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if (p.is_file() or p.is_symlink()) and "__pycache__" not in p.parts
    }


def fingerprint(root: Path) -> tuple:
    """root_state with the random parts of temporary names (mkdtemp suffix, pid) blanked."""
    state = root_state(root)

    def norm(rel: str) -> str:
        return re.sub(r"\.\d+\.sglang-dcp-dspark-tmp$", ".PID.sglang-dcp-dspark-tmp", re.sub(r"\.new-[^/]+", ".new-X", rel))

    return tuple(sorted((norm(k), v) for k, v in state.items()))


@dataclass
class Refs:
    stock: Path  # a sparse 0.5.17 tree: the series' files and what version detection reads
    patched: Path  # the same after a clean apply
    stock_state: dict
    patched_state: dict
    targets: set  # relative paths of the files an apply replaces, record included


@pytest.fixture(scope="module")
def refs(installed_tree, tmp_path_factory) -> Refs:
    base = tmp_path_factory.mktemp("refs")
    backport = series_mod.load_series(SERIES)
    stock = base / "stock"
    for rel in ["__init__.py", "_version.py", *[f.removeprefix("python/sglang/") for f in backport.files]]:
        dest = stock / "sglang" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(installed_tree.package / rel, dest)
    patched = base / "patched"
    shutil.copytree(stock, patched)
    patching.apply(locate_tree(patched), backport)
    stock_state, patched_state = root_state(stock), root_state(patched)
    targets = {k for k in set(stock_state) | set(patched_state) if stock_state.get(k) != patched_state.get(k)}
    assert RECORD in targets and len(targets) == 4
    return Refs(stock, patched, stock_state, patched_state, targets)


def fresh(src: Path, dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, symlinks=True)
    return dest


# ---------------------------------------------------------------- children


@dataclass
class Outcome:
    code: int | None  # exit code, or None when killed
    signal: int | None
    out: str
    err: str

    def assert_clean(self, *codes: int) -> None:
        """No traceback, and an exit code from ``codes`` with at most one ``error:`` line, or death by SIGKILL."""
        assert "Traceback" not in self.err, self.err
        if self.signal == signal.SIGKILL:
            return
        assert self.signal is None, f"died by signal {self.signal}: {self.err}"
        assert self.code in codes, (self.code, self.err)
        errors = [line for line in self.err.splitlines() if not line.startswith("recovered: ")]
        assert len(errors) <= 1 and all(line.startswith("error: ") for line in errors), self.err


def fork_cli(argv, tmp: Path, *, root: Path | None = None, signum: int = signal.SIGKILL, nth: int = 0,
             kill_after: float | None = None, no_hardlinks: bool = False, prepare=None) -> Outcome:
    """Run ``main(argv)`` in a forked child (nothing to import again), optionally faulted.

    With ``nth`` the child's operations on ``root`` signal it at the nth one
    (fault_child); with ``kill_after`` the parent SIGKILLs it after that many
    seconds. The child's TMPDIR is private, so killed runs leak nothing into
    the machine's /tmp.
    """
    tmp.mkdir(parents=True, exist_ok=True)
    out_path, err_path, log_path = tmp / "out", tmp / "err", tmp / "ops.log"
    private_tmp = tmp / "tmpdir"
    private_tmp.mkdir(exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 99
        try:
            for fd, path in ((1, out_path), (2, err_path)):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
            sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.environ["TMPDIR"] = str(private_tmp)
            tempfile.tempdir = None
            if prepare is not None:
                prepare()
            if root is not None:
                fault_child.install(str(root), signum, nth, str(log_path), no_hardlinks=no_hardlinks)
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
        except BaseException:
            traceback.print_exc()
        finally:
            with contextlib.suppress(BaseException):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    start = time.monotonic()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        elapsed = time.monotonic() - start
        if kill_after is not None and elapsed >= kill_after:
            os.kill(pid, signal.SIGKILL)
            kill_after = None
        if elapsed > 120:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"child {argv} hung")
        time.sleep(0.002)
    shutil.rmtree(private_tmp, ignore_errors=True)
    return Outcome(
        os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        out_path.read_text(errors="replace"),
        err_path.read_text(errors="replace"),
    )


def points(direction: str, start: Path, tmp: Path, **kwargs) -> list[tuple[int, str, str]]:
    """Every operation on the tree during one undisturbed run: (index, operation, path)."""
    tree = fresh(start, tmp / "count")
    outcome = fork_cli([direction, "--target", str(tree)], tmp / "count-run", root=tree, nth=0, **kwargs)
    outcome.assert_clean(0)
    lines = (tmp / "count-run" / "ops.log").read_text().splitlines()
    return [(int(i), op, path) for i, op, path in (line.split(" ", 2) for line in lines)]


class Verifier:
    """The recovery contract, checked once per distinct damaged tree.

    After a fault the next ``apply`` must leave the patched reference byte for
    byte, and the next ``revert`` the stock one: both are run, each on its own
    copy. Two faults that leave identical trees (temporary names aside) get the
    same answer, so it is computed once.
    """

    def __init__(self, refs: Refs, tmp: Path) -> None:
        self.refs = refs
        self.tmp = tmp
        self.seen: dict[tuple, str] = {}

    def check(self, tree: Path, what: str) -> None:
        key = fingerprint(tree)
        if key in self.seen:
            return
        problems = []
        for command, want in (("apply", self.refs.patched_state), ("revert", self.refs.stock_state)):
            copy = fresh(tree, self.tmp / f"verify-{command}")
            outcome = fork_cli([command, "--target", str(copy)], self.tmp / f"verify-{command}-run")
            if "Traceback" in outcome.err or outcome.code != 0:
                problems.append(f"next {command} exited {outcome.code}: {outcome.err.strip()}")
            elif root_state(copy) != want:
                problems.append(f"next {command} left {sorted(set(root_state(copy).items()) ^ set(want.items()))[:4]}")
        assert not problems, f"{what}: {problems}"
        self.seen[key] = what
        tally("damaged trees checked: next apply and next revert")


def target_points(ops, refs: Refs) -> list[tuple[int, str, str]]:
    """The operations on target files and the journal, each distinct (operation, path) once.

    Staging reads every target file several times before anything is
    written; a signal at any of those reads leaves the same untouched tree,
    so the first read of each file stands for the others.
    """
    seen, chosen = set(), []
    for index, op, path in ops:
        key = (op, re.sub(r"\.\d+\.sglang-dcp-dspark-tmp$", "", re.sub(r"\.new-[^/]+", ".new", path)))
        if is_target_point(path, refs) and key not in seen:
            seen.add(key)
            chosen.append((index, op, path))
    return chosen


def is_target_point(path: str, refs: Refs) -> bool:
    """An operation on a target file, its temporary beside it, or the journal itself (not the blobs in it)."""
    beside = re.sub(r"(^|/)\.([^/]+)\.\d+\.sglang-dcp-dspark-tmp$", r"\1\2", path)
    in_journal = path.startswith(journal.JOURNAL) and "/" in path
    return path in refs.targets or beside in refs.targets or (path.startswith(journal.JOURNAL) and not in_journal) or path.endswith("journal.json")


# ---------------------------------------------------------------- interrupt points


@pytest.fixture(scope="module")
def verifier(refs, tmp_path_factory) -> Verifier:
    return Verifier(refs, tmp_path_factory.mktemp("verify"))


@pytest.mark.parametrize("direction", ["apply", "revert"])
def test_a_signal_at_every_operation_on_a_target_file(direction, refs, verifier, tmp_path):
    """SIGKILL at each open, write, link, rename and unlink of a target file or the journal, and SIGINT or SIGTERM too.

    SIGKILL: the next apply gives the patched tree and the next revert the
    stock one (Verifier). SIGINT and SIGTERM (taking turns from one point to
    the next): the command itself exits 130/143 with one line and leaves the
    tree wholly on one side, with nothing of ours left over.
    """
    start, end = (refs.stock, refs.patched) if direction == "apply" else (refs.patched, refs.stock)
    start_state, end_state = root_state(start), root_state(end)
    ops = target_points(points(direction, start, tmp_path), refs)
    kinds = {op for _, op, _ in ops}
    assert {"open", "link", "replace", "rename", "unlink", "rmdir"} <= kinds, kinds
    for n, (index, op, path) in enumerate(ops):
        for signum in (signal.SIGKILL, (signal.SIGINT, signal.SIGTERM)[n % 2]):
            what = f"{direction}: {signal.Signals(signum).name} at operation {index} ({op} {path})"
            tree = fresh(start, tmp_path / "tree")
            outcome = fork_cli([direction, "--target", str(tree)], tmp_path / "run", root=tree, signum=signum, nth=index)
            if signum == signal.SIGKILL:
                assert outcome.signal == signal.SIGKILL, what
                verifier.check(tree, what)
                tally("interrupt points: SIGKILL")
            else:
                outcome.assert_clean(128 + signum)
                assert f"interrupted by {signal.Signals(signum).name}" in outcome.err, (what, outcome.err)
                assert root_state(tree) in (start_state, end_state), what
                tally("interrupt points: SIGINT or SIGTERM")


def test_a_kill_at_every_copy_when_hardlinks_fail(refs, verifier, tmp_path):
    """Where a blob cannot be hardlinked into place (another filesystem), it is copied beside the target: a kill at each step of that copy."""
    ops = points("apply", refs.stock, tmp_path, no_hardlinks=True)
    copies = [p for p in ops if p[2].endswith(".sglang-dcp-dspark-tmp") and p[1] in ("open", "write", "fchmod", "fsync")]
    assert {op for _, op, _ in copies} == {"open", "write", "fchmod", "fsync"}
    for index, op, path in copies:
        tree = fresh(refs.stock, tmp_path / "tree")
        outcome = fork_cli(["apply", "--target", str(tree)], tmp_path / "run", root=tree, nth=index, no_hardlinks=True)
        assert outcome.signal == signal.SIGKILL
        verifier.check(tree, f"apply without hardlinks: SIGKILL at {index} ({op} {path})")
        tally("interrupt points: SIGKILL, copying without hardlinks")


def test_the_check_catches_an_in_place_writer(refs, tmp_path):
    """The old writer (truncate, then write each file in place), killed at its first write, fails the same check."""

    def in_place(root, changes, **kwargs):
        for change in changes:
            fd = os.open(root / change.rel, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.write(fd, change.after or b"")
            os.close(fd)

    def prepare():
        journal.commit = in_place

    ops = points("apply", refs.stock, tmp_path, prepare=prepare)
    first_write = next(i for i, op, path in ops if op == "write" and path.endswith("server_args.py"))
    tree = fresh(refs.stock, tmp_path / "tree")
    fork_cli(["apply", "--target", str(tree)], tmp_path / "run", root=tree, nth=first_write, prepare=prepare)
    assert (tree / "sglang/srt/server_args.py").stat().st_size == 0
    with pytest.raises(AssertionError, match="next apply exited 2"):
        Verifier(refs, tmp_path).check(tree, "in-place writer")


def test_random_kills(refs, verifier, tmp_path):
    """SIGKILL after a random delay, apply and revert alternating, for a bounded time; every tree is checked."""
    seed = int(os.environ.get("SGLANG_DCP_DSPARK_FAULT_SEED", "0")) or random.randrange(1 << 30)
    rng = random.Random(seed)
    budget = float(os.environ.get("SGLANG_DCP_DSPARK_FAULT_SECONDS", "15"))
    # How long a whole run takes here, so the delays land across all of it.
    durations = {}
    for direction, start in (("apply", refs.stock), ("revert", refs.patched)):
        tree = fresh(start, tmp_path / "tree")
        t0 = time.monotonic()
        fork_cli([direction, "--target", str(tree)], tmp_path / "run").assert_clean(0)
        durations[direction] = time.monotonic() - t0
    deadline = time.monotonic() + budget
    kills = 0
    while time.monotonic() < deadline:
        direction, start = rng.choice((("apply", refs.stock), ("revert", refs.patched)))
        # Half the delays fall in the last fifth of the run, where files move.
        span = durations[direction]
        delay = rng.uniform(0.8 * span, 1.05 * span) if rng.random() < 0.5 else rng.uniform(0, span)
        tree = fresh(start, tmp_path / "tree")
        outcome = fork_cli([direction, "--target", str(tree)], tmp_path / "run", kill_after=delay)
        outcome.assert_clean(0)
        verifier.check(tree, f"seed {seed}: {direction} killed after {delay:.3f} s")
        kills += outcome.signal == signal.SIGKILL
        tally("random kills")
    assert kills >= 5, f"seed {seed}: only {kills} runs were actually killed"


# ---------------------------------------------------------------- full disks


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip()}); the full-disk cases need one")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(mount: Path, leave: int) -> None:
    """Take all free space but ``leave`` bytes."""
    filler = mount / "filler"
    with contextlib.suppress(FileNotFoundError):
        filler.unlink()
    st = os.statvfs(mount)
    size = st.f_bavail * st.f_frsize - leave
    if size > 0:
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)


@pytest.mark.parametrize("direction", ["apply", "revert"])
def test_full_disk_under_the_tree(direction, refs, tmp_path):
    """The tree on a small tmpfs with 0 B to 2 MiB free: a clean success or one 'no space left' line, never half a tree."""
    start, end = (refs.stock, refs.patched) if direction == "apply" else (refs.patched, refs.stock)
    outcomes = set()
    with tmpfs(tmp_path / "disk", "6m") as disk:
        for leave in (0, 4 << 10, 64 << 10, 512 << 10, 900 << 10, 1400 << 10, 2 << 20):
            tree = disk / "tree"
            if tree.exists():
                shutil.rmtree(tree)
            (disk / "filler").unlink(missing_ok=True)
            shutil.copytree(start, tree)
            fill(disk, leave)
            outcome = fork_cli([direction, "--target", str(tree)], tmp_path / "run")
            outcome.assert_clean(0, 2)
            state = {k: v for k, v in root_state(tree).items()}
            if outcome.code == 0:
                assert state == root_state(end), leave
            else:
                assert "no space left" in outcome.err and "nothing in the tree was changed" in outcome.err, outcome.err
                assert state == root_state(start), leave
            outcomes.add(outcome.code)
            tally("faults: full disk under the tree")
    assert outcomes == {0, 2}, "the sizes should cover both a refusal and a success"


def test_nearly_full_tmpdir(refs, tmp_path, monkeypatch, capsys):
    """TMPDIR on a small tmpfs, from full to roomy: staging fails cleanly or the apply completes, never both or neither."""
    outcomes = set()
    with tmpfs(tmp_path / "tmpdir", "4m") as tmpdir:
        monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
        for leave in (0, 64 << 10, 400 << 10, 700 << 10, 1000 << 10, 1300 << 10, 1600 << 10, 2 << 20, 3 << 20):
            tree = fresh(refs.stock, tmp_path / "tree")
            for stale in tmpdir.iterdir():
                shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
            fill(tmpdir, leave)
            code = main(["apply", "--target", str(tree)])
            captured = capsys.readouterr()
            if code == 0:
                assert root_state(tree) == refs.patched_state, leave
            else:
                assert code == 2 and captured.err.count("\n") == 1 and "cannot stage the series" in captured.err, captured.err
                assert root_state(tree) == refs.stock_state, leave
            outcomes.add(code)
            tally("faults: nearly full TMPDIR")
    assert outcomes == {0, 2}, outcomes


def test_journal_stays_whole_when_a_move_fails_and_undoing_fails_too(refs, tmp_path, monkeypatch, capsys):
    """If putting files back fails as well, the journal stays and the next command finishes the undo."""
    tree = fresh(refs.stock, tmp_path / "tree")
    real_replace = os.replace
    calls = []

    def failing(src, dst, *a, **k):
        calls.append(dst)
        if len(calls) >= 2:
            raise OSError(errno.EIO, "Input/output error", str(dst))
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", failing)
    assert main(["apply", "--target", str(tree)]) == 2
    monkeypatch.undo()
    assert "putting the tree back failed too" in capsys.readouterr().err
    assert (tree / journal.JOURNAL / "journal.json").is_file()
    assert main(["status", "--target", str(tree)]) == 0
    assert "recovered: undid the interrupted apply" in capsys.readouterr().err
    assert root_state(tree) == refs.stock_state
    tally("faults: I/O error while moving, and while undoing")


# ---------------------------------------------------------------- hostile inputs


def write_series(directory: Path, patch_text: str, listing: str = "0001-x.patch") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "series").write_text(f"# applies-to: ==0.5.17\n{listing}\n")
    (directory / "0001-x.patch").write_text(patch_text)
    return directory


HUNK = "@@ -1 +1 @@\n-a\n+b\n"


def diff(path_a: str, path_b: str | None = None, extra: str = "") -> str:
    path_b = path_b or path_a
    return f"From 0 Mon Sep 17 00:00:00 2001\nSubject: x\n\n---\ndiff --git a/{path_a} b/{path_b}\n{extra}--- a/{path_a}\n+++ b/{path_b}\n{HUNK}"


def fake_git(tmp: Path, body: str) -> None:
    bin_dir = tmp / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    git = bin_dir / "git"
    git.write_text("#!/bin/sh\n" + body + "\n")
    git.chmod(0o755)
    os.environ["PATH"] = f"{bin_dir}:{os.environ['PATH']}"


def hostile_cases():
    """(id, setup(tree_root, tmp) -> argv, expected exit code, fragment of the one stderr/stdout line)."""

    def series_dir(text, listing="0001-x.patch"):
        return lambda root, tmp: ["apply", "--target", str(root), "--series-dir", str(write_series(tmp / "s", text, listing))]

    def edit(rel, old, new):
        def run(root):
            path = root / "sglang" / rel
            path.write_bytes(path.read_bytes().replace(old, new))
        return run

    def symlink_out(root, tmp):
        outside = tmp / "outside.py"
        shutil.copyfile(root / "sglang/srt/server_args.py", outside)
        (root / "sglang/srt/server_args.py").unlink()
        (root / "sglang/srt/server_args.py").symlink_to(outside)
        return ["apply", "--target", str(root)]

    def symlink_in(root, tmp):
        real = root / "sglang/srt/server_args_real.py"
        (root / "sglang/srt/server_args.py").rename(real)
        (root / "sglang/srt/server_args.py").symlink_to("server_args_real.py")
        return ["apply", "--target", str(root)]

    def dir_symlink_out(root, tmp):
        shutil.move(root / "sglang/srt/mem_cache", tmp / "mem_cache")
        (root / "sglang/srt/mem_cache").symlink_to(tmp / "mem_cache")
        return ["apply", "--target", str(root)]

    def bad_version(root, tmp):
        (root / "sglang/_version.py").write_bytes(b"__version__ = '0.5.17\xff'\n")
        return ["status", "--target", str(root)]

    def bad_metadata(root, tmp):
        (root / "sglang/_version.py").unlink()
        meta = root / "sglang-0.5.17.dist-info"
        meta.mkdir()
        (meta / "METADATA").write_bytes(b"Name: sglang\nVersion: 0.5.17\nSummary: \xfe\xff\n")
        return ["apply", "--target", str(root)]

    def conflict(args):
        def run(root, tmp):
            edit("srt/mem_cache/kv_cache_builder.py", b"primary = tree_cache", b"primary  = tree_cache")(root)
            return [*args, "--target", str(root)]
        return run

    def as_checkout(root, tmp):
        checkout = tmp / "checkout"
        (checkout / "python").mkdir(parents=True)
        shutil.copytree(root / "sglang", checkout / "python/sglang")
        subprocess.run(["git", "init", "-q", str(checkout)], check=True)
        edit("srt/mem_cache/kv_cache_builder.py", b"primary = tree_cache", b"primary  = tree_cache")(checkout / "python")
        return ["apply", "--target", str(checkout)]

    def no_git(root, tmp):
        os.environ["PATH"] = str(tmp / "empty")
        return ["apply", "--target", str(root)]

    def failing_git(root, tmp):
        fake_git(tmp, "echo 'git: cannot load libpcre' >&2; exit 1")
        return ["apply", "--target", str(root)]

    def crashing_git(root, tmp):
        fake_git(tmp, 'case "$1" in --version) echo "git version 2.99";; *) kill -SEGV $$;; esac')
        return ["apply", "--target", str(root)]

    def damaged_journal(root, tmp):
        (root / journal.JOURNAL).mkdir()
        (root / journal.JOURNAL / "journal.json").write_text("{")
        return ["status", "--target", str(root)]

    def changed_since_kill(root, tmp):
        # A journal as a kill leaves it, then someone edits the file by hand.
        before = (root / "sglang/srt/server_args.py").read_bytes()
        changes = [journal.Change("sglang/srt/server_args.py", before, before + b"# after\n")]
        journal.write_journal(root, changes, "apply", SERIES)
        (root / "sglang/srt/server_args.py").write_bytes(before + b"# someone else\n")
        return ["apply", "--target", str(root)]

    def locked(root, tmp):
        fd = os.open(root, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        HELD.append(fd)
        return ["apply", "--target", str(root)]

    def export_dotdot(root, tmp):
        decoy = tmp / "elsewhere"
        decoy.mkdir()
        (decoy / "keep.patch").write_text("mine")
        return ["export", "--repo", str(tmp), "--base", "HEAD", "--series", f"../../{decoy.name}"]

    def hardlinked(root, tmp):
        os.link(root / "sglang/srt/server_args.py", tmp / "shared-cache-copy.py")
        return ["apply", "--target", str(root)]

    def not_utf8_patch(root, tmp):
        directory = write_series(tmp / "s", "")
        (directory / "0001-x.patch").write_bytes(b"\xff\xfe")
        return ["apply", "--target", str(root), "--series-dir", str(directory)]

    def both_series(root, tmp):
        return ["apply", "--target", str(root), "--series", SERIES, "--series-dir", str(tmp)]

    return [
        ("series name that is a path", lambda r, t: ["apply", "--target", str(r), "--series", "../../x"], 2, "is not a series name"),
        ("series name that is absolute", lambda r, t: ["apply", "--target", str(r), "--series", str(t)], 2, "is not a series name"),
        ("unknown series", lambda r, t: ["apply", "--target", str(r), "--series", "nope"], 2, "unknown series 'nope'"),
        ("--series and --series-dir", both_series, 2, "name a series twice"),
        ("--series-dir without a series", lambda r, t: ["apply", "--target", str(r), "--series-dir", str(t)], 2, "holds no series file"),
        ("patch path with ..", series_dir(diff("python/sglang/../../../evil.py")), 2, "not a plain path"),
        ("patch path absolute", series_dir(diff("/etc/evil")), 2, "not a plain path"),
        ("patch path outside sglang", series_dir(diff("setup.py")), 2, "not a plain path"),
        ("patch path quoted", series_dir('diff --git "a/python/sglang/a b" "b/python/sglang/a b"\n' + HUNK), 2, "not a plain path"),
        ("plain diff with ..", series_dir("--- a/../../evil.py\n+++ b/../../evil.py\n" + HUNK), 2, "not a plain path"),
        ("rename onto ..", series_dir(diff("python/sglang/x.py", extra="rename from python/sglang/x.py\nrename to ../x.py\n")), 2, "not a plain path"),
        ("patch makes a symlink", series_dir(diff("python/sglang/link", extra="new file mode 120000\n")), 2, "symlink or a submodule"),
        ("series lists ../", series_dir(diff("python/sglang/x.py"), listing="../../etc/passwd"), 2, "not a file name"),
        ("patch not UTF-8", not_utf8_patch, 2, "is not UTF-8"),
        ("target file symlinked out of the tree", symlink_out, 2, "is a symlink"),
        ("target file symlinked inside the tree", symlink_in, 2, "is a symlink"),
        ("target directory symlinked out of the tree", dir_symlink_out, 2, "leads outside the tree"),
        ("_version.py not UTF-8", bad_version, 2, "is not UTF-8"),
        ("METADATA not UTF-8", bad_metadata, 2, "is not UTF-8"),
        ("revert, no --series, conflicting tree", conflict(["revert"]), 2, "cannot be reverted"),
        ("revert, no --series, stock tree", lambda r, t: ["revert", "--target", str(r)], 0, "nothing to revert"),
        ("conflict in an installed tree: pip remedy", conflict(["apply"]), 2, "pip install --force-reinstall --no-deps --upgrade --target"),
        ("conflict in a git checkout: git remedy", as_checkout, 2, "checkout -- python/sglang"),
        ("no git on PATH", no_git, 2, "git was not found"),
        ("git binary that fails", failing_git, 2, "does not work (git --version exited 1: git: cannot load libpcre)"),
        ("git binary that crashes in apply", crashing_git, 2, "does not work (git apply exited -11)"),
        ("no sglang tree at --target", lambda r, t: ["status", "--target", str(t)], 2, "no sglang tree"),
        ("damaged journal", damaged_journal, 2, "is damaged"),
        ("file changed after a kill", changed_since_kill, 2, "matches neither side"),
        ("tree locked by another run", locked, 2, "another sglang-dcp-dspark is changing"),
        ("export --series ../../x", export_dotdot, 2, "is not a series name"),
        ("hardlinked target file", hardlinked, 0, "applied 4 patch(es)"),
        ("revert --series of another release", lambda r, t: ["revert", "--target", str(r), "--series", "upstream-pr-35221"], 2, "none of it is in the tree"),
        ("--series-dir naming a good series", lambda r, t: ["apply", "--target", str(r), "--series-dir", str(series_mod.patches_root() / SERIES)], 0, "applied 4 patch(es)"),
    ]


HELD: list[int] = []
CASES = hostile_cases()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_input(case, refs, tmp_path, capsys, monkeypatch):
    name, setup, expected_code, fragment = case
    monkeypatch.setenv("PATH", os.environ["PATH"])  # cases may change PATH; undone after
    tree = fresh(refs.stock, tmp_path / "tree")
    work = tmp_path / "work"
    work.mkdir()
    argv = setup(tree, work)
    before = root_state(tree)
    outside_before = {p: p.read_bytes() for p in work.rglob("*") if p.is_file()}
    try:
        code = main(argv)
    finally:
        while HELD:
            os.close(HELD.pop())
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert code == expected_code, (code, captured.err)
    if expected_code:
        assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
        assert fragment in captured.err, captured.err
        assert root_state(tree) == before
    else:
        assert fragment in captured.out, captured.out
    # Nothing outside the tree was written or deleted.
    assert {p: p.read_bytes() for p in work.rglob("*") if p.is_file()} == outside_before
    assert not list(tmp_path.parent.glob("evil*")) and not (tmp_path / "evil.py").exists()
    tally("hostile inputs")


def test_hardlinked_target_is_replaced_not_written_through(refs, tmp_path, capsys):
    tree = fresh(refs.stock, tmp_path / "tree")
    cache = tmp_path / "shared-cache-copy.py"
    os.link(tree / "sglang/srt/server_args.py", cache)
    stock = cache.read_bytes()
    assert main(["apply", "--target", str(tree)]) == 0
    assert cache.read_bytes() == stock and os.stat(cache).st_nlink == 1
    assert root_state(tree) == refs.patched_state
    tally("hostile inputs")


def test_closed_stdout_is_one_line_and_exit_141(refs, tmp_path):
    """``status | head -1`` with head gone before status writes: no BrokenPipeError traceback."""
    tree = fresh(refs.stock, tmp_path / "tree")
    cli = Path(sys.executable).with_name("sglang-dcp-dspark")
    proc = subprocess.Popen([str(cli), "status", "--target", str(tree)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before anything is written
    err = proc.communicate(timeout=60)[1].decode()
    assert proc.returncode == 141, err
    assert err.count("\n") == 1 and "broken pipe" in err and "Traceback" not in err, err
    tally("hostile inputs")


def test_interrupted_run_is_finished_by_the_same_command(refs, tmp_path):
    """A SIGKILL while files move: apply again finishes it, and says so in one line."""
    ops = points("apply", refs.stock, tmp_path)
    second_move = [i for i, op, path in ops if op == "replace"][1]
    tree = fresh(refs.stock, tmp_path / "tree")
    assert fork_cli(["apply", "--target", str(tree)], tmp_path / "run", root=tree, nth=second_move).signal == signal.SIGKILL
    outcome = fork_cli(["apply", "--target", str(tree)], tmp_path / "again")
    outcome.assert_clean(0)
    assert re.search(r"recovered: finished the interrupted apply of sglang-0.5.17 \(3 of 4 files were still to move\)", outcome.err), outcome.err
    assert "already applied" in outcome.out
    assert root_state(tree) == refs.patched_state


def test_summary():
    """Prints the tally of this module's cases (run with -s to see it); every row counted passed."""
    print("\n" + "\n".join(f"  {row:<48} {n:>4}" for row, n in sorted(TALLY.items())))
