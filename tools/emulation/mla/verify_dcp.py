"""Numbers for the target verify under DCP on flashinfer MLA: N ranks merged against one rank, on CPU.

For one verify batch (a DSPARK block or an EAGLE chain over requests of
different lengths), on the sglang tree on ``PYTHONPATH``:

1. each of N ranks gets its own ``MLATokenToKVPool`` (fp32, DeepSeek-V3's
   latent: kv_lora_rank 512 + rope 64) and the requests' committed prefix is
   written through sglang's own ``set_mla_kv_buffer``, which keeps the
   rank's stripe (loc L on rank L % N at row L // N);
2. the rank's ``FlashInferMLAAttnBackend`` (built by its own ``__init__``
   on a stand-in model runner) builds the verify's metadata with its own
   code: eager (``init_forward_metadata``) or as a CUDA graph (capture with
   ``init_forward_metadata_out_graph(in_capture=True)``, then replay);
3. the backend's own ``forward`` runs the verify, writing the draft window
   through its own KV door. flashinfer's MLA wrapper is the oracle
   (``mla_oracle.py``): it computes what the kernel computes from the plan the
   backend made. The result is unpacked as ``forward_mla.py`` unpacks a DCP
   phase, ``attn_output, lse = ...``;
4. the ranks' partials are merged by sglang's own ``cp_lse_ag_out_rs_mla``
   (the merge a DCP decode uses, its Triton kernel in Triton's interpreter).
   The N ranks are N threads and the process group a stand-in that
   all-gathers and reduce-scatters between them;
5. each rank's heads are compared with the same batch run on one rank
   (no DCP, the stock verify).

With the fix (``--fix plugin``: the plugin's hooks on the backend; or a tree
with upstream-next 0012) every case must match to 1e-5. Stock sglang must
fail every case with N > 1. Controls break one thing on purpose and must be
caught: ``shift-write`` writes each prefix token one physical row off,
``all-ids`` translates every id with ``// N`` instead of this rank's own, and
``bottom-right`` plans each request as one causal run over the rank's own
keys (flashinfer's bottom-right bound on rank-local lengths).

Usage: PYTHONPATH=build/trees/sglang-X .venv/bin/python tools/emulation/mla/verify_dcp.py [--fix plugin|none]
       [--control NAME[,NAME...]] [--cases a,b] [--dcp 2,4,8] [--modes eager,graph]
       [--json | --markdown | --pr-markdown | --kernel-check | --cost | --cost-markdown]
       [--control-cases a,b] [--control-dcp 8] [--control-modes eager]
       (``--control none`` is the run without a control, so one process can give both; the --control-* options
       narrow the controls' runs; ``--kernel-check`` runs the carrier's kernel check on the oracle and on each
       broken kernel of ``mla.oracle``, alone and at the backend's first verify, and prints JSON; ``--cost`` and
       ``--cost-markdown`` count one layer's verify on rank 0 of dcp 8 against stock's at dcp 1, per control:
       launches, full passes and a replay's plans, ``emulation.mla.launches``; the cost controls are
       ``unfused-merge``, ``full-replan`` and ``as-shipped``, both at once, the split as it first shipped)
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import threading
from dataclasses import dataclass
from types import SimpleNamespace

from emulation.mla import launches
from emulation.passmap import harness

# DeepSeek-V3 (deepseek-ai/DeepSeek-V3, config.json): kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128,
# 128 heads. The heads are scaled down to 8 (after the DCP all-gather) for CPU; the latent is not.
KV_LORA_RANK, ROPE, NOPE = 512, 64, 128
HEADS = 8
LAYERS = 2  # the verify reads layer 0; test/datapath's host stack maps two target layers
SM_SCALE = 1.0 / math.sqrt(NOPE + ROPE)
TOLERANCE = 1e-5  # fp32, max |error| against one rank
STOCK_FAILS_OVER = 1e-2

FMB = "sglang.srt.layers.attention.flashinfer_mla_backend"


@dataclass(frozen=True)
class Shape:
    """One verify batch: the requests' committed prefixes, the draft tokens per request, the pool's page size."""

    name: str
    algorithm: str  # "DSPARK" (a block of draft tokens) or "EAGLE" (a chain: steps 3, topk 1)
    prefixes: tuple[int, ...]
    draft_tokens: int
    page_size: int
    hicache: bool = False  # the prefix backed up, evicted and loaded back into other pages before the verify

    @property
    def what(self) -> str:
        """The shape in words, for the PR's table."""
        kind = f"DSpark block {self.draft_tokens}" if self.algorithm == "DSPARK" else f"EAGLE chain of {self.draft_tokens}"
        prefixes = ", ".join(f"{h:,}" for h in self.prefixes)
        return f"{kind}, prefixes {prefixes}, page {self.page_size}" + (", after a HiCache load-back" if self.hicache
                                                                        else "")


