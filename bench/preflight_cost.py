"""What one ``sglang-dcp-dspark preflight`` costs: peak RSS and wall time, flat in the size of the launch it judges.

Each run is a fresh Python process, measured from outside (``os.wait4``: the
child's own peak resident set, not the maximum over every child):

- ``import sglang.srt.server_args``, the floor any preflight pays;
- preflight on its embedded default (DeepSeek-V3 with a one-layer MLA DSPARK
  draft, DCP 8 + HiCache, 540,000 device rows per rank);
- the same launch at 10x and 100x those device rows. No GPU holds that many
  rows of this geometry, and preflight refuses such a --device-rows as bad
  input, so these runs emulate a GPU 10x and 100x as large and lift
  preflight's bound on GPU memory inside the child; the pools sized are
  really 10x and 100x larger (up to ~10^9 logical slots).

Goal: peak RSS within 10% across the three preflight runs, and within 1.5x of
the import. Wall time is reported, not judged: on a shared machine it moves
with the load.

    python bench/preflight_cost.py [--repeats N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from sglang_dcp_dspark.preflight import Node

SCALES = (1, 10, 100)
RSS_SPREAD_GOAL = 0.10
RSS_OVER_IMPORT_GOAL = 1.5
MB = 1e6

# The child for a scaled run: the same CLI, with the per-GPU memory bound
# lifted so that 10x and 100x the rows describe an (impossible) larger GPU
# instead of bad input.
SCALED_CHILD = """
import sys
from sglang_dcp_dspark import preflight
preflight.MAX_GPU_MEMORY_GIB = float("inf")
from sglang_dcp_dspark.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def measure(argv: list[str]) -> dict:
    """Run ``argv`` in a fresh process; its exit code, wall seconds, peak RSS (bytes) and stdout."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        child = subprocess.Popen(argv, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if child.returncode not in (0, 1, 3):  # a preflight verdict, not a crash or bad input
        raise SystemExit(f"error: {' '.join(argv[:4])} ... exited {child.returncode}: {stderr.strip()[-500:]}")
    return {"exit": child.returncode, "wall_s": wall, "peak_rss": usage.ru_maxrss * 1024, "stdout": stdout}


def preflight_argv(scale: int, device_rows: int | None) -> list[str]:
    argv = [sys.executable, "-c", SCALED_CHILD, "preflight", "--json"]
    if scale != 1:
        argv += ["--gpu-memory-gib", str(Node.gpu_memory_gib * scale), "--device-rows", str(device_rows * scale)]
    return argv


def run(repeats: int) -> dict:
    import_argv = [sys.executable, "-W", "ignore", "-c", "import sglang.srt.server_args"]
    rows = []
    baseline = [measure(import_argv) for _ in range(repeats)]
    rows.append({"run": "import sglang.srt.server_args", "device_rows": None, **_median(baseline)})
    base_rows = None
    for scale in SCALES:
        runs = [measure(preflight_argv(scale, base_rows)) for _ in range(repeats)]
        report = json.loads(runs[0]["stdout"])
        rows_here = report["sizing"]["geometry"]["device_rows"]
        if scale == 1:
            base_rows = rows_here
        label = "preflight, embedded default" if scale == 1 else f"preflight, {scale}x device rows"
        rows.append({"run": label, "device_rows": rows_here,
                     "logical_slots": report["sizing"]["geometry"]["target"]["logical_slots"], **_median(runs)})
    flight = [r["peak_rss"] for r in rows[1:]]
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "repeats": repeats,
        "rows": rows,
        "rss_spread": (max(flight) - min(flight)) / min(flight),
        "rss_over_import": max(flight) / rows[0]["peak_rss"],
    }


def _median(runs: list[dict]) -> dict:
    return {
        "exit": runs[0]["exit"],
        "peak_rss": statistics.median(r["peak_rss"] for r in runs),
        "wall_s": statistics.median(r["wall_s"] for r in runs),
    }


def render(result: dict) -> str:
    out = [f"preflight cost, fresh processes (median of {result['repeats']}; {result['machine']}):",
           f"  {'run':<32} {'device rows':>13} {'logical slots':>15} {'exit':>4} {'peak RSS':>10} {'wall':>8}"]
    for r in result["rows"]:
        rows = "" if r["device_rows"] is None else f"{r['device_rows']:,}"
        slots = f"{r['logical_slots']:,}" if r.get("logical_slots") else ""
        out.append(f"  {r['run']:<32} {rows:>13} {slots:>15} {r['exit']:>4} {r['peak_rss'] / MB:>7,.0f} MB {r['wall_s']:>6.1f} s")
    spread, ratio = result["rss_spread"], result["rss_over_import"]
    out.append(f"peak RSS spread across the three preflight runs: {spread:.1%} "
               f"(goal <= {RSS_SPREAD_GOAL:.0%}: {'met' if spread <= RSS_SPREAD_GOAL else 'MISSED'})")
    out.append(f"largest preflight peak RSS / import's: {ratio:.2f}x "
               f"(goal <= {RSS_OVER_IMPORT_GOAL}x: {'met' if ratio <= RSS_OVER_IMPORT_GOAL else 'MISSED'})")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, metavar="N", help="fresh processes per run (median; default 1)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(max(1, args.repeats))
    print(json.dumps(result, indent=2) if args.json else render(result))
    met = result["rss_spread"] <= RSS_SPREAD_GOAL and result["rss_over_import"] <= RSS_OVER_IMPORT_GOAL
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
