"""plugin.dcp_verify: one rank's split plan for a verify under DCP, read back as positions.

The numbers against a one-rank reference are test/numerics/test_verify_dcp.py
(flashinfer's planner and sglang's merge and index builder on the 0.5.22 and
0.5.23 trees). Here the plan itself, on the CPU: over all ranks, draft token
``j`` of a request with ``H`` committed tokens must see each of the positions
``0 .. H + j`` exactly once between its request's prefix row and its own
window row, and nothing past it; a side a rank holds none of gets one slot,
flagged, whose partial the merge weighs at zero. And the plan is O(rows): the
host makes the same number of elements whatever the context.
"""

from __future__ import annotations

import random

import pytest
import torch

from sglang_dcp_dspark.plugin import dcp_verify


def _sides(plan, prefixes) -> list[tuple[list[int], list[int]]]:
    """Per draft token, the positions its prefix row and its window row gather on this rank: what sglang's DCP
    index builder reads for a row of ``keys`` ids from ``start`` (the rank's first position at or after it, then
    every ``dcp``-th)."""
    n, r = plan.dcp_size, plan.dcp_rank

    def gathered(start: int, keys: int) -> list[int]:
        first = start + (r - start) % n
        return [first + n * k for k in range(keys)]

    out = []
    for req, h in enumerate(prefixes):
        prefix = gathered(0, int(plan.prefix_keys[req]))
        for j in range(int(plan.q_lens[req])):
            t = int(plan.prefix_qo_indptr[req]) + j
            assert int(plan.window_start[t]) == h
            out.append((prefix, gathered(h, int(plan.window_keys[t]))))
    return out


def _seen(prefixes, q_lens, dcp: int, *, plan=dcp_verify.plan_split) -> list[list[int]]:
    """For each draft token, the positions the ranks' plans read for it, over all ranks."""
    seen: list[list[int]] = [[] for _ in range(sum(q_lens))]
    for rank in range(dcp):
        p = plan(torch.tensor(prefixes), torch.tensor(q_lens), dcp_size=dcp, dcp_rank=rank)
        for t, (prefix, window) in enumerate(_sides(p, prefixes)):
            for position in prefix + window:
                assert position % dcp == rank  # the owner rule: position p lives on rank p % dcp
            seen[t] += prefix + window
    return seen


def _want(prefixes, q_lens) -> list[list[int]]:
    return [list(range(h + j + 1)) for h, q in zip(prefixes, q_lens, strict=True) for j in range(q)]


@pytest.mark.parametrize("dcp", [1, 2, 4, 8])
def test_each_draft_token_sees_its_prefix_and_window_once_over_the_ranks(dcp):
    rng = random.Random(dcp)
    q_lens = [rng.randint(1, 7) for _ in range(6)]
    prefixes = [rng.randint(0, 40) for _ in q_lens]
    assert [sorted(s) for s in _seen(prefixes, q_lens, dcp)] == _want(prefixes, q_lens)


def test_the_prefix_is_one_row_per_request_and_the_window_one_per_token():
    plan = dcp_verify.plan_split(torch.tensor([37, 5, 130]), torch.tensor([7, 7, 7]), dcp_size=8, dcp_rank=3)
    assert plan.prefix_qo_indptr.tolist() == [0, 7, 14, 21]
    assert plan.prefix_keys.tolist() == [5, 1, 16]  # positions 3, 11, ... below each prefix
    assert plan.tokens == 21 and plan.window_qo_indptr.tolist() == list(range(22))
    # A window row holds at most ceil(7 / 8) = 1 key: each draft token's keys are on the ranks its positions are.
    assert int(plan.window_kv_len.max()) <= dcp_verify.window_capacity(7, 8) == 1


