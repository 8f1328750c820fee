"""``sglang-dcp-dspark preflight``: will this launch pass sglang's validation, and what will HiCache pin?

Runs sglang's own ``prepare_server_args`` on any machine, without a GPU: the
model is read from its ``config.json`` only, and the handful of torch.cuda
probes that argument resolution asks are answered as the target node would
answer them, for the duration of the call. It resolves the launch twice, as
stock sglang and with this project's plugin hooks, then sizes rank 0's HiCache
host pools with :mod:`sizing` from the resolved arguments.

Exit codes: 0 the launch passes (as it runs with the plugin installed and on),
1 sglang rejects it, 2 bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator
from unittest import mock

from .errors import DcpDsparkError

DEFAULT_MODEL = Path(__file__).parent / "data" / "tiny-mla"
DEFAULT_LAUNCH = ("--tp", "8", "--dcp-size", "8", "--enable-hierarchical-cache", "--speculative-algorithm", "DSPARK")
GIB = 1024**3


@dataclass(frozen=True)
class Node:
    """The target machine, as its torch.cuda probes would describe it."""

    gpus: int = 8
    gpu_memory_gib: float = 141.0
    gpu_name: str = "NVIDIA H200"
    capability: tuple[int, int] = (9, 0)
    host_ram_gib: float | None = None  # None: this machine's available RAM


@dataclass
class Resolution:
    passed: bool
    message: str | None = None
    server_args: object = None
    warnings: list[str] = field(default_factory=list)


def default_launch() -> list[str]:
    model = str(DEFAULT_MODEL)
    return ["--model-path", model, *DEFAULT_LAUNCH, "--speculative-draft-model-path", model]


@contextlib.contextmanager
def emulated_node(node: Node) -> Iterator[None]:
    """Answer the runtime CUDA probes as ``node`` would; only while resolving."""
    props = SimpleNamespace(
        name=node.gpu_name, total_memory=int(node.gpu_memory_gib * GIB), major=node.capability[0],
        minor=node.capability[1], multi_processor_count=132,
    )
    total = int(node.gpu_memory_gib * GIB)
    answers = {
        "is_available": True,
        "device_count": node.gpus,
        "get_device_capability": node.capability,
        "get_device_properties": props,
        "get_device_name": node.gpu_name,
        "mem_get_info": (total, total),
    }
    with contextlib.ExitStack() as stack:
        for name, value in answers.items():
            stack.enter_context(mock.patch(f"torch.cuda.{name}", return_value=value))
        yield


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage().splitlines()[0])


@contextlib.contextmanager
def _quiet_sglang() -> Iterator[_Collect]:
    """sglang logs a lot while resolving; keep its warnings for the report, off the terminal."""
    root = logging.getLogger()
    collect = _Collect()
    saved = root.handlers[:], root.level
    root.handlers[:] = [collect]
    root.setLevel(logging.WARNING)
    try:
        # prepare_server_args forces its own root handler; this call is not a server.
        with mock.patch.object(logging, "basicConfig", lambda **kwargs: None):
            yield collect
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)


def _import_sglang() -> None:
    # Before any probe is patched: these modules decide at import time whether
    # CUDA kernels exist, and must decide "no" on a machine without them.
    import sglang.srt.configs.model_config  # noqa: F401
    import sglang.srt.layers.quantization  # noqa: F401
    import sglang.srt.server_args  # noqa: F401


def _option(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _read_config(path: str | None, flag: str) -> dict:
    if path is None:
        raise DcpDsparkError(f"no {flag} in the launch arguments; expected a local model directory; fix: sglang-dcp-dspark preflight -- {flag} DIR ...")
    config = Path(path) / "config.json"
    if not config.is_file():
        raise DcpDsparkError(f"{flag} {path} has no config.json; preflight reads only the model's config.json, expected DIR/config.json; fix: download it (huggingface-cli download MODEL config.json --local-dir DIR) and pass {flag} DIR")
    try:
        return json.loads(config.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise DcpDsparkError(f"{config} is not valid JSON ({exc}); expected a Hugging Face config.json; fix: download it again") from None


def _parse_launch(argv: list[str]) -> argparse.Namespace:
    """sglang's own parser; its usage errors become one-line, exit-2 errors."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve", add_help=False)
    ServerArgs.add_cli_args(parser)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return parser.parse_args(argv)
    except SystemExit:
        reason = next((ln for ln in reversed(stderr.getvalue().splitlines()) if ln.strip()), "invalid arguments")
        raise DcpDsparkError(f"sglang cannot parse the launch arguments: {reason.removeprefix('sglang serve: ')}; fix: correct the arguments after `--` (see `python -m sglang.launch_server --help`)") from None


