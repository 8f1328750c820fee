"""One launch matrix on every release: each launch ends with a verdict from the documented set, as that release judges it.

The expected exit codes are what each release's own code does (read in its
wheel, then run): the flags it lacks are its parser's one-line refusal, never
a check of preflight's on a value nobody passed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_dcp_dspark.core.compat import parse_version
from sglang_dcp_dspark.preflight.check import DEFAULT_DRAFT, DEFAULT_MODEL
from tree_table import TREES
from trees import TREE

from .conftest import preflight

RELEASE = TREES[TREE].sglang
DATA = Path(__file__).resolve().parents[1] / "data"
V3, DRAFT = str(DEFAULT_MODEL), str(DEFAULT_DRAFT)
DCP8 = ["--model-path", V3, "--tp", "8", "--dcp-size", "8", "--enable-hierarchical-cache"]
DSPARK = ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", DRAFT]
ROWS = ["--device-rows", "100000"]


def since(version: str) -> bool:
    return parse_version(RELEASE) >= parse_version(version)


# The node decides the attention backend, and so the verdict under DCP. On an H200 sglang picks fa3 for an MLA
# model, which has no DCP code: under DCP with no --attention-backend the plugin (and upstream-next 0015) picks
# flashinfer MLA instead, which runs plain DCP on every release and DSPARK's verify from 0.5.22 (the plugin's and
# upstream-next's verify fix; before, the plugin refuses DSPARK on flashinfer under DCP: exit 1). On a B200 sglang
# picks trtllm_mla for DeepSeek-V3, whose factory refuses speculative decoding under DCP as the server starts:
# exit 3. cutedsl_mla, named, is PR #35221's validated backend: the map runs its passes on CPU against its kernel's
# documented contract, and the launch PASSES (exit 0), naming that evidence.
HOPPER = ["--gpu-name", "NVIDIA H200"]
BLACKWELL = ["--gpu-name", "NVIDIA B200"]
FLASHINFER = ["--attention-backend", "flashinfer"]
CUTEDSL = ["--attention-backend", "cutedsl_mla"]

# name -> (preflight's own options, the launch, the exit code on this release)
MATRIX = {
    "embedded default": ([], None, 0),
    "no draft": (HOPPER + ROWS, DCP8 + FLASHINFER, 0),
    "no draft on the backend the H200 picks": (HOPPER + ROWS, DCP8, 0),
    "DSPARK on the backend the H200 picks": (HOPPER + ROWS, DCP8 + DSPARK, 0 if since("0.5.22") else 1),
    # trtllm_mla's factory refuses it at startup; the plugin and the series leave that to it: it stops as it
    # starts (0.5.17's HiCache gate refuses every speculative launch under DCP first, stock; the plugin lifts it)
    "DSPARK on the backend the B200 picks": (BLACKWELL + ROWS, DCP8 + DSPARK, 3),
    "DSPARK": (BLACKWELL + ROWS, DCP8 + DSPARK + CUTEDSL, 0),
    "--hicache-size": (BLACKWELL + ROWS, DCP8 + DSPARK + CUTEDSL + ["--hicache-size", "100"], 0),
    "--page-size 64": (BLACKWELL + ROWS, DCP8 + DSPARK + CUTEDSL + ["--page-size", "64"], 0),
    # A decode server leaves its ratio for kv_cache_builder to resolve against its retraction backup.
    # Under DCP every release refuses PD decode with HiCache, so this one runs at tp 8 alone.
    "decode disaggregation": (ROWS, ["--model-path", V3, "--tp", "8", "--enable-hierarchical-cache",
                                     "--disaggregation-mode", "decode", "--disaggregation-decode-enable-radix-cache"], 0),
    "decode disaggregation under DCP": (ROWS, DCP8 + ["--disaggregation-mode", "decode"], 1),
    # --hicache-host-memory-mode arrives in 0.5.19: before, it is an unknown flag to sglang's parser.
    "buffer_only with a storage backend": (ROWS, ["--model-path", V3, "--tp", "8", "--enable-hierarchical-cache",
                                                  "--hicache-host-memory-mode", "buffer_only", "--hicache-storage-backend", "file"],
                                           0 if since("0.5.19") else 2),
    # Under DCP an L3 backend with the default host memory: refused up to 0.5.22, admitted by 0.5.23.
    "a storage backend under DCP": (HOPPER + ROWS, DCP8 + FLASHINFER + ["--hicache-storage-backend", "file"],
                                    0 if since("0.5.23") else 1),
    # Under DCP the L3 backend in buffer_only is refused by every release that has the mode.
    "buffer_only with a storage backend under DCP": (ROWS, DCP8 + ["--hicache-host-memory-mode", "buffer_only",
                                                                   "--hicache-storage-backend", "file"],
                                                     1 if since("0.5.19") else 2),
}


@pytest.mark.parametrize("name", list(MATRIX))
def test_every_launch_ends_with_its_verdict(name):
    options, launch, want = MATRIX[name]
    code, report, err = preflight(*options, *(["--", *launch] if launch else []))
    assert "Traceback" not in err, err[-3000:]
    assert code == want == report["verdict"]["code"], (code, report["verdict"]["line"], err[-500:])
    line = report["verdict"]["line"]
    assert line.startswith(f"verdict: {report['verdict']['outcome']} (exit {code}): ") and "\n" not in line
    if code == 2:
        # Bad input only for what was passed: here a flag this release does not have, in its parser's words.
        assert "unrecognized arguments: --hicache-host-memory-mode" in report["error"] and err.count("\n") == 1
        return
    if code in (0, 5) and launch is not None and "--enable-hierarchical-cache" in launch:
        assert report["release"]["sglang"] == RELEASE
        ram = report["sizing"]["host_ram"]
        assert ram["needed_per_node"] == ram["needed_per_rank"] * report["sizing"]["ranks_per_node"] > 0
        # Read after sglang resolved it: the ratio the pools were built at is a number, whoever resolved it.
        assert report["sizing"]["hicache_ratio"] > 0


def test_the_embedded_default_passes_with_a_draft_covering_every_logical_slot():
    code, report, err = preflight()
    assert code == 0 and err == "", err[-2000:]
    assert report["verdict"]["outcome"] == "PASSES"  # cutedsl_mla's passes, checked against its kernel's contract
    sizing = report["sizing"]
    assert sizing["draft_coverage"] >= 1.0
    assert [p["name"] for p in sizing["pools"]][0] == "target KV"
    assert report["release"]["sglang"] == RELEASE and report["release"]["adapter"].startswith("sglang_0_5_")
    # Which path the draft took, by release: the registration (0.5.17), the legacy sidecar (0.5.18), the assembler's sidecar.
    want_path = ("maybe_register_hicache_draft" if not since("0.5.18")
                 else "_register_legacy_hicache_draft" if not since("0.5.19") else "build_full_draft_pools")
    assert want_path in sizing["draft_path"]
    assert sizing["draft_plan"] == ("registration" if not since("0.5.18") else "SIDECAR")


# A dense DSPARK draft of the public Kimi-K3 DSPARK draft's geometry (the embedded default's), at tp 8 / dcp 8.
KIMI_K3_DRAFT = [*BLACKWELL, "--device-rows", "540000", "--", *DCP8, "--hicache-ratio", "2", *DSPARK, *CUTEDSL]


def test_the_dense_dspark_draft_gets_a_host_pool_over_every_logical_slot():
    """DSparkDraftModel (16 KV heads, head_dim 64, 5 layers): its own host pool, at sglang's bytes per token."""
    code, report, err = preflight(*KIMI_K3_DRAFT)
    assert code == 0, report["verdict"]["line"]
    sizing = report["sizing"]
    assert sizing["draft_kv"] == {"kind": "mha", "layers": 5, "head_num": 2, "head_dim": 64, "v_head_dim": 64,
                                  "dtype": "bfloat16"}
    target = next(p for p in sizing["pools"] if p["role"] == "target")
    draft = next(p for p in sizing["pools"] if p["role"] == "draft")
    # 5 layers x 2 KV heads per rank x (K + V) x 64 x 2 bytes, as MHATokenToKVPoolHost counts it.
    assert draft["bytes_per_token"] == 2_560 and draft["rows"] >= target["logical_slots"] == 8 * target["rows"]
    assert sizing["draft_coverage"] >= 1.0


