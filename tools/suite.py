"""The runs of ``make test``: one pytest process per run of patches/trees.json, each with its own log, JUnit file
and wall time, and the report that ends the suite.

``make test`` starts the runs two at a time (one per core), each as a make target of its own
(``make test-<label>``, rendered into build/trees.mk by tools/tree_table.py), then reads what they left:

- build/logs/<label>.log    the run's whole output (pytest's, and ``status`` where the table asks for it);
- build/junit/<label>.xml   pytest's JUnit file (test/every_test_ran.py reads them all);
- build/junit/<label>.json  how the run ended: its exit code and wall time, and the command;
- build/junit/imports/<label>/  what each harness process of the run imported of sglang (emulation.imports).

They are kept until the next ``make test`` (or the next run of the same label), so where the time went can be read
after the fact: ``python tools/suite.py report`` prints which runs passed, the log tail of each that did not, and the
table (each run's wall time and test count, the slowest tests of the whole suite).

Only the standard library is used, as in tree_table.py.

Usage: python tools/suite.py run LABEL [--python PY]     (one run of make test; its exit code is pytest's)
       python tools/suite.py check LABEL [--python PY]   (one run of make check: no tree, build/check)
       python tools/suite.py report [--slowest N]        (exit 1 when a run failed or did not run)
       python tools/suite.py table DIR                   (the table of the JUnit files in DIR)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import tree_table
from emulation import imports

REPO = tree_table.REPO
JUNIT = REPO / "build" / "junit"
LOGS = REPO / "build" / "logs"
CHECK = REPO / "build" / "check"  # make check's logs and results, apart from make test's
TAIL_LINES = 40
SLOWEST = 15


def run(label: str, python: str = sys.executable, check: bool = False) -> int:
    """One run: pytest on the run's paths with its tree on the path, output to its log; pytest's exit code.

    ``check``: the run as make check runs it, with no tree built (its tests marked trees left out), its files under
    build/check, so that make test's record stays as it was."""
    spec = tree_table.RUNS[label]
    junit_dir, logs = (CHECK, CHECK) if check else (JUNIT, LOGS)
    junit_dir.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    log, junit, record = logs / f"{label}.log", junit_dir / f"{label}.xml", junit_dir / f"{label}.json"
    for stale in (log, junit, record):
        stale.unlink(missing_ok=True)
    harnesses = junit_dir / "imports" / label
    shutil.rmtree(harnesses, ignore_errors=True)
    env = dict(os.environ, **spec.env, **{imports.DIR_ENV: str(harnesses)})
    # make test runs two pytest processes on two cores: torch's own thread pool in each would put four threads on
    # them (two decode_dcp children side by side: 68 s with it, 55 s with one thread each, the same output).
    env.setdefault("OMP_NUM_THREADS", "1")
    marks = ("-m", "not trees") if check and spec.tree_free != "only" else ()
    command = [python, "-m", "pytest", f"--junitxml={junit}", *marks, *spec.test_paths]
    started = time.monotonic()
    with log.open("w", encoding="utf-8") as out:
        if spec.status_first and not check:
            # What the series read as on the tree, in its log, before its tests.
            subprocess.run([python, "-m", "sglang_dcp_dspark", "status", "--target", spec.tree.make_path], cwd=REPO,
                           env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
        out.write(f"$ {spec.shell_line(marks)}\n")
        out.flush()
        code = subprocess.run(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    wall = time.monotonic() - started
    record.write_text(json.dumps({"label": label, "exit": code, "wall_s": round(wall, 1),
                                  "command": spec.shell_line(marks)}) + "\n", encoding="utf-8")
    result = Result.read(label, junit_dir)
    print(result.line(logs), flush=True)
    if check and code != 0:
        print_tail(log)
    return code


def print_tail(log: Path) -> None:
    if log.is_file():
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-TAIL_LINES:]
        print(f"--- the last {len(tail)} lines of {log.relative_to(REPO)} ---")
        print("\n".join(tail))


@dataclass
class Result:
    label: str
    exit: int | None  # None: the run did not finish (no record)
    wall_s: float
    counts: dict[str, int]
    cases: list[tuple[float, str]]  # (seconds, test id)

    @classmethod
    def read(cls, label: str, junit_dir: Path = JUNIT) -> Result:
        record = junit_dir / f"{label}.json"
        ended = json.loads(record.read_text(encoding="utf-8")) if record.is_file() else {}
        counts = dict.fromkeys(("passed", "failed", "skipped", "xfailed"), 0)
        cases: list[tuple[float, str]] = []
        junit = junit_dir / f"{label}.xml"
        if junit.is_file():
            root = ET.parse(junit).getroot()
            for case in root.iter("testcase"):
                counts[outcome(case)] += 1
                cases.append((float(case.get("time") or 0.0), f"{case.get('classname')}::{case.get('name')}"))
            if not ended:  # a JUnit file from before tools/suite.py kept records: pytest's own time, its verdict
                suite = root if root.tag == "testsuite" else root.find("testsuite")
                ended = {"exit": 1 if counts["failed"] else 0, "wall_s": float(suite.get("time") or 0.0)}
        return cls(label, ended.get("exit"), float(ended.get("wall_s", 0.0)), counts, cases)

    @property
    def passed(self) -> bool:
        return self.exit == 0

    @property
    def tests(self) -> int:
        return sum(self.counts.values())

    def line(self, logs: Path = LOGS) -> str:
        if self.exit is None:
            return f"run {self.label}: DID NOT RUN (no {JUNIT.relative_to(REPO)}/{self.label}.json); fix: make test-{self.label}"
        counts = ", ".join(f"{n} {what}" for what, n in self.counts.items() if n)
        state = "passed" if self.passed else f"FAILED (pytest exit {self.exit})"
        return (f"run {self.label}: {state} in {self.wall_s:.0f} s ({counts or 'no tests'}); "
                f"log: {(logs / (self.label + '.log')).relative_to(REPO)}")


def outcome(case: ET.Element) -> str:
    """passed, failed, skipped or xfailed: a JUnit test case as this report and test/every_test_ran.py read it."""
    tags = {child.tag: child for child in case}
    if "failure" in tags or "error" in tags:
        return "failed"
    if "skipped" in tags:
        return "xfailed" if tags["skipped"].get("type") == "pytest.xfail" else "skipped"
    return "passed"


def table(results: list[Result], slowest: int = SLOWEST) -> str:
    """Each run's wall time and test count, and the slowest tests of the whole suite."""
    width = max(len(r.label) for r in results)
    lines = [f"{'run':<{width}}  {'wall s':>7}  {'tests':>5}  {'passed':>6}  {'failed':>6}  {'skipped':>7}  "
             f"{'xfailed':>7}"]
    for r in results:
        c = r.counts
        if r.exit is None:
            lines.append(f"{r.label:<{width}}  {'-':>7}  not run")
            continue
        lines.append(f"{r.label:<{width}}  {r.wall_s:>7.0f}  {r.tests:>5}  {c['passed']:>6}  {c['failed']:>6}  "
                     f"{c['skipped']:>7}  {c['xfailed']:>7}")
    total = sum(r.wall_s for r in results)
    lines.append(f"{'all runs':<{width}}  {total:>7.0f}  {sum(r.tests for r in results):>5}  (run time added up; "
                 "make test runs two at a time)")
    cases = sorted(((s, r.label, test) for r in results for s, test in r.cases), reverse=True)[:slowest]
    lines += ["", f"the {len(cases)} slowest tests of the suite:", f"{'s':>6}  run / test"]
    lines += [f"{s:>6.1f}  {label} / {test}" for s, label, test in cases]
    # The closing line in the form any CI reads (an expected failure is a strict xfail: it failed as it asserts).
    total = {what: sum(r.counts[what] for r in results) for what in ("passed", "failed", "skipped", "xfailed")}
    lines += ["", f"of the passed, {total['xfailed']} are strict xfails, each failing as it asserts",
              f"suite: {total['passed'] + total['xfailed']} passed, {total['failed']} failed, {total['skipped']} skipped"]
    return "\n".join(lines)


def report(slowest: int = SLOWEST) -> int:
    results = [Result.read(label) for label in tree_table.RUNS]
    failed = [r for r in results if not r.passed]
    for r in failed:
        print_tail(LOGS / f"{r.label}.log")
    for r in results:
        print(r.line())
    print(f"{len(results) - len(failed)} of {len(results)} runs passed"
          + (f"; failed or not run: {', '.join(r.label for r in failed)}" if failed else ""))
    twice = imports.repeated(harness_records())
    for line in twice:
        print(f"error: {line}; expected each harness once per distinct set of sglang files; fix: give one tree "
              "same_files_as in patches/trees.json, or run the harness on one of them only")
    print()
    print(table(results, slowest))
    return 1 if failed or twice else 0


def harness_records() -> dict[str, list[dict]]:
    """run label -> the records of its harness processes (emulation.imports), in the table's order."""
    out = {}
    for label in tree_table.RUNS:
        found = sorted((JUNIT / "imports" / label).glob("*.json"))
        out[label] = [json.loads(p.read_text(encoding="utf-8")) for p in found]
    return out


def main(argv: list[str]) -> int:
    usage = "usage: python tools/suite.py run|check LABEL [--python PY] | report [--slowest N] | table DIR"
    if argv[:1] in (["run"], ["check"]) and len(argv) in (2, 4) and argv[1] in tree_table.RUNS:
        python = argv[3] if len(argv) == 4 and argv[2] == "--python" else sys.executable
        return run(argv[1], python, check=argv[0] == "check")
    if argv[:1] == ["table"] and len(argv) == 2 and Path(argv[1]).is_dir():
        # The table of any directory of JUnit files (an older run's, kept elsewhere), in the files' order.
        found = Path(argv[1])
        print(table([Result.read(p.stem, found) for p in sorted(found.glob("*.xml"))]))
        return 0
    if argv[:1] == ["report"] and len(argv) in (1, 3):
        if len(argv) == 3 and argv[1] == "--slowest" and argv[2].isdigit():
            return report(int(argv[2]))
        if len(argv) == 1:
            return report()
    if argv[:1] in (["run"], ["check"]) and len(argv) >= 2 and argv[1] not in tree_table.RUNS:
        print(f"error: no run {argv[1]!r} in patches/trees.json; expected one of {', '.join(tree_table.RUNS)}; "
              "fix: python tools/suite.py run LABEL", file=sys.stderr)
        return 2
    print(f"error: {' '.join(argv) or 'no command'} is not a command; expected {usage.removeprefix('usage: ')}; "
          "fix: python tools/suite.py report", file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:  # Ctrl-C in make test: pytest got it too; its log and JUnit file say how far it got
        print(f"interrupted: python tools/suite.py {' '.join(sys.argv[1:])}; its log is under build/", file=sys.stderr)
        sys.exit(130)
