"""preflight.resolution: what a launch runs, read in one place (the resolved launch, else sglang's own parse of its
arguments), and the options an advised launch drops.

sglang's resolutions themselves, the pass judgement and the advice are exercised end to end (test_check.py and
test/releases/).
"""

from __future__ import annotations

import argparse

import pytest

from sglang_dcp_dspark.preflight import launch as launch_mod
from sglang_dcp_dspark.preflight import resolution
from sglang_dcp_dspark.preflight.launch import Launch


def given(**fields) -> argparse.Namespace:
    """sglang's parse of a launch: its backend options and --dcp-size default to None on every release."""
    base = {"model_path": "target", "speculative_draft_model_path": None, "speculative_algorithm": "EAGLE",
            "dcp_size": None, "enable_hierarchical_cache": True, "attention_backend": None,
            "decode_attention_backend": None, "prefill_attention_backend": None,
            "speculative_draft_attention_backend": None, "speculative_eagle_topk": None, "kv_cache_dtype": "auto"}
    return argparse.Namespace(**(base | fields))


def resolved(**fields) -> Launch:
    base = {"model_path": "target", "draft_model_path": "draft", "tp_size": 8, "pp_size": 1, "nnodes": 1,
            "dcp_size": 8, "page_size": 64, "enable_hierarchical_cache": True, "hicache_ratio": 2.0,
            "hicache_size": 0.0, "hicache_mem_layout": "layer_first", "hicache_io_backend": None,
            "hicache_host_memory_mode": None, "hicache_host_memory_fraction": None, "hicache_storage_backend": None,
            "speculative_algorithm": "DSPARK", "disaggregation_mode": None, "mem_fraction_static": None,
            "kv_cache_dtype": "auto", "attention_backends": ("fa3", "flashinfer")}
    return Launch(**(base | fields))


@pytest.mark.parametrize("value,dcp", [(None, 1), (8, 8), ("4", 4), (0, 0), (-1, -1)])
def test_one_reading_of_dcp_size_for_a_parse_and_a_resolution(value, dcp):
    assert launch_mod.dcp_size(value) == dcp
    assert resolution.runs(None, given(dcp_size=value)).dcp == dcp


def test_the_resolved_launch_is_what_runs():
    runs = resolution.runs(resolved(kv_cache_dtype="fp8_e4m3"), given(dcp_size=2, attention_backend="triton"))
    assert runs.resolved and runs.dcp == 8 and runs.algorithm == "DSPARK" and runs.draft == "draft"
    assert runs.kv_cache_dtype == "fp8_e4m3"
    assert (runs.prefill, runs.decode) == ("fa3", "flashinfer")
    assert runs.named_decode == runs.named_prefill == "triton" and not runs.own_layer


def test_without_a_resolution_the_arguments_say_what_runs():
    runs = resolution.runs(None, given(dcp_size=8, decode_attention_backend="flashinfer", speculative_eagle_topk=4,
                                       kv_cache_dtype="fp8_e5m2"))
    assert not runs.resolved and runs.dcp == 8 and runs.algorithm == "EAGLE" and runs.own_layer
    assert runs.kv_cache_dtype == "fp8_e5m2"
    assert (runs.prefill, runs.decode, runs.draft_backend) == (None, "flashinfer", None)
    assert runs.eagle_topk == 4


def test_an_advised_launch_drops_every_form_of_the_options_it_replaces():
    from sglang_dcp_dspark.preflight import advice
    from sglang_dcp_dspark.preflight.verdict import Change

    argv = ["--tp", "8", "--attention-backend", "fa3", "--decode-attention-backend=flashinfer", "--dcp-size", "8",
            "--enable-hierarchical-cache", "--speculative-algorithm", "EAGLE", "--speculative-eagle-topk=4"]
    backend = Change("--attention-backend flashinfer", add=("--attention-backend", "flashinfer"),
                     drop=advice.BACKEND_OPTIONS)
    changed, removed = advice.apply(argv, backend)
    assert changed == ["--tp", "8", "--dcp-size", "8", *argv[7:], "--attention-backend", "flashinfer"]
    assert removed == ["--attention-backend", "fa3", "--decode-attention-backend=flashinfer"]
    # an option without a value, and every option of one kind
    changed, removed = advice.apply(argv, Change("drop HiCache", drop_flags=(advice.HICACHE_FLAG,)))
    assert advice.HICACHE_FLAG not in changed and removed == [advice.HICACHE_FLAG]
    changed, removed = advice.apply(argv, Change("no speculative decoding", drop_prefix="--speculative-"))
    assert changed == argv[:8] and removed == argv[8:]
    # a value set replaces the old one
    changed, removed = advice.apply(argv, Change("--dcp-size 1", add=("--dcp-size", "1")))
    assert changed.count("--dcp-size") == 1 and changed[-2:] == ["--dcp-size", "1"] and removed == ["--dcp-size", "8"]
