"""What the dcp_dspark plugin adds to ``import sglang.srt.server_args`` plus ``load_plugins()``.

Each repetition is a pair of fresh interpreters (imports are cached per
process), one with the plugin on (SGLANG_PLUGINS unset) and one with it off
(SGLANG_PLUGINS naming no installed plugin), alternating which goes first so
that drift in machine load hits both alike. Every child imports
``sglang.srt.server_args``, then calls ``load_plugins()``, and reports the
two times and what load_plugins() left registered: the HookRegistry targets
the plugin registered and the ones sglang applied (``HookRegistry._patched``),
the plugin's verdict per target it judged (``plugin.findings``), and the
modules whose hooks wait for their import. With ``--tree DIR`` the children
run with ``PYTHONPATH=DIR`` (the sglang they import is checked). With
``--bytecode compiled`` they import the plugin from a copy of the package
with its bytecode written, as a wheel install has it: an editable install
run under PYTHONDONTWRITEBYTECODE (as here) has none, so each process
compiles the plugin's modules from source, while sglang's come from its
__pycache__.

The target, judged on load_plugins() alone (where all of the plugin's work
happens; the whole import is reported too, and carries the import's
run-to-run noise), on the median over the pairs of (on - off), at least 5
pairs:

- under 20 ms where the plugin hooks something during load_plugins();
- under 5 ms where it hooks nothing then (every target already fixed, or
  its module not imported yet).

Then ``--profile-runs`` more children per side (default 3) with timers
around the parts of load_plugins() (entry-point discovery, importing the
plugin, register(), its probes, HookRegistry.apply_hooks and sglang's
``_propagate_patch`` walk of sys.modules) and ``-X importtime`` over
load_plugins(), to say where the time goes. They are instrumented, so their
totals are not the figures judged.

Exits 0 when the measurements ran, met or not; 1 when one failed to run.

    python bench/plugin_overhead.py [--tree DIR] [--repeats N] [--profile-runs N] [--bytecode as-is|compiled] [--json]
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
from pathlib import Path

MIN_PAIRS = 5
HOOKED_TARGET_MS = 20.0
UNHOOKED_TARGET_MS = 5.0
PLUGIN = "dcp_dspark"
OFF_WHITELIST = "no_such_plugin"

# The child: the import, then load_plugins(), timed; then (untimed) what load_plugins() left behind.
CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import sglang.srt.server_args
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
before = {t: len(h) for t, h in HookRegistry._hooks.items()}
patched_before = set(HookRegistry._patched)
tl = time.perf_counter()
load_plugins()
t1 = time.perf_counter()
import importlib.metadata, sglang
from sglang_dcp_dspark import plugin
ours = sorted({t for t, hooks in HookRegistry._hooks.items() for _, _, src in hooks[before.get(t, 0):]
               if src is not None and src.plugin_name == __PLUGIN__})
others = sorted({t for t, hooks in HookRegistry._hooks.items() if len(hooks) > before.get(t, 0)} - set(ours))
print("RESULT " + json.dumps({
    "import_s": tl - t0, "load_plugins_s": t1 - tl, "total_s": t1 - t0,
    "sglang": importlib.metadata.version("sglang"), "sglang_file": sglang.__file__,
    "registered": ours, "registered_by_others": others,
    "applied": sorted(set(HookRegistry._patched) - patched_before),
    "findings": {t: f.verdict.value for t, f in plugin.findings.items()},
    "deferred": [f.name for f in sys.meta_path if type(f).__name__ == "_AfterImport"],
    "active": plugin.active,
    "plugin_file": plugin.__file__,
}))
"""

