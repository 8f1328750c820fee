"""The HiCache+DCP gate of PR #35221's form: DSPARK is admitted, every other algorithm refused."""

from __future__ import annotations

import pytest

OTHER_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH")


def gate_error(algorithm, *, dcp_size=8, storage_backend=None, mla=True):
    """What _resolve_hicache_dcp_compatibility raises for these arguments, or None."""
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs.__new__(ServerArgs)
    args.dcp_size = dcp_size
    args.enable_hierarchical_cache = True
    args.hicache_storage_backend = storage_backend
    args.speculative_algorithm = algorithm
    args.enable_lmcache = False
    args.enable_hisparse = False
    args.use_mla_backend = lambda: mla
    try:
        args._resolve_hicache_dcp_compatibility()
    except NotImplementedError as exc:
        return exc
    return None


@pytest.mark.regression
def test_dspark_is_admitted():
    assert gate_error("DSPARK") is None


def test_no_speculation_is_admitted():
    assert gate_error(None) is None


@pytest.mark.parametrize("algorithm", OTHER_ALGORITHMS)
def test_other_algorithms_are_refused(algorithm):
    assert gate_error(algorithm) is not None


@pytest.mark.parametrize("algorithm", (None, "DSPARK") + OTHER_ALGORITHMS)
def test_without_dcp_every_algorithm_is_admitted(algorithm):
    assert gate_error(algorithm, dcp_size=1) is None


@pytest.mark.parametrize("kwargs", [dict(storage_backend="file"), dict(mla=False)], ids=["l3-storage", "non-mla"])
def test_dspark_keeps_the_other_dcp_gates(kwargs):
    assert gate_error("DSPARK", **kwargs) is not None
