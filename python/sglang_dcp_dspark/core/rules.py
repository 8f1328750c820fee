"""The arithmetic of DCP + HiCache + DSPARK host memory, in one place, with no sglang and no torch.

The plugin (:mod:`budget`), preflight, :mod:`sizing` and ``bench/host_memory.py``
all take their numbers from here, and the per-tree tests prove that series
patch 0004 and ``patches/upstream-next`` compute the same split on sglang's
own pools (``test/regression/test_rules_parity.py``,
``test/upstream_next/test_rules_parity.py``). Every input is a plain int read
off sglang's pools by the caller: rows, bytes per token, page size, dcp_size.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9  # --hicache-size is in decimal gigabytes (HostKVCache: host_size * 1e9)


# ------------------------------------------------------------ logical slots


def logical_slots(host_rows: int, dcp_size: int) -> int:
    """Slots the radix tree addresses in a dcp-striped host pool: every rank's rows, interleaved."""
    return int(host_rows) * max(1, int(dcp_size))


def coverage(draft_rows: int, target_logical_slots: int) -> float:
    """Draft host rows as a share of the target's logical slots; below 1, L1 eviction writes past the draft."""
    return int(draft_rows) / int(target_logical_slots)


def covers(draft_rows: int, target_logical_slots: int) -> bool:
    # The replicated draft is indexed by the logical slot itself, so it needs one row per slot.
    return int(draft_rows) >= int(target_logical_slots)


