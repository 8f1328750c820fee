"""preflight's verdicts over a matrix of launches, read as an operator reads them.

124 launches per tree (an 8 x H200 and an 8 x B200 node; DSPARK, EAGLE3, NEXTN and plain DCP on six backend
choices; an EAGLE draft tree, EAGLE3 with HiCache, DSPARK with a Triton draft, STANDALONE, NGRAM, DFLASH and
FROZEN_KV_MTP on the backend the node picks; the plugin on and off), judged in this process on stock 0.5.17, stock 0.5.23 and 0.5.23 with
patches/upstream-next. Each verdict is held to:

- every line of its text report, the verdict line and the block beneath it included, fits 100 columns, and none
  ends in "…" (nothing is cut);
- the line and the first line of each block entry (``details`` and the quoted ``message`` aside) use an operator's
  words: no pass names, no "pass map", no repository paths, no backend named by its class;
- a Hopper launch's verdict names no Blackwell-only backend the launch does not name itself;
- exit 3's words only with exit 3; "the plugin refuses" only where the plugin's hooks make the difference;
- the advised change, judged by preflight, gets the exit code the verdict states, and is never the backend the
  launch already runs on;
- no advised change takes away more than the first candidate, in the order of what each takes away, that passes:
  an option the refusal's message names, another attention backend, the plugin on, ``--speculative-eagle-topk 1``,
  HiCache off, ``--dcp-size 1``, no speculative decoding. The candidates are built here from the launch and the
  message alone, and each is judged as an operator would run it.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from sglang_dcp_dspark.preflight.check import DEFAULT_DRAFT, DEFAULT_MODEL
from trees import TREE

from .conftest import judge

MATRIX_TREES = ("stock", "next-stock", "next-patched")
pytestmark = pytest.mark.skipif(TREE not in MATRIX_TREES, reason=f"the verdict matrix runs on {', '.join(MATRIX_TREES)}")

WIDTH = 100
EAGLE3_DRAFT = Path(__file__).parents[1] / "data" / "public" / "kimi-k2.5-eagle3"  # a published EAGLE3 draft's shape
NODES = ("NVIDIA H200", "NVIDIA B200")
BACKENDS = (None, "fa3", "flashinfer", "cutedsl_mla", "trtllm_mla", "triton")
BLACKWELL_ONLY = ("cutedsl_mla", "trtllm_mla", "tokenspeed_mla")
BASE = ["--model-path", str(DEFAULT_MODEL), "--tp", "8", "--dcp-size", "8"]
HICACHE = "--enable-hierarchical-cache"
CHAIN = ["--speculative-eagle-topk", "1", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4"]
KINDS = {
    "DSPARK": [*BASE, HICACHE, "--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", str(DEFAULT_DRAFT)],
    "EAGLE3": [*BASE, "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(EAGLE3_DRAFT), *CHAIN],
    "NEXTN": [*BASE, "--speculative-algorithm", "NEXTN"],
    "plain": [*BASE, HICACHE],
}
# Judged on the backend the node picks: the launches of the issue that filed this matrix.
EXTRA = {
    "EAGLE tree": [*BASE, "--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "4",
                   "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "8"],
    "EAGLE3 + HiCache": [*KINDS["EAGLE3"], HICACHE],
    "DSPARK, Triton draft": [*KINDS["DSPARK"], "--speculative-draft-attention-backend", "triton"],
    "STANDALONE": [*BASE, "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path",
                   str(EAGLE3_DRAFT), *CHAIN],
    "NGRAM": [*BASE, "--speculative-algorithm", "NGRAM"],
    "DFLASH": [*BASE, "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(EAGLE3_DRAFT), *CHAIN],
    "FROZEN_KV_MTP": [*BASE, "--speculative-algorithm", "FROZEN_KV_MTP"],
}
OFF = {"SGLANG_ENABLE_DCP_DSPARK_PLUGIN": "0"}
LAUNCHES = ([(node, backend, kind, plugin) for node, backend, kind, plugin in
             itertools.product(NODES, BACKENDS, KINDS, (True, False))]
            + [(node, None, kind, plugin) for node, kind, plugin in itertools.product(NODES, EXTRA, (True, False))])
PASS_NAMES = re.compile(r"\b(EXTEND|DECODE_\w+|TARGET_VERIFY\w*|DRAFT_\w+|BACKEND_INIT)\b")
JARGON = (PASS_NAMES, re.compile(r"pass map|tools/|\b[A-Z]\w*Backend\b"))

_judged: dict = {}


def judged(node: str, argv: list[str], plugin: bool) -> tuple[int, dict, str]:
    """The launch judged as preflight judges it (once per launch in this process): code, JSON, text."""
    key = (node, tuple(argv), plugin)
    if key not in _judged:
        _judged[key] = judge(node, argv, 200_000, env=None if plugin else OFF)
    return _judged[key]


def argv_of(kind: str, backend: str | None) -> list[str]:
    return (KINDS | EXTRA)[kind] + (["--attention-backend", backend] if backend else [])


def options(argv: list[str]) -> dict[str, str | None]:
    out, i = {}, 0
    while i < len(argv):
        valued = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        out[argv[i]] = argv[i + 1] if valued else None
        i += 2 if valued else 1
    return out


def changed(argv: list[str], drop=(), add=()) -> list[str]:
    """``argv`` without the options ``drop`` (an option name, or a prefix ending in "-"), with ``add`` set."""
    names = set(drop) | set(add[::2])
    out = [(k, v) for k, v in options(argv).items()
           if k not in names and not any(d.endswith("-") and k.startswith(d) for d in drop)]
    return [t for k, v in out for t in (k, v) if t is not None] + list(add)


# The option categories, in the order of what each change takes away (the order).
NAMED, BACKEND, PLUGIN, CHAIN_OF_ONE, NO_HICACHE, NO_DCP, NO_SPECULATION = range(7)
# Options whose change is a later category of its own (the backend, DCP, speculation) or no change at all.
NEVER_NAMED = ("--model-path", "--tp", "--dcp-size", "--speculative-algorithm", "--speculative-draft-model-path",
               "--attention-backend")


def candidates(node: str, argv: list[str], message: str, plugin: bool):
    """(category, launch, plugin on) for each change the order names, built from the launch and the message."""
    given = options(argv)
    for name in given:
        if name not in NEVER_NAMED and name in message:
            yield NAMED, changed(argv, drop=[name]), plugin
    blackwell = node == "NVIDIA B200"
    for backend in ("flashinfer", "triton", *(BLACKWELL_ONLY[:2] if blackwell else ("fa3",))):
        if backend != given.get("--attention-backend"):
            yield BACKEND, changed(argv, drop=["--attention-backend"], add=["--attention-backend", backend]), plugin
    if not plugin:
        yield PLUGIN, argv, True
    if int(given.get("--speculative-eagle-topk") or 1) > 1:
        yield CHAIN_OF_ONE, changed(argv, add=["--speculative-eagle-topk", "1"]), plugin
    if HICACHE in given:
        yield NO_HICACHE, changed(argv, drop=[HICACHE]), plugin
    yield NO_DCP, changed(argv, add=["--dcp-size", "1"]), plugin
    if "--speculative-algorithm" in given:
        yield NO_SPECULATION, changed(argv, drop=["--speculative-"]), plugin


def category_of(advice: dict) -> int:
    add, remove = advice["add"], advice["remove"]
    if advice["env"]:
        return PLUGIN
    if add[:1] == ["--attention-backend"]:
        return BACKEND
    if add[:1] == ["--speculative-eagle-topk"] and add[1] == "1" and "--speculative-eagle-topk" in remove:
        return CHAIN_OF_ONE
    if remove == [HICACHE] and not add:
        return NO_HICACHE
    if add == ["--dcp-size", "1"]:
        return NO_DCP
    if not add and remove and all(t.startswith("--speculative-") or not t.startswith("--") for t in remove) and \
            "--speculative-algorithm" in remove:
        return NO_SPECULATION
    return NAMED


def advised(argv: list[str], advice: dict) -> list[str]:
    """The launch the advice names: the tokens it removes taken out in order, the ones it adds put in."""
    out, removed = [], list(advice["remove"])
    for token in argv:
        if removed and token == removed[0]:
            removed.pop(0)
            continue
        out.append(token)
    return changed(out, add=advice["add"]) if advice["add"] else out


def findings(node: str, kind: str, backend: str | None, plugin: bool) -> list[str]:
    argv = argv_of(kind, backend)
    code, report, text = judged(node, argv, plugin)
    verdict = report["verdict"]
    found = []
    for line in text.splitlines():
        if len(line) > WIDTH:
            found.append(f"a line of {len(line)} columns: {line[:60]}…")
        if line.rstrip().endswith("…") and not line.startswith(("    ", "  passes")):
            found.append(f"a line cut short: {line}")
    if code == 2:
        return found
    at = next(i for i, line in enumerate(text.splitlines()) if line.startswith("verdict: "))
    block = text.splitlines()[at:]
    firsts = [block[0]] + [ln for ln in block[1:] if re.match(r"  \S", ln) and not ln.startswith(("  details",
                                                                                                    "  message"))]
    for line in firsts:
        for jargon in JARGON:
            if jargon.search(line):
                found.append(f"jargon ({jargon.search(line).group()}) in: {line}")
    if node != "NVIDIA B200":
        for name in BLACKWELL_ONLY:
            if name in "\n".join(block) and name not in argv:
                found.append(f"the Blackwell-only {name} in a Hopper verdict")
    line = verdict["line"]
    if code == 0 and not ("CPU only" in line or "checks passes only under DCP" in line):
        found.append(f"a PASSES line that does not say what was not checked: {line}")
    at_startup = ("stops at startup", "as it starts", "as the server starts")
    if any(words in line for words in at_startup) and code != 3:
        found.append(f"exit 3's words under exit {code}")
    if code == 1 and "the plugin refuses" in line and (not plugin or report["stock"]["message"] ==
                                                        report["with_plugin"]["message"] and not
                                                        report["stock"]["passed"]):
        found.append("'the plugin refuses' where the plugin's hooks make no difference")
    advice = verdict.get("advice")
    if advice:
        named = report["attention_backends"]["decode"]
        if advice["add"][:1] == ["--attention-backend"] and advice["add"][1] == named:
            found.append(f"advice to use {named}, which the launch already runs on")
        again, report2, _ = judged(node, advised(argv, advice), True if advice["env"] else plugin)
        if again != advice["verdict"] or again not in (0, 6):
            found.append(f"advice {advice['change']} gets exit {again}, not {advice['verdict']}: "
                         f"{report2['verdict']['line']}")
    if code in (1, 3, 5):
        limit = category_of(advice) if advice and advice["verdict"] == 0 else NO_SPECULATION + 1
        for category, other, on in candidates(node, argv, verdict.get("message") or "", plugin):
            if category >= limit:
                break
            if judged(node, other, on)[0] == 0:
                found.append(f"{' '.join(other[len(BASE):])} (plugin {'on' if on else 'off'}) passes and takes "
                             f"away less than the advice ({advice['change'] if advice else 'none'})")
                break
    return found


def test_the_matrix_is_at_least_sixty_launches_of_every_algorithm():
    from sglang_dcp_dspark.preflight import refusals

    assert len(LAUNCHES) >= 60
    named = {options(argv_of(kind, None)).get("--speculative-algorithm") for kind in (*KINDS, *EXTRA)}
    assert set(refusals.algorithm_names()) - {"UNO"} <= named, set(refusals.algorithm_names()) - named


@pytest.mark.parametrize("node", NODES)
def test_every_verdict_reads_as_an_operator_would_want(node):
    bad = {}
    for _, backend, kind, plugin in (launch for launch in LAUNCHES if launch[0] == node):
        found = findings(node, kind, backend, plugin)
        if found:
            bad[(kind, backend, "plugin on" if plugin else "plugin off")] = found
    assert not bad, "\n".join(f"{k}: {v}" for k, v in bad.items())


@pytest.fixture
def fresh():
    """A control judges its launches anew (a patched verdict must not be served from the matrix's cache), and
    leaves nothing patched in the cache behind it."""
    _judged.clear()
    yield
    _judged.clear()


def test_a_contradiction_is_caught(monkeypatch, fresh):
    """Control: a verdict that advises the backend the launch already runs on is reported."""
    from sglang_dcp_dspark.preflight import verdict

    real = verdict.Verdict.as_dict

    def advise_the_same(self):
        out = real(self)
        out["advice"] = {"change": "--attention-backend flashinfer", "add": ["--attention-backend", "flashinfer"],
                         "remove": [], "env": [], "verdict": 0, "line": ""}
        return out

    monkeypatch.setattr(verdict.Verdict, "as_dict", advise_the_same)
    assert any("already runs on" in f for f in findings("NVIDIA H200", "plain", "flashinfer", True))


def test_advice_that_takes_away_too_much_is_caught(monkeypatch, fresh):
    """Control: where the search skips every change before --dcp-size 1, the matrix names the smaller one."""
    from sglang_dcp_dspark.preflight import advice

    real = advice.candidates

    def only_dcp_1(*args, **kwargs):
        return [c for c in real(*args, **kwargs) if c.add[:1] == ("--dcp-size",)]

    monkeypatch.setattr(advice, "candidates", only_dcp_1)
    # Plain DCP on fa3 on Hopper: flashinfer runs it on every release of the matrix, a smaller change.
    found = findings("NVIDIA H200", "plain", "fa3", True)
    assert any("takes away less than the advice (--dcp-size 1)" in f for f in found), found


def test_a_cut_line_is_caught(monkeypatch, fresh):
    """Control: a verdict whose block ends in a line cut short, with "…", is reported."""
    from sglang_dcp_dspark.preflight import result

    real = result.Verdict.block

    def cut(self, width=result.BLOCK_WIDTH):
        return [*real(self, width), "  to do     drop --enable-hier…"]

    monkeypatch.setattr(result.Verdict, "block", cut)
    assert any("cut short" in f for f in findings("NVIDIA H200", "plain", "flashinfer", True))


def test_a_passes_line_that_hides_what_was_not_checked_is_caught(monkeypatch, fresh):
    """Control: a PASSES line stripped of what it did not check is reported."""
    from sglang_dcp_dspark.preflight import result

    real = result.Verdict.line

    monkeypatch.setattr(result.Verdict, "line", property(lambda self: real.fget(self).replace(", CPU only", "")))
    assert any("does not say what was not checked" in f for f in findings("NVIDIA H200", "plain", "flashinfer", True))
