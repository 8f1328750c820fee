"""``sglang-dcp-dspark preflight``: will this launch pass sglang's validation, start, and what will HiCache pin?

Runs sglang's own ``prepare_server_args`` on any machine, without a GPU: the
model is read from its ``config.json`` only, and the handful of torch.cuda
probes that argument resolution asks are answered as the target node would
answer them, for the duration of the call. It resolves the launch twice, as
stock sglang and with this project's plugin hooks, then sizes rank 0's HiCache
host pools with :mod:`sizing` from the resolved arguments.

The exit code is the verdict on the launch as it will run (with the plugin
when sglang's ``load_plugins`` would run it, see :mod:`switch`):

- 0: it passes sglang's validation and will start;
- 1: sglang rejects it;
- 2: bad input (preflight's own options, the launch arguments or a config.json);
- 3: it passes validation but will stop at startup: its host pools do not fit
  the node's RAM, the plugin's start-up check refuses it, or the draft host
  pool is short of the target's logical slots.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import math
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

from . import rules
from .errors import DcpDsparkError

# The embedded default launch (make demo): DeepSeek-V3 with a one-layer MLA
# DSPARK draft (architecture fields only, see data/README.md) at DCP8 +
# HiCache on an 8 x H200 node.
DATA = Path(__file__).parent / "data"
DEFAULT_MODEL = DATA / "deepseek-v3"
DEFAULT_DRAFT = DATA / "deepseek-v3-dspark-draft"
DEFAULT_LAUNCH = ("--tp", "8", "--dcp-size", "8", "--enable-hierarchical-cache", "--speculative-algorithm", "DSPARK")
GIB = 1024**3
# The default launch's device rows per rank, as sglang would log them
# (max_total_num_tokens): DeepSeek-V3's FP8 weights take about 80 GiB of each
# H200 at --tp 8, which leaves about 40 GiB of sglang's 0.88 x 141 GiB for KV;
# a row is 79,488 bytes there (61 target layers plus 8 replicated rows of the
# draft's one layer, 576 bf16 values each), so about 540,000 rows.
DEFAULT_DEVICE_ROWS = 540_000
DEFAULT_DEVICE_ROWS_NOTE = ("the default launch's figure: about 40 GiB of KV per H200 after DeepSeek-V3's "
                            "FP8 weights; pass --device-rows for a measured one")

# Exit codes: the verdict on the launch as it will run.
PASSES, REJECTED, BAD_INPUT, STOPS = 0, 1, 2, 3
OUTCOMES = {PASSES: "PASSES", REJECTED: "REJECTED", BAD_INPUT: "BAD INPUT", STOPS: "STOPS AT STARTUP"}

# What a real node can have. Past these a number is a typo, and preflight would
# emulate a machine that cannot exist (or overflow the sizes it builds).
MAX_GPUS = 64  # per node; HGX boards hold 8, the largest single systems 16
MAX_GPU_MEMORY_GIB = 1024.0  # per GPU; the largest parts today have 288 GB
MAX_HOST_RAM_GIB = 64 * 1024.0  # per node; the largest single-system servers hold 32 TiB
MAX_PAGE_SIZE = 1 << 20
MAX_HICACHE_RATIO = 1000.0  # sglang's default is 2
MLA_FIELDS = ("kv_lora_rank", "qk_rope_head_dim", "num_hidden_layers")
FIX_PREFLIGHT = "sglang-dcp-dspark preflight [options] -- <sglang launch args>"


@dataclass(frozen=True)
class Node:
    """The target machine, as its torch.cuda probes would describe it."""

    gpus: int = 8
    gpu_memory_gib: float = 141.0
    gpu_name: str = "NVIDIA H200"
    capability: tuple[int, int] = (9, 0)
    # 8 x H200 with 2 TiB of host RAM is a DGX H200. The default describes the
    # emulated node, like the GPU defaults: the machine preflight runs on is
    # usually not the one the launch is for. None: this machine's available RAM.
    host_ram_gib: float | None = 2048.0
    host_ram_from: str = "the emulated node's default"


@dataclass
class Resolution:
    passed: bool
    message: str | None = None
    server_args: object = None
    warnings: list[str] = field(default_factory=list)


def default_launch() -> list[str]:
    return ["--model-path", str(DEFAULT_MODEL), *DEFAULT_LAUNCH, "--speculative-draft-model-path", str(DEFAULT_DRAFT)]


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
    with warnings.catch_warnings():
        # On a machine without CUDA, sglang's kernel and quantization modules
        # warn at import that their CUDA paths are off (AWQ, GGUF, Triton). That
        # describes this machine, not the emulated node, so only sglang's own
        # UserWarnings are dropped, and only during this import.
        warnings.filterwarnings("ignore", category=UserWarning, module=r"sglang(\.|$)")
        # Before any probe is patched: these modules decide at import time whether
        # CUDA kernels exist, and must decide "no" on a machine without them.
        import sglang.srt.configs.model_config
        import sglang.srt.layers.quantization
        import sglang.srt.server_args  # noqa: F401


def _option(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _read_config(path: str | None, flag: str) -> dict:
    if path is None:
        raise DcpDsparkError(f"no {flag} in the launch arguments; expected a local model directory; fix: sglang-dcp-dspark preflight -- {flag} DIR ...")
    config = Path(path) / "config.json"
    if not config.is_file():
        raise DcpDsparkError(f"{flag} {path} has no config.json; preflight reads only the model's config.json, expected DIR/config.json; fix: download it (huggingface-cli download MODEL config.json --local-dir DIR) and pass {flag} DIR")
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:  # UnicodeDecodeError is a ValueError
        reason = " ".join(str(exc).split())
        raise DcpDsparkError(f"{config} is not readable JSON ({reason}); expected a Hugging Face config.json; fix: download it again (huggingface-cli download MODEL config.json --local-dir {path})") from None
    if not isinstance(data, dict):
        raise DcpDsparkError(f"{config} holds a JSON {type(data).__name__}, not an object; expected a Hugging Face config.json; fix: download it again (huggingface-cli download MODEL config.json --local-dir {path})")
    # A config that names any MLA field is an MLA model to preflight, and its
    # host pools are sized from all three; a partial one would size nothing.
    if any(name in data for name in MLA_FIELDS[:2]):
        bad = [f"{name}={data.get(name, 'missing')!r}" for name in MLA_FIELDS if not _positive_int(data.get(name))]
        if bad:
            raise DcpDsparkError(f"{config} is an MLA config with {', '.join(bad)}; expected positive integers for {', '.join(MLA_FIELDS)}; fix: download the model's own config.json again (huggingface-cli download MODEL config.json --local-dir {path})")
    return data


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


def _in_range(value: float | None, low: float, high: float, *, low_open: bool = False) -> bool:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return (value > low if low_open else value >= low) and value <= high


def check_node(node: Node, device_rows: int | None) -> None:
    """preflight's own numbers: finite, positive, and what one real node could have."""
    problems = []
    if not _in_range(node.gpus, 1, MAX_GPUS):
        problems.append(f"--gpus {node.gpus} (expected 1 to {MAX_GPUS})")
    if not _in_range(node.gpu_memory_gib, 0, MAX_GPU_MEMORY_GIB, low_open=True):
        problems.append(f"--gpu-memory-gib {node.gpu_memory_gib} (expected a finite number above 0, at most {MAX_GPU_MEMORY_GIB:g})")
    if node.host_ram_gib is not None and not _in_range(node.host_ram_gib, 0, MAX_HOST_RAM_GIB, low_open=True):
        problems.append(f"--host-ram-gib {node.host_ram_gib} (expected a finite number above 0, at most {MAX_HOST_RAM_GIB:g}, or 'local')")
    if device_rows is not None and device_rows < 1:
        problems.append(f"--device-rows {device_rows} (expected >= 1)")
    if problems:
        raise DcpDsparkError(f"out-of-range numbers: {', '.join(problems)}; fix: {FIX_PREFLIGHT} with numbers in range")


