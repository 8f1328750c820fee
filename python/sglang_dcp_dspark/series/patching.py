"""Inspect an sglang tree for a series, and apply or revert it all-or-nothing.

Every operation works on a staging copy of the files the series touches and
only writes to the sglang tree once the whole series has applied there; the
write itself goes through ``journal.commit`` (all files or none, even under
SIGKILL). Whether a series is applied is decided the way patch-package does
it: by dry-running it forward and in reverse. What a series is, and how it is
read and checked, is :mod:`series`.
"""

from __future__ import annotations

import enum
import functools
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..core.compat import SglangTree
from ..core.errors import DcpDsparkError
from . import RECORD, Patch, Series, available_series, journal, load_series


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
    recorded: bool = False  # this tool applied the whole series and the files are as it left them

    def line(self) -> str:
        s = self.series
        if self.state is State.PARTIAL:
            detail = f"{self.applied} of {len(s.patches)} patches in the tree"
        elif self.state is State.FIXED_UPSTREAM and self.recorded:
            detail = "applied by sglang-dcp-dspark (the files now read as the fixed release); revert undoes it"
        elif self.state is State.FIXED_UPSTREAM:
            detail = f"sglang {s.fixed_upstream} and later carry the fix"
        elif self.state is State.CONFLICT and not s.targets(self.tree.version):
            detail = f"series targets sglang{s.applies_to}, this tree is {self.tree.version or 'of unknown version'}"
        elif self.state is State.CONFLICT:
            detail = "neither applies nor reverts: the files differ from the release"
        else:
            detail = f"{len(s.patches)} patches, targets sglang{s.applies_to}"
        return f"{s.name:<22} {self.shown:<18} {detail}"

    @property
    def shown(self) -> str:
        """The state as status prints it: a series written for another release is not in conflict with this tree."""
        if self.state is State.CONFLICT and not self.series.targets(self.tree.version):
            return "other release"
        return self.state.value


@functools.cache
def _git_problem(git: str, stamp: int) -> str | None:
    """Why this git binary cannot be used, or None; ``stamp`` (its mtime) re-checks a replaced binary."""
    try:
        result = subprocess.run([git, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if result.returncode != 0 or not result.stdout.startswith("git version"):
        said = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[0]
        return f"git --version exited {result.returncode}: {said}"
    return None


def _git_error(git: str, why: str) -> DcpDsparkError:
    return DcpDsparkError(
        f"git at {git} does not work ({why}); nothing in the sglang tree was changed; expected a working git "
        "to apply patch series; fix: reinstall git (apt-get install --reinstall git) or put a working git first on PATH"
    )


def require_git() -> str:
    git = shutil.which("git")
    if git is None:
        raise DcpDsparkError(
            "git was not found on PATH; nothing in the sglang tree was changed; expected git to apply patch "
            "series; fix: apt-get install git"
        )
    try:
        stamp = os.stat(git).st_mtime_ns
    except OSError:
        stamp = 0
    problem = _git_problem(git, stamp)
    if problem:
        raise _git_error(git, problem)
    return git


# What git says when the staging directory, not the patch, is the problem.
_STAGING_FAULTS = ("No space left on device", "Disk quota exceeded", "Read-only file system", "Permission denied")


def _staging_error(why: str) -> DcpDsparkError:
    return DcpDsparkError(
        f"cannot stage the series in {tempfile.gettempdir()} ({why}); nothing in the sglang tree was changed; "
        "expected room for a copy of the series' files there; fix: free space there or set TMPDIR to a "
        "directory with room, and rerun"
    )


def temporary_directory(prefix: str) -> tempfile.TemporaryDirectory:
    try:
        return tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True)
    except OSError as exc:
        raise _staging_error(exc.strerror or str(exc)) from None


class Staging:
    """A scratch copy of the series' files, laid out as in the tree, for git apply."""

    def __init__(self, tree: SglangTree, series: Series) -> None:
        self.tree = tree
        self.series = series
        self._dir = temporary_directory("sglang-dcp-dspark-")
        self.root = Path(self._dir.name)
        self.originals: dict[str, bytes | None] = {}
        try:
            for name in series.tree_files(tree):
                source = tree.path_of(name)
                rel = str(source.relative_to(tree.root))
                self.originals[rel] = None
                if source.is_file():
                    data = source.read_bytes()
                    self.originals[rel] = data
                    dest = self.root / rel
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(data)
        except OSError as exc:
            self._dir.cleanup()
            if exc.filename and str(exc.filename).startswith(str(tree.root)):
                raise DcpDsparkError(
                    f"cannot read {exc.filename}: {exc.strerror}; expected a readable sglang tree; "
                    f"fix: {tree.restore_hint()}"
                ) from None
            raise _staging_error(exc.strerror or str(exc)) from None

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *exc) -> None:
        self._dir.cleanup()

    def _git_apply_one(self, root: Path, patch: Patch, reverse: bool) -> subprocess.CompletedProcess:
        git = require_git()
        args = [git, "apply", f"-p{self.tree.strip}"]
        if self.tree.layout == "installed":
            args.append("--include=sglang/*")
        if reverse:
            args.append("-R")
        args.append(str(patch.path))
        env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(root.parent), LC_ALL="C")
        try:
            result = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, errors="replace")
        except OSError as exc:
            raise _git_error(git, exc.strerror or str(exc)) from None
        # A git that dies by a signal, or cannot be run, says nothing about the patch.
        if result.returncode < 0 or result.returncode in (126, 127):
            raise _git_error(git, f"git apply exited {result.returncode}")
        fault = next((f for f in _STAGING_FAULTS if f in result.stderr), None)
        if result.returncode != 0 and fault:
            raise _staging_error(fault)
        return result

    def git_apply(self, patches, *, reverse: bool = False, check: bool = False) -> subprocess.CompletedProcess:
        """Apply patches in order (-R: last first), one ``git apply`` each; the first failure stops.

        One ``git apply`` given several patches does not chain a third change to
        the same file onto the first two, so each patch gets its own run. With
        ``check`` they run on a throwaway copy and staging stays as it was.
        """
        scratch = temporary_directory("sglang-dcp-dspark-check-") if check else None
        root = self.root
        try:
            if scratch is not None:
                root = Path(scratch.name)
                try:
                    shutil.copytree(self.root, root, dirs_exist_ok=True)
                except (OSError, shutil.Error) as exc:
                    raise _staging_error(getattr(exc, "strerror", None) or "copying the staging files failed") from None
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

    def changes(self) -> list[journal.Change]:
        """Every series file of the tree as it was copied and as staging has it now."""
        result = []
        for rel, before in self.originals.items():
            staged = self.root / rel
            try:
                after = staged.read_bytes() if staged.is_file() else None
            except OSError as exc:
                raise _staging_error(exc.strerror or str(exc)) from None
            result.append(journal.Change(rel, before, after))
        return result