def test_a_side_the_rank_holds_no_key_of_gets_a_flagged_filler_slot():
    # Prefix 2 at dcp 4: ranks 2 and 3 hold no prefix key; the window (positions 2, 3) is on ranks 2 and 3.
    plan = dcp_verify.plan_split(torch.tensor([2]), torch.tensor([2]), dcp_size=4, dcp_rank=3)
    assert plan.prefix_keys.tolist() == [0] and plan.prefix_kv_len.tolist() == [1]
    assert plan.prefix_empty.tolist() == [True, True]
    assert plan.window_keys.tolist() == [0, 1] and plan.window_kv_len.tolist() == [1, 1]
    assert plan.window_empty.tolist() == [True, False]
    plan = dcp_verify.plan_split(torch.tensor([2]), torch.tensor([2]), dcp_size=4, dcp_rank=1)
    assert plan.prefix_empty.tolist() == [False, False] and plan.window_empty.tolist() == [True, True]


def test_a_bottom_right_bound_on_the_prefix_row_fails_the_same_check():
    """Control: the prefix row bounded by flashinfer's bottom-right causal mask over the rank's own keys (query j
    sees the first ``keys - q + 1 + j`` of them) drops keys that every draft token should see."""

    prefixes, q_lens, q = [20, 13], [3, 3], 3
    seen = [[] for _ in range(6)]
    for rank in range(4):
        plan = dcp_verify.plan_split(torch.tensor(prefixes), torch.tensor(q_lens), dcp_size=4, dcp_rank=rank)
        for t, (prefix, window) in enumerate(_sides(plan, prefixes)):
            seen[t] += prefix[: max(0, len(prefix) - (q - 1 - t % q))] + window
    assert [sorted(s) for s in seen] != _want(prefixes, q_lens)


def test_a_window_bound_one_past_its_own_position_fails_the_same_check(monkeypatch):
    """Control (the numerics harness's ``window-off-by-one``): a draft token that sees its successor's KV."""
    real = dcp_verify.window_keys
    monkeypatch.setattr(dcp_verify, "window_keys", lambda h, j, n, r: real(h, j + 1, n, r))
    prefixes, q_lens = [9, 4], [4, 2]
    assert [sorted(s) for s in _seen(prefixes, q_lens, 2)] != _want(prefixes, q_lens)


def test_the_device_pack_unpacks_to_the_plans_numbers():
    plan = dcp_verify.plan_split(torch.tensor([9, 0, 33]), torch.tensor([3, 3, 3]), dcp_size=4, dcp_rank=2)
    pack = plan.device_pack()
    assert pack.dtype == torch.int32 and pack.numel() == dcp_verify.pack_size(plan.bs, plan.tokens)
    meta = dcp_verify.unpack(pack, plan.bs, plan.tokens)
    assert meta.q_lens.tolist() == plan.q_lens.tolist()
    assert meta.prefix_keys.tolist() == plan.prefix_keys.tolist()
    assert meta.prefix_kv_indptr.tolist() == plan.prefix_kv_indptr.tolist()
    assert meta.window_start.tolist() == plan.window_start.tolist()
    assert meta.window_keys.tolist() == plan.window_keys.tolist()
    assert meta.window_kv_indptr.tolist() == plan.window_kv_indptr.tolist()
    assert (meta.prefix_empty != 0).tolist() == plan.prefix_empty.tolist()
    assert (meta.window_empty != 0).tolist() == plan.window_empty.tolist()


@pytest.mark.parametrize("bs", [1, 64])
def test_the_host_plan_does_not_grow_with_the_context(bs):
    """What the host builds and copies is O(rows): the same at 4K and at 128K tokens of context."""
    sizes = set()
    for context in (4096, 131072):
        plan = dcp_verify.plan_split(torch.full((bs,), context), torch.full((bs,), 7), dcp_size=8, dcp_rank=5)
        sizes.add((plan.host_elements, plan.device_pack().numel()))
        assert plan.prefix_ids >= bs * context // 8  # the ids themselves are the device's to build
    assert len(sizes) == 1, sizes
    (elements, packed), = sizes
    assert elements <= 5 * bs + 5 * (7 * bs) + 5 and packed == dcp_verify.pack_size(bs, 7 * bs)


def test_a_request_without_a_draft_token_is_refused():
    with pytest.raises(ValueError, match="no draft token"):
        dcp_verify.plan_split(torch.tensor([3]), torch.tensor([0]), dcp_size=2, dcp_rank=0)
