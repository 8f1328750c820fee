"""Generated blocks in the docs: find them, run the command each names, and say when one is stale.

A generated block sits between two markers, the first naming the command that
prints it::

    <!-- name:begin (command) -->
    what the command prints (inside a ``` fence when the block has one)
    <!-- name:end -->

Freshness tests compare a block with what its command prints now (``check``);
``python tools/docblocks.py --write NAME...`` pastes the output in. Commands
run from the repository root with this interpreter's directory first on PATH,
so ``python`` and ``sglang-dcp-dspark`` are the virtual environment's, and each
runs at most once per process (several blocks, or tests, may share one).
They import this checkout's package (``python/`` first on ``PYTHONPATH``, after
a tree the command names), never whatever clone the environment was set up
from, and :func:`check` asserts it.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
_BLOCK = re.compile(
    r"<!-- (?P<name>[\w-]+):begin \((?P<command>[^)]*)\) -->\n(?P<body>.*?)<!-- (?P=name):end -->", re.S
)
FENCE = "```\n"


@dataclass(frozen=True)
class Block:
    doc: Path
    name: str
    command: str
    body: str  # as committed, fence included

    @property
    def fenced(self) -> bool:
        return self.body.startswith(FENCE)

    def render(self, output: str) -> str:
        """The block body that ``output`` of its command makes."""
        output = output if output.endswith("\n") else output + "\n"
        return FENCE + output + FENCE if self.fenced else output


def blocks(docs=DOCS) -> list[Block]:
    return [
        Block(doc, m.group("name"), m.group("command"), m.group("body"))
        for doc in docs
        for m in _BLOCK.finditer(doc.read_text(encoding="utf-8"))
    ]


def block(name: str, docs=DOCS) -> Block:
    found = [b for b in blocks(docs) if b.name == name]
    assert len(found) == 1, f"expected one <!-- {name}:begin (...) --> block in the docs, found {len(found)}"
    return found[0]


_OUTPUT: dict[str, str] = {}
_PENDING: dict[str, subprocess.Popen] = {}


def _env() -> dict[str, str]:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    # The plugin's switches as an operator's shell has them by default; a tree only where the command names one.
    for name in ("SGLANG_PLUGINS", "SGLANG_ENABLE_DCP_DSPARK_PLUGIN", "DCP_DSPARK_TREE", "PYTHONPATH"):
        env.pop(name, None)
    # This checkout's package first: the virtual environment's editable install may be another clone's.
    env["PYTHONPATH"] = str(REPO / "python")
    env["PYTHONWARNINGS"] = "ignore"
    return env


def _in_checkout(command: str) -> str:
    """``command`` as run: a ``PYTHONPATH=TREE`` it starts with keeps this checkout's package after the tree."""
    return re.sub(r"^PYTHONPATH=(\S+) ", lambda m: f'PYTHONPATH={m.group(1)}{os.pathsep}"$PYTHONPATH" ', command)


@functools.cache
def imported_from() -> Path:
    """Where the commands' ``sglang_dcp_dspark`` comes from (checked to be this checkout by :func:`check`)."""
    out = subprocess.run([sys.executable, "-c", "import sglang_dcp_dspark; print(sglang_dcp_dspark.__file__)"],
                         cwd=REPO, env=_env(), capture_output=True, text=True, check=True).stdout
    return Path(out.strip()).resolve()


def start(commands) -> None:
    """Start every command not started yet, without waiting: a slow one runs while other tests do."""
    for command in dict.fromkeys(commands):
        if command not in _OUTPUT and command not in _PENDING:
            _PENDING[command] = subprocess.Popen(
                _in_checkout(command), shell=True, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )


def run(command: str) -> str:
    """What ``command`` prints on stdout, run by the shell from the repository root (once per process)."""
    start([command])
    if command not in _OUTPUT:
        proc = _PENDING.pop(command)
        out, err = proc.communicate()
        # preflight's exit code is its verdict on the launch; a block shows any verdict, never an error
        from sglang_dcp_dspark.core.exits import VERDICTS

        verdicts = VERDICTS if command.startswith("sglang-dcp-dspark preflight") else (0,)
        assert proc.returncode in verdicts, f"`{command}` exited {proc.returncode}: {err.strip()[-2000:]}"
        _OUTPUT[command] = out
    return _OUTPUT[command]


def check(name: str, output: str | None = None) -> None:
    """The block ``name`` is what its command prints now (``output``, when the caller ran it another way)."""
    b = block(name)
    package = imported_from()
    assert package.is_relative_to(REPO / "python"), (
        f"the docs' commands import sglang_dcp_dspark from {package}, not from this checkout ({REPO / 'python'}); "
        "fix: run the tests with this checkout's python/ importable"
    )
    fresh = b.render(run(b.command) if output is None else output)
    assert b.body == fresh, (
        f"{b.doc.relative_to(REPO)}: the {name} block is stale, `{b.command}` prints something else now; "
        f"fix: python tools/docblocks.py --write {name}"
    )


def write(name: str) -> None:
    b = block(name)
    text = b.doc.read_text(encoding="utf-8")
    head = f"<!-- {name}:begin ({b.command}) -->\n"
    start = text.index(head) + len(head)
    end = text.index(f"<!-- {name}:end -->", start)
    b.doc.write_text(text[:start] + b.render(run(b.command)) + text[end:], encoding="utf-8")


if __name__ == "__main__":
    names = sys.argv[2:] if sys.argv[1:2] == ["--write"] else None
    if not names:
        sys.exit("usage: python tools/docblocks.py --write NAME...  (names: " + ", ".join(b.name for b in blocks()) + ")")
    for name in names:
        write(name)
        print(f"rewrote the {name} block")
