"""passes: how a launch is looked up in the pass map and how its passes are reduced to one judgement.

These run on a small map written here, so that each rule of the lookup is
pinned (the map itself is generated from sglang's code and checked by
test/spec). The verdict strings and the record shape are the generated map's.
"""

from __future__ import annotations

import functools
import itertools
import json

import pytest

from emulation.passmap import compact
from sglang_dcp_dspark import passes


def _case(algorithm, *, dcp=8, rank=0, flag=None, backend="fa3", kind="mha", target="flashinfer_mla", **verdicts):
    names = ("EXTEND", "DRAFT_DECODE_GRAPH", "DRAFT_DECODE_EAGER", "DRAFT_EXTEND", "TARGET_VERIFY")
    result = {}
    for name in names:
        verdict = verdicts.get(name, "consistent")
        entry = {"verdict": verdict, "detail": f"{name} {verdict}", "where": f"sglang.{name.lower()}"}
        after = verdicts.get(f"{name}_after")
        if after:
            entry["after_hicache"] = {"verdict": after, "detail": f"{name} after {after}"}
        result[name] = entry
    return {"release": "0.5.23", "algorithm": algorithm, "draft_class": "X", "draft_kind": kind,
            "target_backend": target, "draft_backend": backend, "draft_backend_flag": flag,
            "dcp": dcp, "rank": rank, "passes": result}


@pytest.fixture
def pass_map(tmp_path, monkeypatch):
    cases = [
        _case("DSPARK", rank=0), _case("DSPARK", rank=7, EXTEND_after="wrong-rows"),
        _case("DSPARK", flag="triton", backend="triton", dcp=4, DRAFT_EXTEND="wrong-rows"),
        _case("DSPARK", flag="triton", backend="triton"),
        _case("DSPARK", target="fa3", rank=0),
        _case("NEXTN", kind="mla", backend="fa3", target="fa3", rank=0, EXTEND="wrong-rows"),
        _case("NEXTN", kind="mla", backend="flashinfer_mla", rank=7, TARGET_VERIFY="raises",
              DRAFT_DECODE_GRAPH="wrong-rows"),
        _case("NEXTN", kind="mla", backend="flashinfer_mla", rank=0, DRAFT_DECODE_GRAPH="consistent"),
        _case("DSPARK", dcp=1),
        # an external dense EAGLE3 draft, mapped on flashinfer MLA only: its own draft passes, the target's verify
        _case("EAGLE3", backend="flashinfer", rank=0, TARGET_VERIFY="wrong-rows"),
    ]
    full = {"passes": ["EXTEND", "DRAFT_DECODE_GRAPH", "DRAFT_DECODE_EAGER", "DRAFT_EXTEND", "TARGET_VERIFY"],
            "cases": cases}
    # Through the compaction the package's tables go through.
    path = tmp_path / "spec_passes.json"
    path.write_text(json.dumps(full))
    compact.write(path, tmp_path / "tables")
    monkeypatch.setattr(passes, "TABLES", tmp_path / "tables")
    return path


def test_the_worst_rank_decides_each_pass(pass_map):
    judged = passes.judge("0.5.23", "NEXTN", dcp=8, own_layer=True, target_backend="flashinfer")
    assert judged.mapped
    broken = {f.name: (f.verdict, f.rank) for f in judged.broken}
    assert broken == {"TARGET_VERIFY": ("raises", 7), "DRAFT_DECODE_GRAPH": ("wrong-rows", 7)}
    # Named in pass order, each with its backend and what the operator would see.
    assert judged.summary().startswith("DRAFT_DECODE_GRAPH on flashinfer (the draft reads")
    assert "TARGET_VERIFY on flashinfer (crashes)" in judged.summary()


def test_eagle_with_the_targets_own_layer_is_judged_as_nextn(pass_map):
    judged = passes.judge("0.5.23", "EAGLE", dcp=8, own_layer=True, target_backend="flashinfer")
    assert {f.name: f.verdict for f in judged.broken} == {"TARGET_VERIFY": "raises", "DRAFT_DECODE_GRAPH": "wrong-rows"}


def test_an_external_draft_is_judged_by_its_own_cases_and_borrows_only_where_unmapped(pass_map):
    # On flashinfer MLA the map ran EAGLE3 itself: its dense draft's passes, not NextN's wrong draft decode.
    own = passes.judge("0.5.23", "EAGLE3", dcp=8, own_layer=False, target_backend="flashinfer")
    assert {f.name for f in own.broken} == {"TARGET_VERIFY"} and "EAGLE family" not in own.note
    # On fa3 it ran no EAGLE3 case: the family's cases there (NextN's, with the target's broken extend), said so.
    borrowed = passes.judge("0.5.23", "EAGLE3", dcp=8, own_layer=False, target_backend="fa3")
    assert "EXTEND" in {f.name for f in borrowed.broken}
    assert "on fa3 the map has no EAGLE3 case: judged by the EAGLE family's (NEXTN)" in borrowed.note
    # The draft's own passes are never borrowed from another draft.
    side = passes.judge("0.5.23", "EAGLE3", dcp=8, own_layer=False, draft_side_only=True)
    assert not side.broken


