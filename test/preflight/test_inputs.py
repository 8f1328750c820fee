"""preflight.inputs: preflight's own numbers, the configs a launch names, and the resolved numbers no node holds.

Each refusal is bad input: one line that says what was expected and the fix. The launch's own parse by sglang
(``parse_launch``) is exercised through the command line (test_check.py).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_dcp_dspark.core.errors import DcpDsparkError
from sglang_dcp_dspark.preflight import inputs
from sglang_dcp_dspark.preflight.launch import Node

TINY = Path(__file__).parents[1] / "data" / "tiny-mla"


def resolved(**fields) -> SimpleNamespace:
    """A resolved launch's numbers, in range unless ``fields`` say otherwise."""
    base = {"tp_size": 8, "dcp_size": 8, "pp_size": 1, "nnodes": 1, "page_size": 1, "hicache_ratio": 2.0,
            "hicache_size": 0.0, "mem_fraction_static": None}
    return SimpleNamespace(**(base | fields))


def test_the_default_launch_names_the_shipped_models():
    argv = inputs.default_launch()
    assert argv[argv.index("--model-path") + 1] == str(inputs.DEFAULT_MODEL)
    assert argv[argv.index("--speculative-draft-model-path") + 1] == str(inputs.DEFAULT_DRAFT)
    assert inputs.default_node().gpu_name == inputs.DEFAULT_GPU


def test_the_configs_are_read_by_flag():
    configs = inputs.read_configs(["--model-path", str(TINY), "--speculative-draft-model-path", str(TINY)])
    assert configs.target == configs.draft and configs.target["kv_lora_rank"]
    assert configs.paths == {"--model-path": str(TINY), "--speculative-draft-model-path": str(TINY)}
    alone = inputs.read_configs(["--model-path", str(TINY)])
    assert alone.draft is None and list(alone.paths) == ["--model-path"]


@pytest.mark.parametrize("node,rows,says", [
    (Node(gpus=0), None, "--gpus 0 (expected 1 to 64)"),
    (Node(gpu_memory_gib=float("nan")), None, "--gpu-memory-gib nan"),
    (Node(host_ram_gib=-1.0), None, "--host-ram-gib -1.0"),
    (Node(), 0, "--device-rows 0 (expected >= 1)"),
])
def test_out_of_range_node_numbers_are_one_line(node, rows, says):
    with pytest.raises(DcpDsparkError) as exc:
        inputs.check_node(node, rows)
    assert says in str(exc.value) and "fix: " in str(exc.value) and "\n" not in str(exc.value)


def test_an_in_range_node_passes():
    inputs.check_node(Node(), 1024)
    inputs.check_resolved(resolved(), Node())


@pytest.mark.parametrize("fields,says", [
    ({"dcp_size": 0}, "--dcp-size 0 (expected >= 1)"),
    ({"page_size": 0}, "--page-size 0 (expected 1 to"),
    ({"hicache_ratio": float("inf")}, "--hicache-ratio inf"),
    ({"mem_fraction_static": 1.5}, "--mem-fraction-static 1.5"),
    ({"dcp_size": 3}, "--dcp-size 3 does not divide --tp 8"),
    ({"tp_size": 16}, "puts 16 ranks on a node"),
])
def test_resolved_numbers_no_node_holds_are_one_line(fields, says):
    with pytest.raises(DcpDsparkError) as exc:
        inputs.check_resolved(resolved(**fields), Node())
    assert says in str(exc.value) and "fix: " in str(exc.value)
