"""The HiCache host rows and auto-size estimate of one sglang 0.5.23 tree, at full scale, as JSON-ready figures.

Imported by test_plugin_parity.py for this process's figures, and run as a
child process with PYTHONPATH on the series tree (build/trees/sglang-0.5.23-next)
for the series' own:

    PYTHONPATH=build/trees/sglang-0.5.23-next:test python -m upstream_next.parity --out FILE

Only sglang and pools.py are imported: no plugin, no project code, so the
child's figures are the series' alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from emulation import rank_pools as P

DCP_SIZES = (1, 2, 4, 8)
BUDGETS_GB = (0.05, 1.0, 100.0)
# test_budget.py's FULL_SCALE: a DeepSeek-V3-like target (61 MLA layers), 500k device rows, a one-layer MLA draft.
FULL_SCALE = dict(device_rows=500_000, target_layers=61, draft_layers=1)


def case_id(dcp: int, budget_gb: float) -> str:
    return f"dcp {dcp}, --hicache-size {budget_gb:g}"


def figures() -> dict:
    """{"sglang": the tree's path, "rows": {case: [target host rows, draft host rows]}, "estimate": {dcp: bytes}}."""
    import sglang

    rows: dict[str, list[int]] = {}
    estimate: dict[str, int] = {}
    for dcp in DCP_SIZES:
        for budget_gb in BUDGETS_GB:
            rank = P.Rank(dcp, hicache_size=budget_gb, **FULL_SCALE)
            with P.on_rank(rank):
                pools = P.build(rank)
            rows[case_id(dcp, budget_gb)] = [int(pools.target_host.size), int(pools.draft_host.size)]
        # The estimate reads the device pools only (and the DCP width): no host pool is built for it.
        rank = P.Rank(dcp, **FULL_SCALE)
        with P.on_rank(rank):
            estimate[f"dcp {dcp}"] = P.auto_size_estimate(P.device_pools(rank))
    return {"sglang": str(Path(sglang.__file__).resolve().parent.parent), "rows": rows, "estimate": estimate}


TEST_DIR = Path(__file__).resolve().parents[1]
CHILD_TIMEOUT_S = 300


class SeriesChild:
    """This module run on ``series_tree`` in a child process, started now and read by :meth:`figures`.

    Started as soon as the parity tests are collected (conftest), so that the
    child's sglang import overlaps the tests that run before them.
    """

    def __init__(self, series_tree: Path) -> None:
        self.series_tree = series_tree
        self.tmp = Path(tempfile.mkdtemp(prefix="upstream-next-parity-"))
        self.out = self.tmp / "series.json"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(series_tree), str(TEST_DIR)]),
                   # Nothing of the plugin may reach the series' figures, even through an entry point.
                   SGLANG_ENABLE_DCP_DSPARK_PLUGIN="0")
        env.pop("DCP_DSPARK_TREE", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "upstream_next.parity", "--out", str(self.out)],
                                     cwd=TEST_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._figures: dict | None = None

    def figures(self) -> dict:
        """The child's figures; RuntimeError (never an AssertionError, which a strict xfail would take) if it failed."""
        if self._figures is not None:
            return self._figures
        try:
            try:
                log, _ = self.proc.communicate(timeout=CHILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                log, _ = self.proc.communicate()
            if self.proc.returncode != 0 or not self.out.is_file():
                raise RuntimeError(f"the series' child exited {self.proc.returncode}: {log[-3000:]}")
            got = json.loads(self.out.read_text())
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if Path(got["sglang"]) != self.series_tree.resolve():
            raise RuntimeError(f"the series' child imported sglang from {got['sglang']}, not {self.series_tree}")
        self._figures = got
        return got

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        shutil.rmtree(self.tmp, ignore_errors=True)


_child: SeriesChild | None = None


def series_child(series_tree: Path) -> SeriesChild:
    """The one child of this session (started on first call)."""
    global _child
    if _child is None:
        _child = SeriesChild(series_tree)
    return _child


def stop_series_child() -> None:
    if _child is not None:
        _child.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    args.out.write_text(json.dumps(figures(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