def _check_sizes(ns: argparse.Namespace, node: Node, device_rows: int | None) -> None:
    problems = []
    for name in ("tp_size", "dcp_size", "pp_size", "nnodes"):
        value = getattr(ns, name, None)
        if value is not None and value < 1:
            problems.append(f"--{name.replace('_', '-')} {value} (expected >= 1)")
    if getattr(ns, "page_size", None) is not None and ns.page_size < 1:
        problems.append(f"--page-size {ns.page_size} (expected >= 1)")
    if getattr(ns, "hicache_ratio", 1) <= 0:
        problems.append(f"--hicache-ratio {ns.hicache_ratio} (expected > 0)")
    if getattr(ns, "hicache_size", 0) < 0:
        problems.append(f"--hicache-size {ns.hicache_size} (expected >= 0 GB)")
    if node.gpus < 1 or node.gpu_memory_gib <= 0:
        problems.append(f"--gpus {node.gpus} / --gpu-memory-gib {node.gpu_memory_gib} (expected >= 1 and > 0)")
    if device_rows is not None and device_rows < 1:
        problems.append(f"--device-rows {device_rows} (expected >= 1)")
    if problems:
        raise DcpDsparkError(f"nonsense sizes: {', '.join(problems)}; fix: pass positive sizes")


def resolve(argv: list[str], node: Node, *, with_plugin: bool) -> Resolution:
    """sglang's prepare_server_args on the emulated node, with or without the plugin's resolver hook."""
    from sglang.srt.server_args import ServerArgs, prepare_server_args

    from . import plugin

    patch = contextlib.nullcontext()
    if with_plugin and plugin.resolver_verdict().verdict is plugin.Verdict.NEEDS_FIX:
        original = ServerArgs._resolve_hicache_dcp_compatibility
        patch = mock.patch.object(ServerArgs, "_resolve_hicache_dcp_compatibility",
                                  lambda self: plugin.admit_dspark(original, self))
    with _quiet_sglang() as log, emulated_node(node), patch:
        try:
            args = prepare_server_args(list(argv))
        except SystemExit:
            raise DcpDsparkError("sglang exited while parsing the launch arguments; expected a valid launch; fix: correct the arguments after `--`") from None
        except Exception as exc:  # sglang validates with asserts, ValueError, NotImplementedError, ...
            text = " ".join(str(exc).split()) or type(exc).__name__
            return Resolution(False, f"{type(exc).__name__}: {text}", None, log.lines)
    return Resolution(True, None, args, log.lines)


def plugin_enabled() -> bool:
    """Whether sglang's load_plugins() would run this plugin under the current SGLANG_PLUGINS."""
    from .plugin import PLUGIN_NAME

    allowed = os.environ.get("SGLANG_PLUGINS", "")
    names = {x.strip() for x in allowed.split(",") if x.strip()}
    return not names or PLUGIN_NAME in names


def _mla_kv(config: dict, layers: int, dtype: str):
    from .sizing import MLAKV

    if not config.get("kv_lora_rank"):
        return None
    return MLAKV(layers, int(config["kv_lora_rank"]), int(config["qk_rope_head_dim"]), dtype)


