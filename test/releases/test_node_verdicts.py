"""preflight's verdicts hold on the node the operator has, on every release: the backend that node picks, judged.

Each launch is judged by the tree's own sglang on an emulated node named by its
GPU part (``--gpu-name``), which sets the capability every platform probe
answers from. What is checked:

- a plain DCP launch of DeepSeek-V3 on an H200 (no ``--attention-backend``) is
  judged on the backend sglang picks there, fa3, which has no DCP code: never
  PASSES, and the line names fa3 and the flag that works (flashinfer);
- the same launch on flashinfer PASSES, and its line says what was checked;
- DSPARK + HiCache at dcp 8 with ``--attention-backend flashinfer``: where 0.5.23's
  verify is planned split under DCP (the series' 0012, the plugin's hooks) it
  PASSES and names that fix and its evidence; everywhere else the verify reads
  other tokens' KV;
- a Blackwell-only backend on an emulated B200 gets sglang's verdict, not "only
  supported on Blackwell", and the embedded default (a B200 node, cutedsl_mla)
  says its passes are unchecked rather than PASSES.
"""

from __future__ import annotations

import pytest

from sglang_dcp_dspark import passes
from sglang_dcp_dspark.preflight.check import DEFAULT_DRAFT, DEFAULT_MODEL
from trees import TREE

from .conftest import preflight

OFF = {"SGLANG_ENABLE_DCP_DSPARK_PLUGIN": "0"}
PLAIN = ["--model-path", str(DEFAULT_MODEL), "--tp", "8", "--dcp-size", "8"]
DSPARK = [*PLAIN, "--enable-hierarchical-cache", "--speculative-algorithm", "DSPARK",
          "--speculative-draft-model-path", str(DEFAULT_DRAFT)]
SERIES_TREES = ("next-patched",)  # the tree whose own sglang carries 0011's refusal and 0012's verify
FIXED_TREES = ("release-0.5.22", "next-stock", "next-patched", "next-plugin")  # the verify fix applies (hooks, series)


def _line(report: dict) -> str:
    return report["verdict"]["line"]


def test_plain_dcp_on_hopper_is_judged_on_the_backend_sglang_picks():
    code, report, _ = preflight("--gpu-name", "NVIDIA H200", "--device-rows", "100000", "--", *PLAIN)
    if TREE not in SERIES_TREES:  # the series refuses it inside sglang's resolution: nothing resolved to read back
        assert report["attention_backends"]["decode"] == "fa3", report["attention_backends"]
    assert code != 0 and "fa3" in _line(report) and "--attention-backend flashinfer" in _line(report), _line(report)
    if TREE in SERIES_TREES:  # the series' own check refuses it
        assert code == 1 and "has no DCP code" in _line(report), _line(report)
    else:  # the plugin refuses it in the series' words
        assert code == 1 and passes.FA3_PLAIN.format(dcp=8) in _line(report), _line(report)


def test_plain_dcp_on_hopper_without_the_plugin_is_a_broken_pass():
    if TREE in SERIES_TREES:
        pytest.skip("the series refuses it in sglang's own code, plugin or not")
    code, report, _ = preflight("--gpu-name", "NVIDIA H200", "--", *PLAIN, env=OFF)
    assert code == 5, _line(report)
    assert "DECODE_EAGER on fa3 (crashes)" in _line(report)
    assert "use --attention-backend flashinfer" in _line(report)


def test_plain_dcp_on_flashinfer_passes_and_says_what_was_checked():
    code, report, _ = preflight("--gpu-name", "NVIDIA H200", "--", *PLAIN, "--attention-backend", "flashinfer")
    assert code == 0, _line(report)
    assert "the pass map checked EXTEND, DECODE_EAGER, DECODE_GRAPH on flashinfer" in _line(report)


