"""preflight's verdicts hold on the node the operator has, on every release: the backend that node picks, judged.

Each launch is judged by the tree's own sglang on an emulated node named by its
GPU part (``--gpu-name``), which sets the capability every platform probe
answers from. What is checked:

- NGRAM and STANDALONE at dcp 8 on fa3 MLA: the plugin and the series refuse
  them (0011's check, whatever the algorithm); stock's verdict is a broken
  pass, judged by the target's plain passes, which the map has;
- a plain DCP launch of DeepSeek-V3 on an H200 (no ``--attention-backend``):
  sglang picks fa3 there, which has no DCP code; the plugin (and
  upstream-next 0015) picks flashinfer MLA instead, and the launch PASSES,
  saying who picked it. With the plugin off, on stock sglang, it is a broken
  pass on fa3, and the line names the flag that works (flashinfer); fa3
  named explicitly is refused in one line naming flashinfer;
- the same launch on flashinfer PASSES, and its block says what was checked;
- DSPARK + HiCache at dcp 8 with ``--attention-backend flashinfer``: where 0.5.23's
  verify is planned split under DCP (the series' 0012, the plugin's hooks) it
  PASSES and names that fix and its evidence; everywhere else the verify reads
  other tokens' KV;
- a Blackwell-only backend on an emulated B200 gets sglang's verdict, not "only
  supported on Blackwell", and the embedded default (a B200 node, cutedsl_mla)
  PASSES, naming its evidence: CPU, against the kernel's documented contract;
- a plain DCP launch on a B200 with no backend named runs on trtllm_mla and is
  judged by its checked decode: on 0.5.17 and 0.5.18 that decode hands the
  kernel pages past the rank's cache (exit 5; the plugin refuses it, naming
  cutedsl_mla), from 0.5.19 it PASSES.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_dcp_dspark import passes
from sglang_dcp_dspark.plugin import hooks
from sglang_dcp_dspark.preflight.check import DEFAULT_DRAFT, DEFAULT_MODEL
from tree_table import TREES, VERSIONS
from trees import TREE

from .conftest import preflight

OFF = {"SGLANG_ENABLE_DCP_DSPARK_PLUGIN": "0"}
RELEASE = TREES[TREE].sglang
PLAIN = ["--model-path", str(DEFAULT_MODEL), "--tp", "8", "--dcp-size", "8"]
DSPARK = [*PLAIN, "--enable-hierarchical-cache", "--speculative-algorithm", "DSPARK",
          "--speculative-draft-model-path", str(DEFAULT_DRAFT)]


def _version(release: str) -> tuple[int, ...]:
    return tuple(map(int, release.split(".")))


# The trees whose own sglang carries upstream-next (0011's refusal, 0012's verify), and those where the verify fix
# applies (the plugin's hooks from VERIFY_FIX_SINCE on, or the series): read from patches/trees.json, so a release
# added there is judged here with no edit.
SERIES_TREES = tuple(label for label, t in TREES.items() if t.expect.get("upstream-next") == "applied")
FIXED_TREES = tuple(label for label, t in TREES.items()
                    if _version(t.sglang) >= _version(hooks.VERIFY_FIX_SINCE))


def _line(report: dict) -> str:
    return report["verdict"]["line"]


def _change(report: dict) -> str:
    """The entry beneath the line: the change that works, and preflight's verdict on that launch."""
    return report["verdict"]["change"] or ""


def _block(report: dict) -> str:
    """The verdict's block, as one string: why, the message, checked, unchecked, evidence, to do, details."""
    v = report["verdict"]
    return " ".join([*v["why"], v["message"] or "", v["checked"] or "", v["unchecked"] or "", v["evidence"] or "",
                     *v["todo"], *v["details"]])


