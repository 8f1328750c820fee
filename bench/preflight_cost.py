"""What one ``sglang-dcp-dspark preflight`` costs: peak RSS and wall time, flat in the size of the launch it judges.

Each run is a fresh Python process, measured from outside (``os.wait4``: the
child's own peak resident set, not the maximum over every child), on the
venv's sglang or, with ``--tree DIR``, on the tree at DIR (``PYTHONPATH=DIR``
in every child; the release each child really ran is read back and checked):

- ``import sglang.srt.server_args``, the bare import, for information;
- preflight's honest floor: a process that imports sglang's server_args and
  ModelConfig (with the quantization modules ModelConfig reads) and runs
  sglang's own resolution of the same launch once on the emulated node
  (preflight's node emulation and release adapter, which are what let
  sglang resolve a launch for GPUs this machine does not have). preflight
  cannot judge a launch with less;
- one judgement of preflight's embedded default launch (DeepSeek-V3 with a
  dense DSparkDraftModel DSPARK draft, TP 8 + DCP 8 + HiCache, 470,000 device rows per
  rank on an 8 x H200 node with 2,048 GiB of host RAM);
- the same launch at 10x and 100x those device rows, on a node with 10x and
  100x the GPU memory and host RAM (so the verdict, and the code it runs
  through, stay the same). No node has that much, and preflight refuses such
  numbers as bad input, so the child lifts preflight's bounds on GPU memory
  and host RAM (``MAX_GPU_MEMORY_GIB``, ``MAX_HOST_RAM_GIB``); the pools
  sized are really 10x and 100x larger (up to ~10^9 logical slots);
- a sweep of the 1x launch over N values (``--sweep``, default
  ``dcp=1,2,4,8``): one process, sglang imported once, N judgements.

The runs are interleaved (one of each per round) so that a change in the
machine's load hits them alike; figures are medians over the rounds. Each
row gives the process's wall time, its CPU time (user + system, less moved
by other jobs on the machine) and, for preflight, the seconds (wall and CPU)
spent inside ``preflight.judge()`` (timed in the child), which separate the judgements'
own cost from the import's; and, for one judgement, where its time goes by stage
(torch; ``import_sglang``, server_args with the ModelConfig and quantization
modules a judgement needs beyond the bare import; the rest of ``prepare``, the
configs and the release adapter; then in ``judge()`` sglang's own resolution,
the series a tree carries, the pass map, the models and the host pools). The
load average is printed with the figures.

Targets, all from figures measured in the same run:

- peak RSS of one judgement within 1.5x of the bare import's;
- peak RSS flat from 1x to 100x the device rows (largest / smallest <= 1.10);
- one judgement's wall time within 1.15x of the floor's (the median of each
  round's pair), and preflight's own stages (everything but torch, sglang's
  import and sglang's resolutions) at most 10% of that wall time;
- a sweep costs under 2 s of wall time per value past the first:
  (sweep of N values - one judgement) / (N - 1), the median over the rounds
  of each round's sweep against its judgement (the same from the median
  walls, the CPU times and judge() is printed beside it).

Exits 0 when every measurement ran (met or not: the table says), 1 when one
failed to run (a crash, bad input, or the wrong sglang).

    python bench/preflight_cost.py [--tree DIR] [--repeats N] [--sweep NAME=V1,...] [--json] [--smoke]

``--smoke`` runs each case once, at 1x only, with a two-value sweep: it proves the bench runs (make bench-smoke);
its figures are no measurement.
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
from pathlib import Path

from sglang_dcp_dspark.core.exits import VERDICTS

SCALES = (1, 10, 100)
DEFAULT_SWEEP = "dcp=1,2,4,8"
RSS_OVER_IMPORT_GOAL = 1.5
RSS_FLAT_GOAL = 1.10  # largest / smallest peak RSS across the scales
SWEEP_PER_VALUE_GOAL_S = 2.0
# Wall of one judgement of the default over its floor (sglang's import and its own resolution), per round's pair.
WALL_OVER_FLOOR_GOAL = 1.15
# preflight's own stages (the rest of prepare, the series, the pass map, the models, the pools) over its wall.
OWN_SHARE_GOAL = 0.10
MB = 1e6

# preflight's embedded default launch, spelled out so that each scale gives
# the same flags: its device rows and the node it is judged on.
BASE_DEVICE_ROWS = 470_000
BASE_GPU_MEMORY_GIB = 141.0
BASE_HOST_RAM_GIB = 2048.0

# The child for every preflight run: the same CLI, with preflight's bounds on
# one GPU's memory and one node's RAM lifted, so that 10x and 100x the rows
# describe an (impossible) larger node instead of bad input.
#
# It also times each call of preflight.judge() (one per judgement; run() and
# sweep() look it up at call time) and says the total on stderr, so the cost
# of the judgements can be read apart from the import, which dominates the
# process's wall time and its noise. A launch that does not pass is advised:
# the advice judges the changes it tries through the same judge(), inside the
# judgement it belongs to, so only the outermost calls are counted, each with
# its advice's time in it.
PREFLIGHT_CHILD = """
import sys, time
from sglang_dcp_dspark.preflight import check as preflight
from sglang_dcp_dspark.preflight import inputs
inputs.MAX_GPU_MEMORY_GIB = float("inf")
inputs.MAX_HOST_RAM_GIB = float("inf")
_judge, _spent, _cpu, _depth = preflight.judge, [], [], [0]
def judge(*args, **kwargs):
    if _depth[0]:
        return _judge(*args, **kwargs)
    _depth[0] += 1
    start, cpu = time.perf_counter(), time.process_time()
    try:
        return _judge(*args, **kwargs)
    finally:
        _depth[0] -= 1
        _spent.append(time.perf_counter() - start)
        _cpu.append(time.process_time() - cpu)
