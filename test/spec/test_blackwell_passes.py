"""The pass map's Blackwell rows (``emulation.passmap.blackwell``): cutedsl_mla and trtllm_mla judged by their reads
and by numbers, on the release's own backends over the kernel's oracle; each control breaks what it must.

The rows themselves are checked fresh with the rest of the map (test_passmap.py); here, on 0.5.17 and 0.5.23 (the
releases the issue names), one child runs every Blackwell pass at dcp 2 without a control and under each of
``decode_dcp``'s controls that act at that width (no-fixup needs a rank with no key of a request: the numerics
harness's short shapes catch it, test/numerics/test_decode_dcp.py).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TREE = os.environ.get("DCP_DSPARK_TREE", "stock")
REPO = Path(__file__).resolve().parents[2]
CONTROLS = ("shift-write", "flipped-bound", "lse-base")
pytestmark = pytest.mark.skipif(TREE not in ("stock", "next-stock"),
                                reason=f"the Blackwell controls run on stock 0.5.17 and 0.5.23, not on {TREE}")


@functools.cache
def runs() -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-m", "emulation.passmap.blackwell", "--control",
                          ",".join(("none", *CONTROLS))], capture_output=True, text=True, env=env, cwd=REPO,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def consistent(backend: str) -> set[str]:
    return {name for name, v in runs()["runs"]["none"][backend].items() if v == "consistent"}


def test_cutedsl_mla_runs_every_pass_right() -> None:
    """The backend of PR #35221's validated shape: every pass consistent at dcp 2, on 0.5.17 and on 0.5.23."""
    got = runs()["runs"]["none"]["cutedsl_mla"]
    assert set(got.values()) == {"consistent"}, got


def test_trtllm_mla_decode_by_release() -> None:
    """0.5.17's trtllm_mla decode hands the kernel pages past the rank's cache (fixed upstream by #33926); 0.5.23's
    reads its own rows. Its verify under DCP raises on both, by design."""
    got = runs()["runs"]["none"]["trtllm_mla"]
    want = "wrong-rows" if runs()["release"] == "0.5.17" else "consistent"
    assert got["DECODE_EAGER"] == got["DECODE_GRAPH"] == want, got
    assert got["EXTEND"] == "consistent", got
    assert got["DSPARK:TARGET_VERIFY_EAGER"] == got["DSPARK:TARGET_VERIFY_GRAPH"] == "raises", got


@pytest.mark.parametrize("control, caught, verdicts", [
    ("shift-write", ("EXTEND", "DECODE_EAGER", "DECODE_GRAPH", "DSPARK:TARGET_VERIFY_EAGER"), {"wrong-rows"}),
    ("flipped-bound", ("DSPARK:TARGET_VERIFY_EAGER", "DSPARK:TARGET_VERIFY_GRAPH"), {"wrong-rows"}),
    ("lse-base", ("DECODE_EAGER", "DECODE_GRAPH", "DSPARK:TARGET_VERIFY_GRAPH"), {"wrong-output"}),
])
def test_control_is_caught(control: str, caught: tuple[str, ...], verdicts: set[str]) -> None:
    """Each pass consistent without the control is found broken with it, by its reads or by its numbers."""
    seen = 0
    for backend, got in runs()["runs"][control].items():
        for name in caught:
            if name in consistent(backend):
                assert got[name] in verdicts, (control, backend, name, got[name])
                seen += 1
    assert seen, f"{control}: no pass it acts on was consistent without it"
