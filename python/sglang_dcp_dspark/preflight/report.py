"""How preflight shows a judged launch: the text report, the sweep table, and the chart.

Nothing here judges: every figure comes from the report :mod:`check`
built from the release's own pools (:mod:`releases`) and the host-RAM model
(:mod:`hostram`).
"""

from __future__ import annotations

import json
import re
import textwrap

from .hostram import gib
from .result import NoPools, Report

# The chart's setups, in legend order; docs/preflight.md ("Sweeps") says what each one is.
SETUPS = ("stock", "0.5.18+", "budgeted", "sharded")
# The report's width: a terminal's 100 columns; a longer line wraps at a word boundary under its own column.
WIDTH = 100
# Text chunk of the chart's PNG that carries the figures it was drawn from (the docs' freshness test reads it).
PNG_DATA_KEY = "sglang-dcp-dspark sweep"


def _judged_by(report) -> str:
    rel = report.release
    applied = f" with {', '.join('patches/' + s for s in rel.series_applied)} applied" if rel.series_applied else ""
    return f"sglang {rel.sglang}{applied}'s resolution and pool builders (adapter {rel.adapter}, from {rel.family_since})"


def render(report) -> str:
    """The text form of a :class:`result.Report`."""
    out = []
    verdict = "PASSES" if report.passed else "REJECTED"
    state = "on" if report.plugin.enabled else "off"
    out.append(f"launch {verdict} sglang {report.release.sglang}'s validation (as run with the dcp_dspark plugin {state})")
    out.append(f"  {'judged by':<13} {_judged_by(report)}")
    out.append(f"  {'plugin':<13} {report.plugin.reason}")
    applied = report.release.series_applied
    # A tree with a series applied is not stock sglang: the label says what it carries.
    base = ("sglang + " + ", ".join(applied)) if applied else "stock sglang"
    for label, r in ((base, report.stock), ("with plugin", report.with_plugin)):
        out.append(f"  {label:<13} {'passes' if r.passed else 'rejected: ' + r.message}")
    backends = report.attention_backends
    if backends.decode or backends.prefill:
        out.append(f"  {'attention':<13} {backends.source}")
    out.extend(_render_passes(report.passes))
    if report.sglang_warnings:
        out.append(f"  {'sglang warns':<13} " + report.sglang_warnings[0])
        out.extend(f"  {'':<13} {w}" for w in report.sglang_warnings[1:])
    sizing = report.sizing
    if isinstance(sizing, NoPools):
        out.append(f"  host pools: {sizing.skipped}")
    elif sizing is not None:
        out.extend(_render_sizing(sizing, report))
    out.append("")
    out.append(report.verdict.line)
    out.extend(report.verdict.block())
    return "\n".join(fit(out))


def fit(lines, width: int = WIDTH) -> list[str]:
    """Each line within ``width`` columns: a longer one wraps at word boundaries, its continuation under the
    column its text starts in (after the label), so that nothing is cut."""
    out = []
    for line in (ln.rstrip() for ln in lines):
        if len(line) <= width:
            out.append(line)
            continue
        column = re.match(r" *\S+(?: \S+)*? {2,}", line)
        indent = column.end() if column and column.end() <= 40 else len(line) - len(line.lstrip()) + 4
        out += textwrap.wrap(line, width=width, subsequent_indent=" " * indent, break_on_hyphens=False,
                             break_long_words=True)
    return out


def _render_passes(judged) -> list[str]:
    """The passes under DCP (a :class:`passes.Judgement`), one line each, as the pass map has them
    (docs/spec-under-dcp.md): the speculative ones, or a plain launch's target EXTEND and DECODE."""
    if not judged.algorithm or judged.dcp <= 1:
        return []
    kind = "plain DCP (no speculative decoding)" if judged.algorithm == "plain" else judged.algorithm
    if judged.algorithm == "NEXTN":
        kind = "NEXTN (the target's own NextN layer as draft; sglang runs it as EAGLE)"
    if not judged.mapped:
        return [f"  {'passes':<13} {kind} at dcp {judged.dcp}: unchecked: {judged.why_unmapped}"]
    out = [f"  {'passes':<13} {kind} at dcp {judged.dcp}, from the pass map (docs/spec-under-dcp.md)"
           + (f"; {judged.note}" if judged.note else "")]
    for found in judged.findings:
        hicache = ", after a HiCache load-back" if found.after_hicache else ""
        seen = f"dcp {found.dcp}, rank {found.rank}{hicache}"
        verdict, detail = _reading(found)
        out.append(f"    {found.name:<19} {found.backend:<15} {verdict:<12} ({seen}) {detail}")
    return out


