"""Launch validation through sglang's real prepare_server_args, on an emulated 8-GPU node."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from unittest import mock

import pytest

# Imported before the CUDA probes are patched, so that their import-time
# is_cuda() checks stay false and CUDA-only kernels are not imported.
import sglang.srt.configs.model_config
import sglang.srt.layers.quantization  # noqa: F401
from sglang.srt.server_args import prepare_server_args

GATE_MESSAGE = "HiCache with --dcp-size > 1"


@contextlib.contextmanager
def h200_node(gpus: int = 8):
    """Only the hardware probes sglang asks during argument resolution."""
    props = SimpleNamespace(
        name="NVIDIA H200", total_memory=141 * 1024**3, major=9, minor=0, multi_processor_count=132
    )
    with contextlib.ExitStack() as stack:
        for name, value in {
            "is_available": True,
            "device_count": gpus,
            "get_device_capability": (9, 0),
            "get_device_properties": props,
            "get_device_name": props.name,
            "mem_get_info": (140 * 1024**3, 141 * 1024**3),
        }.items():
            stack.enter_context(mock.patch(f"torch.cuda.{name}", return_value=value))
        yield


def launch(model, *extra: str):
    argv = ["--model-path", str(model), "--device", "cuda", "--tp", "8", "--dcp-size", "8",
            "--enable-hierarchical-cache", *extra]
    with h200_node():
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