def test_the_reads_after_a_load_back_count_only_with_hicache(pass_map):
    assert not passes.judge("0.5.23", "DSPARK", dcp=8, own_layer=False).broken
    (after,) = passes.judge("0.5.23", "DSPARK", dcp=8, own_layer=False, hicache=True).broken
    assert (after.name, after.after_hicache) == ("EXTEND", True)
    assert "after a HiCache load-back" in after.line()


def test_a_draft_backend_flag_picks_its_own_cases_at_every_mapped_dcp(pass_map):
    # Seen at dcp 4 only: the rows a wrong write hits depend on the loc layout, so it counts at dcp 8 too.
    (broken,) = passes.judge("0.5.23", "DSPARK", dcp=8, own_layer=False, draft_backend="triton").broken
    assert (broken.backend, broken.dcp) == ("triton", 4) and "acceptance collapses" in broken.consequence
    assert "(dcp 4, rank 0)" in broken.line()


def test_a_named_target_backend_picks_its_cases_and_an_unnamed_one_is_said(pass_map):
    assert passes.judge("0.5.23", "DSPARK", dcp=8, own_layer=False, target_backend="fa3").findings
    unnamed = passes.judge("0.5.23", "NEXTN", dcp=8, own_layer=True)
    assert "names no --attention-backend" in unnamed.summary() and "ran it on fa3, flashinfer" in unnamed.note
    # Unnamed, every target backend the map ran counts: fa3's broken extend too.
    assert {f.name for f in unnamed.broken} == {"EXTEND", "DRAFT_DECODE_GRAPH", "TARGET_VERIFY"}
    missing = passes.judge("0.5.23", "NEXTN", dcp=8, own_layer=True, target_backend="triton")
    assert not missing.mapped and "has not modelled triton" in missing.why_unmapped


@pytest.mark.parametrize("version,algorithm,dcp,flag,why", [
    ("0.5.17", "DSPARK", 8, None, "preflight covers sglang 0.5.23, not 0.5.17"),
    ("0.5.23", "DSPARK", 8, "flashmla", "not flashmla"),
    ("0.5.23", "NGRAM", 8, None, "no NGRAM case"),
])
def test_what_the_map_does_not_cover_is_said_not_guessed(pass_map, version, algorithm, dcp, flag, why):
    judged = passes.judge(version, algorithm, dcp=dcp, own_layer=False, draft_backend=flag)
    assert not judged.mapped and not judged.broken and why in judged.summary()


def test_no_dcp_or_no_draft_is_not_a_question_for_the_map(pass_map):
    assert not passes.judge("0.5.23", "DSPARK", dcp=1, own_layer=False).mapped
    assert not passes.judge("0.5.23", None, dcp=8, own_layer=False).mapped


def test_refusal_follows_the_map_in_the_series_words(pass_map):
    refuse = functools.partial(passes.refusal, "0.5.23", dcp=8, mla=True)
    line = refuse("NEXTN", own_layer=True, target_backend="flashinfer", draft_backend=None)
    assert line == passes.EAGLE_ON.format(dcp=8, algorithm="NEXTN", backend="flashinfer")
    assert refuse("DSPARK", own_layer=False, target_backend="fa3", draft_backend="triton") == passes.TRITON_DRAFT.format(dcp=8)
    assert refuse("NEXTN", own_layer=True, target_backend="fa3", draft_backend=None) == passes.FA3_ON.format(
        dcp=8, algorithm="NEXTN")
    # A target backend the map did not run is left to sglang; so is one whose passes are all consistent.
    assert refuse("NEXTN", own_layer=True, target_backend="cutedsl_mla", draft_backend=None) is None
    assert refuse("DSPARK", own_layer=False, target_backend="fa3", draft_backend=None) is None
    assert passes.refusal("0.5.23", "NEXTN", dcp=1, own_layer=True, mla=True, target_backend="flashinfer",
                          draft_backend=None) is None


