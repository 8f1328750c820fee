"""The plugin's HiCache gate under DCP decides an EAGLE-family draft by its layout, on 0.5.23 (and not before).

sglang refuses every draft but DSPARK under ``--dcp-size > 1`` with
``--enable-hierarchical-cache``. Where the plugin's hook on
``arg_groups/hicache_hook.resolve_hicache_dcp_compatibility`` applies (0.5.23,
whose ``CacheInitParams`` carries the draft pools the cache-build plan check
reads), it admits the target's own NextN layer (packed into the target's host
pool) and a dense draft on flashinfer or fa3 (replicated, in a sidecar at the
target's logical slots), and refuses a striped draft in a sidecar in one line
naming its layout and the change that fits (``passes.hicache_draft_refusal_of``).

Each launch is resolved by sglang's own ``prepare_server_args`` and
``resolve_once`` after ``load_plugins()``, in a child process on the tree
(test/plugin_launch.py), with the tests' tiny DeepseekV2 (MLA) config and a
published EAGLE3 draft's shape on an emulated H200; the same launches with the
plugin off are the control: stock's gate refuses them all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import sglang_dcp_dspark
from sglang_dcp_dspark import passes
from sglang_dcp_dspark.plugin.hooks import hicache_hook
from sglang_dcp_dspark.plugin.hooks import hybrid_pool_assembler as assembler
from sglang_dcp_dspark.plugin.switch import SWITCH_ENV, WHITELIST_ENV
from tree_table import TREES

CHILD = Path(__file__).parents[1] / "plugin_launch.py"
PACKAGE_ROOT = str(Path(sglang_dcp_dspark.__file__).resolve().parents[1])
DATA = Path(__file__).parents[1] / "data"
TINY = DATA / "tiny-mla"
EAGLE3_DRAFT = DATA / "public" / "kimi-k2.5-eagle3"  # a published EAGLE3 draft's shape (dense, Llama)
MLA_DRAFT = DATA / "deepseek-v3-mla-draft"  # an external draft checkpoint with MLA attention
RELEASES = {TREES[label].sglang: TREES[label].path for label in ("release-0.5.22", "next-stock")}

BASE = ["--model-path", str(TINY), "--device", "cuda", "--tp", "2", "--dcp-size", "2", "--enable-hierarchical-cache"]
EAGLE3 = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(EAGLE3_DRAFT)]
STOCK_GATE = "rejected: NotImplementedError: HiCache with --dcp-size > 1 only supports DSPARK speculative decoding"


def _refused(words: str, **facts) -> str:
    return f"rejected: NotImplementedError: {words.format(**facts)}"


TRITON_USE = ("Drop --speculative-draft-attention-backend triton: the draft then runs on the target's flashinfer, "
              "which keeps it replicated.")
# (launch, outcome on 0.5.23 with the plugin): admitted, or the plugin's one line.
LAUNCHES = {
    "nextn": (["--speculative-algorithm", "NEXTN"], "passes"),
    "eagle3": (EAGLE3, "passes"),
    "eagle3-fa3-draft": ([*EAGLE3, "--speculative-draft-attention-backend", "fa3"], "passes"),
    "eagle3-triton-draft": ([*EAGLE3, "--speculative-draft-attention-backend", "triton"],
                            _refused(passes.HICACHE_STRIPED_MHA, dcp=2, algorithm="EAGLE3", backend="triton",
                                     use=TRITON_USE)),
    "eagle-mla-draft": (["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", str(MLA_DRAFT)],
                        _refused(passes.HICACHE_STRIPED_MLA, dcp=2, algorithm="EAGLE")),
    "ngram": (["--speculative-algorithm", "NGRAM"], STOCK_GATE),
}


def _resolve(tree: Path, plugin: bool) -> dict:
    assert tree.is_dir(), f"{tree} is missing; expected an sglang tree there; fix: make release-trees next-trees (the test is marked trees: make check leaves it to make test)"
    env = {k: v for k, v in os.environ.items() if k not in (WHITELIST_ENV, SWITCH_ENV, "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join([str(tree), PACKAGE_ROOT])  # the tree's sglang, and this process's plugin
    if not plugin:
        env[SWITCH_ENV] = "0"
    launches = [[*BASE, *argv] for argv, _ in LAUNCHES.values()]
    done = subprocess.run([sys.executable, str(CHILD), "NVIDIA H200", json.dumps(launches)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return {"findings": got["findings"], "outcomes": dict(zip(LAUNCHES, got["outcomes"], strict=True))}


@pytest.fixture(scope="module", params=sorted(RELEASES), ids=lambda release: f"sglang-{release}")
def release(request) -> tuple[str, dict]:
    """Every launch resolved once on the release's tree, the plugin loaded as sglang loads it."""
    return request.param, _resolve(RELEASES[request.param], plugin=True)


