"""Patch series: what a series is, read and checked from its directory.

Inspecting a tree and applying or reverting a series on it, all-or-nothing,
is :mod:`patching`; maintainers' tooling (base trees, working branches,
export) is in :mod:`maintain`.

A series is a directory under ``patches/`` holding ``git format-patch`` files
and a ``series`` file that lists them in order. Header comments in ``series``
say which sglang releases it applies to and which release fixed it upstream::

    # applies-to: ==0.5.17
    # fixed-upstream: 0.5.18
    0001-....patch

``--series`` names a directory of the package's own ``patches/``; a series
anywhere else is only read behind an explicit ``--series-dir``. Either way,
every path a patch names is checked before anything is written: relative,
without ``..``, under ``python/sglang/`` or ``test/``, and no symlinks or
submodules.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from ..core.compat import SglangTree, parse_version
from ..core.errors import DcpDsparkError

_DIFF_RE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)
_HEADER_RE = re.compile(r"^#\s*([a-z-]+):\s*(.+?)\s*$")
_HUNK_RE = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
# A series name is one directory of patches/, a patch name one file of it.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# The only places a series may touch, as patches name them.
_ALLOWED_PREFIXES = ("python/sglang/", "test/")
# Which series this tool applied, with the digests it left: the one fact that
# tells "applied by us" from "shipped by the release" once both read the same.
RECORD = ".sglang-dcp-dspark-applied.json"


def patches_root() -> Path:
    """Series shipped in the wheel, or the repository's ``patches/`` in a checkout."""
    override = os.environ.get("SGLANG_DCP_DSPARK_PATCHES")
    candidates = [Path(override)] if override else []
    package = Path(__file__).resolve().parents[1]  # the wheel puts patches/ beside the package's modules
    candidates += [package / "patches", package.parents[1] / "patches"]
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


def applied_to(tree) -> list[str]:
    """The series this tool applied to ``tree`` (a :class:`~..core.compat.SglangTree`), by name; a series that
    cannot be read or inspected counts as not applied."""
    from . import patching

    out = []
    for name in available_series():
        with contextlib.suppress(Exception):
            series = load_series(name)
            # apply refuses a tree of a release the series does not target, so such a tree carries none of it
            # (and asking git, a subprocess per patch, is most of what this costs a preflight judgement).
            if tree.version is not None and not series.targets(tree.version):
                continue
            if patching.inspect(tree, series).state.value == "applied":
                out.append(name)
    return out


def load_series(name: str) -> Series:
    """A series of the package's own ``patches/``, by name; a path is never taken here."""
    if not NAME_RE.match(name):
        known = ", ".join(available_series()) or "none"
        raise DcpDsparkError(
            f"{name!r} is not a series name; expected one of: {known} (a series directory elsewhere needs "
            "--series-dir DIR); fix: sglang-dcp-dspark status"
        )
    directory = patches_root() / name
    if not (directory / "series").is_file():
        known = ", ".join(available_series()) or "none"
        raise DcpDsparkError(
            f"unknown series {name!r}; expected one of: {known}; fix: sglang-dcp-dspark status"
        )
    return _load(directory, name)


def load_series_dir(directory: str | Path) -> Series:
    """A series from a directory the user named explicitly (``--series-dir``)."""
    directory = Path(directory)
    if not (directory / "series").is_file():
        raise DcpDsparkError(
            f"{directory} holds no series file; expected a directory with a series listing and its patches; "
            "fix: pass --series-dir a directory like the package's patches/sglang-0.5.17"
        )
    return _load(directory, directory.resolve().name)


def read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DcpDsparkError(
            f"{what} {path} is not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
            "expected a git format-patch file; fix: regenerate it with sglang-dcp-dspark export"
        ) from None
    except OSError as exc:
        raise DcpDsparkError(f"cannot read {what} {path}: {exc.strerror}; fix: reinstall sglang-dcp-dspark") from None


def _unsafe(path: str, patch: Path) -> DcpDsparkError:
    return DcpDsparkError(
        f"patch {patch} names {path!r}, which is not a plain path under {' or '.join(_ALLOWED_PREFIXES)}; "
        "nothing was written; expected a series for sglang's own files; fix: use a series from sglang-dcp-dspark "
        "status or regenerate it with sglang-dcp-dspark export"
    )


def _check_path(raw: str, patch: Path, *, strip: bool) -> None:
    """Refuse a path git would write outside the series' files: absolute, ``..``, quoted or elsewhere."""
    if raw == "/dev/null":
        return
    if raw.startswith('"') or "\\" in raw:
        raise _unsafe(raw, patch)
    path = raw.split("\t")[0]
    if strip:
        path = path.split("/", 1)[1] if "/" in path else ""
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts) or not path.startswith(_ALLOWED_PREFIXES):
        raise _unsafe(raw, patch)


def _patch_files(text: str, patch: Path) -> tuple[str, ...]:
    """The files a patch changes, after checking every path and mode git apply would act on.

    Hunk bodies are skipped by their line counts, so a removed line that
    happens to read "--- x" is content, not a file header.
    """
    files: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        hunk = _HUNK_RE.match(line)
        if hunk:
            old = int(hunk.group(1) or 1)
            new = int(hunk.group(2) or 1)
            while (old > 0 or new > 0) and i + 1 < len(lines):
                i += 1
                body = lines[i]
                if body.startswith("-"):
                    old -= 1
                elif body.startswith("+"):
                    new -= 1
                elif body.startswith("\\"):
                    pass
                else:
                    old, new = old - 1, new - 1
        elif line.startswith("diff --git "):
            match = _DIFF_RE.match(line)
            if not match:
                raise _unsafe(line.removeprefix("diff --git "), patch)
            for raw in match.groups():
                _check_path(raw, patch, strip=False)
            files.append(match.group(2))
        elif line.startswith(("--- ", "+++ ")) and (
            line.startswith("+++ ") or (i + 1 < len(lines) and lines[i + 1].startswith("+++ "))
        ):
            _check_path(line[4:], patch, strip=True)
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            _check_path(line.split(" ", 2)[2], patch, strip=False)
        elif line.startswith(
            ("new file mode ", "new mode ", "old mode ", "deleted file mode ", "index ")
        ) and line.rstrip().endswith((" 120000", " 160000")):
            raise DcpDsparkError(
                f"patch {patch} creates a symlink or a submodule ({line.strip()}); nothing was written; "
                "expected changes to regular files only; fix: use a series from sglang-dcp-dspark status"
            )
        i += 1
    return tuple(dict.fromkeys(files))


def _load(directory: Path, name: str) -> Series:
    listing = directory / "series"
    headers: dict[str, str] = {}
    patches: list[Patch] = []
    for line in read_text(listing, "series listing").splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            match = _HEADER_RE.match(line)
            if match:
                headers[match.group(1)] = match.group(2)
            continue
        if not NAME_RE.match(line):
            raise DcpDsparkError(
                f"series {name} lists {line!r}, which is not a file name in {directory}; nothing was written; "
                "expected plain patch names; fix: regenerate the series with sglang-dcp-dspark export"
            )
        path = directory / line
        if not path.is_file():
            raise DcpDsparkError(
                f"series {name} lists {line} but the file is missing; expected it in {directory}; "
                "fix: reinstall sglang-dcp-dspark or regenerate with sglang-dcp-dspark export"
            )
        patches.append(Patch(path=path, files=_patch_files(read_text(path, "patch"), path)))
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