preflight.judge = judge
# Where the time goes: wall seconds in each stage, by the module-level names judge() and run() call.
import json
_stages = {}
# torch first, timed on its own: sglang's import starts with it, and preflight's package imports it too.
_start = time.perf_counter()
import torch
_stages["torch"] = time.perf_counter() - _start
# The sglang modules a stage imports (sglang's code, not preflight's): each first import's own execution, nested
# ones inside their importer's, charged to the innermost stage running.
import importlib.abc, importlib.machinery
_running, _sglang_in, _importing = [], {}, [0]
class _SglangImports(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if not _running or fullname.split(".")[0] != "sglang":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module
        def exec_module(module):
            if _importing[0]:
                return execute(module)
            _importing[0] += 1
            stage, start = _running[-1], time.perf_counter()
            try:
                return execute(module)
            finally:
                _importing[0] -= 1
                _sglang_in[stage] = _sglang_in.get(stage, 0.0) + time.perf_counter() - start
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, _SglangImports())
def _timed(module, name):
    fn = getattr(module, name)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        _running.append(name)
        try:
            return fn(*args, **kwargs)
        finally:
            _running.pop()
            _stages[name] = _stages.get(name, 0.0) + time.perf_counter() - start
    setattr(module, name, timed)
from sglang_dcp_dspark.preflight import launch as launch_mod
_timed(launch_mod, "import_sglang")
for _name in STAGES[2:]:
    _timed(preflight, _name)
from sglang_dcp_dspark.__main__ import main
try:
    code = main(sys.argv[1:])
finally:
    print(f"JUDGE_SECONDS {sum(_spent)!r} {sum(_cpu)!r} {len(_spent)}", file=sys.stderr, flush=True)
    print("STAGE_SECONDS " + json.dumps(_stages), file=sys.stderr, flush=True)
    print("SGLANG_IMPORT_SECONDS " + json.dumps(_sglang_in), file=sys.stderr, flush=True)
