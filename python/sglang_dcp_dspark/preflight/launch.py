"""A launch as the installed sglang resolves it, on a GPU node that is only described.

preflight runs sglang's own argument resolution on any machine: the handful
of torch.cuda probes resolution asks are answered as the target node would
answer them (:func:`emulated_node`), sglang's log is kept off the terminal
(:func:`quiet_sglang`), and the models are read from their ``config.json``
alone. What the release then resolved is read back by its adapter
(:mod:`releases`) into a :class:`Launch` of plain values, after sglang's own
defaulting and resolution hooks have run; nothing here re-validates what
sglang decides.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from ..core import swap
from ..core.errors import DcpDsparkError
from . import gpus as gpus_mod

GIB = 1024**3
FIX_PREFLIGHT = "sglang-dcp-dspark preflight [options] -- <sglang launch args>"


@dataclass(frozen=True)
class Node:
    """The target machine, as its torch.cuda and sglang platform probes would describe it.

    Its part (:mod:`gpus`) sets the name, the capability and the memory per
    GPU together: :meth:`of_part`.
    """

    gpus: int = 8
    gpu_memory_gib: float = gpus_mod.DEFAULT.memory_gib
    gpu_name: str = gpus_mod.DEFAULT.name
    capability: tuple[int, int] = gpus_mod.DEFAULT.capability
    # 8 x H200 with 2 TiB of host RAM is a DGX H200. The default describes the
    # emulated node, like the GPU defaults: the machine preflight runs on is
    # usually not the one the launch is for. None: this machine's available RAM.
    host_ram_gib: float | None = 2048.0
    host_ram_from: str = "the emulated node's default"

    @classmethod
    def of_part(cls, gpu_name: str | None = None, *, gpu_memory_gib: float | None = None, **fields) -> Node:
        """The node of the part ``gpu_name`` names (the default part when None); its datasheet memory unless given."""
        part = gpus_mod.part(gpu_name) if gpu_name is not None else gpus_mod.DEFAULT
        name = gpu_name.strip() if gpu_name is not None else part.name
        memory = part.memory_gib if gpu_memory_gib is None else gpu_memory_gib
        return cls(gpu_name=name, capability=part.capability, gpu_memory_gib=memory, **fields)

    @property
    def architecture(self) -> str:
        return gpus_mod.ARCHITECTURES.get(self.capability[0], f"SM{self.capability[0]}{self.capability[1]}")


@dataclass(frozen=True)
class Launch:
    """The fields of a resolved launch that its host pools depend on, as sglang resolved them."""

    model_path: str
    draft_model_path: str | None
    tp_size: int
    pp_size: int
    nnodes: int
    dcp_size: int
    page_size: int
    enable_hierarchical_cache: bool
    # None where the release resolves it while building the pools: a decode
    # server's ratio (against its retraction backup) or an auto-sized one.
    hicache_ratio: float | None
    hicache_size: float
    hicache_mem_layout: str
    hicache_io_backend: str | None
    hicache_host_memory_mode: str | None  # 0.5.19 on
    hicache_host_memory_fraction: float | None  # 0.5.21 on: auto-sizing, unless a ratio or size was given
    hicache_storage_backend: str | None
    speculative_algorithm: str | None
    disaggregation_mode: str | None
    mem_fraction_static: float | None
    kv_cache_dtype: str
    hicache_draft_backup: str | None = None  # patches/upstream-next 0005 only
    # The target's (prefill, decode) attention backends as the release resolved them on the emulated node:
    # the launch's flags, else the release's default for that architecture and model (model hooks included).
    attention_backends: tuple = (None, None)
    speculative_draft_attention_backend: str | None = None
    # sglang's own resolved record, for the builders that take it (a decode server's model config).
    record: object = field(default=None, compare=False, repr=False)

    def fields(self) -> dict:
        return {k: v for k, v in vars(self).items() if k != "record"}

    @property
    def logical_page_size(self) -> int:
        return self.page_size * self.dcp_size


def dcp_size(value) -> int:
    """``--dcp-size`` as sglang parsed or resolved it, the one reading of it: 1 where it is unset, else its value
    (0 and below stay what they are, for sglang's refusal and preflight's range check to see)."""
    return 1 if value is None else int(value)


@dataclass
class Resolution:
    """sglang's verdict on the launch: the resolved launch, or its own refusal."""

    passed: bool
    message: str | None = None  # "Type: text", as the report shows it
    launch: Launch | None = None
    warnings: list[str] = field(default_factory=list)
    text: str = ""  # the refusal's own words, without its exception type


