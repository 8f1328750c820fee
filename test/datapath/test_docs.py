"""docs/hicache-datapath.md carries the matrix table that matrix.py generates from the plans the tests run."""

from __future__ import annotations

import docblocks
from emulation.datapath import matrix


def test_committed_matrix_table_is_fresh():
    assert matrix.committed_table() == matrix.markdown(), (
        "docs/hicache-datapath.md's matrix table is stale; fix: .venv/bin/python tools/emulation/datapath/matrix.py --write"
    )
    # The same "matrix" block as the docs' shared checker reads it (test/project/test_docs.py lists every block).
    docblocks.check("matrix", matrix.markdown())