def test_a_node_with_ram_for_the_target_pool_alone_stops_the_dense_draft_launch():
    """600 GiB holds the target's 565 GiB per node, not the dense draft's 165 GiB beside it: exit 3."""
    code, report, err = preflight("--host-ram-gib", "600", *KIMI_K3_DRAFT)
    assert code == 3 == report["verdict"]["code"], report["verdict"]["line"]
    target = next(p for p in report["sizing"]["pools"] if p["role"] == "target")
    assert target["per_node_bytes"] < (600 - 10) * 2**30


def test_the_decode_server_ratio_is_resolved_by_the_release():
    _, launch, _ = MATRIX["decode disaggregation"]
    code, report, _ = preflight(*ROWS, "--", *launch)
    assert code == 0
    if since("0.5.18"):
        assert report["resolved"]["hicache_ratio"] is None  # left for kv_cache_builder, as sglang leaves it
    # An MLA pool's retraction backup is cpu_tensor: the standard 2.0.
    assert report["sizing"]["hicache_ratio"] == 2.0


# --hicache-ratio 2 stated: from 0.5.21 auto-sizing would otherwise bring the ratio down until the pools fit.
DSA_LAUNCH = [*HOPPER, "--device-rows", "1400000", "--", "--model-path", str(DATA / "deepseek-v32"), "--tp", "8", "--dcp-size", "8",
              "--enable-hierarchical-cache", "--hicache-ratio", "2", *DSPARK]


