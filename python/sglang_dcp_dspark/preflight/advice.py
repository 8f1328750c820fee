"""The smallest change that makes a launch pass, judged by preflight itself on the same node and release.

The candidates come from the launch's facts, in the order of what each takes
away: the changes the refusal itself names (the option it names, dropped or
corrected), an attention backend the pass map shows running the launch, the
plugin switched on (the launch's own flags kept, one more component in the
process), a chain (``--speculative-eagle-topk 1``) for a draft tree, HiCache
off, ``--dcp-size 1``, and last no speculative decoding. A RAM stop
tries first a ``--hicache-size`` the node holds. The first that passes
(exit 0) is advised; where none does, the first that starts unchecked
(exit 6); where none of those, nothing, and the verdict says what was tried.
"""

from __future__ import annotations

from ..core.errors import DcpDsparkError
from .verdict import PASSES, STOPS, UNCHECKED, Advice, Change

# The attention-backend options a launch names; an advised backend replaces them all.
BACKEND_OPTIONS = ("--attention-backend", "--decode-attention-backend", "--prefill-attention-backend")
HICACHE_FLAG = "--enable-hierarchical-cache"


def apply(argv: list[str], change: Change) -> tuple[list[str], list[str]]:
    """``argv`` changed: what ``change`` drops taken out (each option with its value), what it sets put at the
    end; and the launch's own tokens it took out."""
    drop = set(change.drop) | set(change.add[::2])
    out, removed, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        name = arg.split("=", 1)[0]
        valued = name in drop or (change.drop_prefix and name.startswith(change.drop_prefix))
        if valued and "=" not in arg and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            removed += argv[i: i + 2]
            i += 2
            continue
        if valued or arg in change.drop_flags:
            removed.append(arg)
            i += 1
            continue
        out.append(arg)
        i += 1
    return [*out, *change.add], removed


def candidates(facts, runs, *, code: int, working: tuple[str, ...], plugin_installed: bool) -> list[Change]:
    """The changes to try, in order (the module's docstring says which and why)."""
    out: list[Change] = []
    ram = facts.ram
    if code == STOPS and ram is not None and any(s.kind == "ram" for s in ram.stops) and ram.ranks_per_node:
        per_rank_gb = int((ram.available - ram.reserve) / ram.ranks_per_node / 1e9 * 0.9)
        if per_rank_gb >= 1:
            out.append(Change(f"--hicache-size {per_rank_gb}", add=("--hicache-size", str(per_rank_gb))))
    if facts.refused is not None:
        out += facts.refused.fixes
    if code == UNCHECKED:
        # It runs; only a backend the map checked is worth naming beside it.
        return out + _backends(runs, working)
    out += _backends(runs, working)
    if not facts.plugin_on and plugin_installed:
        out.append(Change("the dcp_dspark plugin on", plugin_on=True))
    if runs.dcp > 1 and runs.algorithm and runs.eagle_topk > 1:
        # A draft tree under DCP: the split verify plans a chain, so a chain keeps DCP (sglang sets a chain's
        # draft tokens to its steps + 1 itself; the changed launch is judged as sglang resolves it).
        out.append(Change("--speculative-eagle-topk 1", add=("--speculative-eagle-topk", "1")))
    if runs.hicache:
        out.append(Change(f"drop {HICACHE_FLAG}", drop_flags=(HICACHE_FLAG,)))
    if runs.dcp > 1:
        out.append(Change("--dcp-size 1", add=("--dcp-size", "1"), drop=("--decode-context-parallel-size",)))
    if runs.algorithm:
        out.append(Change("drop speculative decoding (every --speculative- option)", drop_prefix="--speculative-"))
    return list(dict.fromkeys(out))


def _backends(runs, working: tuple[str, ...]) -> list[Change]:
    if runs.dcp <= 1:
        return []
    return [Change(f"--attention-backend {b}", add=("--attention-backend", b), drop=BACKEND_OPTIONS)
            for b in working if b != runs.decode]


def search(judge, release, argv: list[str], node, device_rows, configs, changes: list[Change], *,
           plugin_on: bool, code: int) -> tuple[Advice | None, tuple[str, ...]]:
    """Judge each change in order (``judge``: :func:`check.judge`); the first that passes, else (for a launch
    that does not start as it is, ``code``) the first that starts unchecked; and the changes tried."""
    from ..plugin import switch

    fallback, tried = None, []
    for change in changes:
        changed, removed = apply(argv, change)
        on = True if change.plugin_on else plugin_on
        tried.append(change.words)
        try:
            report = judge(release, changed, node, device_rows, configs, advise=False, plugin_on=on)
        except DcpDsparkError:
            continue
        got = Advice(change, tuple(removed), report.verdict.code, report.verdict.line, report.verdict.reason,
                     (switch.TURN_ON,) if change.plugin_on else (), report.verdict.evidence)
        if got.code == PASSES:
            return got, tuple(tried)
        if got.code == UNCHECKED and fallback is None and code != UNCHECKED:
            fallback = got
    return fallback, tuple(tried)
