"""Crash-safe writes into an sglang tree: a journal first, then one rename per file.

Modelled on git's lockfile and dpkg's journal. Before the first file of the
tree moves, the bytes of every file before and after the operation are
written into a journal directory at the tree's root and fsynced; the journal
appears under its final name by a single rename, so it is either complete or
absent. Each file is then replaced by renaming a file from its own directory
over it, so a reader, or a kill, finds the old file or the new one, never part
of either, and a hardlinked target gets a new inode instead of being written
through. The journal is removed once every file is in place: that is the
commit point.

Whatever runs next on the tree (``recover``) finds a journal left by a kill and
puts the whole tree on one side of it: forward when it is the same command
again, back otherwise. SIGINT and SIGTERM are held while files move and roll
the operation back.

Layout, at the tree root (the ``--target`` directory)::

    .sglang-dcp-dspark-journal/
        journal.json      {"format": 1, "action": "apply", "series": NAME,
                           "files": [{"path": "sglang/srt/x.py",
                                      "before": SHA256 or null,
                                      "after": SHA256 or null, "mode": 420}]}
        0.before 0.after  the bytes of files[0] (absent where the digest is null)
        ...
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import signal
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..core.errors import DcpDsparkError

JOURNAL = ".sglang-dcp-dspark-journal"
# A journal still being written: nothing in the tree has moved yet.
_NEW = JOURNAL + ".new-"
# A file about to be renamed over its target, beside it.
_TMP = ".sglang-dcp-dspark-tmp"
FORMAT = 1
# Where a hardlink cannot be made (another filesystem, no hardlinks, too many
# links), the bytes are copied to the temporary file instead.
_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}


def sha256(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def digest_of(path: Path) -> str | None:
    return sha256(path.read_bytes()) if path.is_file() else None


@dataclass(frozen=True)
class Change:
    rel: str  # relative to the tree root, "/"-separated
    before: bytes | None  # None: the file does not exist
    after: bytes | None  # None: the operation deletes it


class _Stop(Exception):
    """A held signal arrived: stop moving files and put the tree back."""


class HeldSignals:
    """SIGINT and SIGTERM noted instead of acted on while the tree is between two consistent states.

    Python runs handlers between bytecodes of the main thread, so a handler
    that raises could land between a rename and its bookkeeping; holding the
    signal and checking at known points cannot.
    """

    def __init__(self) -> None:
        self.pending: int | None = None
        self._old: dict[int, object] = {}

    def __enter__(self) -> HeldSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._old[signum] = signal.signal(signum, self._hold)
        return self

    def _hold(self, signum, frame) -> None:
        if self.pending is None:
            self.pending = signum

    def check(self) -> None:
        if self.pending is not None:
            raise _Stop()

    @property
    def name(self) -> str:
        return signal.Signals(self.pending).name if self.pending else ""

    def __exit__(self, *exc) -> None:
        for signum, old in self._old.items():
            signal.signal(signum, old if old is not None else signal.SIG_DFL)


_held_locks: dict[str, int] = {}


@contextlib.contextmanager
def locked(root: Path):
    """One sglang-dcp-dspark at a time per tree: an flock on the tree's root directory.

    Taking it again in the same process is allowed (``apply`` recovers, then
    writes). Nothing is created for it, so it leaves no file behind.
    """
    key = str(root)
    if key in _held_locks:
        _held_locks[key] += 1
        try:
            yield
        finally:
            _held_locks[key] -= 1
        return
    fd = os.open(root, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DcpDsparkError(
                f"another sglang-dcp-dspark is changing {root}; expected one at a time per tree; "
                "fix: wait for it to finish, then rerun"
            ) from None
        except OSError:
            pass  # a filesystem without flock: go on unlocked rather than refuse
        _held_locks[key] = 1
        try:
            yield
        finally:
            del _held_locks[key]
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):  # filesystems that cannot sync a directory
            raise
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes, mode: int, owner: tuple[int, int] | None = None) -> None:
    """Create ``path`` with exactly these bytes and mode, on disk before it returns."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)  # the exact mode, whatever the umask
        if owner is not None and owner != (os.geteuid(), os.getegid()):
            os.fchown(fd, *owner)
        os.fsync(fd)
    except OSError as exc:
        exc.filename = exc.filename or str(path)  # os.write names no file; the message should
        raise
    finally:
        os.close(fd)


