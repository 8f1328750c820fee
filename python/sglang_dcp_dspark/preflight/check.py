"""``sglang-dcp-dspark preflight``: will this launch pass sglang's validation, start, and what will HiCache pin?

The installed sglang judges the launch, through its own code: its parser and
resolution (read back after its own defaulting), and its own host-pool
builders on the meta device. This module gathers one judgement's facts: its
input is :mod:`inputs` (the default launch, the configs, sglang's parse, the
range checks); the launch on the emulated node :mod:`resolution` (sglang's
resolutions, what the launch runs, its passes); who refuses it
:mod:`refusals`; what it pins :mod:`sizing` (with the host-RAM model,
:mod:`hostram`). :func:`verdict.decide` turns the facts into the verdict, with
the change :mod:`advice` finds. What differs between releases lives in one
adapter per release family (:mod:`releases`); what the speculative passes
read, :mod:`passes`; the report, the sweep table and the chart are
:mod:`report`. A sweep of judgements is :mod:`sweep`, the command line
:mod:`cli.preflight`. The launch is judged twice, as stock sglang and with
this project's plugin hooks (judged and applied as the plugin applies them,
for the call only).

The exit code is the verdict on the launch as it will run (with the plugin
when sglang's ``load_plugins`` would run it, see :mod:`plugin.switch`); what
each code means is :mod:`core.exits`'.
"""

from __future__ import annotations

import dataclasses

from .. import passes as passes_mod
from ..plugin import hooks as hooks_mod
from . import advice as advice_mod
from . import inputs, refusals, resolution, result
from . import launch as launch_mod
from . import models as models_mod
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


def _refused(release, res, stock, state, runs, configs, given, node, *, checked: bool) -> verdict_mod.Refusal | None:
    """Who refuses the launch as it runs (``res``), and what, as facts: a plain mistake in the launch; else the
    plugin's check (``checked``: the launch passes with the plugin's hooks but without its check) or the series'
    on a tree that carries it, decided from the launch's facts; else sglang's own HiCache gates. Its message is
    quoted whole, with who raised it."""
    if res.passed:
        return None
    applied = applied_series()
    hooked = res is not stock and state.enabled
    source = "the plugin" if hooked and res.message != stock.message else f"sglang {release.version}"
    message = f"{source}: {res.message}"
    # A refusal of one short sentence can be quoted whole in the line.
    text = res.text.strip().removesuffix(".")
    words = text if "." not in text and ":" not in text else ""
    who = "the plugin" if hooked and stock.passed else f"sglang {release.version}"
    gate = refusals.input_gate(who, message, given, node=node)
    # sglang's HiCache gate runs before its speculative check: where the plugin's hook (or upstream-next 0020)
    # decides it, a draft whose host pool does not fit its layout is refused there first, after the gate's others,
    # which refuse the launch in sglang's words (hicache_gate below names them).
    other = refusals.other_gate(who, message, given, mla=models_mod.is_mla_config(configs.target))
    gate_fix = hooks_mod.hicache_gate_fix(plugin_on=hooked) if gate is None and other is None else None
    held = (resolution.hicache_refusal(runs, configs, launched=given.speculative_algorithm)
            if gate_fix is not None else None)
    if held is not None:
        gate = refusals.of_check("the plugin" if gate_fix == "plugin" else applied[-1], message, held)
    found = (resolution.refusal(release, runs, configs, plugin_on=state.enabled, launched=given.speculative_algorithm)
             if gate is None and ((hooked and checked) or applied) else None)
    if gate is None and found is not None:
        gate = refusals.of_check("the plugin" if hooked and checked else applied[-1], message, found)
    if gate is None:
        gate = refusals.hicache_gate(who, message, given, mla=models_mod.is_mla_config(configs.target),
                                     version=release.version)
    return dataclasses.replace(gate, words=words)


