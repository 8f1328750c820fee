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

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "sglang_dcp_dspark"
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


def run_at_import(tree: ast.AST):
    """The nodes an import of the module runs: not a function's body, nor an ``if TYPE_CHECKING:`` block."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for branch in node.orelse:
                yield branch
                yield from run_at_import(branch)
            continue
        yield node
        yield from run_at_import(node)


def imports(name: str, source: str, known: set[str], is_package: bool, *, module_level: bool = False) -> set[str]:
    """The package's modules that ``source`` (the module ``name``) imports; ``module_level``: only the imports
    that run when it is imported."""
    here = name.split(".") if name else []
    base = here if is_package else here[:-1]
    found = set()
    tree = ast.parse(source)
    for node in (run_at_import(tree) if module_level else ast.walk(tree)):
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


def graph(package: Path = PACKAGE, extra: dict[str, str] | None = None, *,
          module_level: bool = False) -> dict[str, set[str]]:
    """module -> the package modules it imports; ``extra`` adds sources (name -> code) as if they were modules;
    ``module_level``: only the imports that run when the module is imported."""
    files = modules(package)
    sources = {name: path.read_text(encoding="utf-8") for name, path in files.items()}
    packages = {name for name, path in files.items() if path.name == "__init__.py"}
    sources.update(extra or {})
    known = set(sources)
    return {name: imports(name, code, known, name in packages, module_level=module_level)
            for name, code in sources.items()}


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


def cycles(edges: dict[str, set[str]], *, own_parts: bool = False) -> list[list[str]]:
    """Import cycles among modules; a package's own front door importing its parts (lazily) is not one, unless
    ``own_parts`` (a module-level import is one whoever it is between: the package assembling its parts and a part
    importing a name back from the package is a cycle)."""
    def own_part(source: str, target: str) -> bool:
        return not own_parts and (target.startswith(source + ".") or source.startswith(target + "."))

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


def test_no_module_level_import_cycle():
    """No module imports, at module level, a module that imports it back: a package's front door included (the
    hook table assembles its carriers, which take the entry type from hooks/entry.py, not from the table)."""
    assert cycles(graph(module_level=True), own_parts=True) == []


def test_a_module_level_cycle_is_caught():
    # Control: the old hook table's shape, a carrier taking Hook from the package that imports the carriers.
    scheduler = (PACKAGE / "plugin" / "hooks" / "scheduler.py").read_text(encoding="utf-8")
    found = cycles(graph(extra={"plugin.hooks.scheduler": scheduler + "\nfrom . import Hook\n"}, module_level=True),
                   own_parts=True)
    assert any({"plugin.hooks", "plugin.hooks.scheduler"} == set(c) for c in found), found
    # ... and only at module level: the same import inside a function (or under TYPE_CHECKING) runs later, if ever.
    lazy = {"def later():\n    from . import Hook\n", "if TYPE_CHECKING:\n    from . import Hook\n"}
    for code in lazy:
        assert cycles(graph(extra={"plugin.hooks.scheduler": scheduler + "\n" + code}, module_level=True),
                      own_parts=True) == [], code


@pytest.mark.parametrize("module,code,expected", [
    # the plugin reaching into preflight: a job importing another job's code
    ("plugin.hooks.stray", "from ...preflight import check\n", "plugin may import only"),
    # preflight past the plugin's front door, as it once reached the hooks' private common module for Verdict
    ("preflight.stray", "from ..plugin.hooks.common import Verdict\n", "only through"),
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


TESTS = Path(__file__).resolve().parents[1]


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