PARTIAL = re.compile(r"every row read holds a token it attends to, but it reads (\d+) of the (\d+) tokens (.*)")


def _reading(found) -> tuple[str, str]:
    """A pass's reading in words a reader can resolve: a consistent pass that plans fewer of its tokens than it
    attends to reads as a subset, not as plainly consistent."""
    m = PARTIAL.fullmatch(found.detail or "")
    if found.verdict == "consistent" and m:
        return "subset", (f"reads only rows holding its own tokens, but plans {m.group(1)} of the {m.group(2)} it "
                          f"attends to {m.group(3)}")
    return found.verdict, found.detail


def _name_width(sizing) -> int:
    """The pool column: 30 wide, wider for a name that needs it (with the stock rows' label)."""
    names = [p.name for p in sizing.pools] + ["stock: " + p.name for p in sizing.stock_pools or ()]
    return max([30, *map(len, names)])


def _pool_lines(pools, coverage: float | None, label: str = "", width: int = 30) -> list[str]:
    out = []
    for p in pools:
        cov = f"{coverage:.3f}" if p.role == "draft" and coverage is not None else ""
        out.append(f"  {label + p.name:<{width}} {p.rows:>13,} {p.bytes_per_token:>8,} {gib(p.bytes):>14} "
                   f"{gib(p.per_node_bytes):>14} {cov:>9}")
    return out


def _render_sizing(sizing, report) -> list[str]:
    # A refused launch is sized as it would run if the refusing side admitted it.
    admitted = "" if report.admitted else ", if admitted (the launch as run is refused)"
    out = ["", f"DCP geometry (rank 0 of {sizing.dcp_size}{admitted}):"]
    out.append(f"  page size       {sizing.page_size} physical, {sizing.logical_page_size} logical")
    out.append(f"  device rows     {sizing.device_rows:,} physical per rank ({sizing.device_rows_note})")
    ratio = sizing.hicache_ratio
    if sizing.auto_sized_from is not None and ratio != sizing.auto_sized_from:
        out.append(f"  host ratio      {ratio:.4g}, auto-sized by sglang from {sizing.auto_sized_from:g} "
                   "(--hicache-host-memory-fraction of this rank's share of the node's RAM)")
    elif sizing.auto_sized_from is not None:
        out.append(f"  host ratio      {ratio:g}, as sglang resolved it; its auto-sizing kept it (the pools fit "
                   "--hicache-host-memory-fraction of this rank's share of the node's RAM)")
    elif (report.resolved or {}).get("hicache_size"):
        out.append(f"  host size       --hicache-size {report.resolved['hicache_size']:g} GB per rank (decimal)")
    elif ratio is not None:
        out.append(f"  host ratio      {ratio:g}, as sglang resolved it")
    target = sizing.target
    if target:
        out.append(f"  target host     {target.rows:,} physical rows, {target.logical_slots:,} logical slots")
    if sizing.draft_plan:
        out.append(f"  draft           plan {sizing.draft_plan}, {sizing.draft_path or 'no draft host pool'}")
    out.append("")
    width = _name_width(sizing)
    out.append(f"  {'host pool':<{width}} {'rows/rank':>13} {'B/token':>8} {'pinned/rank':>14} {'pinned/node':>14} {'coverage':>9}")
    out.extend(_pool_lines(sizing.pools, sizing.draft_coverage, width=width))
    stock = sizing.stock_pools
    if stock is not None and stock != sizing.pools:
        stock_draft = [p for p in stock if p.role == "draft"]
        others = [p for p in stock if p.role != "draft" and p not in sizing.pools]
        out.extend(_pool_lines(others + stock_draft, sizing.draft_coverage_stock, "stock: ", width))
        if sizing.stock_startup_error:
            out.append(f"  stock sglang stops here: {sizing.stock_startup_error}")
    ram = sizing.host_ram
    out.append("")
    out.append(f"Host RAM ({sizing.ranks_per_node} ranks per node, {'as run' if report.admitted else 'if admitted'}):")
    if ram.startup_error:
        out.append(f"  needed          at least {gib(ram.needed_per_rank)} per rank, {gib(ram.needed_per_node)} per node "
                   "(the pools built before startup stopped)")
    else:
        out.append(f"  needed          {gib(ram.needed_per_rank)} per rank, {gib(ram.needed_per_node)} per node")
    if ram.budget_per_rank:
        got = sum(p.bytes for p in sizing.pools)
        split = f"; the target got {sizing.target_hicache_size:.2f} GB of it" if sizing.target_hicache_size else ""
        slack = max((p.page_size * p.bytes_per_token for p in sizing.pools), default=0) * 2
        held = "holds" if got <= ram.budget_per_rank + slack else "does NOT hold"
        out.append(f"  budget          --hicache-size {ram.budget_per_rank / 1e9:g} GB (= {gib(ram.budget_per_rank)}) per rank {held} every pool{split}")
    fits = "fits" if ram.fits else "does NOT fit"
    if ram.startup_error:
        fits = f"{fits} (so far; startup stops first)"
    out.append(f"  available       {gib(ram.available)} ({ram.available_from}) less sglang's {gib(ram.reserve)} reserve: {fits}")
    for mode, b in (sizing.backups or {}).items():
        if b.startup_error:
            out.append(f"  --hicache-draft-backup {mode:<10} stops at startup: {b.startup_error}")
            continue
        held = f", target {b.target_logical_slots:,} tokens" if b.target_logical_slots else ""
        out.append(f"  --hicache-draft-backup {mode:<10} {gib(b.per_rank)} per rank, {gib(b.per_node)} per node{held}")
    return out


