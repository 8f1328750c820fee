"""Public configs shaped unlike DeepSeek-V3, on every release: sglang's verdict, or one line on why preflight cannot judge.

The configs are in ``test/data/public`` (their sources in its README). Each is
read through the release's own ``ModelConfig``: MLA fields in ``text_config``
(Kimi-K2.5), a compressed KV pool (DeepSeek-V4-Flash), a hybrid mamba stack
that sglang refuses on this CPU machine for this machine's reasons
(Qwen3-Next), a NEXTN launch on a target without MTP layers (Kimi-K2-Thinking).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tree_table import TREES, VERSIONS
from trees import TREE

from .conftest import preflight

PUBLIC = Path(__file__).resolve().parents[1] / "data" / "public"
# flashinfer: the MLA backend whose plain passes the map shows consistent under DCP (on an H200 sglang would pick
# fa3, which the plugin refuses there: test_node_verdicts.py)
DCP8 = ["--tp", "8", "--dcp-size", "8", "--enable-hierarchical-cache", "--attention-backend", "flashinfer"]
ROWS = ["--device-rows", "100000"]


def judged(name: str, *launch: str) -> tuple[int, dict, str]:
    code, report, err = preflight(*ROWS, "--", "--model-path", str(PUBLIC / name), *launch)
    assert "Traceback" not in err, err[-3000:]
    assert code in (0, 1, 2, 3) and report["verdict"]["code"] == code
    if code == 2:
        # One line, with its remedy, and never "download again" for a config sglang itself loads.
        assert err.count("\n") == 1 and "fix: " in err and "download the model's own config.json again" not in err
    return code, report, err


def host_pool(report: dict) -> dict:
    return next(p for p in report["sizing"]["pools"] if p["role"] == "target")


@pytest.mark.parametrize("dtype,bytes_per_token", [("auto", 54_144), ("fp8_e4m3", 27_072)])
def test_glm_4_7_flash_is_sized_at_its_mla_rows(dtype, bytes_per_token):
    """47 layers x (512 + 64) values, in bf16 or fp8."""
    code, report, _ = judged("glm-4.7-flash", *DCP8, "--kv-cache-dtype", dtype)
    assert code == 0 and host_pool(report)["bytes_per_token"] == bytes_per_token


def test_kimi_k2_thinking_is_sized_at_its_mla_rows():
    code, report, _ = judged("kimi-k2-thinking", *DCP8)
    assert code == 0 and host_pool(report)["bytes_per_token"] == 70_272


def test_a_nextn_launch_on_a_target_without_mtp_layers_is_never_a_pass():
    """Kimi-K2-Thinking ships no NextN layer: refused by the release's gate, or named as the reason (exit 2)."""
    code, report, err = judged("kimi-k2-thinking", *DCP8, "--speculative-algorithm", "NEXTN")
    if code == 1:
        assert "speculative" in report["verdict"]["message"], report["verdict"]
    else:
        assert code == 2 and "has none (num_nextn_predict_layers is not set)" in err


def test_kimi_k2_5_is_read_through_its_text_config():
    """Its MLA fields live in text_config: sglang's hf_text_config reads them, and so does preflight."""
    code, report, _ = judged("kimi-k2.5", *DCP8)
    assert code == 0, report["verdict"]["line"]
    assert report["sizing"]["target_kv"]["kv_lora_rank"] == 512 and host_pool(report)["bytes_per_token"] == 70_272


def test_deepseek_v4_flash_gets_sglangs_verdict_or_one_line():
    """Under DCP sglang refuses it (not MLA to its HiCache gate); without DCP, its compressed pool is named."""
    code, report, _ = judged("deepseek-v4-flash", *DCP8)
    assert code == 1 and "only supported for MLA models" in report["verdict"]["message"]
    assert report["verdict"]["line"].endswith("refuses HiCache under DCP for a dense model"), report["verdict"]["line"]
    code, _, err = judged("deepseek-v4-flash", "--tp", "8", "--enable-hierarchical-cache")
    assert code == 2 and "DeepseekV4ForCausalLM" in err and "compressed KV pool" in err


def test_qwen3_next_is_not_judged_on_this_machines_platform():
    """sglang's extra_buffer check asks the platform: the CPU machine's answer is no verdict on the GPU node. Where
    the release asks an architecture probe the emulated node answers (0.5.23's platform object), the check passes and
    preflight says it does not size the hybrid stack instead: never a verdict either way."""
    code, _, err = judged("qwen3-next", "--tp", "8", "--enable-hierarchical-cache")
    assert code == 2 and err.count("\n") == 1, err
    assert ("for a reason of the machine preflight runs on, not of the emulated" in err
            and "preflight cannot reach sglang's verdict on CPU" in err) or (
        "preflight cannot size the target" in err and "Qwen3NextForCausalLM" in err), err


EAGLE3 = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(PUBLIC / "kimi-k2.5-eagle3")]


def test_an_eagle3_draft_gets_its_own_dense_host_pool_without_dcp():
    """A one-layer LlamaForCausalLMEagle3 with 64 KV heads over --tp 8: 8 heads x (128 + 128) x 2 bytes per token."""
    code, report, _ = judged("kimi-k2-thinking", "--tp", "8", "--enable-hierarchical-cache", *EAGLE3)
    assert code == 0, report["verdict"]["line"]
    draft = next(p for p in report["sizing"]["pools"] if p["role"] == "draft")
    assert report["sizing"]["draft_kv"]["kind"] == "mha" and draft["bytes_per_token"] == 4_096


def test_an_eagle3_draft_under_dcp_and_hicache_passes_where_the_gate_decides_by_layout():
    """A dense EAGLE3 draft on flashinfer is replicated, which its own host pool fits: admitted under DCP + HiCache
    on 0.5.23 (the plugin's gate hook, upstream-next 0020), its sidecar at the target's logical slots; every release
    before refuses it at sglang's gate."""
    code, report, _ = judged("kimi-k2-thinking", *DCP8, *EAGLE3)
    if TREES[TREE].sglang != VERSIONS["next"]:  # 0.5.23: the plan check needs its CacheInitParams
        assert code == 1 and "dcp-size > 1" in report["verdict"]["message"]
        assert report["verdict"]["line"].endswith("refuses HiCache under DCP with EAGLE3"), report["verdict"]["line"]
        return
    assert code == 0, report["verdict"]["line"]
    draft = next(p for p in report["sizing"]["pools"] if p["role"] == "draft")
    assert draft["rows"] == host_pool(report)["logical_slots"], draft
