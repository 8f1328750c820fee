"""The plugin in a scheduler's real start-up order (load_plugins, then sglang's configure_logger): its decision lines, fail-closed hooks, quiet and CUDA-free probes, and the off switch, on 0.5.17, 0.5.18 and 0.5.23.

The decision lines reach sglang's configured log without a hook on
``configure_logger`` (see sglang_dcp_dspark.plugin.decisions). On 0.5.23 the sidecar
hooks are hooked and a real tree-cache build goes through them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_dcp_dspark.plugin.switch import SWITCH_ENV, WHITELIST_ENV
from tree_table import TREES as TREE_TABLE
from trees import BUILD_TREES

CHILD = Path(__file__).parents[1] / "plugin_startup.py"
# The stock releases, from the trees table: the venv's own sglang has no directory there.
TREES = {t.sglang: BUILD_TREES / t.dir if t.dir else None for t in map(TREE_TABLE.get, ("stock", "upstream-0.5.18", "next-stock"))}
# sglang's configured format: "[date time prefix] message" (configure_logger, prefix " TP0" here).
CONFIGURED = r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP0\] "
RESOLVER = "sglang.srt.server_args.ServerArgs._resolve_hicache_dcp_compatibility"
REGISTRATION = "sglang.srt.mem_cache.kv_cache_builder.maybe_register_hicache_draft"
BUDGET = "sglang.srt.managers.scheduler.Scheduler.init_memory_pools"
ASSEMBLER = "sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler"
STACK, GROUP, SIDECAR = f"{ASSEMBLER}.build_kv_only_stack", f"{ASSEMBLER}.build_kv_only_group", f"{ASSEMBLER}.build_full_draft_pools"
AUTO_SIZE = "sglang.srt.mem_cache.hicache_auto_size._draft_bytes"
ESTIMATE = "sglang.srt.mem_cache.hicache_auto_size._estimate_hicache_bytes"
HICACHE_GATE = "sglang.srt.arg_groups.hicache_hook.resolve_hicache_dcp_compatibility"
# The backend pick under DCP on Hopper: ServerArgs' own method up to 0.5.18, arg_groups.overrides' from 0.5.19.
PICK, OVERRIDES_PICK = "sglang.srt.server_args.ServerArgs._get_default_attn_backend", "sglang.srt.arg_groups.overrides.get_default_attn_backend"
PICKED = "under DCP sglang picks fa3 for an MLA model on Hopper, which has no DCP code"
# The speculative check sits on argument resolution (arg_groups.speculative_hook), which a scheduler does not import.
SPECULATIVE = "sglang.srt.arg_groups.speculative_hook.handle_speculative_decoding"
NO_SIDECAR_PARAMS = "CacheInitParams has no sidecar_draft_device_pools (0.5.23 adds it), so build_kv_only_stack cannot see the draft sidecar"


def start(*flags: str, tree: str = "0.5.17", env: dict[str, str] | None = None) -> tuple[dict, list[str]]:
    """Run the child; returns its JSON result and its log lines (stderr)."""
    environ = {k: v for k, v in os.environ.items() if k not in (WHITELIST_ENV, SWITCH_ENV, "PYTHONPATH")}
    if TREES[tree] is not None:
        assert TREES[tree].is_dir(), f"{TREES[tree]} is missing; expected sglang {tree} installed there; fix: make upstream-trees next-trees (the test is marked trees: make check leaves it to make test)"
        environ["PYTHONPATH"] = str(TREES[tree])
    environ.update(env or {})
    done = subprocess.run([sys.executable, str(CHILD), *flags], env=environ, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr.splitlines()


def plugin_lines(log: list[str]) -> list[str]:
    return [line for line in log if "dcp_dspark: " in line and "plugin=dcp_dspark" not in line]


EXPECTED = {
    "0.5.17": [
        f"dcp_dspark: hooked {RESOLVER}: the resolver rejects DSPARK under DCP + HiCache",
        f"dcp_dspark: hooked {PICK}: {PICKED}",
        f"dcp_dspark: hooked {REGISTRATION}: the draft host pool is sized from physical rows (160 rows for 288 logical slots at dcp 2)",
        f"dcp_dspark: hooked {BUDGET}: --hicache-size sizes the target host pool alone",
        f"dcp_dspark: left {OVERRIDES_PICK} alone (not for this release): sglang.srt.arg_groups.overrides has no get_default_attn_backend in this release; nothing to hook",
    ],
    "0.5.18": [
        f"dcp_dspark: left {RESOLVER} alone (already fixed): the resolver already admits DSPARK under DCP + HiCache",
        f"dcp_dspark: hooked {PICK}: {PICKED}",
        f"dcp_dspark: left {REGISTRATION} alone (already fixed): sglang 0.5.18 carries the fix upstream (registration probe failed: TypeError: ",
        f"dcp_dspark: left {BUDGET} alone (not for this release): the budget hook is for sglang 0.5.17, found 0.5.18",
        f"dcp_dspark: left {STACK} alone (not for this release): {NO_SIDECAR_PARAMS}",
        f"dcp_dspark: left {GROUP} alone (not for this release): follows build_kv_only_stack: {NO_SIDECAR_PARAMS}",
        f"dcp_dspark: left {SIDECAR} alone (not for this release): this draft sidecar builder takes server_args (0.5.18)",
        f"dcp_dspark: left {OVERRIDES_PICK} alone (not for this release): sglang.srt.arg_groups.overrides has no get_default_attn_backend in this release; nothing to hook",
    ],
    "0.5.23": [
        f"dcp_dspark: left {RESOLVER} alone (not for this release): sglang.srt.server_args.ServerArgs has no _resolve_hicache_dcp_compatibility in this release; nothing to hook",
        f"dcp_dspark: left {PICK} alone (not for this release): sglang.srt.server_args.ServerArgs has no _get_default_attn_backend in this release; nothing to hook",
        f"dcp_dspark: left {REGISTRATION} alone (already fixed): sglang 0.5.23 carries the fix upstream (registration probe failed: TypeError: MLATokenToKVPoolHost.__init__() missing ",
        f"dcp_dspark: left {BUDGET} alone (not for this release): the budget hook is for sglang 0.5.17, found 0.5.23",
        f"dcp_dspark: hooked {STACK}: --hicache-size sizes the target host pool alone (96 rows with or without a draft sidecar at dcp 2); the hook gives the target t / (t + dcp_size * d) of --hicache-size",
        f"dcp_dspark: hooked {GROUP}: build_kv_only_stack passes it no host_size; the budget goes in there; the hook builds the target host pool at that share",
        f"dcp_dspark: hooked {SIDECAR}: a draft sidecar of 256 rows for 288 logical slots builds without complaint; the hook stops startup",
        f"dcp_dspark: hooked {AUTO_SIZE}: the estimate prices the draft sidecar at the target's physical rows (92160 bytes for 2x as many at dcp 2)",
        f"dcp_dspark: hooked {ESTIMATE}: follows _draft_bytes: ",
        f"dcp_dspark: hooked {HICACHE_GATE}: the gate refuses every draft but DSPARK under DCP + HiCache",
        f"dcp_dspark: hooked {OVERRIDES_PICK}: {PICKED}",
    ],
}


@pytest.mark.parametrize("tree", [pytest.param(release, marks=[pytest.mark.trees] if path else [])
                                  for release, path in TREES.items()])
def test_one_decision_line_per_hook_in_the_configured_log_and_no_cuda(tree):
    flags = ["--cuda-trap"] + (["--hooked-call"] if tree == "0.5.17" else ["--sidecar-call"] if tree == "0.5.23" else [])
    got, log = start(*flags, tree=tree)
    lines = plugin_lines(log)
    assert len(lines) == len(EXPECTED[tree]), log
    for line, want in zip(lines, EXPECTED[tree], strict=True):
        assert re.match(CONFIGURED, line), line  # sglang's format and prefix: written after configure_logger
        assert line[line.index("] ") + 2 :].startswith(want), line
    assert got["touched"] == []  # the probes called no torch.cuda entry point and imported no sgl_kernel
    if tree == "0.5.17":
        assert got["call"] == "draft rows 17408 for 16896 logical slots"
        assert {t: got["findings"][t] for t in (RESOLVER, REGISTRATION, BUDGET)} == dict.fromkeys(
            (RESOLVER, REGISTRATION, BUDGET), "NEEDS_FIX")
        assert SPECULATIVE not in got["findings"]
    if tree == "0.5.23":
        # The scheduler's own build went through the hooks: the budget shares 100 GB with the dcp-8 draft
        # (upstream-next 0001's rows; stock 0.5.23 gives the target 1,400,128 rows and pins the draft on top).
        assert got["sidecar"] == {"target_rows": 1_258_112, "draft_rows": 10_064_896}
        hooked = (STACK, GROUP, SIDECAR, AUTO_SIZE, ESTIMATE)
        assert {t: got["findings"][t] for t in hooked} == dict.fromkeys(hooked, "NEEDS_FIX")


def test_unrecognised_pool_signature_warns_at_any_log_level_and_the_launch_stops_short_of_overflow():
    got, log = start("--new-pool-arg", "--hooked-call", "--log-level", "error")
    lines = plugin_lines(log)
    # INFO lines follow --log-level error; the two warnings do not.
    assert len(lines) == 2 and all(re.match(CONFIGURED, line) for line in lines), log
    assert f"dcp_dspark: code not recognised, check-only hook on {REGISTRATION}: " in lines[0]
    assert "missing 1 required keyword-only argument: 'layout_hint_from_a_later_release'" in lines[0]
    assert f"dcp_dspark: code not recognised, left {BUDGET} alone: budget probe failed: TypeError" in lines[1]
    # The resolver was hooked (the launcher admits DSPARK), so this scheduler must stop, never run short.
    assert got["findings"][RESOLVER] == "NEEDS_FIX"
    assert got["call"].startswith("DraftHostPoolTooSmall: draft HiCache host pool has 2560 rows but the target host pool addresses 16896")
    assert "\n" not in got["call"] and "sglang-dcp-dspark apply" in got["call"]


def test_a_failed_registration_probe_installs_the_check_only_hook():
    got, log = start("--probe-failure", "--hooked-call")
    assert got["findings"][REGISTRATION] == "UNRECOGNISED"
    assert any("check-only hook on" in line and "injected probe failure" in line for line in plugin_lines(log)), log
    assert got["call"].startswith("DraftHostPoolTooSmall: ") and "does not recognise this sglang's draft registration" in got["call"]


def test_probe_pools_leave_no_lines_in_sglangs_log():
    # Logging configured first, so the probes (at the scheduler's import) run with sglang's log live.
    got, log = start("--configure-first", "--hooked-call")
    allocations = [line for line in log if "is allocated" in line or "hierarchical KV host pool" in line]
    assert any("#tokens: 8192" in line for line in allocations), log  # the real pools' lines do show
    assert not [line for line in allocations if "#tokens: 64," in line or "#tokens: 128," in line or " 160 tokens" in line]
    assert len(plugin_lines(log)) == len(EXPECTED["0.5.17"])  # a process configured before load_plugins() still gets its lines


def test_off_switch_hooks_nothing_and_says_so_once():
    got, log = start("--hooked-call", env={SWITCH_ENV: "0"})
    assert got["findings"] == {}
    assert got["call"] == "draft rows 2560 for 16896 logical slots"  # stock sizing, unhooked
    assert plugin_lines(log) == [
        f"dcp_dspark: plugin off ({SWITCH_ENV}=0); no sglang code is hooked"
    ], log


def test_the_operator_guide_quotes_the_lines_these_tests_check():
    guide = (Path(__file__).resolve().parents[2] / "docs" / "operator-guide.md").read_text(encoding="utf-8")
    quoted = " ".join(guide.split())  # the guide wraps prose lines
    for line in EXPECTED["0.5.17"]:
        assert f"TP0] {line}\n" in guide, line
    assert f"\ndcp_dspark: plugin off ({SWITCH_ENV}=0); no sglang code is hooked\n" in guide
    assert f"dcp_dspark: code not recognised, check-only hook on {REGISTRATION}: sglang's own sizing runs and startup stops if the draft host pool is short: ..." in quoted
    assert "left ... alone (not for this release): the budget hook is for sglang 0.5.17, found 0.5.18" in quoted
