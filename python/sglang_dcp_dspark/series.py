"""Patch series: inspect, apply and revert them all-or-nothing, and export them.

A series is a directory under ``patches/`` holding ``git format-patch`` files
and a ``series`` file that lists them in order. Header comments in ``series``
say which sglang releases it applies to and which release fixed it upstream::

    # applies-to: ==0.5.17
    # fixed-upstream: 0.5.18
    0001-....patch

Every operation works on a staging copy of the files the series touches and
only writes to the sglang tree once the whole series has applied there, so a
failure leaves the tree byte-identical. Whether a series is applied is decided
the way patch-package does it: by dry-running it forward and in reverse.
"""

from __future__ import annotations

import enum
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from .compat import SglangTree, locate_tree, parse_version
from .errors import DcpDsparkError

_DIFF_RE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)
_HEADER_RE = re.compile(r"^#\s*([a-z-]+):\s*(.+?)\s*$")

# Stable export, as Electron does it: no commit ids, stats or signatures to churn.
FORMAT_PATCH_FLAGS = (
    "--keep-subject",
    "--no-stat",
    "--no-signature",
    "--zero-commit",
    "--full-index",
    "--no-numbered",
    "--encoding=UTF-8",
)


def patches_root() -> Path:
    """Series shipped in the wheel, or the repository's ``patches/`` in a checkout."""
    override = os.environ.get("SGLANG_DCP_DSPARK_PATCHES")
    candidates = [Path(override)] if override else []
    here = Path(__file__).resolve().parent
    candidates += [here / "patches", here.parents[1] / "patches"]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise DcpDsparkError(
        "no patch series found next to sglang_dcp_dspark; expected a patches/ directory; "
        "fix: pip install --force-reinstall sglang-dcp-dspark"
    )


@dataclass(frozen=True)
class Patch:
    path: Path
    files: tuple[str, ...]  # as named in the patch: python/sglang/...

    @property
    def name(self) -> str:
        return self.path.stem


@dataclass(frozen=True)
class Series:
    name: str
    directory: Path
    patches: tuple[Patch, ...]
    applies_to: SpecifierSet
    fixed_upstream: str | None

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(sorted({f for p in self.patches for f in p.files}))

    def tree_files(self, tree: SglangTree) -> tuple[str, ...]:
        """The series' files that exist in this kind of tree (an installed tree has no tests)."""
        if tree.layout == "checkout":
            return self.files
        return tuple(f for f in self.files if f.startswith("python/sglang/"))

    def targets(self, version: str | None) -> bool:
        parsed = parse_version(version)
        return parsed is not None and self.applies_to.contains(parsed, prereleases=True)

    def fixed_in(self, version: str | None) -> bool:
        parsed = parse_version(version)
        fixed = parse_version(self.fixed_upstream)
        return parsed is not None and fixed is not None and parsed >= fixed


def available_series() -> list[str]:
    root = patches_root()
    return sorted(p.parent.name for p in root.glob("*/series"))


def load_series(name: str) -> Series:
    directory = patches_root() / name
    listing = directory / "series"
    if not listing.is_file():
        known = ", ".join(available_series()) or "none"
        raise DcpDsparkError(
            f"unknown series {name!r}; expected one of: {known}; fix: sglang-dcp-dspark status"
        )
    headers: dict[str, str] = {}
    patches: list[Patch] = []
    for line in listing.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            match = _HEADER_RE.match(line)
            if match:
                headers[match.group(1)] = match.group(2)
            continue
        path = directory / line
        if not path.is_file():
            raise DcpDsparkError(
                f"series {name} lists {line} but the file is missing; expected it in {directory}; "
                "fix: reinstall sglang-dcp-dspark or regenerate with sglang-dcp-dspark export"
            )
        text = path.read_text(encoding="utf-8")
        files = tuple(dict.fromkeys(m.group(2) for m in _DIFF_RE.finditer(text)))
        patches.append(Patch(path=path, files=files))
    try:
        applies_to = SpecifierSet(headers.get("applies-to", ""))
    except InvalidSpecifier as exc:
        raise DcpDsparkError(f"series {name} has a bad applies-to header: {exc}") from None
    return Series(
        name=name,
        directory=directory,
        patches=tuple(patches),
        applies_to=applies_to,
        fixed_upstream=headers.get("fixed-upstream"),
    )


