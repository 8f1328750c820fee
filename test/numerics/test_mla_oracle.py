"""The MLA oracle on its own: paged and planned, it must equal softmax attention written out densely."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from emulation.mla.oracle import LOG2E, MLAOracle, PlanError, dense_reference  # noqa: E402

CKV, KPE, HEADS = 16, 8, 4


def paged(page_size: int, lengths: list[int], seed: int = 0):
    """A cache of shuffled pages holding one key run per request; returns the cache and each request's pages."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // page_size) for n in lengths]
    order = torch.randperm(sum(need) + 3, generator=g).tolist()  # 3 pages no request uses
    ckv = torch.randn(len(order), page_size, CKV, generator=g, dtype=torch.float64)
    kpe = torch.randn(len(order), page_size, KPE, generator=g, dtype=torch.float64)
    pages, at = [], 0
    for k in need:
        pages.append(order[at: at + k])
        at += k
    return ckv, kpe, pages


def keys_of(cache, pages, n, dim):
    return cache[pages].reshape(-1, dim)[:n]


def run(page_size, lengths, queries, *, causal, return_lse=True, seed=1):
    ckv, kpe, pages = paged(page_size, lengths)
    g = torch.Generator().manual_seed(seed)
    nq = sum(queries)
    qn = torch.randn(nq, HEADS, CKV, generator=g, dtype=torch.float64)
    qr = torch.randn(nq, HEADS, KPE, generator=g, dtype=torch.float64)
    qo = torch.tensor([0] + queries).cumsum(0)
    kv = torch.tensor([0] + [len(p) for p in pages]).cumsum(0)
    oracle = MLAOracle()
    oracle.plan(qo, kv, torch.tensor(sum(pages, [])), torch.tensor(lengths), HEADS, CKV, KPE, page_size, causal, 0.3)
    return oracle.run(qn, qr, ckv, kpe, return_lse=return_lse), (ckv, kpe, pages, qn, qr, qo)


@pytest.mark.parametrize("page_size", [1, 4, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_planned_equals_dense(page_size, causal):
    lengths, queries = [9, 70, 3], [3, 5, 3]
    (out, lse), (ckv, kpe, pages, qn, qr, qo) = run(page_size, lengths, queries, causal=causal)
    for i, n in enumerate(lengths):
        q = queries[i]
        visible = torch.ones(q, n, dtype=torch.bool)
        if causal:
            visible = torch.arange(n)[None, :] <= (torch.arange(q) + n - q)[:, None]
        want_o, want_lse = dense_reference(qn[qo[i]:qo[i + 1]], qr[qo[i]:qo[i + 1]], keys_of(ckv, pages[i], n, CKV),
                                           keys_of(kpe, pages[i], n, KPE), 0.3, visible)
        assert torch.allclose(out[qo[i]:qo[i + 1]], want_o, atol=1e-12)
        assert torch.allclose(lse[qo[i]:qo[i + 1]].double(), want_lse, atol=1e-5)


def test_causal_is_bottom_right_not_top_left():
    """3 queries over 9 keys: bottom-right lets query 0 see keys 0..6; top-left would show it key 0 only."""
    lengths, queries = [9], [3]
    (out, _), (ckv, kpe, pages, qn, qr, _) = run(1, lengths, queries, causal=True)
    top_left = torch.arange(9)[None, :] <= torch.arange(3)[:, None]
    wrong, _ = dense_reference(qn, qr, keys_of(ckv, pages[0], 9, CKV), keys_of(kpe, pages[0], 9, KPE), 0.3, top_left)
    assert (out - wrong).abs().max() > 1e-2


def test_lse_is_base_two_and_merges_split_keys():
    """Two halves of one request's keys, planned apart and merged by their base-2 LSE, give the whole."""
    (whole, whole_lse), (ckv, kpe, pages, qn, qr, _) = run(1, [12], [2], causal=False)
    halves = []
    for part in (pages[0][:5], pages[0][5:]):
        oracle = MLAOracle()
        oracle.plan([0, 2], [0, len(part)], part, [len(part)], HEADS, CKV, KPE, 1, False, 0.3)
        halves.append(oracle.run(qn, qr, ckv, kpe, return_lse=True))
    lses = torch.stack([h[1].double() for h in halves])
    total = torch.logsumexp(lses / LOG2E, 0) * LOG2E
    merged = sum(h[0] * torch.exp2(h[1].double() - total)[..., None] for h in halves)
    assert torch.allclose(merged, whole, atol=1e-12)
    assert torch.allclose(total, whole_lse.double(), atol=1e-5)


def test_no_lse_unless_asked():
    out, _ = run(1, [4], [1], causal=False, return_lse=False)
    assert isinstance(out, torch.Tensor)


def test_query_left_no_key_is_neutral():
    """4 queries over 2 keys, causal bottom-right: queries 0 and 1 see nothing: output 0, LSE -inf."""
    (out, lse), _ = run(1, [2], [4], causal=True)
    assert torch.equal(out[:2], torch.zeros_like(out[:2])) and torch.isinf(lse[:2]).all()
    assert torch.isfinite(lse[2:]).all()


@pytest.mark.parametrize("what", ["empty", "outside", "pages"])
def test_strict(what):
    ckv, kpe, _ = paged(1, [4])
    q = torch.zeros(1, HEADS, CKV, dtype=torch.float64), torch.zeros(1, HEADS, KPE, dtype=torch.float64)
    oracle = MLAOracle()
    with pytest.raises(PlanError):
        if what == "pages":
            oracle.plan([0, 1], [0, 2], [0, 1], [3], HEADS, CKV, KPE, 1, False, 1.0)
        oracle.plan([0, 1], [0, 1 if what == "outside" else 0], [ckv.shape[0] + 5], [1 if what == "outside" else 0],
                    HEADS, CKV, KPE, 1, False, 1.0)
        oracle.run(*q, ckv, kpe)
