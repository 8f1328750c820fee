"""The test configuration as Python objects, and the make include rendered from it; one file per concern:

- ``patches/<series>/config.json``: each series' own metadata, beside its
  patches (which tree it is re-exported on, the paths it may touch, what its
  DEP-3 headers say, its upstream PRs);
- ``patches/trees.json``: every tree label (the DCP_DSPARK_TREE of a test
  run), its sglang release, how it is built and the state each series must
  read as there, and which test directories ``make test`` runs on it (``tests``);
  and the two runs that are no tree's: the unit tier (``unit``: the package's
  own tests on the venv's sglang, ``make check``) and the tree-free tests
  (``tree_free``: tests that import no sglang, run once).

``RUNS`` is every pytest run of ``make test``, each a make target of its own
(``make test-<label>``) that tools/suite.py runs, two at a time.

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
    reads: tuple[str, ...] = ()  # other trees its tests read (they are built before its run)
    same_files_as: str | None = None  # byte-identical to that tree: asserted by a hash, not suited twice
    cost_s: int = 0  # about how long its run takes (seconds, 2-core machine), to start the longest runs first

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
    label: Tree(label=label, test_dirs=tuple(row["tests"]), reads=tuple(row.get("reads", ())),
                **{k: v for k, v in row.items() if k not in ("tests", "reads")})
    for label, row in _RAW["trees"].items()
}


def trees_testing(series: str) -> dict[str, Tree]:
    """The trees that run the series' own test directory: those whose ``suite`` it is."""
    return {label: t for label, t in TREES.items() if t.suite == series}


TREE_FREE_ENV = "DCP_DSPARK_TREE_FREE"  # "only" in the tree-free run, "skip" in every other run of make test
UNIT_RUNS: dict[str, dict] = _RAW["unit"]["runs"]  # the unit tier, as runs: label -> tests, cost_s
TREE_FREE_TESTS: tuple[str, ...] = tuple(_RAW["tree_free"]["tests"])


@dataclass(frozen=True)
class Run:
    """One pytest process of ``make test``: its label (make test-<label>, build/junit/<label>.xml), the tree it
    imports, what it collects, and the other trees it reads."""

    label: str
    tree: Tree
    test_paths: tuple[str, ...]
    tree_free: str  # the TREE_FREE_ENV value: "only" (the tree-free run) or "skip"
    reads: tuple[str, ...]
    cost_s: int  # about how long it runs (seconds, 2-core machine): make starts the longest first
    title: str

    @property
    def env(self) -> dict[str, str]:
        env = {"DCP_DSPARK_TREE": self.tree.label, TREE_FREE_ENV: self.tree_free}
        if self.tree.dir:
            env["PYTHONPATH"] = self.tree.make_path
        return env

    @property
    def status_first(self) -> bool:
        return self.tree.status_first and self.label == self.tree.label

    def shell_line(self, marks: tuple[str, ...] = ()) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.env.items())
        quoted = [f'"{m}"' if " " in m else m for m in marks]
        return f"{env} pytest {' '.join([*quoted, *self.test_paths])}"

    def make_deps(self) -> list[str]:
        own = [_stamp(self.tree)] if self.tree.dir else ["$(STAMP)"]
        return own + [_stamp(TREES[label]) for label in self.reads if TREES[label].dir and _stamp(TREES[label]) not in own]


def _runs() -> dict[str, Run]:
    stock = TREES["stock"]
    runs = {
        "tree-free": Run("tree-free", stock, TREE_FREE_TESTS, "only", (), _RAW["tree_free"]["cost_s"],
                         "the tests that import no sglang"),
    }
    for label, row in UNIT_RUNS.items():
        # The unit tier's tests marked trees read every tree (the table's states, the series' re-exports).
        runs[label] = Run(label, stock, tuple(row["tests"]), "skip", tuple(t.label for t in TREES.values() if t.dir),
                          row["cost_s"], row["title"])
    for tree in TREES.values():
        if tree.test_dirs:
            runs[tree.label] = Run(tree.label, tree, tree.test_dirs, "skip", tree.reads, tree.cost_s, tree.title)
    return runs


def _stamp(tree: Tree) -> str:
    return f"{tree.make_path}/.stamp"


def make_include() -> str:
    """build/trees.mk: a rule per built tree, the tree groups, and a make target per run of make test."""
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
        releases = list(dict.fromkeys(t.sglang for t in TREES.values() if t.dir and _stamp(t) in stamps))
        count = f"{len(stamps)} tree{'s' if len(stamps) > 1 else ''}"
        out.append(f"{target}: {' '.join(stamps)} ## build {count} under build/trees (sglang {', '.join(releases)})")
    out += ["", f"TREE_TARGETS := {' '.join(groups)}"]
    # One make target per run; make test starts them longest first, two at a time (tools/suite.py runs one).
    order = sorted(RUNS.values(), key=lambda r: -r.cost_s)
    checks = [r for r in order if r.label in UNIT_RUNS or r.label == "tree-free"]
    out += [f"TEST_RUNS := {' '.join(f'test-{r.label}' for r in order)}",
            f"CHECK_RUNS := {' '.join(f'check-{r.label}' for r in checks)}",
            ".PHONY: $(TEST_RUNS) $(CHECK_RUNS)"]
    for run in RUNS.values():
        out += ["", f"test-{run.label}: {' '.join(run.make_deps())} ## one run of make test: {run.title}",
                f"\t$(BIN)/python tools/suite.py run {run.label}"]
    for run in checks:  # make check: the same runs with no tree built (the tests marked trees left to make test)
        out += ["", f"check-{run.label}: $(STAMP) ## one run of make check: {run.title}",
                f"\t$(BIN)/python tools/suite.py check {run.label}"]
    return "\n".join(out) + "\n"


RUNS: dict[str, Run] = _runs()


def markdown(series: str) -> str:
    """The trees ``series`` is tested on: what each is, the state the series reads as there, and its pytest run."""
    rows = [
        f"| tree label | tree | under build/trees | {series} | its run in `make test` |",
        "|---|---|---|---|---|",
    ]
    for label, tree in trees_testing(series).items():
        where = f"`{tree.dir}`" if tree.dir else "(the venv's sglang)"
        if label in RUNS:
            run = f"`make test-{label}`: `{RUNS[label].shell_line()}`"
        else:
            run = f"none: its files are {tree.same_files_as}'s, asserted by their hash (`test/project/test_tree_table.py`)"
        state = tree.expect[series] + (" (tests marked regression: strict xfails)" if tree.defect else "")
        rows.append(f"| `{label}` | {tree.title} | {where} | {state} | {run} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--make"]:
        sys.stdout.write(make_include())
    elif sys.argv[1:2] == ["--markdown"] and len(sys.argv) == 3 and sys.argv[2] in SERIES:
        sys.stdout.write(markdown(sys.argv[2]))
    else:
        sys.exit(f"usage: python3 tools/tree_table.py --make | --markdown SERIES "
                 f"(SERIES: {', '.join(SERIES)})")
