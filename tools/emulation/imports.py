"""What a harness run imported of sglang, recorded at its exit: each file by its path in the package and its sha256.

``make test`` gives every run a directory (``DCP_DSPARK_IMPORTS_DIR``, build/junit/imports/<run>, set by
tools/suite.py); each harness process (the pass map, the MLA numerics) started under it writes one record there:
its command line, the run, and the sglang files its modules came from. ``tools/suite.py report`` reads them all: a
harness run twice with the same command on byte-identical sglang files measured nothing new the second time, and the report names it (a tree whose files are another's is not
suited twice: patches/trees.json's ``same_files_as``). A tree that changes one of the files a harness imports
has another record, and runs it again.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import sys
from pathlib import Path

DIR_ENV = "DCP_DSPARK_IMPORTS_DIR"


def sglang_files() -> dict[str, str]:
    """Each sglang module imported now: its file's path under the package's parent, and that file's sha256."""
    sglang = sys.modules.get("sglang")
    if sglang is None or not getattr(sglang, "__file__", None):
        return {}
    root = Path(sglang.__file__).resolve().parent.parent
    out = {}
    for module in list(sys.modules.values()):
        name = getattr(module, "__file__", None)
        if not name:
            continue
        path = Path(name).resolve()
        if path.is_relative_to(root / "sglang") and path.is_file():
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return dict(sorted(out.items()))


def record(argv: list[str]) -> dict:
    files = sglang_files()
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    return {"command": [Path(argv[0]).name if argv else "", *argv[1:]], "run": os.environ.get("DCP_DSPARK_TREE"),
            "files": len(files), "digest": digest}


def write_at_exit() -> None:
    """Under make test (the directory set), write this process's record when it exits."""
    where = os.environ.get(DIR_ENV)
    if not where:
        return

    def write() -> None:
        entry = record(sys.argv)
        key = hashlib.sha256(json.dumps(entry["command"]).encode()).hexdigest()[:16]
        Path(where).mkdir(parents=True, exist_ok=True)
        (Path(where) / f"{key}-{os.getpid()}.json").write_text(json.dumps(entry) + "\n", encoding="utf-8")

    atexit.register(write)


def repeated(records: dict[str, list[dict]]) -> list[str]:
    """Each harness command that ran on two runs with the same sglang files: one line each. (Whether the plugin
    hooks a harness is its command's to say, ``--fix plugin``: the same command on the same files runs the same.)"""
    seen: dict[tuple, str] = {}
    out = []
    for run, entries in records.items():
        for entry in entries:
            key = (tuple(entry["command"]), entry["digest"])
            if entry["files"] and key in seen and seen[key] != run:
                out.append(f"{' '.join(entry['command'])} ran on {seen[key]} and on {run} with the same "
                           f"{entry['files']} sglang files")
            seen.setdefault(key, run)
    return out
