"""The HiCache+DCP gate (ServerArgs._resolve_hicache_dcp_compatibility): DSPARK admitted, all else as before."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from sglang.srt.server_args import ServerArgs

ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK")
DCP_SIZES = (1, 2, 8)
# Each other gate, and the first words of the message it raises (unchanged by the fix).
GATES = {
    None: None,
    "l3": "--hicache-storage-backend (L3) with --dcp-size > 1",
    "lmcache": "--enable-lmcache with --dcp-size > 1",
    "hisparse": "--enable-hisparse with --dcp-size > 1",
    "non_mla": "HiCache with --dcp-size > 1 is only supported for MLA models",
}
SPEC_REJECTED = "HiCache with --dcp-size > 1"
DSPARK_ONLY = "only supports DSPARK speculative decoding"


def server_args(dcp_size: int, algorithm: str | None, gate: str | None) -> SimpleNamespace:
    """The fields the resolver reads, as a launch with these flags would set them."""
    return SimpleNamespace(
        dcp_size=dcp_size,
        enable_hierarchical_cache=True,
        hicache_storage_backend="file" if gate == "l3" else None,
        speculative_algorithm=algorithm,
        enable_lmcache=gate == "lmcache",
        enable_hisparse=gate == "hisparse",
        use_mla_backend=lambda: gate != "non_mla",
    )


def resolve(args: SimpleNamespace) -> str | None:
    """Run sglang's resolver; the rejection message, or None when admitted."""
    try:
        ServerArgs._resolve_hicache_dcp_compatibility(args)
    except NotImplementedError as exc:
        return str(exc)
    return None


def expected(dcp_size: int, algorithm: str | None, gate: str | None) -> str | None:
    """What the fixed resolver must say: the gate order of upstream 0.5.18."""
    if dcp_size <= 1:
        return None
    if gate == "l3":
        return GATES["l3"]
    if algorithm not in (None, "DSPARK"):
        # The series and the plugin refuse them in the same words (upstream's).
        return DSPARK_ONLY
    return GATES[gate]


def matrix(*, changed: bool):
    """(dcp, algorithm, gate) cases whose outcome the fix changes, or those it must not."""
    for dcp in DCP_SIZES:
        for algorithm in ALGORITHMS:
            for gate in GATES:
                # The fix changes DSPARK past the L3 gate, and the wording of
                # the rejection for every other algorithm; nothing at dcp 1.
                is_changed = dcp > 1 and gate != "l3"
                if is_changed == changed:
                    yield pytest.param(dcp, algorithm, gate, id=f"dcp{dcp}-{algorithm}-{gate or 'nogate'}")


@pytest.mark.regression
@pytest.mark.parametrize("dcp,algorithm,gate", list(matrix(changed=True)))
def test_gate_outcome_matches_upstream(dcp, algorithm, gate):
    message = resolve(server_args(dcp, algorithm, gate))
    want = expected(dcp, algorithm, gate)
    if want is None:
        assert message is None, f"rejected: {message}"
    else:
        assert message is not None and want in message, f"expected {want!r}, got {message!r}"


@pytest.mark.parametrize("dcp,algorithm,gate", list(matrix(changed=False)))
def test_gate_outcome_unchanged(dcp, algorithm, gate):
    message = resolve(server_args(dcp, algorithm, gate))
    want = expected(dcp, algorithm, gate)
    if want is None:
        assert message is None
    else:
        assert message is not None and want in message


@pytest.mark.parametrize("dcp", [d for d in DCP_SIZES if d > 1])
@pytest.mark.parametrize("algorithm", [a for a in ALGORITHMS if a != "DSPARK"])
def test_other_algorithms_still_rejected(dcp, algorithm):
    """Whatever the wording, no algorithm but DSPARK gets through under DCP on any tree."""
    message = resolve(server_args(dcp, algorithm, None))
    assert message is not None and SPEC_REJECTED in message


@pytest.mark.parametrize("dcp", DCP_SIZES)
def test_no_speculation_admitted(dcp):
    assert resolve(server_args(dcp, None, None)) is None


def test_gate_skipped_without_hicache():
    args = server_args(8, "EAGLE", "lmcache")
    args.enable_hierarchical_cache = False
    assert resolve(args) is None


def series_refusal() -> str:
    """The refusal series patch 0001 writes, joined from the string literals it adds."""
    from pathlib import Path

    (patch,) = (Path(__file__).resolve().parents[2] / "patches" / "sglang-0.5.17").glob("0001-*.patch")
    added = [ln[1:].strip() for ln in patch.read_text(encoding="utf-8").splitlines() if ln.startswith("+")]
    literals = [ln.strip('"') for ln in added if ln.startswith('"') and ln.endswith('"')]
    assert literals and DSPARK_ONLY in "".join(literals), f"patch 0001 no longer adds the refusal: {added}"
    return "".join(literals)


@pytest.mark.regression
@pytest.mark.parametrize("algorithm", [a for a in ALGORITHMS if a != "DSPARK"])
@pytest.mark.parametrize("gate", [None, "lmcache", "hisparse", "non_mla"])
def test_other_algorithms_are_refused_in_the_series_words(algorithm, gate):
    """Plugin parity: whichever carrier fixed the tree, a non-DSPARK draft under DCP + HiCache reads the same."""
    message = resolve(server_args(8, algorithm, gate))
    assert message == series_refusal(), f"{algorithm}: {message!r}"