SHAPES = (
    Shape("dspark-block7-page1", "DSPARK", (37, 5, 130), 7, 1),  # three requests of different lengths
    Shape("dspark-block7-page64", "DSPARK", (5, 130), 7, 64),
    Shape("eagle-chain4-page1", "EAGLE", (29, 11), 4, 1),
    Shape("eagle-chain4-page64", "EAGLE", (29, 11), 4, 64),
    Shape("short-prefixes", "DSPARK", (1, 6), 7, 1),  # shorter than N: some ranks hold no key of a request
    # At the page size test/datapath's host stack is built with (4).
    Shape("after-load-back", "DSPARK", (37, 70), 7, 4, hicache=True),
    # Prefixes in the thousands, where the verify's cost is the prefix: the split hands it to the kernel once.
    Shape("long-prefixes-page1", "DSPARK", (2000, 2345), 7, 1),
    Shape("long-prefixes-page64", "DSPARK", (2000, 2345), 7, 64),
    Shape("long-prefixes-eagle", "EAGLE", (2100, 3001), 4, 64),
    # At dcp 8, ranks 3 to 7 hold no key of the first request's prefix, and ranks 1 to 7 none of the second's.
    Shape("no-prefix-key", "DSPARK", (3, 1), 7, 1),
    # An EAGLE chain of 2 on prefixes of 16 and 40: at dcp 4 and 8 the window sits on ranks 0 and 1 only, so
    # every draft token's window keys are on other ranks for ranks 2 and up (and for token 0 on rank 1).
    Shape("window-on-other-ranks", "EAGLE", (16, 40), 2, 1),
)
DCP_SIZES = (2, 4, 8)
MODES = ("eager", "graph")
CONTROLS = ("shift-write", "all-ids", "bottom-right", "window-off-by-one")
COST_CONTROLS = ("unfused-merge", "full-replan", "as-shipped")  # what one layer costs, not its numbers
# The split verify's numbers handed to the kernel, against what the ranks hold, must stay within this where the
# prefixes are in the thousands (the window and the filler slots are all it adds to the prefix).
KV_RATIO_BOUND = 1.2


# ---------------------------------------------------------------- the batch, its locs and its values


