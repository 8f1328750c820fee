"""The PR map of a series: which upstream PRs its patches form, what each stacks on, and its status.

``patches/<series>/prs.json`` (upstream-next has one) names each PR, its
patches in order, the PRs it stacks on and its status:

- ``proposed``: a PR to open; it must apply alone on the series' base
  release (plus the PRs it stacks on), pass its own tests there, import
  nothing of the sharded draft backup, and add only black-clean files;
- ``held``: meant to be proposed, not mergeable as cut; ``why`` says what
  the re-cut must do;
- ``comment``: its evidence goes as a comment on the open upstream PR
  ``upstream``; the patches stay in the series for users until ``drop_when``;
- ``downstream``: kept for users of the series alone, until ``drop_when``.

docs/series.md's table is generated from the map (``--markdown``);
docs/upstreaming.md is checked against it (:func:`upstreaming_problems`);
``test/upstream_next/test_pr_map.py`` applies each PR with ``git am`` onto a
git checkout of the base release (:func:`apply_alone`).

    python tools/pr_map.py --markdown upstream-next
    python tools/pr_map.py --standalone upstream-next TREE   (TREE: an installed sglang of the base release)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STATUSES = ("proposed", "held", "comment", "downstream")
# What a proposed PR may not carry: the sharded draft backup is an RFC until upstream's draft-pool declarations
# settle, and fa3 / Hopper's default under DCP are sgl-project/sglang#35384's scope.
SHARDED_BACKUP = "draft_backup_sharded"
UPSTREAMING = REPO / "docs" / "upstreaming.md"


@dataclass(frozen=True)
class PR:
    id: str
    title: str
    patches: tuple[str, ...]
    stacks_on: tuple[str, ...]
    status: str
    standalone: bool
    why: str
    heading: str
    upstream: int | None = None
    related: tuple[int, ...] = ()
    drop_when: str = ""

    @property
    def span(self) -> str:
        return self.patches[0] if len(self.patches) == 1 else f"{self.patches[0]}-{self.patches[-1]}"

    @property
    def status_words(self) -> str:
        """The status as the docs say it."""
        if self.status == "comment":
            return f"comment on #{self.upstream}, downstream"
        return self.status


class MapError(ValueError):
    """The map contradicts itself or its series: one line, ending with what fixes it."""

    def __init__(self, series: str, what: str) -> None:
        super().__init__(f"{what}; fix: edit patches/{series}/prs.json, then run "
                         f"python tools/pr_map.py --markdown {series}")


def path_of(series: str) -> Path:
    return REPO / "patches" / series / "prs.json"


def load(series: str) -> tuple[PR, ...]:
    """The map's PRs, checked against the series' patches: each patch in one PR, in the series' order."""
    raw = json.loads(path_of(series).read_text(encoding="utf-8"))
    prs = tuple(
        PR(id=r["id"], title=r["title"], patches=tuple(r["patches"]), stacks_on=tuple(r["stacks_on"]),
           status=r["status"], standalone=bool(r["standalone"]), why=r.get("why", ""), heading=r["heading"],
           upstream=r.get("upstream"), related=tuple(r.get("related", ())), drop_when=r.get("drop_when", ""))
        for r in raw["prs"]
    )
    numbers = [p.name[:4] for p in patch_files(series)]
    if [n for pr in prs for n in pr.patches] != numbers:
        raise MapError(series, f"{path_of(series).name}: the PRs' patches are not the series' {numbers[0]}-{numbers[-1]} in order")
    ids = [pr.id for pr in prs]
    for pr in prs:
        if pr.status not in STATUSES:
            raise MapError(series, f"{pr.id}: status {pr.status!r}, expected one of {', '.join(STATUSES)}")
        unknown = [s for s in pr.stacks_on if s not in ids[: ids.index(pr.id)]]
        if unknown:
            raise MapError(series, f"{pr.id}: stacks on {', '.join(unknown)}, which no earlier PR of the map is")
        if pr.status == "comment" and not pr.upstream:
            raise MapError(series, f"{pr.id}: a comment names the upstream PR it goes on")
        if pr.status in ("comment", "downstream") and not pr.drop_when:
            raise MapError(series, f"{pr.id}: kept for users, it says when to drop it (drop_when)")
        if pr.status == "held" and not pr.why:
            raise MapError(series, f"{pr.id}: held, it says what the re-cut must do (why)")
        if pr.status == "proposed" and not pr.standalone:
            raise MapError(series, f"{pr.id}: proposed, it must apply alone on its base")
    return prs


