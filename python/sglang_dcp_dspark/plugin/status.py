"""What the plugin does for a tree at run time, in one line for ``sglang-dcp-dspark status``.

Judged from the version and the environment without importing the tree; at
start-up the hooks judge the code itself.
"""

from __future__ import annotations

from . import switch


def handles(version: str | None) -> bool:
    """Is this the release the 0.5.17 hooks were written for (any post or local build of it)?"""
    from ..core.compat import parse_version
    from .hooks import WRITTEN_FOR

    parsed = parse_version(version)
    return parsed is not None and parsed.release[:3] == parse_version(WRITTEN_FOR).release[:3]


def sidecar_carries(version: str | None) -> str | None:
    """What the hooks do on this release after the upstream fix, or None where they have nothing to hook.

    The sidecar entries from the hook table (:data:`hooks.SIDECAR_CARRIES`),
    with why the missing ones are missing; the speculative check wherever
    the pass map shows a launch kind that reads other rows under DCP
    (:func:`passes.broken_kinds`). The sharded draft backup stays series-only.
    """
    from .. import passes
    from ..core.compat import parse_version
    from .hooks import SIDECAR_CARRIES

    parsed = parse_version(version)
    if parsed is None or parsed.release[:2] != (0, 5):
        return None
    present = [does for since, _, does, _ in SIDECAR_CARRIES if parsed >= parse_version(since)]
    missing = [why for since, _, _, why in sorted(SIDECAR_CARRIES, key=lambda row: parse_version(row[0]))
               if parsed < parse_version(since) and why]
    does = None
    if present:
        does = present[0] if len(present) == 1 else f"{', '.join(present[:-1])} and {present[-1]}"
        if missing:
            does += f" ({'; '.join(dict.fromkeys(missing))})"
    release = passes.release_key(version)
    if release in passes.releases() and passes.measured(release) and passes.broken_kinds(release):
        check = REFUSES
        does = f"{does}, and {check}" if does else check
    return does


REFUSES = ("refuses under DCP, at argument time, the speculative launches the pass map shows reading other rows "
           "(and a plain launch on a backend whose passes it shows broken)")


def status_line(version: str | None, series_statuses=(), environ=None) -> str:
    """One line for ``sglang-dcp-dspark status``: what the plugin does for this tree at run time, and what only a series would.

    Judged from the version and the environment, without importing the tree;
    at start-up the hooks judge the code itself. ``series_statuses`` (from
    ``patching.inspect``) say whether a series is in the tree or would apply.
    """
    import os

    from ..core.compat import version_at_least
    from .hooks import FIXED_UPSTREAM_IN

    state = switch.plugin_state(os.environ if environ is None else environ)
    label = f"{'plugin ' + switch.PLUGIN_NAME:<22} {('enabled' if state.enabled else 'off'):<18}"
    applied = [s.series.name for s in series_statuses if s.state.value == "applied"]
    applicable = [s.series.name for s in series_statuses if s.state.value == "applicable"]
    series_fix = (
        f"`sglang-dcp-dspark apply --series {applicable[0]}`" if applicable else "no series here applies to this release"
    )
    if applied:
        return f"{label} series {', '.join(applied)} applied; the plugin stands aside"
    if version_at_least(version, FIXED_UPSTREAM_IN):
        carries = sidecar_carries(version)
        also = f"; series {applicable[0]} also applies: {series_fix}" if applicable else ""
        if carries is None:
            return f"{label} sglang {version} carries the fix upstream; the plugin leaves it alone{also}"
        if not switch.entry_point_installed():
            return (f"{label} sglang {version} carries the fix upstream; the dcp_dspark entry point is not installed "
                    f"(pip install --no-deps a checkout of sglang-dcp-dspark), so nothing {carries.split(' (')[0]}{also}")
        if not state.enabled:
            return (f"{label} sglang {version} carries the fix upstream; {state.reason}, so the plugin's sidecar "
                    f"hooks are off: {switch.TURN_ON}{also}")
        return f"{label} sglang {version} carries the fix upstream; at run time the plugin {carries}{also}"
    if not handles(version):
        return f"{label} the plugin does not handle sglang {version or 'of unknown version'}; only a series would do: {series_fix}"
    if not switch.entry_point_installed():
        return f"{label} the dcp_dspark entry point is not installed (pip install --no-deps a checkout of sglang-dcp-dspark); only the series would do: {series_fix}"
    if not state.enabled:
        return f"{label} {state.reason}; only the series would do: {series_fix}, or turn the plugin on: {switch.TURN_ON}"
    from .. import passes

    release = passes.release_key(version)
    if release in passes.releases() and passes.measured(release) and passes.broken_kinds(release):
        return f"{label} fixed at run time by the plugin (series not needed); it also {REFUSES}"
    return f"{label} fixed at run time by the plugin (series not needed)"