def default_node_answers(node: Node) -> dict:
    props = SimpleNamespace(
        name=node.gpu_name, total_memory=int(node.gpu_memory_gib * GIB), major=node.capability[0],
        minor=node.capability[1], multi_processor_count=132,
    )
    total = int(node.gpu_memory_gib * GIB)
    return {
        "is_available": True,
        "device_count": node.gpus,
        "get_device_capability": node.capability,
        "get_device_properties": props,
        "get_device_name": node.gpu_name,
        "mem_get_info": (total, total),
    }


# The node whose facts sglang's probes answer while preflight resolves or sizes (innermost last); empty: the
# probes are this machine's own.
_ACTIVE: list[Node] = []


class _Probe:
    """One of sglang's platform probe functions, answering for the emulated node while one is active.

    It replaces the function in every sglang module that holds it, once: a
    module imported while a node is emulated binds this object, and after the
    block it answers as the original does, so nothing is left answering for a
    node that is gone.
    """

    def __init__(self, fact: str, original) -> None:
        self.fact, self.original = fact, original
        self.__wrapped__ = original
        self.__name__ = getattr(original, "__name__", fact)

    def __call__(self, *args, **kwargs):
        if _ACTIVE:
            return getattr(gpus_mod.facts(_ACTIVE[-1].capability), self.fact)
        return self.original(*args, **kwargs)

    def cache_clear(self) -> None:  # the originals are lru_cache-d; sglang's tests clear them
        getattr(self.original, "cache_clear", lambda: None)()


def _install_probes() -> None:
    """Put a :class:`_Probe` in place of each platform probe function in the sglang modules loaded now."""
    import sys

    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "sglang" or module_name.startswith("sglang.")):
            continue
        space = getattr(module, "__dict__", {})
        for name, fact in gpus_mod.PROBE_FUNCTIONS.items():
            value = space.get(name)
            if value is not None and callable(value) and not isinstance(value, _Probe):
                space[name] = _Probe(fact, value)


def _platform_object(node: Node):
    """sglang's platform object (0.5.19 on: ``runtime_context.get_platform()``), overridden through its own
    ``override_platform`` with the node's facts, the device kind included: its readers are resolution checks (the
    DCP comm backend's ``is_cuda``), not the import-time kernel choices the probe functions make."""
    try:
        from sglang.srt import runtime_context
    except ImportError:
        return contextlib.nullcontext()
    override = getattr(runtime_context, "override_platform", None)
    known = getattr(runtime_context, "_PLATFORM_PROBES", None)
    if override is None or known is None:
        return contextlib.nullcontext()
    names = set(known) | set(getattr(runtime_context, "_PLATFORM_VALUES", {}))
    facts = gpus_mod.facts(node.capability).as_dict() | {"has_flashinfer": True}
    return override(**{name: value for name, value in facts.items() if name in names})


@contextlib.contextmanager
def emulated_node(node: Node) -> Iterator[None]:
    """Answer the runtime probes as ``node`` would, only while resolving: torch.cuda's, the CUDA runtime version,
    and sglang's own platform probes (``get_platform()`` reads the probe functions, so it answers too)."""
    import torch

    _install_probes()
    with contextlib.ExitStack() as stack:
        for name, value in default_node_answers(node).items():
            stack.enter_context(swap.attribute(torch.cuda, name, swap.returning(value)))
        stack.enter_context(swap.attribute(torch.version, "cuda", gpus_mod.CUDA_VERSION))
        stack.enter_context(_platform_object(node))
        _ACTIVE.append(node)
        stack.callback(_ACTIVE.pop)
        yield


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage().splitlines()[0])


