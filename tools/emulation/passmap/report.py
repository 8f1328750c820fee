"""The map's outputs: the full map (``spec_passes.json``), its freshness against a run, and the document's block
(docs/spec-under-dcp.md); ``write_data`` writes the package's compacted tables too (``compact.py``)."""

from __future__ import annotations

import json
from pathlib import Path

from emulation.passmap import compact, plain
from emulation.passmap.fixed import fixed_key, fixed_markdown
from emulation.passmap.harness import PASSES, worst_cell

HERE = Path(__file__).resolve()
REPO = HERE.parents[3]  # tools/emulation/passmap/report.py
DATA = HERE.parent / "spec_passes.json"  # the full map; the package ships it compacted (compact.py)
DOC = REPO / "docs" / "spec-under-dcp.md"
BEGIN, END = "<!-- passmap:begin -->", "<!-- passmap:end -->"
GENERATED_BY = "python -m emulation.passmap --write (on each tree: PYTHONPATH=build/trees/sglang-X)"


def sort_key(c: dict) -> tuple:
    return (tuple(int(x) for x in c["release"].split(".")[:3]), c["target_backend"] != "flashinfer_mla",
            c["target_backend"], c["algorithm"], c.get("draft_backend_flag") or "",
            c["draft_backend"] or "", c["dcp"], c["rank"])


def probe_key(r: dict) -> tuple:
    return tuple(int(x) for x in r["release"].split(".")[:3]), r["probe"]


def merge(old: dict | None, records: list[dict], probe_records: list[dict], rel: str,
          plain_records: list[dict] = ()) -> dict:
    kept = [c for c in (old or {}).get("cases", []) if c["release"] != rel]
    kept_probes = [r for r in (old or {}).get("probes", []) if r["release"] != rel]
    kept_plain = [r for r in (old or {}).get("plain", []) if r["release"] != rel]
    return {"generated_by": GENERATED_BY, "passes": list(PASSES), "plain_passes": list(plain.PLAIN_PASSES),
            "cases": sorted(kept + records, key=sort_key), "probes": sorted(kept_probes + probe_records, key=probe_key),
            "plain": sorted(kept_plain + list(plain_records), key=plain.sort_key),
            "verify_fixed": (old or {}).get("verify_fixed", [])}


def load() -> dict | None:
    return json.loads(DATA.read_text(encoding="utf-8")) if DATA.exists() else None


def cell(p: dict) -> str:
    v, hc = p["verdict"], p.get("after_hicache", {}).get("verdict", "?")
    return v if hc == v else f"{v} / after HiCache: {hc}"


def flag_name(c: dict) -> str:
    flag = c.get("draft_backend_flag")
    return f"{flag}" if flag else f"default ({c['draft_backend']})"


def markdown(data: dict) -> str:
    out = []
    releases = sorted({c["release"] for c in data["cases"]}, key=lambda r: tuple(int(x) for x in r.split(".")[:3]))
    for rel in releases:
        rows = [c for c in data["cases"] if c["release"] == rel]
        out += [f"### sglang {rel}", "", "Summary (worst over the ranks run; NEXTN and DSPARK at dcp 1 and 8):", "",
                "| algorithm | target backend | draft-backend flag (backend) | dcp | " + " | ".join(PASSES) + " |",
                "|---|---|---|---|" + "---|" * len(PASSES)]
        for c in rows:
            if c["rank"] != 0 or c["dcp"] not in (1, 8):
                continue
            peers = [d for d in rows if (d["algorithm"], d["target_backend"], d.get("draft_backend_flag"), d["dcp"])
                     == (c["algorithm"], c["target_backend"], c.get("draft_backend_flag"), c["dcp"])]
            out.append(f"| {c['algorithm']} | {c['target_backend']} | {flag_name(c)} | {c['dcp']} | "
                       + " | ".join(worst_cell([d["passes"][p] for d in peers]) for p in PASSES) + " |")
        plain_rows = [r for r in data.get("plain", []) if r["release"] == rel]
        if plain_rows:
            out += ["", *plain.markdown(plain_rows)]
        probe_rows = [r for r in data.get("probes", []) if r["release"] == rel]
        if probe_rows:
            out += ["", "Launches refused before any pass runs (probes):", "", "| launch | verdict | detail | where |",
                    "|---|---|---|---|"]
            out += [f"| {r['probe']} | {r['verdict']} | {r['detail']} | `{r['where']}` |" for r in probe_rows]
        out += ["", "| algorithm | draft (kind) | target / draft backend (flag) | dcp | rank | "
                + " | ".join(PASSES) + " |", "|---|---|---|---|---|" + "---|" * len(PASSES)]
        for c in rows:
            out.append(f"| {c['algorithm']} | {c['draft_class']} ({c['draft_kind']}) | {c['target_backend']} / "
                       f"{flag_name(c)} | {c['dcp']} | {c['rank']} | "
                       + " | ".join(cell(c["passes"][p]) for p in PASSES) + " |")
        out += ["", "Details (the largest dcp, last rank, of each case):", ""]
        seen = set()
        for c in reversed(rows):
            k = (c["algorithm"], c["target_backend"], c.get("draft_backend_flag"))
            if k in seen:
                continue
            seen.add(k)
            out.append(f"- {c['algorithm']} / target {c['target_backend']} / {flag_name(c)}, dcp {c['dcp']} "
                       f"rank {c['rank']}:")
            for p in PASSES:
                q = c["passes"][p]
                out.append(f"  - {p}: **{q['verdict']}**: {q['detail']} (after HiCache: "
                           f"{q['after_hicache']['verdict']}: {q['after_hicache']['detail']}). Where: `{q['where']}`")
        out.append("")
    if data.get("verify_fixed"):
        out += fixed_markdown(sorted(data["verify_fixed"], key=fixed_key))
    return "\n".join(out).rstrip() + "\n"


def write_doc(data: dict) -> None:
    text = DOC.read_text(encoding="utf-8") if DOC.exists() else f"# Speculative passes under DCP\n\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{markdown(data)}{END}{tail}", encoding="utf-8")


def committed_for(rel: str) -> list[dict]:
    return [c for c in (load() or {}).get("cases", []) if c["release"] == rel]


def committed_probes_for(rel: str) -> list[dict]:
    return [r for r in (load() or {}).get("probes", []) if r["release"] == rel]


def fresh(records: list[dict], probe_records: list[dict], rel: str, plain_records: list[dict] = ()) -> bool:
    key = plain.sort_key
    committed_plain = [r for r in (load() or {}).get("plain", []) if r["release"] == rel]
    return (sorted(records, key=sort_key) == sorted(committed_for(rel), key=sort_key)
            and sorted(probe_records, key=probe_key) == sorted(committed_probes_for(rel), key=probe_key)
            and sorted(plain_records, key=key) == sorted(committed_plain, key=key))


def write_data(data: dict) -> None:
    """The full map, the package's per-release tables compacted from it, and the document."""
    DATA.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    compact.write(DATA)
    write_doc(data)
