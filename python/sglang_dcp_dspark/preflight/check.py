"""``sglang-dcp-dspark preflight``: will this launch pass sglang's validation, start, and what will HiCache pin?

The installed sglang judges the launch, through its own code: its parser and
resolution (read back after its own defaulting), and its own host-pool
builders on the meta device. What differs between releases lives in one
adapter per release family (:mod:`releases`); the host-RAM model is
:mod:`hostram`; what the speculative passes read, :mod:`passes`; the report,
the sweep table and the chart are :mod:`report`. This module is the model of
one judgement; a sweep of them is :mod:`sweep`, the command line
:mod:`cli.preflight`.
The launch is judged twice, as stock sglang and with this project's plugin
hooks (judged and applied as the plugin applies them, for the call only).

The exit code is the verdict on the launch as it will run (with the plugin
when sglang's ``load_plugins`` would run it, see :mod:`plugin.switch`):

- 0: it passes sglang's validation and will start;
- 1: sglang rejects it;
- 2: bad input (preflight's own options, the launch arguments or a config.json);
- 3: it passes validation but will stop at startup: sglang or the plugin
  refuses its host pools while building them, the draft host pool is short of
  the target's logical slots, or its pools do not fit the node's RAM;
- 5: it passes validation, but under DCP one of its passes (speculative, or
  a plain extend or decode) crashes or reads other tokens' KV, as the pass map
  shows it on the backend the emulated node runs;
- 6: it passes validation and will start, but under DCP the pass map has not
  checked its passes on that backend (or release): the line says what is
  unchecked. 0 is said only where every pass under DCP was checked.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import math
import os
from pathlib import Path

from .. import passes as passes_mod
from ..core import rules, swap
from ..core.errors import DcpDsparkError
from ..plugin import hooks as hooks_mod
from . import hostram, result
from . import launch as launch_mod
from . import models as models_mod
from . import verdict as verdict_mod
from .launch import FIX_PREFLIGHT, GIB, Node, Resolution
from .models import kv_fields

__all__ = ["DEFAULT_DEVICE_ROWS", "DEFAULT_DRAFT", "DEFAULT_GPU", "DEFAULT_MODEL", "GIB", "MAX_GPU_MEMORY_GIB", "Node", "emulated_node",
           "judge", "run"]

emulated_node = launch_mod.emulated_node

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


def default_node(**fields) -> Node:
    """The node the embedded default launch is judged on."""
    return Node.of_part(DEFAULT_GPU, **fields)


# Exit codes: the verdict on the launch as it will run (see :mod:`verdict`).
PASSES, REJECTED, BAD_INPUT, STOPS = verdict_mod.PASSES, verdict_mod.REJECTED, verdict_mod.BAD_INPUT, verdict_mod.STOPS
BROKEN_PASS, UNCHECKED = verdict_mod.BROKEN_PASS, verdict_mod.UNCHECKED
OUTCOMES = verdict_mod.OUTCOMES

# What a real node can have. Past these a number is a typo, and preflight would
# emulate a machine that cannot exist (or overflow the sizes it builds).
MAX_GPUS = 64  # per node; HGX boards hold 8, the largest single systems 16
MAX_GPU_MEMORY_GIB = 1024.0  # per GPU; the largest parts today have 288 GB
MAX_HOST_RAM_GIB = 64 * 1024.0  # per node; the largest single-system servers hold 32 TiB
MAX_PAGE_SIZE = 1 << 20
MAX_HICACHE_RATIO = 1000.0  # sglang's default is 2


def default_launch() -> list[str]:
    return ["--model-path", str(DEFAULT_MODEL), *DEFAULT_LAUNCH, "--speculative-draft-model-path", str(DEFAULT_DRAFT)]


# ---------------------------------------------------------------- input checks (what sglang does not check)


def _in_range(value, low: float, high: float, *, low_open: bool = False) -> bool:
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


def check_resolved(la, node: Node) -> None:
    """Numbers sglang resolved and accepts but no node could hold, and a DCP layout it does not check.

    Read from the resolved launch: a field sglang leaves unset (a ratio it
    resolves while building the pools) is not a bad number.
    """
    problems = []
    for flag, value in (("--tp", la.tp_size), ("--dcp-size", la.dcp_size), ("--pp-size", la.pp_size), ("--nnodes", la.nnodes)):
        if value < 1:
            problems.append(f"{flag} {value} (expected >= 1)")
    if not _in_range(la.page_size, 1, MAX_PAGE_SIZE):
        problems.append(f"--page-size {la.page_size} (expected 1 to {MAX_PAGE_SIZE})")
    if la.hicache_ratio is not None and not _in_range(la.hicache_ratio, 0, MAX_HICACHE_RATIO, low_open=True):
        problems.append(f"--hicache-ratio {la.hicache_ratio} (expected a finite number above 0, at most {MAX_HICACHE_RATIO:g})")
    max_hicache_gb = MAX_HOST_RAM_GIB * GIB / 1e9
    if not _in_range(la.hicache_size, 0, max_hicache_gb):
        size = int(la.hicache_size) if float(la.hicache_size).is_integer() else la.hicache_size
        problems.append(f"--hicache-size {size} (expected 0 to {max_hicache_gb:.0f} GB per rank)")
    mfs = la.mem_fraction_static
    if mfs is not None and not _in_range(mfs, 0, 1, low_open=True):
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


def _parse_launch(argv: list[str]) -> argparse.Namespace:
    """sglang's own parser, before any resolution: the arguments as given (its usage errors become one-line, exit-2
    errors). What the passes are judged on where every resolution refused the launch."""
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


# ---------------------------------------------------------------- sglang's verdict


def resolve(release, argv: list[str], node: Node, paths: dict[str, str], *, hooked: bool) -> Resolution:
    """The release's own resolution on the emulated node, with or without the plugin's hooks on server_args.

    sglang's resolution writes to the environment (0.5.23 sets SGLANG_USE_CUDA_IPC_TRANSPORT for the processes it
    would start); a judgement resolves several launches, and the next would read that as the operator's setting
    and warn of it, so each resolution leaves the environment as it found it."""
    with swap.environ_restored(), launch_mod.quiet_sglang() as log, launch_mod.emulated_node(node):
        try:
            args = release.resolve(argv, hooked=hooked)
        except SystemExit:
            raise DcpDsparkError("sglang exited while parsing the launch arguments; expected a valid launch; fix: correct the arguments after `--`") from None
        except Exception as exc:  # sglang validates with asserts, ValueError, NotImplementedError, ...
            bad = launch_mod.config_load_failure(exc, paths, release.version) or launch_mod.platform_refusal(
                exc, node, release.version)
            if bad is not None:
                raise bad from None
            text = " ".join(str(exc).split()) or type(exc).__name__
            return Resolution(False, f"{type(exc).__name__}: {text}", None, log.lines)
        return Resolution(True, None, release.launch(args), log.lines)


def plugin_state(environ=None):
    """Would sglang's load_plugins() run this plugin here, and would it act? (enabled, reason)"""
    from ..plugin import switch

    state = switch.plugin_state(os.environ if environ is None else environ)
    if state.enabled and not switch.entry_point_installed():
        return switch.PluginState(False, f"not installed: no {switch.PLUGIN_NAME} entry point in {switch.ENTRY_POINT_GROUP} (pip install --no-deps a checkout of sglang-dcp-dspark)")
    return state


