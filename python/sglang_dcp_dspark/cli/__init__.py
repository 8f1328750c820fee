"""One module per CLI command, as pre-commit lays them out: ``add_parser(sub)`` and ``run(args) -> int``.

``PARSERS`` is the order ``sglang-dcp-dspark --help`` lists them in. Users'
commands come first (status, apply, revert), then the maintainers' (export,
base, workbench, whose work is in ``maintain``), then the diagnostics
(coverage, and preflight, whose judgement is :mod:`..preflight`).
"""

from __future__ import annotations

from . import apply, base, coverage, export, preflight, revert, status, workbench

PARSERS = (status, apply, revert, export, coverage, base, workbench, preflight)