def test_a_dsa_models_indexer_pool_is_counted_or_the_release_refuses_it():
    """DeepSeek-V3.2 at 1.4M device rows with the dense DSPARK draft at tp 8 / dcp 8: about 2,060 GiB per node with the indexer."""
    code, report, err = preflight(*DSA_LAUNCH)
    assert "Traceback" not in err
    if since("0.5.22"):
        assert code == 1 and "refuses it: DSA DCP does not support HiSparse or HiCache" in report["verdict"]["line"]
        assert "DSA DCP does not support HiSparse or HiCache." in report["verdict"]["message"]
        return
    assert code == 3, report["verdict"]["line"]
    pools = {p["name"]: p for p in report["sizing"]["pools"]}
    indexer = pools["DSA indexer"]
    assert indexer["bytes_per_token"] == 61 * 132  # 128 + 128 // 128 * 4 bytes per token per layer
    assert indexer["rows"] >= pools["target KV"]["rows"]
    ram = report["sizing"]["host_ram"]
    if since("0.5.19"):
        # sglang books each pool against this rank's share of the node's RAM and refuses the draft sidecar,
        # the last pool it builds, once the target and the indexer have taken most of it.
        assert "Not enough host memory available" in ram["startup_error"], report["verdict"]["line"]
    else:
        # Each pool is checked against the whole node's free RAM there; the node does not hold them all.
        assert ram["needed_per_node"] > 2_038 * 2**30 and not ram["fits"]
        assert "host pools need 2,06" in report["verdict"]["line"] and "has 2,038 GiB left" in report["verdict"]["line"]
        assert "more than the 2,038.00 GiB left" in report["verdict"]["detail"]


