"""What a judged launch pins: rank 0's device rows and host pools, as the launch runs them and as stock sglang
would build them, the chart's setups, and the node's RAM (:mod:`hostram`).

The pools are the release's own (:meth:`releases.Release.build`, on the meta
device); here they are only counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core import rules
from ..core.errors import DcpDsparkError
from . import hostram, result
from . import launch as launch_mod
from . import models as models_mod
from .inputs import Configs
from .launch import GIB, Node
from .models import kv_fields


def device_bytes_per_row(models, dcp: int) -> int:
    """GPU bytes per target device row: the target's KV (and DSA index), plus dcp draft rows (the draft spans the logical locs)."""
    import torch

    def row(kv) -> int:
        width = kv.kv_lora_rank + kv.qk_rope_head_dim if kv.kind == "mla" else kv.head_num * (kv.head_dim + kv.v_head_dim)
        return kv.layers * width * getattr(torch, kv.dtype).itemsize

    index = models.target.layers * (models.dsa_index_head_dim + models.dsa_index_head_dim // 128 * 4) if models.dsa_index_head_dim else 0
    return row(models.target) + index + (dcp * row(models.draft) if models.draft else 0)


def available(node: Node) -> tuple[int, str]:
    """The node's host RAM in bytes, and where the figure comes from."""
    if node.host_ram_gib is not None:
        return int(node.host_ram_gib * GIB), node.host_ram_from
    import psutil

    return int(psutil.virtual_memory().available), "this machine, available now"


@dataclass(frozen=True)
class DeviceRows:
    """Target device rows per rank: given, or an upper-bound estimate; and the most one GPU holds."""

    rows: int
    note: str
    estimated: bool
    most: int


def device_rows(la, models, node: Node, given: int | None) -> DeviceRows:
    per_row = device_bytes_per_row(models, la.dcp_size)
    most = int(node.gpu_memory_gib * GIB // per_row)
    if given is not None:
        if given > most:
            raise DcpDsparkError(f"--device-rows {given:,} needs {given * per_row / GIB:,.1f} GiB of KV per GPU at {per_row:,} bytes per row, more than --gpu-memory-gib {node.gpu_memory_gib:g}; expected at most {most:,}; fix: pass --device-rows N with N the max_total_num_tokens sglang logs for this launch")
        return DeviceRows(given, "given with --device-rows", False, most)
    # An upper bound: sglang measures free memory after loading weights, which preflight does not do.
    mfs = la.mem_fraction_static if la.mem_fraction_static is not None else 0.88
    rows = max(1, int(mfs * node.gpu_memory_gib * GIB // per_row))
    return DeviceRows(rows, (f"estimate: mem_fraction_static {mfs} x {node.gpu_memory_gib:g} GiB, weights not "
                             "subtracted (an upper bound); pass --device-rows for the real figure"), True, most)


def check_device_rows(configs: Configs, node: Node, device_rows: int) -> None:
    """--device-rows against the GPU's memory where no resolution got far enough to size a row: a row is at least
    its target layers' latent (or K and V heads) at one byte a value, which bounds the rows a GPU can hold."""
    config = configs.target
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    layers = int(text.get("num_hidden_layers") or 1)
    if models_mod.is_mla_config(config):
        width = int(text.get("kv_lora_rank") or 0) + int(text.get("qk_rope_head_dim") or 0)
    else:
        heads = int(text.get("num_key_value_heads") or text.get("num_attention_heads") or 1)
        width = 2 * heads * int(text.get("head_dim") or (int(text.get("hidden_size") or 0)
                                                          // max(1, int(text.get("num_attention_heads") or 1))))
    least = max(1, layers * max(1, width))
    most = int(node.gpu_memory_gib * GIB // least)
    if device_rows > most:
        raise DcpDsparkError(f"--device-rows {device_rows:,} needs at least {device_rows * least / GIB:,.1f} GiB of KV "
                             f"per GPU (a row is at least {least:,} bytes), more than --gpu-memory-gib "
                             f"{node.gpu_memory_gib:g}; expected at most {most:,}; fix: pass --device-rows N with N the "
                             "max_total_num_tokens sglang logs for this launch")


def _same(a, b) -> bool:
    return a is b or ([p.size for p in a.pools] == [p.size for p in b.pools] and a.startup_error == b.startup_error)


def size_pools(release, la, models, node: Node, device_rows_given: int | None, *, plugin_on: bool, stock_la=None,
               variants: bool = False, stock_passed: bool = True) -> result.Sizing | result.NoPools:
    """Rank 0's host pools as the launch runs them, and as stock sglang would build them, with the RAM they need."""
    from sglang.srt.mem_cache.pool_host.base import HICACHE_HOST_MEMORY_RESERVE_BYTES

    if not la.enable_hierarchical_cache:
        return result.NoPools("HiCache is off (no --enable-hierarchical-cache): no host pools to size")
    device = device_rows(la, models, node, device_rows_given)
    rows = device.rows
    ram_bytes, ram_from = available(node)
    ranks = rules.ranks_per_node(la.tp_size, la.pp_size, la.nnodes)
    with launch_mod.quiet_sglang():
        # The draft backup the launch names (--hicache-draft-backup, upstream-next 0005), where the tree has it.
        built = release.build(la, models, rows, hooked=plugin_on, host_ram=ram_bytes, backup=la.hicache_draft_backup)
        stock = (release.build(stock_la or la, models, rows, hooked=False, host_ram=ram_bytes,
                               backup=(stock_la or la).hicache_draft_backup) if plugin_on else built)
        backups = {}
        if la.hicache_draft_backup is not None and models.draft is not None:
            # A tree with upstream-next's --hicache-draft-backup: both modes, side by side.
            for mode in ("replicated", "sharded"):
                other = built if mode == la.hicache_draft_backup else release.build(la, models, rows, hooked=plugin_on,
                                                                                       host_ram=ram_bytes, backup=mode)
                backups[mode] = result.Backup(result.Pool.of(other, ranks), other.bytes, other.bytes * ranks,
                                              other.target.logical_slots if other.target else None, other.startup_error)
        chart = (setups(release, la, models, rows, ram_bytes, ranks, plugin_on, built, stock, backups, stock_passed)
                 if variants else None)
    ram = hostram.judge(built, ranks_per_node=ranks, available=ram_bytes, available_from=ram_from,
                        reserve=HICACHE_HOST_MEMORY_RESERVE_BYTES, hicache_size_gb=la.hicache_size, device_rows=rows)
    stock_cov = None
    if stock.target is not None and stock.draft is not None and stock.draft_plan != "PACKED":
        stock_cov = rules.coverage(stock.draft.logical_slots, stock.target.logical_slots)
    # The stock figures are left out where stock sglang builds exactly what runs (nothing of the plugin's applies).
    same = _same(stock, built)
    return result.Sizing(
        device_rows=rows, device_rows_note=device.note, device_rows_estimated=device.estimated,
        device_rows_max=device.most,
        dcp_size=la.dcp_size, page_size=la.page_size, logical_page_size=la.logical_page_size,
        target_kv=kv_fields(models.target), draft_kv=kv_fields(models.draft),
        draft_architecture=models.draft_architecture, ranks_per_node=ranks,
        draft_plan=built.draft_plan, draft_path=built.draft_path,
        hicache_ratio=built.hicache_ratio, auto_sized_from=built.auto_sized_from,
        target_hicache_size=built.target_hicache_size,
        pools=result.Pool.of(built, ranks),
        stock_pools=None if same else result.Pool.of(stock, ranks),
        stock_startup_error=None if same else stock.startup_error,
        draft_coverage=ram.coverage, draft_coverage_stock=stock_cov,
        backups=backups or None, variants=chart, host_ram=ram,
    )


def setups(release, la, models, rows, ram_bytes, ranks, plugin_on, built, stock, backups,
           stock_passed: bool = True) -> dict | None:
    """Pinned bytes per node of the chart's four setups (report.SETUPS), each from the release's classes where it has them."""
    from ..core.budget import unbudgeted_sizing

    if models.draft is None:
        return None
    classes = f"sglang {release.version}'s classes"

    def entry(b, source=classes):
        return result.Setup(b.bytes * ranks if b.pools else None, source, b.startup_error)

    with unbudgeted_sizing():
        unbudgeted = release.build(la, models, rows, hooked=plugin_on, host_ram=ram_bytes)
    # Stock sglang pins nothing where it rejects the launch: no stock point there.
    stock_entry = entry(stock) if stock_passed else result.Setup(None, "stock sglang rejects the launch", None)
    out = {"stock": stock_entry, "0.5.18+": entry(unbudgeted), "budgeted": entry(built)}
    if "sharded" in backups:
        out["sharded"] = result.Setup(backups["sharded"].per_node, classes, backups["sharded"].startup_error)
    elif unbudgeted.target is not None and unbudgeted.draft is not None:
        # A model of patches/upstream-next 0005-0006 where the tree does not carry them: each rank keeps
        # one DCP stripe of the draft, one draft row per target row; --hicache-size splits t / (t + d).
        t, d = unbudgeted.target, unbudgeted.draft
        per_rank = rules.sharded_backup_bytes_per_rank(
            target_rows=t.rows, target_bytes_per_token=t.bytes_per_token, draft_bytes_per_token=d.bytes_per_token,
            page_size=t.page_size, extra_bytes=sum(p.size.bytes for p in unbudgeted.pools if p.role == "extra"),
            hicache_size_gb=la.hicache_size)
        out["sharded"] = result.Setup(per_rank * ranks, "model: one draft stripe per rank (upstream-next 0005-0006)", None)
    return out
