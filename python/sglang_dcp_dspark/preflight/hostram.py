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

from dataclasses import dataclass

from ..core import rules

GIB = 1024**3


@dataclass(frozen=True)
class Stop:
    """One reason startup stops in the host pools: ``pool-build`` (sglang or a hook refused while building them),
    ``coverage`` (the draft host pool short of the logical slots), ``ram`` (the node cannot hold them). Its words
    are :mod:`verdict`'s."""

    kind: str
    error: str | None = None
    coverage: float | None = None
    needed: int = 0
    left: int = 0


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
    stops: tuple[Stop, ...] = ()
    host_rows: int | None = None  # the target host pool's physical rows, and the device pool's, per rank
    device_rows: int | None = None

    @property
    def fits(self) -> bool:
        return self.needed_per_node <= self.available - self.reserve

    def as_dict(self) -> dict:
        """The ``--json`` form (the stops are the sizing's ``startup_stops``, in the verdict's words)."""
        return {"needed_per_rank": self.needed_per_rank, "needed_per_node": self.needed_per_node,
                "budget_per_rank": self.budget_per_rank, "available": self.available,
                "available_from": self.available_from, "reserve": self.reserve, "fits": self.fits,
                "startup_error": self.startup_error}


def judge(built, *, ranks_per_node: int, available: int, available_from: str, reserve: int,
          hicache_size_gb: float, device_rows: int | None = None) -> HostRam:
    per_rank = built.bytes
    target, draft = built.target, built.draft
    coverage = None
    if target is not None and draft is not None and built.draft_plan != "PACKED":
        coverage = rules.coverage(draft.logical_slots, target.logical_slots)
    needed = rules.per_node(per_rank, ranks_per_node)
    short = coverage is not None and not rules.covers(draft.logical_slots, target.logical_slots)
    stops = tuple(stop for stop in (
        Stop("pool-build", error=built.startup_error) if built.startup_error else None,
        Stop("coverage", coverage=coverage) if short else None,
        Stop("ram", needed=needed, left=available - reserve) if per_rank and needed > available - reserve else None,
    ) if stop is not None)
    return HostRam(
        needed_per_rank=per_rank, needed_per_node=needed, ranks_per_node=ranks_per_node,
        available=available, available_from=available_from, reserve=reserve,
        budget_per_rank=int(hicache_size_gb * rules.GB) if hicache_size_gb else None, coverage=coverage,
        startup_error=built.startup_error, stops=stops,
        host_rows=target.rows if target is not None else None, device_rows=device_rows,
    )


def gib(n: int) -> str:
    return f"{n / GIB:,.2f} GiB"


def stop_sentence(stop, *, estimated: bool) -> str:
    """One stop at startup (a :class:`hostram.Stop`), in words."""
    caveat = "; device rows are an upper-bound estimate, pass --device-rows for a firm verdict" if estimated else ""
    if stop.kind == "pool-build":
        return f"startup stops while the host pools are built: {stop.error}{caveat}"
    if stop.kind == "coverage":
        return (f"the draft host pool covers {stop.coverage:.3f} of the target's logical slots (the capacity guard stops "
                "startup; without it L1 eviction writes past the draft buffer)")
    if stop.kind == "ram":
        return (f"host pools need {gib(stop.needed)} per node, more than the {gib(stop.left)} left after sglang's "
                f"reserve (sglang's host-memory check refuses them){caveat}")
    raise ValueError(f"unknown stop {stop.kind!r}")
