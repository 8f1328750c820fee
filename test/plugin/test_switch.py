"""switch.plugin_state: sglang's SGLANG_PLUGINS whitelist and the plugin's own off switch, checked against real load_plugins()."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sglang_dcp_dspark.plugin import switch
from sglang_dcp_dspark.plugin.switch import SWITCH_ENV, WHITELIST_ENV, plugin_state


@pytest.mark.parametrize(
    "environ,enabled,says",
    [
        ({}, True, "SGLANG_PLUGINS is not set"),
        ({WHITELIST_ENV: ""}, True, "SGLANG_PLUGINS is empty (no whitelist)"),  # empty is no whitelist, not "none"
        ({WHITELIST_ENV: "dcp_dspark"}, True, "names dcp_dspark"),
        ({WHITELIST_ENV: " other , dcp_dspark "}, True, "names dcp_dspark"),
        ({WHITELIST_ENV: "other"}, False, "does not name dcp_dspark"),
        ({WHITELIST_ENV: ","}, False, "does not name dcp_dspark"),  # non-empty, no names: sglang runs no plugin
        ({WHITELIST_ENV: "dcp_dspark_extra"}, False, "does not name"),  # whole names, not prefixes
        ({SWITCH_ENV: "0"}, False, f"switched off: {SWITCH_ENV}=0"),
        ({SWITCH_ENV: "off"}, False, "switched off"),
        ({SWITCH_ENV: "FALSE"}, False, "switched off"),
        ({SWITCH_ENV: "n"}, False, "switched off"),
        ({SWITCH_ENV: "1"}, True, f"{SWITCH_ENV}=1"),
        ({SWITCH_ENV: "Yes"}, True, "enabled"),
        ({SWITCH_ENV: "disabled"}, False, "is not a boolean"),  # a typo turns it off, never silently on
        ({SWITCH_ENV: ""}, False, "is not a boolean"),
        ({WHITELIST_ENV: "other", SWITCH_ENV: "1"}, False, "sglang skips it"),  # the whitelist wins
    ],
)
def test_plugin_state(environ, enabled, says):
    state = plugin_state(environ)
    assert state.enabled is enabled
    assert says in state.reason and "\n" not in state.reason


def test_default_reads_the_process_environment(monkeypatch):
    monkeypatch.setenv(SWITCH_ENV, "off")
    assert plugin_state().enabled is False
    monkeypatch.delenv(SWITCH_ENV)
    monkeypatch.delenv(WHITELIST_ENV, raising=False)
    assert plugin_state().enabled is True


def test_the_entry_point_is_installed():
    assert switch.entry_point_installed()


# In a fresh interpreter: does sglang's real load_plugins() run register(), and does register() act?
CHILD = """
import json, sys
from sglang.srt.plugins import load_plugins
load_plugins()
ran = "sglang_dcp_dspark.plugin" in sys.modules  # ep.load() imports it only for a plugin sglang runs
from sglang_dcp_dspark import plugin
from sglang_dcp_dspark.plugin import switch
print(json.dumps({"acted": ran and plugin.active is True, "state": switch.plugin_state().enabled}))
"""


@pytest.mark.parametrize(
    "environ",
    [{}, {WHITELIST_ENV: ""}, {WHITELIST_ENV: "other"}, {WHITELIST_ENV: ","}, {SWITCH_ENV: "off"}],
    ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()) or "unset",
)
def test_plugin_state_agrees_with_real_load_plugins(environ):
    env = {k: v for k, v in os.environ.items() if k not in (WHITELIST_ENV, SWITCH_ENV, "PYTHONPATH")}
    env.update(environ)
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["acted"] == got["state"] == plugin_state(environ).enabled
