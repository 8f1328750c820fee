"""How the repository's code finds its modules: by name, through the venv's editable install, never by path edits.

The package (python/) and the emulation library with the table tools (tools/) are on the venv's path through the
editable install (pyproject.toml, ``dev-mode-dirs``); tests reach test/'s helpers through pytest's own rootdir.
So no file edits ``sys.path`` or ``sys.modules``: an edit there is how a tree ends up importable from one command
and not from another (``make bench`` once stopped on a module only the tests' path reached).
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The one sys.modules change the repo makes, each through unittest.mock (which restores the dict exactly), and why:
# sgl_kernel is a CUDA-only package that FlashAttentionBackend imports; the pass map stands it in to read fa3's
# metadata builders on CPU ("mock only what needs a GPU").
MOCKED_MODULES = {"tools/emulation/passmap/fa3.py": "sgl_kernel"}


def python_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    return [REPO / name for name in listed if (REPO / name).is_file()]


def _is_sys(node: ast.AST, attr: str) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name)
            and node.value.id == "sys")


def path_edits(source: str) -> list[str]:
    """Each edit of sys.path or sys.modules in ``source``, as 'line: what'; reading either is not an edit."""
    found = []
    for node in ast.walk(ast.parse(source)):
        where = getattr(node, "lineno", 0)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            for attr in ("path", "modules"):
                if _is_sys(owner, attr) and node.func.attr not in ("get", "items", "keys", "values", "copy"):
                    found.append(f"{where}: sys.{attr}.{node.func.attr}(...)")
            # unittest.mock.patch.dict(sys.modules, ...) and monkeypatch.setitem(sys.modules, ...) edit it too.
            if (node.args and any(_is_sys(node.args[0], attr) for attr in ("path", "modules"))
                    and node.func.attr in ("dict", "setitem", "delitem")):
                found.append(f"{where}: {node.func.attr}(sys.{node.args[0].attr}, ...)")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "syspath_prepend":
            found.append(f"{where}: syspath_prepend(...)")
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        for target in targets:
            base = target.value if isinstance(target, ast.Subscript) else target
            for attr in ("path", "modules"):
                if _is_sys(base, attr):
                    found.append(f"{where}: sys.{attr} assigned or deleted")
    return found


def test_no_file_edits_sys_path_or_sys_modules():
    found = {}
    for path in python_files():
        rel = path.relative_to(REPO).as_posix()
        edits = path_edits(path.read_text(encoding="utf-8"))
        if rel in MOCKED_MODULES:
            edits = [e for e in edits if not e.split(": ", 1)[1].startswith("dict(sys.modules")]
        if edits:
            found[rel] = edits
    assert not found, ("files that edit sys.path or sys.modules; expected imports by name through the editable install "
                       f"(tools/ and python/ are on the venv's path); fix: import the module by name: {found}")


def test_mocked_modules_are_where_they_are_said_to_be():
    # The exemption names a file and the module it stands in; a renamed file must not leave a stale exemption.
    for rel, module in MOCKED_MODULES.items():
        source = (REPO / rel).read_text(encoding="utf-8")
        assert "patch.dict(sys.modules" in source and f'"{module}"' in source, rel


def test_each_kind_of_edit_is_caught():
    # Controls: every form the repo once used, and the ones a newcomer might reach for.
    edits = [
        "import sys\nsys.path.insert(0, 'x')\n",
        "import sys\nsys.path[:0] = ['x']\n",
        "import sys\nsys.path.append('x')\n",
        "import sys\nsys.modules['a'] = object()\n",
        "import sys\nsys.modules.setdefault('a', sys.modules[__name__])\n",
        "import sys\nsys.modules.update({'a': 1})\n",
        "import sys\nsys.modules.pop('a', None)\n",
        "import sys\ndel sys.modules['a']\n",
        "import sys\nfrom unittest import mock\nwith mock.patch.dict(sys.modules, {'a': 1}): pass\n",
        "import sys\ndef t(monkeypatch): monkeypatch.setitem(sys.modules, 'a', 1)\n",
        "def t(monkeypatch): monkeypatch.syspath_prepend('x')\n",
    ]
    for source in edits:
        assert path_edits(source), source
    reads = "import sys\nm = sys.modules.get('a')\nn = list(sys.modules.items())\nok = 'a' in sys.modules\np = sys.path[0]\n"
    assert path_edits(reads) == []


PACKAGE = "sglang_dcp_dspark"


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def private_uses(source: str) -> list[str]:
    """Each use of a private module or name of the package in ``source``, as 'line: dotted name'."""
    tree = ast.parse(source)
    bound: dict[str, str] = {}  # a local name -> the package's module or name it is bound to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == PACKAGE:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if any(_private(p) for p in full.split(".")):
                    found.append(f"{node.lineno}: {full}")
                bound[alias.asname or alias.name] = full
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != PACKAGE:
                    continue
                if any(_private(p) for p in alias.name.split(".")):
                    found.append(f"{node.lineno}: {alias.name}")
                bound[alias.asname or PACKAGE] = alias.name if alias.asname else PACKAGE
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        dotted = _dotted(node)
        if dotted is None:
            continue
        head, _, rest = dotted.partition(".")
        if head in bound and rest and any(_private(p) for p in rest.split(".")):
            found.append(f"{node.lineno}: {bound[head]}.{rest}")
    return sorted(set(found), key=lambda f: int(f.split(":")[0]))


def test_no_test_bench_or_tool_uses_a_private_name_of_the_package():
    found = {}
    for path in python_files():
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith("python/"):
            continue
        uses = private_uses(path.read_text(encoding="utf-8"))
        if uses:
            found[rel] = uses
    assert not found, ("tests, benches or tools that use a private name of the package; expected its public names; "
                       f"fix: give the name a public one in the package, or test through the public one: {found}")


def test_a_private_use_is_caught():
    # Controls: each way a private name was reached before the names were made public.
    uses = [
        "from sglang_dcp_dspark import plugin\nplugin._decide('t')\n",
        "from sglang_dcp_dspark.plugin.hooks import _common\n",
        "from sglang_dcp_dspark.cli._args import DEFAULT_SERIES\n",
        "import sglang_dcp_dspark.series.journal as journal\njournal._write_journal()\n",
        "import sglang_dcp_dspark\nsglang_dcp_dspark.passes._read.cache_clear()\n",
        "from sglang_dcp_dspark.preflight import launch as _launch\n_launch._kernels()\n",
    ]
    for source in uses:
        assert private_uses(source), source
    public = ("from sglang_dcp_dspark import plugin\nplugin.register()\nfrom sglang_dcp_dspark.__main__ import main\n"
              "import os\nos._exit\n")
    assert private_uses(public) == []