# The profiling child: the same, with timers around the parts of load_plugins().
PROFILE_CHILD = r"""
import json, sys, time
import sglang.srt.server_args
import sglang.srt.plugins as plugins_mod
from sglang.srt.plugins import hook_registry, load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
import importlib.metadata as md

spent = {}
def add(key, dt, n=1):
    s = spent.setdefault(key, [0.0, 0])
    s[0] += dt
    s[1] += n

def timed(key, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            add(key, time.perf_counter() - start)
    return wrapper

plugins_mod.entry_points = timed("entry_points() discovery", plugins_mod.entry_points)
_apply = HookRegistry.apply_hooks.__func__
HookRegistry.apply_hooks = classmethod(timed("HookRegistry.apply_hooks()", _apply))
_propagate = hook_registry._propagate_patch
def propagate(*args):
    start = time.perf_counter()
    try:
        return _propagate(*args)
    finally:
        add("  of which _propagate_patch() walks", time.perf_counter() - start)
        add("  modules walked", 0, len(sys.modules))
hook_registry._propagate_patch = propagate

_load = md.EntryPoint.load
def load(self):
    n = len(sys.modules)
    start = time.perf_counter()
    func = _load(self)
    add(f"ep.load() {self.name} (import {self.value.partition(':')[0]})", time.perf_counter() - start)
    add(f"  modules it imported", 0, len(sys.modules) - n)
    if self.name == __PLUGIN__:
        from sglang_dcp_dspark import plugin
        from sglang_dcp_dspark.plugin import decisions, hooks
        hooks.Hook.judged = timed("  of which probes (Hook.judged)", hooks.Hook.judged)
        plugin.install = timed("  of which install() (decide, HookRegistry.register, log)", plugin.install)
        decisions.watch = timed("  of which decisions.watch()", decisions.watch)
    def call():
        start = time.perf_counter()
        try:
            return func()
        finally:
            add(f"{self.name} register()", time.perf_counter() - start)
    return call
md.EntryPoint.load = load

# importlib.import_module() bypasses -X importtime (which sees import statements only): the plugin
# module itself (ep.load) and the hook carriers (hooks.Hook looks them up by name) come in this way.
import importlib, importlib.util
imported_by_name = {}
_import_module = importlib.import_module
def import_module(name, package=None):
    full = importlib.util.resolve_name(name, package) if name.startswith(".") else name
    fresh = full not in sys.modules
    start = time.perf_counter()
    try:
        return _import_module(name, package)
    finally:
        if fresh and full in sys.modules:  # a module imported now (pkgutil.resolve_name also tries non-modules)
            imported_by_name[full] = imported_by_name.get(full, 0.0) + time.perf_counter() - start
importlib.import_module = import_module
md.import_module = import_module

print("LOAD_PLUGINS_BEGIN", file=sys.stderr, flush=True)
already = set(sys.modules)
start = time.perf_counter()
load_plugins()
total = time.perf_counter() - start
print("LOAD_PLUGINS_END", file=sys.stderr, flush=True)
import os


def fresh_bytecode(m):
    # A .pyc counts only when the import system would use it: a stale one
    # (its header's source mtime and size no longer match, as after an edit
    # under PYTHONDONTWRITEBYTECODE) is recompiled from source every time.
    cached, source = getattr(m, "__cached__", None), getattr(m, "__file__", None)
    if not cached or not source or not os.path.exists(cached):
        return False
    with open(cached, "rb") as f:
        header = f.read(16)
    if len(header) < 16 or int.from_bytes(header[4:8], "little") != 0:
        return len(header) == 16  # hash-based bytecode: checked or trusted, either way not recompiled here
    st = os.stat(source)
    return (int.from_bytes(header[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
            and int.from_bytes(header[12:16], "little") == st.st_size & 0xFFFFFFFF)


new = {name: {"file": getattr(m, "__file__", None), "bytecode": fresh_bytecode(m)}
       for name, m in sys.modules.items() if name not in already}
print("RESULT " + json.dumps({"load_plugins_s": total, "parts": spent, "import_module": imported_by_name,
                              "new_modules": new}))
"""


class Failed(Exception):
    """A measurement did not run."""


class Where:
    """Which sglang the children import (``--tree``), and which copy of the plugin (``--bytecode``)."""

    def __init__(self, tree: Path | None, plugin_copy: Path | None = None) -> None:
        self.tree = tree
        self.plugin_copy = plugin_copy  # a compiled copy of the package, first on PYTHONPATH

    def pythonpath(self) -> str | None:
        parts = [str(p) for p in (self.plugin_copy, self.tree) if p is not None]
        return os.pathsep.join(parts) or None


