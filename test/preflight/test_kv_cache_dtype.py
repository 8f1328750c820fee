"""preflight's verdict on an fp8 KV launch under DCP + DSPARK on 0.5.23 with the plugin: the plugin's refusal, before launch.

The split verify on flashinfer MLA is proven on the model's own KV dtype only
(docs/verify-under-dcp.md), and the plugin refuses a quantized pool under it
at argument time. preflight judges the launch as the plugin resolves it, so
its verdict is that refusal (exit 1), in the plugin's words, with the change
it judged to pass (``--kv-cache-dtype auto``); the same launch with a bf16
pool passes. Run in a preflight process on the 0.5.23 tree, as an operator
runs it (the plugin switches unset).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sglang_dcp_dspark
from sglang_dcp_dspark import passes
from sglang_dcp_dspark.plugin.switch import SWITCH_ENV, WHITELIST_ENV
from sglang_dcp_dspark.preflight.inputs import DEFAULT_DRAFT, DEFAULT_MODEL
from tree_table import TREES

TREE = TREES["next-stock"]
PACKAGE_ROOT = str(Path(sglang_dcp_dspark.__file__).resolve().parents[1])
# DeepSeek-V3 at TP8/DCP8 with HiCache and the dense DSpark draft, on an H200: the plugin picks flashinfer MLA there.
LAUNCH = ["--gpu-name", "NVIDIA H200", "--device-rows", "100000", "--", "--model-path", str(DEFAULT_MODEL),
          "--tp", "8", "--dcp-size", "8", "--enable-hierarchical-cache", "--speculative-algorithm", "DSPARK",
          "--speculative-draft-model-path", str(DEFAULT_DRAFT)]


def preflight(*extra: str) -> tuple[int, dict]:
    assert TREE.path.is_dir(), f"{TREE.path} is missing; expected sglang {TREE.sglang} installed there; fix: make next-trees (the test is marked trees: make check leaves it to make test)"
    env = {k: v for k, v in os.environ.items() if k not in (WHITELIST_ENV, SWITCH_ENV, "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join([str(TREE.path), PACKAGE_ROOT])  # the tree's sglang, and this preflight
    done = subprocess.run([sys.executable, "-m", "sglang_dcp_dspark", "preflight", "--json", *LAUNCH, *extra],
                          env=env, capture_output=True, text=True, timeout=600)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)


@pytest.mark.trees
def test_an_fp8_kv_launch_under_dcp_and_dspark_gets_the_plugins_refusal():
    code, report = preflight("--kv-cache-dtype", "fp8_e4m3")
    line, refusal = report["verdict"]["line"], passes.QUANTIZED_KV.format(dcp=8, algorithm="DSPARK", kv="fp8_e4m3")
    assert report["plugin"]["enabled"] and report["stock"]["passed"], report["plugin"]
    assert code == 1 and report["message"] == f"ValueError: {refusal}", report["message"]
    # The line: who refuses what, and the change preflight judged to pass; the block quotes the plugin's line whole.
    assert line == "verdict: REJECTED (exit 1): the plugin refuses DSPARK's fp8_e4m3 KV on flashinfer under DCP"
    assert report["verdict"]["change"].startswith("--kv-cache-dtype auto: PASSES (exit 0)"), report["verdict"]
    assert report["verdict"]["message"] == f"the plugin: ValueError: {refusal}"
    advice = report["verdict"]["advice"]
    assert advice["add"] == ["--kv-cache-dtype", "auto"] and advice["remove"] == ["--kv-cache-dtype", "fp8_e4m3"]
    # Its passes under DCP are not called checked: the split verify is proven on the model's own dtype only.
    judged = report["passes"]
    assert not judged["mapped"] and judged["refused_kv"] == "fp8_e4m3", judged
    assert report["attention_backends"]["decode"] == "flashinfer", report["attention_backends"]


@pytest.mark.trees
def test_the_same_launch_on_a_bf16_pool_passes():
    code, report = preflight("--kv-cache-dtype", "bf16")
    assert code == 0 and "the plugin fixes its verify" in report["verdict"]["line"], report["verdict"]["line"]
    assert report["passes"]["refused_kv"] is None
