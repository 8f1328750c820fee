"""What flashinfer's ``trtllm_batch_decode_with_kv_cache_mla`` computes, on CPU, in plain torch.

Written in our own words from flashinfer's documented API and from its own tests, not from its kernels
(flashinfer-ai/flashinfer at fb28d72: the docstring and ``_validate_mla_dcp_args`` in ``flashinfer/mla/_core.py``,
re-exported by ``flashinfer/decode.py``; ``tests/attention/test_cute_dsl_mla_dcp.py`` for what a rank returns;
``include/flashinfer/trtllm/fmha/lse.cuh`` for trtllm-gen's LSE). sglang calls it on two paths under DCP:

- cutedsl_mla, decode and target verify: ``backend="cute-dsl", enable_dcp=True, cp_world, cp_rank,
  causal_seqlens_kv_global, return_lse=True`` (``cutedsl_mla_backend.py::_run_decode_kernel``, 0.5.17 and 0.5.23);
- trtllm_mla's DCP decode (#33926, ``trtllm_mla_backend.py::_forward_decode_dcp``): the trtllm-gen kernel with
  ``return_lse=True`` and no ``enable_dcp``, one query per request, over the rank's own table and lengths.

The contract, as this oracle applies it:

- ``query`` is ``[batch, q_len, heads, kv_lora_rank + qk_rope_head_dim]`` (the absorbed q: latent, then rope);
  ``kv_cache`` is ``[pages, 1, page_size, kv_lora_rank + qk_rope_head_dim]`` (or without the 1); request ``i``'s
  key ``t`` is row ``t % page_size`` of page ``block_tables[i, t // page_size]``; only the pages its length needs
  are read.
- ``seq_lens[i]`` is the number of keys request ``i`` holds in this cache: under DCP, the rank's own share
  ("rank-local lengths", the docstring).
- The score is ``bmm1_scale * (q . k)`` over the whole head dim; the output is the softmax-weighted sum of the
  keys' first ``kv_lora_rank`` values (MLA's values are its compressed keys), times ``bmm2_scale``.
- Without ``enable_dcp``, queries are aligned bottom-right: query ``j`` of ``q_len`` sees keys
  ``0 .. seq_lens[i] - q_len + j`` (trtllm-gen's tests compare against a causal, bottom-right plan).
- With ``enable_dcp`` (cute-dsl; "auto" is forced to it), rank ``r`` holds the global positions ``g`` with
  ``g % cp_world == r``, its key ``t`` being ``g = t * cp_world + r``. ``G = causal_seqlens_kv_global[i]`` is the
  global exclusive bound of the newest query (the new tokens counted), so query ``j`` sees global positions
  ``0 .. G - q_len + j``: its first ``ceil((G - (q_len - 1) + j - r) / cp_world)`` local keys (the bound
  flashinfer's test pins).
- The LSE comes back as ``[batch * q_len, heads]`` float32: natural log for cute-dsl (its kernel converts its
  base-2 sum), base 2 for trtllm-gen (``lse.cuh``: ``log2e * m + log2(d)``; no docstring says so).
- Under DCP, a query that sees no key gets output 0 and LSE -inf (flashinfer's empty-rank test asserts both).

Made strict where the contract is silent, so that sglang code proven here does not lean on it:

- the argument checks flashinfer documents raise :class:`DecodeContractError` (DCP arguments without
  ``enable_dcp``; with it: a backend other than cute-dsl or auto, no ``return_lse``, a ``cp_rank`` outside
  ``[0, cp_world)``, no int32 ``causal_seqlens_kv_global`` of ``batch`` entries), and so do cute-dsl's page rule
  (``128 % page_size == 0``, page size not 1) and its table width (a multiple of ``128 / page_size`` pages);
- so does a ``seq_lens`` that is not int32, or, under DCP, a local length other than the rank's share of ``G``
  (the kernel pages by the local length and bounds by the global one: two that disagree read keys the rank does
  not hold, or skip keys it does);
- a page id the request needs outside the cache raises (on a GPU: another request's rows, or an illegal access);
- without DCP, the output of a query that sees no key is NaN (the kernel's masked scores are -1e6, so its value
  there is not specified): sglang must neutralise such rows (``fixup_zero_kv_rows``), and a merge that reads one
  shows.
"""

