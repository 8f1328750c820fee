"""The host-RAM model of a judged launch: what its pools pin per rank and per node, and whether the node holds them.

Pure arithmetic over the pools a release adapter built (:class:`releases.Built`)
and the node preflight emulates; the sizes themselves are sglang's. The
verdict's reasons for a stop at startup are decided here, in one place:

- sglang (or a plugin hook) refused while building the pools;
- the draft host pool covers fewer slots than the target's logical slot space
  (the capacity guard stops it; without the guard L1 eviction writes past it);
- the node's RAM, less sglang's reserve, cannot hold every rank's pools.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core import rules

GIB = 1024**3


@dataclass(frozen=True)
class HostRam:
    needed_per_rank: int
    needed_per_node: int
    ranks_per_node: int
    available: int
    available_from: str
    reserve: int
    budget_per_rank: int | None  # --hicache-size, when given
    coverage: float | None  # draft rows / target logical slots
    startup_error: str | None
    stops: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.needed_per_node <= self.available - self.reserve


def judge(built, *, ranks_per_node: int, available: int, available_from: str, reserve: int,
          hicache_size_gb: float, estimated_rows: bool) -> HostRam:
    per_rank = built.bytes
    target, draft = built.target, built.draft
    coverage = None
    if target is not None and draft is not None and built.draft_plan != "PACKED":
        coverage = rules.coverage(draft.logical_slots, target.logical_slots)
    ram = HostRam(
        needed_per_rank=per_rank, needed_per_node=rules.per_node(per_rank, ranks_per_node), ranks_per_node=ranks_per_node,
        available=available, available_from=available_from, reserve=reserve,
        budget_per_rank=int(hicache_size_gb * rules.GB) if hicache_size_gb else None, coverage=coverage,
        startup_error=built.startup_error,
    )
    # Both RAM figures scale with the device rows; an estimate overstates them.
    caveat = "; device rows are an upper-bound estimate, pass --device-rows for a firm verdict" if estimated_rows else ""
    if built.startup_error:
        ram.stops.append(f"startup stops while the host pools are built: {built.startup_error}{caveat}")
    if coverage is not None and not rules.covers(draft.logical_slots, target.logical_slots):
        ram.stops.append(f"the draft host pool covers {coverage:.3f} of the target's logical slots "
                         "(the capacity guard stops startup; without it L1 eviction writes past the draft buffer)")
    if per_rank and not ram.fits:
        ram.stops.append(f"host pools need {gib(ram.needed_per_node)} per node, more than the "
                         f"{gib(available - reserve)} left after sglang's reserve (sglang's host-memory check refuses them){caveat}")
    return ram


def gib(n: int) -> str:
    return f"{n / GIB:,.2f} GiB"