def test_plain_dcp_on_hopper_runs_on_the_backend_the_plugin_picks():
    code, report, _ = preflight("--gpu-name", "NVIDIA H200", "--device-rows", "100000", "--", *PLAIN)
    assert report["attention_backends"]["decode"] == "flashinfer", report["attention_backends"]
    assert code == 0 and "DCP passes checked on flashinfer, CPU only" in _line(report), _line(report)
    if TREE in SERIES_TREES:  # sglang's own default there (0015): nothing of the plugin's
        assert "sglang's choice on the NVIDIA H200" in report["attention_backends"]["from"]
    else:
        assert "decode flashinfer (picked by the plugin under DCP)" in report["attention_backends"]["from"]


def test_fa3_named_under_dcp_is_refused_in_one_line_naming_flashinfer():
    code, report, _ = preflight("--gpu-name", "NVIDIA H200", "--device-rows", "100000", "--", *PLAIN,
                                "--attention-backend", "fa3")
    assert code == 1 and "fa3" in _line(report), _line(report)
    assert _change(report).startswith("--attention-backend flashinfer: PASSES (exit 0)"), _change(report)
    if TREE in SERIES_TREES:  # the series' own check refuses it
        assert _line(report).endswith("upstream-next refuses DCP on fa3"), _line(report)
        assert "has no DCP code" in report["verdict"]["message"], report["verdict"]["message"]
    else:  # the plugin refuses it in the series' words
        assert _line(report).endswith("the plugin refuses DCP on fa3"), _line(report)
        assert report["verdict"]["message"] == "the plugin: ValueError: " + passes.FA3_PLAIN.format(dcp=8)


# A speculative algorithm the map has no case of runs the target's plain extend and decode: on fa3 MLA under DCP it
# is never PASSES or PASSES, UNCHECKED. STANDALONE's draft is the target's own checkpoint here (any causal LM does).
UNMODELLED = {"NGRAM": ["--speculative-algorithm", "NGRAM"],
              "STANDALONE": ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path",
                             str(DEFAULT_MODEL)]}


@pytest.mark.parametrize("algorithm", list(UNMODELLED))
def test_an_unmodelled_algorithm_on_fa3_under_dcp_is_refused_or_broken(algorithm):
    launch = [*PLAIN, *UNMODELLED[algorithm], "--attention-backend", "fa3"]
    code, report, _ = preflight("--gpu-name", "NVIDIA H200", "--device-rows", "100000", "--", *launch)
    # 0011's check, whatever the algorithm; the plugin's, in 0011's words
    carrier = "upstream-next" if TREE in SERIES_TREES else "the plugin"
    assert code == 1 and _line(report).endswith(f"{carrier} refuses {algorithm} on fa3 under DCP"), _line(report)
    assert report["verdict"]["message"].endswith("ValueError: " + passes.FA3_PLAIN.format(dcp=8)), report["verdict"]
    off, report, _ = preflight("--gpu-name", "NVIDIA H200", "--device-rows", "100000", "--", *launch, env=OFF)
    if TREE in SERIES_TREES:
        assert off == 1, _line(report)
    else:  # stock sglang admits it: its plain passes on fa3 are broken
        assert off == 5 and "on fa3" in _line(report), _line(report)
        assert "DECODE_EAGER on fa3 (dcp 8, rank 0): crashes" in _block(report)
        assert f"the map has no {algorithm} case" in _block(report)


def test_plain_dcp_on_hopper_without_the_plugin_is_a_broken_pass():
    """The off switch turns the pick off too: sglang's fa3, and its passes under DCP."""
    code, report, _ = preflight("--gpu-name", "NVIDIA H200", "--", *PLAIN, env=OFF)
    if TREE in SERIES_TREES:  # 0015 is sglang's own default there, plugin or not
        assert code == 0 and report["attention_backends"]["decode"] == "flashinfer", _line(report)
        return
    assert code == 5 and report["attention_backends"]["decode"] == "fa3", _line(report)
    assert "on fa3" in _line(report), _line(report)
    assert _change(report).startswith("--attention-backend flashinfer: PASSES (exit 0)"), _change(report)
    assert "DECODE_EAGER on fa3 (dcp 8, rank 0): crashes" in _block(report)