def host_pool_rows(rows: int, page_size: int) -> int:
    """The rows sglang's host pool ends up with for ``rows`` asked: up past the last whole page.

    It keeps one page more than the whole pages that fit (0.5.17 on:
    ``page_num = size // page_size + 1``); the budget split holds that page back.
    """
    return (int(rows) // int(page_size) + 1) * int(page_size)


# ------------------------------------------------------------ per node


def ranks_per_node(tp_size: int, pp_size: int = 1, nnodes: int = 1) -> int:
    """Ranks that share one node's RAM: the launcher spreads tp x pp evenly over nnodes."""
    return max(1, int(tp_size) * int(pp_size) // max(1, int(nnodes)))


def nodes_needed(tp_size: int, pp_size: int, gpus_per_node: int) -> int:
    """The fewest nodes that give every rank its own GPU."""
    return -(-int(tp_size) * int(pp_size) // max(1, int(gpus_per_node)))


def most_ranks_on_a_node(tp_size: int, pp_size: int, nnodes: int) -> int:
    """The busiest node's rank count when tp x pp does not divide evenly (validation only)."""
    return -(-int(tp_size) * int(pp_size) // max(1, int(nnodes)))


def per_node(bytes_per_rank: int, ranks: int) -> int:
    """Every rank pins its own host pools, target and replicated draft alike."""
    return int(bytes_per_rank) * int(ranks)


def rank_share_of_free_ram(available_bytes: int, reserve_bytes: int, ranks: int) -> int:
    """One rank's share of a node's free RAM after sglang's reserve.

    Co-located ranks all see the same free RAM, so each may count on only its
    share of it; sglang 0.5.17 checks each pool against the whole.
    """
    return max(0, int(available_bytes) - int(reserve_bytes)) // max(1, int(ranks))


def bytes_per_target_row(target_bytes_per_token: int, draft_bytes_per_token: int, dcp_size: int) -> int:
    """Host bytes one target row costs with its draft: each brings dcp_size logical slots, each a draft row."""
    return int(target_bytes_per_token) + max(1, int(dcp_size)) * int(draft_bytes_per_token)


def smallest_host_bytes(device_rows: int, target_bytes_per_token: int, draft_bytes_per_token: int, dcp_size: int) -> int:
    """Host pools that mirror the device pool once (a smaller L2 holds less than L1: sglang warns it is of little use)."""
    return int(device_rows) * bytes_per_target_row(target_bytes_per_token, draft_bytes_per_token, dcp_size)


# ------------------------------------------------------------ budget split


@dataclass(frozen=True)
class BudgetSplit:
    """One rank's ``--hicache-size`` shared between the target and the replicated draft.

    Every target row costs ``target_bytes_per_token`` and brings ``dcp_size``
    logical slots, each of which needs a draft row: so a budget of B bytes buys
    B / (t + dcp_size * d) target rows. Upstream's open PR #35875 divides by
    t + d, which under DCP pins up to dcp_size times the draft it budgeted.

    sglang rounds every host pool up past its last whole page
    (:func:`host_pool_rows`), so one target page and two draft pages (each
    dcp_size rows per physical row) are held back to keep what is pinned
    inside the budget. ``hold_back_rounding=False`` is ``patches/upstream-next``'s
    split, which holds nothing back and so pins up to one page per pool past it.
    """

    budget_bytes: int
    target_bytes_per_token: int
    draft_bytes_per_token: int
    dcp_size: int
    page_size: int = 0  # physical page of the target host pool
    hold_back_rounding: bool = True

    @property
    def rounding_bytes(self) -> int:
        if not self.hold_back_rounding:
            return 0
        return self.page_size * (self.target_bytes_per_token + 2 * self.dcp_size * self.draft_bytes_per_token)

    @property
    def bytes_per_target_row(self) -> int:
        return bytes_per_target_row(self.target_bytes_per_token, self.draft_bytes_per_token, self.dcp_size)

    @property
    def target_share(self) -> float:
        return self.target_bytes_per_token / self.bytes_per_target_row

    @property
    def target_rows(self) -> int:
        return max(0, self.budget_bytes - self.rounding_bytes) // self.bytes_per_target_row

    @property
    def draft_rows(self) -> int:
        return self.target_rows * self.dcp_size

    @property
    def target_budget_bytes(self) -> int:
        return self.target_rows * self.target_bytes_per_token

    @property
    def draft_budget_bytes(self) -> int:
        return self.draft_rows * self.draft_bytes_per_token

    @property
    def target_hicache_size_gb(self) -> float:
        """What ``--hicache-size`` becomes for the target alone (sglang sizes the target host pool from it)."""
        return self.target_budget_bytes / GB

    @property
    def share_without_dcp(self) -> float:
        """The target share PR #35875 would give: it misses the dcp factor."""
        return self.target_bytes_per_token / (self.target_bytes_per_token + self.draft_bytes_per_token)


# ------------------------------------------------------------ the sidecar budget (sglang 0.5.23, upstream-next 0001)


def device_bytes_per_token(kv_size_bytes: int, rows: int, page_size: int) -> float:
    """A device pool's bytes per token: its KV buffers carry one padding page past ``size``."""
    return kv_size_bytes / (rows + page_size)


def sidecar_target_hicache_size(hicache_size: float, target_bytes: float, draft_bytes: float, dcp_size: int) -> float:
    """The share of ``--hicache-size`` (GB) left for the target once full draft sidecars are paid.

    Each target host row brings dcp_size draft rows (one per logical slot), so
    the target gets t / (t + dcp_size * d). Evaluated as patches/upstream-next
    0001 evaluates it, operation for operation, so the plugin and the series
    give the same float and so the same rows.
    """
    return hicache_size * target_bytes / (target_bytes + dcp_size * draft_bytes)


# ------------------------------------------------------------ the sharded draft backup (upstream-next 0005-0006)


def sharded_backup_bytes_per_rank(*, target_rows: int, target_bytes_per_token: int, draft_bytes_per_token: int,
                                  page_size: int, extra_bytes: int = 0, hicache_size_gb: float = 0) -> int:
    """Host bytes one rank pins when it keeps only its DCP stripe of the replicated draft.

    One draft row per target row (this rank's stripe), so target and draft
    share a row count; with ``--hicache-size`` the budget splits t / (t + d)
    rather than t / (t + N d). ``extra_bytes``: the pools beside them (a DSA
    indexer), which the split does not touch.
    """
    t, d = int(target_bytes_per_token), int(draft_bytes_per_token)
    if hicache_size_gb:
        split = BudgetSplit(int(hicache_size_gb * GB), t, d, 1, int(page_size), hold_back_rounding=False)
        return split.target_rows * (t + d) + int(extra_bytes)
    return int(target_rows) * (t + d) + int(extra_bytes)
