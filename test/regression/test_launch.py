"""Launch validation through sglang's real prepare_server_args, on an emulated 8-GPU node."""

from __future__ import annotations

import pytest

# Imported before the CUDA probes are patched, so that their import-time
# is_cuda() checks stay false and CUDA-only kernels are not imported.
import sglang.srt.configs.model_config
import sglang.srt.layers.quantization  # noqa: F401
from sglang.srt.server_args import prepare_server_args

from sglang_dcp_dspark.preflight.check import Node, emulated_node

GATE_MESSAGE = "HiCache with --dcp-size > 1"


def launch(model, *extra: str):
    # 8 x B200 on cutedsl_mla, PR #35221's validated shape: the probes argument resolution asks, as preflight answers
    # them. (On an H200 sglang picks fa3, which the plugin refuses under DCP: test/releases/test_node_verdicts.py.)
    argv = ["--model-path", str(model), "--device", "cuda", "--tp", "8", "--dcp-size", "8",
            "--enable-hierarchical-cache", "--attention-backend", "cutedsl_mla", *extra]
    with emulated_node(Node.of_part("NVIDIA B200")):
        return prepare_server_args(argv)


@pytest.mark.regression
def test_dcp8_hicache_dspark_passes_the_gate(tiny_mla_model):
    try:
        args = launch(tiny_mla_model, "--speculative-algorithm", "DSPARK",
                      "--speculative-draft-model-path", str(tiny_mla_model))
    except NotImplementedError as exc:
        raise AssertionError(f"launch rejected: {exc}") from None
    assert args.speculative_algorithm == "DSPARK"
    assert args.dcp_size == 8 and args.enable_hierarchical_cache


def test_dcp8_hicache_eagle_is_rejected(tiny_mla_model):
    with pytest.raises(NotImplementedError, match=GATE_MESSAGE):
        launch(tiny_mla_model, "--speculative-algorithm", "EAGLE",
               "--speculative-draft-model-path", str(tiny_mla_model))


def test_dcp8_hicache_without_speculation_passes(tiny_mla_model):
    assert launch(tiny_mla_model).dcp_size == 8
