"""Whether sglang will run this plugin in a process started with a given environment.

Two environment variables decide it, and this module is the one place that
reads them (the plugin, preflight and ``status`` all ask :func:`plugin_state`):

- ``SGLANG_PLUGINS``, sglang's own whitelist, parsed exactly as
  ``sglang.srt.plugins.load_plugins_by_group`` parses it: unset or empty means
  *no whitelist* (every installed plugin runs, this one included); any other
  value is split on commas, names stripped, and only the names left run. So
  ``SGLANG_PLUGINS=,`` runs no plugin at all, and ``SGLANG_PLUGINS=`` does not
  turn this one off.
- ``SGLANG_ENABLE_DCP_DSPARK_PLUGIN``, this plugin's own off switch. The name
  follows sglang's ``SGLANG_ENABLE_*`` boolean flags (``srt/environ.py``), and
  the values are those of sglang's ``EnvBool`` (1/true/yes/y, 0/false/no/n,
  any case) plus on/off. Unlike ``EnvBool``, which warns and falls back to the
  default, a value that is not a boolean turns the plugin *off*: an operator
  who typed something meant to change the default, and an unpatched 0.5.17
  refuses DSPARK under DCP + HiCache at argument time, which is the safe side.
  The switch exists because the whitelist cannot say "everything but this one"
  without naming every other plugin.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

PLUGIN_NAME = "dcp_dspark"
ENTRY_POINT_GROUP = "sglang.srt.plugins"
WHITELIST_ENV = "SGLANG_PLUGINS"
SWITCH_ENV = "SGLANG_ENABLE_DCP_DSPARK_PLUGIN"
TURN_ON = f"unset {SWITCH_ENV} (or set it to 1), and leave {WHITELIST_ENV} unset or add {PLUGIN_NAME} to it"

_TRUE = frozenset({"true", "1", "yes", "y", "on"})
_FALSE = frozenset({"false", "0", "no", "n", "off"})


class PluginState(NamedTuple):  # read in every sglang process's load_plugins(): no dataclass to build
    enabled: bool
    reason: str


def switch_state(environ: Mapping[str, str] = os.environ) -> PluginState:
    """The off switch alone: what :func:`register` itself obeys."""
    raw = environ.get(SWITCH_ENV)
    if raw is None:
        return PluginState(True, f"{SWITCH_ENV} is not set")
    value = raw.strip().lower()
    if value in _TRUE:
        return PluginState(True, f"{SWITCH_ENV}={raw}")
    if value in _FALSE:
        return PluginState(False, f"{SWITCH_ENV}={raw}")
    return PluginState(
        False, f"{SWITCH_ENV}={raw!r} is not a boolean (expected 1/true/yes/y/on or 0/false/no/n/off), so the plugin is off"
    )


def whitelist_state(environ: Mapping[str, str] = os.environ) -> PluginState:
    """``SGLANG_PLUGINS`` alone, with sglang's parsing (see the module docstring)."""
    raw = environ.get(WHITELIST_ENV, "")
    if not raw:
        return PluginState(True, f"{WHITELIST_ENV} is {'empty' if WHITELIST_ENV in environ else 'not set'} (no whitelist)")
    allowed = {name.strip() for name in raw.split(",") if name.strip()}
    if PLUGIN_NAME in allowed:
        return PluginState(True, f"{WHITELIST_ENV}={raw} names {PLUGIN_NAME}")
    return PluginState(False, f"{WHITELIST_ENV}={raw} does not name {PLUGIN_NAME}")


def plugin_state(environ: Mapping[str, str] = os.environ) -> PluginState:
    """Will ``load_plugins()`` run this plugin, and will it act? ``reason`` says why, in one clause."""
    whitelist = whitelist_state(environ)
    if not whitelist.enabled:
        return PluginState(False, f"sglang skips it: {whitelist.reason}")
    switch = switch_state(environ)
    if not switch.enabled:
        return PluginState(False, f"switched off: {switch.reason}")
    return PluginState(True, f"enabled: {whitelist.reason}, {switch.reason}")


def entry_point_installed() -> bool:
    """Is the ``dcp_dspark`` entry point registered where ``load_plugins()`` looks?

    Importing this package proves nothing: a source checkout on PYTHONPATH
    imports fine, but sglang only finds plugins through installed metadata.
    """
    from importlib.metadata import entry_points

    return any(ep.name == PLUGIN_NAME for ep in entry_points(group=ENTRY_POINT_GROUP))
