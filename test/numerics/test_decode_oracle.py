"""The contract oracle of flashinfer's ``trtllm_batch_decode_with_kv_cache_mla`` (``emulation.mla.decode_oracle``):
its ranks merged against dense attention, its controls told apart from it, the empty-rank rule and its strictness."""

from __future__ import annotations

import math

import pytest
import torch

from emulation.mla.decode_oracle import DecodeContractError, DecodeMLAOracle, dense_reference, local_visible

LORA, ROPE, HEADS, PAGE = 16, 8, 2, 32
SCALE = 1.0 / math.sqrt(LORA + ROPE)


def _rank_call(oracle, keys, query, world: int, rank: int, *, pages: int = 4, **kw):
    """One request's keys packed as flashinfer's test packs them (rank r holds global positions g % world == r),
    into shuffled pages of a cache, and the oracle called as cutedsl_mla calls it."""
    g = keys.shape[0]
    local = keys[rank::world]
    cache = torch.randn(pages * 2, PAGE, LORA + ROPE)
    order = torch.randperm(pages * 2)[:pages]
    for t in range(local.shape[0]):
        cache[order[t // PAGE], t % PAGE] = local[t]
    table = order[None, :].to(torch.int32)
    return oracle(query[None], cache[:, None], None, LORA * 2, LORA, ROPE, table,
                  torch.tensor([local.shape[0]], dtype=torch.int32), local.shape[0], bmm1_scale=SCALE,
                  backend="cute-dsl", enable_dcp=True, cp_world=world, cp_rank=rank,
                  causal_seqlens_kv_global=torch.tensor([g], dtype=torch.int32), return_lse=True, **kw)


def _merge(parts):
    """Ranks' partials merged by their natural-log LSEs, written out here (not sglang's merge)."""
    lses = torch.stack([lse for _, lse in parts])  # [ranks, q, heads]
    top = lses.amax(0)
    w = torch.where(torch.isfinite(lses), torch.exp(lses - top), torch.zeros_like(lses))
    outs = torch.stack([o.double() for o, _ in parts])
    return (w[..., None] * outs).sum(0) / w.sum(0)[..., None], top + torch.log(w.sum(0))


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("global_len,q_len", [(100, 7), (9, 4), (3, 4)])
def test_ranks_merged_equal_dense(world, global_len, q_len):
    torch.manual_seed(world * 100 + global_len)
    keys = torch.randn(global_len, LORA + ROPE, dtype=torch.float64)
    query = torch.randn(q_len, HEADS, LORA + ROPE, dtype=torch.float64)
    parts = []
    for rank in range(world):
        out, lse = _rank_call(DecodeMLAOracle(), keys, query, world, rank)
        parts.append((out[0], lse.view(q_len, HEADS).double()))
    merged, merged_lse = _merge(parts)
    visible = torch.arange(global_len)[None, :] <= (global_len - q_len + torch.arange(q_len))[:, None]
    ref, ref_lse = dense_reference(query, keys, SCALE, LORA, visible)
    seen = visible.any(1)  # queries that see a key on some rank (G < q_len leaves early ones with none)
    assert float((merged[seen] - ref[seen]).abs().max()) < 1e-6
    assert float((merged_lse[seen] - ref_lse[seen]).abs().max()) < 1e-6


def test_flipped_bound_is_caught():
    torch.manual_seed(3)
    keys = torch.randn(50, LORA + ROPE, dtype=torch.float64)
    query = torch.randn(7, HEADS, LORA + ROPE, dtype=torch.float64)
    visible = torch.arange(50)[None, :] <= (50 - 7 + torch.arange(7))[:, None]
    ref, _ = dense_reference(query, keys, SCALE, LORA, visible)
    parts = [_rank_call(DecodeMLAOracle(flip_bound=True), keys, query, 4, r) for r in range(4)]
    merged, _ = _merge([(o[0], lse.view(7, HEADS).double()) for o, lse in parts])
    assert float((merged - ref).abs().max()) > 1e-2


def test_the_bound_is_flashinfers():
    """``ceil((G - (q_len - 1) + q_idx - rank) / world)``, as flashinfer's test pins it, for every small case."""
    for world in (1, 2, 3, 8):
        for g in range(0, 20):
            for q_len in (1, 4, 7):
                for j in range(q_len):
                    for rank in range(world):
                        want = max(0, -(-(g - (q_len - 1) + j - rank) // world))
                        assert local_visible(g, q_len, j, world, rank) == want


def test_an_empty_rank_gives_zero_and_minus_inf():
    keys = torch.randn(3, LORA + ROPE, dtype=torch.float64)
    query = torch.randn(4, HEADS, LORA + ROPE, dtype=torch.float64)
    out, lse = _rank_call(DecodeMLAOracle(), keys, query, 8, 5)  # rank 5 holds none of 3 positions
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.isneginf(lse).all()


def test_lse_base_per_backend_and_its_control():
    keys = torch.randn(40, LORA + ROPE, dtype=torch.float64)
    query = torch.randn(1, HEADS, LORA + ROPE, dtype=torch.float64)
    _, natural = _rank_call(DecodeMLAOracle(), keys, query, 2, 0)
    _, other = _rank_call(DecodeMLAOracle(lse_other_base=True), keys, query, 2, 0)
    assert torch.allclose(other.double(), natural.double() / math.log(2.0), atol=1e-5)
    # trtllm-gen (no enable_dcp) answers in base 2
    cache = keys.float().view(-1, 1, 40, LORA + ROPE)
    table = torch.zeros(1, 1, dtype=torch.int32)
    out, lse = DecodeMLAOracle()(query[None].float(), cache, None, 2 * LORA, LORA, ROPE, table,
                                 torch.tensor([40], dtype=torch.int32), 40, bmm1_scale=SCALE, backend="trtllm-gen",
                                 return_lse=True)
    _, ref_lse = dense_reference(query, keys, SCALE, LORA, torch.ones(1, 40, dtype=torch.bool))
    assert torch.allclose(lse.double(), ref_lse / math.log(2.0), atol=1e-4)


@pytest.mark.parametrize("change,match", [
    (dict(backend="trtllm-gen"), "enable_dcp needs backend"),
    (dict(return_lse=False), "return_lse"),
    (dict(cp_rank=2), "cp_rank"),
    (dict(causal_seqlens_kv_global=torch.tensor([10], dtype=torch.int64)), "int32"),
    (dict(causal_seqlens_kv_global=torch.tensor([11], dtype=torch.int32)), "share"),
])
def test_strict_where_the_call_is_wrong(change, match):
    """A call that is right but for ``change`` (5 local keys: rank 0's share of 10 at cp_world 2)."""
    query = torch.randn(1, 1, HEADS, LORA + ROPE)
    call = dict(backend="cute-dsl", enable_dcp=True, cp_world=2, cp_rank=0, return_lse=True,
                causal_seqlens_kv_global=torch.tensor([10], dtype=torch.int32))
    oracle, table = DecodeMLAOracle(), torch.tensor([[0, 1, 2, 3]], dtype=torch.int32)
    oracle(query, torch.randn(4, 1, PAGE, LORA + ROPE), None, 2 * LORA, LORA, ROPE, table,
           torch.tensor([5], dtype=torch.int32), 5, **call)  # the control: right as it is
    with pytest.raises(DecodeContractError, match=match):
        oracle(query, torch.randn(4, 1, PAGE, LORA + ROPE), None, 2 * LORA, LORA, ROPE, table,
               torch.tensor([5], dtype=torch.int32), 5, **dict(call, **change))


def test_strict_on_pages():
    query = torch.randn(1, 1, HEADS, LORA + ROPE)
    lens = torch.tensor([40], dtype=torch.int32)
    with pytest.raises(DecodeContractError, match="page size"):
        DecodeMLAOracle()(query, torch.randn(4, 1, 1, LORA + ROPE), None, 2 * LORA, LORA, ROPE,
                          torch.zeros(1, 128, dtype=torch.int32), lens, 40, backend="cute-dsl")
    with pytest.raises(DecodeContractError, match="multiple"):
        DecodeMLAOracle()(query, torch.randn(4, 1, PAGE, LORA + ROPE), None, 2 * LORA, LORA, ROPE,
                          torch.zeros(1, 3, dtype=torch.int32), lens, 40, backend="cute-dsl")
    with pytest.raises(DecodeContractError, match="outside a cache"):
        DecodeMLAOracle()(query, torch.randn(4, 1, PAGE, LORA + ROPE), None, 2 * LORA, LORA, ROPE,
                          torch.tensor([[0, 9, 0, 0]], dtype=torch.int32), lens, 40, backend="cute-dsl")


def test_without_dcp_a_row_with_no_key_is_nan():
    """The contract is silent there (trtllm-gen masks with -1e6): the oracle makes such a row poison a merge."""
    query = torch.randn(1, 4, HEADS, LORA + ROPE)
    out = DecodeMLAOracle()(query, torch.randn(2, 1, PAGE, LORA + ROPE), None, 2 * LORA, LORA, ROPE,
                            torch.zeros(1, 4, dtype=torch.int32), torch.tensor([2], dtype=torch.int32), 2,
                            backend="trtllm-gen")
    assert torch.isnan(out[0, :2]).all() and not torch.isnan(out[0, 2:]).any()