def test_plain_dcp_on_flashinfer_passes_and_says_what_was_checked():
    code, report, _ = preflight("--gpu-name", "NVIDIA H200", "--", *PLAIN, "--attention-backend", "flashinfer")
    assert code == 0 and "DCP passes checked on flashinfer, CPU only" in _line(report), _line(report)
    assert "each pass it runs on flashinfer reads the rows it wrote" in report["verdict"]["checked"]
    assert "consistent under DCP: EXTEND, DECODE_EAGER, DECODE_GRAPH" in report["verdict"]["details"]


def test_dspark_on_flashinfer_is_judged_with_the_verify_the_launch_runs():
    """The verify under DCP on flashinfer MLA is planned split where 0.5.23's code is patched (the series'
    0012) or 0.5.22's and 0.5.23's hooked (the plugin): there PASSES, naming the fix and its evidence. Elsewhere, without the plugin, a
    broken verify (exit 5) on every release that admits it (0.5.17 does not, at HiCache + DCP: its gate, exit 1);
    with the plugin, refused, naming the verify."""
    evidence = "proven on CPU within 1e-5 of one rank, not yet on a GPU (sglang-dcp-dspark's docs/verify-under-dcp.md)"
    code, report, _ = preflight("--gpu-name", "NVIDIA H200", "--device-rows", "100000", "--", *DSPARK,
                                "--attention-backend", "flashinfer", env=OFF)
    if TREE in SERIES_TREES:
        assert code == 0 and "upstream-next fixes its verify" in _line(report), _line(report)
        assert "fixed by upstream-next 0012" in report["verdict"]["evidence"] and evidence in report["verdict"]["evidence"]
    elif report["stock"]["passed"]:
        # The line says what goes wrong, in an operator's words; the details name both forms of the pass.
        assert code == 5 and "on flashinfer, the target reads other tokens' KV" in _line(report), _line(report)
        assert "TARGET_VERIFY_EAGER on flashinfer" in _block(report) and "TARGET_VERIFY_GRAPH" in _block(report)
        if TREE in FIXED_TREES:  # the plugin's verify fix applies here: the advice is to turn it on
            assert _change(report).startswith("the dcp_dspark plugin on: PASSES (exit 0)"), _change(report)
            assert report["verdict"]["advice"]["env"] and not report["verdict"]["advice"]["add"]
    else:
        assert code == 1 and "TARGET_VERIFY_EAGER on flashinfer" in _block(report), _line(report)
    code, report, _ = preflight("--gpu-name", "NVIDIA H200", "--device-rows", "100000", "--", *DSPARK,
                                "--attention-backend", "flashinfer")
    if TREE in FIXED_TREES:
        fix, short = (("upstream-next 0012", "upstream-next") if TREE in SERIES_TREES
                      else ("the plugin's flashinfer MLA hooks", "the plugin"))
        assert code == 0 and f"{short} fixes its verify" in _line(report), _line(report)
        assert f"fixed by {fix}" in report["verdict"]["evidence"] and evidence in report["verdict"]["evidence"]
    else:
        assert code == 1 and "the plugin refuses DSPARK on flashinfer under DCP" in _line(report), _line(report)
        assert "verify plans KV ids past this rank's pool" in report["verdict"]["message"]


def test_a_blackwell_backend_on_an_emulated_blackwell_node_gets_sglangs_verdict():
    code, report, _ = preflight("--gpu-name", "NVIDIA B200", "--device-rows", "100000", "--", *DSPARK,
                                "--attention-backend", "cutedsl_mla")
    assert "only supported on Blackwell" not in _line(report), _line(report)
    assert report["node"]["capability"] == [10, 0]
    assert code == 0, _line(report)  # it starts, and the map ran its passes against the kernel's contract
    assert "DCP passes checked on cutedsl_mla" in _line(report), _line(report)
    assert report["verdict"]["advice"] is None  # never advised the backend it runs on
    # and on a Hopper node sglang refuses it, for that reason
    code, report, _ = preflight("--gpu-name", "NVIDIA H200", "--device-rows", "100000", "--", *DSPARK,
                                "--attention-backend", "cutedsl_mla")
    assert code == 1 and "Blackwell" in report["verdict"]["message"], report["verdict"]["message"]
    assert _line(report).endswith("refuses cutedsl_mla on the NVIDIA H200's Hopper GPUs"), _line(report)