# ---------------------------------------------------------------- the sweep


def render_sweep(result) -> str:
    """The text form of a :class:`result.Sweep`: one row per value, why each that does not pass, the setups."""
    out = [f"preflight sweep of {result.flag} on sglang {result.release} ({len(result.rows)} launches, sglang imported once)", ""]
    out.append(f"  {result.flag:<14} {'target tokens in host':>22} {'draft pinned/node':>18} {'pinned/node':>14}  verdict")
    for row in result.rows:
        sizing = row.sizing
        pools = sizing.pools if sizing is not None else ()
        target = sizing.target if pools else None
        draft = sum(p.per_node_bytes for p in pools if p.role == "draft")
        ram = sizing.host_ram if sizing is not None else None
        verdict = row.report.verdict
        tokens = f"{target.logical_slots:,}" if target else "-"
        out.append(f"  {row.value:<14} {tokens:>22} {gib(draft) if pools else '-':>18} {gib(ram.needed_per_node) if ram is not None else '-':>14}  "
                   f"{verdict.outcome} (exit {verdict.code})")
    # Every row that does not pass says why, in its verdict's own words.
    why = [(row.value, row.report.verdict) for row in result.rows if row.report.verdict.code]
    if why:
        out += ["", "  why:"]
        out += [f"  {value:<14} {verdict.line.removeprefix('verdict: ')}" for value, verdict in why]
        out += ["", "  (preflight without --sweep, on one value, prints the reasons in full)"]
    if any(r.variants for r in result.rows):
        out += ["", f"  pinned host memory per node, GiB, by setup ({', '.join(SETUPS)}; see docs/preflight.md):"]
        for row in result.rows:
            cells = [f"{name} {f'{v.per_node / 2**30:,.2f}' if v.per_node is not None else '-'}"
                     for name, v in row.variants.items()]
            out.append(f"  {row.value:<14} " + ("; ".join(cells) or f"- ({row.report.verdict.outcome}, see why)"))
    if result.plot:
        out += ["", f"  chart: {result.plot}"]
    return "\n".join(fit(out))


def chart_data(result) -> dict:
    """The figures a chart is drawn from, as a plain object (embedded in the PNG, compared by the docs' test)."""
    series = {name: [] for name in SETUPS}
    for row in result.rows:
        for name in SETUPS:
            v = row.variants.get(name)
            series[name].append(None if v is None or v.per_node is None else round(v.per_node / 2**30, 2))
    ram = next((r.sizing.host_ram for r in result.rows if r.sizing is not None), None)
    return {"release": result.release, "flag": result.flag, "values": [r.value for r in result.rows],
            "pinned_gib_per_node": series,
            "from": {name: next((r.variants[name].source for r in result.rows if r.variants.get(name)), None)
                     for name in SETUPS},
            "labels": {name: label_of(name, result) for name in SETUPS},
            # The values whose launch does not pass as run (their points are drawn as failures), and the node's RAM.
            "failing": [r.value for r in result.rows if r.report.verdict.code not in (0, 6)],
            "node_ram_gib": None if ram is None else round((ram.available - ram.reserve) / 2**30, 2)}