from __future__ import annotations

import math


class DecodeContractError(ValueError):
    """A call the kernel would refuse, or one that would read outside the cache."""


def local_visible(global_len: int, q_len: int, j: int, world: int, rank: int) -> int:
    """Local keys query ``j`` sees on ``rank``: the global positions ``0 .. global_len - q_len + j`` this rank holds."""
    last = global_len - q_len + j  # the last global position query j sees
    return 0 if last < rank else (last - rank) // world + 1


def local_share(global_len: int, world: int, rank: int) -> int:
    """How many of ``global_len`` positions sit on ``rank`` (position g on rank g % world)."""
    return 0 if global_len <= rank else (global_len - 1 - rank) // world + 1


def _ints(x) -> list[int]:
    return [int(v) for v in (x.tolist() if hasattr(x, "tolist") else x)]


class DecodeMLAOracle:
    """``trtllm_batch_decode_with_kv_cache_mla`` with its keyword signature.

    ``flip_bound`` and ``lse_other_base`` break the contract on purpose, for the controls: the first mirrors each
    query's bound (query ``j`` gets query ``q_len - 1 - j``'s), the second returns the LSE in the other base
    (base 2 for cute-dsl, natural log for trtllm-gen)."""

    def __init__(self, *, flip_bound: bool = False, lse_other_base: bool = False) -> None:
        self.flip_bound, self.lse_other_base = flip_bound, lse_other_base
        self.calls: list[dict] = []
        # Per call, per request, per query: the cache rows (page * page_size + slot) it attended, in key order. The
        # pass map judges a backend by what these rows hold (``emulation.passmap.blackwell``).
        self.reads: list[list[list[list[int]]]] = []

    def __call__(self, query, kv_cache, workspace_buffer=None, qk_nope_head_dim=None, kv_lora_rank=None,
                 qk_rope_head_dim=None, block_tables=None, seq_lens=None, max_seq_len=None, sparse_mla_top_k=0,
                 out=None, bmm1_scale=1.0, bmm2_scale=1.0, sinks=None, skip_softmax_threshold_scale_factor=None,
                 enable_pdl=None, backend="auto", return_lse=False, enable_dcp=False, cp_world=1, cp_rank=0,
                 causal_seqlens_kv_global=None, **unused):
        import torch

        if query.dim() != 4:
            raise DecodeContractError(f"query is {tuple(query.shape)}, expected [batch, q_len, heads, head_dim]")
        bs, q_len, heads, dim = query.shape
        if dim != kv_lora_rank + qk_rope_head_dim:
            raise DecodeContractError(f"query head dim {dim} is not kv_lora_rank {kv_lora_rank} + rope "
                                      f"{qk_rope_head_dim}")
        cache = kv_cache.reshape(kv_cache.shape[0], -1, dim)
        page_size = cache.shape[1]
        if seq_lens is None or seq_lens.dtype != torch.int32 or seq_lens.numel() != bs:
            raise DecodeContractError(f"seq_lens must be int32 of {bs} entries, got "
                                      f"{None if seq_lens is None else (seq_lens.dtype, seq_lens.numel())}")
        lens = _ints(seq_lens)
        table = block_tables.tolist()
        cute = backend == "cute-dsl" or (enable_dcp and backend == "auto")
        if cute and (page_size == 1 or 128 % page_size):
            raise DecodeContractError(f"cute-dsl needs a page size dividing 128 (not 1), got {page_size}")
        if cute and block_tables.shape[1] % (128 // page_size):
            raise DecodeContractError(f"block_tables has {block_tables.shape[1]} pages a row, not a multiple of "
                                      f"128 / page_size = {128 // page_size}")
        if enable_dcp:
            if backend not in ("cute-dsl", "auto"):
                raise DecodeContractError(f"enable_dcp needs backend 'cute-dsl' or 'auto', got {backend!r}")
            if not return_lse:
                raise DecodeContractError("enable_dcp needs return_lse=True")
            if (causal_seqlens_kv_global is None or causal_seqlens_kv_global.dtype != torch.int32
                    or causal_seqlens_kv_global.numel() != bs):
                raise DecodeContractError("enable_dcp needs causal_seqlens_kv_global as int32 global KV lengths")
            if not 0 <= cp_rank < cp_world:
                raise DecodeContractError(f"cp_rank {cp_rank} outside cp_world {cp_world}")
            globals_ = _ints(causal_seqlens_kv_global)
            for i, (n, g) in enumerate(zip(lens, globals_, strict=True)):
                if n != local_share(g, cp_world, cp_rank):
                    raise DecodeContractError(f"request {i}: seq_lens {n} on rank {cp_rank} of {cp_world} is not "
                                              f"its share {local_share(g, cp_world, cp_rank)} of global length {g}")
        elif causal_seqlens_kv_global is not None or cp_world != 1 or cp_rank != 0:
            raise DecodeContractError("DCP arguments (cp_world, cp_rank, causal_seqlens_kv_global) need enable_dcp")
        natural_log = cute
        self.calls.append({"backend": backend, "enable_dcp": bool(enable_dcp), "q_len": q_len, "seq_lens": lens,
                           "global": globals_ if enable_dcp else None, "world": cp_world, "rank": cp_rank})

        o = torch.zeros(bs, q_len, heads, kv_lora_rank, dtype=torch.float64)
        s = torch.full((bs, q_len, heads), float("-inf"), dtype=torch.float64)
        reads: list[list[list[int]]] = []
        self.reads.append(reads)
        for i, n in enumerate(lens):
            pages = [int(p) for p in table[i][: -(-n // page_size)]]
            if pages and (min(pages) < 0 or max(pages) >= cache.shape[0]):
                bad = min(pages) if min(pages) < 0 else max(pages)
                raise DecodeContractError(f"request {i} reads page {bad}, outside a cache of {cache.shape[0]} pages")
            keys = cache[pages].reshape(-1, dim)[:n].double() if pages else cache.new_zeros(0, dim).double()
            score = torch.einsum("qhd,kd->qhk", query[i].double(), keys) * float(bmm1_scale)
            rows = [p * page_size + t for p in pages for t in range(page_size)][:n]
            reads.append([])
            for j in range(q_len):
                jj = q_len - 1 - j if self.flip_bound else j
                seen = (local_visible(globals_[i], q_len, jj, cp_world, cp_rank) if enable_dcp
                        else max(0, n - q_len + jj + 1))
                seen = min(seen, n)
                reads[-1].append(rows[:seen])
                if seen == 0:
                    o[i, j] = 0.0 if enable_dcp else float("nan")
                    continue
                row = score[j, :, :seen]
                s[i, j] = torch.logsumexp(row, -1)
                o[i, j] = torch.softmax(row, -1) @ keys[:seen, :kv_lora_rank] * float(bmm2_scale)
        if natural_log == self.lse_other_base:  # trtllm-gen's base 2, or the control's flip of either base
            s = s / math.log(2.0)
        result = o.to(query.dtype)
        if out is not None:
            out.view_as(result).copy_(result)
            result = out
        return (result, s.float().reshape(bs * q_len, heads)) if return_lse else result


def dense_reference(query, keys, bmm1_scale: float, kv_lora_rank: int, visible):
    """Softmax attention written out for one request, with an explicit mask ``visible[query, key]`` over the
    global positions; the oracle's tests merge its ranks against this. ``(out, lse natural log)`` in float64."""
    import torch

    score = torch.einsum("qhd,kd->qhk", query.double(), keys.double()) * bmm1_scale
    score = score.masked_fill(~visible[:, None, :], float("-inf"))
    return torch.softmax(score, -1) @ keys[:, :kv_lora_rank].double(), torch.logsumexp(score, -1)


BROKEN_DECODE_KERNELS = {"flipped-bound": {"flip_bound": True}, "lse-base": {"lse_other_base": True}}
