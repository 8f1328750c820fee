"""plugin.dcp_verify: one rank's plan for a verify under DCP, one row per draft token, read back as positions.

The numbers against a one-rank reference are test/numerics/test_verify_dcp.py
(flashinfer's planner and sglang's merge on the patched and plugin trees).
Here the plan itself, on the CPU: over all ranks, draft token ``j`` of a
request with ``H`` committed tokens must see each of the positions
``0 .. H + j`` exactly once, and nothing past it; a rank that holds none of
them gets one slot, marked empty, whose partial the merge weighs at zero.
"""

from __future__ import annotations

import random

import pytest
import torch

from sglang_dcp_dspark.plugin import dcp_verify


def _csr(lengths):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


def _seen(q_lens, kv_lens, dcp: int, *, plan=dcp_verify.verify_rows) -> list[list[int]]:
    """For each draft token, the positions (within its request) the ranks' plans read, over all ranks."""
    qo, kv = _csr(q_lens), _csr(kv_lens)
    rows = sum(q_lens)
    seen: list[list[int]] = [[] for _ in range(rows)]
    for rank in range(dcp):
        plan_rows = plan(qo, kv, dcp_size=dcp, dcp_rank=rank)
        assert plan_rows.rows == rows and plan_rows.qo_indptr.tolist() == list(range(rows + 1))
        start = plan_rows.kv_indptr.tolist()
        request = [r for r, q in enumerate(q_lens) for _ in range(q)]
        for row in range(rows):
            ids = plan_rows.gather[start[row]:start[row + 1]].tolist()
            if plan_rows.empty[row]:
                assert ids == [-1]  # one slot, never read
                continue
            assert -1 not in ids
            for virtual in ids:
                position = virtual - int(kv[request[row]])
                assert position % dcp == rank  # the owner rule: position p lives on rank p % dcp
                seen[row].append(position)
    return seen


def _want(q_lens, kv_lens) -> list[list[int]]:
    return [list(range(kv - q + j + 1)) for q, kv in zip(q_lens, kv_lens, strict=True) for j in range(q)]


@pytest.mark.parametrize("dcp", [1, 2, 4, 8])
def test_each_draft_token_sees_its_prefix_once_over_the_ranks(dcp):
    rng = random.Random(dcp)
    q_lens = [rng.randint(1, 5) for _ in range(6)]
    kv_lens = [q + rng.randint(0, 40) for q in q_lens]
    assert [sorted(s) for s in _seen(q_lens, kv_lens, dcp)] == _want(q_lens, kv_lens)


def test_a_rank_holding_none_of_a_tokens_keys_gets_an_empty_row():
    # no committed prefix: the first draft token sees position 0 only, which rank 0 holds
    rows = dcp_verify.verify_rows(_csr([2]), _csr([2]), dcp_size=4, dcp_rank=3)
    assert rows.empty.tolist() == [True, True] and rows.kv_len.tolist() == [1, 1]
    rows = dcp_verify.verify_rows(_csr([2]), _csr([2]), dcp_size=4, dcp_rank=1)
    assert rows.empty.tolist() == [True, False]


def test_a_bottom_right_causal_bound_on_rank_local_lengths_fails_the_same_check():
    """Control: the plan stock sglang's shape would give (the rank's own key count, the causal bound counted from
    its end) drops or adds keys that the check above catches."""

    def rank_local_causal(qo_indptr, kv_indptr, *, dcp_size, dcp_rank):
        full = dcp_verify.verify_rows(qo_indptr, kv_indptr, dcp_size=dcp_size, dcp_rank=dcp_rank)
        q_len = (qo_indptr[1:] - qo_indptr[:-1]).tolist()
        kv_len = (kv_indptr[1:] - kv_indptr[:-1]).tolist()
        # every token of a request gets the request's last row's keys less (q - 1 - j): counted from the end
        gather, lens = [], []
        for r, (q, n) in enumerate(zip(q_len, kv_len, strict=True)):
            owned = [int(kv_indptr[r]) + p for p in range(n) if p % dcp_size == dcp_rank]
            for j in range(q):
                keep = owned[: max(1, len(owned) - (q - 1 - j))]
                gather += keep
                lens.append(len(keep))
        return dcp_verify.VerifyRows(full.qo_indptr, _csr(lens), torch.tensor(lens, dtype=torch.int32),
                                     torch.tensor(gather), torch.zeros(len(lens), dtype=torch.bool))

    q_lens, kv_lens = [3, 4], [20, 13]
    # it reads only rows the rank holds (the owner rule holds), yet the prefixes come out wrong
    assert [sorted(s) for s in _seen(q_lens, kv_lens, 4, plan=rank_local_causal)] != _want(q_lens, kv_lens)


def test_more_draft_tokens_than_positions_is_refused():
    with pytest.raises(ValueError, match="more draft tokens than positions"):
        dcp_verify.verify_rows(_csr([3]), _csr([2]), dcp_size=2, dcp_rank=0)


def test_an_empty_row_gets_the_neutral_partial():
    out, lse = torch.ones(3, 4, 8), torch.zeros(3, 4)
    dcp_verify.neutralise(out, lse, torch.tensor([False, True, False]))
    assert out[1].abs().sum() == 0 and torch.isneginf(lse[1]).all()
    assert out[0].sum() == 32 and out[2].sum() == 32 and torch.isfinite(lse[[0, 2]]).all()