@pytest.mark.skipif(not since("0.5.21") or since("0.5.22"), reason="0.5.21 is the one release that auto-sizes a DSA launch under DCP")
def test_auto_sizing_brings_the_dsa_launch_into_the_node_with_the_fix():
    at = DSA_LAUNCH.index("--hicache-ratio")
    launch = DSA_LAUNCH[:at] + DSA_LAUNCH[at + 2:]
    code, report, _ = preflight(*launch)
    assert code == 6 and report["sizing"]["hicache_ratio"] < 2
    assert "DSA indexer" in [p["name"] for p in report["sizing"]["pools"]]
    assert "Not enough host memory available" in report["sizing"]["stock_startup_error"]


@pytest.mark.parametrize("config,says", [
    ("minicpm3", "config.json needs the model's own Python code to load"),
    ("unknown-arch", "names architecture NoSuchModelForCausalLM, which sglang"),
])
def test_a_config_the_release_cannot_load_is_one_line_of_bad_input(config, says):
    code, report, err = preflight("--", "--model-path", str(DATA / config), "--tp", "8", "--dcp-size", "8",
                                  "--enable-hierarchical-cache")
    assert code == 2 and report["verdict"]["outcome"] == "BAD INPUT"
    assert says in err and err.count("\n") == 1 and "fix: " in err and "Traceback" not in err
    assert f"sglang {RELEASE}" in err


@pytest.mark.skipif(not since("0.5.21"), reason="auto-sizing (--hicache-host-memory-fraction) arrives in 0.5.21")
def test_auto_sizing_short_of_the_draft_stops_stock_and_the_fix_fits():
    """At 400 GiB for 8 ranks, stock auto-sizing prices the DCP8 draft sidecar at 1/dcp and runs out of host memory."""
    argv = ("--host-ram-gib", "400", "--device-rows", "540000")
    code, report, _ = preflight(*argv)
    sizing = report["sizing"]
    assert sizing["auto_sized_from"] == 2.0
    # As run (the plugin on, or the series): the estimate counts the draft, the ratio comes down, the pools fit.
    assert code == 0 and sizing["hicache_ratio"] < 2.0
    if "upstream-next" in report["release"]["series_applied"]:
        assert sizing["stock_pools"] is None  # the series sizes it; the plugin stands aside, stock builds the same
    else:
        assert "Not enough host memory available" in sizing["stock_startup_error"]
        off, report_off, _ = preflight(*argv, env={"SGLANG_ENABLE_DCP_DSPARK_PLUGIN": "0"})
        assert off == 3 and "Not enough host memory available" in report_off["verdict"]["detail"]


@pytest.mark.skipif(since("0.5.21"), reason="from 0.5.21 the ratio is auto-sized")
def test_no_auto_sizing_before_0_5_21():
    code, report, _ = preflight("--host-ram-gib", "400", "--device-rows", "540000")
    assert report["sizing"]["auto_sized_from"] is None and report["sizing"]["hicache_ratio"] == 2.0


@pytest.mark.skipif(TREE != "next-patched", reason="--hicache-draft-backup is upstream-next's (0005)")
def test_the_series_budget_and_both_draft_backups_side_by_side():
    code, report, _ = preflight(*BLACKWELL, *ROWS, "--", *DCP8, *DSPARK, *CUTEDSL, "--hicache-size", "100")
    assert code == 0 and report["release"]["series_applied"] == ["upstream-next"]
    backups = report["sizing"]["backups"]
    replicated, sharded = backups["replicated"], backups["sharded"]
    # The same budget holds both; sharded, the target gets the draft's share back (t / (t + d) rather than t / (t + 8 d)).
    for b in (replicated, sharded):
        assert b["per_rank"] <= 100e9 + 70_272 * 64 and b["per_node"] == 8 * b["per_rank"]
    assert sharded["target_logical_slots"] > replicated["target_logical_slots"]
    # Replicated, a draft row per logical slot; sharded, one per target row (this rank's stripe).
    for mode, per_target_row in (("replicated", 8), ("sharded", 1)):
        rows = {p["role"]: p["rows"] for p in backups[mode]["pools"]}
        assert rows["draft"] == rows["target"] * per_target_row, (mode, rows)