sys.exit(code)
"""
# preflight's stages, timed in the child: the sglang modules a judgement needs (server_args, which the bare import
# times alone, and ModelConfig's and the quantization modules), the rest of prepare (preflight's input, the configs,
# the release adapter), then inside judge(): sglang's resolution (stock and with the plugin), the series a tree
# carries, the pass map, the models and the host pools (with the plugin's hooks judged on the release's code).
STAGES = ("torch", "import_sglang", "prepare", "resolve", "applied_series", "judge_passes", "read_models", "size_pools")
OWN_STAGES = STAGES[4:]
PREFLIGHT_CHILD = f"STAGES = {STAGES!r}\n" + PREFLIGHT_CHILD

IMPORT_CHILD = """
import sglang.srt.server_args
import importlib.metadata, sglang
print(importlib.metadata.version("sglang"), sglang.__file__)
"""

# The floor: sglang's import (server_args, ModelConfig and what it reads, as preflight imports them) and one
# resolution of the same launch by sglang's own code on the same emulated node, as it runs (with the plugin's hooks
# where the plugin is on); nothing of preflight's judgement. Like preflight, it leaves torch.compile out of sglang's import (launch.kernels_uncompiled): neither runs a kernel.
FLOOR_CHILD = """
import sys
from sglang_dcp_dspark.preflight import inputs, launch, releases, resolution
@launch.kernels_uncompiled
def floor():
    launch.import_sglang()
    release = releases.installed()
    node = inputs.default_node(gpu_memory_gib=float(sys.argv[1]), host_ram_gib=float(sys.argv[2]))
    # As the launch runs: with the plugin's hooks where sglang's load_plugins() would run the plugin (0.5.17 rejects
    # the default stock).
    as_run = resolution.plugin_state().enabled
    return release, resolution.resolve(release, inputs.default_launch(), node, {}, hooked=as_run)
release, resolved = floor()
print(release.version, resolved.passed)
"""


class Failed(Exception):
    """A measurement did not run."""


def child_env(tree: Path | None) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return env




def measure(argv: list[str], env: dict, label: str) -> dict:
    """Run ``argv`` in a fresh process; its exit code, wall seconds, peak RSS (bytes) and stdout."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        child = subprocess.Popen(argv, stdout=out, stderr=err, text=True, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if code not in VERDICTS:  # a preflight verdict (core/exits.py), not a crash or bad input
        raise Failed(f"{label}: exited {code}: {stderr.strip()[-800:]}")
    judge = [ln.split() for ln in stderr.splitlines() if ln.startswith("JUDGE_SECONDS ")]
    stages = [json.loads(ln.split(" ", 1)[1]) for ln in stderr.splitlines() if ln.startswith("STAGE_SECONDS ")]
    imported = [json.loads(ln.split(" ", 1)[1]) for ln in stderr.splitlines()
                if ln.startswith("SGLANG_IMPORT_SECONDS ")]
    return {"exit": code, "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss": usage.ru_maxrss * 1024,
            "judge_s": float(judge[-1][1]) if judge else None, "judge_cpu_s": float(judge[-1][2]) if judge else None,
            "judgements": int(judge[-1][3]) if judge else 0, "stages": stages[-1] if stages else {},
            "sglang_imports": imported[-1] if imported else {},
            "stdout": stdout}


def node_flags(scale: int) -> list[str]:
    return ["--gpu-memory-gib", f"{BASE_GPU_MEMORY_GIB * scale:g}", "--host-ram-gib", f"{BASE_HOST_RAM_GIB * scale:g}",
            "--device-rows", str(BASE_DEVICE_ROWS * scale)]