def compiled_copy(into: Path) -> Path:
    """The installed sglang_dcp_dspark package copied under ``into`` with its bytecode written, as a wheel install has it."""
    import compileall
    import importlib.util
    import shutil

    spec = importlib.util.find_spec("sglang_dcp_dspark")
    source = Path(next(iter(spec.submodule_search_locations)))
    shutil.copytree(source, into / source.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if not compileall.compile_dir(into / source.name, quiet=1):
        raise Failed(f"could not compile the copy of {source}")
    return into


def child_env(where: Where, plugin_on: bool) -> dict:
    env = dict(os.environ)
    for name in ("PYTHONPATH", "SGLANG_PLUGINS", "SGLANG_ENABLE_DCP_DSPARK_PLUGIN"):
        env.pop(name, None)
    if where.pythonpath():
        env["PYTHONPATH"] = where.pythonpath()
    if not plugin_on:
        env["SGLANG_PLUGINS"] = OFF_WHITELIST
    return env


def _child(argv: list[str], env: dict, what: str) -> tuple[dict, str]:
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise Failed(f"{what}: exited {done.returncode}: {done.stderr.strip()[-800:]}")
    return json.loads(lines[-1].removeprefix("RESULT ")), done.stderr


def once(where: Where, plugin_on: bool) -> dict:
    code = CHILD.replace("__PLUGIN__", repr(PLUGIN))
    result, _ = _child([sys.executable, "-W", "ignore", "-c", code], child_env(where, plugin_on),
                       f"plugin {'on' if plugin_on else 'off'}")
    if where.tree is not None and not Path(result["sglang_file"]).resolve().is_relative_to(where.tree):
        raise Failed(f"--tree {where.tree}: the child imported sglang from {result['sglang_file']}, not from the tree")
    if where.plugin_copy is not None and not Path(result["plugin_file"]).resolve().is_relative_to(where.plugin_copy.resolve()):
        raise Failed(f"--bytecode compiled: the child imported the plugin from {result['plugin_file']}, not the compiled copy")
    if bool(result["findings"]) != plugin_on or result["active"] is not (True if plugin_on else None):
        raise Failed(f"plugin {'on' if plugin_on else 'off'}, but the child says active={result['active']}, "
                     f"findings={result['findings']}")
    return result


def importtime_lines(stderr: str) -> list[tuple[int, int, int, str]]:
    """(self us, cumulative us, depth, module) for each import -X importtime saw inside load_plugins()."""
    inside, out = False, []
    for line in stderr.splitlines():
        if line.startswith("LOAD_PLUGINS_BEGIN"):
            inside = True
        elif line.startswith("LOAD_PLUGINS_END"):
            break
        elif inside and line.startswith("import time:") and "|" in line and "self [us]" not in line:
            own, cumulative, name = line.removeprefix("import time:").split("|", 2)
            depth = (len(name) - len(name.lstrip())) // 2
            out.append((int(own), int(cumulative), depth, name.strip()))
    return out


def compile_seconds(files: list[str]) -> float:
    """What compiling these sources costs here (what an import without bytecode pays on top of running them)."""
    import time

    total = 0.0
    for name in files:
        source = Path(name).read_text()
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            compile(source, name, "exec", dont_inherit=True)
            best = min(best, time.perf_counter() - start)
        total += best
    return total


def profile(where: Where, plugin_on: bool, runs: int) -> dict:
    code = PROFILE_CHILD.replace("__PLUGIN__", repr(PLUGIN))
    totals, parts, imports, by_name, new_modules = [], {}, {}, {}, {}
    for _ in range(runs):
        result, stderr = _child([sys.executable, "-W", "ignore", "-X", "importtime", "-c", code],
                                child_env(where, plugin_on), f"profile, plugin {'on' if plugin_on else 'off'}")
        totals.append(result["load_plugins_s"])
        new_modules.update(result["new_modules"])
        for key, (secs, n) in result["parts"].items():
            parts.setdefault(key, []).append((secs, n))
        for name, secs in result["import_module"].items():
            by_name.setdefault(name, []).append(secs)
        for own, cumulative, depth, name in importtime_lines(stderr):
            imports.setdefault(name, []).append((own, cumulative, depth))
    return {
        "load_plugins_s": statistics.median(totals),
        "parts": {k: {"s": statistics.median(s for s, _ in v), "n": statistics.median(n for _, n in v)} for k, v in parts.items()},
        "import_module": {k: statistics.median(v) for k, v in by_name.items()},
        "new_modules": sorted(new_modules),
        "compiled_from_source": sorted(k for k, v in new_modules.items() if not v["bytecode"]),
        "compile_s": compile_seconds([v["file"] for v in new_modules.values() if not v["bytecode"] and v["file"]
                                      and v["file"].endswith(".py")]),
        "imports": {k: {"self_us": statistics.median(o for o, _, _ in v), "cumulative_us": statistics.median(c for _, c, _ in v),
                        "depth": v[0][2]} for k, v in imports.items()},
    }


def loadavg() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def run(where: Where, repeats: int, profile_runs: int) -> dict:
    load_before = loadavg()
    on, off = [], []
    for i in range(repeats):
        # Alternate which side goes first in each pair.
        for plugin_on in ((True, False) if i % 2 == 0 else (False, True)):
            (on if plugin_on else off).append(once(where, plugin_on))
    load_after = loadavg()
    for key in ("registered", "applied", "findings", "deferred"):
        if any(r[key] != on[0][key] for r in on):
            raise Failed(f"the plugin-on children disagree on {key}: {[r[key] for r in on]}")
    hooked = bool(on[0]["registered"] or on[0]["applied"])
    target_ms = HOOKED_TARGET_MS if hooked else UNHOOKED_TARGET_MS
    pairs = [(a["load_plugins_s"] - b["load_plugins_s"]) * 1000 for a, b in zip(on, off, strict=True)]
    added_ms = statistics.median(pairs)

    def med(side, key):
        return statistics.median(r[key] for r in side)

    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "tree": str(where.tree) if where.tree else None, "sglang": on[0]["sglang"], "sglang_file": on[0]["sglang_file"],
        "bytecode": "compiled" if where.plugin_copy else "as-is", "plugin_file": on[0]["plugin_file"],
        "env_dont_write_bytecode": bool(os.environ.get("PYTHONDONTWRITEBYTECODE")),
        "pairs": repeats, "load_average": {"before": load_before, "after": load_after},
        "hooks": {k: on[0][k] for k in ("registered", "registered_by_others", "applied", "findings", "deferred")},
        "off_registered": off[0]["registered"] + off[0]["registered_by_others"],
        "sides": {name: {k: med(side, k) for k in ("import_s", "load_plugins_s", "total_s")}
                  | {"load_plugins_runs_ms": [round(r["load_plugins_s"] * 1000, 1) for r in side],
                     "total_runs_ms": [round(r["total_s"] * 1000) for r in side]}
                  for name, side in (("off", off), ("on", on))},
        "load_plugins_added_ms_per_pair": [round(p, 1) for p in pairs],
        "load_plugins_added_ms": added_ms,
        "total_added_ms": (med(on, "total_s") - med(off, "total_s")) * 1000,
        "hooked_at_load_plugins": hooked,
        "target_ms": target_ms,
        "met": added_ms < target_ms,
    }
    if profile_runs:
        result["profile"] = {"runs": profile_runs, "on": profile(where, True, profile_runs),
                             "off": profile(where, False, profile_runs), "load_average_after": loadavg()}
    return result