def test_the_verify_fix_counts_only_its_own_readings_and_names_its_evidence(pass_map):
    """With the per-draft-token verify in effect, the map's readings of the verify with that fix replace the
    release's own; the draft's passes still decide, and a draft tree is refused in one line."""
    data = json.loads(pass_map.read_text())
    fixed = {"TARGET_VERIFY": {"verdict": "consistent", "detail": "planned per draft token", "where": "w"}}
    data["verify_fixed"] = [
        {"release": "0.5.23", "fix": "plugin", "algorithm": algorithm, "draft_class": "X", "draft_backend_flag": None,
         "dcp": 8, "rank": rank, "passes": fixed} for algorithm, rank in (("EAGLE3", 0), ("NEXTN", 7))]
    pass_map.write_text(json.dumps(data))
    compact.write(pass_map, passes.TABLES)
    passes.read_table.cache_clear()  # the table was read once already in this process, before its rewrite
    refuse = functools.partial(passes.refusal, "0.5.23", dcp=8, mla=True, target_backend="flashinfer",
                               draft_backend=None)
    stock = passes.EAGLE_ON.format(dcp=8, algorithm="EAGLE3", backend="flashinfer")
    assert refuse("EAGLE3", own_layer=False) == stock
    assert refuse("EAGLE3", own_layer=False, verify_fix="plugin") is None
    judged = passes.judge("0.5.23", "EAGLE3", dcp=8, own_layer=False, target_backend="flashinfer", verify_fix="plugin")
    assert not judged.broken
    assert judged.fixed_by == "plugin" and "fixed by the plugin's flashinfer MLA hooks" in judged.summary()
    assert "proven on CPU within 1e-5 of one rank" in judged.summary() and "not yet on a GPU" in judged.summary()
    # the target's own NextN layer: its draft decode still reads other rows, in the series' (0013) words
    assert refuse("NEXTN", own_layer=True, verify_fix="plugin") == passes.NEXTN_DRAFT.format(dcp=8, algorithm="NEXTN")
    assert refuse("EAGLE3", own_layer=False, verify_fix="plugin", topk=4) == passes.TOPK_TREE.format(dcp=8, topk=4)
    # a fix the map has no readings of on this release changes nothing, and says nothing
    assert refuse("EAGLE3", own_layer=False, verify_fix="upstream-next") == stock
    unfixed = passes.judge("0.5.23", "EAGLE3", dcp=8, own_layer=False, target_backend="flashinfer",
                           verify_fix="upstream-next")
    assert not unfixed.evidence and not unfixed.fixed_by


def test_an_external_mla_draft_is_judged_as_the_nextn_draft_it_runs_as():
    """sglang builds a draft's attention from the draft's own config: an EAGLE launch with an MLA checkpoint runs
    on the MLA draft backends, as the target's own NextN layer does. The shipped 0.5.23 map: judged by the NEXTN
    cases (without the fix its draft passes read other rows on flashinfer MLA; with the plugin's hooks, which plan
    them, none does), not by the dense EAGLE draft's; refused all the same, in the series' (0018) words, its passes
    being proven with the own layer only, which the fix admits; on fa3 the refusal does not send it to
    flashinfer, and the own layer's does."""
    common = dict(dcp=8, target_backend="flashinfer", verify_fix="plugin")
    dense = passes.judge("0.5.23", "EAGLE", own_layer=False, **common)
    mla = passes.judge("0.5.23", "EAGLE", own_layer=False, draft_mla=True, **common)
    own = passes.judge("0.5.23", "NEXTN", own_layer=True, **common)
    assert dense.mapped and not dense.broken
    assert [(f.name, f.verdict) for f in mla.findings] == [(f.name, f.verdict) for f in own.findings]
    assert not mla.broken and own.fixes_draft
    stock = passes.judge("0.5.23", "EAGLE", own_layer=False, draft_mla=True, **dict(common, verify_fix=None))
    assert {f.name for f in stock.broken} >= {"DRAFT_DECODE_GRAPH", "DRAFT_EXTEND"}, stock.broken
    nextn = functools.partial(passes.refusal, "0.5.23", "NEXTN", dcp=8, own_layer=True, mla=True, draft_backend=None,
                              flashinfer_fix="plugin")
    assert nextn(target_backend="flashinfer", verify_fix="plugin") is None
    assert nextn(target_backend="fa3") == passes.FA3_ON_FLASHINFER.format(dcp=8, algorithm="NEXTN")
    refuse = functools.partial(passes.refusal, "0.5.23", "EAGLE", dcp=8, own_layer=False, mla=True,
                               draft_backend=None, flashinfer_fix="plugin")
    assert refuse(target_backend="flashinfer", verify_fix="plugin") is None
    assert (refuse(target_backend="flashinfer", verify_fix="plugin", draft_mla=True)
            == passes.NEXTN_MLA_DRAFT.format(dcp=8, algorithm="EAGLE"))
    assert refuse(target_backend="fa3") == passes.FA3_ON_FLASHINFER.format(dcp=8, algorithm="EAGLE")
    assert refuse(target_backend="fa3", draft_mla=True) == passes.FA3_ON.format(dcp=8, algorithm="EAGLE")