def cases(sweep: str, scales: tuple[int, ...] = SCALES) -> list[dict]:
    py = sys.executable
    out = [{"key": "import", "run": "import sglang.srt.server_args", "argv": [py, "-W", "ignore", "-c", IMPORT_CHILD]},
           {"key": "floor", "run": "floor: sglang's import + its resolution",
            "argv": [py, "-W", "ignore", "-c", FLOOR_CHILD, f"{BASE_GPU_MEMORY_GIB:g}", f"{BASE_HOST_RAM_GIB:g}"]}]
    for scale in scales:
        out.append({"key": f"x{scale}", "scale": scale,
                    "run": "preflight, one judgement (1x)" if scale == 1 else f"preflight, {scale}x device rows",
                    "argv": [py, "-c", PREFLIGHT_CHILD, "preflight", "--json", *node_flags(scale)]})
        if scale == 1:  # the sweep runs right after the judgement it is weighed against
            out.append({"key": "sweep", "run": f"preflight --sweep {sweep} (1x)",
                        "argv": [py, "-c", PREFLIGHT_CHILD, "preflight", "--json", "--sweep", sweep, *node_flags(1)]})
    return out


def read_back(case: dict, run: dict) -> dict:
    """What the child says it did: the release it ran, and for a judgement its rows and verdict."""
    if case["key"] == "import":
        version, _, where = run["stdout"].strip().splitlines()[-1].partition(" ")
        return {"release": version, "sglang_file": where}
    if case["key"] == "floor":
        version, _, passed = run["stdout"].strip().splitlines()[-1].partition(" ")
        if passed != "True":
            raise Failed("floor: sglang's resolution rejected the default launch; expected it to pass, as preflight says; "
                         "fix: run the bench with the plugin installed and on (make setup)")
        return {"release": version}
    try:
        report = json.loads(run["stdout"])
    except ValueError as exc:
        raise Failed(f"{case['run']}: no JSON on stdout ({exc})") from None
    if case["key"] == "sweep":
        return {"release": report["release"], "values": len(report["rows"]),
                "verdicts": [r["report"]["verdict"]["outcome"] for r in report["rows"]]}
    sizing = report.get("sizing", {})
    target = next((p for p in sizing.get("pools", []) if p["role"] == "target"), None)
    return {"release": report["release"]["sglang"], "adapter": report["release"]["adapter"],
            "verdict": report["verdict"]["outcome"], "device_rows": sizing.get("device_rows"),
            "logical_slots": target["logical_slots"] if target else None}