class State(enum.Enum):
    APPLICABLE = "applicable"
    APPLIED = "applied"
    PARTIAL = "partially applied"
    FIXED_UPSTREAM = "fixed upstream"
    CONFLICT = "conflict"


@dataclass(frozen=True)
class Status:
    series: Series
    tree: SglangTree
    state: State
    applied: int  # how many leading patches are in the tree

    def line(self) -> str:
        s = self.series
        if self.state is State.PARTIAL:
            detail = f"{self.applied} of {len(s.patches)} patches in the tree"
        elif self.state is State.FIXED_UPSTREAM:
            detail = f"sglang {s.fixed_upstream} and later carry the fix"
        elif self.state is State.CONFLICT and not s.targets(self.tree.version):
            detail = f"series targets sglang{s.applies_to}, this tree is {self.tree.version or 'of unknown version'}"
        elif self.state is State.CONFLICT:
            detail = "neither applies nor reverts: the files differ from the release"
        else:
            detail = f"{len(s.patches)} patches, targets sglang{s.applies_to}"
        return f"{s.name:<22} {self.state.value:<18} {detail}"


def require_git() -> str:
    git = shutil.which("git")
    if git is None:
        raise DcpDsparkError(
            "git was not found on PATH; expected git to apply patch series; fix: apt-get install git"
        )
    return git


class _Staging:
    """A scratch copy of the series' files, laid out as in the tree, for git apply."""

    def __init__(self, tree: SglangTree, series: Series) -> None:
        self.tree = tree
        self.series = series
        self._dir = tempfile.TemporaryDirectory(prefix="sglang-dcp-dspark-")
        self.root = Path(self._dir.name)
        for name in series.tree_files(tree):
            source = tree.path_of(name)
            if source.is_file():
                dest = self.root / source.relative_to(tree.root)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, dest)

    def __enter__(self) -> "_Staging":
        return self

    def __exit__(self, *exc) -> None:
        self._dir.cleanup()

    def _git_apply_one(self, root: Path, patch: Patch, reverse: bool) -> subprocess.CompletedProcess:
        args = [require_git(), "apply", f"-p{self.tree.strip}"]
        if self.tree.layout == "installed":
            args.append("--include=sglang/*")
        if reverse:
            args.append("-R")
        args.append(str(patch.path))
        env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(root.parent), LC_ALL="C")
        return subprocess.run(args, cwd=root, env=env, capture_output=True, text=True)

    def git_apply(self, patches, *, reverse: bool = False, check: bool = False) -> subprocess.CompletedProcess:
        """Apply patches in order (-R: last first), one ``git apply`` each; the first failure stops.

        One ``git apply`` given several patches does not chain a third change to
        the same file onto the first two, so each patch gets its own run. With
        ``check`` they run on a throwaway copy and staging stays as it was.
        """
        scratch = tempfile.TemporaryDirectory(prefix="sglang-dcp-dspark-check-") if check else None
        root = self.root
        try:
            if scratch is not None:
                root = Path(scratch.name)
                shutil.copytree(self.root, root, dirs_exist_ok=True)
            result = subprocess.CompletedProcess([], 0, "", "")
            for patch in (list(reversed(patches)) if reverse else list(patches)):
                result = self._git_apply_one(root, patch, reverse)
                if result.returncode != 0:
                    break
            return result
        finally:
            if scratch is not None:
                scratch.cleanup()

    def applies(self, patches, *, reverse: bool = False) -> bool:
        return not patches or self.git_apply(patches, reverse=reverse, check=True).returncode == 0

    def contents(self) -> dict[Path, bytes | None]:
        """New bytes for every series file in the tree; None where the series deletes it."""
        result: dict[Path, bytes | None] = {}
        for name in self.series.tree_files(self.tree):
            staged = self.root / self.tree.path_of(name).relative_to(self.tree.root)
            result[self.tree.path_of(name)] = staged.read_bytes() if staged.is_file() else None
        return result


