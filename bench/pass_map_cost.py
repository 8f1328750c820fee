"""What reading the pass map adds to the plugin's start-up, on the path a launch takes.

Each repetition is a pair of fresh interpreters with the plugin on: both
run ``load_plugins()`` and then import ``sglang.srt.arg_groups.speculative_hook``
(the launch's argument handling imports it, and the plugin's check judges
it then, from the map), inside the timer. One reads the map as the package
ships it; the other is handed the same answers (the releases the map
covers, whether it ran the release, the launch kinds it shows broken),
worked out before the timer, so both decide and hook alike and differ only
by reading the map. The figure is the median over the pairs of (with the
map - with its answers), in ms; the target is under 5 ms. The order of the
two alternates.

``--package DIR`` runs the children on another checkout's ``python/`` (for
example the commit before the map was compacted, which parsed the whole
map, every release's cases, in every process that judged a launch).

    python bench/pass_map_cost.py [--tree DIR] [--package DIR] [--repeats N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

MIN_PAIRS = 5
TARGET_MS = 5.0

CHILD = r"""
import json, sys, time
import sglang.srt.server_args
from sglang.srt.plugins import load_plugins
from sglang_dcp_dspark import passes
if __ANSWERS__:
    from importlib.metadata import version
    covered = passes.releases()
    release = passes.release_key(version("sglang"))
    measured = {release: passes.measured(release)} if release in covered else {}
    broken = {release: passes.broken_kinds(release)} if release in covered else {}
    passes.releases = lambda: covered
    passes.measured = measured.__getitem__
    passes.broken_kinds = broken.__getitem__
    for name in ("_read", "load"):  # nothing read since is cached: the timed side must not read the map either
        getattr(getattr(passes, name, None), "cache_clear", lambda: None)()
t0 = time.perf_counter()
load_plugins()
try:
    import sglang.srt.arg_groups.speculative_hook
except ImportError:  # a release without it (0.5.17)
    pass
t1 = time.perf_counter()
from sglang_dcp_dspark import plugin
print("RESULT " + json.dumps({"startup_s": t1 - t0, "passes_file": passes.__file__,
                              "findings": {t: f.verdict.value for t, f in plugin.findings.items()}}))
"""


class Failed(Exception):
    pass


def once(env: dict, answers: bool) -> dict:
    code = CHILD.replace("__ANSWERS__", repr(answers))
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env, capture_output=True, text=True)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise Failed(f"exited {done.returncode}: {done.stderr.strip()[-800:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def run(tree: Path | None, package: Path | None, repeats: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_PLUGINS", "SGLANG_ENABLE_DCP_DSPARK_PLUGIN")}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (package, tree) if p is not None)
    with_map, without = [], []
    for i in range(repeats):
        sides = [(with_map, False), (without, True)]
        for side, answers in (sides if i % 2 == 0 else sides[::-1]):
            side.append(once(env, answers))
    if with_map[0]["findings"] != without[0]["findings"]:
        raise Failed(f"the two sides decided differently: {with_map[0]['findings']} != {without[0]['findings']}")
    pairs = [(a["startup_s"] - b["startup_s"]) * 1000 for a, b in zip(with_map, without, strict=True)]
    added = statistics.median(pairs)
    return {"tree": str(tree) if tree else None, "passes_file": with_map[0]["passes_file"], "pairs": repeats,
            "with_map_ms": [round(r["startup_s"] * 1000, 1) for r in with_map],
            "without_map_ms": [round(r["startup_s"] * 1000, 1) for r in without],
            "added_ms_per_pair": [round(p, 1) for p in pairs], "added_ms": added,
            "findings": with_map[0]["findings"], "target_ms": TARGET_MS, "met": added < TARGET_MS}


def render(r: dict) -> str:
    where = r["tree"] or "the venv's sglang"
    verdicts = "; ".join(f"{target.rsplit('.', 1)[-1]}: {v}" for target, v in r["findings"].items())
    return "\n".join([
        f"the pass map in the plugin's start-up (load_plugins() + the speculative_hook import), {r['pairs']} pairs of fresh processes, alternated "
        f"({where}; the map's reader: {r['passes_file']})",
        f"  the plugin's verdicts: {verdicts}",
        f"  start-up reading the map, ms:        {', '.join(f'{x:.1f}' for x in r['with_map_ms'])}",
        f"  start-up handed its answers, ms:     {', '.join(f'{x:.1f}' for x in r['without_map_ms'])}",
        f"  added per pair (map - answers), ms:  {', '.join(f'{x:+.1f}' for x in r['added_ms_per_pair'])}",
        f"target: the map adds under {r['target_ms']:g} ms; median {r['added_ms']:+.1f} ms: "
        f"{'met' if r['met'] else 'NOT met'}",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, metavar="DIR", help="an sglang tree (build/trees/sglang-X) for the children")
    parser.add_argument("--package", type=Path, metavar="DIR", help="a python/ directory holding the sglang_dcp_dspark to time")
    parser.add_argument("--repeats", type=int, default=MIN_PAIRS, metavar="N", help=f"pairs (at least {MIN_PAIRS})")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="one pair at the smallest size (make bench-smoke): proves the bench runs; its figures are no measurement")
    args = parser.parse_args(argv)
    for flag, path, inside in (("--tree", args.tree, "sglang/srt/plugins/__init__.py"),
                               ("--package", args.package, "sglang_dcp_dspark/__init__.py")):
        if path is not None and not (path / inside).is_file():
            print(f"error: {flag} {path}: no {inside} under it; expected a directory that holds it", file=sys.stderr)
            return 1
    try:
        result = run(args.tree and args.tree.resolve(), args.package and args.package.resolve(),
                     1 if args.smoke else max(MIN_PAIRS, args.repeats))
    except Failed as exc:
        print(f"error: a measurement failed to run: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
