"""docs/hicache-datapath.md carries the matrix table that matrix.py generates from the plans the tests run."""

from __future__ import annotations

from datapath import matrix


def test_committed_matrix_table_is_fresh():
    assert matrix.committed_table() == matrix.markdown(), (
        "docs/hicache-datapath.md's matrix table is stale; fix: .venv/bin/python test/datapath/matrix.py --write"
    )