def test_the_embedded_default_gets_a_checked_verdict_naming_its_evidence():
    code, report, _ = preflight()
    assert report["node"]["gpu_name"] == "NVIDIA B200"
    assert code == 0 and _line(report).startswith("verdict: PASSES (exit 0): DCP passes checked on "
                                                  "cutedsl_mla"), _line(report)
    assert "CPU only" in _line(report), _line(report)
    assert passes.KERNEL_EVIDENCE in report["verdict"]["evidence"]
    assert report["verdict"]["advice"] is None and not report["verdict"]["unchecked"], _line(report)


def test_a_plain_dcp_launch_on_a_b200_is_judged_on_trtllm_mlas_decode():
    """No backend named: sglang picks trtllm_mla for DeepSeek-V3 there, and the map ran its DCP decode."""
    broken = RELEASE in ("0.5.17", "0.5.18")  # before #33926: the table of the widened locs, untranslated
    code, report, _ = preflight("--gpu-name", "NVIDIA B200", "--device-rows", "100000", "--", *PLAIN, env=OFF)
    assert report["attention_backends"]["decode"] == "trtllm_mla"
    if broken:
        assert code == 5 and "on trtllm_mla, the target" in _line(report), _line(report)
        assert "DECODE_EAGER on trtllm_mla" in _block(report)
        assert any("page past the rank's cache" in p["detail"] for p in report["passes"]["passes"])
        assert _change(report).startswith("--attention-backend cutedsl_mla: PASSES (exit 0)"), _change(report)
    else:
        assert code == 0 and "DCP passes checked on trtllm_mla" in _line(report), _line(report)
        assert "CPU only" in _line(report), _line(report)
    code, report, _ = preflight("--gpu-name", "NVIDIA B200", "--device-rows", "100000", "--", *PLAIN)
    if broken:  # the plugin's check refuses a pass the map shows broken, and names the backend that runs it
        assert code == 1 and "the plugin refuses DCP on trtllm_mla" in _line(report), _line(report)
        assert _change(report).startswith("--attention-backend cutedsl_mla: PASSES (exit 0)"), _change(report)
    else:
        assert code == 0, _line(report)


def test_dspark_on_the_backend_a_b200_picks_stops_at_startup():
    """sglang picks trtllm_mla for DeepSeek-V3 on a B200, and its factory refuses speculative decoding under DCP when
    the model runner builds it (the map's probe): it stops as the server starts (exit 3). The plugin and the series
    leave that refusal to sglang; the line names cutedsl_mla, the backend PR #35221 was validated on, or flashinfer
    where its verify is planned split (the plugin's hooks on 0.5.22 and 0.5.23, the series on 0.5.23)."""
    for env in (OFF, None):
        code, report, _ = preflight("--gpu-name", "NVIDIA B200", "--device-rows", "100000", "--", *DSPARK, env=env)
        if env is OFF and not report["stock"]["passed"]:  # 0.5.17's own HiCache gate, stock: refused first
            assert code == 1 and "does not support speculative decoding" in report["verdict"]["message"], _line(report)
            continue
        assert code == 3 and "trtllm_mla refuses DSPARK under DCP as it starts" in _line(report), _line(report)
        assert "cannot serve decode context parallelism with speculative decoding" in _block(report)
        # cutedsl_mla, checked against its kernel's contract, comes first (and flashinfer MLA where its verify is
        # planned split); either way the advised launch's evidence is named
        assert _change(report).startswith("--attention-backend cutedsl_mla: PASSES (exit 0)"), _change(report)
        assert "CPU only" in _change(report), _change(report)


