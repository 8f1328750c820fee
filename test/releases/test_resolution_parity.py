"""The plugin's hooks change sglang's resolution of a launch only where they mean to, on every release.

Each launch is resolved by the release's own code on an emulated node twice, stock and with the plugin's hooks (as
preflight resolves it), and every resolved field is compared. The one intended difference: under DCP on Hopper,
for an MLA model that names no --attention-backend, the plugin picks flashinfer where sglang picks fa3. Everything
else (no DCP, a named backend, Blackwell) resolves field for field as stock sglang resolves it, or is a refusal of
the plugin's own argument check where the pass map shows a pass broken.
"""

from __future__ import annotations

import pytest

from sglang_dcp_dspark.preflight import check, resolution
from sglang_dcp_dspark.preflight.launch import Node
from tree_table import TREES
from trees import TREE

MODEL = str(check.DEFAULT_MODEL)
BASE = ["--model-path", MODEL, "--tp", "8"]
LAUNCHES = {
    "no DCP, H200": ("NVIDIA H200", BASE),
    "DCP, flashinfer named, H200": ("NVIDIA H200", [*BASE, "--dcp-size", "8", "--attention-backend", "flashinfer"]),
    "DCP, no backend, B200": ("NVIDIA B200", [*BASE, "--dcp-size", "8"]),
    "DCP + HiCache, flashinfer named, H200": ("NVIDIA H200", [*BASE, "--dcp-size", "8", "--enable-hierarchical-cache",
                                                               "--attention-backend", "flashinfer"]),
    "DCP, no backend, H200": ("NVIDIA H200", [*BASE, "--dcp-size", "8"]),
}
PICKED = "DCP, no backend, H200"
BLACKWELL_PLAIN = "DCP, no backend, B200"


def resolutions(gpu: str, argv: list[str]):
    release, argv, configs = check.prepare(argv, Node.of_part(gpu), 100_000)
    node = Node.of_part(gpu)
    stock = resolution.resolve(release, argv, node, configs.paths, hooked=False)
    hooked = resolution.resolve(release, argv, node, configs.paths, hooked=True)
    return stock, hooked


@pytest.mark.parametrize("name", list(LAUNCHES))
def test_the_plugin_resolves_as_stock_but_where_it_means_to(name):
    gpu, argv = LAUNCHES[name]
    stock, hooked = resolutions(gpu, argv)
    if not stock.passed:
        pytest.skip(f"{TREE}: sglang refuses it ({stock.message})")
    if not hooked.passed:
        # The plugin's own argument check refuses a pass the map shows broken: fa3 under DCP (which the pick
        # avoids), and on a B200 before #33926 (0.5.17, 0.5.18) trtllm_mla's DCP decode, past the rank's cache.
        if name == BLACKWELL_PLAIN:
            assert "trtllm_mla" in hooked.message and "DECODE" in hooked.message, hooked.message
            assert TREES[TREE].sglang in ("0.5.17", "0.5.18"), hooked.message
        else:
            assert name == PICKED and "fa3" in hooked.message, hooked.message
        return
    a, b = stock.launch.fields(), hooked.launch.fields()
    differ = {k: (a[k], b[k]) for k in a if a[k] != b[k]}
    if name == PICKED and stock.launch.attention_backends[1] == "fa3":
        assert differ.pop("attention_backends")[1][1] == "flashinfer", differ
    assert not differ, differ


def test_a_pick_past_dcp_is_caught(monkeypatch):
    """Control: a pick that also applied without DCP would show as a difference on the launch without DCP."""
    from sglang_dcp_dspark.plugin.hooks import overrides

    picked, _ = resolutions(*LAUNCHES[PICKED])
    if picked.passed and picked.launch.attention_backends[1] != "fa3":
        pytest.skip(f"{TREE}: the release picks {picked.launch.attention_backends[1]} under DCP itself; the plugin leaves the pick alone")
    real = overrides.pick
    monkeypatch.setattr(overrides, "pick", lambda backend, server_args, use_mla: "flashinfer" if backend == "fa3"
                        else real(backend, server_args, use_mla))
    stock, hooked = resolutions(*LAUNCHES["no DCP, H200"])
    if not (stock.passed and hooked.passed) or stock.launch.attention_backends[1] != "fa3":
        pytest.skip(f"{TREE}: the hook does not apply here")
    assert stock.launch.fields() != hooked.launch.fields()