def loadavg() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def run(tree: Path | None, repeats: int, sweep: str, scales: tuple[int, ...] = SCALES) -> dict:
    env = child_env(tree)
    todo = cases(sweep, scales)
    runs: dict[str, list[dict]] = {c["key"]: [] for c in todo}
    seen: dict[str, dict] = {}
    load_before = loadavg()
    for _ in range(repeats):
        for case in todo:  # one of each per round: drift in the load hits every case alike
            r = measure(case["argv"], env, case["run"])
            runs[case["key"]].append(r)
            seen.setdefault(case["key"], read_back(case, r))
    load_after = loadavg()

    imported = seen["import"]
    if tree is not None and not Path(imported["sglang_file"]).resolve().is_relative_to(tree):
        raise Failed(f"--tree {tree}: the child imported sglang from {imported['sglang_file']}, not from the tree")
    for key, got in seen.items():
        if got["release"] != imported["release"]:
            raise Failed(f"{key}: ran sglang {got['release']}, the import ran {imported['release']}")
    for scale in scales:
        got = seen[f"x{scale}"]
        if got["device_rows"] != BASE_DEVICE_ROWS * scale:
            raise Failed(f"{scale}x: preflight sized {got['device_rows']} device rows, expected {BASE_DEVICE_ROWS * scale}")

    rows = []
    for case in todo:
        rs = runs[case["key"]]
        rows.append({"key": case["key"], "run": case["run"], **{k: v for k, v in seen[case["key"]].items() if k != "sglang_file"},
                     "exit": rs[0]["exit"], "peak_rss": statistics.median(r["peak_rss"] for r in rs),
                     "wall_s": statistics.median(r["wall_s"] for r in rs),
                     "cpu_s": statistics.median(r["cpu_s"] for r in rs),
                     "judge_s": statistics.median(r["judge_s"] for r in rs) if rs[0]["judge_s"] is not None else None,
                     "judge_cpu_s": statistics.median(r["judge_cpu_s"] for r in rs) if rs[0]["judge_s"] is not None else None,
                     "judgements": rs[0]["judgements"],
                     "stages": {name: statistics.median(r["stages"].get(name, 0.0) for r in rs) for name in STAGES}
                     if rs[0]["stages"] else None,
                     "wall_runs": [round(r["wall_s"], 2) for r in rs], "rss_runs": [r["peak_rss"] for r in rs]})
    by = {r["key"]: r for r in rows}
    scaled = [by[f"x{s}"]["peak_rss"] for s in scales]
    n_values = by["sweep"]["values"]
    if by["sweep"]["judgements"] != n_values or by["x1"]["judgements"] != 1:
        raise Failed(f"expected 1 and {n_values} judgements, the children made {by['x1']['judgements']} and {by['sweep']['judgements']}")
    added = max(1, n_values - 1)
    # Judged per round: the sweep against the judgement run next to it, so that drift in the load cancels.
    per_round = [(s["wall_s"] - o["wall_s"]) / added for s, o in zip(runs["sweep"], runs["x1"], strict=True)]
    per_value = statistics.median(per_round)
    wall_pairs = [o["wall_s"] / i["wall_s"] for o, i in zip(runs["x1"], runs["import"], strict=True)]
    wall_ratio = statistics.median(wall_pairs)
    floor_pairs = [o["wall_s"] / f["wall_s"] for o, f in zip(runs["x1"], runs["floor"], strict=True)]
    floor_ratio = statistics.median(floor_pairs)
    own_shares = [own_seconds(r["stages"], r["sglang_imports"]) / r["wall_s"] for r in runs["x1"]]
    own_share = statistics.median(own_shares)
    own_imports = statistics.median(own_seconds(r["stages"], r["sglang_imports"], imports_only=True)
                                    for r in runs["x1"])
    return {
        "wall_over_floor": floor_ratio, "wall_over_floor_per_round": [round(x, 3) for x in floor_pairs],
        "own_share": own_share, "own_share_per_round": [round(x, 3) for x in own_shares],
        "own_stages_sglang_imports_s": own_imports,
        "wall_over_import": wall_ratio, "wall_over_import_per_round": [round(x, 3) for x in wall_pairs],
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "tree": str(tree) if tree else None,
        "sglang": imported["release"], "sglang_file": imported["sglang_file"],
        "adapter": by["x1"].get("adapter"),
        "repeats": repeats, "sweep": sweep,
        "load_average": {"before": load_before, "after": load_after},
        "rows": rows,
        "rss_over_import": by["x1"]["peak_rss"] / by["import"]["peak_rss"],
        "rss_largest_over_import": max(scaled) / by["import"]["peak_rss"],
        "rss_100x_over_1x": by[f"x{scales[-1]}"]["peak_rss"] / by["x1"]["peak_rss"],
        "rss_flat": max(scaled) / min(scaled),
        "sweep_values": n_values,
        "sweep_over_single_s": by["sweep"]["wall_s"] - by["x1"]["wall_s"],
        "sweep_per_added_value_s": per_value,
        "sweep_per_added_value_per_round_s": [round(x, 2) for x in per_round],
        "sweep_per_added_value_of_medians_s": (by["sweep"]["wall_s"] - by["x1"]["wall_s"]) / added,
        "sweep_per_added_value_cpu_s": (by["sweep"]["cpu_s"] - by["x1"]["cpu_s"]) / added,
        "sweep_per_added_value_judge_s": (by["sweep"]["judge_s"] - by["x1"]["judge_s"]) / added,
        "sweep_per_added_value_judge_cpu_s": (by["sweep"]["judge_cpu_s"] - by["x1"]["judge_cpu_s"]) / added,
        "judge_s_per_sweep_value": by["sweep"]["judge_s"] / n_values,
        "targets": {
            "rss_over_import": by["x1"]["peak_rss"] / by["import"]["peak_rss"] <= RSS_OVER_IMPORT_GOAL,
            "rss_flat": max(scaled) / min(scaled) <= RSS_FLAT_GOAL,
            "sweep_per_added_value": per_value < SWEEP_PER_VALUE_GOAL_S,
            "wall_over_floor": floor_ratio <= WALL_OVER_FLOOR_GOAL,
            "own_share": own_share <= OWN_SHARE_GOAL,
        },
    }


