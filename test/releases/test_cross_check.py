"""preflight's full-size figures come off the meta device; here the same pools are built with real CPU buffers at reduced scale.

Rows, logical slots, page, bytes per token and buffer bytes of every pool,
and so the draft's coverage, must be equal both ways, on every release: the
meta device changes where the bytes would live, never how many there are.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_dcp_dspark.core import meta as meta_device
from sglang_dcp_dspark.core.compat import parse_version
from sglang_dcp_dspark.preflight import check as preflight
from sglang_dcp_dspark.preflight import launch as launch_mod
from sglang_dcp_dspark.preflight.resolution import read_models, resolve
from tree_table import TREES
from trees import TREE

RELEASE = TREES[TREE].sglang
DATA = Path(__file__).resolve().parents[1] / "data"
TINY = str(DATA / "tiny-mla")
DSA = str(DATA / "deepseek-v32")
DENSE_DRAFT = preflight.DEFAULT_DRAFT
# A Blackwell node, where cutedsl_mla runs: the map finds its passes consistent, so the plugin admits speculative
# decoding under DCP (on an H200 sglang picks fa3, which the plugin refuses: test_node_verdicts.py).
NODE = launch_mod.Node.of_part("NVIDIA B200")


def _launch(argv: list[str]):
    # cutedsl_mla, PR #35221's validated backend on Blackwell (flashinfer, which the tiny configs would get, and
    # trtllm_mla, which DeepSeek-V3 gets, are refused under DCP with a draft)
    argv = [*argv, "--attention-backend", "cutedsl_mla"]
    release, argv, configs = preflight.prepare(argv, NODE, 1024)
    resolution = resolve(release, argv, NODE, configs.paths, hooked=True)
    assert resolution.passed, resolution.message
    la = resolution.launch
    return release, la, read_models(release, la, NODE, configs.paths)


def _figures(built) -> list[tuple]:
    return [(p.name, p.role, p.size) for p in built.pools]


CASES = {
    "MLA target + DSPARK draft, dcp 2": ["--model-path", TINY, "--tp", "2", "--dcp-size", "2", "--enable-hierarchical-cache",
                                         "--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", TINY],
    # (--hicache-size is whole GB in sglang: real buffers at that size are the full-scale tests' job, on meta.)
    "MLA target + DSPARK draft, dcp 4, --hicache-ratio 3, --page-size 16": [
        "--model-path", TINY, "--tp", "4", "--dcp-size", "4", "--enable-hierarchical-cache", "--hicache-ratio", "3",
        "--page-size", "16", "--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", TINY],
    "DSA target (indexer pool), no draft": ["--model-path", DSA, "--tp", "2", "--enable-hierarchical-cache"],
    # The dense draft sglang ships for DSPARK (DSparkDraftModel): its own MHATokenToKVPool and host class.
    "MLA target + dense DSPARK draft, dcp 4": ["--model-path", TINY, "--tp", "4", "--dcp-size", "4",
                                              "--enable-hierarchical-cache", "--speculative-algorithm", "DSPARK",
                                              "--speculative-draft-model-path", str(DENSE_DRAFT)],
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("hooked", [False, True], ids=["stock", "with-plugin"])
def test_meta_figures_equal_real_cpu_pools(name, hooked):
    release, la, models = _launch(CASES[name])
    ram = 64 * 2**30
    meta = release.build(la, models, 1024, hooked=hooked, host_ram=ram)
    with meta_device.real_buffers():
        real = release.build(la, models, 1024, hooked=hooked, host_ram=ram)
    assert meta.startup_error == real.startup_error
    assert _figures(meta) == _figures(real)
    assert meta.pools, "nothing was built"
    if models.dsa_index_head_dim:
        assert "DSA indexer" in [p.name for p in meta.pools]
    if models.draft is not None and meta.draft is not None:
        # The same coverage both ways, and (stock 0.5.17 aside) the whole logical slot space.
        assert meta.draft.logical_slots == real.draft.logical_slots
        if hooked or parse_version(RELEASE) >= parse_version("0.5.18"):
            assert meta.draft.logical_slots >= meta.target.logical_slots
