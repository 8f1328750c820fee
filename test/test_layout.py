"""The package's layout: a package per user job over one shared core, and the imports allowed between them.

This module is the one record of the allowed imports (docs/layout.md
describes the packages). The graph is read from the source, every import
statement, at module level or inside a function: a lazy import is still a
dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "sglang_dcp_dspark"
ROOT = "sglang_dcp_dspark"

# Which packages each package may import. core and passes are shared by the jobs; a job reaches another job only
# through that job's front door (below). cli is the shell of the jobs (parse, call, print) and may reach any.
ALLOWED = {
    "core": set(),
    "passes": {"core"},
    "series": {"core"},
    "plugin": {"core", "passes"},
    "preflight": {"core", "passes", "plugin", "series"},
    "cli": {"core", "passes", "series", "plugin", "preflight"},
    "__main__": {"cli", "core", "preflight"},
}
JOBS = ("series", "plugin", "preflight")
# What a job offers the other jobs. preflight judges "with the plugin" through the hook table alone (and asks the
# switch whether the plugin would run); it asks the series package which series a tree carries.
FRONT_DOORS = {
    "plugin": {"plugin", "plugin.hooks", "plugin.switch"},
    "series": {"series"},
    "preflight": set(),
}


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted name (without the root) -> file; a package is named by its directory."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(name: str, source: str, known: set[str], is_package: bool) -> set[str]:
    """The package's modules that ``source`` (the module ``name``) imports."""
    here = name.split(".") if name else []
    base = here if is_package else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parent = base[: len(base) - (node.level - 1)]
                module = ".".join(parent + ([node.module] if node.module else []))
            elif node.module == ROOT or (node.module or "").startswith(ROOT + "."):
                module = node.module[len(ROOT):].lstrip(".")
            else:
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}".strip(".")
                found.add(sub if sub in known else module)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(ROOT + "."):
                    found.add(alias.name[len(ROOT) + 1:])
    return {m for m in found if m and m != name}


def graph(package: Path = PACKAGE, extra: dict[str, str] | None = None) -> dict[str, set[str]]:
    """module -> the package modules it imports; ``extra`` adds sources (name -> code) as if they were modules."""
    files = modules(package)
    sources = {name: path.read_text(encoding="utf-8") for name, path in files.items()}
    packages = {name for name, path in files.items() if path.name == "__init__.py"}
    sources.update(extra or {})
    known = set(sources)
    return {name: imports(name, code, known, name in packages) for name, code in sources.items()}


def top(name: str) -> str:
    return name.split(".")[0]


def violations(edges: dict[str, set[str]]) -> list[str]:
    out = []
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            a, b = top(source), top(target)
            if a == b:
                continue
            if b not in ALLOWED.get(a, set()):
                out.append(f"{source} -> {target}: {a} may import only {sorted(ALLOWED.get(a, set()))}")
            elif a in JOBS and b in JOBS and target not in FRONT_DOORS[b]:
                out.append(f"{source} -> {target}: a job reaches {b} only through {sorted(FRONT_DOORS[b])}")
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles among modules; a package's own front door importing its parts (lazily) is not one."""
    def own_part(source: str, target: str) -> bool:
        return target.startswith(source + ".") or source.startswith(target + ".")

    graph_ = {s: {t for t in ts if t in edges and not own_part(s, t)} for s, ts in edges.items()}
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph_[node]):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph_):
        if node not in state:
            visit(node)
    return found


def test_every_package_is_in_the_layout():
    packages = {top(name) for name in modules() if name}
    assert packages == set(ALLOWED), f"packages {sorted(packages ^ set(ALLOWED))}: add them to ALLOWED here"


def test_imports_follow_the_layout():
    assert violations(graph()) == []


def test_no_import_cycle():
    assert cycles(graph()) == []


@pytest.mark.parametrize("module,code,expected", [
    # the plugin reaching into preflight: a job importing another job's code
    ("plugin.hooks.stray", "from ...preflight import check\n", "plugin may import only"),
    # preflight past the plugin's front door, as it once reached hooks._common for Verdict
    ("preflight.stray", "from ..plugin.hooks._common import Verdict\n", "only through"),
    # the shared core depending on a job
    ("core.stray", "from sglang_dcp_dspark.series import patching\n", "core may import only"),
])
def test_a_new_cross_import_is_caught(module, code, expected):
    found = violations(graph(extra={module: code}))
    assert len(found) == 1 and expected in found[0], found


def test_a_new_cycle_is_caught():
    # core.sizing importing core.pools, which imports core.sizing: the shape of the old probes <-> sizing cycle
    found = cycles(graph(extra={"core.sizing": (PACKAGE / "core" / "sizing.py").read_text(encoding="utf-8")
                                + "\nfrom . import pools\n"}))
    assert any({"core.sizing", "core.pools"} <= set(c) for c in found), found


TESTS = Path(__file__).resolve().parent


def untested(package: Path = PACKAGE, tests: Path = TESTS) -> list[str]:
    """Package modules with code that no test module imports by name (an empty ``__init__`` has nothing to test)."""
    files = modules(package)
    known = set(files)
    reached = set()
    for path in sorted(tests.rglob("test_*.py")):
        reached |= imports("", path.read_text(encoding="utf-8"), known, True)
    return sorted(name for name, path in files.items()
                  if name and name not in reached and path.read_text(encoding="utf-8").strip())


def test_every_module_has_a_test_module_that_imports_it():
    """test/ mirrors the package: a module is tested by a test module that imports it, not only through another."""
    assert untested() == [], "modules no test imports; fix: add a test module for each (test/<package>/test_<module>.py)"


def test_a_module_without_a_test_is_caught(tmp_path):
    # Control: the same tests against a package with one more module, which none of them imports.
    import shutil

    copy = tmp_path / "sglang_dcp_dspark"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("*.pyc", "__pycache__", "*.json.gz", "data"))
    (copy / "core" / "stray.py").write_text("VALUE = 1\n")
    assert untested(copy) == ["core.stray"]
