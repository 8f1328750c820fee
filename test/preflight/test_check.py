"""preflight on sglang 0.5.17 (the default tree): the report, its input checks, its exit codes, sweeps and the docs' samples.

What is the same on every release (the launch matrix, the DSA indexer pool,
configs a release cannot load, auto-sizing, the series' draft backups) runs on
each release tree: test/releases/.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from report_text import below_verdict, verdict_line
from sglang_dcp_dspark.__main__ import main
from sglang_dcp_dspark.plugin.switch import SWITCH_ENV, WHITELIST_ENV
from sglang_dcp_dspark.preflight.inputs import (
    DEFAULT_DEVICE_ROWS,
    DEFAULT_DEVICE_ROWS_NOTE,
    DEFAULT_DRAFT,
    DEFAULT_MODEL,
    MAX_GPU_MEMORY_GIB,
)
from sglang_dcp_dspark.preflight.launch import GIB

GATE = "HiCache with --dcp-size > 1"
# The tests' own 2-layer MLA config; the default launch is DeepSeek-V3 (test_default_launch_*).
TINY = Path(__file__).parents[1] / "data" / "tiny-mla"
# The tiny config's device bytes per target row: 2 layers x (512 + 64) x 2 bytes,
# plus dcp_size x 2 draft layers when the same config is the replicated draft.
TARGET_ROW = 2 * 576 * 2
DRAFT_ROW_AT_DCP8 = TARGET_ROW + 8 * 2 * 576 * 2
# A generous bound on one preflight process: the sglang import alone is about
# 1 GB. Sizing that built sglang's per-slot bookkeeping for real (about 10
# bytes per logical slot) peaked at 3.4 GB at the largest --device-rows with a
# draft, and over 10 GB without one.
PEAK_RSS_LIMIT = 2 * GIB


# The nodes and backends the launches run on, so that each will start: a speculative launch under DCP on the
# Blackwell shape PR #35221 was validated on (cutedsl_mla, its passes checked against its kernel's contract: exit 0),
# at the H200's 141 GiB so the figures stay the H200's; a plain one on an H200 with flashinfer (exit 0).
SPECULATIVE_NODE = ("--gpu-name", "NVIDIA B200", "--gpu-memory-gib", "141")
PLAIN_NODE = ("--gpu-name", "NVIDIA H200")
CHECKED = 0  # the code of a launch on cutedsl_mla, the embedded default's backend


def launch(model=TINY, algorithm="DSPARK", *extra, draft=True):
    spec = ["--speculative-algorithm", algorithm, "--speculative-draft-model-path", str(model)] if draft else []
    node, backend = (SPECULATIVE_NODE, "cutedsl_mla") if draft else (PLAIN_NODE, "flashinfer")
    return [*node, "--", "--model-path", str(model), "--tp", "8", "--dcp-size", "8", "--enable-hierarchical-cache",
            *spec, "--attention-backend", backend, *extra]


def run_cli(*argv: str) -> tuple[int, str, str, int]:
    """preflight in a fresh process: exit code, stdout, stderr, and that process's own peak RSS in bytes (wait4).

    The plugin switches are unset, as in an operator's shell by default.
    """
    env = {name: value for name, value in os.environ.items() if name not in (WHITELIST_ENV, SWITCH_ENV)}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen([sys.executable, "-m", "sglang_dcp_dspark", "preflight", *argv], stdout=out, stderr=err,
                                 text=True, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return child.returncode, out.read(), err.read(), usage.ru_maxrss * 1024  # ru_maxrss is in KiB on Linux


def passes_line(*, draft: bool = True) -> str:
    """The exact verdict line of a launch that passes and will start. A speculative launch runs on cutedsl_mla on a
    B200 (its draft on flashinfer), checked on CPU against the kernel's contract; a plain one on flashinfer on an
    H200."""
    if draft:
        return "verdict: PASSES (exit 0): DCP passes checked on cutedsl_mla, flashinfer, CPU only"
    return "verdict: PASSES (exit 0): DCP passes checked on flashinfer, CPU only"


def host_entry(per_node: str, available: str = "2.0 TiB", *, estimate: bool = False) -> str:
    """The verdict block's host entry (``per_node``: the report's "1,234.56 GiB")."""
    gib = f"{float(per_node.split()[0].replace(',', '')):,.0f} GiB/node host" + (" (estimate)" if estimate else "")
    return f"  host      {gib}, fits {available}"


def why(out: str) -> str:
    """The block beneath the verdict line, as one string (its lines are wrapped)."""
    return " ".join(line.strip() for line in below_verdict(out))


COVERS_ALL = "with the plugin it passes and the draft host pool covers all of the target's logical slots"


def assert_clean(err: str) -> None:
    assert "Traceback" not in err, err[-3000:]
    # sglang's import-time UserWarnings (AWQ, GGUF, Triton on a machine without CUDA) are filtered around the import.
    assert "UserWarning" not in err, err[-3000:]


# ---------------------------------------------------------------- launches of every size, in fresh processes


def test_plain_launch_without_a_draft_passes():
    """DCP8 + HiCache, no draft, device rows estimated: sizing ~1e9 logical slots costs no per-slot memory."""
    code, out, err, rss = run_cli(*launch(draft=False))
    assert code == 0, err[-2000:]
    assert_clean(err)
    assert "stock sglang  passes" in out and "with plugin   passes" in out
    assert "Host RAM (8 ranks per node, as run):" in out
    per_node = re.search(r"needed +[\d,.]+ GiB per rank, ([\d,.]+ GiB) per node", out).group(1)
    assert verdict_line(out) == passes_line(draft=False)
    assert below_verdict(out)[0] == host_entry(per_node, estimate=True)
    assert "stock sglang admits it too with the plugin it passes" in why(out)
    assert 0 < rss < PEAK_RSS_LIMIT


def test_default_launch_with_a_draft_passes():
    """No arguments (make demo): DeepSeek-V3 and a dense DSPARK draft at DCP8 + HiCache on cutedsl_mla, on an 8 x
    B200, 2 TiB node.

    Stock sglang refuses it, the plugin admits it with a draft host pool that
    covers the logical slots, the node holds the pools, the verdict says the
    passes on cutedsl_mla were checked against its kernel's contract (exit 0), and nothing but the report
    reaches the terminal: no warning from sglang's import.
    """
    code, out, err, rss = run_cli()
    assert code == CHECKED, err[-2000:]
    assert err == ""
    assert "launch PASSES sglang 0.5.17's validation" in out
    assert "  judged by     sglang 0.5.17's resolution and pool builders (adapter sglang_0_5_17, from 0.5.17)" in out
    assert "stock sglang  rejected: NotImplementedError: " + GATE in out
    assert "with plugin   passes" in out
    assert "page size       64 physical, 512 logical" in out  # cutedsl_mla pages by 64 (sglang sets it)
    # a line longer than 100 columns wraps under its own column: read as one
    assert f"device rows {DEFAULT_DEVICE_ROWS:,} physical per rank ({DEFAULT_DEVICE_ROWS_NOTE})" in " ".join(out.split())
    assert max(len(line) for line in out.splitlines()) <= 100
    # DeepSeek-V3's MLA rows: 61 layers x (512 + 64) x 2 bytes; the dense draft's: 5 layers x 2 KV heads
    # per rank (16 over --tp 8) x K and V x head_dim 64 x 2 bytes = 2,560 bytes.
    assert re.search(r"^  target KV +[\d,]+ +70,272 ", out, re.M), out
    assert re.search(r"^  stock: draft +[\d,]+ +2,560 .* 0\.125$", out, re.M), out
    assert re.search(r"^  draft +[\d,]+ +2,560 .* 1\.000$", out, re.M), out
    assert "  draft           plan registration, kv_cache_builder.maybe_register_hicache_draft" in out
    assert "available       2,048.00 GiB (the emulated node's default) less sglang's 10.00 GiB reserve: fits" in out
    per_node = re.search(r"needed +[\d,.]+ GiB per rank, ([\d,.]+ GiB) per node", out).group(1)
    assert verdict_line(out) == passes_line()
    assert below_verdict(out)[0] == host_entry(per_node)
    assert "stock sglang rejects it (HiCache under DCP with DSPARK)" in why(out) and COVERS_ALL in why(out)
    # cutedsl_mla decodes only: sglang 0.5.17 prefills with trtllm_mla beside it on Blackwell, its own choice
    assert ("attention prefill trtllm_mla (sglang's choice on the NVIDIA B200); decode cutedsl_mla (named by the "
            "launch)") in " ".join(out.split())
    assert 0 < rss < PEAK_RSS_LIMIT


def test_default_launch_is_deepseek_v3_with_a_dense_dspark_draft(capsys):
    """The embedded default's configs: DeepSeek-V3's geometry, a dense DSparkDraftModel draft, the stated device rows."""
    assert main(["preflight", "--json"]) == CHECKED
    report = json.loads(capsys.readouterr().out)
    launch = report["launch"]
    assert launch[launch.index("--model-path") + 1] == str(DEFAULT_MODEL)
    assert launch[launch.index("--speculative-draft-model-path") + 1] == str(DEFAULT_DRAFT)
    target = json.loads((DEFAULT_MODEL / "config.json").read_text())
    assert target["architectures"] == ["DeepseekV3ForCausalLM"] and target["num_hidden_layers"] == 61
    sizing = report["sizing"]
    assert sizing["target_kv"] == {"kind": "mla", "layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                                   "dtype": "bfloat16"}
    # A class sglang ships (models/dspark.py), read through its ModelConfig: 16 KV heads split over --tp 8.
    draft = json.loads((DEFAULT_DRAFT / "config.json").read_text())
    assert draft["architectures"] == ["DSparkDraftModel"] and sizing["draft_architecture"] == "DSparkDraftModel"
    assert sizing["draft_kv"] == {"kind": "mha", "layers": 5, "head_num": 2, "head_dim": 64, "v_head_dim": 64,
                                  "dtype": "bfloat16"}
    assert sizing["device_rows"] == DEFAULT_DEVICE_ROWS and not sizing["device_rows_estimated"]
    assert report["node"]["gpus"] == 8 and report["node"]["gpu_name"] == "NVIDIA B200"
    assert report["node"]["capability"] == [10, 0] and report["node"]["gpu_memory_gib"] == 180.0
    ram = sizing["host_ram"]
    assert ram["available"] == 2048 * GIB and ram["fits"] and not ram["startup_error"] and sizing["draft_coverage"] >= 1
    # A realistic share of the node: the pools take a quarter to two thirds of its 2 TiB.
    assert 0.25 * ram["available"] < ram["needed_per_node"] < 2 / 3 * ram["available"]


@pytest.mark.parametrize("draft,row_bytes", [(False, TARGET_ROW), (True, DRAFT_ROW_AT_DCP8)])
def test_largest_device_rows_one_gpu_holds(draft, row_bytes):
    """--device-rows at what 141 GiB holds for the geometry (6.6e7 rows without the draft): exit 3, not a crash.

    The old sizing built sglang's per-slot bookkeeping for real here, over 10 GB
    without the draft; the bound on the child's peak RSS is what fails then.
    """
    rows = int(141 * GIB // row_bytes)  # the H200's memory, which both nodes of launch() have
    code, out, err, rss = run_cli("--json", "--device-rows", str(rows), *launch(draft=draft))
    assert_clean(err)
    report = json.loads(out)
    assert report["sizing"]["device_rows_max"] == rows
    assert report["sizing"]["device_rows"] == rows
    # A host pool twice that size per rank does not fit a 2 TiB node: it will stop at startup.
    assert code == 3 == report["verdict"]["code"], err[-2000:]
    assert not report["sizing"]["host_ram"]["fits"]
    assert 0 < rss < PEAK_RSS_LIMIT


# ---------------------------------------------------------------- the report


def test_json_report_geometry(capsys):
    assert main(["preflight", "--json", "--device-rows", "1024", "--host-ram-gib", "2048"]) == CHECKED
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and not report["stock"]["passed"] and GATE in report["stock"]["message"]
    per_node = f"{report['sizing']['host_ram']['needed_per_node'] / GIB:,.2f} GiB"
    verdict = report["verdict"]
    assert (verdict["code"], verdict["outcome"], verdict["line"]) == (CHECKED, "PASSES", passes_line())
    assert verdict["host"] == host_entry(per_node).split(None, 1)[1]
    assert verdict["advice"] is None and any(COVERS_ALL in w for w in verdict["why"])
    sizing = report["sizing"]
    assert sizing["dcp_size"] == 8 and sizing["device_rows"] == 1024
    pools = {p["name"]: p for p in sizing["pools"]}
    assert pools["target KV"]["logical_slots"] == 8 * pools["target KV"]["rows"]
    assert sizing["draft_coverage_stock"] < 0.2 <= 1.0 <= sizing["draft_coverage"]
    ram = sizing["host_ram"]
    assert ram["needed_per_rank"] == pools["target KV"]["bytes"] + pools["draft"]["bytes"]
    assert ram["needed_per_node"] == 8 * ram["needed_per_rank"] and ram["fits"]


@pytest.mark.parametrize("unbudgeted", [False, True])
def test_hicache_size_is_shared_with_the_draft(capsys, monkeypatch, unbudgeted):
    """With --hicache-size, target + draft fit it; SGLANG_HICACHE_SIZE_EXCLUDES_DRAFT=1 shows sglang's own sizing."""
    if unbudgeted:
        monkeypatch.setenv("SGLANG_HICACHE_SIZE_EXCLUDES_DRAFT", "1")
    argv = ["preflight", "--json", "--device-rows", "1024", "--host-ram-gib", "2048",
            *launch(TINY, "DSPARK", "--hicache-size", "2")]
    assert main(argv) == CHECKED
    report = json.loads(capsys.readouterr().out)
    sizing = report["sizing"]
    ram = sizing["host_ram"]
    assert sizing["draft_coverage"] >= 1.0 and ram["budget_per_rank"] == 2e9
    if unbudgeted:
        assert sizing["target_hicache_size"] is None and ram["needed_per_rank"] > 2e9
    else:
        # The plugin's own budget hook ran on the scheduler stand-in: the target got t / (t + 8 d) of it.
        assert ram["needed_per_rank"] <= ram["budget_per_rank"]
        assert 0 < sizing["target_hicache_size"] < 2