def _read_record(tree: SglangTree) -> dict:
    path = tree.root / RECORD
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # absent, or not ours to trust: as if nothing had been recorded
    return record.get("series", {}) if isinstance(record, dict) else {}


def _record_change(tree: SglangTree, series: Series, after: dict[str, bytes | None] | None) -> journal.Change:
    """The record file as it is, and with ``series`` entered (``after`` given) or removed."""
    path = tree.root / RECORD
    before = path.read_bytes() if path.is_file() else None
    entries = dict(_read_record(tree))
    entries.pop(series.name, None)
    if after is not None:
        entries[series.name] = {"files": {rel: journal.sha256(data) for rel, data in sorted(after.items())}}
    data = (json.dumps({"format": 1, "series": entries}, indent=1, sort_keys=True) + "\n").encode() if entries else None
    return journal.Change(RECORD, before, data)


def _recorded(tree: SglangTree, series: Series) -> bool:
    entry = _read_record(tree).get(series.name)
    if not isinstance(entry, dict) or not isinstance(entry.get("files"), dict) or not entry["files"]:
        return False
    return all(journal.digest_of(tree.root / rel) == digest for rel, digest in entry["files"].items())


def inspect(tree: SglangTree, series: Series) -> Status:
    patches = series.patches
    with Staging(tree, series) as staging:
        if staging.applies(patches):
            return Status(series, tree, State.APPLICABLE, 0)
        if staging.applies(patches, reverse=True):
            if series.fixed_in(tree.version):
                return Status(series, tree, State.FIXED_UPSTREAM, len(patches), _recorded(tree, series))
            return Status(series, tree, State.APPLIED, len(patches))
        for k in range(len(patches) - 1, 0, -1):
            if staging.applies(patches[:k], reverse=True) and staging.applies(patches[k:]):
                return Status(series, tree, State.PARTIAL, k)
    state = State.FIXED_UPSTREAM if series.fixed_in(tree.version) else State.CONFLICT
    return Status(series, tree, state, 0)


def recover(tree: SglangTree, *, action: str | None = None, series: str | None = None) -> str | None:
    """Finish or undo an operation a kill left half done (see ``journal``); the line saying which, or None.

    The same command as the interrupted one finishes it; anything else,
    ``status`` included, undoes it.
    """
    with journal.locked(tree.root):
        return journal.recover(tree.root, intent=(action, series) if action else None)


def _first_failing(staging: Staging, patches) -> tuple[Patch, str]:
    """Which patch of a failing run breaks first, and git's complaint about it."""
    for i, patch in enumerate(patches):
        result = staging.git_apply(patches[: i + 1], check=True)
        if result.returncode != 0:
            errors = [e for e in result.stderr.splitlines() if e.startswith("error:")]
            return patch, (errors[0] if errors else result.stderr.strip()).removeprefix("error: ")
    return patches[-1], "unknown failure"


