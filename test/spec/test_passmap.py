"""The pass map (``python -m emulation.passmap``, tools/emulation/passmap/): fresh for this run's tree, and able to see a wrong row.

Each test runs the harness in a child process (Triton's interpreter must be switched on before Triton is
imported, which an earlier test of the session may already have done), with PYTHONPATH on this run's tree.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tree_table import TREES

# The map is generated on the stock release trees: 0.5.17 (the stock run, which takes test/spec) and the trees
# patches/trees.json runs test/spec on.
TREE = os.environ.get("DCP_DSPARK_TREE", "stock")
MAP_TREES = tuple(label for label, t in TREES.items() if label == "stock" or "test/spec" in t.test_dirs)


def _version(release: str) -> tuple[int, ...]:
    return tuple(map(int, release.split(".")))


MAPPED = sorted({TREES[label].sglang for label in MAP_TREES}, key=_version)
on_a_mapped_tree = pytest.mark.skipif(
    TREE not in MAP_TREES, reason=f"the pass map is generated on stock sglang {MAPPED[0]} to {MAPPED[-1]} ({', '.join(MAP_TREES)}), not on {TREE}")

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
COMMAND = ("-m", "emulation.passmap")  # tools/ is on the path through the editable install
DATA = REPO / "tools" / "emulation" / "passmap" / "spec_passes.json"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, *COMMAND, *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=600)


@functools.cache
def _controls_run() -> dict:
    """Both negative controls and the freshness check in one child (one sglang import), and this tree's release."""
    out = _run("--control", "shift-write,no-translate,shift-mha-write,no-lse", "--check")
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _release() -> str:
    return _controls_run()["release"]


@on_a_mapped_tree
def test_fresh_for_this_tree() -> None:
    """The committed entries for this tree's release are what the harness measures now."""
    release = _release()
    data = json.loads(DATA.read_text(encoding="utf-8"))
    if not any(c["release"] == release for c in data["cases"]):
        pytest.fail(f"no committed pass-map entries for sglang {release}: run "
                    f"PYTHONPATH=<tree> python -m emulation.passmap --write")
    assert _controls_run()["check"], (f"sglang {release}: the harness measures other verdicts than the committed "
                                      f"map: run PYTHONPATH=<tree> python -m emulation.passmap --check / --write")


def _controls(name: str) -> list[dict]:
    return _controls_run()["controls"][name]


def _committed(release: str) -> dict:
    data = json.loads(DATA.read_text(encoding="utf-8"))
    return {(c["dcp"], c["rank"]): c for c in data["cases"]
            if c["release"] == release and c["algorithm"] == "NEXTN" and c["target_backend"] == "flashinfer_mla"}


@on_a_mapped_tree
@pytest.mark.parametrize("control, passes", [
    # a one-row shift in set_mla_kv_buffer's rows
    ("shift-write", ("EXTEND", "DRAFT_DECODE_EAGER", "TARGET_VERIFY_GRAPH", "TARGET_VERIFY_EAGER")),
    # the DCP read translation removed: KVIndexTranslator.translate_dcp_read_ids (0.5.20 on), else
    # plan_dcp_decode_metadata in the flashinfer-MLA decode (0.5.18, 0.5.19)
    ("no-translate", ("DRAFT_DECODE_EAGER", "TARGET_VERIFY_GRAPH")),
])
def test_negative_control(control: str, passes: tuple[str, ...]) -> None:
    """A pass the committed map calls consistent at dcp > 1 reads wrong rows once the write or read is broken."""
    release = _release()
    committed = _committed(release)
    checked = 0
    for case in _controls(control):
        before = committed.get((case["dcp"], case["rank"]))
        for name in passes:
            if before is None or before["passes"][name]["verdict"] != "consistent":
                continue  # only a formerly consistent pass says anything here
            assert case["passes"][name]["verdict"] == "wrong-rows", (control, name, case["dcp"], case["rank"],
                                                                      case["passes"][name])
            checked += 1
    if not checked:
        pytest.skip(f"sglang {release}: no NEXTN pass is consistent at dcp > 1 in the committed map")


