"""preflight.gpus: the part a --gpu-name names, and the platform facts sglang's probes answer for it."""

from __future__ import annotations

import pytest

from sglang_dcp_dspark.core.errors import DcpDsparkError
from sglang_dcp_dspark.preflight import gpus


@pytest.mark.parametrize("name,key,capability", [
    ("NVIDIA H200", "H200", (9, 0)),
    ("nvidia h100 80gb hbm3", "H100", (9, 0)),
    ("NVIDIA H20", "H20", (9, 0)),  # not the H200: a model number is a whole word
    ("NVIDIA GB200", "GB200", (10, 0)),  # not the B200 inside it
    ("NVIDIA B300 SXM6 AC", "B300", (10, 3)),
    ("A100", "A100", (8, 0)),
])
def test_a_name_picks_its_part(name, key, capability):
    part = gpus.part(name)
    assert (part.key, part.capability) == (key, capability)


@pytest.mark.parametrize("name", ["NVIDIA RTX 4090", "", "H2000"])
def test_an_unknown_part_is_one_line_with_the_fix(name):
    with pytest.raises(DcpDsparkError) as exc:
        gpus.part(name)
    line = str(exc.value)
    assert "\n" not in line and "names no GPU preflight can emulate" in line and "fix: " in line


def test_the_facts_follow_the_architecture():
    hopper, blackwell = gpus.facts((9, 0)), gpus.facts((10, 0))
    assert hopper.is_sm90 and not hopper.is_blackwell and hopper.device_sm == 90
    assert blackwell.is_blackwell and blackwell.is_sm100 and not blackwell.is_sm90
    assert gpus.facts((12, 0)).is_sm120 and not gpus.facts((12, 0)).is_sm100
    # every probe function preflight answers names a fact the table has
    assert set(gpus.PROBE_FUNCTIONS.values()) <= set(hopper.as_dict())


def test_the_default_part_is_the_h200():
    assert gpus.DEFAULT.name == "NVIDIA H200" and gpus.DEFAULT.architecture == "Hopper"
    assert gpus.part("NVIDIA B200").architecture == "Blackwell"
