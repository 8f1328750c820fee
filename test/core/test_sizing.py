"""The sizing model: host-pool rows and bytes read off sglang's own pool classes at full size, unallocated."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import hostpool
from sglang_dcp_dspark.core import sizing
from sglang_dcp_dspark.plugin.hooks import kv_cache_builder as kv_cache_hooks
from trees import load_bench

bench = load_bench("host_memory")  # the bench builds its pools with the package's meta device and pool builder

TARGET = sizing.MLAKV(layers=2, kv_lora_rank=512, qk_rope_head_dim=64)
DRAFT = sizing.MLAKV(layers=1, kv_lora_rank=512, qk_rope_head_dim=64)


@pytest.fixture(scope="module")
def registrations():
    from sglang.srt.mem_cache import kv_cache_builder

    stock = inspect.unwrap(kv_cache_builder.maybe_register_hicache_draft)
    return stock, kv_cache_hooks.fixed_registration(stock)


@pytest.mark.parametrize("dcp,page,layout", [(1, 64, "layer_first"), (2, 64, "layer_first"), (8, 64, "layer_first"),
                                              (8, 1, "layer_first"), (8, 64, "page_first")])
def test_matches_pools_built_for_real(registrations, dcp, page, layout):
    """The same geometry built with real CPU buffers and bookkeeping (hostpool) gives the same rows, slots and bytes.

    Page 1 is what sglang 0.5.17 resolves for the embedded launch; page_first is another buffer shape.
    """
    stock, fixed = registrations
    g = hostpool.Geometry(dcp, layout, page_size=page)
    measured = bench.measure(
        sizing.MLAKV(g.target_layers, g.kv_lora_rank, g.qk_rope_head_dim),
        sizing.MLAKV(g.draft_layers, g.kv_lora_rank, g.qk_rope_head_dim),
        dcp_size=dcp, device_rows=g.device_rows, page_size=g.page_size, hicache_ratio=g.host_ratio, layout=layout,
        register_stock=stock, register_fixed=fixed,
    )
    for register, draft in ((stock, measured.draft_stock), (fixed, measured.draft_fixed)):
        real = hostpool.build_pools(g, register=register)
        assert measured.target == sizing.HostPoolSize.of(real.target_host_pool)
        assert measured.target.logical_slots == real.target_host_pool.logical_size == len(real.target_host_pool.free_slots)
        assert draft == sizing.HostPoolSize.of(real.draft_host_pool)


def test_full_scale_costs_no_memory_and_shows_the_defect(registrations):
    stock, fixed = registrations
    # 400k rows x 61 layers: ~56 GB of target host pool per rank if it were allocated.
    m = bench.measure(sizing.MLAKV(61, 512, 64), DRAFT, dcp_size=8, device_rows=400_000, page_size=64,
                       hicache_ratio=2.0, register_stock=stock, register_fixed=fixed)
    assert m.target.bytes == m.target.rows * m.target.bytes_per_token > 50e9
    assert m.target.logical_slots == 8 * m.target.rows
    assert m.coverage(m.draft_stock) < 0.2
    assert m.coverage(m.draft_fixed) >= 1.0


def test_hicache_size_sets_target_rows(registrations):
    stock, fixed = registrations
    m = bench.measure(TARGET, None, dcp_size=2, device_rows=4096, page_size=64, hicache_ratio=2.0, hicache_size_gb=1)
    # sglang rounds the row count up past the next page boundary.
    page_bytes = m.target.bytes_per_token * m.target.page_size
    assert 1e9 <= m.target.bytes <= 1e9 + page_bytes
    assert m.draft_stock is None and m.draft_fixed is None


class _RealTensors(TorchDispatchMode):
    """Counts the bytes of every tensor an aten op returns that is not on the meta device."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self.bytes += t.nbytes
                self.largest = max(self.largest, t.nbytes)
        return out


def test_sizing_builds_no_per_slot_tensor(registrations):
    """sglang's host pools build their bookkeeping (free-slot list, slot states) per logical slot: on meta here.

    At 100k device rows and dcp 8 the target alone addresses 1.6M logical slots,
    so a real free-slot list is 12.8 MB; the whole measurement may build a few
    real scalars, nothing that grows with the launch.
    """
    stock, fixed = registrations
    with _RealTensors() as real:
        m = bench.measure(TARGET, DRAFT, dcp_size=8, device_rows=100_000, page_size=1, hicache_ratio=2.0,
                           register_stock=stock, register_fixed=fixed)
    assert m.target.logical_slots > 1_000_000
    assert real.largest < 1024, f"{real.largest} bytes in one real tensor: per-slot bookkeeping was materialised"
    assert real.bytes < 64 * 1024