@launch_mod.kernels_uncompiled
def judge(release, argv: list[str], node: Node, device_rows: int | None, configs: Configs, *,
          variants: bool = False, advise: bool = True, plugin_on: bool | None = None) -> result.Report:
    """One launch on the installed release: sglang's verdict stock and with the plugin, the pools, the RAM.

    ``advise``: where the launch does not pass, judge the changes that could make it (:mod:`advice`) and name
    the first that passes. ``plugin_on``: judge as if the plugin were on (or off), whatever the environment
    says."""
    from ..plugin import switch

    paths = configs.paths
    decided = release.record()
    given = inputs.parse_launch(argv)
    state = resolution.plugin_state() if plugin_on is None else switch.PluginState(
        plugin_on, "as advised: with the plugin on" if plugin_on else "as advised: with the plugin off")
    stock = resolve(release, argv, node, paths, hooked=False)
    fixed = resolve(release, argv, node, paths, hooked=True)
    as_run = fixed if state.enabled else stock
    # What the plugin's hooks would run where its own check refuses the launch: the backend it picks under DCP,
    # the KV dtype as resolved. Its refusal is decided on those facts, so they are judged here too.
    unchecked = None
    if state.enabled and not fixed.passed:
        with hooks_mod.without_pass_check():
            unchecked = resolve(release, argv, node, paths, hooked=True)
        unchecked = unchecked if unchecked.passed else None
    # Bad input first: numbers no node could hold, or a config sglang cannot size, read off the resolution that
    # got through (stock's, where the plugin refused), are exit 2 whatever the verdict. A refused launch is then
    # sized as it would run if the refusing side admitted it.
    other = (as_run if as_run.passed else fixed if fixed.passed else stock if stock.passed and unchecked is None
             else unchecked)
    runs = resolution.runs(other.launch if other is not None else None, given)
    judged = judge_passes(release, runs, configs, plugin_on=state.enabled, node=node)
    stock_judged = (judge_passes(release, resolution.runs(stock.launch, given), configs, plugin_on=False, node=node)
                    if stock.passed else None)
    hooked = fixed if fixed.passed else unchecked or fixed
    backends = resolution.backends(runs, node, picked_by=resolution.picked_by(stock, hooked, state.enabled, runs))
    rel = result.Release(release.version, type(release).__module__.rsplit(".", 1)[1], release.first,
                         tuple(release.changes), tuple(applied_series()))
    sizing = la = None
    if other is not None:
        la = other.launch
        inputs.check_resolved(la, node)
        if la.enable_hierarchical_cache:
            models = read_models(release, la, node, paths)
        else:
            # No pools to size, but a geometry no model has is bad input all the same.
            read_models(release, la, node, paths, reader=models_mod.geometry)
            models = None
        sizing = size_pools(release, la, models, node, device_rows, plugin_on=state.enabled,
                            stock_la=stock.launch if stock.passed else la, variants=variants,
                            stock_passed=stock.passed)
    if device_rows is not None and (la is None or not la.enable_hierarchical_cache):
        check_device_rows(configs, node, device_rows)
    plugin = result.Plugin(state.enabled, state.reason, release.decisions(decided))
    stock_runs = resolution.runs(stock.launch, given) if stock.passed else runs
    facts = verdict_mod.Facts(
        release=rel, node=node, plugin_on=state.enabled, stock_passed=stock.passed, plugin_passed=fixed.passed,
        judged=judged, refused=_refused(release, as_run, stock, state, runs, configs, given, node,
                                        checked=unchecked is not None),
        stock_refused=_refused(release, stock, stock, switch.PluginState(False, ""), stock_runs, configs, given,
                               node, checked=False),
        sizing=sizing, admitted=as_run.passed, stock_judged=stock_judged, backend=backends.decode,
        backend_picked=backends.picked_by, warnings=tuple(as_run.warnings))

    def search(code: int):
        working = passes_mod.working_backends(
            release.version, runs.algorithm, dcp=runs.dcp, own_layer=runs.own_layer,
            capability_major=node.capability[0], hicache=runs.hicache,
            verify_fix=hooks_mod.verify_fix(plugin_on=state.enabled) if runs.algorithm else None,
            draft_mla=resolution.draft_mla(runs, configs)) if runs.dcp > 1 else ()
        changes = advice_mod.candidates(facts, runs, code=code, working=working,
                                        plugin_installed=switch.entry_point_installed())
        return advice_mod.search(judge, release, argv, node, device_rows, configs, changes,
                                 plugin_on=state.enabled, code=code)

    verdict = verdict_mod.decide(facts, search if advise else None)
    return result.Report(
        release=rel, launch=tuple(argv), node=node, plugin=plugin,
        stock=result.Outcome(stock.passed, stock.message), with_plugin=result.Outcome(fixed.passed, fixed.message),
        sglang_warnings=tuple(as_run.warnings),
        attention_backends=backends, passes=judged, verdict=verdict,
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
