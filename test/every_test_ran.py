"""After every run of ``make test``: each test ran and passed on at least one run.

``make test`` runs pytest once per run of patches/trees.json (a tree, the unit
tier, the tree-free tests; tools/suite.py), each writing a JUnit file under
build/junit (one per run label). A test skipped on every run, or one that
failed everywhere, tests nothing anywhere; this check names it. An expected failure counts as a pass: the suite's xfails are strict, so
each asserts its failure (a defect on a stock tree, or a wrong pair the data
path must catch). A parametrization with no case on a tree shows there as
``name[none]``, skipped with the reason; it is judged by the cases the same
function has on the trees it runs on.

    python test/every_test_ran.py build/junit
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from suite import outcome


def outcomes(junit_dir: Path) -> dict[str, dict[str, str]]:
    """test id -> {tree label: passed | xfailed | skipped | failed}."""
    seen: dict[str, dict[str, str]] = {}
    for path in sorted(junit_dir.glob("*.xml")):
        for case in ET.parse(path).getroot().iter("testcase"):
            test = f"{case.get('classname')}::{case.get('name')}"
            seen.setdefault(test, {})[path.stem] = outcome(case)
    return seen


def main(argv: list[str]) -> int:
    junit_dir = Path(argv[0]) if argv else Path("build/junit")
    seen = outcomes(junit_dir)
    if not seen:
        print(f"error: no JUnit results under {junit_dir}; expected one file per tree from make test; fix: run make test",
              file=sys.stderr)
        return 2
    ran = {test for test, trees in seen.items() if {"passed", "xfailed"} & set(trees.values())}
    functions = {test.split("[")[0] for test in ran}
    never = {test: trees for test, trees in seen.items() if test not in ran
             and not (test.endswith("[none]") and test.split("[")[0] in functions)}
    for test, trees in sorted(never.items()):
        print(f"never passed on any tree: {test} ({', '.join(f'{t}: {o}' for t, o in sorted(trees.items()))}); "
              "expected a tree that runs it; fix: add its directory to a tree's tests in patches/trees.json, or drop the test")
    print(f"{len(seen) - len(never)} of {len(seen)} tests passed (or failed as they assert) on at least one of "
          f"{len(list(junit_dir.glob('*.xml')))} runs")
    return 1 if never else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
