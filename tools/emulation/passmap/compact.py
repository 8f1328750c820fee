"""The package's pass-map tables, one per sglang release, compacted from the full map (``spec_passes.json`` here).

The full map keeps every case as the generator measured it, with the draft
class and the dcp-1 baselines (docs/spec-under-dcp.md renders it). What the
plugin and preflight judge a launch with is smaller: per release, the cases
under DCP with their verdicts, each text once in a table of strings, plus
the two facts that read the dcp-1 cases (did the map run any pass on the
release; which target backends it ran), gzipped: the texts (each pass's
detail and its call path) are most of a table, and they repeat across
releases. ``passes.load(release)`` expands a table back into the full map's
shape for that release, so a judgement reads the same records either way
(test/spec/test_compact.py).

    python tools/emulation/passmap/compact.py [--check]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]  # tools/emulation/passmap
FULL = HERE / "spec_passes.json"
TABLES = REPO / "python" / "sglang_dcp_dspark" / "passes" / "data"
NOT_RUN = "not-run"
CASE_FIELDS = ("algorithm", "draft_kind", "target_kind", "target_backend", "draft_backend", "draft_backend_flag",
               "dcp", "rank")
PLAIN_FIELDS = ("target_backend", "target_kind", "dcp", "rank")
FIXED_FIELDS = ("fix", "algorithm", "draft_backend_flag", "dcp", "rank")
PROBE_FIELDS = ("probe", "verdict", "detail", "where")


def _sort_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


class _Strings:
    def __init__(self) -> None:
        self.index: dict[str, int] = {}

    def __call__(self, text: str | None) -> int | None:
        if text is None:
            return None
        return self.index.setdefault(text, len(self.index))

    def table(self) -> list[str]:
        return list(self.index)


def _passes(passes: dict, s: _Strings) -> dict:
    out = {}
    for name, result in passes.items():
        row = [result["verdict"], s(result.get("detail")), s(result.get("where"))]
        after = result.get("after_hicache")
        if after is not None:
            row += [after["verdict"], s(after.get("detail"))]
        out[name] = row
    return out


def table(full: dict, release: str) -> dict:
    """The compact table of one release."""
    s = _Strings()
    cases = [c for c in full["cases"] if c["release"] == release]
    plain = [r for r in full.get("plain", []) if r["release"] == release and r["dcp"] > 1]
    return {
        "release": release,
        "generated_by": "python tools/emulation/passmap/compact.py (from tools/emulation/passmap/spec_passes.json)",
        "passes": full["passes"],
        "plain_passes": full.get("plain_passes", []),
        # The two readings of the dcp-1 cases, which the table leaves out.
        "measured": any(p["verdict"] != NOT_RUN for c in cases for p in c["passes"].values()),
        "case_backends": sorted({c["target_backend"] for c in cases}),
        "cases": [[*(c.get(f) for f in CASE_FIELDS), _passes(c["passes"], s)] for c in cases if c["dcp"] > 1],
        "plain": [[*(r.get(f) for f in PLAIN_FIELDS), _passes(r["passes"], s)] for r in plain],
        "verify_fixed": [[*(r.get(f) for f in FIXED_FIELDS), _passes(r["passes"], s)]
                         for r in full.get("verify_fixed", []) if r["release"] == release and r["dcp"] > 1],
        "probes": [[p[f] if f in ("probe", "verdict") else s(p.get(f)) for f in PROBE_FIELDS]
                   for p in full.get("probes", []) if p["release"] == release],
        "strings": s.table(),
    }


def tables(full: dict) -> dict[str, str]:
    """File name -> text, for every release of the full map."""
    releases = sorted({c["release"] for c in full["cases"]}, key=_sort_key)
    return {f"{r}.json.gz": json.dumps(table(full, r), separators=(",", ":"), sort_keys=True) + "\n" for r in releases}


def stale(full_path: Path = FULL, tables_dir: Path = TABLES) -> list[str]:
    """The tables that differ from what the full map gives (missing, changed or left over)."""
    want = tables(json.loads(full_path.read_text(encoding="utf-8")))
    # Compared as text: gzip's bytes may differ between zlib builds for the same table.
    have = {p.name: gzip.decompress(p.read_bytes()).decode("utf-8") for p in tables_dir.glob("*.json.gz")}
    return sorted(name for name in set(want) | set(have) if want.get(name) != have.get(name))


def write(full_path: Path = FULL, tables_dir: Path = TABLES) -> list[str]:
    want = tables(json.loads(full_path.read_text(encoding="utf-8")))
    tables_dir.mkdir(parents=True, exist_ok=True)
    for old in tables_dir.glob("*.json.gz"):
        if old.name not in want:
            old.unlink()
    for name, text in want.items():
        (tables_dir / name).write_bytes(gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0))
    return sorted(want)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a table is not what the full map gives")
    args = parser.parse_args(argv)
    if args.check:
        bad = stale()
        if bad:
            print(f"stale pass-map tables: {', '.join(bad)}; expected them compacted from {FULL.relative_to(REPO)}; "
                  "fix: python tools/emulation/passmap/compact.py", file=sys.stderr)
            return 1
        return 0
    written = write()
    print(f"wrote {len(written)} tables to {TABLES.relative_to(REPO)}: {', '.join(written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