def inspect(tree: SglangTree, series: Series) -> Status:
    patches = series.patches
    with _Staging(tree, series) as staging:
        if staging.applies(patches):
            return Status(series, tree, State.APPLICABLE, 0)
        if staging.applies(patches, reverse=True):
            state = State.FIXED_UPSTREAM if series.fixed_in(tree.version) else State.APPLIED
            return Status(series, tree, state, len(patches))
        for k in range(len(patches) - 1, 0, -1):
            if staging.applies(patches[:k], reverse=True) and staging.applies(patches[k:]):
                return Status(series, tree, State.PARTIAL, k)
    state = State.FIXED_UPSTREAM if series.fixed_in(tree.version) else State.CONFLICT
    return Status(series, tree, state, 0)


def _first_failing(staging: _Staging, patches) -> tuple[Patch, str]:
    """Which patch of a failing run breaks first, and git's complaint about it."""
    for i, patch in enumerate(patches):
        result = staging.git_apply(patches[: i + 1], check=True)
        if result.returncode != 0:
            errors = [l for l in result.stderr.splitlines() if l.startswith("error:")]
            return patch, (errors[0] if errors else result.stderr.strip()).removeprefix("error: ")
    return patches[-1], "unknown failure"


def _write_all(contents: dict[Path, bytes | None], action: str) -> None:
    """Write every file or none: check writability first, roll back on any error."""
    for path, data in contents.items():
        probe = path if path.exists() else path.parent
        while not probe.exists():
            probe = probe.parent
        if not os.access(probe, os.W_OK) or (not path.exists() and not os.access(probe, os.W_OK | os.X_OK)):
            raise DcpDsparkError(
                f"cannot {action}: {probe} is read-only; expected a writable sglang tree; "
                f"fix: rerun as its owner (e.g. sudo sglang-dcp-dspark {action} --target ...) or "
                "install sglang into a writable environment"
            )
    originals = {path: (path.read_bytes() if path.exists() else None) for path in contents}
    written: list[Path] = []
    try:
        for path, data in contents.items():
            if data == originals[path]:
                continue
            written.append(path)
            if data is None:
                path.unlink()
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
    except OSError as exc:
        for path in written:
            before = originals[path]
            if before is None:
                path.unlink(missing_ok=True)
            else:
                path.write_bytes(before)
        raise DcpDsparkError(
            f"cannot {action}: writing {exc.filename} failed ({exc.strerror}); the tree was restored; "
            f"fix: make the sglang tree writable and rerun sglang-dcp-dspark {action}"
        ) from None


def apply(tree: SglangTree, series: Series) -> str:
    """Apply the rest of a series; returns a one-line report."""
    require_git()
    status = inspect(tree, series)
    if status.state is State.APPLIED:
        return f"{series.name}: already applied to {tree.describe()}; nothing to do"
    if status.state is State.FIXED_UPSTREAM:
        return f"{series.name}: {tree.describe()} already carries the fix (since {series.fixed_upstream}); nothing to do"
    if tree.version is not None and not series.targets(tree.version):
        raise DcpDsparkError(
            f"series {series.name} targets sglang{series.applies_to} but found sglang {tree.version} "
            f"at {tree.package}; fix: pip install 'sglang{series.applies_to}' or use the plugin "
            "(see sglang-dcp-dspark status)"
        )
    pending = series.patches[status.applied :]
    with _Staging(tree, series) as staging:
        if status.state is State.CONFLICT:
            patch, why = _first_failing(staging, pending)
            raise DcpDsparkError(
                f"patch {patch.name} does not apply to {tree.describe()} ({why}); expected unmodified "
                f"sglang{series.applies_to}; fix: pip install --force-reinstall --no-deps "
                f"'sglang{series.applies_to}' and rerun sglang-dcp-dspark apply"
            )
        result = staging.git_apply(pending)
        if result.returncode != 0:  # inspect() said it applies; anything else is a bug or a race
            raise DcpDsparkError(f"git apply failed in staging: {result.stderr.strip().splitlines()[0]}")
        _write_all(staging.contents(), "apply")
    after = inspect(tree, series)
    # A series in upstream's own form turns its base into exactly what the
    # fixed release shipped, so a full apply may read as "fixed upstream":
    # what counts is that the whole series now reverts.
    if after.applied != len(series.patches):
        revert(tree, series)
        raise DcpDsparkError(
            f"{series.name}: tree reads as {after.state.value} after applying; it was reverted; "
            "fix: report this with the output of sglang-dcp-dspark status"
        )
    return f"{series.name}: applied {len(pending)} patch(es) to {tree.describe()}"


