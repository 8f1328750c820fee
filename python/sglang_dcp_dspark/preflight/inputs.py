"""preflight's input: the embedded default launch, the configs a launch names, sglang's own parse of its arguments,
and the numbers no node could hold (what sglang does not check).

Everything here is bad input (exit 2) when it fails: preflight's own options
(:func:`check_node`), the launch's arguments as sglang's parser reads them
(:func:`parse_launch`), the models' ``config.json`` (:func:`read_configs`),
and the numbers of the resolved launch (:func:`check_resolved`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
from dataclasses import dataclass
from pathlib import Path

from ..core import rules
from ..core.errors import DcpDsparkError
from . import launch as launch_mod
from .launch import FIX_PREFLIGHT, GIB, Node

# The embedded default launch (make demo): DeepSeek-V3 with a dense DSPARK
# draft of the public Kimi-K3 DSPARK draft's geometry (architecture fields
# only, see data/README.md) at DCP8 + HiCache on an 8 x B200 node, on the
# cutedsl_mla attention backend: the shape PR #35221 was validated on (8 x
# B300, Kimi-K3, whose model hook forces cutedsl_mla under DCP). On Hopper no
# backend the pass map checked runs speculative decoding under DCP correctly
# (docs/spec-under-dcp.md), so the default is the Blackwell shape.
DATA = Path(__file__).parent / "data"
DEFAULT_MODEL = DATA / "deepseek-v3"
DEFAULT_DRAFT = DATA / "kimi-k3-dspark-draft"
DEFAULT_LAUNCH = ("--tp", "8", "--dcp-size", "8", "--enable-hierarchical-cache", "--speculative-algorithm", "DSPARK",
                  "--attention-backend", "cutedsl_mla")
DEFAULT_GPU = "NVIDIA B200"
# The default launch's device rows per rank, as sglang would log them
# (max_total_num_tokens): DeepSeek-V3's FP8 weights take about 80 GiB of each
# GPU at --tp 8, which leaves about 78 GiB of sglang's 0.88 x 180 GiB of a
# B200 for KV; a row is 90,752 bytes there (61 target layers of 576 bf16
# values, plus the dense draft's 8 logical rows of 2,560 bytes: 5 layers x 2
# KV heads x K and V x head_dim 64), so about 930,000 rows.
DEFAULT_DEVICE_ROWS = 930_000
DEFAULT_DEVICE_ROWS_NOTE = ("the default launch's figure: about 78 GiB of KV per B200 after DeepSeek-V3's "
                            "FP8 weights; pass --device-rows for a measured one")

# What a real node can have. Past these a number is a typo, and preflight would
# emulate a machine that cannot exist (or overflow the sizes it builds).
MAX_GPUS = 64  # per node; HGX boards hold 8, the largest single systems 16
MAX_GPU_MEMORY_GIB = 1024.0  # per GPU; the largest parts today have 288 GB
MAX_HOST_RAM_GIB = 64 * 1024.0  # per node; the largest single-system servers hold 32 TiB
MAX_PAGE_SIZE = 1 << 20
MAX_HICACHE_RATIO = 1000.0  # sglang's default is 2


def default_node(**fields) -> Node:
    """The node the embedded default launch is judged on."""
    return Node.of_part(DEFAULT_GPU, **fields)


def default_launch() -> list[str]:
    return ["--model-path", str(DEFAULT_MODEL), *DEFAULT_LAUNCH, "--speculative-draft-model-path", str(DEFAULT_DRAFT)]


@dataclass(frozen=True)
class Configs:
    """The ``config.json`` of each model the launch names, as read, and the directory each flag names (for the
    one-line error when sglang cannot load one)."""

    target: dict
    draft: dict | None
    paths: dict[str, str]  # "--model-path" (and "--speculative-draft-model-path") -> the directory given


def read_configs(argv: list[str]) -> Configs:
    """The launch's model configs, checked to be readable JSON objects (before sglang is imported)."""
    target_path = launch_mod.option(argv, "--model-path") or launch_mod.option(argv, "--model")
    target = launch_mod.read_config(target_path, "--model-path")
    draft_path = launch_mod.option(argv, "--speculative-draft-model-path")
    draft = launch_mod.read_config(draft_path, "--speculative-draft-model-path") if draft_path else None
    paths = {"--model-path": target_path, **({"--speculative-draft-model-path": draft_path} if draft_path else {})}
    return Configs(target, draft, paths)


def check_architectures(configs: Configs, release: str) -> None:
    """Each model's architecture is one the release serves (else its launch fails at model load)."""
    for flag, config in (("--model-path", configs.target), ("--speculative-draft-model-path", configs.draft)):
        if config is not None:
            launch_mod.check_architecture(config, configs.paths[flag], flag, release)


