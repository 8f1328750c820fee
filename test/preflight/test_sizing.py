"""preflight.sizing: a target device row's bytes, and --device-rows against the GPU's memory.

The host pools themselves are the release's own builders' (test/releases/test_cross_check.py checks them against
sglang's real pools); here, the arithmetic preflight adds around them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_dcp_dspark.core.errors import DcpDsparkError
from sglang_dcp_dspark.core.sizing import MLAKV
from sglang_dcp_dspark.preflight import inputs, sizing
from sglang_dcp_dspark.preflight.launch import GIB, Node
from sglang_dcp_dspark.preflight.models import Models

TINY = Path(__file__).parents[1] / "data" / "tiny-mla"
# The tiny config: 2 layers of (512 + 64) bf16 values per token.
ROW = 2 * 576 * 2


def test_a_row_is_the_target_plus_dcp_draft_rows():
    target = MLAKV(layers=2, kv_lora_rank=512, qk_rope_head_dim=64)
    assert sizing.device_bytes_per_row(Models(target), 8) == ROW
    assert sizing.device_bytes_per_row(Models(target, draft=target), 8) == ROW + 8 * ROW


def test_device_rows_a_gpu_cannot_hold_are_one_line():
    configs = inputs.read_configs(["--model-path", str(TINY)])
    node = Node(gpu_memory_gib=1.0)
    sizing.check_device_rows(configs, node, 1024)
    with pytest.raises(DcpDsparkError) as exc:
        sizing.check_device_rows(configs, node, int(GIB))
    assert "--gpu-memory-gib 1" in str(exc.value) and "fix: " in str(exc.value)