@on_a_mapped_tree
def test_probe_control() -> None:
    """The trtllm_mla probe's refusal is the release's DCP check, not a failure to build: at dcp 1 the same factory
    call gets past it."""
    control = _controls_run()["probe_control"]
    assert control["verdict"] != "not-admitted", control
    committed = [r for r in json.loads(DATA.read_text(encoding="utf-8"))["probes"]
                 if r["release"] == _release() and "trtllm_mla" in r["probe"]]
    assert committed and committed[0]["verdict"] == "not-admitted", committed


@on_a_mapped_tree
def test_negative_control_on_the_dense_draft_block() -> None:
    """DSPARK's draft block, read on the real flashinfer and trtllm_mha backend objects (eager and CUDA graph): a
    one-row shift in the dense draft's write door turns each formerly consistent reading wrong-rows."""
    release = _release()
    data = json.loads(DATA.read_text(encoding="utf-8"))
    committed = {(c["draft_backend_flag"], c["dcp"], c["rank"]): c for c in data["cases"]
                 if c["release"] == release and c["algorithm"] == "DSPARK" and c["target_backend"] == "flashinfer_mla"}
    checked = 0
    for case in _controls("shift-mha-write"):
        before = committed[(case["draft_backend_flag"], case["dcp"], case["rank"])]["passes"]["DRAFT_EXTEND"]
        if before["verdict"] != "consistent":
            continue
        assert case["passes"]["DRAFT_EXTEND"]["verdict"] == "wrong-rows", (case["draft_backend_flag"], case["dcp"],
                                                                           case["rank"], case["passes"]["DRAFT_EXTEND"])
        checked += 1
    assert checked, f"sglang {release}: no DSPARK draft block is consistent in the committed map"


def _committed_plain(release: str, backend: str) -> dict:
    data = json.loads(DATA.read_text(encoding="utf-8"))
    return {(r["dcp"], r["rank"]): r for r in data["plain"] if r["release"] == release and r["target_backend"] == backend}


@on_a_mapped_tree
@pytest.mark.parametrize("control, verdicts", [
    # a one-row shift in set_mla_kv_buffer's rows: every pass of the plain target reads wrong rows
    ("shift-write", {"EXTEND": "wrong-rows", "DECODE_EAGER": "wrong-rows", "DECODE_GRAPH": "wrong-rows"}),
    # the decode kernel answers without the LSE the backend asked for: the model's unpack fails
    ("no-lse", {"DECODE_EAGER": "raises", "DECODE_GRAPH": "raises"}),
])
def test_negative_control_on_the_plain_target(control: str, verdicts: dict) -> None:
    """The plain flashinfer-MLA target, which the committed map reads consistent at dcp > 1, is found broken once its
    write door or its decode kernel's LSE is broken: the map can see both a wrong row and a missing LSE."""
    release = _release()
    committed = _committed_plain(release, "flashinfer_mla")
    checked = 0
    for record in _controls_run()["plain_controls"][control]:
        before = committed[(record["dcp"], record["rank"])]["passes"]
        for name, verdict in verdicts.items():
            assert before[name]["verdict"] == "consistent", (release, name, before[name])
            assert record["passes"][name]["verdict"] == verdict, (control, name, record["dcp"], record["passes"][name])
            checked += 1
    assert checked


@on_a_mapped_tree
def test_plain_dcp_on_fa3_is_found_broken() -> None:
    """fa3 has no DCP code: its decode returns no LSE for the model to merge with, which the map records at dcp > 1
    (and not at dcp 1, where the model does not ask for one)."""
    release = _release()
    committed = _committed_plain(release, "fa3")
    for (dcp, rank), record in committed.items():
        decode = record["passes"]["DECODE_EAGER"]
        if dcp == 1:
            assert decode["verdict"] == "consistent", (release, rank, decode)
        else:
            assert decode["verdict"] == "raises" and "attn_mqa_for_dcp_decode" not in decode["detail"], decode
            assert "no LSE" in decode["detail"], decode