def patch_files(series: str) -> list[Path]:
    return sorted((REPO / "patches" / series).glob("*.patch"))


def base_of(prs: tuple[PR, ...], pr: PR) -> list[PR]:
    """The PRs ``pr`` stacks on, transitively, in the map's order."""
    by_id = {p.id: p for p in prs}
    wanted: set[str] = set()
    todo = list(pr.stacks_on)
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo.extend(by_id[name].stacks_on)
    return [p for p in prs if p.id in wanted]


def patches_of(series: str, prs: tuple[PR, ...], pr: PR) -> list[Path]:
    """The patch files to ``git am`` for ``pr``: its base's, then its own, in the series' order."""
    numbers = {n for p in (*base_of(prs, pr), pr) for n in p.patches}
    return [p for p in patch_files(series) if p.name[:4] in numbers]


def added_files(patches: list[Path]) -> list[str]:
    """The files the patches create (``new file mode``)."""
    added = []
    for patch in patches:
        text = patch.read_text(encoding="utf-8")
        for m in re.finditer(r"^diff --git a/(\S+) b/\S+\nnew file mode", text, re.M):
            added.append(m.group(1))
    return added


def markdown(series: str) -> str:
    """docs/series.md's table: one row per PR of the map."""
    prs = load(series)
    counts = {s: sum(1 for pr in prs if pr.status == s) for s in STATUSES}
    said = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    rows = [f"{series}: {len(patch_files(series))} patches, {len(prs)} PRs in its map ({said})", "",
            "| PR | patches | stacks on | status |", "|---|---|---|---|"]
    for pr in prs:
        rows.append(f"| {pr.title} | {pr.span} | {', '.join(pr.stacks_on) or 'stock ' + base_release(series)} "
                    f"| {pr.status_words} |")
    return "\n".join(rows) + "\n"


def base_release(series: str) -> str:
    return json.loads(path_of(series).read_text(encoding="utf-8"))["base"]


def upstreaming_problems(series: str, text: str | None = None) -> list[str]:
    """Where docs/upstreaming.md disagrees with the map: each PR's heading is there, with a status line naming
    its status (and, for a comment, its upstream PR), and each PR's title appears in its section."""
    text = UPSTREAMING.read_text(encoding="utf-8") if text is None else text
    problems = []
    sections = {m.group(1): m.start() for m in re.finditer(r"^#{2,3} (.+)$", text, re.M)}
    for pr in load(series):
        start = sections.get(pr.heading)
        if start is None:
            problems.append(f"{pr.id}: no heading {pr.heading!r}")
            continue
        after = [s for s in sections.values() if s > start and text[s:s + 3] == "## "]
        section = text[start:min(after) if after else len(text)]
        status = f"**Status ({pr.id}):** {pr.status_words}"
        if status not in section:
            problems.append(f"{pr.id}: its section lacks {status!r}")
        if pr.title not in section:
            problems.append(f"{pr.id}: its section does not carry the title {pr.title!r}")
    return problems


PATCHES_DOC = REPO / "docs" / "patches.md"


def patches_doc_problems(series: str, text: str | None = None) -> list[str]:
    """Where docs/patches.md's entries of the series disagree with the map: each patch's entry has an Upstream line
    that starts with its PR's id and status."""
    text = PATCHES_DOC.read_text(encoding="utf-8") if text is None else text
    start = text.find(f"\n## {series}\n")
    if start < 0:
        return [f"docs/patches.md has no section {series}"]
    end = text.find("\n## ", start + 1)
    body = text[start:end if end > 0 else len(text)]
    entries = {m.group(1): m.start() for m in re.finditer(r"^### (\d{4})-", body, re.M)}
    problems = []
    for pr in load(series):
        for number in pr.patches:
            if number not in entries:
                problems.append(f"{number}: no entry")
                continue
            after = [s for s in entries.values() if s > entries[number]]
            entry = body[entries[number]:min(after) if after else len(body)]
            said = f"- **Upstream:** PR map `{pr.id}` ({pr.status_words})"
            if said not in entry:
                problems.append(f"{number}: its entry lacks {said!r}")
    return problems


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    # A fixed identity, and no user or system git config (HOME in the checkout): the same result on any machine.
    env = {**os.environ, "GIT_AUTHOR_NAME": "pr-map", "GIT_AUTHOR_EMAIL": "pr-map@localhost",
           "GIT_COMMITTER_NAME": "pr-map", "GIT_COMMITTER_EMAIL": "pr-map@localhost", "HOME": str(repo),
           "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", "-c", "commit.gpgsign=false", *args], cwd=repo, env=env, capture_output=True,
                          text=True)


