"""``sglang-dcp-dspark preflight``: will this launch pass sglang's validation, start, and what will HiCache pin?

The installed sglang judges the launch, through its own code: its parser and
resolution (read back after its own defaulting), and its own host-pool
builders on the meta device. This module puts one judgement together: its
input is :mod:`inputs` (the default launch, the configs, sglang's parse, the
range checks); the launch on the emulated node :mod:`resolution` (sglang's
resolutions, what the launch runs, its passes, the advice); what it pins
:mod:`sizing` (with the host-RAM model, :mod:`hostram`); the verdict's words
:mod:`verdict`. What differs between releases lives in one adapter per
release family (:mod:`releases`); what the speculative passes read,
:mod:`passes`; the report, the sweep table and the chart are :mod:`report`.
A sweep of judgements is :mod:`sweep`, the command line :mod:`cli.preflight`.
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

import dataclasses

from .. import passes as passes_mod
from ..plugin import hooks as hooks_mod
from . import inputs, resolution, result
from . import launch as launch_mod
from . import verdict as verdict_mod
from .inputs import (
    DEFAULT_DEVICE_ROWS,
    DEFAULT_DEVICE_ROWS_NOTE,
    DEFAULT_DRAFT,
    DEFAULT_GPU,
    DEFAULT_LAUNCH,
    DEFAULT_MODEL,
    Configs,
    default_launch,
    default_node,
)
from .launch import Node, emulated_node
from .resolution import applied_series, judge_passes, read_models, resolve
from .sizing import check_device_rows, size_pools

# What other code imports from here: the default launch and its node, the node type, and the judgement.
__all__ = ["DEFAULT_DEVICE_ROWS", "DEFAULT_DRAFT", "DEFAULT_GPU", "DEFAULT_LAUNCH", "DEFAULT_MODEL", "Node",
           "default_launch", "default_node", "emulated_node", "judge", "prepare", "run"]


def outcome(passed: bool, judged, sizing) -> tuple[int, object]:
    """The exit code of a judged launch, and what stops it where it stops at startup."""
    if not passed:
        return verdict_mod.REJECTED, None
    stops = sizing.host_ram.stops if isinstance(sizing, result.Sizing) else ()
    if stops:
        return verdict_mod.STOPS, stops[0]
    refusing = [f for f in judged.broken if verdict_mod.refuses_at_startup(f)]
    if refusing:
        return verdict_mod.STOPS, refusing[0]
    if judged.broken:
        return verdict_mod.BROKEN_PASS, None
    if judged.dcp > 1 and not judged.mapped:
        return verdict_mod.UNCHECKED, None
    return verdict_mod.PASSES, None


def _refused_by_plugin(release, argv: list[str], node: Node, paths, state, stock, fixed):
    """The launch as the plugin resolves it, where the plugin refuses a launch on a quantized KV pool that stock
    admits, else None. The plugin decides that refusal on the launch as it resolves it (the backend it picks under
    DCP, the KV dtype as resolved: ``passes.kv_cache_refusal``), so the same facts are judged here; any other
    refusal of the plugin's is judged on stock's resolution, as before."""
    if not (state.enabled and stock.passed and not fixed.passed and passes_mod.quantized_kv(stock.launch.kv_cache_dtype)):
        return None
    with hooks_mod.without_pass_check():
        unchecked = resolve(release, argv, node, paths, hooked=True)
    return unchecked.launch if unchecked.passed else None


@launch_mod.kernels_uncompiled
def judge(release, argv: list[str], node: Node, device_rows: int | None, configs: Configs, *,
          variants: bool = False, advise: bool = True, plugin_on: bool | None = None) -> result.Report:
    """One launch on the installed release: sglang's verdict stock and with the plugin, the pools, the RAM.

    ``advise``: where the launch does not pass, judge the changes that could make it (another attention backend
    the pass map shows running it, the plugin on, --dcp-size 1, a --hicache-size that fits) and name the first
    that passes. ``plugin_on``: judge as if the plugin were on (or off), whatever the environment says."""
    from ..plugin import switch

    paths = configs.paths
    given = inputs.parse_launch(argv)
    state = resolution.plugin_state() if plugin_on is None else switch.PluginState(
        plugin_on, "as advised: with the plugin on" if plugin_on else "as advised: with the plugin off")
    stock = resolve(release, argv, node, paths, hooked=False)
    fixed = resolve(release, argv, node, paths, hooked=True)
    as_run = fixed if state.enabled else stock
    # Bad input first: numbers no node could hold, or a config sglang cannot size, read off the resolution that
    # got through (stock's, where the plugin refused), are exit 2 whatever the verdict. A refused launch is then
    # sized as it would run if the refusing side admitted it.
    other = as_run if as_run.passed else fixed if fixed.passed else stock if stock.passed else None
    if other is None and state.enabled:
        # Refused both ways, the plugin's pass check among the refusals: what it would pin without that check
        # (with the plugin's hooks, but not its argument-time pass check), where sglang admits it then.
        with hooks_mod.without_pass_check():
            unchecked = resolve(release, argv, node, paths, hooked=True)
        other = unchecked if unchecked.passed else None
    runs = resolution.runs(as_run.launch or _refused_by_plugin(release, argv, node, paths, state, stock, fixed)
                           or (other.launch if other is not None else None), given)
    judged = judge_passes(release, runs, configs, plugin_on=state.enabled)
    stock_judged = (judge_passes(release, resolution.runs(stock.launch, given), configs, plugin_on=False)
                    if stock.passed else None)
    backends = resolution.backends(runs, node, picked_by=resolution.picked_by(stock, fixed, state.enabled, runs))
    rel = result.Release(release.version, type(release).__module__.rsplit(".", 1)[1], release.first,
                         tuple(release.changes), tuple(applied_series()))
    sizing = la = None
    if other is not None:
        la = other.launch
        inputs.check_resolved(la, node)
        models = read_models(release, la, node, paths) if la.enable_hierarchical_cache else None
        sizing = size_pools(release, la, models, node, device_rows, plugin_on=state.enabled,
                            stock_la=stock.launch if stock.passed else la, variants=variants,
                            stock_passed=stock.passed)
    elif device_rows is not None:
        check_device_rows(configs, node, device_rows)
    # What the plugin's hooks decided on this launch, before the advice judges others with the same adapter.
    plugin = result.Plugin(state.enabled, state.reason, release.decisions())
    facts = verdict_mod.Facts(
        release=rel, node=node, plugin_on=state.enabled, stock_passed=stock.passed, stock_message=stock.message,
        plugin_passed=fixed.passed, plugin_message=fixed.message, judged=judged, sizing=sizing,
        admitted=as_run.passed, stock_judged=stock_judged, backend=backends.decode,
        backend_picked=backends.picked_by, warnings=tuple(as_run.warnings))
    code, stop = outcome(as_run.passed, judged, sizing)
    advice = (resolution.advise(judge, release, argv, node, device_rows, configs, code=code, launch=runs,
                                plugin_on=state.enabled, sizing=sizing, refused_kv=judged.refused_kv)
              if advise and code != verdict_mod.PASSES else None)
    return result.Report(
        release=rel, launch=tuple(argv), node=node, plugin=plugin,
        stock=result.Outcome(stock.passed, stock.message), with_plugin=result.Outcome(fixed.passed, fixed.message),
        sglang_warnings=tuple(as_run.warnings),
        attention_backends=backends, passes=judged, verdict=verdict_mod.of(code, facts, stop, advice),
        resolved=la.fields() if la is not None else None, sizing=sizing)


@launch_mod.kernels_uncompiled
def prepare(launch: list[str], node: Node, device_rows: int | None) -> tuple[object, list[str], Configs]:
    """Check preflight's own input, read the configs, import sglang once and pick its adapter."""
    from . import releases

    inputs.check_node(node, device_rows)
    argv = list(launch) or default_launch()
    configs = inputs.read_configs(argv)
    launch_mod.import_sglang()
    release = releases.installed()
    inputs.check_architectures(configs, release.version)
    return release, argv, configs


def run(launch: list[str], node: Node, device_rows: int | None = None) -> result.Report:
    default_rows = not launch and device_rows is None
    if default_rows:
        device_rows = DEFAULT_DEVICE_ROWS
    release, argv, configs = prepare(launch, node, device_rows)
    report = judge(release, argv, node, device_rows, configs)
    if default_rows and isinstance(report.sizing, result.Sizing):
        report = dataclasses.replace(report, sizing=dataclasses.replace(report.sizing, device_rows_note=DEFAULT_DEVICE_ROWS_NOTE))
    return report