def check_launch(ns: argparse.Namespace, node: Node) -> None:
    """The launch's numbers, and the parallel layout sglang needs but does not check at argument time."""
    problems = []
    for name in ("tp_size", "dcp_size", "pp_size", "nnodes"):
        value = getattr(ns, name, None)
        if value is not None and value < 1:
            problems.append(f"--{name.replace('_', '-')} {value} (expected >= 1)")
    if getattr(ns, "page_size", None) is not None and not _in_range(ns.page_size, 1, MAX_PAGE_SIZE):
        problems.append(f"--page-size {ns.page_size} (expected 1 to {MAX_PAGE_SIZE})")
    if not _in_range(getattr(ns, "hicache_ratio", 2.0), 0, MAX_HICACHE_RATIO, low_open=True):
        problems.append(f"--hicache-ratio {ns.hicache_ratio} (expected a finite number above 0, at most {MAX_HICACHE_RATIO:g})")
    max_hicache_gb = MAX_HOST_RAM_GIB * GIB / 1e9
    if not _in_range(getattr(ns, "hicache_size", 0), 0, max_hicache_gb):
        problems.append(f"--hicache-size {ns.hicache_size} (expected 0 to {max_hicache_gb:.0f} GB per rank)")
    mfs = getattr(ns, "mem_fraction_static", None)
    if mfs is not None and not _in_range(mfs, 0, 1, low_open=True):
        problems.append(f"--mem-fraction-static {mfs} (expected a finite number above 0, at most 1)")
    if problems:
        raise DcpDsparkError(f"out-of-range numbers in the launch: {', '.join(problems)}; fix: correct them after `--` in {FIX_PREFLIGHT}")
    tp, dcp, pp, nnodes = ns.tp_size, ns.dcp_size, ns.pp_size, ns.nnodes
    if dcp > 1 and tp % dcp:
        # sglang 0.5.17 does not check this at argument time, but its DCP groups
        # are consecutive slices of dcp_size ranks of each TP group, and each
        # rank takes dcp_rank = tp_rank % dcp_size (parallel_state,
        # model_runner): a dcp_size that does not divide tp leaves a short
        # group whose ranks believe in slots that no rank stores.
        divisors = [d for d in range(1, tp + 1) if tp % d == 0]
        raise DcpDsparkError(f"--dcp-size {dcp} does not divide --tp {tp}; sglang builds its DCP groups from slices of dcp_size ranks of each TP group, so expected one of {divisors}; fix: pass --dcp-size {max(d for d in divisors if d <= dcp)} (or a --tp that is a multiple of {dcp})")
    ranks_per_node = rules.most_ranks_on_a_node(tp, pp, nnodes)
    if ranks_per_node > node.gpus:
        fix = f"pass --nnodes {rules.nodes_needed(tp, pp, node.gpus)} after `--`"
        if ranks_per_node <= MAX_GPUS:
            fix += f", or --gpus {ranks_per_node} if the node has that many"
        raise DcpDsparkError(f"--tp {tp} x --pp-size {pp} over --nnodes {nnodes} puts {ranks_per_node} ranks on a node, but the emulated node has --gpus {node.gpus}; expected at most one rank per GPU; fix: {fix}")


