"""Maintainers' series tooling: rebuild a series' base tree, open a git working branch, re-export.

Users only ever apply, revert and inspect (``series``). Maintaining a series
needs three more steps, none of which touches an installed sglang:

- ``reconstruct_base``: the tree a series in upstream's form was written
  against, rebuilt from the release that shipped it;
- ``workbench``: a git repository with the series' base files committed and the
  series ``git am``'ed on top, to edit with ``git rebase -i``;
- ``export``: the branch written back as the series, deterministically, so CI
  can compare a re-export with what is committed (Electron's check-patches).

Commits carry a fixed identity and date so that nothing but the files decides
the exported bytes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..core.compat import SglangTree, locate_tree
from ..core.errors import DcpDsparkError
from . import NAME_RE, Series, journal, patches_root, read_text
from .patching import Staging, require_git, temporary_directory

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


def export(repo: Path, base: str, series_name: str, *, out_dir: Path | None = None) -> list[Path]:
    """Re-export ``base..HEAD`` of a working branch as the named series.

    Writes the patches and the ``series`` listing (keeping its header comments)
    into ``out_dir`` (default: the series' own directory) and returns the files
    written. Output depends only on the commits, so a re-export of unchanged
    commits is byte-identical: CI compares it with what is committed.

    Only patches the directory's old ``series`` listing named are removed, so
    an ``--out`` that holds other ``.patch`` files keeps them.
    """
    if not NAME_RE.match(series_name):
        raise DcpDsparkError(
            f"{series_name!r} is not a series name; expected a directory name such as sglang-0.5.17; "
            "fix: pass --series NAME (and --out DIR to write elsewhere)"
        )
    git = require_git()
    target = out_dir or (patches_root() / series_name)
    listing = patches_root() / series_name / "series"
    lines = read_text(listing, "series listing").splitlines() if listing.is_file() else []
    header = [line for line in lines if line.startswith("#")]
    with temporary_directory("sglang-dcp-dspark-export-") as tmp:
        result = subprocess.run(
            [git, "-c", "core.abbrev=40", "format-patch", *FORMAT_PATCH_FLAGS, "-o", tmp, f"{base}..HEAD"],
            cwd=repo,
            capture_output=True,
            text=True,
            errors="replace",
        )
        if result.returncode != 0:
            raise DcpDsparkError(
                f"git format-patch {base}..HEAD failed in {repo}: {(result.stderr.strip() or 'no output').splitlines()[-1]}; "
                "expected a git checkout with the series committed on top of BASE; fix: pass --repo and --base"
            )
        produced = sorted(Path(tmp).glob("*.patch"))
        if not produced:
            raise DcpDsparkError(f"no commits in {base}..HEAD of {repo}; expected the series' commits; fix: check --base")
        try:
            target.mkdir(parents=True, exist_ok=True)
            old_listing = target / "series"
            if old_listing.is_file():
                for line in read_text(old_listing, "series listing").splitlines():
                    line = line.strip()
                    if NAME_RE.match(line) and line.endswith(".patch") and (target / line).is_file():
                        (target / line).unlink()
            written = []
            for patch in produced:
                dest = target / patch.name
                shutil.copyfile(patch, dest)
                written.append(dest)
            (target / "series").write_text("\n".join(header + [p.name for p in written]) + "\n", encoding="utf-8")
        except OSError as exc:
            raise DcpDsparkError(
                f"cannot write the series into {target}: {exc.strerror} on {exc.filename or target}; "
                "fix: free space or pick a writable --out, and rerun sglang-dcp-dspark export"
            ) from None
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
    with Staging(source, series) as staging:
        if not staging.applies(series.patches, reverse=True):
            raise DcpDsparkError(
                f"series {series.name} does not reverse-apply to {source.describe()}; expected the release "
                f"that shipped it (sglang {series.fixed_upstream}); fix: pip install --no-deps --target DIR "
                f"'sglang=={series.fixed_upstream}' and pass --from DIR"
            )
    existed = out.exists()
    try:
        _copy_for_base(source, series, out)
        base = locate_tree(out)
        with Staging(base, series) as staging:
            result = staging.git_apply(series.patches, reverse=True)
            if result.returncode != 0:  # checked above on the same bytes; anything else is a bug
                raise DcpDsparkError(f"git apply -R failed in staging: {(result.stderr.strip() or 'no output').splitlines()[0]}")
            changes = staging.changes()
        journal.commit(base.root, changes, action="base", series=series.name, verb="base")
    except BaseException as exc:
        # A half-built base must not pass for a base later: OUT was new or
        # empty (checked above), so all of it is ours to remove.
        if existed:
            for child in out.iterdir():
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        else:
            shutil.rmtree(out, ignore_errors=True)
        if isinstance(exc, OSError):
            raise DcpDsparkError(
                f"cannot build the base in {out}: {exc.strerror} on {exc.filename or out}; it was removed again; "
                "fix: free space or pick another --out, and rerun sglang-dcp-dspark base"
            ) from None
        raise
    return f"{series.name}: base rebuilt at {base.package} from {source.describe()}, {len(series.patches)} patch(es) reversed"


def _copy_for_base(source: SglangTree, series: Series, out: Path) -> None:
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