def test_device_rows_estimate_is_labelled(capsys):
    assert main(["preflight", "--json", *launch()]) == CHECKED
    sizing = json.loads(capsys.readouterr().out)["sizing"]
    assert "estimate" in sizing["device_rows_note"] and sizing["device_rows_estimated"]
    # The default launch states its own figure instead; --device-rows overrides it.
    assert main(["preflight", "--json"]) == CHECKED
    sizing = json.loads(capsys.readouterr().out)["sizing"]
    assert sizing["device_rows_note"] == DEFAULT_DEVICE_ROWS_NOTE and not sizing["device_rows_estimated"]
    assert main(["preflight", "--json", "--device-rows", "1024"]) == CHECKED
    sizing = json.loads(capsys.readouterr().out)["sizing"]
    assert sizing["device_rows"] == 1024 and sizing["device_rows_note"] == "given with --device-rows"


def test_no_hicache_no_host_pools(capsys):
    """Without --enable-hierarchical-cache there is nothing to pin, so nothing to fit."""
    argv = ["preflight", "--json", "--host-ram-gib", "12", "--", "--model-path", str(TINY), "--tp", "8"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert "HiCache is off" in report["sizing"]["skipped"] and report["verdict"]["code"] == 0


def test_host_ram_default_is_the_emulated_node(capsys):
    """The node's RAM defaults to the emulated DGX node's 2 TiB, not to whatever machine runs preflight."""
    assert main(["preflight", "--json", "--device-rows", "1024"]) == CHECKED
    ram = json.loads(capsys.readouterr().out)["sizing"]["host_ram"]
    assert ram["available"] == 2048 * GIB and ram["available_from"] == "the emulated node's default"
    assert main(["preflight", "--json", "--device-rows", "1024", "--host-ram-gib", "2048"]) == CHECKED
    assert json.loads(capsys.readouterr().out)["sizing"]["host_ram"]["available_from"] == "--host-ram-gib"
    assert main(["preflight", "--json", "--device-rows", "1024", "--host-ram-gib", "local"]) in (CHECKED, 3)
    assert json.loads(capsys.readouterr().out)["sizing"]["host_ram"]["available_from"] == "this machine, available now"


# ---------------------------------------------------------------- exit codes: the verdict on the launch as it will run


def test_plugins_startup_check_stops_it_exit_3(capsys):
    """The plugin's own start-up check (budget.fit_hicache_size), run on the scheduler stand-in: device rows x (t + dcp d) against the rank's RAM share."""
    assert main(["preflight", "--json", "--device-rows", "400000", "--host-ram-gib", "12"]) == 3
    report = json.loads(capsys.readouterr().out)
    error = report["sizing"]["host_ram"]["startup_error"]
    assert error.startswith("HiCache needs at least ") and "this rank's share of free host RAM" in error
    assert report["passed"] and report["verdict"]["code"] == 3 and report["verdict"]["outcome"] == "STOPS AT STARTUP"
    assert report["startup_stops"][0] == f"startup stops while the host pools are built: {error}"
    assert main(["preflight", "--device-rows", "400000", "--host-ram-gib", "12"]) == 3
    out = capsys.readouterr().out
    # The error is longer than the line holds: the line says so, whole, and the block quotes the error.
    assert verdict_line(out) == "verdict: STOPS AT STARTUP (exit 3): building the host pools fails (its error is below)"
    assert f"startup stops while the host pools are built: {' '.join(error.split())}" in why(out)


def test_stop_on_estimated_rows_says_so(capsys):
    """A stop judged on the upper-bound estimate of device rows asks for the real figure."""
    assert main(["preflight", "--host-ram-gib", "64", *launch()]) == 3
    out = capsys.readouterr().out
    assert verdict_line(out).startswith("verdict: STOPS AT STARTUP (exit 3)") and "on estimated rows" in verdict_line(out)
    assert any(line.startswith("  host") and "(estimate)" in line for line in below_verdict(out))
    assert "device rows are an upper-bound estimate, pass --device-rows for a firm verdict" in why(out)


def test_hicache_size_that_does_not_fit_exits_3(capsys):
    argv = ["preflight", "--device-rows", "1024", "--host-ram-gib", "64", *launch(TINY, "DSPARK", "--hicache-size", "100")]
    assert main(argv) == 3
    out = capsys.readouterr().out
    # sglang's own check refuses the target pool while it is built: the target's share of the 100 GB
    # (the plugin's split) is more than the 64 GiB node has free after sglang's reserve.
    assert verdict_line(out).startswith("verdict: STOPS AT STARTUP (exit 3)")
    assert "Not enough host memory available. Requesting 88.89 GB but only have 57.98 GB free" in why(out)


def test_short_draft_host_pool_exits_3(capsys, monkeypatch):
    """A draft registration that leaves the draft short of the logical slots (e.g. shadowed by another plugin) stops at startup."""
    from sglang_dcp_dspark.plugin.hooks import BY_TARGET, kv_cache_builder

    # The hook in the plugin's table, which preflight runs: replaced by one that sizes nothing.
    monkeypatch.setattr(BY_TARGET[kv_cache_builder.DRAFT_REGISTRATION], "hook",
                        lambda original, *args, **kwargs: original(*args, **kwargs))
    assert main(["preflight", "--json", "--device-rows", "1024"]) == 3
    report = json.loads(capsys.readouterr().out)
    assert report["sizing"]["draft_coverage"] < 1
    # about 1/8 (one draft row per target row), a little over at 1,024 rows in cutedsl_mla's 64-row pages
    assert "draft host pool covers 0.129" in report["verdict"]["line"]


def test_preflight_resolves_through_the_plugins_own_resolver_hook(capsys, monkeypatch):
    """A hook in the plugin's table is what preflight runs: here the resolver hook, seen being called."""
    from sglang_dcp_dspark.plugin.hooks import BY_TARGET, server_args

    real, seen = server_args.admit_dspark, []

    def spy(original, args, *rest, **kwargs):
        seen.append(args.speculative_algorithm)
        return real(original, args, *rest, **kwargs)

    monkeypatch.setattr(BY_TARGET[server_args.RESOLVER], "hook", spy)
    assert main(["preflight", "--device-rows", "1024"]) != 1  # admitted: the hook let DSPARK through
    assert seen == ["DSPARK"]  # once, in the resolution with the plugin; the stock one runs sglang alone


def test_eagle_is_rejected_with_sglangs_message(capsys):
    assert main(["preflight", *launch(TINY, "EAGLE")]) == 1
    out = capsys.readouterr().out
    assert "launch REJECTED" in out and GATE in out
    # sglang's gate and the plugin's resolver hook both refuse it; the block quotes the plugin's words whole
    assert verdict_line(out) == "verdict: REJECTED (exit 1): sglang 0.5.17 refuses HiCache under DCP with EAGLE"
    assert "message   the plugin: NotImplementedError: " + GATE in why(out)
    # the smallest change that passes: HiCache off keeps DCP and the draft
    assert below_verdict(out)[0].startswith("  change    drop --enable-hierarchical-cache: PASSES (exit 0)")


@pytest.mark.parametrize(
    "env,reason",
    [
        ({"SGLANG_PLUGINS": "some_other_plugin"}, "sglang skips it: SGLANG_PLUGINS=some_other_plugin does not name dcp_dspark"),
        # sglang's load_plugins reads "," as a whitelist that names no plugin.
        ({"SGLANG_PLUGINS": ","}, "sglang skips it: SGLANG_PLUGINS=, does not name dcp_dspark"),
        ({"SGLANG_ENABLE_DCP_DSPARK_PLUGIN": "0"}, "switched off: SGLANG_ENABLE_DCP_DSPARK_PLUGIN=0"),
    ],
)
def test_plugin_off_reports_the_stock_result(capsys, monkeypatch, env, reason):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["preflight", "--device-rows", "1024"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("(as run with the dcp_dspark plugin off)")
    assert out.splitlines()[2] == f"  plugin        {reason}"
    assert verdict_line(out).startswith("verdict: REJECTED (exit 1)")


def test_empty_sglang_plugins_keeps_the_plugin_on(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_PLUGINS", "")
    assert main(["preflight", "--json", "--device-rows", "1024"]) == CHECKED
    plugin = json.loads(capsys.readouterr().out)["plugin"]
    assert plugin["enabled"] and "SGLANG_PLUGINS is empty (no whitelist)" in plugin["reason"]


# ---------------------------------------------------------------- bad input: exit 2, one line, and JSON with --json


def _config(tmp_path, name, edit):
    model = tmp_path / name
    model.mkdir()
    config = json.loads((TINY / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(edit(config)))
    return model


def _without(key):
    return lambda config: {k: v for k, v in config.items() if k != key}


BAD_INPUT = [
    (["--", "--model-path", "/nonexistent-model-dir"], "has no config.json"),
    (launch(TINY, "DSPARK", "--no-such-flag"), "unrecognized arguments: --no-such-flag"),
    (launch(TINY, "DSPARK", "--hicache-ratio", "-1"), "--hicache-ratio -1.0 (expected a finite number above 0"),
    (launch(TINY, "DSPARK", "--hicache-ratio", "nan"), "--hicache-ratio nan (expected a finite number"),
    (launch(TINY, "DSPARK", "--hicache-size", "1000000000"), "--hicache-size 1000000000 (expected 0 to"),
    # a plain launch: cutedsl_mla (a speculative launch()'s backend) sets its own page size
    (launch(TINY, "DSPARK", "--page-size", "0", draft=False), "--page-size 0 (expected 1 to"),
    (launch(TINY, "DSPARK", "--mem-fraction-static", "nan"), "--mem-fraction-static nan"),
    (["--gpus", "0"], "--gpus 0 (expected 1 to 64)"),
    (["--gpus", "eight"], "--gpus 'eight' is not an integer"),
    (["--gpu-memory-gib", "nan"], "--gpu-memory-gib nan (expected a finite number above 0"),
    (["--gpu-memory-gib", str(MAX_GPU_MEMORY_GIB * 2)], "--gpu-memory-gib 2048.0 (expected a finite number above 0, at most 1024"),
    (["--host-ram-gib", "inf"], "--host-ram-gib inf (expected a finite number above 0"),
    (["--host-ram-gib", "-100"], "--host-ram-gib -100.0 (expected a finite number above 0"),
    (["--device-rows", "0"], "--device-rows 0 (expected >= 1)"),
    (["--device-rows", "10000000000"], "--device-rows 10,000,000,000 needs"),
    (["--", "--model-path", str(TINY), "--tp", "8", "--dcp-size", "1000000", "--enable-hierarchical-cache"],
     "--dcp-size 1000000 does not divide --tp 8"),
    (["--", "--model-path", str(TINY), "--tp", "3", "--dcp-size", "2", "--enable-hierarchical-cache"],
     "--dcp-size 2 does not divide --tp 3; sglang builds its DCP groups from slices of dcp_size ranks of each TP group, so expected one of [1, 3]; fix: pass --dcp-size 1"),
    (["--", "--model-path", str(TINY), "--tp", "16", "--dcp-size", "8", "--enable-hierarchical-cache"],
     "puts 16 ranks on a node, but the emulated node has --gpus 8; expected at most one rank per GPU; fix: pass --nnodes 2 after `--`, or --gpus 16"),
    (["--", "--model-path", str(TINY), "--tp", "1000000", "--dcp-size", "1000000", "--enable-hierarchical-cache"],
     "puts 1000000 ranks on a node"),
]


@pytest.mark.parametrize("argv,reason", BAD_INPUT, ids=[" ".join(a[-4:]) for a, _ in BAD_INPUT])
def test_bad_input_exits_2_with_one_line(capsys, argv, reason):
    assert main(["preflight", *argv]) == 2
    captured = capsys.readouterr()
    assert reason in captured.err and captured.err.count("\n") == 1 and "fix:" in captured.err
    assert captured.out == ""


@pytest.mark.parametrize(
    "name,edit,reason",
    [
        ("zero-rank", lambda c: {**c, "kv_lora_rank": 0}, "has kv_lora_rank 0 and qk_rope_head_dim 64 as sglang reads them"),
        ("layers-text", lambda c: {**c, "num_hidden_layers": "2"}, "has a field of the wrong type (Validation error for field 'num_hidden_layers'"),
        ("a-list", lambda c: [c], "holds a JSON list, not an object"),
        ("a-million-layers", lambda c: {**c, "num_hidden_layers": 1_000_000},
         "has 1,000,000 KV layers per rank; expected 1 to 1,024 (preflight's limits"),
    ],
)
def test_bad_config_exits_2(capsys, tmp_path, name, edit, reason):
    model = _config(tmp_path, name, edit)
    argv = ["preflight", "--device-rows", "1024", "--", "--model-path", str(model), "--tp", "8", "--dcp-size", "8",
            "--enable-hierarchical-cache"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert reason in err and err.count("\n") == 1 and "fix:" in err


def test_a_dense_target_under_hicache_is_one_line(capsys, tmp_path):
    """HiCache without DCP on a dense target: sglang admits it, preflight says it does not size it (never a silent pass)."""
    model = _config(tmp_path, "dense", lambda c: {**c, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                                                   "head_dim": 128, "num_key_value_heads": 8})
    assert main(["preflight", "--device-rows", "1024", "--", "--model-path", str(model), "--tp", "8",
                 "--enable-hierarchical-cache"]) == 2
    err = capsys.readouterr().err
    assert "preflight sizes HiCache host pools for MLA targets" in err and "(Qwen3ForCausalLM)" in err
    assert err.count("\n") == 1 and "fix:" in err


def test_a_partial_mla_config_is_sized_as_sglang_reads_it(capsys, tmp_path):
    """No qk_rope_head_dim: transformers' DeepseekV2Config gives its default (64), and so does preflight."""
    model = _config(tmp_path, "no-rope", _without("qk_rope_head_dim"))
    assert main(["preflight", "--json", "--device-rows", "1024", "--", "--model-path", str(model), "--tp", "8",
                 "--dcp-size", "8", "--enable-hierarchical-cache", "--attention-backend", "flashinfer"]) == 0
    assert json.loads(capsys.readouterr().out)["sizing"]["target_kv"]["qk_rope_head_dim"] == 64


def test_not_json_config_exits_2(capsys, tmp_path):
    (tmp_path / "config.json").write_bytes(b"\xff\xfe not json")
    assert main(["preflight", "--", "--model-path", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is not readable JSON" in err and err.count("\n") == 1


@pytest.mark.parametrize("argv", [["--gpu-memory-gib", "nan"], ["--device-rows", "10000000000"],
                                  ["--", "--model-path", "/nonexistent-model-dir"]])
def test_json_reports_bad_input_on_stdout(capsys, argv):
    assert main(["preflight", "--json", *argv]) == 2
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["verdict"]["code"] == 2 and report["verdict"]["outcome"] == "BAD INPUT"
    assert report["error"] in captured.err and report["verdict"]["line"].startswith("verdict: BAD INPUT (exit 2): ")


# ---------------------------------------------------------------- sample output quoted in the docs

REPO = Path(__file__).resolve().parents[2]
DOCS = (REPO / "README.md", REPO / "docs" / "operator-guide.md")
# <!-- preflight:begin (COMMAND) --> then a fenced block with COMMAND's output, then <!-- preflight:end -->; a
# demo-verdict block holds the output's verdict alone, from its line on.
SAMPLE = re.compile(r"(<!-- (?P<name>preflight|demo-verdict):begin \((?P<command>sglang-dcp-dspark preflight[^)]*)\) -->\n)"
                    r"(?P<block>.*?)(<!-- (?P=name):end -->)", re.S)


def sample_output(command: str, name: str = "preflight") -> str:
    """What COMMAND prints now, with the plugin switches as an operator's shell has them by default (unset); a
    demo-verdict block, its verdict alone."""
    import contextlib
    import io

    saved = {name: os.environ.pop(name) for name in (WHITELIST_ENV, SWITCH_ENV) if name in os.environ}
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            main(shlex.split(command)[1:])
    finally:
        os.environ.update(saved)
    text = out.getvalue()
    if name == "demo-verdict":
        text = text[text.rindex("\nverdict: ") + 1:]
    return "```\n" + text + "```\n"


def regenerate(text: str) -> str:
    return SAMPLE.sub(lambda m: m.group(1) + sample_output(m.group("command"), m.group("name")) + m.group(5), text)


def test_a_judgement_leaves_the_environment_as_it_found_it(capsys):
    """sglang's resolution writes SGLANG_USE_CUDA_IPC_TRANSPORT for the servers it would start; preflight resolves
    several launches per judgement, and a leak would reach the next one as the operator's own setting (sglang then
    warns that it is deprecated, in the report, of a variable the operator never set)."""
    from sglang_dcp_dspark.preflight import launch as launch_mod

    launch_mod.import_sglang()  # sglang's import sets its own variables (DG_JIT_CACHE_DIR, ...) once, for the process
    before = dict(os.environ)
    for _ in range(2):
        assert main(["preflight", *launch(draft=False)]) == 0
        assert dict(os.environ) == before
        assert "SGLANG_USE_CUDA_IPC_TRANSPORT" not in capsys.readouterr().out


def test_doc_samples_are_fresh():
    samples = 0
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in SAMPLE.finditer(text):
            samples += 1
            fresh = sample_output(m.group("command"), m.group("name"))
            assert m.group("block") == fresh, (
                f"{doc.name}: the sample output of `{m.group('command')}` is stale; fix: python test/preflight/test_check.py --write-docs")
    assert samples >= 1


if __name__ == "__main__":
    # python test/preflight/test_check.py --write-docs: rewrite every marked sample block from its command.
    if sys.argv[1:] != ["--write-docs"]:
        sys.exit("usage: python test/preflight/test_check.py --write-docs")
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        if SAMPLE.search(text):
            doc.write_text(regenerate(text), encoding="utf-8")
            print(f"rewrote the preflight samples in {doc.relative_to(REPO)}")


# ---------------------------------------------------------------- sweeps, and the charts in docs/preflight.md

CHARTS = {
    "preflight-sweep-dcp.png": [],
    "preflight-sweep-dcp-hicache-size.png": ["--model-path", str(DEFAULT_MODEL), "--tp", "8", "--dcp-size", "8",
                                             "--enable-hierarchical-cache", "--speculative-algorithm", "DSPARK",
                                             "--speculative-draft-model-path", str(DEFAULT_DRAFT),
                                             "--attention-backend", "cutedsl_mla", "--hicache-size", "100"],
}


@pytest.fixture(scope="module")
def sweeps():
    from sglang_dcp_dspark.preflight import sweep
    from sglang_dcp_dspark.preflight.check import default_node

    # the default launch's own node (8 x B200, cutedsl_mla), as the command line judges it
    return {name: sweep.sweep(launch, default_node(), None, "dcp=1,2,4,8") for name, launch in CHARTS.items()}


def test_a_sweep_judges_each_value_and_draws_the_four_setups(sweeps):
    result = sweeps["preflight-sweep-dcp.png"]
    assert [r.value for r in result.rows] == ["1", "2", "4", "8"] and result.flag == "--dcp-size"
    for row in result.rows:
        # without DCP nothing reads another rank's layout; under DCP cutedsl_mla's passes are checked
        assert row.report.verdict.code == (0 if row.value == "1" else CHECKED)
        assert row.report.sizing.dcp_size == int(row.value)
        setups = row.variants
        assert list(setups) == ["stock", "0.5.18+", "budgeted", "sharded"]
        if row.value == "1":
            # Without DCP, stock 0.5.17's draft and the sharded stripe both hold one draft row per target row.
            assert setups["stock"].per_node == pytest.approx(setups["sharded"].per_node, rel=1e-5)
        else:
            # Stock sglang rejects DCP + HiCache + a draft: it pins nothing, and the chart draws no stock point.
            assert setups["stock"].per_node is None and setups["stock"].source == "stock sglang rejects the launch"
            # Its short draft is still in the report's table: about one draft row per target row, as the
            # sharded stripe (the stock draft rounds up past its last page, of 64 rows on cutedsl_mla).
            stock_pools = row.report.sizing.stock_pools
            assert sum(p.per_node_bytes for p in stock_pools) == pytest.approx(setups["sharded"].per_node, rel=1e-5)
        assert setups["sharded"].per_node <= setups["0.5.18+"].per_node
        assert setups["budgeted"].per_node == setups["0.5.18+"].per_node  # no --hicache-size: nothing to share
        assert setups["sharded"].source.startswith("model")  # 0.5.17 has no sharded backup to build it with
    # the worst row's verdict is the sweep's
    assert result.verdict.code == CHECKED
    per_node = [r.variants["0.5.18+"].per_node for r in result.rows]
    assert per_node == sorted(per_node) and per_node[0] < per_node[-1]  # the replicated draft grows with dcp
    budgeted = sweeps["preflight-sweep-dcp-hicache-size.png"]
    for row in budgeted.rows:
        setups = row.variants
        assert setups["budgeted"].per_node < setups["0.5.18+"].per_node or row.value == "1"
        assert setups["budgeted"].per_node <= 8 * 100e9 + 8 * 80_000  # the budget holds target and draft (a page over)


def test_the_sweep_block_and_the_charts_are_fresh(sweeps, tmp_path):
    import docblocks
    from sglang_dcp_dspark.preflight import report

    docblocks.check("sweep-dcp", report.render_sweep(sweeps["preflight-sweep-dcp.png"]))
    for name, result in sweeps.items():
        committed = report.read_chart_data(str(REPO / "docs" / "img" / name))
        assert committed == json.loads(json.dumps(report.chart_data(result), sort_keys=True)), (
            f"docs/img/{name} was drawn from other figures than a sweep gives now; fix: rerun the command "
            "docs/preflight.md gives for it")
    # The command writes what it reads back.
    out = tmp_path / "chart.png"
    assert report.plot(sweeps["preflight-sweep-dcp.png"], str(out)) == str(out)
    assert report.read_chart_data(str(out)) == report.read_chart_data(str(REPO / "docs" / "img" / "preflight-sweep-dcp.png"))


def test_a_sweep_on_the_command_line(capsys):
    assert main(["preflight", "--sweep", "dcp=2,8", "--device-rows", "1024"]) == CHECKED
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "preflight sweep of --dcp-size on sglang 0.5.17 (2 launches, sglang imported once)"
    assert [line.split()[0] for line in out[3:5]] == ["2", "8"]
    assert all("PASSES (exit 0)" in line for line in out[3:5]), out


@pytest.mark.parametrize("argv,says", [
    (["--sweep", "nonsense=1,2"], "--sweep 'nonsense=1,2' is not NAME=V1,V2,...; expected NAME one of dcp, hicache-size"),
    (["--sweep", "dcp=1,two"], "--sweep dcp value 'two' is not a number"),
    (["--plot", "x.png"], "--plot draws a sweep; expected --sweep NAME=V1,V2,... with it"),
    (["--sweep", "dcp=,,,"], "--sweep 'dcp=,,,' names no value"),
    (["--sweep", "dcp=1,2,2.0"], "--sweep dcp gives '2' and '2.0', the same value twice"),
    (["--sweep", "dcp=1,2", "--sweep", "tp=8"], "--sweep is given 2 times (dcp=1,2, tp=8); a sweep varies one option"),
    (["--sweep", "dcp=" + ",".join(map(str, range(1, 1001)))], "--sweep dcp has 1,000 values; expected at most 32"),
    (["--sweep", "dcp=8", "--plot", "x.jpg"], "--plot x.jpg names a .jpg file; expected a name ending in .png, .svg, .pdf"),
])
def test_bad_sweeps_are_one_line(capsys, argv, says):
    """Refused before sglang is imported (each in well under the time one judgement takes)."""
    assert main(["preflight", *argv]) == 2
    captured = capsys.readouterr()
    assert says in captured.err and captured.err.count("\n") == 1 and "fix:" in captured.err and captured.out == ""


def test_every_sweep_row_that_does_not_pass_says_why(capsys):
    assert main(["preflight", "--sweep", "dcp=1.5,-1,8", "--device-rows", "1024"]) == 2
    out = capsys.readouterr().out
    # one row per value, its continuation lines (wrapped at 100 columns) indented under the verdict
    why = re.split(r"\n  (?=\S)", out.split("\n  why:\n", 1)[1].split("\n\n", 1)[0].strip("\n"))
    why = [" ".join(row.split()) for row in why]
    assert why[0].split()[0] == "1.5" and "invalid int value: '1.5'" in why[0]
    assert why[1].split()[0] == "-1" and "REJECTED (exit 1): sglang 0.5.17 refuses --dcp-size -1: it takes 1 or more" in why[1]
    assert "8 " not in [line[:2] for line in why if line.strip()][:2]


def test_a_launch_argument_bad_at_every_value_is_one_error_line(capsys):
    """--device-rows after `--` is sglang's to parse, and it refuses it whatever the dcp: one line on stderr naming
    it, exit 2, no table of the same row four times. A value that is bad alone stays a row (the test above)."""
    launch = ["--", "--model-path", str(DEFAULT_MODEL), "--tp", "8", "--device-rows", "99"]
    assert main(["preflight", "--sweep", "dcp=1,2,4,8", *launch]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert "unrecognized arguments: --device-rows 99" in captured.err and "every --dcp-size value" in captured.err
    assert captured.err.index("every --dcp-size value") < captured.err.index("fix:")


def test_a_long_sweep_shows_its_progress(capsys):
    assert main(["preflight", "--sweep", "hicache-ratio=1,2,3,4,5", "--device-rows", "1024"]) == CHECKED
    err = capsys.readouterr().err.splitlines()
    assert err == [f"preflight: judging value {i} of 5 ({i})" for i in range(1, 6)]


@pytest.mark.parametrize("suffix,magic", [(".png", b"\x89PNG"), (".svg", b"<?xml"), (".pdf", b"%PDF")])
def test_the_chart_is_written_in_the_format_its_name_says(tmp_path, suffix, magic):
    assert main(["preflight", "--sweep", "dcp=2,8", "--device-rows", "1024", "--plot", str(tmp_path / f"c{suffix}")]) == CHECKED
    assert (tmp_path / f"c{suffix}").read_bytes().startswith(magic)


def test_a_sweep_worst_verdict_is_its_exit_code(capsys):
    """dcp 3 does not divide tp 8 (bad input, exit 2): the sweep goes on and exits with its worst."""
    assert main(["preflight", "--json", "--sweep", "dcp=3,8", "--device-rows", "1024"]) == 2
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["report"]["verdict"]["code"] for r in rows] == [2, CHECKED]
    assert "--dcp-size 3 does not divide --tp 8" in rows[0]["report"]["verdict"]["line"]


def test_without_matplotlib_the_plot_is_one_line(capsys, monkeypatch, tmp_path):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.split(".")[0] == "matplotlib":
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert main(["preflight", "--sweep", "dcp=8", "--device-rows", "1024", "--plot", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err
    assert "needs matplotlib, which is not installed" in err and "pip install 'sglang-dcp-dspark[plot]'" in err
    assert err.count("\n") == 1 and not (tmp_path / "c.png").exists()


def test_an_internal_error_has_its_own_exit_code_in_one_line(capsys, monkeypatch):
    """A bug of the tool is exit 4, never a verdict (0 to 3); the traceback only on request."""
    from sglang_dcp_dspark.preflight import check as preflight

    monkeypatch.setattr(preflight, "run", lambda *args, **kwargs: 1 / 0)
    monkeypatch.delenv("SGLANG_DCP_DSPARK_TRACEBACK", raising=False)
    assert main(["preflight"]) == 4
    err = capsys.readouterr().err
    assert err.startswith("error: internal error in sglang-dcp-dspark (ZeroDivisionError: division by zero, at ")
    assert err.count("\n") == 1 and "SGLANG_DCP_DSPARK_TRACEBACK=1" in err
    monkeypatch.setenv("SGLANG_DCP_DSPARK_TRACEBACK", "1")
    with pytest.raises(ZeroDivisionError):
        main(["preflight"])