def revert(tree: SglangTree, series: Series) -> str:
    """Undo whatever part of a series is in the tree; returns a one-line report."""
    require_git()
    status = inspect(tree, series)
    if status.state is State.APPLICABLE:
        return f"{series.name}: not applied to {tree.describe()}; nothing to revert"
    if status.state is State.FIXED_UPSTREAM:
        return f"{series.name}: {tree.describe()} carries the fix upstream; nothing of ours to revert"
    if status.state is State.CONFLICT:
        raise DcpDsparkError(
            f"{series.name} cannot be reverted from {tree.describe()}: its files match neither the "
            f"stock nor the patched sources; fix: pip install --force-reinstall --no-deps 'sglang{series.applies_to}'"
        )
    with _Staging(tree, series) as staging:
        result = staging.git_apply(series.patches[: status.applied], reverse=True)
        if result.returncode != 0:
            raise DcpDsparkError(f"git apply -R failed in staging: {result.stderr.strip().splitlines()[0]}")
        _write_all(staging.contents(), "revert")
    return f"{series.name}: reverted {status.applied} patch(es) from {tree.describe()}"


def export(repo: Path, base: str, series_name: str, *, out_dir: Path | None = None) -> list[Path]:
    """Re-export ``base..HEAD`` of a working branch as the named series.

    Writes the patches and the ``series`` listing (keeping its header comments)
    into ``out_dir`` (default: the series' own directory) and returns the files
    written. Output depends only on the commits, so a re-export of unchanged
    commits is byte-identical: CI compares it with what is committed.
    """
    git = require_git()
    target = out_dir or (patches_root() / series_name)
    listing = patches_root() / series_name / "series"
    header = [l for l in listing.read_text(encoding="utf-8").splitlines() if l.startswith("#")] if listing.is_file() else []
    with tempfile.TemporaryDirectory(prefix="sglang-dcp-dspark-export-") as tmp:
        result = subprocess.run(
            [git, "-c", "core.abbrev=40", "format-patch", *FORMAT_PATCH_FLAGS, "-o", tmp, f"{base}..HEAD"],
            cwd=repo,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise DcpDsparkError(
                f"git format-patch {base}..HEAD failed in {repo}: {result.stderr.strip().splitlines()[-1]}; "
                "expected a git checkout with the series committed on top of BASE; fix: pass --repo and --base"
            )
        produced = sorted(Path(tmp).glob("*.patch"))
        if not produced:
            raise DcpDsparkError(f"no commits in {base}..HEAD of {repo}; expected the series' commits; fix: check --base")
        target.mkdir(parents=True, exist_ok=True)
        for old in target.glob("*.patch"):
            old.unlink()
        written = []
        for patch in produced:
            dest = target / patch.name
            shutil.copyfile(patch, dest)
            written.append(dest)
    (target / "series").write_text("\n".join(header + [p.name for p in written]) + "\n", encoding="utf-8")
    return written + [target / "series"]


# Identity and date for commits this tool makes, so that a working branch and
# its re-export depend on nothing but the files.
_AUTHOR = ("sglang-dcp-dspark", "sglang-dcp-dspark@users.noreply.github.com")
_DATE = "2026-11-29T00:00:00+0000"


def _git_env() -> dict[str, str]:
    name, email = _AUTHOR
    return dict(
        os.environ,
        GIT_AUTHOR_NAME=name,
        GIT_AUTHOR_EMAIL=email,
        GIT_COMMITTER_NAME=name,
        GIT_COMMITTER_EMAIL=email,
        GIT_AUTHOR_DATE=_DATE,
        GIT_COMMITTER_DATE=_DATE,
        LC_ALL="C",
    )


def _require_empty(out: Path, verb: str) -> None:
    if out.exists() and any(out.iterdir()):
        raise DcpDsparkError(
            f"{out} is not empty; expected a new or empty directory for {verb}; "
            f"fix: rm -rf {out} and rerun sglang-dcp-dspark {verb}"
        )


def reconstruct_base(source: SglangTree, series: Series, out: Path) -> str:
    """Rebuild the tree that a series in upstream's form was written against.

    ``source`` is the release that shipped the series (for upstream-pr-35221,
    sglang 0.5.18). It is copied to ``out`` and the series is reversed there
    with ``git apply -R``; nothing is edited by hand, so the base is the release
    minus exactly upstream's hunks. ``revert`` cannot do this: on the release
    the series reads as "fixed upstream", which is not ours to undo.
    """
    require_git()
    out = Path(out)
    _require_empty(out, "base")
    with _Staging(source, series) as staging:
        if not staging.applies(series.patches, reverse=True):
            raise DcpDsparkError(
                f"series {series.name} does not reverse-apply to {source.describe()}; expected the release "
                f"that shipped it (sglang {series.fixed_upstream}); fix: pip install --no-deps --target DIR "
                f"'sglang=={series.fixed_upstream}' and pass --from DIR"
            )
    skip = shutil.ignore_patterns("__pycache__")
    if source.layout == "installed":
        shutil.copytree(source.package, out / "sglang", ignore=skip)
        for meta in source.root.glob("sglang-*.dist-info"):
            shutil.copytree(meta, out / meta.name)
    else:
        shutil.copytree(source.package, out / "python" / "sglang", ignore=skip)
        extras = [f for f in series.tree_files(source) if not f.startswith("python/sglang/")]
        for name in extras + ["python/pyproject.toml"]:
            if (source.root / name).is_file():
                (out / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source.root / name, out / name)
    base = locate_tree(out)
    with _Staging(base, series) as staging:
        result = staging.git_apply(series.patches, reverse=True)
        if result.returncode != 0:  # checked above on the same bytes; anything else is a bug
            raise DcpDsparkError(f"git apply -R failed in staging: {result.stderr.strip().splitlines()[0]}")
        _write_all(staging.contents(), "base")
    return f"{series.name}: base rebuilt at {base.package} from {source.describe()}, {len(series.patches)} patch(es) reversed"


def workbench(base: SglangTree, series: Series, repo: Path) -> str:
    """A git working branch for a series; returns the base commit to pass to ``export``.

    The series' files as they are in ``base`` are committed as the base, then
    the series is ``git am``ed on top, so the branch holds one commit per patch
    to edit (``git rebase -i``) before re-exporting. Commits carry a fixed
    identity and date: re-exporting an untouched branch reproduces the
    committed files byte for byte, which is what CI checks.
    """
    git = require_git()
    repo = Path(repo)
    _require_empty(repo, "workbench")
    repo.mkdir(parents=True, exist_ok=True)
    env = _git_env()

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([git, "-c", "commit.gpgsign=false", *args], cwd=repo, env=env, capture_output=True, text=True)

    run("init", "-q", "-b", "main")
    for name in series.files:
        source = base.path_of(name)
        if source.is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, repo / name)
    run("add", "-A")
    run("commit", "-q", "--allow-empty", "-m", f"base of {series.name}: {base.describe()}")
    rev = run("rev-parse", "HEAD").stdout.strip()
    result = run("am", "-q", "--keep", "--committer-date-is-author-date", *[str(p.path) for p in series.patches])
    if result.returncode != 0:
        first = (result.stderr.strip() or result.stdout.strip() or "git am failed").splitlines()[0]
        raise DcpDsparkError(
            f"series {series.name} does not git-am onto {base.describe()} ({first}); expected the tree it "
            f"was written against; fix: sglang-dcp-dspark base --series {series.name} --from DIR --out BASE "
            "and pass --from BASE"
        )
    return rev
