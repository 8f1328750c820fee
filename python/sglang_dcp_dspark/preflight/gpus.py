"""The GPU parts preflight can emulate, and what sglang's platform probes answer on each.

sglang picks its attention backends (and refuses some) by the GPU's
architecture: fa3 for MLA on Hopper with CUDA >= 12.3, flashinfer on SM100,
cutedsl_mla and trtllm_mla only on Blackwell. A node is therefore named by its
part: the part sets the compute capability and the memory per GPU together,
and every probe sglang asks (torch's, sglang's platform object, the
``is_sm100_supported`` / ``is_blackwell`` / ``is_hopper_with_cuda_12_3``
family) answers from that capability, as on a CUDA 12.8 machine.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from ..core.errors import DcpDsparkError

# The CUDA runtime the emulated node reports: sglang's Blackwell probes ask for >= 12.8, Hopper's for >= 12.3.
CUDA_VERSION = "12.8"


@dataclass(frozen=True)
class Part:
    key: str  # the model number as it appears in torch.cuda.get_device_name()
    name: str  # what torch.cuda.get_device_name() returns on the part
    capability: tuple[int, int]
    memory_gib: float  # the part's memory, as its datasheet gives it (GB), the figure operators know

    @property
    def architecture(self) -> str:
        return ARCHITECTURES.get(self.capability[0], f"SM{self.capability[0]}{self.capability[1]}")


ARCHITECTURES = {8: "Ampere", 9: "Hopper", 10: "Blackwell", 11: "Blackwell", 12: "Blackwell"}

# Datasheet figures (NVIDIA product pages): capability from the CUDA GPU list, memory per GPU.
PARTS = (
    Part("A100", "NVIDIA A100-SXM4-80GB", (8, 0), 80.0),
    Part("H100", "NVIDIA H100 80GB HBM3", (9, 0), 80.0),
    Part("H800", "NVIDIA H800", (9, 0), 80.0),
    Part("H20", "NVIDIA H20", (9, 0), 96.0),
    Part("H200", "NVIDIA H200", (9, 0), 141.0),
    Part("B200", "NVIDIA B200", (10, 0), 180.0),
    Part("GB200", "NVIDIA GB200", (10, 0), 186.0),
    Part("B300", "NVIDIA B300 SXM6 AC", (10, 3), 288.0),
    Part("GB300", "NVIDIA GB300", (10, 3), 288.0),
)
DEFAULT = next(p for p in PARTS if p.key == "H200")
FIX = 'sglang-dcp-dspark preflight --gpu-name "NVIDIA H200" ...'


def part(name: str) -> Part:
    """The part a GPU name names (its model number as a whole word, any case); bad input when none does."""
    text = (name or "").strip()
    for p in sorted(PARTS, key=lambda p: -len(p.key)):
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(p.key)}(?![0-9])", text, re.I):
            return p
    known = ", ".join(p.key for p in PARTS)
    raise DcpDsparkError(f"--gpu-name {text!r} names no GPU preflight can emulate; expected a name with one of "
                         f"{known} (the node's architecture decides sglang's attention backends); fix: {FIX}")


@dataclass(frozen=True)
class Facts:
    """sglang's platform facts on a CUDA node, each named as ``runtime_context._PLATFORM_PROBES`` names it."""

    is_sm90: bool
    is_sm100: bool
    is_sm100_or_sm110: bool
    is_sm110: bool
    is_sm120: bool
    is_blackwell: bool
    is_hopper_with_cuda_12_3: bool
    is_ampere_with_cuda_12_3: bool
    device_sm: int
    device_capability: tuple[int, int]
    is_cuda: bool = True
    is_hip: bool = False
    is_npu: bool = False
    is_xpu: bool = False
    is_musa: bool = False
    is_mps: bool = False

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def facts(capability: tuple[int, int]) -> Facts:
    """sglang's platform facts on a CUDA node of this capability."""
    major, minor = capability
    return Facts(
        is_sm90=major == 9, is_sm100=major == 10, is_sm100_or_sm110=major in (10, 11), is_sm110=major == 11,
        is_sm120=major == 12, is_blackwell=major in (10, 11, 12), is_hopper_with_cuda_12_3=major == 9,
        is_ampere_with_cuda_12_3=major == 8, device_sm=major * 10 + minor, device_capability=(major, minor),
    )


# sglang.srt.utils' architecture probes and the fact each answers (the functions ``PlatformContext`` reads, and the
# names modules import directly). The device-kind probes (is_cuda, is_hip, ...) stay this machine's: sglang imports
# its CUDA kernel packages (flashinfer, sgl_kernel) wherever they say CUDA, and this machine has none; a refusal
# that comes from one is reported as this machine's, not the node's (launch.platform_refusal).
PROBE_FUNCTIONS = {
    "is_sm90_supported": "is_sm90", "is_sm100_supported": "is_sm100",
    "is_sm100_or_sm110_supported": "is_sm100_or_sm110", "is_sm110_supported": "is_sm110",
    "is_sm120_supported": "is_sm120", "is_sm120": "is_sm120", "is_blackwell": "is_blackwell",
    "is_blackwell_supported": "is_blackwell", "is_hopper_with_cuda_12_3": "is_hopper_with_cuda_12_3",
    "is_ampere_with_cuda_12_3": "is_ampere_with_cuda_12_3", "get_device_sm": "device_sm",
}