def in_range(value, low: float, high: float, *, low_open: bool = False) -> bool:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return (value > low if low_open else value >= low) and value <= high


def check_node(node: Node, device_rows: int | None) -> None:
    """preflight's own numbers: finite, positive, and what one real node could have."""
    problems = []
    if not in_range(node.gpus, 1, MAX_GPUS):
        problems.append(f"--gpus {node.gpus} (expected 1 to {MAX_GPUS})")
    if not in_range(node.gpu_memory_gib, 0, MAX_GPU_MEMORY_GIB, low_open=True):
        problems.append(f"--gpu-memory-gib {node.gpu_memory_gib} (expected a finite number above 0, at most {MAX_GPU_MEMORY_GIB:g})")
    if node.host_ram_gib is not None and not in_range(node.host_ram_gib, 0, MAX_HOST_RAM_GIB, low_open=True):
        problems.append(f"--host-ram-gib {node.host_ram_gib} (expected a finite number above 0, at most {MAX_HOST_RAM_GIB:g}, or 'local')")
    if device_rows is not None and device_rows < 1:
        problems.append(f"--device-rows {device_rows} (expected >= 1)")
    if problems:
        raise DcpDsparkError(f"out-of-range numbers: {', '.join(problems)}; fix: {FIX_PREFLIGHT} with numbers in range")


def check_resolved(la, node: Node) -> None:
    """Numbers sglang resolved and accepts but no node could hold, and a DCP layout it does not check.

    Read from the resolved launch: a field sglang leaves unset (a ratio it
    resolves while building the pools) is not a bad number.
    """
    problems = []
    for flag, value in (("--tp", la.tp_size), ("--dcp-size", la.dcp_size), ("--pp-size", la.pp_size), ("--nnodes", la.nnodes)):
        if value < 1:
            problems.append(f"{flag} {value} (expected >= 1)")
    if not in_range(la.page_size, 1, MAX_PAGE_SIZE):
        problems.append(f"--page-size {la.page_size} (expected 1 to {MAX_PAGE_SIZE})")
    if la.hicache_ratio is not None and not in_range(la.hicache_ratio, 0, MAX_HICACHE_RATIO, low_open=True):
        problems.append(f"--hicache-ratio {la.hicache_ratio} (expected a finite number above 0, at most {MAX_HICACHE_RATIO:g})")
    max_hicache_gb = MAX_HOST_RAM_GIB * GIB / 1e9
    if not in_range(la.hicache_size, 0, max_hicache_gb):
        size = int(la.hicache_size) if float(la.hicache_size).is_integer() else la.hicache_size
        problems.append(f"--hicache-size {size} (expected 0 to {max_hicache_gb:.0f} GB per rank)")
    mfs = la.mem_fraction_static
    if mfs is not None and not in_range(mfs, 0, 1, low_open=True):
        problems.append(f"--mem-fraction-static {mfs} (expected a finite number above 0, at most 1)")
    if problems:
        raise DcpDsparkError(f"out-of-range numbers in the launch: {', '.join(problems)}; fix: correct them after `--` in {FIX_PREFLIGHT}")
    tp, dcp = la.tp_size, la.dcp_size
    if dcp > 1 and tp % dcp:
        # sglang's DCP groups are consecutive slices of dcp_size ranks of each
        # TP group, and each rank takes dcp_rank = tp_rank % dcp_size: a
        # dcp_size that does not divide tp leaves a short group whose ranks
        # believe in slots that no rank stores.
        divisors = [d for d in range(1, tp + 1) if tp % d == 0]
        raise DcpDsparkError(f"--dcp-size {dcp} does not divide --tp {tp}; sglang builds its DCP groups from slices of dcp_size ranks of each TP group, so expected one of {divisors}; fix: pass --dcp-size {max(d for d in divisors if d <= dcp)} (or a --tp that is a multiple of {dcp})")
    ranks_per_node = rules.most_ranks_on_a_node(tp, la.pp_size, la.nnodes)
    if ranks_per_node > node.gpus:
        fix = f"pass --nnodes {rules.nodes_needed(tp, la.pp_size, node.gpus)} after `--`"
        if ranks_per_node <= MAX_GPUS:
            fix += f", or --gpus {ranks_per_node} if the node has that many"
        raise DcpDsparkError(f"--tp {tp} x --pp-size {la.pp_size} over --nnodes {la.nnodes} puts {ranks_per_node} ranks on a node, but the emulated node has --gpus {node.gpus}; expected at most one rank per GPU; fix: {fix}")


def parse_launch(argv: list[str]) -> argparse.Namespace:
    """sglang's own parser, before any resolution: the arguments as given (its usage errors become one-line, exit-2
    errors). What the launch names; what it runs is read from it only where every resolution refused the launch
    (:func:`resolution.runs`)."""
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