def label_of(name: str, result) -> str:
    """A chart line's label: what the setup is, on this release."""
    if name == "stock":
        rejected = [r.value for r in result.rows if isinstance(r.report, Report) and not r.report.stock.passed]
        where = f" (rejects {result.flag} {', '.join(rejected)})" if rejected else ""
        return f"stock sglang {result.release}{where}"
    return {"0.5.18+": "with the fix, --hicache-size for the target alone (0.5.18 on)",
            "budgeted": "with the fix, the draft in --hicache-size (as run)",
            "sharded": "with the sharded draft backup (upstream-next)"}[name]


# The formats --plot writes, by the file name's suffix (matplotlib's own writers).
CHART_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}


def chart_format(path: str) -> str:
    """The format a chart named ``path`` is written in; a name that says another format is refused."""
    from pathlib import Path

    from ..core.errors import DcpDsparkError

    suffix = Path(path).suffix.lower()
    if suffix not in CHART_FORMATS:
        raise DcpDsparkError(f"--plot {path} names a {suffix or 'suffix-less'} file; expected a name ending in {', '.join(CHART_FORMATS)} "
                             f"(the format is the name's); fix: --plot {Path(path).with_suffix('.png').name}")
    return CHART_FORMATS[suffix]


def plot(result, path: str) -> str:
    """A chart of pinned host GiB per node against the swept value, one line per setup; returns its path.

    The y axis starts at zero, so a rise reads at its true size. Setups often
    coincide (no --hicache-size: the budget changes nothing); a line equal to
    one drawn before it is drawn thinner on top, with a marker of its own, and
    its legend entry says it lies on another, so that no line hides another. Each line
    is labelled by what it is; a launch that does not pass as run is a red cross on the as-run line, and the node's
    RAM less sglang's reserve is a dashed line.
    """
    from ..core.errors import DcpDsparkError

    fmt = chart_format(path)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise DcpDsparkError(f"--plot {path} needs matplotlib, which is not installed; expected the plot extra; fix: pip install 'sglang-dcp-dspark[plot]' (or drop --plot for the table alone)") from None
    data = chart_data(result)
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    x = [float(v) for v in data["values"]]
    styles = {"stock": ("o", "-"), "0.5.18+": ("s", "--"), "budgeted": ("^", "-."), "sharded": ("D", ":")}
    drawn: list[tuple[str, list]] = []
    for name, ys in data["pinned_gib_per_node"].items():
        if all(y is None for y in ys):
            continue
        label = data["labels"][name] + ("" if (data["from"].get(name) or "").startswith("sglang") else " (model)")
        same = next((other for other, seen in drawn if seen == ys), None)
        if same is not None:
            label += " (on the line it equals)"
        marker, line = styles.get(name, ("o", "-"))
        width, size = (1.2, 5) if same is not None else (2.4, 8)
        ax.plot(x, [float("nan") if y is None else y for y in ys], marker=marker, linestyle=line, label=label,
                linewidth=width, markersize=size, zorder=3 + len(drawn))
        drawn.append((name, ys))
    # The launches that do not pass as run: their point on the as-run line is a red cross.
    as_run = data["pinned_gib_per_node"]["budgeted"]
    failing = [(xv, y) for xv, v, y in zip(x, data["values"], as_run, strict=True) if v in data["failing"] and y is not None]
    if failing:
        ax.scatter([f[0] for f in failing], [f[1] for f in failing], marker="x", s=120, color="red", zorder=20,
                   label="does not pass as run (see the verdicts)")
    if data["node_ram_gib"] is not None:
        ax.axhline(data["node_ram_gib"], color="grey", linestyle="--", linewidth=1.2,
                   label=f"the node's RAM less sglang's reserve ({data['node_ram_gib']:,.0f} GiB)")
    ax.set_ylim(bottom=0)
    ax.set_xlabel(result.flag)
    ax.set_ylabel("pinned host GiB per node")
    ax.set_xticks(x)
    ax.set_title(f"HiCache host pools per node, sglang {data['release']}")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    # The figures ride in the PNG's text chunk (the docs' freshness test reads them); other formats carry none.
    metadata = {"Software": None, PNG_DATA_KEY: json.dumps(data, sort_keys=True)} if fmt == "png" else None
    try:
        fig.savefig(path, format=fmt, metadata=metadata)
    except OSError as exc:
        raise DcpDsparkError(f"cannot write the chart to {path}: {exc.strerror}; expected a writable file path; fix: pass --plot a path in a writable directory") from None
    finally:
        plt.close(fig)
    return path


def read_chart_data(path: str) -> dict | None:
    """The figures embedded in a chart this module wrote (None if it carries none)."""
    from PIL import Image

    with Image.open(path) as image:
        text = image.text.get(PNG_DATA_KEY) if hasattr(image, "text") else None
    return None if text is None else json.loads(text)