def _place(root: Path, rel: str, blob: Path | None) -> None:
    """Put the blob's bytes at ``root/rel`` by one rename (or delete it when ``blob`` is None)."""
    target = root / rel
    if blob is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(target)
        if target.parent.is_dir():
            _fsync_dir(target.parent)
        return
    if not target.parent.is_dir():
        target.parent.mkdir(parents=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}{_TMP}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    try:
        # The blob is already on disk; linking it needs no space, so a full
        # disk cannot stop a file from moving forward or back.
        os.link(blob, tmp)
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
        st = os.stat(blob)
        _write_file(tmp, blob.read_bytes(), st.st_mode & 0o7777)
    os.replace(tmp, target)
    _fsync_dir(target.parent)


def _clean_tmp(root: Path, rel: str) -> None:
    target = root / rel
    if target.parent.is_dir():
        for stray in target.parent.glob(f".{target.name}.*{_TMP}"):
            stray.unlink()


def write_journal(root: Path, changes: list[Change], action: str, series: str, held: HeldSignals | None = None) -> Path:
    """The journal of ``changes`` (each file's before and after, and the record), renamed into place whole: what
    a kill leaves for :func:`recover`. ``held``: the signals held meanwhile, checked between files."""
    held = held if held is not None else HeldSignals()
    new = Path(tempfile.mkdtemp(prefix=_NEW, dir=root))
    try:
        entries = []
        for i, change in enumerate(changes):
            target = root / change.rel
            st = target.stat() if target.is_file() else None
            mode = st.st_mode & 0o7777 if st else 0o644
            # Files keep their owner when root patches someone else's install.
            owner = (st.st_uid, st.st_gid) if st and os.geteuid() == 0 else None
            for side in ("before", "after"):
                data = getattr(change, side)
                if data is not None:
                    _write_file(new / f"{i}.{side}", data, mode, owner)
                held.check()
            entries.append({"path": change.rel, "before": sha256(change.before), "after": sha256(change.after), "mode": mode})
        record = {"format": FORMAT, "action": action, "series": series, "files": entries}
        _write_file(new / "journal.json", (json.dumps(record, indent=1) + "\n").encode(), 0o644)
        _fsync_dir(new)
        os.rename(new, root / JOURNAL)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    return root / JOURNAL


def _discard(journal: Path) -> None:
    """The commit point: once journal.json is gone, the operation has happened (or been undone)."""
    os.unlink(journal / "journal.json")
    _fsync_dir(journal)
    shutil.rmtree(journal, ignore_errors=True)


def _move(root: Path, journal: Path, entries: list[dict], side: str, held: HeldSignals | None = None) -> int:
    """Put every file of the journal on ``side``; returns how many had to move."""
    moved = 0
    for i, entry in enumerate(entries):
        if held is not None:
            held.check()
        _clean_tmp(root, entry["path"])
        if digest_of(root / entry["path"]) == entry[side]:
            continue
        blob = journal / f"{i}.{side}" if entry[side] is not None else None
        if blob is not None and digest_of(blob) != entry[side]:
            raise DcpDsparkError(
                f"the journal at {journal} is damaged: {blob.name} does not match its digest; expected the "
                f"bytes it recorded; fix: restore the tree by hand, then rm -rf {journal}"
            )
        _place(root, entry["path"], blob)
        moved += 1
    return moved