@contextlib.contextmanager
def quiet_sglang() -> Iterator[_Collect]:
    """sglang logs a lot while resolving and building pools; keep its warnings for the report, off the terminal."""
    root = logging.getLogger()
    collect = _Collect()
    saved = root.handlers[:], root.level
    root.handlers[:] = [collect]
    root.setLevel(logging.WARNING)
    try:
        # prepare_server_args forces its own root handler; this call is not a server.
        with swap.attribute(logging, "basicConfig", lambda **kwargs: None):
            yield collect
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)


@contextlib.contextmanager
def about_this_machine_quiet() -> Iterator[None]:
    """Keep import-time notes about this machine's missing CUDA off the terminal.

    sglang's kernel and quantization modules warn that their CUDA paths are
    off (AWQ, GGUF, Triton), and torch's extension loader logs that it found
    no CUDA runtime. That describes the machine preflight runs on, not the
    emulated node; only these, and only while sglang's modules import.
    """
    torch_ext = logging.getLogger("torch.utils.cpp_extension")
    level = torch_ext.level
    torch_ext.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning, module=r"sglang(\.|$)")
            yield
    finally:
        torch_ext.setLevel(level)


def _uncompiled(model=None, **options):
    """``torch.compile`` as preflight needs it: the function itself, for ``@torch.compile`` and
    ``@torch.compile(...)`` alike."""
    return model if model is not None else (lambda fn: fn)


def kernels_uncompiled(fn):
    """Run ``fn`` with ``torch.compile`` returning the function it is given.

    sglang's quantization, MoE and scheduling modules compile kernels with
    ``@torch.compile`` as they import, and the first such call imports all of
    dynamo and inductor (two seconds here, most of what preflight cost on top
    of sglang's own import). preflight runs none of those kernels: it reads
    configs, resolves arguments and builds pools, whose code calls none of
    them. Only for the duration of the call.
    """
    @functools.wraps(fn)
    def uncompiled(*args, **kwargs):
        import torch

        with swap.attribute(torch, "compile", _uncompiled):
            return fn(*args, **kwargs)

    return uncompiled


def import_sglang() -> None:
    with about_this_machine_quiet():
        # Before any probe is patched: these modules decide at import time whether
        # CUDA kernels exist, and must decide "no" on a machine without them.
        import sglang.srt.configs.model_config
        import sglang.srt.layers.quantization
        import sglang.srt.server_args  # noqa: F401