def resolve(argv: list[str], node: Node, *, with_plugin: bool) -> Resolution:
    """sglang's prepare_server_args on the emulated node, with or without the plugin's hooks on server_args.

    The hooks are the plugin's own table entries, applied as register() would
    apply them (judged first, hooked only where needed), for this call only.
    """
    from sglang.srt.server_args import prepare_server_args

    from . import hooks

    patch = hooks.in_effect("sglang.srt.server_args") if with_plugin else contextlib.nullcontext()
    with _quiet_sglang() as log, emulated_node(node), patch:
        try:
            args = prepare_server_args(list(argv))
        except SystemExit:
            raise DcpDsparkError("sglang exited while parsing the launch arguments; expected a valid launch; fix: correct the arguments after `--`") from None
        except Exception as exc:  # sglang validates with asserts, ValueError, NotImplementedError, ...
            text = " ".join(str(exc).split()) or type(exc).__name__
            return Resolution(False, f"{type(exc).__name__}: {text}", None, log.lines)
    return Resolution(True, None, args, log.lines)


def plugin_state(environ=None):
    """Would sglang's load_plugins() run this plugin here, and would it act? (enabled, reason)

    :mod:`switch` reads SGLANG_PLUGINS as load_plugins parses it, plus the
    plugin's own off switch; load_plugins also only finds installed entry points.
    """
    from . import switch

    state = switch.plugin_state(os.environ if environ is None else environ)
    if state.enabled and not switch.entry_point_installed():
        return switch.PluginState(False, f"not installed: no {switch.PLUGIN_NAME} entry point in {switch.ENTRY_POINT_GROUP} (pip install sglang-dcp-dspark)")
    return state


