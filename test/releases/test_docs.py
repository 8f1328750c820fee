"""docs/preflight.md's release table: this release's row is what preflight says of the embedded default now."""

from __future__ import annotations

from releases import table


def test_this_releases_row_is_fresh():
    mine = table.row()
    key = mine.split("|")[1].strip()
    committed = table.committed_rows()
    assert committed.get(key) == mine, (
        f"docs/preflight.md's row for sglang {key} is stale or missing: expected\n{mine}\nfound\n{committed.get(key)}\n"
        "fix: .venv/bin/python test/releases/table.py --write"
    )
    assert len(committed) == len(table.LABELS)  # one row per release tree, none left over