def _secs(value) -> str:
    return "" if value is None else f"{value:.2f} s"


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def render(result: dict) -> str:
    where = f"--tree {result['tree']}" if result["tree"] else "the venv's sglang"
    out = [f"preflight cost on sglang {result['sglang']} ({where}; adapter {result['adapter']}), fresh processes, "
           f"median of {result['repeats']}; {result['machine']}",
           f"  load average (1/5/15 min): {result['load_average']['before']} before, {result['load_average']['after']} after",
           f"  {'run':<38} {'device rows':>12} {'target slots':>13} {'verdict':>8} {'peak RSS':>10} {'wall':>7} {'CPU':>7} {'judge()':>8} {'its CPU':>8}  wall per run (s)"]
    for r in result["rows"]:
        rows = "" if r.get("device_rows") is None else f"{r['device_rows']:,}"
        slots = "" if r.get("logical_slots") is None else f"{r['logical_slots']:,}"
        verdict = r.get("verdict") or (", ".join(sorted(set(r["verdicts"]))) if r.get("verdicts") else "")
        out.append(f"  {r['run']:<38} {rows:>12} {slots:>13} {verdict[:8]:>8} {r['peak_rss'] / MB:>7,.0f} MB "
                   f"{r['wall_s']:>5.2f} s {r['cpu_s']:>5.2f} s {_secs(r['judge_s']):>8} {_secs(r['judge_cpu_s']):>8}  {', '.join(f'{w:.2f}' for w in r['wall_runs'])}")
    t = result["targets"]
    out.append(f"wall, one judgement of the default / bare import, per round: median {result['wall_over_import']:.2f}x "
               f"(rounds: {', '.join(f'{x:.2f}' for x in result['wall_over_import_per_round'])}; for information)")
    out.append(f"peak RSS, one judgement / bare import: {result['rss_over_import']:.2f}x "
               f"(100x rows / import: {result['rss_largest_over_import']:.2f}x; target <= {RSS_OVER_IMPORT_GOAL}x): "
               f"{_met(t['rss_over_import'])}")
    out.append(f"peak RSS from 1x to 100x device rows: 100x / 1x = {result['rss_100x_over_1x']:.3f}, largest / smallest "
               f"= {result['rss_flat']:.3f} (target flat, <= {RSS_FLAT_GOAL:.2f}): {_met(t['rss_flat'])}")
    out.append(f"sweep of {result['sweep_values']} values vs one judgement, wall per added value: median over the rounds "
               f"{result['sweep_per_added_value_s']:+.2f} s (rounds: "
               f"{', '.join(f'{x:+.2f}' for x in result['sweep_per_added_value_per_round_s'])}; target < "
               f"{SWEEP_PER_VALUE_GOAL_S:g} s): {_met(t['sweep_per_added_value'])}")
    out.append(f"  from the median walls: {result['sweep_over_single_s']:+.2f} s in all, "
               f"{result['sweep_per_added_value_of_medians_s']:+.2f} s per added value; "
               f"from the median CPU times: {result['sweep_per_added_value_cpu_s']:+.2f} s per added value;")
    out.append("  "
               f"inside the children, judge(): {result['sweep_per_added_value_judge_s']:+.2f} s wall "
               f"({result['sweep_per_added_value_judge_cpu_s']:+.2f} s CPU) per added value "
               f"({result['judge_s_per_sweep_value']:.2f} s per sweep value, which adds the chart's setups, vs "
               f"{next(r for r in result['rows'] if r['key'] == 'x1')['judge_s']:.2f} s for one judgement)")
    out += _stage_lines(result)
    out.append(f"preflight's own stages / its wall, one judgement, less the sglang modules they import "
               f"({result['own_stages_sglang_imports_s']:.2f} s): median {result['own_share']:.1%} (rounds: "
               f"{', '.join(f'{x:.1%}' for x in result['own_share_per_round'])}; target <= {OWN_SHARE_GOAL:.0%}): "
               f"{_met(t['own_share'])}")
    # Last: the figure the bench is about, read first by an operator.
    out.append(f"wall, one judgement of the default / its floor (sglang's import + its resolution), per round: median "
               f"{result['wall_over_floor']:.2f}x (rounds: {', '.join(f'{x:.2f}' for x in result['wall_over_floor_per_round'])}"
               f"; target <= {WALL_OVER_FLOOR_GOAL}x): {_met(t['wall_over_floor'])}")
    return "\n".join(out)