def test_dspark_on_flashinfer_is_judged_with_the_verify_the_launch_runs():
    """The verify under DCP on flashinfer MLA is planned split where 0.5.23's code is patched (the series'
    0012) or 0.5.22's and 0.5.23's hooked (the plugin): there PASSES, naming the fix and its evidence. Elsewhere, without the plugin, a
    broken verify (exit 5) on every release that admits it (0.5.17 does not, at HiCache + DCP: its gate, exit 1);
    with the plugin, refused, naming the verify."""
    evidence = "proven on CPU against a one-rank reference (tools/mla/verify_dcp.py), not yet run on a GPU"
    code, report, _ = preflight("--gpu-name", "NVIDIA H200", "--device-rows", "100000", "--", *DSPARK,
                                "--attention-backend", "flashinfer", env=OFF)
    if TREE in SERIES_TREES:
        assert code == 0 and "fixed by upstream-next 0012" in _line(report) and evidence in _line(report), _line(report)
    elif report["stock"]["passed"]:
        assert code == 5 and "TARGET_VERIFY_EAGER on flashinfer" in _line(report), _line(report)
    else:
        assert code == 1 and "TARGET_VERIFY_EAGER on flashinfer" in _line(report), _line(report)
    code, report, _ = preflight("--gpu-name", "NVIDIA H200", "--device-rows", "100000", "--", *DSPARK,
                                "--attention-backend", "flashinfer")
    if TREE in FIXED_TREES:
        fix = "upstream-next 0012" if TREE in SERIES_TREES else "the plugin's flashinfer MLA hooks"
        assert code == 0 and f"fixed by {fix}" in _line(report) and evidence in _line(report), _line(report)
    else:
        assert code == 1 and "verify plans KV ids past this rank's pool" in _line(report), _line(report)


def test_a_blackwell_backend_on_an_emulated_blackwell_node_gets_sglangs_verdict():
    code, report, _ = preflight("--gpu-name", "NVIDIA B200", "--device-rows", "100000", "--", *DSPARK,
                                "--attention-backend", "cutedsl_mla")
    assert "only supported on Blackwell" not in _line(report), _line(report)
    assert report["node"]["capability"] == [10, 0]
    assert code == 6, _line(report)  # it starts; the map cannot run cutedsl_mla's in-kernel DCP reads
    assert "unchecked" in _line(report) and "cutedsl_mla" in _line(report)
    # and on a Hopper node sglang refuses it, for that reason
    code, report, _ = preflight("--gpu-name", "NVIDIA H200", "--device-rows", "100000", "--", *DSPARK,
                                "--attention-backend", "cutedsl_mla")
    assert code == 1 and "Blackwell" in _line(report), _line(report)


def test_the_embedded_default_says_what_was_not_checked():
    code, report, _ = preflight()
    assert report["node"]["gpu_name"] == "NVIDIA B200"
    assert code == 6 and "PASSES, UNCHECKED" in _line(report), _line(report)
    assert "unchecked" in _line(report) and "cutedsl_mla" in _line(report)


def test_dspark_on_the_backend_a_b200_picks_stops_at_startup():
    """sglang picks trtllm_mla for DeepSeek-V3 on a B200, and its factory refuses speculative decoding under DCP when
    the model runner builds it (the map's probe): never PASSES. The plugin and the series leave that refusal to
    sglang; the line names cutedsl_mla, the backend PR #35221 was validated on, or flashinfer where its verify is
    planned split (the plugin's hooks on 0.5.22 and 0.5.23, the series on 0.5.23)."""
    for env in (OFF, None):
        code, report, _ = preflight("--gpu-name", "NVIDIA B200", "--device-rows", "100000", "--", *DSPARK, env=env)
        if env is OFF and not report["stock"]["passed"]:  # 0.5.17's own HiCache gate, stock: refused first
            assert code == 1 and "does not support speculative decoding" in _line(report), _line(report)
            continue
        assert code == 5 and "BACKEND_INIT on trtllm_mla (stops at startup)" in _line(report), _line(report)
        if TREE in FIXED_TREES and (env is None or TREE in SERIES_TREES):
            # with the verify planned split, flashinfer MLA runs it on this node too
            assert "use --attention-backend flashinfer" in _line(report) and "not yet run on a GPU" in _line(report)
        else:
            assert "--attention-backend cutedsl_mla" in _line(report), _line(report)