@dataclass(frozen=True)
class Outcome:
    """What ``apply`` or ``revert`` did to a tree, in one line; ``note``: the line of the killed run it finished or
    undid first (None: there was none)."""

    line: str
    note: str | None = None


def _locked(action: str, body: Callable[[SglangTree, Series], str], tree: SglangTree, series: Series) -> Outcome:
    """``body`` under the tree's journal lock, after recovering whatever a killed run left."""
    require_git()
    with journal.locked(tree.root):
        note = recover(tree, action=action, series=series.name)
        return Outcome(body(tree, series), note)


def apply(tree: SglangTree, series: Series) -> Outcome:
    """Apply the rest of a series; its line (and the recovery's, after a killed run)."""
    return _locked("apply", _apply, tree, series)


def _apply(tree: SglangTree, series: Series) -> str:
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
    with Staging(tree, series) as staging:
        if status.state is State.CONFLICT:
            patch, why = _first_failing(staging, pending)
            raise DcpDsparkError(
                f"patch {patch.name} does not apply to {tree.describe()} ({why}); expected unmodified "
                f"sglang{series.applies_to}; fix: {tree.restore_hint(str(series.applies_to))} and rerun "
                "sglang-dcp-dspark apply"
            )
        result = staging.git_apply(pending)
        if result.returncode != 0:  # inspect() said it applies; anything else is a bug or a race
            raise DcpDsparkError(f"git apply failed in staging: {(result.stderr.strip() or 'no output').splitlines()[0]}")
        # Checked here, before the tree is touched: the whole series must now
        # reverse-apply. (A series in upstream's form turns its base into what
        # the fixed release shipped, so the tree may then read "fixed upstream".)
        if not staging.applies(series.patches, reverse=True):
            raise DcpDsparkError(
                f"{series.name}: the staged result does not reverse-apply; nothing in the tree was changed; "
                "fix: report this with the output of sglang-dcp-dspark status"
            )
        changes = staging.changes()
    changes.append(_record_change(tree, series, {c.rel: c.after for c in changes}))
    journal.commit(tree.root, changes, action="apply", series=series.name, verb="apply")
    return f"{series.name}: applied {len(pending)} patch(es) to {tree.describe()}"


def revert(tree: SglangTree, series: Series) -> Outcome:
    """Undo whatever part of a series is in the tree; its line (and the recovery's, after a killed run)."""
    return _locked("revert", _revert, tree, series)


def _revert(tree: SglangTree, series: Series) -> str:
    status = inspect(tree, series)
    applied = status.applied
    if status.state is State.APPLICABLE:
        return f"{series.name}: not applied to {tree.describe()}; nothing to revert"
    if status.state is State.FIXED_UPSTREAM and not status.recorded:
        return f"{series.name}: {tree.describe()} carries the fix upstream; nothing of ours to revert"
    if status.state is State.CONFLICT and tree.version is not None and not series.targets(tree.version):
        raise DcpDsparkError(
            f"series {series.name} targets sglang{series.applies_to} but {tree.describe()} is another release, "
            "so none of it is in the tree to revert; fix: sglang-dcp-dspark status lists the series for this tree"
        )
    if status.state is State.CONFLICT:
        raise DcpDsparkError(
            f"{series.name} cannot be reverted from {tree.describe()}: its files match neither the "
            f"stock nor the patched sources; fix: {tree.restore_hint(str(series.applies_to))}"
        )
    with Staging(tree, series) as staging:
        result = staging.git_apply(series.patches[:applied], reverse=True)
        if result.returncode != 0:
            raise DcpDsparkError(f"git apply -R failed in staging: {(result.stderr.strip() or 'no output').splitlines()[0]}")
        changes = staging.changes()
    changes.append(_record_change(tree, series, None))
    journal.commit(tree.root, changes, action="revert", series=series.name, verb="revert")
    return f"{series.name}: reverted {applied} patch(es) from {tree.describe()}"


def revert_found(tree: SglangTree):
    """``revert`` with no series named: undo every series found in the tree, yielding one :class:`Outcome` each.

    A series meant for this release whose files match neither side is an
    error, not something to skip in silence; it is raised after the others
    are reverted, so the lines already yielded stay true.
    """
    reverted, conflicts = 0, []
    for name in available_series():
        series = load_series(name)
        status = inspect(tree, series)
        if status.state in (State.APPLIED, State.PARTIAL) or status.recorded:
            yield revert(tree, series)
            reverted += 1
        elif status.state is State.CONFLICT and series.targets(tree.version):
            conflicts.append(series)
    if conflicts:
        names = ", ".join(s.name for s in conflicts)
        raise DcpDsparkError(
            f"{names} cannot be reverted from {tree.describe()}: its files match neither the stock nor the "
            f"patched sources{'; ' + str(reverted) + ' other series reverted' if reverted else ''}; "
            f"fix: {tree.restore_hint(str(conflicts[0].applies_to))}"
        )
    if not reverted:
        yield Outcome(f"nothing to revert: no series is applied to {tree.describe()}")