def test_a_draft_tree_under_dcp_is_advised_the_chain_that_runs():
    """EAGLE3 with a draft tree (topk 4) on flashinfer under DCP: the split verify plans a chain, so the plugin and
    the series refuse the tree, and the advice is the chain at the same depth (DCP kept), judged by preflight, not
    --dcp-size 1."""
    if TREE not in FIXED_TREES:
        pytest.skip("flashinfer MLA's verify is planned for DCP only where the fix applies")
    draft = Path(__file__).parents[1] / "data" / "public" / "kimi-k2.5-eagle3"  # a published EAGLE3 draft's shape
    code, report, _ = preflight("--gpu-name", "NVIDIA H200", "--device-rows", "200000", "--", *PLAIN,
                                "--attention-backend", "flashinfer", "--speculative-algorithm", "EAGLE3",
                                "--speculative-draft-model-path", str(draft), "--speculative-eagle-topk", "4",
                                "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "8")
    advice = report["verdict"]["advice"]
    assert code == 1 and "(topk 4) on flashinfer under DCP" in _line(report), _line(report)
    assert advice["add"] == ["--speculative-eagle-topk", "1"] and advice["verdict"] == 0, advice
    assert _change(report).startswith("--speculative-eagle-topk 1: PASSES (exit 0)"), _change(report)


def test_nextn_on_flashinfer_passes_where_the_fix_plans_its_draft_passes_too():
    """DeepSeek's own MTP layer as draft (NEXTN) at --tp 8 --dcp-size 8 on an emulated H200, flashinfer: where the fix
    applies (the plugin's hooks on 0.5.22 and 0.5.23, upstream-next 0017 on the patched tree) it PASSES, the line
    naming who fixes its verify and draft and the block every pass consistent; elsewhere the plugin refuses it."""
    nextn = [*PLAIN, "--attention-backend", "flashinfer", "--speculative-algorithm", "NEXTN"]
    code, report, _ = preflight("--gpu-name", "NVIDIA H200", "--device-rows", "100000", "--", *nextn)
    if TREE not in FIXED_TREES:
        assert code == 1 and "the plugin refuses NEXTN" in _line(report), _line(report)
        return
    short = "upstream-next" if TREE in SERIES_TREES else "the plugin"
    # The line names who fixes them (in full where it fits 100 columns); the evidence says what it fixes.
    assert code == 0 and f"fixed by {short}" in _line(report), _line(report)
    assert "the NextN draft's decode and extend on flashinfer under DCP are fixed by" in report["verdict"]["evidence"]
    judged = {p["name"]: p["verdict"] for p in report["passes"]["passes"]}
    assert set(judged) >= {"DRAFT_DECODE_GRAPH", "DRAFT_EXTEND", "TARGET_VERIFY_GRAPH"}, judged
    assert set(judged.values()) == {"consistent"}, judged


# The trees whose HiCache gate decides an EAGLE-family draft under DCP by its layout: 0.5.23 with the plugin's
# hook (its plan check needs 0.5.23's CacheInitParams), or with upstream-next 0020.
HICACHE_TREES = tuple(label for label, t in TREES.items() if t.sglang == VERSIONS["next"])
EAGLE3_DRAFT = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                str(Path(__file__).parents[1] / "data" / "public" / "kimi-k2.5-eagle3")]


def _pools(report: dict) -> dict[str, dict]:
    return {pool["name"]: pool for pool in report["sizing"]["pools"]}


