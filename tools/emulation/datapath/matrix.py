"""Which data-path cases run on which sglang tree, and the docs table made from that plan.

The tests parametrize over these lists, and docs/hicache-datapath.md carries
the table that ``python tools/emulation/datapath/matrix.py`` prints (``--write`` pastes it in)
(test_docs.py fails when the committed table is stale). Importing this module
does not import sglang.

Usage: python tools/emulation/datapath/matrix.py [--write]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import tree_table

DCP_SIZES = (1, 2, 3, 4, 8)
LAYOUT_IO_PAIRS = (  # the pairs sglang keeps (ServerArgs._resolve_layout_io_compatibility)
    ("layer_first", "direct"),
    ("layer_first", "kernel"),
    ("page_first", "kernel"),
    ("page_first_direct", "direct"),
)
DRAFT_KINDS = ("mla", "mha")

# The tree labels and what each tree is come from patches/trees.json
# (tools/tree_table.py); this module adds, per label, the draft registration
# paths the harness drives there and whether the full matrix runs.
# "default": 0.5.17's HiRadixCache registration. "legacy": HiRadixCache through
# _register_legacy_hicache_draft (0.5.18, the PR parent). "sidecar": the tree's
# UnifiedRadixCache with a HostPoolGroup, the draft put in as a sidecar by
# hybrid_pool_assembler.build_full_draft_pools (0.5.18 and the PR parent under
# SGLANG_ENABLE_UNIFIED_RADIX_TREE or for hybrid/DSA models; every HiCache launch of 0.5.23).
_DRIVEN = {
    "stock": (("default",), True),
    "patched": (("default",), True),
    "plugin": (("default",), True),
    "upstream-base": (("legacy", "sidecar"), False),
    "upstream-0.5.18": (("legacy", "sidecar"), False),
    "next-stock": (("sidecar",), False),
    "next-patched": (("sidecar",), False),
    # The stock 0.5.23 tree with the plugin loaded through load_plugins() (conftest): its hooks are on this path.
    "next-plugin": (("sidecar",), False),
}
# The trees of the table whose run includes this directory (the release trees 0.5.19-0.5.22 run test/releases only).
_RUN_HERE = [label for label, tree in tree_table.TREES.items()
             if any("test/datapath/".startswith(d.rstrip("/") + "/") for d in tree.test_dirs)]
if set(_DRIVEN) != set(_RUN_HERE):
    raise RuntimeError(
        f"tools/emulation/datapath/matrix.py drives {sorted(_DRIVEN)} but the trees of patches/trees.json that run test/datapath "
        f"are {sorted(_RUN_HERE)}; fix: give every such tree its draft paths here"
    )
# label -> (what the tree is, the draft registration paths it is driven through, full matrix?)
TREES = {label: (tree_table.TREES[label].title, *_DRIVEN[label]) for label in _RUN_HERE}
# Trees whose draft host pool is sized from physical rows: every dcp > 1 case is
# a strict xfail there, and the failure must be the draft host pool overflowing.
DEFECT_TREES = frozenset({"stock", "upstream-base"})
# Why a tree with no draft path above would run no data-path case (docs and the skip reason say the same).
NOT_DRIVEN = "no draft registration path of this tree is driven by the harness"


# --hicache-size of the budget round trips, in GB (16 kB): what about 125 rows of the harness's default target
# (2 layers x 32 dims in bf16, 128 bytes a token) would pin alone, twice what --hicache-ratio 2 gives it.
BUDGET_GB = 1.6e-5


@dataclass(frozen=True)
class Planned:
    dcp_size: int
    dcp_rank: int
    layout: str
    io_backend: str
    draft: str
    draft_path: str
    hicache_size: float = 0  # GB, as --hicache-size; 0: sized by --hicache-ratio
    draft_plan: str = "sidecar"  # 0.5.23's HiCache draft plan: "sidecar" or "packed" (harness.Case)
    draft_layout: str = "replicated"  # the draft's device layout: "replicated" or "striped" (harness.Case)
    forward_read: bool = False  # also check the draft attention's read path after every load-back

    @property
    def id(self) -> str:
        path = "" if self.draft_path == "default" else f"-{self.draft_path}"
        budget = f"-hicache-size{self.hicache_size:g}" if self.hicache_size else ""
        pair = "" if (self.draft_plan, self.draft_layout) == ("sidecar", "replicated") else \
            f"-{self.draft_layout}-draft-{self.draft_plan}-plan"
        read = "-read" if self.forward_read else ""
        return (f"dcp{self.dcp_size}-r{self.dcp_rank}-{self.layout}-{self.io_backend}-{self.draft}{path}{budget}"
                f"{pair}{read}")


def _ranks(dcp: int) -> list[int]:
    return sorted({0, dcp - 1})


def round_trip_plan(tree: str) -> list[Planned]:
    """Full matrix on the 0.5.17 trees; elsewhere dcp 1/2/3/8 at the last rank, pairs in rotation, both drafts."""
    _, paths, full = TREES[tree]
    out: list[Planned] = []
    for path in paths:
        if full:
            for dcp in DCP_SIZES:
                for rank in _ranks(dcp):
                    for layout, io in LAYOUT_IO_PAIRS:
                        for draft in DRAFT_KINDS:
                            out.append(Planned(dcp, rank, layout, io, draft, path))
        else:
            for i, dcp in enumerate((1, 2, 3, 8)):
                layout, io = LAYOUT_IO_PAIRS[i % len(LAYOUT_IO_PAIRS)]
                for draft in DRAFT_KINDS:
                    out.append(Planned(dcp, dcp - 1, layout, io, draft, path))
    return out


def stress_plan(tree: str) -> list[Planned]:
    """Every dcp and both end ranks on the 0.5.17 trees (layout pair and draft kind in rotation); dcp 2 and 8 elsewhere."""
    _, paths, full = TREES[tree]
    out: list[Planned] = []
    for path in paths:
        points = [(d, r) for d in DCP_SIZES for r in _ranks(d)] if full else [(2, 1), (8, 7)]
        for k, (dcp, rank) in enumerate(points):
            layout, io = LAYOUT_IO_PAIRS[k % len(LAYOUT_IO_PAIRS)]
            out.append(Planned(dcp, rank, layout, io, DRAFT_KINDS[k % len(DRAFT_KINDS)], path))
    return out


def negative_plan(tree: str) -> list[Planned]:
    """Sabotaged copies at dcp 1 everywhere, and at dcp 8 (last rank) where the fix is in."""
    _, paths, _ = TREES[tree]
    out = []
    for path in paths:
        out.append(Planned(1, 0, "layer_first", "direct", "mla", path))
        if tree not in DEFECT_TREES:
            out.append(Planned(8, 7, "page_first", "kernel", "mha", path))
    return out


def budget_plan(tree: str) -> list[Planned]:
    """Round trips with --hicache-size set, on the 0.5.23 trees (whose sidecar budget 0001 and the plugin change).

    dcp 2 with an MLA draft and dcp 8 with an MHA draft, each on another layout/io pair.
    """
    _, paths, _ = TREES[tree]
    if tree_table.TREES[tree].sglang != tree_table.VERSIONS["next"] or "sidecar" not in paths:
        return []
    return [
        Planned(2, 1, "layer_first", "direct", "mla", "sidecar", BUDGET_GB),
        Planned(8, 7, "page_first", "kernel", "mha", "sidecar", BUDGET_GB),
    ]


def budget_fits(tree: str) -> bool:
    """Does --hicache-size hold target and draft on this tree? Not on the tree the table marks with the defect."""
    return not tree_table.TREES[tree].defect


# The draft's HiCache plan x its device layout (docs/draft-layouts.md), driven on the 0.5.23 trees' sidecar path:
# (plan, layout, draft kind, what sglang 0.5.23 gives it, fits?). "fits": byte-exact and the forward read
# returns the written bytes; otherwise every case is a strict xfail that only harness.DraftRowsWrong satisfies.
DRAFT_PAIRS = (
    ("packed", "striped", "mla", "NEXTN/MTP: EAGLE with the target's own NextN layer", True),
    ("sidecar", "replicated", "mha", "an MHA draft on fa3/flashinfer", True),
    ("sidecar", "striped", "mla", "an external MLA EAGLE draft (the HiCache gate refuses it at launch)", False),
    ("packed", "replicated", "mla", "counterfactual: a replicated draft packed into the striped target pool", False),
)
# Where each pair runs: (dcp, rank) points, and whether the eviction stress runs there too.
_PAIR_POINTS = {
    ("packed", "striped"): ([(d, r) for d in (2, 4, 8) for r in _ranks(d)], True),
    # The pairs the HiCache gate admits under DCP (the plugin's hook, upstream-next 0020) run the stress too.
    ("sidecar", "replicated"): ([(2, 1), (8, 7)], True),
    ("sidecar", "striped"): ([(2, 1), (8, 7)], False),
    ("packed", "replicated"): ([(2, 1)], False),
}
# The negative controls of the draft rows: (id, plan, layout, draft, (dcp, rank), the draft's load-back shifted by
# one row?, byte check of the draft on?, what it shows). Each must raise harness.DraftRowsWrong.
DRAFT_CONTROLS = (
    ("shifted-load-byte-check", "packed", "striped", "mla", (4, 3), True, True,
     "the draft's load-back lands one row off: caught by the byte check"),
    ("shifted-load-forward-read", "packed", "striped", "mla", (4, 3), True, False,
     "the same, with the draft's byte check off: caught by the forward read"),
    ("byte-exact-on-unread-rows", "sidecar", "replicated", "mla", (2, 1), False, True,
     "a replicated MLA draft, byte-exact on its rows, which the MLA read path does not read: caught by the "
     "forward read"),
)


def _pairs_driven(tree: str) -> bool:
    _, paths, _ = TREES[tree]
    return tree_table.TREES[tree].sglang == tree_table.VERSIONS["next"] and "sidecar" in paths


def draft_pair_plan(tree: str, scenario: str = "round_trip") -> list[Planned]:
    """The draft plan x layout cases on the 0.5.23 trees (``scenario``: "round_trip" or "stress"), forward read on.

    Layout/io pairs in rotation over each pair's points.
    """
    if not _pairs_driven(tree):
        return []
    out = []
    for plan, draft_layout, draft, _, _ in DRAFT_PAIRS:
        points, stress = _PAIR_POINTS[(plan, draft_layout)]
        if scenario == "stress" and not stress:
            continue
        for k, (dcp, rank) in enumerate(points):
            layout, io = LAYOUT_IO_PAIRS[k % len(LAYOUT_IO_PAIRS)]
            out.append(Planned(dcp, rank, layout, io, draft, "sidecar", draft_plan=plan, draft_layout=draft_layout,
                               forward_read=True))
    return out


def draft_control_plan(tree: str) -> list[tuple[str, Planned, bool, bool]]:
    """DRAFT_CONTROLS on this tree: (id, case, shift the draft's load-back?, byte check of the draft on?)."""
    if not _pairs_driven(tree):
        return []
    return [(name, Planned(dcp, rank, "layer_first", "direct", draft, "sidecar", draft_plan=plan,
                           draft_layout=layout, forward_read=True), shift, byte_check)
            for name, plan, layout, draft, (dcp, rank), shift, byte_check, _ in DRAFT_CONTROLS]


def draft_pair_fits(p: Planned) -> bool | None:
    """Whether the case's (plan, layout, draft) pair of DRAFT_PAIRS fits; None for a case of no pair."""
    return next((fits for plan, layout, draft, _, fits in DRAFT_PAIRS
                 if (plan, layout, draft) == (p.draft_plan, p.draft_layout, p.draft)), None)


def expected(tree: str, p: Planned) -> str:
    if p.forward_read and draft_pair_fits(p) is not None:
        return "byte-exact" if draft_pair_fits(p) else "xfail: draft rows wrong"
    return "xfail: draft host overflow" if tree in DEFECT_TREES and p.dcp_size > 1 else "byte-exact"


def markdown() -> str:
    rows = [
        "| tree label | tree | draft path | round trips | with --hicache-size | stress runs | negative controls "
        "| draft plan x layout runs | dcp > 1 expected |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for tree, (what, paths, full) in TREES.items():
        if not paths:
            rows.append(f"| `{tree}` | {what} | none | 0 | 0 | 0 | 0 | 0 | not driven: {NOT_DRIVEN} |")
            continue
        rt, bud, st, neg = round_trip_plan(tree), budget_plan(tree), stress_plan(tree), negative_plan(tree)
        outcome = "strict xfail, asserted draft host overflow" if tree in DEFECT_TREES else "byte-exact"
        scope = "full matrix" if full else "subset"
        budget = f"{len(bud)} ({'fits' if budget_fits(tree) else 'pins past it'})" if bud else "0"
        pairs = draft_pair_plan(tree, "round_trip") + draft_pair_plan(tree, "stress")
        wrong = sum(not draft_pair_fits(p) for p in pairs)
        controls = len(draft_control_plan(tree))
        pair_runs = f"{len(pairs)} ({wrong} strict xfail) + {controls} controls" if pairs else "0"
        rows.append(
            f"| `{tree}` | {what} | {', '.join(paths)} | {len(rt)} ({scope}) | {budget} | {len(st)} | {len(neg)} "
            f"| {pair_runs} | {outcome} |"
        )
    rows.append("")
    rows.append(
        f"Full matrix: dcp {', '.join(map(str, DCP_SIZES))} x dcp_rank 0 and the last rank x "
        + ", ".join(f"{layout}/{io}" for layout, io in LAYOUT_IO_PAIRS)
        + " x an MLA and an MHA draft. Subset, on each draft path of the tree: dcp 1, 2, 3 and 8 at the "
        "last rank, one layout/io pair each in rotation, both drafts; stress at dcp 2 and 8. With --hicache-size "
        f"(0.5.23 trees): the round trip at dcp 2 (MLA draft) and dcp 8 (MHA draft) with --hicache-size {BUDGET_GB:g} GB, "
        "byte-exact everywhere; 'fits': target and draft host pools pin no more than the budget and one page, "
        "'pins past it': the target takes the whole budget and the draft comes on top (stock 0.5.23)."
    )
    rows += ["", *pairs_markdown()]
    return "\n".join(rows)


def _points(points: list[tuple[int, int]]) -> str:
    ranks: dict[int, list[int]] = {}
    for dcp, rank in points:
        ranks.setdefault(dcp, []).append(rank)
    return ", ".join(f"dcp {d} (rank {' and '.join(map(str, r))})" for d, r in ranks.items())


def pairs_markdown() -> list[str]:
    """The draft plan x layout cases of the 0.5.23 trees (the same on each of them)."""
    rows = [
        "Draft plan x device layout, on each 0.5.23 tree (sidecar path; forward-read check on):",
        "",
        "| draft plan | device layout | draft | what 0.5.23 gives it | runs at | scenarios | expected |",
        "|---|---|---|---|---|---|---|",
    ]
    for plan, layout, draft, what, fits in DRAFT_PAIRS:
        points, stress = _PAIR_POINTS[(plan, layout)]
        scenarios = "round trip, eviction stress" if stress else "round trip"
        outcome = ("byte-exact, forward read returns the written bytes" if fits
                   else "strict xfail, asserted `DraftRowsWrong` (the rows are named)")
        rows.append(f"| {plan} | {layout} | {draft.upper()} | {what} | {_points(points)} | {scenarios} | {outcome} |")
    for _, plan, layout, draft, point, _, _, what in DRAFT_CONTROLS:
        rows.append(f"| {plan} | {layout} | {draft.upper()} | negative control: {what} | {_points([point])} "
                    "| round trip | caught, as `DraftRowsWrong` |")
    rows += [
        "",
        "'striped': written through the draft pool's own `MLATokenToKVPool.set_mla_kv_buffer` (rank r keeps loc L with "
        "L % N == r at row L // N); 'replicated': every loc at row = loc, an MLA draft written directly, a dense (MHA) draft through `MHATokenToKVPool.set_kv_buffer`, the door DSPARK's `write_target_hidden_kv` takes. 'packed': the draft pool "
        "is handed to the tree as `mtp_draft_device_pools`, so its layers are tail layers of the target's "
        "`MLATokenToKVPoolHost`, and no sidecar is registered. Forward read: after every load-back, the rows the "
        "draft attention's own read path returns for the request's locs (MLA: `KVIndexTranslator.pack_read_stream`, "
        "`plan_dcp_decode_metadata`, `KVIndexTranslator.translate_dcp_read_ids`; MHA: the `req_to_token` "
        "passthrough, `KVIndexTranslator.read_source`) must hold the bytes written before eviction.",
    ]
    return rows


BEGIN, END = "<!-- matrix:begin (python tools/emulation/datapath/matrix.py) -->", "<!-- matrix:end -->"
DOC = Path(__file__).resolve().parents[3] / "docs" / "hicache-datapath.md"


def committed_table(doc: Path = DOC) -> str:
    text = doc.read_text()
    return text[text.index(BEGIN) + len(BEGIN): text.index(END)].strip("\n")


def write(doc: Path = DOC) -> None:
    text = doc.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(f"{head}{BEGIN}\n{markdown()}\n{END}{tail}")


if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        write()
    else:
        print(markdown())