def _io_error(exc: OSError, root: Path, verb: str, outcome: str, size: int) -> DcpDsparkError:
    where = exc.filename or root
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DcpDsparkError(
            f"cannot {verb}: no space left on the filesystem holding {root} for the journal of the change "
            f"({size // 1024 + 1} KiB, old and new bytes of every file); {outcome}; "
            f"fix: free at least that much there and rerun sglang-dcp-dspark {verb}"
        )
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return DcpDsparkError(
            f"cannot {verb}: {where} is read-only ({exc.strerror}); {outcome}; expected a writable sglang tree; "
            f"fix: rerun as its owner (e.g. sudo sglang-dcp-dspark {verb} --target ...) or install sglang into "
            "a writable environment"
        )
    return DcpDsparkError(
        f"cannot {verb}: {exc.strerror} on {where}; {outcome}; fix: resolve that and rerun sglang-dcp-dspark {verb}"
    )


def check_targets(root: Path, rels, verb: str) -> None:
    """Refuse, before anything is written, any target that would take a write outside the tree.

    A symlinked file is refused even when it points inside the tree: files are
    replaced by rename, which would swap the link for a file and leave what it
    pointed to unpatched. A hardlinked file is replaced, not written through, so
    its other names keep the old bytes.
    """
    real_root = root.resolve()
    for rel in rels:
        parts = PurePosixPath(rel).parts
        if not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
            raise DcpDsparkError(f"refusing to {verb}: {rel!r} is not a path inside the tree; expected a relative path")
        path = root / rel
        parent = path.parent.resolve()
        if parent != real_root and real_root not in parent.parents:
            raise DcpDsparkError(
                f"refusing to {verb}: {path.parent} leads outside the tree (to {parent}); expected the sglang "
                f"files to lie inside {root}; fix: pass --target {parent.parent if parent.name else parent} "
                "or replace the link with a real directory"
            )
        if path.is_symlink():
            raise DcpDsparkError(
                f"refusing to {verb}: {path} is a symlink (to {os.readlink(path)}); expected a regular file, "
                "since files are replaced by rename and never written through a link; fix: replace the link "
                "with a copy of its file (cp --remove-destination \"$(readlink -f FILE)\" FILE) and rerun"
            )
        if path.exists() and not path.is_file():
            raise DcpDsparkError(f"refusing to {verb}: {path} is not a regular file; expected a source file")
    for rel in rels:
        probe = (root / rel).parent
        while not probe.exists():
            probe = probe.parent
        target = root / rel
        for candidate in (probe, root, target if target.exists() else None):
            if candidate is not None and not os.access(candidate, os.W_OK | (os.X_OK if candidate.is_dir() else 0)):
                raise DcpDsparkError(
                    f"cannot {verb}: {candidate} is read-only; nothing in the tree was changed; expected a "
                    f"writable sglang tree; fix: rerun as its owner (e.g. sudo sglang-dcp-dspark {verb} "
                    "--target ...) or install sglang into a writable environment"
                )


def commit(root: Path, changes: list[Change], *, action: str, series: str, verb: str) -> None:
    """Make every change or none, surviving a kill at any point (see the module docstring)."""
    changes = [c for c in changes if c.before != c.after]
    if not changes:
        return
    check_targets(root, [c.rel for c in changes], verb)
    for change in changes:
        if digest_of(root / change.rel) != sha256(change.before):
            raise DcpDsparkError(
                f"cannot {verb}: {root / change.rel} changed while the series was being prepared; nothing in "
                f"the tree was changed; fix: rerun sglang-dcp-dspark {verb}"
            )
    size = sum(len(c.before or b"") + len(c.after or b"") for c in changes)
    with HeldSignals() as held:
        try:
            journal = write_journal(root, changes, action, series, held)
        except OSError as exc:
            raise _io_error(exc, root, verb, "nothing in the tree was changed", size) from None
        except _Stop:
            raise DcpDsparkError(
                f"{verb} interrupted by {held.name} before any file moved; nothing in the tree was changed; "
                f"fix: rerun sglang-dcp-dspark {verb}",
                exit_code=128 + held.pending,
            ) from None
        entries = json.loads((journal / "journal.json").read_text())["files"]
        try:
            for i, change in enumerate(changes):
                held.check()
                _place(root, change.rel, journal / f"{i}.after" if change.after is not None else None)
            held.check()
        except BaseException as exc:  # a signal, a full or failing disk, or a bug: put every file back
            try:
                _move(root, journal, entries, "before")
                _discard(journal)
            except OSError as undo:
                raise DcpDsparkError(
                    f"cannot {verb}, and putting the tree back failed too ({undo.strerror} on "
                    f"{undo.filename or root}); the journal {journal} records both sides; fix: resolve that, "
                    f"then run sglang-dcp-dspark status --target {root} to finish putting it back"
                ) from None
            if isinstance(exc, _Stop):
                raise DcpDsparkError(
                    f"{verb} interrupted by {held.name}; every file was put back as it was; "
                    f"fix: rerun sglang-dcp-dspark {verb}",
                    exit_code=128 + held.pending,
                ) from None
            if isinstance(exc, OSError):
                raise _io_error(exc, root, verb, "every file was put back as it was", size) from None
            raise
        _discard(journal)
    if held.pending:
        raise DcpDsparkError(
            f"interrupted by {held.name} just as {verb} finished: it is complete; "
            f"fix: sglang-dcp-dspark status --target {root} shows the result",
            exit_code=128 + held.pending,
        )