class Layout:
    """Where each request's positions live: whole logical pages (page_size * N slots), handed out in a shuffled
    order as sglang's allocator would after some churn; loc 0 is never handed out (the padded slot)."""

    def __init__(self, shape: Shape, dcp: int, *, seed: int = 7) -> None:
        import torch

        self.shape, self.dcp = shape, dcp
        page = shape.page_size * dcp
        lengths = [h + shape.draft_tokens for h in shape.prefixes]
        need = [-(-n // page) for n in lengths]
        g = torch.Generator().manual_seed(seed)
        pages = (torch.randperm(2 * sum(need) + 2, generator=g) + 1).tolist()  # spare pages for a load-back
        self.width = max(need) * page + page
        self.req_to_token = torch.zeros((len(lengths), self.width), dtype=torch.int32)
        self.spare = pages[sum(need):]
        at = 0
        for r in range(len(lengths)):
            mine = pages[at: at + need[r]]
            at += need[r]
            self.req_to_token[r, : need[r] * page] = torch.cat([torch.arange(p * page, (p + 1) * page) for p in mine])
        self.slots = (len(pages) + 1) * page  # logical slots; each rank holds slots // N rows

        # HiCache: the prefix is written at these locs, backed up and evicted, then loaded back into spare pages,
        # which the verify reads (``load_back``).
        self.written = self.req_to_token.clone()
        if shape.hicache:
            for r in range(len(lengths)):
                self._move_prefix(r)

    def locs(self, r: int, start: int, stop: int, *, written: bool = False):
        return (self.written if written else self.req_to_token)[r, start:stop].to(torch_int64())

    def _move_prefix(self, r: int) -> None:
        import torch

        page = self.shape.page_size * self.dcp
        for k in range(-(-self.shape.prefixes[r] // page)):
            p = self.spare.pop()
            self.req_to_token[r, k * page:(k + 1) * page] = torch.arange(p * page, (p + 1) * page, dtype=torch.int32)


def torch_int64():
    import torch

    return torch.int64


def values(shape: Shape, seed: int = 11):
    """Each request's latent KV per position and the draft tokens' queries, the same whatever N is."""
    import torch

    g = torch.Generator().manual_seed(seed)
    kv = [(torch.randn(h + shape.draft_tokens, KV_LORA_RANK, generator=g),
           torch.randn(h + shape.draft_tokens, ROPE, generator=g)) for h in shape.prefixes]
    tokens = len(shape.prefixes) * shape.draft_tokens
    q = (torch.randn(tokens, HEADS, KV_LORA_RANK, generator=g), torch.randn(tokens, HEADS, ROPE, generator=g))
    return kv, q


# ---------------------------------------------------------------- sglang's pieces on a rank


LAYER = SimpleNamespace(layer_id=0, is_cross_attention=False, tp_q_head_num=HEADS, tp_k_head_num=1, tp_v_head_num=1,
                        v_head_dim=KV_LORA_RANK, head_dim=KV_LORA_RANK + ROPE, qk_head_dim=KV_LORA_RANK + ROPE,
                        logit_cap=0.0, scaling=SM_SCALE, sliding_window_size=-1)


def pool_for(layout: Layout):
    import torch
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    return MLATokenToKVPool(layout.slots // layout.dcp, page_size=layout.shape.page_size, dtype=torch.float32,
                            kv_lora_rank=KV_LORA_RANK, qk_rope_head_dim=ROPE, layer_num=LAYERS, device="cpu",
                            enable_memory_saver=False, start_layer=0, end_layer=LAYERS - 1)


def write_prefix(pool, layout: Layout, kv, shift: int = 0) -> None:
    """The committed prefix through ``set_mla_kv_buffer`` (the pool keeps this rank's stripe)."""
    for r, h in enumerate(layout.shape.prefixes):
        locs = layout.locs(r, 0, h, written=True)
        c, k = kv[r]
        pool.set_mla_kv_buffer(LAYER, harness.mla_loc(pool, locs + shift * layout.dcp), c[:h, None, :], k[:h, None, :])


def load_back(ops, pool, layout: Layout) -> None:
    """HiCache: back every request's prefix up to the host (``start_writing``), scrub the device pool (eviction),
    and load it back into other pages (``start_loading``), then point the requests at them. The host pool and the
    transfer lists are sglang's (``build_kv_only_stack``; ``HybridCacheController._l2_transfers``,
    ``_resolve_device_transfers``, ``_l2_load_transfers``; ``L2TransferEngine``), the copies the data path's
    reference ops (``test/datapath``)."""
    import functools

    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController as HCC
    from sglang.srt.mem_cache.l2_transfer import L2TransferEngine

    from emulation.datapath import layouts

    group, _, extra_pools = harness.host_stack("PACKED", None, [], pool, layout.dcp)
    ops.register_pool("target/device", pool)
    ops.register_pool("target/host", group.anchor_entry.host_pool)
    ctl = SimpleNamespace(mem_pool_host=group, transfer_layer_id_max=pool.layer_num, layer_num=pool.layer_num,
                          has_draft=False, mtp_draft_device_pools=(), has_mtp_draft=False)
    ctl._l2_transfers = functools.partial(HCC._l2_transfers, ctl)
    engine = L2TransferEngine(layouts.IO_BACKEND)
    page = layout.shape.page_size * layout.dcp
    backed = []
    for r, h in enumerate(layout.shape.prefixes):
        locs = layout.locs(r, 0, -(-h // page) * page, written=True)
        host = group.alloc(len(locs))
        transfers = group.resolve_host_transfers(extra_pools(), primary_device_indices=locs, primary_host_indices=host)
        engine.submit_device_to_host(HCC._l2_transfers(ctl, host, locs, transfers))
        backed.append(host)
    for buffer in pool.kv_buffer:
        buffer.zero_()
    for r, host in enumerate(backed):
        locs2 = layout.locs(r, 0, len(host))
        loads = HCC._resolve_device_transfers(ctl, extra_pools(), kv_device_indices=locs2, kv_host_indices=host)
        engine.submit_host_to_device(HCC._l2_load_transfers(ctl, host, locs2, loads),
                                     transfer_layer_id_max=pool.layer_num)


def model_runner(pool, layout: Layout, translator):
    runner = harness.model_runner(pool, layout.req_to_token, translator, heads=HEADS)
    runner.model_config.kv_lora_rank, runner.model_config.qk_rope_head_dim = KV_LORA_RANK, ROPE
    runner.model_config.qk_nope_head_dim, runner.model_config.v_head_dim = NOPE, NOPE
    runner.model_config.scaling = SM_SCALE
    runner.model_config.context_len = layout.width
    runner.page_size = layout.shape.page_size
    runner.dtype = runner.kv_cache_dtype = __import__("torch").float32
    runner.token_to_kv_pool_allocator.page_size = layout.shape.page_size
    return runner


def oracle_wrapper_class():
    """flashinfer's ``BatchMLAPagedAttentionWrapper`` as the oracle (``mla.oracle.OracleMLAWrapper``: bound to its
    CUDA-graph buffers as flashinfer's is, sizes checked, with the fast plan sglang's replays call), its plans
    recorded for the cost count, and the ``bottom-right`` control."""

    from emulation.mla.oracle import BROKEN_KERNELS, OracleMLAWrapper

    kernel = CURRENT.get("kernel", "oracle")
    base = BROKEN_KERNELS.get(kernel, OracleMLAWrapper)

    class OracleWrapper(base):
        def fast_plan(self, num_heads, head_dim_ckv, causal, *lengths) -> None:
            with launches.planning("fast"):
                super().fast_plan(num_heads, head_dim_ckv, causal, *lengths)

        def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe,
                 page_size, causal, sm_scale, *dtypes, **kwargs):
            if CURRENT.get("control") == "bottom-right" and not causal and len(qo_indptr) > 1 \
                    and int((qo_indptr[1:] - qo_indptr[:-1]).max()) > 1:
                causal = True  # the prefix row bounded by flashinfer's bottom-right mask on the rank's own keys
            super().plan(qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe,
                         page_size, causal, sm_scale)

        @property
        def kv_tokens(self) -> int:
            """KV tokens the last plan hands the kernel (page size times pages, as planned)."""
            planned = self.oracle.planned
            return 0 if planned is None else sum(planned.kv_len)

    OracleWrapper.__qualname__ = f"OracleWrapper[{kernel}]"  # the kernel check's once-per-process key
    return OracleWrapper


CURRENT: dict = {}


def spec_input(shape: Shape):
    """The verify's spec input, as the worker builds it: DSPARK's draft-block spec, or EAGLE's chain (topk 1)."""
    import torch

    bs, n = len(shape.prefixes), shape.draft_tokens
    if shape.algorithm == "DSPARK":
        from sglang.srt.speculative.draft_worker_common import make_draft_block_spec_info

        return make_draft_block_spec_info(draft_token_num=n, device="cpu")
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    return EagleVerifyInput(
        draft_token=torch.zeros(bs * n, dtype=torch.long), custom_mask=torch.ones(bs * 64 * n, dtype=torch.bool),
        positions=torch.zeros(bs * n, dtype=torch.long), retrieve_index=torch.arange(bs * n).view(bs, n),
        retrieve_next_token=torch.full((bs, n), -1), retrieve_next_sibling=torch.full((bs, n), -1),
        retrieve_cum_len=None, spec_steps=n - 1, topk=1, draft_token_num=n, capture_hidden_mode=CaptureHiddenMode.FULL,
        seq_lens_sum=0, seq_lens_cpu=None)


def verify_batch(shape: Shape, layout: Layout, spec, *, capture: bool = False):
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    bs, n = len(shape.prefixes), shape.draft_tokens
    lens = torch.tensor([1] * bs if capture else list(shape.prefixes), dtype=torch.int64)
    window = (torch.zeros(bs * n, dtype=torch.int64) if capture
              else torch.cat([layout.locs(r, h, h + n) for r, h in enumerate(shape.prefixes)]))
    positions = torch.cat([torch.arange(int(h), int(h) + n) for h in lens])
    b = harness.fb(forward_mode=ForwardMode.TARGET_VERIFY, batch_size=bs, req_pool_indices=torch.arange(bs),
                   seq_lens=lens, seq_lens_sum=int(lens.sum()), seq_lens_cpu=lens.clone(), spec_info=spec,
                   positions=positions, out_cache_loc=window)
    b.out_cache_loc_is_physical = True
    b.attn_attend_prefix_cache = None  # a verify attends its prefix through the paged plan, not in MHA chunks
    if not capture and hasattr(spec, "live_seq_lens_cpu"):
        # DSpark's verify carries the committed lengths on the host (dspark_verify.run_non_compact); its batch's
        # seq_lens_cpu then counts the window too.
        spec.live_seq_lens_cpu = lens.clone()
        b.seq_lens_cpu = lens + n
    return b


def backend_for(pool, layout: Layout):
    import importlib

    fmb = importlib.import_module(FMB)
    harness.stub_flashinfer(fmb)
    fmb.BatchMLAPagedAttentionWrapper = oracle_wrapper_class()
    translator = harness.translator_for(pool, layout.req_to_token, draft=False)
    return fmb.FlashInferMLAAttnBackend(model_runner(pool, layout, translator), skip_prefill=False)


def rank_partial(shape: Shape, layout: Layout, kv, q, mode: str, *, shift: int = 0, ops=None, handed=None,
                 cost: dict | None = None):
    """One rank's verify: its pool, its backend's metadata, its forward. Returns what the model unpacks at a DCP
    phase, ``(out, lse)``, or at one rank the output alone. ``handed`` gets the KV tokens its plans hand the
    kernel (both sides of a split verify, filler slots included). ``cost`` gets what the layer's forward
    launches and, in graph mode, which plans the replay makes (:mod:`emulation.mla.launches`)."""
    import torch

    pool = pool_for(layout)
    write_prefix(pool, layout, kv, shift)
    if shape.hicache:
        load_back(ops, pool, layout)
    be = backend_for(pool, layout)
    spec = spec_input(shape)
    live = verify_batch(shape, layout, spec)
    harness.bind_own(live, be.kv_index_translator)
    bs = len(shape.prefixes)
    if mode == "eager":
        be.init_forward_metadata(live)
    else:
        be.init_cuda_graph_state(bs, bs * shape.draft_tokens)
        cap_spec = spec_input(shape)
        cap = verify_batch(shape, layout, cap_spec, capture=True)
        harness.bind_runner_slots(cap, be.kv_index_translator)
        be.init_forward_metadata_out_graph(cap, in_capture=True)
        with _counted(cost, pool, shape) as count:
            be.init_forward_metadata_out_graph(live, in_capture=False)
        if cost is not None:
            cost["replay_plans"] = list(count.plans)
        # A replay runs the kernels captured on that graph's wrapper.
        import importlib

        fmb = importlib.import_module(FMB)
        be.forward_metadata = fmb.PrefillMetadata(be.prefill_cuda_graph_metadata[be._verify_graph_key(bs, spec)], False)
    if handed is not None:
        wrapper = be.forward_metadata.prefill_wrapper
        split = getattr(wrapper, "_dcp_split", None)
        handed.append(wrapper.kv_tokens if split is None else split.prefix.kv_tokens + split.window.kv_tokens)
    window_c = torch.cat([kv[r][0][h:h + shape.draft_tokens] for r, h in enumerate(shape.prefixes)])
    window_k = torch.cat([kv[r][1][h:h + shape.draft_tokens] for r, h in enumerate(shape.prefixes)])
    q_nope, q_rope = q[0].clone(), q[1].clone()
    with _counted(cost, pool, shape) as count:
        result = be.forward(q_nope, window_c[:, None, :], window_c[:, None, :], LAYER, live, save_kv_cache=True,
                            q_rope=q_rope, k_rope=window_k[:, None, :])
    if cost is not None:
        cost.update(launches=count.n_launches, full_passes=count.full_passes, kernels=count.names())
    if layout.dcp == 1:
        return result.view(-1, HEADS, KV_LORA_RANK), None
    attn_output, lse = result  # forward_mla.py, at a DCP phase: ``attn_output, lse = self.attn_mqa_for_dcp_decode(...)``
    return attn_output, lse


@contextlib.contextmanager
def _counted(cost: dict | None, pool, shape: Shape):
    """Count what runs inside when ``cost`` asks for it: launches, full passes over the verify's output, plans."""
    if cost is None:
        yield launches.Count()
        return
    import importlib

    wrapper = importlib.import_module(FMB).BatchMLAPagedAttentionWrapper
    tokens = len(shape.prefixes) * shape.draft_tokens
    with launches.counting(full_numel=tokens * HEADS * KV_LORA_RANK, pools=[pool.get_key_buffer(LAYER.layer_id)],
                           wrapper_classes=[wrapper]) as count:
        yield count


# ---------------------------------------------------------------- the DCP group: N rank threads


class _Exchange:
    def __init__(self, n: int) -> None:
        self.n, self.slots, self.barrier = n, [None] * n, threading.Barrier(n)

    def swap(self, rank: int, tensor):
        self.slots[rank] = tensor
        self.barrier.wait()
        got = list(self.slots)
        self.barrier.wait()
        return got


class RankGroup:
    """What ``cp_lse_ag_out_rs_mla`` reads of sglang's ``GroupCoordinator``, over N threads of one process."""

    def __init__(self, exchange: _Exchange, rank: int) -> None:
        self.exchange, self.rank_in_group, self.world_size = exchange, rank, exchange.n

    def all_gather(self, tensor, dim: int = 0):
        import torch

        return torch.cat(self.exchange.swap(self.rank_in_group, tensor), dim=dim)

    def reduce_scatter_along_dim(self, tensor, dim: int = 0):
        parts = self.exchange.swap(self.rank_in_group, tensor)
        total = sum(p.clone() for p in parts)
        return total.chunk(self.world_size, dim=dim)[self.rank_in_group].contiguous()


def merge(partials: list, *, is_lse_base_on_e: bool = False) -> list:
    """Each rank's heads after sglang's DCP merge (``cp_lse_ag_out_rs_mla``, then the transpose forward_mla does).
    ``is_lse_base_on_e``: what the model tells the merge of the backend's LSE (flashinfer MLA's is base 2)."""
    import importlib

    comm = importlib.import_module("sglang.srt.layers.dcp.comm")
    n = len(partials)
    exchange, results, errors = _Exchange(n), [None] * n, []
    lock = threading.Lock()
    real = comm.correct_attn_out

    def serial(*args, **kwargs):  # Triton's interpreter is not re-entrant: one rank's kernel at a time
        with lock:
            return real(*args, **kwargs)

    def rank(r: int) -> None:
        try:
            out, lse = partials[r]
            merged = comm.cp_lse_ag_out_rs_mla(out.view(-1, HEADS, KV_LORA_RANK), lse, RankGroup(exchange, r),
                                               is_lse_base_on_e=is_lse_base_on_e)
            results[r] = merged.transpose(0, 1)
        except BaseException as exc:  # reported, and the barrier released for the other ranks
            errors.append(exc)
            exchange.barrier.abort()

    comm.correct_attn_out = serial
    try:
        threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        comm.correct_attn_out = real
    if errors:
        raise errors[0]
    return results


# ---------------------------------------------------------------- one case


@contextlib.contextmanager
def fix_in_effect(fix: str):
    """``plugin``: the plugin's hooks on the flashinfer MLA backend, applied as the plugin applies them (its hook
    table, judged on this tree's code); ``none``: the tree's own code (stock, or a tree with upstream-next)."""
    if fix != "plugin":
        yield {}
        return
    from sglang_dcp_dspark.plugin import hooks

    with hooks.in_effect(FMB) as findings:
        yield findings


# Where each carrier keeps the split verify's pieces a control replaces: the plugin's module, and the series'
# (upstream-next 0012) module with the backend module that imports its names.
PLANNERS = (("sglang_dcp_dspark.plugin.dcp_verify", "plan_split"), ("sglang.srt.layers.dcp.split_verify",
            "plan_dcp_split_verify"), (FMB, "plan_dcp_split_verify"))
ID_BUILDERS = (("sglang_dcp_dspark.plugin.dcp_verify", "build_ids"), ("sglang.srt.layers.dcp.split_verify",
               "build_dcp_split_verify_ids"), (FMB, "build_dcp_split_verify_ids"))
WINDOW_BOUNDS = (("sglang_dcp_dspark.plugin.dcp_verify", "window_keys"), ("sglang.srt.layers.dcp.split_verify",
                 "dcp_window_keys"))


# And the pieces the cost controls replace: the on-rank merge, and a graph replay's plan of a wrapper.
MERGES = (("sglang_dcp_dspark.plugin.dcp_verify", "merge"), ("sglang.srt.layers.dcp.split_verify",
          "merge_dcp_split_verify"), (FMB, "merge_dcp_split_verify"))
REPLANS = (("sglang_dcp_dspark.plugin.dcp_verify", "replan"),
           ("sglang.srt.layers.dcp.split_verify", "replan_dcp_split_verify"), (FMB, "replan_dcp_split_verify"))


def unfused_merge(prefix_out, prefix_lse, window_out, window_lse, *flags):
    """The on-rank merge as the split verify first shipped it, for the cost controls and the bench: each flagged
    side neutralised by full-size fills, the base-2 LSEs converted for sglang's ``merge_state`` (base e) and back,
    the result of a query with both sides flagged filled again. Same numbers, about 18 launches."""
    from sglang.srt.layers.attention.merge_state import merge_state

    ln2 = math.log(2.0)
    # The plugin's merge takes the plan's device meta, the series' the two flags.
    empty_a, empty_b = (flags[0].prefix_empty, flags[0].window_empty) if len(flags) == 1 else flags
    empty_a, empty_b = empty_a != 0, empty_b != 0

    def neutral(out, lse, empty):
        out.masked_fill_(empty.view(-1, *([1] * (out.dim() - 1))), 0.0)
        lse.masked_fill_(empty.view(-1, *([1] * (lse.dim() - 1))), float("-inf"))

    neutral(prefix_out, prefix_lse, empty_a)
    neutral(window_out, window_lse, empty_b)
    both = empty_a & empty_b
    prefix_lse.masked_fill_(both.view(-1, *([1] * (prefix_lse.dim() - 1))), 0.0)
    out, lse = merge_state(prefix_out, prefix_lse * ln2, window_out, window_lse * ln2)
    lse = lse * (1.0 / ln2)
    neutral(out, lse, both)
    return out, lse


def full_replan(wrapper, qo_indptr, kv_indptr, kv_len, num_heads, head_dim_ckv):
    """A replay that plans each wrapper with flashinfer's full ``plan()`` (the split as it first shipped)."""
    _, _, _, _, _, _, head_dim_kpe, page_size, _, sm_scale = wrapper._plan_args
    wrapper.plan(qo_indptr, kv_indptr, wrapper._kv_indices_buf[: int(kv_indptr[-1])], kv_len, num_heads,
                 head_dim_ckv, head_dim_kpe, page_size, False, sm_scale)


@contextlib.contextmanager
def control(name: str | None):
    """A control breaks one thing on purpose, wherever the split verify lives (the plugin's or the series').
    ``all-ids``: the planner sees one rank of one, so every position is "this rank's" and every id is
    translated ``// N``; ``bottom-right``: the oracle bounds each prefix row with flashinfer's bottom-right causal
    mask on the rank's own keys; ``window-off-by-one``: each draft token's window reaches one position past its
    own (its successor's KV)."""
    import importlib

    saved = []

    def replace(homes, make) -> None:
        for module_name, attr in homes:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            real = getattr(module, attr, None)
            if real is None:
                continue
            setattr(module, attr, make(real))
            saved.append((module, attr, real))

    def one_rank(real):
        def planner(*args, _real=real, **kwargs):
            CURRENT["dcp"] = kwargs["dcp_size"]
            kwargs.update(dcp_size=1, dcp_rank=0)
            return _real(*args, **kwargs)
        return planner

    def translated(real):
        def build(plan, source, req_pool_indices, prefix_out, window_out, meta, *args, _real=real, **kwargs):
            _real(plan, source, req_pool_indices, prefix_out, window_out, meta, *args, **kwargs)
            dcp = CURRENT["dcp"]
            prefix_out[: int(plan.prefix_kv_indptr[-1])] //= dcp
            window_out[: int(plan.window_kv_indptr[-1])] //= dcp
        return build

    def past_own(real):
        def bound(prefix_lens, j, dcp_size, dcp_rank, _real=real):
            return _real(prefix_lens, j + 1, dcp_size, dcp_rank)
        return bound

    try:
        if name == "all-ids":
            replace(PLANNERS, one_rank)
            replace(ID_BUILDERS, translated)
        elif name == "window-off-by-one":
            replace(WINDOW_BOUNDS, past_own)
        elif name == "bottom-right":
            CURRENT["control"] = "bottom-right"
        elif name == "unfused-merge":
            replace(MERGES, lambda real: unfused_merge)
        elif name == "full-replan":
            replace(REPLANS, lambda real: full_replan)
        elif name == "as-shipped":  # the split as it first shipped: both of the above
            replace(MERGES, lambda real: unfused_merge)
            replace(REPLANS, lambda real: full_replan)
        elif name not in (None, "shift-write"):
            raise ValueError(f"unknown control {name!r}; expected one of {', '.join(CONTROLS + COST_CONTROLS)}")
        yield
    finally:
        for module, attr, real in reversed(saved):
            setattr(module, attr, real)
        CURRENT.pop("control", None)


def reference_for(shape: Shape):
    """The batch on one rank (no DCP): the stock verify, which is right there."""
    kv, q = values(shape)
    with harness.on_rank(1, 0) as ops:
        reference, _ = rank_partial(shape, Layout(shape, 1), kv, q, "eager", ops=ops)
    return reference


def run_case(shape: Shape, dcp: int, modes=MODES, *, fix: str = "none", control_name: str | None = None,
             reference=None) -> dict:
    """Per mode: max |error| of the merged verify against one rank, over every rank's heads; or what raised.

    The merge runs once for modes whose partials are equal bit for bit (the graph's replay and the eager plan
    of a correct fix): sglang's merge is a function of the partials alone."""

    kv, q = values(shape)
    reference = reference_for(shape) if reference is None else reference
    held = sum(h + shape.draft_tokens for h in shape.prefixes)  # every position sits on exactly one rank
    results, merged_by = {}, []
    for mode in modes:
        layout = Layout(shape, dcp)
        partials, handed = [], []
        try:
            with fix_in_effect(fix), control(control_name):
                for rank in range(dcp):
                    with harness.on_rank(dcp, rank) as ops, attention_tp(dcp):
                        partials.append(rank_partial(shape, layout, kv, q, mode, ops=ops, handed=handed,
                                                     shift=1 if control_name == "shift-write" else 0))
                merged = next((m for p, m in merged_by if same(p, partials)), None)
                if merged is None:
                    merged = merge(partials)
                    merged_by.append((partials, merged))
        except Exception as exc:  # a verify that raises is a finding
            first = str(exc).splitlines()[0][:200] if str(exc) else ""
            results[mode] = {"outcome": "raises", "detail": f"{type(exc).__name__}: {first}"}
            continue
        per = HEADS // dcp
        error = max(float((merged[r].reshape(-1, per, KV_LORA_RANK) - reference[:, r * per:(r + 1) * per]).abs().max())
                    for r in range(dcp))
        ratio = {"kv_handed": sum(handed), "kv_held": held}
        if not math.isfinite(error):
            results[mode] = {"outcome": "differs", "error": error, "detail": "non-finite output", **ratio}
        else:
            results[mode] = {"outcome": "matches" if error <= TOLERANCE else "differs", "error": error, **ratio}
    return results


def same(a: list, b: list) -> bool:
    import torch

    return len(a) == len(b) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b, strict=True))


@contextlib.contextmanager
def attention_tp(dcp: int):
    """tp N / dcp N, as in #35221's runs: each rank projects HEADS / N heads and the DCP all-gather brings all
    HEADS to every rank (the decode plans heads / attn_tp x attn_dcp)."""
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(attn_tp_size=dcp):
        yield


# ---------------------------------------------------------------- the run


def measure(*, fix: str, control_name: str | None = None, names: list[str] | None = None,
            dcp_sizes=DCP_SIZES, modes=MODES) -> list[dict]:
    out = []
    for shape in SHAPES:
        if names and shape.name not in names:
            continue
        reference = reference_for(shape)
        for dcp in dcp_sizes:
            results = run_case(shape, dcp, modes, fix=fix, control_name=control_name, reference=reference)
            out.extend({"case": shape.name, "dcp": dcp, "mode": mode, **results[mode]} for mode in modes)
    return out


def markdown(rows: list[dict], *, fix: str, control_name: str | None) -> str:
    import importlib

    series = hasattr(importlib.import_module(FMB), "plan_dcp_split_verify")
    tree = f"sglang {release()}" + (" + upstream-next (0012)" if series else "")
    what = "the plugin's hooks" if fix == "plugin" else "the tree's own code"
    what += f", control {control_name}" if control_name else ""
    out = [f"{tree}, {what}:", "", "| case | dcp | outcome | max error (eager, graph) | KV handed / held |",
           "|---|---|---|---|---|"]
    grouped: dict = {}
    for row in rows:
        grouped.setdefault((row["case"], row["dcp"]), []).append(row)
    for (case, dcp), group in grouped.items():
        errors = ", ".join(dict.fromkeys(f"{r['error']:.1e}" if "error" in r else r["detail"] for r in group))
        outcome = "matches" if all(r["outcome"] == "matches" for r in group) else group[0]["outcome"]
        out.append(f"| {case} | {dcp} | {outcome} | {errors} | {ratio_cell(group)} |")
    return "\n".join(out) + "\n"


def pr_markdown(rows: list[dict]) -> str:
    """The PR's table: a row per case, its worst error (eager and graph) at each N, its KV ratio at the widest."""
    by_case: dict = {}
    for row in rows:
        by_case.setdefault(row["case"], {}).setdefault(row["dcp"], []).append(row)
    widest = max(DCP_SIZES)
    out = [f"| case | what it holds | max error, N = {' / '.join(str(n) for n in DCP_SIZES)} | "
           f"KV handed / held, N = {widest} |", "|---|---|---|---|"]
    shapes = {shape.name: shape for shape in SHAPES}
    for case, at in by_case.items():
        errors = []
        for n in DCP_SIZES:
            group = at.get(n, [])
            bad = next((r for r in group if r["outcome"] != "matches"), None)
            errors.append(bad["outcome"] if bad else f"{max(r['error'] for r in group):.1e}")
        out.append(f"| {case} | {shapes[case].what} | {' / '.join(errors)} | {ratio_cell(at.get(widest, []))} |")
    return "\n".join(out) + "\n"


def ratio_cell(group: list[dict]) -> str:
    """KV tokens handed to the kernel over the tokens the ranks hold, per mode run (eager, graph)."""
    cells = [f"{r['kv_handed'] / r['kv_held']:.2f}x" for r in group if r.get("kv_held")]
    return ", ".join(dict.fromkeys(cells)) or "-"


# ---------------------------------------------------------------- the kernel check


def kernel_check(fix: str) -> dict:
    """The carrier's kernel check (the plugin's, or the series' on a tree with 0012) on the oracle and on each
    deliberately broken kernel: called directly, and reached through the backend's first verify under DCP. Per
    kernel: "passes", or the assumption it stops on."""
    import importlib

    import torch

    from emulation.mla.oracle import BROKEN_KERNELS, OracleMLAWrapper

    if fix == "plugin":
        from sglang_dcp_dspark.plugin.kernel_check import check
    else:
        check = importlib.import_module("sglang.srt.layers.dcp.split_verify").check_dcp_verify_kernel
    shape = SHAPES[4]  # short prefixes: empty rows on both sides at dcp 2
    out = {}
    for name, kernel in (("oracle", OracleMLAWrapper), *BROKEN_KERNELS.items()):
        found = {}
        try:
            check(kernel, workspace=None, device="cpu", num_heads=HEADS, head_dim_ckv=KV_LORA_RANK, head_dim_kpe=ROPE,
                  sm_scale=SM_SCALE, q_dtype=torch.float32, kv_dtype=torch.float32)
            found["check"] = "passes"
        except Exception as exc:  # the check's one error type, in either carrier
            found["check"] = f"stops: {getattr(exc, 'assumption', type(exc).__name__)}"
            found["message"] = str(exc)
        CURRENT["kernel"] = name
        try:
            result = run_case(shape, 2, ("eager",), fix=fix)["eager"]
            found["verify"] = "runs" if result["outcome"] == "matches" else result.get("detail", result["outcome"])
        finally:
            CURRENT.pop("kernel", None)
        out[name] = found
    return out


# One layer's verify, one rank, counted: DSPARK and EAGLE, eager at page 1 and a graph replay at page 64.
COST_CASES = (("DSPARK", "eager", "dspark-block7-page1"), ("DSPARK", "graph", "dspark-block7-page64"),
              ("EAGLE", "eager", "eagle-chain4-page1"), ("EAGLE", "graph", "eagle-chain4-page64"))


def verify_cost(fix: str, dcp: int = 8, control_name: str | None = None) -> list[dict]:
    """Per case: what one layer's verify attention launches on rank 0 (``launches``, ``full_passes``, the
    ``kernels`` by name) and, for a graph, which plans its replay makes (``replay_plans``), for stock's verify
    at dcp 1 and for the split at ``dcp`` (with ``control_name`` where given). The layer's forward is the
    backend's: the step's KV write, the attention and the on-rank merge; the DCP all-gather of q and the ranks'
    merge are a DCP decode's too, and are not in it."""
    shapes = {shape.name: shape for shape in SHAPES}
    rows = []
    for algorithm, mode, name in COST_CASES:
        shape = shapes[name]
        kv, q = values(shape)
        for design, width, with_fix, ctl in (("stock", 1, "none", None), ("split", dcp, fix, control_name)):
            cost: dict = {}
            with fix_in_effect(with_fix), control(ctl), harness.on_rank(width, 0) as ops, attention_tp(width):
                rank_partial(shape, Layout(shape, width), kv, q, mode, ops=ops, cost=cost)
            rows.append({"algorithm": algorithm, "mode": mode, "case": name, "design": design, "dcp": width,
                         "control": ctl, **cost})
    return rows


def cost_markdown(rows: list[dict]) -> str:
    out = ["| draft | form | design | launches | full passes | plans at a replay |", "|---|---|---|---|---|---|"]
    for r in rows:
        design = "stock verify, dcp 1" if r["design"] == "stock" else f"split verify, dcp {r['dcp']}"
        if r.get("control"):
            design += f" ({r['control']})"
        plans = ", ".join(r["replay_plans"]) if "replay_plans" in r else "-"
        form = f"{r['mode']}, page {64 if 'page64' in r['case'] else 1}"
        out.append(f"| {r['algorithm']} | {form} | {design} | {r['launches']} | {r['full_passes']} | {plans} |")
    return "\n".join(out) + "\n"


def release() -> str:
    import sglang

    return sglang.__version__


def main(argv: list[str]) -> int:
    os.environ["TRITON_INTERPRET"] = "1"  # before sglang (and Triton) import: sglang's kernels in the interpreter

    harness.prepare()

    def option(name: str, default=None):
        return argv[argv.index(name) + 1] if name in argv else default

    fix = option("--fix", "none")
    names = option("--cases").split(",") if "--cases" in argv else None
    dcp_sizes = tuple(int(x) for x in option("--dcp").split(",")) if "--dcp" in argv else DCP_SIZES
    modes = tuple(option("--modes").split(",")) if "--modes" in argv else MODES
    # Several controls run in one process (one sglang import); "none" is the run without one. --control-cases,
    # --control-dcp and --control-modes narrow the controls' runs only.
    controls = [None if c == "none" else c for c in option("--control").split(",")] if "--control" in argv else [None]
    narrowed = dict(names=option("--control-cases").split(",") if "--control-cases" in argv else names,
                    dcp_sizes=tuple(int(x) for x in option("--control-dcp").split(",")) if "--control-dcp" in argv
                    else dcp_sizes,
                    modes=tuple(option("--control-modes").split(",")) if "--control-modes" in argv else modes)
    if "--cost" in argv or "--cost-markdown" in argv:
        rows = [row for name in controls for row in verify_cost(fix, control_name=name)]
        if "--cost" in argv:
            print(json.dumps({"release": release(), "fix": fix, "rows": rows}))
        else:
            print(cost_markdown(rows), end="")
        return 0
    if "--kernel-check" in argv:
        controls = []
    runs = {name: measure(fix=fix, control_name=name, **(narrowed if name else dict(names=names, dcp_sizes=dcp_sizes,
                                                                                       modes=modes)))
            for name in controls}
    if "--kernel-check" in argv:
        print(json.dumps({"release": release(), "fix": fix, "kernels": kernel_check(fix)}))
        return 0
    if "--json" in argv:
        print(json.dumps({"release": release(), "fix": fix, "runs": {str(k): v for k, v in runs.items()}}))
        return 0
    if "--pr-markdown" in argv:
        print(pr_markdown(runs[None]), end="")
        return 0
    if "--markdown" in argv:  # one row per case and N: the worst error over the modes run, or what raised
        for name, rows in runs.items():
            print(markdown(rows, fix=fix, control_name=name))
        return 0
    for name, rows in runs.items():
        if name is not None:
            print(f"control {name}:")
        for row in rows:
            shown = f"{row['error']:.2e}" if "error" in row else row.get("detail", "")
            held = f"  KV {row['kv_handed'] / row['kv_held']:.2f}x" if row.get("kv_held") else ""
            print(f"{row['case']:24} dcp {row['dcp']} {row['mode']:5} {row['outcome']:8} {shown}{held}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