# The order the parts of load_plugins() are printed in: sglang's steps, each followed by what is inside it.
PART_ORDER = ("entry_points()", "ep.load()", "  modules it imported", f"{PLUGIN} register()", "  of which install()",
              "  of which probes", "  of which decisions.watch()", "HookRegistry.apply_hooks()",
              "  of which _propagate_patch()", "  modules walked")


def _part_rank(key: str) -> int:
    return next((i for i, prefix in enumerate(PART_ORDER) if key.startswith(prefix)), len(PART_ORDER))


def render(r: dict) -> str:
    where = f"--tree {r['tree']}" if r["tree"] else "the venv's sglang"
    off, on = r["sides"]["off"], r["sides"]["on"]
    h = r["hooks"]
    if r["bytecode"] == "compiled":
        code = "the plugin from a copy with its bytecode compiled (--bytecode compiled)"
    elif r["env_dont_write_bytecode"]:
        code = "the plugin as installed; PYTHONDONTWRITEBYTECODE is set, so without __pycache__ its modules compile in every process"
    else:
        code = "the plugin as installed"
    out = [f"plugin overhead on sglang {r['sglang']} ({where}), {r['pairs']} pairs of fresh processes, alternated; {r['machine']}",
           f"  {code}: {r['plugin_file']}",
           f"  load average (1/5/15 min): {r['load_average']['before']} before, {r['load_average']['after']} after",
           "  during load_plugins() with the plugin on:",
           f"    hooks it registered: {len(h['registered'])} {h['registered'] or ''}",
           f"    targets sglang applied (HookRegistry._patched): {len(h['applied'])} {h['applied'] or ''}",
           "    its verdicts: " + ("; ".join(f"{t.rsplit('.', 2)[-2]}.{t.rsplit('.', 1)[-1]}: {v}" for t, v in h["findings"].items()) or "none"),
           f"    waiting for their module's import: {', '.join(m.rsplit('.', 1)[-1] for m in h['deferred']) or 'none'}",
           f"  {'median':<34} {'plugin off':>11} {'plugin on':>11} {'added':>10}"]
    for label, key in (("import sglang.srt.server_args", "import_s"), ("load_plugins()", "load_plugins_s"),
                       ("import + load_plugins()", "total_s")):
        out.append(f"  {label:<34} {off[key] * 1000:>8.1f} ms {on[key] * 1000:>8.1f} ms {(on[key] - off[key]) * 1000:>+7.1f} ms")
    out.append(f"  load_plugins() per run, ms: off {', '.join(f'{x:.1f}' for x in off['load_plugins_runs_ms'])}; "
               f"on {', '.join(f'{x:.1f}' for x in on['load_plugins_runs_ms'])}")
    out.append(f"  import + load_plugins() per run, ms: off {', '.join(str(x) for x in off['total_runs_ms'])}; "
               f"on {', '.join(str(x) for x in on['total_runs_ms'])}")
    out.append(f"  load_plugins() added per pair (on - off), ms: {', '.join(f'{x:+.1f}' for x in r['load_plugins_added_ms_per_pair'])}")
    why = "the plugin hooks something during load_plugins()" if r["hooked_at_load_plugins"] else \
        "the plugin hooks nothing during load_plugins()"
    out.append(f"target: load_plugins() adds under {r['target_ms']:g} ms ({why}); median over the pairs "
               f"{r['load_plugins_added_ms']:+.1f} ms: {'met' if r['met'] else 'NOT met'}")
    if "profile" in r:
        p = r["profile"]
        out.append(f"where load_plugins() goes (instrumented, -X importtime; median of {p['runs']} more runs per side; "
                   f"load after: {p['load_average_after']}):")
        for side in ("off", "on"):
            s = p[side]
            out.append(f"  plugin {side}: load_plugins() {s['load_plugins_s'] * 1000:.1f} ms")
            for key, v in sorted(s["parts"].items(), key=lambda kv: _part_rank(kv[0])):
                if key.strip() in ("modules walked", "modules it imported"):
                    out.append(f"    {key:<58} {v['n']:>9,.0f}")
                else:
                    out.append(f"    {key:<58} {v['s'] * 1000:>6.1f} ms" + (f" ({v['n']:g} calls)" if v["n"] != 1 else ""))
            if s["compiled_from_source"]:
                out.append(f"    modules imported during load_plugins() without bytecode (compiled from source): "
                           f"{len(s['compiled_from_source'])} of {len(s['new_modules'])}; compiling them costs "
                           f"{s['compile_s'] * 1000:.1f} ms here (best of 5, in this process)")
            elif s["new_modules"]:
                out.append(f"    modules imported during load_plugins(): {len(s['new_modules'])}, all from bytecode")
            if s["import_module"]:
                out.append("    fresh importlib.import_module() calls (cumulative, nested ones included in their caller's): "
                           + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in s["import_module"].items()))
            top = sorted(((v["cumulative_us"], k, v) for k, v in s["imports"].items() if v["depth"] <= 2), reverse=True)[:8]
            if top:
                out.append(f"    import statements inside load_plugins() (-X importtime): {len(s['imports'])} modules; "
                           "the largest (cumulative / self):")
                for cum, name, v in top:
                    out.append(f"      {'  ' * (v['depth'] - 1)}{name:<52} {cum / 1000:>6.1f} ms / {v['self_us'] / 1000:.1f} ms")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", metavar="DIR", type=Path,
                        help="an sglang tree (build/trees/sglang-X): the children run with PYTHONPATH=DIR (default: the venv's sglang)")
    parser.add_argument("--repeats", type=int, default=MIN_PAIRS, metavar="N",
                        help=f"pairs of runs, plugin on and off (default and least {MIN_PAIRS})")
    parser.add_argument("--profile-runs", type=int, default=3, metavar="N",
                        help="instrumented runs per side after the pairs, to say where load_plugins() goes (default 3; 0: none)")
    parser.add_argument("--bytecode", choices=("as-is", "compiled"), default="as-is",
                        help="as-is: the plugin as installed (an editable install under PYTHONDONTWRITEBYTECODE compiles its modules "
                             "in every process); compiled: a copy of it with its bytecode written, first on PYTHONPATH, as a wheel "
                             "install has it (default as-is)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="one pair at the smallest size (make bench-smoke): proves the bench runs; its figures are no measurement")
    args = parser.parse_args(argv)
    tree = None
    if args.tree is not None:
        tree = args.tree.resolve()
        if not (tree / "sglang" / "srt" / "plugins" / "__init__.py").is_file():
            print(f"error: --tree {args.tree}: no sglang/srt/plugins/__init__.py under it", file=sys.stderr)
            return 1
    repeats = args.repeats
    if args.smoke:
        repeats, args.profile_runs = 1, 1
    elif repeats < MIN_PAIRS:
        print(f"note: --repeats {repeats} raised to {MIN_PAIRS}: the target is judged on at least {MIN_PAIRS} pairs", file=sys.stderr)
        repeats = MIN_PAIRS
    try:
        with tempfile.TemporaryDirectory(prefix="plugin_overhead.") as tmp:
            where = Where(tree, compiled_copy(Path(tmp)) if args.bytecode == "compiled" else None)
            result = run(where, repeats, max(0, args.profile_runs))
    except Failed as exc:
        print(f"error: a measurement failed to run: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
