"""The test configuration as Python objects, and the make include rendered from it; one file per concern:

- ``patches/<series>/config.json``: each series' own metadata, beside its
  patches (which tree it is re-exported on, the paths it may touch, what its
  DEP-3 headers say, its upstream PRs);
- ``patches/trees.json``: every tree label (the DCP_DSPARK_TREE of a test
  run), its sglang release, how it is built and the state each series must
  read as there, and which test directories ``make test`` runs on it (``tests``).

Only the standard library is used: make runs ``python3 tools/tree_table.py
--make`` before the virtual environment exists.

Usage: python3 tools/tree_table.py --make              (prints build/trees.mk)
       python3 tools/tree_table.py --markdown SERIES   (the docs' table of the trees SERIES is tested on)
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "patches" / "trees.json"
BUILD_TREES = REPO / "build" / "trees"
MAKE_TREES = "build/trees"  # the same directory as make names it, relative to the repository


@dataclass(frozen=True)
class Tree:
    label: str
    title: str
    sglang: str
    dir: str | None  # under build/trees; None: the venv's own sglang
    build: dict
    make_target: str
    defect: bool  # tests marked ``regression`` are strict xfails here
    suite: str  # the series whose own test directory runs here
    expect: dict  # series name -> the state ``inspect`` must report
    test_dirs: tuple[str, ...]
    status_first: bool = False

    @property
    def path(self) -> Path | None:
        return BUILD_TREES / self.dir if self.dir else None

    @property
    def make_path(self) -> str | None:
        return f"{MAKE_TREES}/{self.dir}" if self.dir else None


def load(path: Path = TABLE) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


_RAW = load()
VERSIONS: dict[str, str] = _RAW["versions"]
SERIES: dict[str, dict] = {
    path.parent.name: {k: v for k, v in load(path).items() if k != "_comment"}
    for path in sorted((REPO / "patches").glob("*/config.json"))
}
TREES: dict[str, Tree] = {
    label: Tree(label=label, test_dirs=tuple(row["tests"]), **{k: v for k, v in row.items() if k != "tests"})
    for label, row in _RAW["trees"].items()
}


def trees_testing(series: str) -> dict[str, Tree]:
    """The trees that run the series' own test directory: those whose ``suite`` it is."""
    return {label: t for label, t in TREES.items() if t.suite == series}


def _stamp(tree: Tree) -> str:
    return f"{tree.make_path}/.stamp"


def make_include() -> str:
    """build/trees.mk: a rule per built tree, the tree groups, and the per-tree test runs."""
    out = [
        "# Generated from patches/trees.json by tools/tree_table.py --make; edit the table, not this file.",
        f"SGLANG_BASE := {VERSIONS['base']}",
    ]
    for tree in TREES.values():
        if tree.dir:
            out.append(f"TREE_{tree.label.replace('-', '_').replace('.', '_')} := {tree.make_path}")
    for tree in TREES.values():
        if not tree.dir or tree.build["how"] == "same":  # another label's tree: built by its own rule
            continue
        how = tree.build["how"]
        if how == "pip":
            deps = "$(STAMP)"
            # pip's own output goes to a log beside the tree: a wheel it cannot fetch is one line here.
            log = f"{tree.make_path}.pip.log"
            # The pip log sits beside the tree, in build/trees, which a fresh clone does not have yet.
            recipe = ["rm -rf $(@D) && mkdir -p $(dir $(@D))", f"$(BIN)/python -m pip install -q --no-deps --target $(@D) sglang=={tree.sglang} > {log} 2>&1 "
                      f"|| {{ echo \"error: pip cannot fetch sglang=={tree.sglang} for the tree {tree.label} ({log} has pip's output); "
                      f"fix: make the package index reachable, or remove {tree.label} from patches/trees.json\" >&2; exit 1; }}"]
        elif how == "base":
            source = TREES[tree.build["from"]]
            deps = f"{_stamp(source)} $(wildcard patches/{tree.build['series']}/*)"
            recipe = ["rm -rf $(@D)", f"$(CLI) base --series {tree.build['series']} --from {source.make_path} --out $(@D)"]
        elif how == "copy":
            source = TREES[tree.build["from"]]
            series = tree.build["apply"]
            if source.dir:
                deps = f"{_stamp(source)} $(wildcard patches/{series}/*)"
                copy = f"rm -rf $(@D) && cp -r {source.make_path} $(@D)"
            else:  # a copy of the venv's own sglang
                deps = f"$(STAMP) $(wildcard patches/{series}/*)"
                copy = ("rm -rf $(@D) && mkdir -p $(@D) && cp -r \"$$($(BIN)/python -c 'import sysconfig; "
                        "print(sysconfig.get_paths()[\"purelib\"])')/sglang\" $(@D)/sglang")
            recipe = [copy, f"$(CLI) apply --target $(@D) --series {series}"]
        else:
            raise ValueError(f"patches/trees.json: tree {tree.label} has an unknown build {how!r}")
        out += ["", f"{_stamp(tree)}: {deps}", *[f"\t{line}" for line in recipe], "\ttouch $@"]
    groups: dict[str, list[str]] = {}
    for tree in TREES.values():
        if tree.dir and _stamp(tree) not in groups.get(tree.make_target, []):
            groups.setdefault(tree.make_target, []).append(_stamp(tree))
    out.append("")
    for target, stamps in groups.items():
        out.append(f"{target}: {' '.join(stamps)}")
    out += ["", f"TREE_TARGETS := {' '.join(groups)}", "", "define TREE_TESTS", "rm -rf build/junit && mkdir -p build/junit"]
    for tree in TREES.values():
        if tree.status_first:
            out.append(f"$(CLI) status --target {tree.make_path}")
        out.append(tree_run(tree))
    # Every test ran and passed on at least one tree (test/every_test_ran.py reads the runs' JUnit files).
    out += ["$(BIN)/python test/every_test_ran.py build/junit", "endef", ""]
    return "\n".join(out)


def tree_run(tree) -> str:
    """The pytest run of one tree in ``make test``, with its JUnit file for test/every_test_ran.py."""
    pythonpath = f" PYTHONPATH={tree.make_path}" if tree.dir else ""
    return (f"DCP_DSPARK_TREE={tree.label}{pythonpath} $(PYTEST) --junitxml=build/junit/{tree.label}.xml "
            f"{' '.join(tree.test_dirs)}")


def markdown(series: str) -> str:
    """The trees ``series`` is tested on: what each is, the state the series reads as there, and its pytest run."""
    rows = [
        f"| tree label | tree | under build/trees | {series} | its run in `make test` |",
        "|---|---|---|---|---|",
    ]
    for label, tree in trees_testing(series).items():
        where = f"`{tree.dir}`" if tree.dir else "(the venv's sglang)"
        pythonpath = f"PYTHONPATH={tree.make_path} " if tree.dir else ""
        run = f"`DCP_DSPARK_TREE={label} {pythonpath}pytest {' '.join(tree.test_dirs)}`"
        state = tree.expect[series] + (" (tests marked regression: strict xfails)" if tree.defect else "")
        rows.append(f"| `{label}` | {tree.title} | {where} | {state} | {run} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--make"]:
        sys.stdout.write(make_include())
    elif sys.argv[1:2] == ["--markdown"] and len(sys.argv) == 3 and sys.argv[2] in SERIES:
        sys.stdout.write(markdown(sys.argv[2]))
    else:
        sys.exit(f"usage: python3 tools/tree_table.py --make | --markdown {{{','.join(SERIES)}}}")