def _mla_kv(config: dict, dtype: str, pp: int = 1):
    """One rank's MLA KV from a config that _read_config checked; None for a model without MLA fields."""
    from .sizing import MLAKV

    if not config.get("kv_lora_rank"):
        return None
    layers = math.ceil(config["num_hidden_layers"] / pp)
    return MLAKV(layers, config["kv_lora_rank"], config["qk_rope_head_dim"], dtype)


def _device_bytes_per_row(target_kv, draft_kv, dcp: int) -> int:
    """GPU bytes per target device row: the target's KV, plus dcp draft rows (the draft is replicated)."""
    import torch

    def row(kv) -> int:
        return kv.layers * (kv.kv_lora_rank + kv.qk_rope_head_dim) * getattr(torch, kv.dtype).itemsize

    return row(target_kv) + (dcp * row(draft_kv) if draft_kv else 0)


def size_pools(args, node: Node, target_config: dict, draft_config: dict | None, device_rows: int | None,
               plugin_on: bool = True) -> dict:
    """Rank 0's HiCache host pools for the resolved launch, plus the RAM they need per node."""
    import psutil
    from sglang.srt.mem_cache import kv_cache_builder
    from sglang.srt.mem_cache.pool_host.base import HICACHE_HOST_MEMORY_RESERVE_BYTES

    from . import budget, hooks, plugin, sizing

    if not args.enable_hierarchical_cache:
        return {"skipped": "HiCache is off (no --enable-hierarchical-cache): no host pools to size"}
    dtype = sizing.KV_DTYPES.get(str(args.kv_cache_dtype), "bfloat16")
    pp = max(1, args.pp_size)
    dcp = max(1, args.dcp_size)
    target_kv = _mla_kv(target_config, dtype, pp)
    if target_kv is None:
        if dcp > 1:
            # sglang admitted HiCache under DCP, which it does only for MLA
            # models (it fills the MLA fields from its own defaults), but
            # preflight sizes from the config's own fields.
            raise DcpDsparkError(f"the target config.json has no kv_lora_rank or qk_rope_head_dim, but sglang resolves this HiCache + DCP launch as MLA; expected an MLA config with {', '.join(MLA_FIELDS)}; fix: download the model's own config.json (huggingface-cli download MODEL config.json --local-dir DIR)")
        return {"skipped": "the target model is not MLA (no kv_lora_rank); HiCache under DCP needs MLA"}
    draft_kv = None
    if args.speculative_algorithm and draft_config is not None:
        draft_kv = _mla_kv(draft_config, dtype)
    per_row = _device_bytes_per_row(target_kv, draft_kv, dcp)
    most_rows = int(node.gpu_memory_gib * GIB // per_row)
    if device_rows is not None:
        if device_rows > most_rows:
            raise DcpDsparkError(f"--device-rows {device_rows:,} needs {device_rows * per_row / GIB:,.1f} GiB of KV per GPU at {per_row:,} bytes per row, more than --gpu-memory-gib {node.gpu_memory_gib:g}; expected at most {most_rows:,}; fix: pass --device-rows N with N the max_total_num_tokens sglang logs for this launch")
        rows_note = "given with --device-rows"
        estimated = False
    else:
        # An upper bound: sglang measures free memory after loading weights,
        # which preflight does not do. Replicated draft rows count dcp times.
        device_rows = max(1, int(args.mem_fraction_static * node.gpu_memory_gib * GIB // per_row))
        rows_note = (f"estimate: mem_fraction_static {args.mem_fraction_static} x {node.gpu_memory_gib:g} GiB, "
                     "weights not subtracted (an upper bound); pass --device-rows for the real figure")
        estimated = True
    stock = kv_cache_builder.maybe_register_hicache_draft
    # The plugin's own table entry decides and hooks it. Without its check-only
    # hook: a short draft is reported below as a stop at startup, not raised here.
    _, fixed = hooks.BY_TARGET[plugin.DRAFT_REGISTRATION].wrap(stock, check_only=False)
    with _quiet_sglang():
        result = sizing.measure(
            target_kv, draft_kv, dcp_size=dcp, device_rows=device_rows, page_size=args.page_size or 1,
            hicache_ratio=args.hicache_ratio, hicache_size_gb=args.hicache_size, layout=args.hicache_mem_layout,
            register_stock=stock if draft_kv else None, register_fixed=fixed if draft_kv else None,
        )
    split = None
    if args.hicache_size and result.draft_fixed is not None and not budget.unbudgeted() and plugin_on:
        # As the plugin (and the series' patch 0004) run it: the target gets
        # its share of --hicache-size and the draft follows the target.
        split = rules.BudgetSplit(
            int(args.hicache_size * 1e9), result.target.bytes_per_token, result.draft_fixed.bytes_per_token,
            dcp, result.target.page_size,
        )
        unbudgeted_rank = result.target.bytes + result.draft_fixed.bytes
        with _quiet_sglang():
            result = sizing.measure(
                target_kv, draft_kv, dcp_size=dcp, device_rows=device_rows, page_size=args.page_size or 1,
                hicache_ratio=args.hicache_ratio, hicache_size_gb=split.target_hicache_size_gb,
                layout=args.hicache_mem_layout, register_stock=stock, register_fixed=fixed,
            )
    ranks_per_node = rules.ranks_per_node(args.tp_size, pp, args.nnodes)
    # The draft as this launch registers it: the plugin's fix when it runs.
    draft = result.draft_fixed if plugin_on else result.draft_stock
    need_rank = result.target.bytes + (draft.bytes if draft else 0)
    if split is not None:
        budget_rank = int(args.hicache_size * 1e9)
        budget_from = (f"--hicache-size {args.hicache_size:g} (decimal GB, = {_gib(int(args.hicache_size * 1e9))}), target + draft: {split.target_share:.1%} to the target "
                       f"(unbudgeted, as sglang 0.5.18+ or {budget.UNBUDGETED_ENV}=1: {_gib(unbudgeted_rank)} per rank)")
    elif args.hicache_size:
        budget_rank, budget_from = int(args.hicache_size * 1e9), f"--hicache-size {args.hicache_size:g} (decimal GB, = {_gib(int(args.hicache_size * 1e9))}; target pool only)"
    else:
        budget_rank, budget_from = result.target.bytes, f"--hicache-ratio {args.hicache_ratio:g} (target pool only)"
    if node.host_ram_gib is not None:
        available, available_from = int(node.host_ram_gib * GIB), node.host_ram_from
    else:
        available, available_from = int(psutil.virtual_memory().available), "this machine, available now"
    # The plugin's start-up check (budget.fit_hicache_size): host pools that
    # mirror the device pool once must fit this rank's share of free RAM.
    draft_bpt = draft.bytes_per_token if draft else 0
    smallest_rank = rules.smallest_host_bytes(device_rows, result.target.bytes_per_token, draft_bpt, dcp)
    share_rank = rules.rank_share_of_free_ram(available, HICACHE_HOST_MEMORY_RESERVE_BYTES, ranks_per_node)
    need_node = rules.per_node(need_rank, ranks_per_node)
    coverage = result.coverage(draft)
    return {
        "geometry": result.as_dict(),
        "device_rows_note": rows_note,
        "device_rows_estimated": estimated,
        "device_rows_max": most_rows,
        "target_kv": vars(target_kv),
        "draft_kv": vars(draft_kv) if draft_kv else None,
        "ranks_per_node": ranks_per_node,
        "draft_as_run": None if draft is None else ("with fix" if plugin_on else "stock"),
        "draft_coverage": coverage,
        "host_ram": {
            "needed_per_rank": need_rank,
            "needed_per_node": need_node,
            "budget_per_rank": budget_rank,
            "budget_from": budget_from,
            "target_share": None if split is None else split.target_share,
            "target_share_without_dcp": None if split is None else split.share_without_dcp,
            "over_budget_per_rank": max(0, need_rank - budget_rank),
            "available": available,
            "available_from": available_from,
            "reserve": HICACHE_HOST_MEMORY_RESERVE_BYTES,
            "fits": need_node <= available - HICACHE_HOST_MEMORY_RESERVE_BYTES,
            "smallest_per_rank": smallest_rank,
            "share_per_rank": share_rank,
            # The check runs only where the plugin does, and only with a draft.
            "starts": not plugin_on or draft is None or smallest_rank <= share_rank,
        },
    }


def startup_stops(sizing: dict) -> list[str]:
    """Why a launch that passes validation will stop at startup; empty when it will start."""
    if not sizing or "skipped" in sizing:
        return []
    ram = sizing["host_ram"]
    reasons = []
    coverage = sizing.get("draft_coverage")
    if coverage is not None and coverage < 1:
        reasons.append(f"the draft host pool covers {coverage:.3f} of the target's logical slots "
                       "(the plugin's capacity guard stops startup; without it L1 eviction writes past the draft buffer)")
    # Both RAM checks scale with the device rows; an estimate overstates them.
    caveat = "; device rows are an upper-bound estimate, pass --device-rows for a firm verdict" if sizing.get("device_rows_estimated") else ""
    if not ram["starts"]:
        reasons.append(f"the plugin's start-up check: host pools that mirror the device pool once need "
                       f"{_gib(ram['smallest_per_rank'])} per rank, more than its {_gib(ram['share_per_rank'])} share of free RAM{caveat}")
    if not ram["fits"]:
        reasons.append(f"host pools need {_gib(ram['needed_per_node'])} per node, more than the "
                       f"{_gib(ram['available'] - ram['reserve'])} left after sglang's reserve (sglang's host-memory check refuses them){caveat}")
    return reasons


def _verdict(code: int, detail: str) -> dict:
    outcome = OUTCOMES.get(code, "ERROR")
    return {"code": code, "outcome": outcome, "line": f"verdict: {outcome} (exit {code}): {detail}"}


def run(launch: list[str], node: Node, device_rows: int | None = None) -> dict:
    check_node(node, device_rows)
    default_rows = not launch and device_rows is None
    if default_rows:
        device_rows = DEFAULT_DEVICE_ROWS
    launch = list(launch) or default_launch()
    target_path = _option(launch, "--model-path") or _option(launch, "--model")
    target_config = _read_config(target_path, "--model-path")
    draft_path = _option(launch, "--speculative-draft-model-path")
    draft_config = _read_config(draft_path, "--speculative-draft-model-path") if draft_path else None
    _import_sglang()
    check_launch(_parse_launch(launch), node)

    from . import plugin

    stock = resolve(launch, node, with_plugin=False)
    fixed = resolve(launch, node, with_plugin=True)
    state = plugin_state()
    as_run = fixed if state.enabled else stock
    report = {
        "launch": launch,
        "node": vars(node) | {"capability": list(node.capability)},
        "plugin": {"enabled": state.enabled, "reason": state.reason, "resolver": plugin.resolver_verdict().detail},
        "stock": {"passed": stock.passed, "message": stock.message},
        "with_plugin": {"passed": fixed.passed, "message": fixed.message},
        "passed": as_run.passed,
        "message": as_run.message,
        "sglang_warnings": as_run.warnings,
    }
    if not as_run.passed:
        report["verdict"] = _verdict(REJECTED, f"sglang rejects the launch: {as_run.message}")
        return report
    report["sizing"] = size_pools(as_run.server_args, node, target_config, draft_config, device_rows, plugin_on=state.enabled)
    if default_rows and "device_rows_note" in report["sizing"]:
        report["sizing"]["device_rows_note"] = DEFAULT_DEVICE_ROWS_NOTE
    stops = startup_stops(report["sizing"])
    report["startup_stops"] = stops
    if stops:
        report["verdict"] = _verdict(STOPS, f"passes sglang's validation but stops at startup: {stops[0]}")
    else:
        report["verdict"] = _verdict(PASSES, _passes_detail(report))
    return report


def _passes_detail(report: dict) -> str:
    """One line for a launch that will start: what stock sglang does, what the fix does, whether the node fits."""
    stock = "stock sglang passes it too" if report["stock"]["passed"] else "stock sglang rejects it"
    fix = "with the plugin it passes" if report["plugin"]["enabled"] else "the plugin is off"
    sizing = report.get("sizing") or {}
    if "host_ram" not in sizing:
        return f"{stock}; {fix}; no HiCache host pools to pin: it will start"
    coverage = sizing.get("draft_coverage")
    if coverage is not None:
        fix += f" and the draft host pool covers {'all' if coverage >= 1 else f'{coverage:.3f}'} of the target's logical slots"
    ram, node = sizing["host_ram"], report["node"]
    return (f"{stock}; {fix}; its host pools pin {_gib(ram['needed_per_node'])} per node, within the "
            f"{_gib(ram['available'])} of the {node['gpus']} x {node['gpu_name']} node ({ram['available_from']}): it will start")


def _gib(n: int) -> str:
    return f"{n / GIB:,.2f} GiB"


def render(report: dict) -> str:
    out = []
    verdict = "PASSES" if report["passed"] else "REJECTED"
    state = "on" if report["plugin"]["enabled"] else "off"
    out.append(f"launch {verdict} sglang's validation (as run with the dcp_dspark plugin {state})")
    out.append(f"  {'plugin':<13} {report['plugin']['reason']}")
    for label, key in (("stock sglang", "stock"), ("with plugin", "with_plugin")):
        r = report[key]
        out.append(f"  {label:<13} {'passes' if r['passed'] else 'rejected: ' + r['message']}")
    sizing = report.get("sizing")
    if sizing and "skipped" in sizing:
        out.append(f"  host pools: {sizing['skipped']}")
    elif sizing:
        out.extend(_render_sizing(sizing))
    out.append("")
    out.append(report["verdict"]["line"])
    return "\n".join(line.rstrip() for line in out)


def _render_sizing(sizing: dict) -> list[str]:
    out = []
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
    draft = f"target + draft {sizing['draft_as_run']}" if sizing.get("draft_as_run") else "target"
    out.append(f"Host RAM ({n} ranks per node, {draft}):")
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
    return out


def _number(flag: str, value: str | None, kind: type, *, local: bool = False):
    """preflight's numeric options, read here rather than by argparse so that a bad one is a one-line error (JSON with --json)."""
    if value is None:
        return None
    if local and value.strip().lower() == "local":
        return None  # this machine's available RAM now
    try:
        return kind(value)
    except ValueError:
        what = ("an integer" if kind is int else "a number") + (" or 'local'" if local else "")
        raise DcpDsparkError(f"{flag} {value!r} is not {what}; fix: {FIX_PREFLIGHT} with {flag} set to {what}") from None


def main(args: argparse.Namespace) -> int:
    launch = list(args.launch or [])
    if launch[:1] == ["--"]:
        launch = launch[1:]
    try:
        ram = {}
        if args.host_ram_gib is not None:
            ram = {"host_ram_gib": _number("--host-ram-gib", args.host_ram_gib, float, local=True), "host_ram_from": "--host-ram-gib"}
        node = Node(
            gpus=_number("--gpus", args.gpus, int), gpu_memory_gib=_number("--gpu-memory-gib", args.gpu_memory_gib, float),
            gpu_name=args.gpu_name, **ram,
        )
        report = run(launch, node, device_rows=_number("--device-rows", args.device_rows, int))
    except DcpDsparkError as exc:
        if args.json:
            # The same verdict on stdout for a script; the one-line error still goes to stderr.
            print(json.dumps({"verdict": _verdict(exc.exit_code, str(exc)), "error": str(exc)}, indent=2))
        raise
    print(json.dumps(report, indent=2, default=str) if args.json else render(report))
    return report["verdict"]["code"]


def add_parser(sub) -> None:
    p = sub.add_parser(
        "preflight",
        help="will this launch pass sglang's validation and start, and how much pinned host memory will HiCache take (no GPU needed)",
        description="Runs sglang's own argument resolution on an emulated GPU node; with no launch arguments, "
                    "DeepSeek-V3 (its config.json, shipped in the package) with a one-layer MLA DSPARK draft, "
                    + " ".join(DEFAULT_LAUNCH) + f" and {DEFAULT_DEVICE_ROWS:,} device rows per rank. Exit codes: 0 passes and will "
                    "start, 1 sglang rejects it, 2 bad input, 3 passes validation but stops at startup.",
    )
    p.add_argument("--json", action="store_true", help="print the report (or the error) as JSON on stdout")
    p.add_argument("--gpus", default=str(Node.gpus), metavar="N", help=f"GPUs on the target node (default {Node.gpus})")
    p.add_argument("--gpu-memory-gib", default=str(Node.gpu_memory_gib), metavar="GIB", help=f"memory per GPU (default {Node.gpu_memory_gib:g})")
    p.add_argument("--gpu-name", default=Node.gpu_name, metavar="NAME")
    p.add_argument("--host-ram-gib", metavar="GIB",
                   help=f"host RAM of the target node (default {Node.host_ram_gib:g}, as on a DGX H200); "
                        "'local': what this machine has available now")
    p.add_argument("--device-rows", metavar="N", help="target device KV rows per rank (sglang logs max_total_num_tokens; default: an upper-bound "
                        f"estimate, or {DEFAULT_DEVICE_ROWS:,} for the default launch)")
    p.add_argument("launch", nargs=argparse.REMAINDER, help="-- followed by the sglang launch arguments")
    p.set_defaults(func=main)
