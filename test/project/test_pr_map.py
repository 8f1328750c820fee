"""upstream-next's PR map (patches/upstream-next/prs.json) holds: what it says of each PR is what git and pytest do.

- Each PR's ``standalone`` claim is what ``git am`` does with its patches (on
  the PRs it stacks on) on a git checkout of stock 0.5.23, either way.
- A standalone PR's own upstream tests pass there, alone.
- A proposed PR imports nothing of the sharded draft backup, touches nothing
  of sgl-project/sglang#35384's scope, and adds only files that
  ``ruff format --line-length 88 --check`` accepts.
- docs/upstreaming.md has each PR's section, title and status; docs/patches.md names each patch's PR and status.
- The map contradicting itself is refused, naming the PR.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import pr_map
import tree_table

SERIES = "upstream-next"
PRS = pr_map.load(SERIES)
BY_ID = {pr.id: pr for pr in PRS}
# The trees make test builds: stock 0.5.23, the release the map's base names.
STOCK = tree_table.TREES[tree_table.SERIES[SERIES]["reexport_on"]].path
# sgl-project/sglang#35384's scope: fa3 under DCP and Hopper's MLA default (the two PRs the map sends there).
SCOPE_35384 = ("_check_dcp_decode_backend", "model_override_base.py")


def _stock() -> Path:
    if not (STOCK / "sglang" / "__init__.py").is_file():
        pytest.fail(f"{STOCK} is missing; expected the trees of make next-trees; fix: make next-trees")
    return STOCK


@pytest.mark.trees
@pytest.mark.parametrize("pr", PRS, ids=lambda pr: pr.id)
def test_standalone_is_what_git_am_does(pr, tmp_path):
    failed = pr_map.apply_alone(SERIES, pr, _stock(), tmp_path)
    base = f"stock 0.5.23{' + ' + ', '.join(pr.stacks_on) if pr.stacks_on else ''}"
    assert (failed is None) == pr.standalone, (
        f"{pr.id}: the map says standalone={pr.standalone}, but on {base} "
        f"{'every patch applies' if failed is None else 'patch ' + failed + ' does not'}")


@pytest.mark.trees
@pytest.mark.parametrize("pr", [pr for pr in PRS if pr.standalone], ids=lambda pr: pr.id)
def test_a_standalone_pr_passes_its_own_tests_alone(pr, tmp_path):
    assert pr_map.own_tests(SERIES, pr), f"{pr.id} has no upstream test of its own"
    result = pr_map.run_own_tests(SERIES, pr, _stock(), tmp_path)
    tail = (result.stdout + result.stderr).strip().splitlines()[-15:]
    assert result.returncode == 0, "\n".join(tail)
    assert " passed" in tail[-1] and "skipped" not in tail[-1], tail[-1]


def _proposed_text(pr) -> str:
    return "".join(p.read_text(encoding="utf-8") for p in pr_map.patches_of(SERIES, PRS, pr)
                   if p.name[:4] in pr.patches)


@pytest.mark.trees
@pytest.mark.parametrize("pr", [pr for pr in PRS if pr.status == "proposed"], ids=lambda pr: pr.id)
def test_a_proposed_pr_is_mergeable_as_cut(pr, tmp_path):
    text = _proposed_text(pr)
    assert pr_map.SHARDED_BACKUP not in text, f"{pr.id} uses the sharded draft backup, an RFC not proposed"
    assert not [s for s in SCOPE_35384 if s in text], f"{pr.id} touches sgl-project/sglang#35384's scope"
    assert all(BY_ID[b].status == "proposed" for b in pr.stacks_on), f"{pr.id} stacks on a PR not proposed"
    repo = tmp_path / "repo"
    repo.mkdir()
    assert pr_map.apply_alone(SERIES, pr, _stock(), repo) is None
    added = [name for name in pr_map.added_files(pr_map.patches_of(SERIES, PRS, pr)) if name.endswith(".py")]
    if added:
        result = subprocess.run([sys.executable, "-m", "ruff", "format", "--line-length", "88", "--check", *added],
                                cwd=repo, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_the_pr_texts_and_the_patch_index_are_the_map():
    assert pr_map.upstreaming_problems(SERIES) == []
    assert pr_map.patches_doc_problems(SERIES) == []


def test_the_statuses_hold_what_the_issue_asks():
    """What is not proposed as cut: the sharded backup (downstream, an RFC), fa3's refusal and Hopper's default
    (a comment on #35384); every PR that imports the sharded backup is not proposed."""
    assert BY_ID["sharded-draft-backup"].status == "downstream"
    assert {BY_ID["fa3-refusal"].upstream, BY_ID["hopper-default"].upstream} == {35384}
    for pr in PRS:
        if pr_map.SHARDED_BACKUP in _proposed_text(pr) and pr.id != "sharded-draft-backup":
            assert pr.status != "proposed", pr.id


@pytest.mark.parametrize("change,said", [
    (lambda raw: raw["prs"][0]["patches"].pop(), "are not the series' 0001-0021 in order"),
    (lambda raw: raw["prs"][3].update(upstream=None), "fa3-refusal: a comment names the upstream PR"),
    (lambda raw: raw["prs"][1].update(drop_when=""), "sharded-draft-backup: kept for users, it says when"),
    (lambda raw: raw["prs"][2].update(status="proposed"), "spec-refusals: proposed, it must apply alone"),
    (lambda raw: raw["prs"][0].update(stacks_on=["hicache-gate"]), "draft-budget: stacks on hicache-gate"),
    (lambda raw: raw["prs"][0].update(status="merged"), "draft-budget: status 'merged', expected one of"),
])
def test_a_map_that_contradicts_itself_is_refused(change, said, tmp_path, monkeypatch):
    raw = json.loads(pr_map.path_of(SERIES).read_text(encoding="utf-8"))
    change(raw)
    broken = tmp_path / "prs.json"
    broken.write_text(json.dumps(raw), encoding="utf-8")
    monkeypatch.setattr(pr_map, "path_of", lambda series: broken)
    with pytest.raises(pr_map.MapError, match=said.replace("(", r"\(")) as refused:
        pr_map.load(SERIES)
    assert "\n" not in str(refused.value)
    assert str(refused.value).endswith("fix: edit patches/upstream-next/prs.json, then run "
                                       "python tools/pr_map.py --markdown upstream-next")


@pytest.mark.trees
def test_a_wrong_claim_is_caught(tmp_path):
    """Control: where a PR does not apply alone, apply_alone names the patch that fails, so a flipped claim fails."""
    assert pr_map.apply_alone(SERIES, BY_ID["spec-refusals"], _stock(), tmp_path) == "0009"


def test_a_missing_section_or_entry_is_caught():
    """Controls: the docs checks name what is missing."""
    held = BY_ID["spec-refusals"]
    text = pr_map.UPSTREAMING.read_text(encoding="utf-8")
    status = f"**Status ({held.id}):** {held.status_words}"
    problems = pr_map.upstreaming_problems(SERIES, text.replace(status, "**Status:** proposed"))
    assert problems == [f"{held.id}: its section lacks {status!r}"]
    index = pr_map.PATCHES_DOC.read_text(encoding="utf-8")
    said = "- **Upstream:** PR map `fa3-refusal` (comment on #35384, downstream)"
    assert pr_map.patches_doc_problems(SERIES, index.replace(said, "- **Upstream:** not yet sent")) == [
        f"0011: its entry lacks {said!r}"]