def size_pools(args, node: Node, target_config: dict, draft_config: dict | None, device_rows: int | None) -> dict:
    """Rank 0's HiCache host pools for the resolved launch, plus the RAM they need per node."""
    import psutil
    from sglang.srt.mem_cache import kv_cache_builder
    from sglang.srt.mem_cache.pool_host.base import HICACHE_HOST_MEMORY_RESERVE_BYTES

    from . import budget, plugin, sizing

    dtype = sizing.KV_DTYPES.get(str(args.kv_cache_dtype), "bfloat16")
    pp = max(1, args.pp_size)
    target_kv = _mla_kv(target_config, math.ceil(int(target_config["num_hidden_layers"]) / pp), dtype)
    if target_kv is None:
        return {"skipped": "the target model is not MLA (no kv_lora_rank); HiCache under DCP needs MLA"}
    draft_kv = None
    if args.speculative_algorithm and draft_config is not None:
        draft_kv = _mla_kv(draft_config, int(draft_config["num_hidden_layers"]), dtype)
    dcp = max(1, args.dcp_size)
    if device_rows is not None:
        rows_note = "given with --device-rows"
    else:
        # An upper bound: sglang measures free memory after loading weights,
        # which preflight does not do. Replicated draft rows count dcp times.
        import torch

        per_row = target_kv.layers + (dcp * draft_kv.layers if draft_kv else 0)
        per_row *= (target_kv.kv_lora_rank + target_kv.qk_rope_head_dim) * getattr(torch, dtype).itemsize
        device_rows = int(args.mem_fraction_static * node.gpu_memory_gib * GIB // per_row)
        rows_note = (f"estimate: mem_fraction_static {args.mem_fraction_static} x {node.gpu_memory_gib:g} GiB, "
                     "weights not subtracted (an upper bound); pass --device-rows for the real figure")
    stock = kv_cache_builder.maybe_register_hicache_draft
    fixed = stock
    if plugin.registration_verdict(stock).verdict is plugin.Verdict.NEEDS_FIX:
        fixed = functools.partial(plugin.size_draft_from_logical, stock)
    with _quiet_sglang():
        result = sizing.measure(
            target_kv, draft_kv, dcp_size=dcp, device_rows=device_rows, page_size=args.page_size or 1,
            hicache_ratio=args.hicache_ratio, hicache_size_gb=args.hicache_size, layout=args.hicache_mem_layout,
            register_stock=stock if draft_kv else None, register_fixed=fixed if draft_kv else None,
        )
    split = None
    if args.hicache_size and result.draft_fixed is not None and not budget.unbudgeted():
        # As the plugin (and the series' patch 0004) run it: the target gets
        # its share of --hicache-size and the draft follows the target.
        split = sizing.BudgetSplit(
            int(args.hicache_size * 1e9), result.target.bytes_per_token, result.draft_fixed.bytes_per_token,
            dcp, result.target.page_size,
        )
        unbudgeted_rank = result.target.bytes + result.draft_fixed.bytes
        with _quiet_sglang():
            result = sizing.measure(
                target_kv, draft_kv, dcp_size=dcp, device_rows=device_rows, page_size=args.page_size or 1,
                hicache_ratio=args.hicache_ratio, hicache_size_gb=split.target_budget_bytes / 1e9,
                layout=args.hicache_mem_layout, register_stock=stock, register_fixed=fixed,
            )
    ranks_per_node = max(1, (args.tp_size * pp) // max(1, args.nnodes))
    draft = result.draft_fixed
    need_rank = result.target.bytes + (draft.bytes if draft else 0)
    if split is not None:
        budget_rank = int(args.hicache_size * 1e9)
        budget_from = (f"--hicache-size {args.hicache_size:g} GB, target + draft: {split.target_share:.1%} to the target "
                       f"(unbudgeted, as sglang 0.5.18+ or {budget.UNBUDGETED_ENV}=1: {_gib(unbudgeted_rank)} per rank)")
    elif args.hicache_size:
        budget_rank, budget_from = int(args.hicache_size * 1e9), f"--hicache-size {args.hicache_size:g} GB (target pool only)"
    else:
        budget_rank, budget_from = result.target.bytes, f"--hicache-ratio {args.hicache_ratio:g} (target pool only)"
    if node.host_ram_gib is not None:
        available, available_from = int(node.host_ram_gib * GIB), "--host-ram-gib"
    else:
        available, available_from = int(psutil.virtual_memory().available), "this machine, available now"
    usable = available - HICACHE_HOST_MEMORY_RESERVE_BYTES
    # The plugin's start-up check (budget.fit_hicache_size): host pools that
    # mirror the device pool once must fit this rank's share of free RAM.
    draft_bpt = draft.bytes_per_token if draft else 0
    smallest_rank = device_rows * (result.target.bytes_per_token + dcp * draft_bpt)
    share_rank = max(0, usable) // ranks_per_node
    return {
        "geometry": result.as_dict(),
        "device_rows_note": rows_note,
        "target_kv": vars(target_kv),
        "draft_kv": vars(draft_kv) if draft_kv else None,
        "ranks_per_node": ranks_per_node,
        "host_ram": {
            "needed_per_rank": need_rank,
            "needed_per_node": need_rank * ranks_per_node,
            "budget_per_rank": budget_rank,
            "budget_from": budget_from,
            "target_share": None if split is None else split.target_share,
            "target_share_without_dcp": None if split is None else split.share_without_dcp,
            "over_budget_per_rank": max(0, need_rank - budget_rank),
            "available": available,
            "available_from": available_from,
            "reserve": HICACHE_HOST_MEMORY_RESERVE_BYTES,
            "fits": need_rank * ranks_per_node <= usable,
            "smallest_per_rank": smallest_rank,
            "share_per_rank": share_rank,
            "starts": draft is None or smallest_rank <= share_rank,
        },
    }


def run(launch: list[str], node: Node, device_rows: int | None = None) -> dict:
    launch = list(launch) or default_launch()
    target_config = _read_config(_option(launch, "--model-path") or _option(launch, "--model"), "--model-path")
    draft_path = _option(launch, "--speculative-draft-model-path")
    draft_config = _read_config(draft_path, "--speculative-draft-model-path") if draft_path else None
    _import_sglang()
    _check_sizes(_parse_launch(launch), node, device_rows)

    from . import plugin

    stock = resolve(launch, node, with_plugin=False)
    fixed = resolve(launch, node, with_plugin=True)
    enabled = plugin_enabled()
    as_run = fixed if enabled else stock
    report = {
        "launch": launch,
        "node": vars(node) | {"capability": list(node.capability)},
        "plugin": {"enabled": enabled, "resolver": plugin.resolver_verdict().detail},
        "stock": {"passed": stock.passed, "message": stock.message},
        "with_plugin": {"passed": fixed.passed, "message": fixed.message},
        "passed": as_run.passed,
        "message": as_run.message,
        "sglang_warnings": as_run.warnings,
    }
    if as_run.passed:
        report["sizing"] = size_pools(as_run.server_args, node, target_config, draft_config, device_rows)
    return report


def _gib(n: int) -> str:
    return f"{n / GIB:,.2f} GiB"


def render(report: dict) -> str:
    out = []
    verdict = "PASSES" if report["passed"] else "REJECTED"
    plugin_state = "on" if report["plugin"]["enabled"] else "off (SGLANG_PLUGINS)"
    out.append(f"launch {verdict} sglang's validation (as run with the dcp_dspark plugin {plugin_state})")
    for label, key in (("stock sglang", "stock"), ("with plugin", "with_plugin")):
        r = report[key]
        out.append(f"  {label:<13} {'passes' if r['passed'] else 'rejected: ' + r['message']}")
    sizing = report.get("sizing")
    if not sizing:
        return "\n".join(out)
    if "skipped" in sizing:
        out.append(f"  host pools: {sizing['skipped']}")
        return "\n".join(out)
    g = sizing["geometry"]
    out.append("")
    out.append(f"DCP geometry (rank 0 of {g['dcp_size']}):")
    out.append(f"  page size       {g['page_size']} physical, {g['logical_page_size']} logical")
    out.append(f"  device rows     {g['device_rows']:,} physical per rank ({sizing['device_rows_note']})")
    out.append(f"  target host     {g['target']['rows']:,} physical rows, {g['target']['logical_slots']:,} logical slots")
    out.append("")
    out.append(f"  {'host pool':<22} {'rows/rank':>13} {'B/token':>8} {'pinned/rank':>14} {'pinned/node':>14} {'coverage':>9}")
    n = sizing["ranks_per_node"]
    rows = [("target", g["target"], None), ("draft, stock sizing", g["draft_stock"], g["coverage_stock"]),
            ("draft, with fix", g["draft_fixed"], g["coverage_fixed"])]
    for name, pool, cov in rows:
        if pool is None:
            continue
        cov_text = "" if cov is None else f"{cov:.3f}"
        out.append(f"  {name:<22} {pool['rows']:>13,} {pool['bytes_per_token']:>8,} {_gib(pool['bytes']):>14} {_gib(pool['bytes'] * n):>14} {cov_text:>9}")
    ram = sizing["host_ram"]
    out.append("")
    out.append(f"Host RAM ({n} ranks per node, target + draft with fix):")
    out.append(f"  needed          {_gib(ram['needed_per_rank'])} per rank, {_gib(ram['needed_per_node'])} per node")
    over = f", {_gib(ram['over_budget_per_rank'])} over it per rank (the draft pool is not counted in it)" if ram["over_budget_per_rank"] else ""
    if ram.get("target_share") is not None:
        out.append(f"  budget split    target {ram['target_share']:.1%}, draft {1 - ram['target_share']:.1%} "
                   f"(PR #35875's split, without the dcp factor, would give the target {ram['target_share_without_dcp']:.1%})")
    out.append(f"  budget          {_gib(ram['budget_per_rank'])} per rank from {ram['budget_from']}{over}")
    fits = "fits" if ram["fits"] else "does NOT fit"
    out.append(f"  available       {_gib(ram['available'])} ({ram['available_from']}) less sglang's {_gib(ram['reserve'])} reserve: {fits}")
    if not ram["starts"]:
        out.append(f"  startup         STOPS with the plugin: host pools that mirror the device pool once need "
                   f"{_gib(ram['smallest_per_rank'])} per rank, more than its {_gib(ram['share_per_rank'])} share of free RAM")
    return "\n".join(out)


def main(args: argparse.Namespace) -> int:
    launch = list(args.launch or [])
    if launch[:1] == ["--"]:
        launch = launch[1:]
    node = Node(gpus=args.gpus, gpu_memory_gib=args.gpu_memory_gib, gpu_name=args.gpu_name, host_ram_gib=args.host_ram_gib)
    report = run(launch, node, device_rows=args.device_rows)
    print(json.dumps(report, indent=2, default=str) if args.json else render(report))
    return 0 if report["passed"] else 1


def add_parser(sub) -> None:
    p = sub.add_parser(
        "preflight",
        help="will this launch pass sglang's validation, and how much pinned host memory will HiCache take (no GPU needed)",
        description="Runs sglang's own argument resolution on an emulated GPU node; with no launch arguments, "
                    "the embedded tiny MLA model with " + " ".join(DEFAULT_LAUNCH) + ".",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--gpus", type=int, default=Node.gpus, metavar="N", help=f"GPUs on the target node (default {Node.gpus})")
    p.add_argument("--gpu-memory-gib", type=float, default=Node.gpu_memory_gib, metavar="GIB", help=f"memory per GPU (default {Node.gpu_memory_gib:g})")
    p.add_argument("--gpu-name", default=Node.gpu_name, metavar="NAME")
    p.add_argument("--host-ram-gib", type=float, metavar="GIB", help="host RAM of the target node (default: what this machine has available)")
    p.add_argument("--device-rows", type=int, metavar="N", help="target device KV rows per rank (sglang logs max_total_num_tokens; default: an upper-bound estimate)")
    p.add_argument("launch", nargs=argparse.REMAINDER, help="-- followed by the sglang launch arguments")
    p.set_defaults(func=main)