@pytest.mark.parametrize("algorithm", ["NGRAM", "STANDALONE", "DFLASH"])
def test_an_algorithm_the_map_has_no_case_of_is_judged_by_the_plain_passes(algorithm):
    """The shipped 0.5.23 map has no NGRAM, STANDALONE or DFLASH case, and those run the target's plain extend and
    decode: on fa3 MLA (broken there) they are judged broken and refused in 0011's words, which name the backend
    that runs; on flashinfer (consistent there) their own passes stay unchecked, as before."""
    common = dict(dcp=8, own_layer=False)
    on_fa3 = passes.judge("0.5.23", algorithm, target_backend="fa3", **common)
    assert on_fa3.mapped and on_fa3.by_plain and on_fa3.algorithm == algorithm
    assert {f.name for f in on_fa3.broken} == {"EXTEND", "DECODE_EAGER", "DECODE_GRAPH"}, on_fa3.broken
    assert "the map has no " + algorithm + " case" in on_fa3.note
    refuse = functools.partial(passes.refusal_of, "0.5.23", algorithm, mla=True, draft_backend=None, **common)
    found = refuse(target_backend="fa3")
    assert found.line == passes.FA3_PLAIN.format(dcp=8) and found.backend == "fa3"
    assert found.what == f"{algorithm} on fa3 under DCP"
    on_flashinfer = passes.judge("0.5.23", algorithm, target_backend="flashinfer", **common)
    assert not on_flashinfer.mapped and not on_flashinfer.by_plain
    assert refuse(target_backend="flashinfer") is None
    # A dense target is not the map's question, and dcp 1 is not DCP.
    assert not passes.judge("0.5.23", algorithm, target_backend="fa3", target_mla=False, **common).mapped
    assert passes.refusal("0.5.23", algorithm, dcp=1, own_layer=False, mla=True, target_backend="fa3",
                          draft_backend=None) is None


def test_a_quantized_kv_pool_is_refused_only_under_the_split_verify():
    """The facts the plugin's check and preflight decide a quantized KV refusal from, once: DCP, a speculative
    algorithm, a quantized --kv-cache-dtype, and a flashinfer MLA target whose verify is planned split."""
    facts = dict(dcp=8, algorithm="DSPARK", target_backend="flashinfer", mla=True, verify_fix="plugin")
    line = passes.QUANTIZED_KV.format(dcp=8, algorithm="DSPARK", kv="fp8_e4m3")
    assert passes.kv_cache_refusal(kv_cache_dtype="fp8_e4m3", **facts) == line
    assert "\n" not in line and "Use --kv-cache-dtype auto (or bf16)" in line
    for kv in ("fp8_e5m2", "mxfp8", "nvfp4", "fp4_mx_block16"):
        assert passes.kv_cache_refusal(kv_cache_dtype=kv, **facts) == line.replace("fp8_e4m3", kv)
    for kv in (None, "auto", "bf16", "bfloat16"):
        assert passes.kv_cache_refusal(kv_cache_dtype=kv, **facts) is None
    for other in (dict(dcp=1), dict(algorithm=None), dict(verify_fix=None), dict(target_backend="fa3"),
                  dict(mla=False)):
        assert passes.kv_cache_refusal(kv_cache_dtype="fp8_e4m3", **(facts | other)) is None, other
    # The argument check's line: first of its refusals, in the same words.
    assert passes.refusal("0.5.23", "EAGLE3", dcp=8, own_layer=False, mla=True, target_backend="flashinfer",
                          draft_backend=None, verify_fix="plugin", topk=4, kv_cache_dtype="fp8_e4m3") == (
        passes.QUANTIZED_KV.format(dcp=8, algorithm="EAGLE3", kv="fp8_e4m3"))


@pytest.mark.parametrize("release", passes.releases())
def test_every_backend_a_judgement_names_is_an_attention_backend_value(release):
    """The shipped tables, judged as preflight judges a launch: every backend a finding names is a value of
    sglang's ``--attention-backend`` (the installed release's choices), since preflight's line tells the operator
    what a pass ran on and what to pass instead. 0.5.17's table named its EAGLE drafts' backend by its class,
    ``FlashInferAttnBackend``, and the embedded node's NEXTN and EAGLE3 launches on cutedsl_mla read "passes checked
    on FlashInferAttnBackend, cutedsl_mla"."""
    from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES

    named = {}
    for algorithm, backend in itertools.product(("DSPARK", "EAGLE3", "EAGLE", "NEXTN"),
                                                (None, "fa3", "flashinfer", "cutedsl_mla", "trtllm_mla")):
        judged = passes.judge(release, algorithm, dcp=8, own_layer=algorithm == "NEXTN", target_backend=backend)
        for found in judged.findings:
            named.setdefault(found.backend, f"{algorithm} {found.name} (--attention-backend {backend})")
    assert len(named) >= 3, named  # the map ran fa3, flashinfer and Blackwell's backends: a table was read
    assert {b: where for b, where in named.items() if b not in ATTENTION_BACKEND_CHOICES} == {}