@pytest.mark.trees
def test_the_gate_decides_each_draft_by_its_layout_where_the_plan_check_can_follow(release):
    version, got = release
    finding = got["findings"].get(hicache_hook.GATE)
    if version != "0.5.23":
        # 0.5.22's CacheInitParams carries no sidecar pools for the plan check: sglang's gate stays.
        assert finding == "OUT_OF_SCOPE", got["findings"]
        assert all(outcome.startswith(STOCK_GATE) for outcome in got["outcomes"].values()), got["outcomes"]
        return
    assert finding == "NEEDS_FIX", got["findings"]
    for name, (_, want) in LAUNCHES.items():
        outcome = got["outcomes"][name]
        assert outcome.startswith(want) if want == STOCK_GATE else outcome == want, (name, outcome)
        assert "\n" not in outcome


@pytest.mark.trees
def test_with_the_plugin_off_stock_0_5_23_refuses_every_one():
    """The control: the same launches on stock 0.5.23's own gate."""
    got = _resolve(RELEASES["0.5.23"], plugin=False)
    assert all(outcome.startswith(STOCK_GATE) for outcome in got["outcomes"].values()), got["outcomes"]


@pytest.mark.parametrize(("facts", "layout"), [
    (dict(algorithm="NEXTN", own_layer=True, draft_mla=False, draft_backend=None, target_backend="flashinfer"),
     ("PACKED", "striped")),
    (dict(algorithm="EAGLE", own_layer=True, draft_mla=False, draft_backend=None, target_backend="flashinfer"),
     ("PACKED", "striped")),
    (dict(algorithm="EAGLE3", own_layer=False, draft_mla=False, draft_backend=None, target_backend="flashinfer"),
     ("SIDECAR", "replicated")),
    (dict(algorithm="EAGLE3", own_layer=False, draft_mla=False, draft_backend="fa3", target_backend="trtllm_mla"),
     ("SIDECAR", "replicated")),
    (dict(algorithm="EAGLE3", own_layer=False, draft_mla=False, draft_backend="triton", target_backend="flashinfer"),
     ("SIDECAR", "striped")),
    (dict(algorithm="EAGLE", own_layer=False, draft_mla=True, draft_backend=None, target_backend="flashinfer"),
     ("SIDECAR", "striped")),
    (dict(algorithm="EAGLE3", own_layer=False, draft_mla=False, draft_backend=None, target_backend="trtllm_mla"),
     ("SIDECAR", "unproven")),
])
def test_each_draft_gets_the_layout_the_data_path_measured(facts, layout):
    algorithm = facts.pop("algorithm")
    assert passes.draft_host_layout(algorithm, **facts) == layout
    refused = passes.hicache_draft_refusal_of(algorithm, dcp=8, hicache=True, **facts)
    assert (refused is None) == (layout[1] == "replicated" or layout[0] == "PACKED")
    if refused is not None:
        assert "\n" not in refused.line and refused.line.startswith("HiCache with --dcp-size 8")
        # The one change it names is an option the operator can change: NEXTN for an MLA checkpoint, else the
        # draft's backend.
        assert "Use --speculative-algorithm NEXTN" in refused.line if facts["draft_mla"] else refused.flag


def test_the_refusal_needs_dcp_hicache_and_an_eagle_draft():
    striped = dict(own_layer=False, draft_mla=False, draft_backend="triton", target_backend="flashinfer")
    assert passes.hicache_draft_refusal_of("EAGLE3", dcp=1, hicache=True, **striped) is None
    assert passes.hicache_draft_refusal_of("EAGLE3", dcp=8, hicache=False, **striped) is None
    assert passes.hicache_draft_refusal_of("DSPARK", dcp=8, hicache=True, **striped) is None  # sglang's gate, DSPARK's
    # Where the target's own backend would not keep the draft replicated, flashinfer is named for the draft.
    refused = passes.hicache_draft_refusal_of("EAGLE3", dcp=8, hicache=True, **{**striped, "target_backend": "trtllm_mla"})
    assert refused.fix == ("--speculative-draft-attention-backend", "flashinfer"), refused


@pytest.mark.parametrize(("pool", "backends", "striped"), [
    (SimpleNamespace(), ("flashinfer",), None),
    (SimpleNamespace(), ("fa3",), None),
    (SimpleNamespace(), ("triton",), "a dense draft on triton, not replicated on flashinfer or fa3"),
    (SimpleNamespace(), ("flashinfer", "triton"), "a dense draft on triton, not replicated on flashinfer or fa3"),
    (SimpleNamespace(_write_loc_dcp_span=8), ("flashinfer",), "an MLA draft, one row per 8 locs"),
    (SimpleNamespace(_write_loc_dcp_span=1), ("flashinfer",), None),  # an MLA pool built replicated
])
def test_the_plan_check_reads_a_sidecar_pools_layout(monkeypatch, pool, backends, striped):
    """The cache-build check (0009's rule as 0020 narrows it): an MLA pool's layout by its write span, a dense
    pool's by the backends its draft runs on (sglang's own reading, stood in here: it needs 0.5.23's context)."""
    monkeypatch.setattr(assembler, "_draft_backends", lambda: backends)
    assert assembler.striped_sidecar(pool) == striped
