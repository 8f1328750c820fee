"""preflight.models: which configs are MLA (to pick the pass map's cases) and how a KV geometry is reported.

The pools themselves are read through the release's ModelConfig
(``models.read``), which every preflight judgement in test/preflight/test_check.py
and test/releases runs; here the parts that need no sglang.
"""

from __future__ import annotations

import json

from sglang_dcp_dspark.core.sizing import MLAKV
from sglang_dcp_dspark.preflight import check, models


def _config(path) -> dict:
    return json.loads((path / "config.json").read_text())


def test_the_shipped_configs_are_read_as_published():
    # DeepSeek-V3's public config.json is MLA; the Kimi-K3 DSPARK draft's geometry is a dense draft
    assert models.is_mla_config(_config(check.DEFAULT_MODEL))
    assert not models.is_mla_config(_config(check.DEFAULT_DRAFT))


def test_mla_in_a_text_config_counts():
    """Kimi-K2.5 keeps its attention fields under text_config, as sglang's hf_text_config reads them."""
    assert models.is_mla_config({"text_config": {"kv_lora_rank": 512}})
    assert not models.is_mla_config({"text_config": {"kv_lora_rank": 0}})
    assert not models.is_mla_config(None) and not models.is_mla_config(["kv_lora_rank"])


def test_a_geometry_is_reported_with_its_kind():
    kv = MLAKV(layers=61, kv_lora_rank=512, qk_rope_head_dim=64, dtype="bfloat16")
    fields = models.kv_fields(kv)
    assert fields["kind"] == "mla" and fields["layers"] == 61 and fields["kv_lora_rank"] == 512
    assert models.kv_fields(None) is None