def checkout(tree: Path, files: list[str], repo: Path) -> None:
    """A git checkout of the base release: the series' files as ``tree`` (an installed sglang) has them, committed.

    ``files`` are repository paths (``python/sglang/...``, ``test/registered/...``); only the python ones have a
    counterpart in an installed tree."""
    _git(repo, "init", "-q", "-b", "main")
    for name in files:
        if name.startswith("python/"):
            source = tree / name[len("python/"):]
            if source.is_file():
                (repo / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, repo / name)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "base")


def series_files(series: str) -> list[str]:
    """Every file any patch of the series touches."""
    names = set()
    for patch in patch_files(series):
        names.update(re.findall(r"^diff --git a/(\S+) b/", patch.read_text(encoding="utf-8"), re.M))
    return sorted(names)


def apply_alone(series: str, pr: PR, tree: Path, repo: Path) -> str | None:
    """``git am`` the PR (on its base PRs) onto a fresh checkout of ``tree`` in ``repo``; None if every patch
    applies, else the number of the first that does not."""
    prs = load(series)
    checkout(tree, series_files(series), repo)
    for patch in patches_of(series, prs, pr):
        if _git(repo, "am", "-q", "--keep", str(patch)).returncode != 0:
            _git(repo, "am", "--abort")
            return patch.name[:4]
    return None


def own_tests(series: str, pr: PR) -> list[str]:
    """The upstream test files the PR's own patches touch (``test/registered/...``)."""
    names = set()
    for patch in patch_files(series):
        if patch.name[:4] in pr.patches:
            names.update(re.findall(r"^diff --git a/(test/registered/\S+\.py) b/", patch.read_text(encoding="utf-8"),
                                    re.M))
    return sorted(names)


def overlay(tree: Path, repo: Path, out: Path) -> Path:
    """``tree`` (an installed sglang) with the checkout's python files in place of its own, at ``out``: hard links
    for the rest (each replaced file is unlinked first, so ``tree`` is never written)."""
    shutil.copytree(tree / "sglang", out / "sglang", copy_function=os.link)
    for source in (repo / "python" / "sglang").rglob("*"):
        if source.is_file():
            dest = out / source.relative_to(repo / "python")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.unlink(missing_ok=True)
            shutil.copyfile(source, dest)
    return out


def run_own_tests(series: str, pr: PR, tree: Path, work: Path) -> subprocess.CompletedProcess:
    """The PR applied alone (on its base PRs) to ``tree``, and its own upstream tests run there with pytest."""
    repo = work / "repo"
    repo.mkdir()
    failed = apply_alone(series, pr, tree, repo)
    if failed is not None:
        raise MapError(series, f"{pr.id}: patch {failed} does not apply on stock {base_release(series)}")
    site = overlay(tree, repo, work / "site")
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *own_tests(series, pr)],
                          cwd=repo, env=env, capture_output=True, text=True)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--markdown":
        sys.stdout.write(markdown(argv[1]))
        return 0
    if len(argv) == 3 and argv[0] == "--standalone":
        for pr in load(argv[1]):
            with tempfile.TemporaryDirectory() as tmp:
                failed = apply_alone(argv[1], pr, Path(argv[2]), Path(tmp))
            print(f"{pr.id}: {'applies' if failed is None else 'fails at ' + failed} on stock "
                  f"{base_release(argv[1])}{' + ' + ', '.join(pr.stacks_on) if pr.stacks_on else ''}")
        return 0
    print("usage: python tools/pr_map.py --markdown SERIES | --standalone SERIES TREE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
