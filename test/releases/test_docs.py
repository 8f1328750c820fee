"""The release tables: docs/preflight.md's (the embedded default) and the README's (what runs the headline launch),
this release's row of each as preflight says it now."""

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


def test_this_releases_recipe_row_in_the_readme_is_fresh():
    from releases import recipes

    mine = recipes.row()
    key = mine.split("|")[1].strip()
    committed = recipes.committed_rows()
    assert committed.get(key) == mine, (
        f"README.md's recipe row for sglang {key} is stale or missing: expected\n{mine}\nfound\n{committed.get(key)}\n"
        "fix: .venv/bin/python test/releases/recipes.py --write"
    )
    assert len(committed) == len(recipes.LABELS)