# ---------------------------------------------------------------- the pools


def read_models(release, la, node: Node, paths: dict[str, str]):
    """Each model's KV as the release's ModelConfig reads it; a config it cannot load is one exit-2 line."""
    with launch_mod.quiet_sglang(), launch_mod.emulated_node(node):
        try:
            return models_mod.read(release, la)
        except DcpDsparkError:
            raise
        except Exception as exc:  # transformers' and sglang's config loading raise many types
            bad = launch_mod.config_load_failure(exc, paths, release.version)
            if bad is not None:
                raise bad from None
            text = " ".join(str(exc).split())[:200] or type(exc).__name__
            raise DcpDsparkError(f"sglang {release.version}'s ModelConfig cannot read the launch's models ({type(exc).__name__}: {text}); "
                                 "expected configs sglang loads; fix: pass the models' own config.json (huggingface-cli download MODEL config.json)") from None


def device_bytes_per_row(models, dcp: int) -> int:
    """GPU bytes per target device row: the target's KV (and DSA index), plus dcp draft rows (the draft spans the logical locs)."""
    import torch

    def row(kv) -> int:
        width = kv.kv_lora_rank + kv.qk_rope_head_dim if kv.kind == "mla" else kv.head_num * (kv.head_dim + kv.v_head_dim)
        return kv.layers * width * getattr(torch, kv.dtype).itemsize

    index = models.target.layers * (models.dsa_index_head_dim + models.dsa_index_head_dim // 128 * 4) if models.dsa_index_head_dim else 0
    return row(models.target) + index + (dcp * row(models.draft) if models.draft else 0)


def _available(node: Node) -> tuple[int, str]:
    if node.host_ram_gib is not None:
        return int(node.host_ram_gib * GIB), node.host_ram_from
    import psutil

    return int(psutil.virtual_memory().available), "this machine, available now"


def _device_rows(la, models, node: Node, device_rows: int | None):
    per_row = device_bytes_per_row(models, la.dcp_size)
    most = int(node.gpu_memory_gib * GIB // per_row)
    if device_rows is not None:
        if device_rows > most:
            raise DcpDsparkError(f"--device-rows {device_rows:,} needs {device_rows * per_row / GIB:,.1f} GiB of KV per GPU at {per_row:,} bytes per row, more than --gpu-memory-gib {node.gpu_memory_gib:g}; expected at most {most:,}; fix: pass --device-rows N with N the max_total_num_tokens sglang logs for this launch")
        return device_rows, "given with --device-rows", False, most
    # An upper bound: sglang measures free memory after loading weights, which preflight does not do.
    mfs = la.mem_fraction_static if la.mem_fraction_static is not None else 0.88
    rows = max(1, int(mfs * node.gpu_memory_gib * GIB // per_row))
    return rows, (f"estimate: mem_fraction_static {mfs} x {node.gpu_memory_gib:g} GiB, weights not subtracted "
                  "(an upper bound); pass --device-rows for the real figure"), True, most


def _same(a, b) -> bool:
    return a is b or ([p.size for p in a.pools] == [p.size for p in b.pools] and a.startup_error == b.startup_error)


def size_pools(release, la, models, node: Node, device_rows: int | None, *, plugin_on: bool, stock_la=None,
               variants: bool = False, stock_passed: bool = True) -> result.Sizing | result.NoPools:
    """Rank 0's host pools as the launch runs them, and as stock sglang would build them, with the RAM they need."""
    from sglang.srt.mem_cache.pool_host.base import HICACHE_HOST_MEMORY_RESERVE_BYTES

    if not la.enable_hierarchical_cache:
        return result.NoPools("HiCache is off (no --enable-hierarchical-cache): no host pools to size")
    rows, note, estimated, most = _device_rows(la, models, node, device_rows)
    available, available_from = _available(node)
    ranks = rules.ranks_per_node(la.tp_size, la.pp_size, la.nnodes)
    with launch_mod.quiet_sglang():
        # The draft backup the launch names (--hicache-draft-backup, upstream-next 0005), where the tree has it.
        built = release.build(la, models, rows, hooked=plugin_on, host_ram=available, backup=la.hicache_draft_backup)
        stock = (release.build(stock_la or la, models, rows, hooked=False, host_ram=available,
                               backup=(stock_la or la).hicache_draft_backup) if plugin_on else built)
        backups = {}
        if la.hicache_draft_backup is not None and models.draft is not None:
            # A tree with upstream-next's --hicache-draft-backup: both modes, side by side.
            for mode in ("replicated", "sharded"):
                other = built if mode == la.hicache_draft_backup else release.build(la, models, rows, hooked=plugin_on,
                                                                                       host_ram=available, backup=mode)
                backups[mode] = result.Backup(result.Pool.of(other, ranks), other.bytes, other.bytes * ranks,
                                              other.target.logical_slots if other.target else None, other.startup_error)
        chart = (_variants(release, la, models, rows, available, ranks, plugin_on, built, stock, backups, stock_passed)
                 if variants else None)
    ram = hostram.judge(built, ranks_per_node=ranks, available=available, available_from=available_from,
                        reserve=HICACHE_HOST_MEMORY_RESERVE_BYTES, hicache_size_gb=la.hicache_size, device_rows=rows)
    stock_cov = None
    if stock.target is not None and stock.draft is not None and stock.draft_plan != "PACKED":
        stock_cov = rules.coverage(stock.draft.logical_slots, stock.target.logical_slots)
    # The stock figures are left out where stock sglang builds exactly what runs (nothing of the plugin's applies).
    same = _same(stock, built)
    return result.Sizing(
        device_rows=rows, device_rows_note=note, device_rows_estimated=estimated, device_rows_max=most,
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


def _variants(release, la, models, rows, available, ranks, plugin_on, built, stock, backups,
              stock_passed: bool = True) -> dict | None:
    """Pinned bytes per node of the chart's four setups (report.SETUPS), each from the release's classes where it has them."""
    from ..core.budget import UNBUDGETED_ENV

    if models.draft is None:
        return None
    classes = f"sglang {release.version}'s classes"

    def entry(b, source=classes):
        return result.Setup(b.bytes * ranks if b.pools else None, source, b.startup_error)

    with swap.environ(**{UNBUDGETED_ENV: "1"}):
        unbudgeted = release.build(la, models, rows, hooked=plugin_on, host_ram=available)
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


# ---------------------------------------------------------------- one judgement


def verdict_of(code: int, detail: str) -> verdict_mod.Verdict:
    """The verdict of an error (bad input, 2; an internal error, 4): its one line is the reason."""
    return verdict_mod.of_error(code, detail)


@launch_mod.kernels_uncompiled
def judge(release, argv: list[str], node: Node, device_rows: int | None, configs: dict, *,
          variants: bool = False, advise: bool = True, plugin_on: bool | None = None) -> result.Report:
    """One launch on the installed release: sglang's verdict stock and with the plugin, the pools, the RAM.

    ``advise``: where the launch does not pass, judge the changes that could make it (another attention backend
    the pass map shows running it, the plugin on, --dcp-size 1, a --hicache-size that fits) and name the first
    that passes. ``plugin_on``: judge as if the plugin were on (or off), whatever the environment says."""
    from ..plugin import switch

    paths = configs["paths"]
    given = _parse_launch(argv)
    state = plugin_state() if plugin_on is None else switch.PluginState(
        plugin_on, "as advised: with the plugin on" if plugin_on else "as advised: with the plugin off")
    stock = resolve(release, argv, node, paths, hooked=False)
    fixed = resolve(release, argv, node, paths, hooked=True)
    as_run = fixed if state.enabled else stock
    # Bad input first: numbers no node could hold, or a config sglang cannot size, read off the resolution that
    # got through (stock's, where the plugin refused), are exit 2 whatever the verdict. A refused launch is then
    # sized as it would run if the refusing side admitted it.
    other = as_run if as_run.passed else fixed if fixed.passed else stock if stock.passed else None
    if other is None and state.enabled:
        # Refused both ways, the plugin's pass check among the refusals: what it would pin without that check.
        other = _resolve_unchecked(release, argv, node, paths)
    resolved = as_run.launch or (other.launch if other is not None else None)
    judged = judge_passes(release, given, configs, resolved, plugin_on=state.enabled)
    stock_judged = judge_passes(release, given, configs, stock.launch, plugin_on=False) if stock.passed else None
    backends = _backends(resolved, given, node, picked_by=_picked_by(stock, fixed, state.enabled, given))
    rel = result.Release(release.version, type(release).__module__.rsplit(".", 1)[1], release.first,
                         tuple(release.changes), tuple(_applied_series()))
    sizing = la = None
    if other is not None:
        la = other.launch
        check_resolved(la, node)
        models = read_models(release, la, node, paths) if la.enable_hierarchical_cache else None
        sizing = size_pools(release, la, models, node, device_rows, plugin_on=state.enabled,
                            stock_la=stock.launch if stock.passed else la, variants=variants,
                            stock_passed=stock.passed)
    elif device_rows is not None:
        check_device_rows(configs, node, device_rows)
    plugin = result.Plugin(state.enabled, state.reason, release.decisions())
    facts = verdict_mod.Facts(
        release=rel, node=node, plugin_on=state.enabled, stock_passed=stock.passed, stock_message=stock.message,
        plugin_passed=fixed.passed, plugin_message=fixed.message, judged=judged, sizing=sizing,
        admitted=as_run.passed, stock_judged=stock_judged, backend=backends.decode,
        backend_picked=backends.picked_by, warnings=tuple(as_run.warnings))
    code, stop = _outcome(as_run.passed, judged, sizing)
    advice = (_advise(release, argv, node, device_rows, configs, code=code, la=resolved, given=given, judged=judged,
                      backend=backends.decode, plugin_on=state.enabled, sizing=sizing)
              if advise and code != PASSES else None)
    if code == REJECTED:
        verdict = verdict_mod.rejected(facts, advice)
    elif code == STOPS:
        verdict = verdict_mod.stops(facts, stop, advice)
    elif code == BROKEN_PASS:
        verdict = verdict_mod.broken(facts, advice)
    elif code == UNCHECKED:
        verdict = verdict_mod.unchecked(facts, advice)
    else:
        verdict = verdict_mod.passes(facts)
    return result.Report(
        release=rel, launch=tuple(argv), node=node, plugin=plugin, stock=result.Outcome(stock.passed, stock.message),
        with_plugin=result.Outcome(fixed.passed, fixed.message), passed=as_run.passed, message=as_run.message,
        sglang_warnings=tuple(as_run.warnings), attention_backends=backends, passes=judged, verdict=verdict,
        resolved=la.fields() if la is not None else None, sizing=sizing, admitted=as_run.passed)


def _resolve_unchecked(release, argv: list[str], node: Node, paths: dict) -> Resolution | None:
    """The resolution with the plugin's hooks but without its argument-time pass check: the launch the check
    refuses, as it would run if admitted (for its host-memory figures only). None where sglang refuses it too."""
    with hooks_mod.without_pass_check():
        unchecked = resolve(release, argv, node, paths, hooked=True)
    return unchecked if unchecked.passed else None


def _outcome(passed: bool, judged, sizing):
    """The exit code of a judged launch, and what stops it where it stops at startup."""
    if not passed:
        return REJECTED, None
    stops = getattr(getattr(sizing, "host_ram", None), "stops", ())
    if stops:
        return STOPS, stops[0]
    refusing = [f for f in judged.broken if verdict_mod.refuses_at_startup(f)]
    if refusing:
        return STOPS, refusing[0]
    if judged.broken:
        return BROKEN_PASS, None
    if judged.dcp > 1 and not judged.mapped:
        return UNCHECKED, None
    return PASSES, None


# Backends the release runs that the pass map does not model (their passes are unchecked there).
UNMODELLED_BACKENDS = ("cutedsl_mla",)
# The attention-backend options a launch names; an advised backend replaces them all.
BACKEND_OPTIONS = ("--attention-backend", "--decode-attention-backend", "--prefill-attention-backend")


def _without(argv: list[str], names: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """``argv`` less the options ``names`` (with their values), and what was taken out."""
    out, removed, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in names and i + 1 < len(argv):
            removed += argv[i: i + 2]
            i += 2
            continue
        if any(arg.startswith(n + "=") for n in names):
            removed.append(arg)
            i += 1
            continue
        out.append(arg)
        i += 1
    return out, removed


def _advise(release, argv: list[str], node: Node, device_rows: int | None, configs: dict, *, code: int, la, given,
            judged, backend: str | None, plugin_on: bool, sizing) -> verdict_mod.Advice | None:
    """The first change that makes the launch pass on this node and release, judged by preflight itself; None where
    none does. Tried in order: an attention backend the pass map shows running it (not the one it runs), the plugin
    on, a chain for a draft tree, --dcp-size 1 (where the launch is refused or broken), a --hicache-size the node holds."""
    from ..plugin import switch

    launch = la if la is not None else given
    dcp = la.dcp_size if la is not None else int(given.dcp_size or 1)
    algorithm = launch.speculative_algorithm
    tries: list[tuple[list[str], tuple, tuple, tuple, bool]] = []  # (argv, add, remove, env, plugin on)
    if dcp > 1 and code in (REJECTED, BROKEN_PASS, UNCHECKED, STOPS):
        draft = la.draft_model_path if la is not None else given.speculative_draft_model_path
        own_layer = draft in (None, launch.model_path)
        good = passes_mod.working_backends(
            release.version, algorithm, dcp=dcp, own_layer=own_layer,
            capability_major=node.capability[0], hicache=bool(launch.enable_hierarchical_cache),
            verify_fix=_verify_fix(plugin_on) if algorithm else None,
            draft_mla=not own_layer and models_mod.is_mla_config(configs["draft"]))
        # Then a backend the map does not model but the release runs on this architecture (PR #35221 was validated
        # on Blackwell's cutedsl_mla): its passes unchecked (exit 6), still a better change than losing DCP.
        unmodelled = [b for b in UNMODELLED_BACKENDS if node.capability[0] in passes_mod.ARCHITECTURE_BACKENDS.get(b, ())]
        for other in (*good, *unmodelled):
            if other == backend or code == UNCHECKED and other in unmodelled:
                continue
            rest, removed = _without(argv, BACKEND_OPTIONS)
            tries.append(([*rest, "--attention-backend", other], ("--attention-backend", other), tuple(removed), (),
                          plugin_on))
    if not plugin_on and switch.entry_point_installed() and code != UNCHECKED:
        tries.append((list(argv), (), (), (switch.TURN_ON,), True))
    # As the launch gives it (the resolved Launch keeps only what the host pools depend on).
    if dcp > 1 and code in (REJECTED, BROKEN_PASS) and (given.speculative_eagle_topk or 1) > 1:
        # A draft tree under DCP: the split verify plans a chain, so a chain of the same depth keeps DCP (sglang
        # sets a chain's draft tokens to its steps + 1 itself; the advised launch is judged as sglang resolves it).
        chain = ("--speculative-eagle-topk", "1")
        rest, removed = _without(argv, chain[:1])
        tries.append(([*rest, *chain], chain, tuple(removed), (), plugin_on))
    if dcp > 1 and code in (REJECTED, BROKEN_PASS, STOPS) and not (code == STOPS and getattr(sizing, "startup_stops", ())):
        rest, removed = _without(argv, ("--dcp-size",))
        tries.append(([*rest, "--dcp-size", "1"], ("--dcp-size", "1"), tuple(removed), (), plugin_on))
    ram = getattr(sizing, "host_ram", None)
    if code == STOPS and ram is not None and any(s.kind == "ram" for s in ram.stops) and ram.ranks_per_node:
        per_rank_gb = int((ram.available - ram.reserve) / ram.ranks_per_node / 1e9 * 0.9)
        if per_rank_gb >= 1:
            rest, removed = _without(argv, ("--hicache-size",))
            tries.append(([*rest, "--hicache-size", str(per_rank_gb)], ("--hicache-size", str(per_rank_gb)),
                          tuple(removed), (), plugin_on))
    fallback = None
    for advised, add, remove, env, on in tries:
        if fallback is not None and add[:1] != ("--attention-backend",):
            return fallback  # a backend that runs it, unchecked, before the plugin or --dcp-size 1
        try:
            report = judge(release, advised, node, device_rows, configs, advise=False, plugin_on=on)
        except DcpDsparkError:
            continue
        got = verdict_mod.Advice(add, remove, env, report.verdict.code, report.verdict.line, report.verdict.evidence)
        if got.code == PASSES:
            return got
        if got.code == UNCHECKED and fallback is None and code != UNCHECKED:
            fallback = got
    return fallback


def check_device_rows(configs: dict, node: Node, device_rows: int) -> None:
    """--device-rows against the GPU's memory where no resolution got far enough to size a row: a row is at least
    its target layers' latent (or K and V heads) at one byte a value, which bounds the rows a GPU can hold."""
    config = configs["target"]
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


def _picked_by(stock, fixed, plugin_on: bool, given: argparse.Namespace) -> str:
    """Who picked the decode backend of a launch that names none, where sglang's own pick was not kept: "the plugin"
    where its resolution and stock's both got through and differ there (under DCP on Hopper it picks flashinfer)."""
    if not plugin_on or given.decode_attention_backend or given.attention_backend:
        return ""
    if stock.launch is None or fixed.launch is None:
        return ""
    return "the plugin" if stock.launch.attention_backends[1] != fixed.launch.attention_backends[1] else ""


def _backends(la, given: argparse.Namespace, node: Node, *, picked_by: str = "") -> result.Backends:
    """The target's attention backends the launch runs on the emulated node, and where each comes from (``given``:
    sglang's parse of the launch; its backend options default to None on every release)."""
    prefill, decode = la.attention_backends if la is not None else (None, None)
    named_decode = given.decode_attention_backend or given.attention_backend
    named_prefill = given.prefill_attention_backend or given.attention_backend
    choice = f"sglang's choice on the {node.gpu_name}"
    picked = picked_by if not named_decode and la is not None else ""
    parts = []
    for side, value, named in (("prefill", prefill, named_prefill), ("decode", decode or named_decode, named_decode)):
        if value is None:
            continue
        parts.append(f"{side} {value} (" + ("named by the launch" if named and named == value
                                            else f"picked by {picked} under DCP" if picked and value == decode
                                            else choice) + ")")
    return result.Backends(prefill, decode or named_decode, "; ".join(parts) or "not resolved",
                           la.speculative_draft_attention_backend if la is not None else None, picked)


def judge_passes(release, given: argparse.Namespace, configs: dict, la=None, *,
                 plugin_on: bool = False) -> passes_mod.Judgement:
    """What the pass map says of the launch's passes under DCP (docs/spec-under-dcp.md): the speculative ones, or
    a plain launch's EXTEND and DECODE.

    From the launch as sglang resolved it on the emulated node where it did:
    the decode backend is the one the release picks there (its default for
    the architecture and model, model hooks included) unless the launch names
    one. From sglang's own parse of the arguments (``given``) where every
    resolution refused, so a rejection still names the pass that would break;
    a launch that names no backend is then judged on every target backend the
    map ran. A flashinfer MLA target's verify is judged as the launch runs it:
    planned split where the tree carries upstream-next 0012 or the
    plugin is on and its hooks apply to this release.
    """
    launch = la if la is not None else given
    algorithm = launch.speculative_algorithm
    # The decode backend the release resolved on the emulated node; the arguments' where nothing resolved.
    backend = (la.attention_backends[1] if la is not None else None) or given.decode_attention_backend or \
        given.attention_backend
    dcp = la.dcp_size if la is not None else (1 if given.dcp_size is None else int(given.dcp_size))
    target = launch.model_path
    draft = la.draft_model_path if la is not None else given.speculative_draft_model_path
    hicache = bool(launch.enable_hierarchical_cache)
    mla = models_mod.is_mla_config(configs["target"])
    if not algorithm:
        if dcp > 1 and not mla:
            return passes_mod.Judgement(passes_mod.release_key(release.version), passes_mod.PLAIN, dcp, False,
                                        why_unmapped="the map's targets are MLA models; a dense target under DCP is "
                                                     "not mapped")
        return passes_mod.judge_plain(release.version, dcp=dcp, target_backend=backend)
    verify_fix = _verify_fix(plugin_on) if backend == "flashinfer" and mla and dcp > 1 else None
    own_layer = draft in (None, target)
    return passes_mod.judge(
        release.version, algorithm, dcp=dcp, own_layer=own_layer, target_mla=mla,
        target_backend=backend, draft_backend=given.speculative_draft_attention_backend, hicache=hicache,
        verify_fix=verify_fix, draft_mla=not own_layer and models_mod.is_mla_config(configs["draft"]),
    )


def _verify_fix(plugin_on: bool) -> str | None:
    """Who plans a flashinfer MLA verify split under DCP on this tree: its code (upstream-next 0012) or, with the
    plugin on, the plugin's hooks where they apply to the release; None: the release's own verify."""
    return hooks_mod.verify_fix(plugin_on=plugin_on)


def _applied_series() -> list[str]:
    from .. import series
    from ..core.compat import locate_tree

    try:
        tree = locate_tree(None)
    except DcpDsparkError:
        return []
    return series.applied_to(tree)


@launch_mod.kernels_uncompiled
def prepare(launch: list[str], node: Node, device_rows: int | None):
    """Check preflight's own input, read the configs, import sglang once and pick its adapter."""
    from . import releases

    check_node(node, device_rows)
    argv = list(launch) or default_launch()
    target_path = launch_mod.option(argv, "--model-path") or launch_mod.option(argv, "--model")
    target_config = launch_mod.read_config(target_path, "--model-path")
    draft_path = launch_mod.option(argv, "--speculative-draft-model-path")
    draft_config = launch_mod.read_config(draft_path, "--speculative-draft-model-path") if draft_path else None
    launch_mod.import_sglang()
    release = releases.installed()
    launch_mod.check_architecture(target_config, target_path, "--model-path", release.version)
    if draft_config is not None:
        launch_mod.check_architecture(draft_config, draft_path, "--speculative-draft-model-path", release.version)
    paths = {"--model-path": target_path, **({"--speculative-draft-model-path": draft_path} if draft_path else {})}
    return release, argv, {"target": target_config, "draft": draft_config, "paths": paths}


def run(launch: list[str], node: Node, device_rows: int | None = None) -> result.Report:
    default_rows = not launch and device_rows is None
    if default_rows:
        device_rows = DEFAULT_DEVICE_ROWS
    release, argv, configs = prepare(launch, node, device_rows)
    report = judge(release, argv, node, device_rows, configs)
    if default_rows and isinstance(report.sizing, result.Sizing):
        report = dataclasses.replace(report, sizing=dataclasses.replace(report.sizing, device_rows_note=DEFAULT_DEVICE_ROWS_NOTE))
    return report