def _stage_lines(result: dict) -> list[str]:
    out = []
    one = next(r for r in result["rows"] if r["key"] == "x1")
    over = one["wall_s"] - next(r for r in result["rows"] if r["key"] == "import")["wall_s"]
    stages = dict(one.get("stages") or {})
    if stages:
        imported = stages.pop("import_sglang")
        stages["prepare"] -= imported  # prepare calls import_sglang; the rest is the configs and the adapter
        out.append(f"where one judgement's time goes (medians, wall; {over:+.2f} s over the bare import in all): "
                   f"torch {stages.pop('torch'):.2f} s, import_sglang {imported:.2f} s (server_args, ModelConfig, "
                   f"quantization), the rest of prepare {stages.pop('prepare'):.2f} s (the configs; the release "
                   "adapter, which imports the sglang modules it asks), then in judge(): "
                   + ", ".join(f"{name.strip('_')} {stages[name]:.2f} s" for name in STAGES[3:]))
    return out


def own_seconds(stages: dict, imports: dict, *, imports_only: bool = False) -> float:
    """preflight's own stages in one judgement: the rest of prepare (its input, the configs, the adapter) and, in
    judge(), the series, the pass map, the models and the pools; not torch, sglang's import or its resolutions,
    nor the sglang modules those stages import (the scheduler, whose code the budget hook is judged on).
    ``imports_only``: those modules' import time instead."""
    if not stages:
        raise Failed("the preflight child said no stage times; expected STAGE_SECONDS on its stderr")
    own = ("prepare", *OWN_STAGES)
    sglang = sum(imports.get(name, 0.0) for name in own)
    if imports_only:
        return sglang
    return (stages["prepare"] - stages["import_sglang"]) + sum(stages[name] for name in OWN_STAGES) - sglang


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", metavar="DIR", type=Path,
                        help="an sglang tree (build/trees/sglang-X): every child runs with PYTHONPATH=DIR (default: the venv's sglang)")
    parser.add_argument("--repeats", type=int, default=3, metavar="N", help="rounds of fresh processes (median; default 3)")
    parser.add_argument("--sweep", default=DEFAULT_SWEEP, metavar="NAME=V1,...",
                        help=f"the sweep timed against one judgement (default {DEFAULT_SWEEP}; at least two values)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--smoke", action="store_true",
                        help="each case once, at 1x, a two-value sweep (make bench-smoke): proves the bench runs; no measurement")
    args = parser.parse_args(argv)
    tree = None
    if args.tree is not None:
        tree = args.tree.resolve()
        if not (tree / "sglang" / "srt" / "server_args.py").is_file():
            print(f"error: --tree {args.tree}: no sglang/srt/server_args.py under it", file=sys.stderr)
            return 1
    if len([v for v in args.sweep.partition("=")[2].split(",") if v.strip()]) < 2:
        print(f"error: --sweep {args.sweep}: expected at least two values", file=sys.stderr)
        return 1
    try:
        result = (run(tree, 1, "dcp=1,8", scales=(1,)) if args.smoke else
                  run(tree, max(1, args.repeats), args.sweep))
    except Failed as exc:
        print(f"error: a measurement failed to run: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
