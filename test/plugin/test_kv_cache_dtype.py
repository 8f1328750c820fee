"""The plugin's argument check refuses a quantized KV pool under the split verify, on 0.5.22 and 0.5.23.

Where the plugin plans the target verify under DCP split on flashinfer MLA
(0.5.22 and 0.5.23), the plan is proven on the model's own KV dtype only
(docs/verify-under-dcp.md). A launch with ``--dcp-size > 1``, a speculative
algorithm and a quantized ``--kv-cache-dtype`` (fp8_e4m3, fp8_e5m2, ...) is
refused at argument time, in one ValueError line that names the flag and
the change that fixes it (``passes.QUANTIZED_KV``); the model's own dtype
(auto, bf16) is admitted, and so are the same fp8 pool without DCP and
without speculative decoding.

Each tree is driven through sglang's own ``prepare_server_args`` and
``resolve_once`` after ``load_plugins()``, in a child process on that tree
(test/plugin_launch.py), with the tests' tiny DeepseekV2 (MLA) config and the
dense DSpark draft preflight ships, on an emulated H200.
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
from sglang_dcp_dspark.preflight.inputs import DEFAULT_DRAFT
from tree_table import TREES

CHILD = Path(__file__).parents[1] / "plugin_launch.py"
PACKAGE_ROOT = str(Path(sglang_dcp_dspark.__file__).resolve().parents[1])
TINY = Path(__file__).parents[1] / "data" / "tiny-mla"
EAGLE3_DRAFT = Path(__file__).parents[1] / "data" / "public" / "kimi-k2.5-eagle3"  # a published EAGLE3 draft's shape
# The stock releases whose flashinfer MLA verify the plugin plans split under DCP.
RELEASES = {TREES[label].sglang: TREES[label].path for label in ("release-0.5.22", "next-stock")}

BASE = ["--model-path", str(TINY), "--device", "cuda", "--tp", "2"]
DSPARK = ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", str(DEFAULT_DRAFT)]
EAGLE3 = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(EAGLE3_DRAFT)]
FLASHINFER = ["--attention-backend", "flashinfer"]
DCP2 = ["--dcp-size", "2"]


def fp8(kv: str, dcp: int = 2, algorithm: str = "DSPARK") -> str:
    return f"rejected: ValueError: {passes.QUANTIZED_KV.format(dcp=dcp, algorithm=algorithm, kv=kv)}"


# (launch, outcome): the refusal in the plugin's one line, or admitted.
LAUNCHES = {
    "dspark-fp8_e4m3": ([*DCP2, *DSPARK, *FLASHINFER, "--kv-cache-dtype", "fp8_e4m3"], fp8("fp8_e4m3")),
    "dspark-fp8_e5m2": ([*DCP2, *DSPARK, *FLASHINFER, "--kv-cache-dtype", "fp8_e5m2"], fp8("fp8_e5m2")),
    # No backend named: the plugin picks flashinfer under DCP on Hopper, and its check judges the launch as picked.
    "dspark-fp8_e4m3-backend-picked": ([*DCP2, *DSPARK, "--kv-cache-dtype", "fp8_e4m3"], fp8("fp8_e4m3")),
    "eagle3-fp8_e4m3": ([*DCP2, *EAGLE3, *FLASHINFER, "--kv-cache-dtype", "fp8_e4m3"], fp8("fp8_e4m3", algorithm="EAGLE3")),
    "dspark-auto": ([*DCP2, *DSPARK, *FLASHINFER], "passes"),
    "dspark-bf16": ([*DCP2, *DSPARK, *FLASHINFER, "--kv-cache-dtype", "bf16"], "passes"),
    "eagle3-bf16": ([*DCP2, *EAGLE3, *FLASHINFER, "--kv-cache-dtype", "bf16"], "passes"),
    "plain-fp8_e4m3": ([*DCP2, *FLASHINFER, "--kv-cache-dtype", "fp8_e4m3"], "passes"),
    "dspark-fp8_e4m3-no-dcp": ([*DSPARK, *FLASHINFER, "--kv-cache-dtype", "fp8_e4m3"], "passes"),
}


@pytest.fixture(scope="module", params=sorted(RELEASES), ids=lambda release: f"sglang-{release}")
def outcomes(request) -> dict[str, str]:
    """Every launch resolved once on the release's tree, the plugin loaded as sglang loads it."""
    tree = RELEASES[request.param]
    assert tree.is_dir(), f"{tree} is missing; expected sglang {request.param} installed there; fix: make release-trees next-trees (the test is marked trees: make check leaves it to make test)"
    env = {k: v for k, v in os.environ.items() if k not in (WHITELIST_ENV, SWITCH_ENV, "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join([str(tree), PACKAGE_ROOT])  # the tree's sglang, and this process's plugin
    launches = [[*BASE, *argv] for argv, _ in LAUNCHES.values()]
    done = subprocess.run([sys.executable, str(CHILD), "NVIDIA H200", json.dumps(launches)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["findings"]["sglang.srt.arg_groups.speculative_hook.handle_speculative_decoding"] == "NEEDS_FIX"
    return dict(zip(LAUNCHES, got["outcomes"], strict=True))


@pytest.mark.trees
@pytest.mark.parametrize("name", [n for n, (_, want) in LAUNCHES.items() if want != "passes"])
def test_a_quantized_kv_pool_under_the_split_verify_is_refused_in_one_line(outcomes, name):
    got = outcomes[name]
    assert got == LAUNCHES[name][1], got
    assert "\n" not in got and "--kv-cache-dtype" in got and "Use --kv-cache-dtype auto (or bf16)" in got


@pytest.mark.trees
@pytest.mark.parametrize("name", [n for n, (_, want) in LAUNCHES.items() if want == "passes"])
def test_the_models_own_kv_dtype_and_an_fp8_pool_without_the_split_verify_are_admitted(outcomes, name):
    assert outcomes[name] == "passes", outcomes[name]
