"""The data-path scenarios: round trip, eviction stress and the negative controls' sabotage.

Each scenario builds a :class:`harness.HiCacheRun` for one case, drives it the
way a scheduler does, and raises AssertionError on the first byte that comes
back wrong (or :class:`harness.DraftHostOverflow` when the draft host pool is
addressed past its end). They return the run's counts, so a caller can also
assert that the run did what it claims (every request loaded back, the host
pool wrapped).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from .harness import Case, Counts, HiCacheRun, overflow_as_assertion
from .substitutions import ReferenceOps

MIN_LOAD_TOKENS = 16  # sglang skips a load-back under 10 tokens (HiRadixCache.load_back_threshold)


def _pages_range(case: Case) -> tuple[int, int]:
    low = max(1, -(-MIN_LOAD_TOKENS // case.logical_page))
    return low, min(low + 3, case.device_pages)


def round_trip(case: Case, *, register: Callable | None = None, ops: ReferenceOps | None = None,
               seed: int = 0, **run_kwargs) -> Counts:
    """Fill the host pool by write-through, evict every device page, scrub, load every request back, compare."""
    rng = random.Random(seed)
    with overflow_as_assertion(), HiCacheRun(case, register=register, ops=ops, seed=seed, **run_kwargs) as run:
        low, high = _pages_range(case)
        free_pages = run.host_logical_slots // case.logical_page
        requests: list[list[int]] = []
        while free_pages >= low:
            pages = min(rng.randint(low, high), free_pages)
            free_pages -= pages
            # A distinct first token per request: no shared prefix, so each request owns its host slots.
            tokens = [len(requests) + 1] + [rng.randrange(1, 50_000) for _ in range(pages * case.logical_page - 1)]
            requests.append(tokens)
            run.write(tokens)
        run.evict_device()
        run.scrub_device()
        for tokens in requests:
            locs = run.load_back(tokens).device_indices
            if len(locs) != len(tokens):
                raise AssertionError(f"{case.label()}: {len(locs)} of {len(tokens)} tokens came back from host")
            run.check_device(tokens, locs)
            if case.forward_read:
                run.check_reads(tokens, locs)
            run.evict_device()  # room for the next request; its host copy stays
        if run.counts.host_evictions:
            raise AssertionError(f"{case.label()}: the host pool evicted while it was being filled")
        return run.counts


def stress_requests(case: Case, n: int, rng: random.Random) -> list[list[int]]:
    """``n`` requests over a few shared roots, with nested shared prefixes and varied lengths."""
    low, high = _pages_range(case)
    page = case.logical_page
    root_pages = -(-12 // page)  # long enough that a root alone is worth loading back
    roots = [[rng.randrange(1, 50_000) for _ in range(rng.randint(root_pages, root_pages + 1) * page)] for _ in range(6)]
    requests: list[list[int]] = []
    for _ in range(n):
        if requests and rng.random() < 0.3:
            base = rng.choice(requests)  # extend or branch off an earlier request
            keep = rng.randint(1, len(base) // page) * page
            base = base[:keep]
        else:
            base = list(rng.choice(roots))
        total = max(rng.randint(low, high) * page, len(base) + page)
        total = min(total, case.device_pages * page)
        base = base[: total - page]
        requests.append(base + [rng.randrange(1, 50_000) for _ in range(total - len(base))])
    return requests


def eviction_stress(case: Case, *, requests: int = 64, min_cycles: int = 2, max_cycles: int = 8,
                    register: Callable | None = None, ops: ReferenceOps | None = None, seed: int = 0,
                    **run_kwargs) -> Counts:
    """Repeated serve/evict/load cycles over shared-prefix requests until the host pool itself evicts.

    Every request first loads its cached prefix back from host (when L1 lost
    it) and checks it byte for byte before computing the rest.
    """
    rng = random.Random(seed)
    with overflow_as_assertion(), HiCacheRun(case, register=register, ops=ops, seed=seed, **run_kwargs) as run:
        batch = stress_requests(case, requests, rng)
        cycle = 0
        while cycle < min_cycles or (run.counts.host_evictions == 0 and cycle < max_cycles):
            order = list(range(len(batch)))
            rng.shuffle(order)
            for i, r in enumerate(order):
                run.write(batch[r])
                if i % 5 == 4:
                    run.evict_device()  # L1 pressure: what is on host must come back from there
            cycle += 1
        if run.counts.host_evictions == 0:
            raise AssertionError(f"{case.label()}: {cycle} cycles and the host pool never wrapped")
        if run.counts.load_backs == 0:
            raise AssertionError(f"{case.label()}: nothing was loaded back from host")
        return run.counts


def corrupting(pool: str) -> Callable:
    """Sabotage for ReferenceOps.sabotage: every copy into ``pool`` lands with its first element's bits flipped."""

    def corrupt(values):
        values = values.clone()
        flat = values.view(-1).view(dtype=_int_like(values))
        flat[0] = ~flat[0]
        return values

    return corrupt


def _int_like(t):
    import torch

    return {2: torch.int16, 4: torch.int32, 1: torch.int8, 8: torch.int64}[t.element_size()]


# Where a tree's draft registration looks the MLA host pool class up: the module itself
# (0.5.17, the legacy path) and the hybrid assembler, which imports the name (the sidecar path).
MLA_HOST_CLASS_SITES = (
    "sglang.srt.mem_cache.pool_host.mla",
    "sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler",
)


def halve_draft_host_pool(monkeypatch) -> None:
    """Deliberately wrong sizing on every draft path: each draft MLA host pool gets half the rows it asks for.

    The ratio is halved, and on 0.5.23 (which also passes the row count as
    ``host_token_capacity``) so is that count, rounded down to a whole page.
    """
    import importlib

    from sglang.srt.mem_cache.pool_host import mla

    base = mla.MLATokenToKVPoolHost

    class HalfDraft(base):
        def __init__(self, first, host_to_device_ratio, *args, **kwargs):
            if kwargs.get("pool_label") == "draft":
                host_to_device_ratio /= 2
                if kwargs.get("host_token_capacity") is not None:
                    half, page = kwargs["host_token_capacity"] // 2, kwargs.get("page_size") or 1
                    kwargs["host_token_capacity"] = half - half % page
            super().__init__(first, host_to_device_ratio, *args, **kwargs)

    for name in MLA_HOST_CLASS_SITES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # 0.5.17 has no hybrid assembler
            continue
        if getattr(module, "MLATokenToKVPoolHost", None) is base:
            monkeypatch.setattr(module, "MLATokenToKVPoolHost", HalfDraft)