def option(argv: list[str], name: str) -> str | None:
    """The value of ``name`` in raw launch arguments (only to find the model directories to read)."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def replace_option(argv: list[str], name: str, value: str) -> list[str]:
    """``argv`` with ``name`` set to ``value`` (added when absent): one value of a sweep."""
    out, i, found = [], 0, False
    while i < len(argv):
        arg = argv[i]
        if arg == name and i + 1 < len(argv):
            out += [name, value]
            i, found = i + 2, True
            continue
        if arg.startswith(name + "="):
            out.append(f"{name}={value}")
            i, found = i + 1, True
            continue
        out.append(arg)
        i += 1
    return out if found else [*out, name, value]


def read_config(path: str | None, flag: str) -> dict:
    """A model's config.json, checked to be a readable JSON object; its fields are sglang's to read (:mod:`models`)."""
    if path is None:
        raise DcpDsparkError(f"no {flag} in the launch arguments; expected a local model directory; fix: sglang-dcp-dspark preflight -- {flag} DIR ...")
    config = Path(path) / "config.json"
    fetch = f"fix: download it again (huggingface-cli download MODEL config.json --local-dir {path}) and pass {flag} DIR"
    if config.is_dir():
        raise DcpDsparkError(f"{config} is a directory, not a file; expected the model's config.json; {fetch}")
    if config.is_symlink() and not config.exists():
        raise DcpDsparkError(f"{config} is a symbolic link that leads nowhere (dangling, or a loop); expected the "
                             f"model's config.json; {fetch}")
    if not config.is_file():
        raise DcpDsparkError(f"{flag} {path} has no config.json; preflight reads only the model's config.json, expected DIR/config.json; fix: download it (huggingface-cli download MODEL config.json --local-dir DIR) and pass {flag} DIR")
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except RecursionError:
        raise DcpDsparkError(f"{config} is nested deeper than a JSON reader can follow; expected a Hugging Face "
                             f"config.json (a few levels deep); {fetch}") from None
    except (ValueError, OSError) as exc:  # UnicodeDecodeError is a ValueError
        reason = " ".join(str(exc).split())
        raise DcpDsparkError(f"{config} is not readable JSON ({reason}); expected a Hugging Face config.json; fix: download it again (huggingface-cli download MODEL config.json --local-dir {path})") from None
    if not isinstance(data, dict):
        raise DcpDsparkError(f"{config} holds a JSON {type(data).__name__}, not an object; expected a Hugging Face config.json; fix: download it again (huggingface-cli download MODEL config.json --local-dir {path})")
    return data


def served_architectures() -> frozenset[str]:
    """The model classes the installed sglang serves: every ``EntryClass`` of ``sglang/srt/models``, read as text.

    Read rather than imported: sglang's ModelRegistry imports every model
    module to find them, which pulls in kernels a CPU machine does not have.
    """
    import re

    import sglang.srt.models as models

    names: set[str] = set()
    for path in Path(models.__path__[0]).glob("*.py"):
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in re.finditer(r"^EntryClass\s*=\s*(\[[^\]]*\]|[\w.]+)", text, re.M):
            names.update(re.findall(r"\b([A-Z]\w+)\b", m.group(1)))
    return frozenset(names)


def check_architecture(config: dict, path: str, flag: str, release: str) -> None:
    """A config whose architecture the release does not serve is bad input: sglang would fail at model load."""
    archs = config.get("architectures") or []
    if not archs or not isinstance(archs, list) or not isinstance(archs[0], str):
        raise DcpDsparkError(f"{path}/config.json has no architectures list; expected e.g. \"architectures\": [\"DeepseekV3ForCausalLM\"]; fix: download the model's own config.json (huggingface-cli download MODEL config.json --local-dir {path})")
    if archs[0] not in served_architectures():
        raise DcpDsparkError(f"{path}/config.json names architecture {archs[0]}, which sglang {release} does not serve (no EntryClass in sglang/srt/models), so its launch would fail at model load; expected a model class of this release; fix: pass {flag} a model sglang {release} supports, or install a release that serves {archs[0]}")


def config_load_failure(exc: BaseException, paths: dict[str, str], release: str) -> DcpDsparkError | None:
    """The one-line bad-input error when sglang could not load a model's config, else None.

    Decided by where the exception came from (transformers' config loading,
    under sglang's ``get_config``), not by its wording, which transformers
    changes between releases.
    """
    frames = [(f.filename.replace("\\", "/"), f.name) for f in traceback.extract_tb(exc.__traceback__)]
    loading = any("/transformers/" in name and ("configuration" in name or "dynamic_module" in name or "hub" in name)
                  for name, _ in frames) or any(fn == "get_config" and "/sglang/" in name for name, fn in frames)
    # transformers 5 checks each config field's type through huggingface_hub's strict dataclasses.
    strict = type(exc).__name__.startswith("StrictDataclass")
    if not loading or not (strict or isinstance(exc, (ValueError, OSError, KeyError, ImportError))):
        return None
    text = " ".join(str(exc).split())
    path = next((p for p in paths.values() if p and p in text), next(iter(paths.values())))
    flag = next((f for f, p in paths.items() if p == path), "--model-path")
    if "trust_remote_code" in text or "custom code" in text:
        why = "needs the model's own Python code to load (its auto_map), which preflight does not run"
        fix = f"download the model's configuration_*.py beside {path}/config.json and pass --trust-remote-code, or preflight a model whose model_type transformers knows"
    elif "does not appear to have a file named" in text:
        missing = text.split("file named", 1)[1].split(".")[0].strip() + ".py" if "file named" in text else "its code"
        why = f"loads with --trust-remote-code only with {missing} beside it"
        fix = f"download {missing} into {path} (huggingface-cli download MODEL {missing} --local-dir {path})"
    elif "does not recognize this architecture" in text or "model type" in text:
        model_type = text.split("model type", 1)[1].split()[0].strip("`'\"") if "model type" in text else "?"
        why = f"has model_type {model_type}, which the installed transformers does not know"
        fix = "upgrade transformers to a release that knows it, or pass the model's own config.json"
    elif strict:
        why = f"has a field of the wrong type ({text[:200]})"
        fix = f"correct that field in {path}/config.json, or download the model's own config.json again (huggingface-cli download MODEL config.json --local-dir {path})"
    else:
        why = f"cannot be loaded ({type(exc).__name__}: {text[:200]})"
        fix = f"download the model's own config.json again (huggingface-cli download MODEL config.json --local-dir {path})"
    return DcpDsparkError(f"{path}/config.json {why}; sglang {release} loads every model's config through transformers before it resolves a launch; fix: {fix} ({flag} {path})")


# The probes that answer for the machine preflight runs on even while a node is emulated: the device-kind functions
# (utils.is_cuda and kin: sglang imports its CUDA kernels where they say CUDA, so they keep this machine's answer),
# the flags modules compute from them at import (``_is_cuda``), and ``platforms.current_platform``, chosen at import.
# A refusal that comes from one is not sglang's verdict on the GPU node. The architecture probes (``is_sm100``,
# ``get_platform().is_blackwell`` ...) answer for the node (emulated_node), so a refusal they lead to is its verdict.
_PLATFORM_PROBE = re.compile(r"\b(?:is_cuda|is_cuda_alike|is_hip|is_musa|is_npu|is_xpu|_platform_supports\w*)\s*\("
                             r"|\b_is_(?:cuda|cuda_alike|hip|musa|npu|xpu)\b|\bcurrent_platform\b")


def guard_line(filename: str, lineno: int, reach: int = 20) -> int:
    """The first line of the ``if`` / ``elif`` that guards the statement at ``lineno`` (the condition that leads to
    a ``raise``), or ``lineno`` when the statement is not inside one within ``reach`` lines."""
    import linecache

    line = linecache.getline(filename, lineno)
    indent = len(line) - len(line.lstrip())
    for n in range(lineno - 1, max(0, lineno - reach), -1):
        text = linecache.getline(filename, n)
        if not text.strip() or len(text) - len(text.lstrip()) >= indent:
            continue
        if text.lstrip().startswith(")"):  # the close of a condition over several lines: its ``if`` is above
            indent = len(text) - len(text.lstrip()) + 1
            continue
        return n if text.lstrip().startswith(("if ", "elif ", "if(")) else lineno
    return lineno


def platform_refusal(exc: BaseException, node: Node, release: str) -> DcpDsparkError | None:
    """The one-line exit-2 error when sglang refused because of this machine's platform, else None.

    Decided by the statement that raised and the condition that leads to it:
    the innermost sglang frame's source (the whole statement, an ``assert``
    over several lines included, and the ``if`` that guards a ``raise``) names
    one of the probes that answer for this machine.
    """
    import linecache

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/sglang/" in f.filename.replace("\\", "/")]
    if not frames:
        return None
    last = frames[-1]
    end = getattr(last, "end_lineno", None) or last.lineno
    statement = " ".join(linecache.getline(last.filename, n).strip() for n in range(guard_line(last.filename, last.lineno),
                                                                                   end + 1))
    probe = _PLATFORM_PROBE.search(statement)
    if probe is None:
        return None
    text = " ".join(str(exc).split()) or type(exc).__name__
    where = f"{last.filename.replace(chr(92), '/').split('/sglang/', 1)[-1]}:{last.lineno}"
    asked = probe.group(0).rstrip("( ")
    return DcpDsparkError(
        f"sglang {release} refuses this launch for a reason of the machine preflight runs on, not of the emulated "
        f"{node.gpus} x {node.gpu_name} node: \"{text}\" (sglang/{where} asks {asked}, which answers for this CPU "
        "machine); preflight cannot reach sglang's verdict on CPU; fix: run `sglang-dcp-dspark preflight` on a machine "
        "of the node's platform, or change the option that check is about"
    )