def test_drafts_under_dcp_and_hicache_pass_where_their_host_pool_fits():
    """DeepSeek-V3 at --tp 8 --dcp-size 8 with --enable-hierarchical-cache on an emulated H200, no backend named:
    the NextN draft (packed into the target's host pool) and a dense EAGLE3 draft (replicated, in a sidecar at the
    target's logical slots) PASS where the gate decides a draft by its layout, their host pools sized and counted;
    the same EAGLE3 draft on triton (striped, in a sidecar) is refused in one line naming the draft's backend, and
    dropping that flag is the advice. Elsewhere, and on stock 0.5.23 with the plugin off, sglang's gate refuses
    every draft but DSPARK."""
    hicache = [*PLAIN, "--enable-hierarchical-cache"]
    nextn = [*hicache, "--speculative-algorithm", "NEXTN"]
    if TREE not in HICACHE_TREES:
        code, report, _ = preflight("--gpu-name", "NVIDIA H200", "--device-rows", "100000", "--", *nextn)
        assert code == 1 and "refuses HiCache under DCP with NEXTN" in _line(report), _line(report)
        return
    if TREE not in SERIES_TREES:  # the control: stock 0.5.23's own gate
        code, report, _ = preflight("--gpu-name", "NVIDIA H200", "--device-rows", "100000", "--", *nextn, env=OFF)
        assert code == 1 and _line(report).endswith("sglang 0.5.23 refuses HiCache under DCP with NEXTN"), _line(report)
    short = "upstream-next" if TREE in SERIES_TREES else "the plugin"
    code, report, _ = preflight("--gpu-name", "NVIDIA H200", "--device-rows", "100000", "--", *nextn)
    assert code == 0 and f"fixed by {short}" in _line(report), _line(report)
    assert set(p["verdict"] for p in report["passes"]["passes"]) == {"consistent"}, report["passes"]
    assert report["sizing"]["draft_plan"] == "PACKED"
    # The NextN layer rides in the target's host rows: 62 layers of 576 bf16 values per token, not 61.
    assert _pools(report)["target KV + packed draft layers"]["bytes_per_token"] == 62 * 576 * 2
    # The sidecar counted in --hicache-size (the NextN launch above was auto-sized): both pools within 20 GB a rank.
    code, report, _ = preflight("--gpu-name", "NVIDIA H200", "--device-rows", "100000", "--", *hicache, *EAGLE3_DRAFT,
                                "--hicache-size", "20")
    assert code == 0 and "PASSES" in _line(report), _line(report)
    sidecar = _pools(report)["draft sidecar"]
    assert report["sizing"]["draft_plan"] == "SIDECAR" and sidecar["rows"] == sidecar["logical_slots"], sidecar
    assert sidecar["logical_slots"] == _pools(report)["target KV"]["logical_slots"]
    needed = report["sizing"]["host_ram"]["needed_per_rank"]
    slack = 2 * max(p["page_size"] * p["bytes_per_token"] for p in _pools(report).values())  # page alignment
    assert sidecar["bytes"] + _pools(report)["target KV"]["bytes"] <= needed <= 20 * 10**9 + slack, needed
    # And in sglang's auto-sizing: on a 200 GiB node the ratio shrinks so that both fit (stock prices the sidecar
    # at 1/dcp of its rows and stops at startup, short of host memory).
    code, report, _ = preflight("--gpu-name", "NVIDIA H200", "--device-rows", "100000", "--host-ram-gib", "200", "--",
                                *hicache, *EAGLE3_DRAFT)
    sizing = report["sizing"]
    assert code == 0 and sizing["host_ram"]["fits"] and sizing["hicache_ratio"] < sizing["auto_sized_from"], sizing
    assert "draft sidecar" in _pools(report)
    code, report, _ = preflight("--gpu-name", "NVIDIA H200", "--device-rows", "100000", "--", *hicache, *EAGLE3_DRAFT,
                                "--speculative-draft-attention-backend", "triton")
    assert code == 1 and _line(report).endswith(f"{short} refuses HiCache under DCP for EAGLE3's draft on triton"), \
        _line(report)
    assert "striped over the DCP ranks" in report["verdict"]["message"] and "\n" not in report["verdict"]["message"]
    assert _change(report).startswith("drop --speculative-draft-attention-backend triton: PASSES (exit 0)"), \
        _change(report)