def recover(root: Path, *, intent: tuple[str, str | None] | None = None) -> str | None:
    """Finish or undo whatever a killed run left; returns the one line that says which, or None.

    ``intent`` is the (action, series) of the command about to run: an
    interrupted run of that same command is finished, anything else is undone,
    so that ``status`` or the opposite command starts from where the user was.
    """
    notes = []
    for stale in sorted(root.glob(_NEW + "*")):
        shutil.rmtree(stale)
        notes.append("recovered: removed the half-written journal of an interrupted run; no file had moved")
    journal = root / JOURNAL
    if journal.is_dir() and not (journal / "journal.json").is_file():
        shutil.rmtree(journal)
        notes.append("recovered: removed the journal of a run that was killed just after it finished")
    if not (journal / "journal.json").is_file():
        return "; ".join(notes) or None
    try:
        record = json.loads((journal / "journal.json").read_text(encoding="utf-8"))
        action, series, entries = record["action"], record["series"], record["files"]
        check_targets(root, [e["path"] for e in entries], "recover")
    except (ValueError, KeyError, TypeError) as exc:
        raise DcpDsparkError(
            f"the journal at {journal} is damaged ({exc.__class__.__name__}); expected the journal of an "
            f"interrupted run; fix: restore the tree by hand, then rm -rf {journal}"
        ) from None
    for entry in entries:
        _clean_tmp(root, entry["path"])
        now = digest_of(root / entry["path"])
        if now not in (entry["before"], entry["after"]):
            raise DcpDsparkError(
                f"{root / entry['path']} changed after an interrupted {action} of {series} and matches neither "
                f"side of it; expected the bytes in the journal {journal}; fix: restore that file, or rm -rf "
                f"{journal} to keep the tree as it is"
            )
    forward = intent is not None and intent[0] == action and intent[1] in (None, series)
    side = "after" if forward else "before"
    done = sum(digest_of(root / e["path"]) == e["after"] for e in entries)
    with HeldSignals() as held:
        try:
            _move(root, journal, entries, side)
            _discard(journal)
        except OSError as exc:
            raise DcpDsparkError(
                f"cannot recover the interrupted {action} of {series}: {exc.strerror} on {exc.filename or root}; "
                f"the journal {journal} is kept; fix: resolve that and rerun"
            ) from None
    if forward:
        notes.append(f"recovered: finished the interrupted {action} of {series} ({len(entries) - done} of {len(entries)} files were still to move)")
    else:
        notes.append(f"recovered: undid the interrupted {action} of {series} ({done} of {len(entries)} files had moved); the tree is as it was before it")
    line = "; ".join(notes)
    if held.pending:
        raise DcpDsparkError(f"interrupted by {held.name} after this: {line}", exit_code=128 + held.pending)
    return line
