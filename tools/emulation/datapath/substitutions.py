"""Everything the data-path harness substitutes in sglang, and why; nothing else is replaced.

Three things stand between sglang's real HiCache objects and a byte-moving run
on a machine without a CUDA driver:

1. ``sgl_kernel.kvcacheio`` transfer ops. ``pool_host/mla.py`` and ``mha.py``
   import them only on CUDA, so on CPU the names are simply absent from those
   modules. :class:`ReferenceOps` supplies them under the same names and
   keyword signatures, written with torch index ops. They raise
   :class:`RowOutOfBounds` on any row outside the buffer they address (never
   clamp, never wrap: a negative row would wrap in torch indexing, and on a GPU
   the real kernel writes through raw pointers, so an overflow there is silent
   corruption). They also count the bytes they move per source and
   destination pool, which is what ``bench/hicache_traffic.py`` reports.
2. ``cache_controller.device_module`` (and the same name in the hybrid
   controller and ``l2_transfer``): ``torch.cuda`` without a driver cannot make
   streams or events; ``torch.cpu`` has working ``Stream``, ``Event`` and
   ``stream()``. Its ``Stream`` lacks ``synchronize()``, which 0.5.23's
   ``l2_transfer`` calls when a copy raises (so an overflow would surface as an
   AttributeError instead of itself); :data:`CPU_DEVICE_MODULE` is
   ``torch.cpu`` with a ``Stream`` that has it, as a no-op: on CPU every copy
   has already run, in order, on the calling thread. On a GPU the real
   ``torch.cuda`` is used.
3. ``pool_host.common._cuda_host_register`` (cudaHostRegister), which pinned
   host pools call: a no-op on CPU, the real call on a GPU.

``HICACHE_HOST_MEMORY_RESERVE_BYTES`` (10 GiB of RAM that host pools leave
free) is lowered too: the harness's pools are megabytes, and a shared 24 GB
test machine may not have 10 GiB spare. sglang reads it at call time.

One more, only for the forward-read check of the draft (``harness.HiCacheRun``
with ``Case.forward_read``), and only for the duration of that read: the
Triton kernels on the draft attention's read path on 0.5.23
(``create_flashinfer_kv_indices_triton`` in ``KVIndexTranslator.pack_read_stream``,
``update_kv_lens_and_indices`` in ``plan_dcp_decode_metadata``) run in
Triton's interpreter (:func:`triton_interpreted`), the same interpreter
``layouts.py`` gets from ``TRITON_INTERPRET=1`` in its own process. The
kernels' code is sglang's; only where it runs changes.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from collections import Counter
from collections.abc import Iterator

import torch

# The modules that call the transfer ops by their bare names.
OP_MODULES = ("sglang.srt.mem_cache.pool_host.mla", "sglang.srt.mem_cache.pool_host.mha")
# Modules holding a ``device_module = get_device_module()`` that HiCache's streams come from.
DEVICE_MODULE_HOLDERS = (
    "sglang.srt.managers.cache_controller",
    "sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller",
    "sglang.srt.mem_cache.l2_transfer",
)
RESERVE_BYTES = 256 << 20


class _CpuStream(torch.cpu.Stream):
    def synchronize(self) -> None:  # the copies issued "on" it ran synchronously already
        pass

    def query(self) -> bool:
        return True


def _cpu_device_module() -> types.ModuleType:
    module = types.ModuleType("torch.cpu")  # l2_transfer logs device_module.__name__
    module.__dict__.update({k: v for k, v in vars(torch.cpu).items() if not k.startswith("__")})
    module.Stream = _CpuStream
    return module


CPU_DEVICE_MODULE = _cpu_device_module()


class RowOutOfBounds(IndexError):
    """A transfer op was asked for a row its buffer does not have."""

    def __init__(self, pool: str, side: str, row: int, rows: int, op: str) -> None:
        self.pool, self.side, self.row, self.rows, self.op = pool, side, row, rows, op
        super().__init__(f"{op}: {side} row {row} is out of bounds for the {pool} buffer ({rows} rows)")


class ReferenceOps:
    """Reference ``sgl_kernel.kvcacheio`` ops over registered pool buffers, with a byte ledger.

    Buffers are known by the storage they live in (tensor arguments) and by
    their data pointer (the uint64 pointer tables that the all-layer ops take),
    so every pool the harness builds is registered with :meth:`register_pool`
    and a name such as ``draft/host``.
    """

    NAMES = (
        "transfer_kv_per_layer_mla",
        "transfer_kv_per_layer_mla_pf_lf",
        "transfer_kv_all_layer_mla",
        "transfer_kv_all_layer_mla_lf_pf",
        "transfer_kv_direct",
        "transfer_kv_per_layer_direct_pf_lf",
        "transfer_kv_all_layer_direct_lf_pf",
        "transfer_kv_per_layer",
        "transfer_kv_per_layer_pf_lf",
        "transfer_kv_all_layer",
        "transfer_kv_all_layer_lf_pf",
    )

    def __init__(self) -> None:
        self._by_storage: dict[int, str] = {}
        self._by_pointer: dict[int, torch.Tensor] = {}
        self.moved: Counter[tuple[str, str]] = Counter()  # (source pool, destination pool) -> bytes
        self.sabotage: dict[str, object] = {}  # pool name -> callable(rows) used by negative controls
        # Negative controls: destination pool name -> callable(row indices) -> the rows the copy lands at instead.
        self.reroute: dict[str, object] = {}
        # When a list: every copy appends (source pool, destination pool, source rows, destination rows).
        self.log: list[tuple[str, str, list[int], list[int]]] | None = None

    # ---------------------------------------------------------- registry

    def register_pool(self, name: str, pool) -> None:
        """Learn every buffer of a device or host pool (MLA or MHA) under ``name``."""
        tensors: list[torch.Tensor] = []
        for attr in ("kv_buffer", "k_buffer", "v_buffer", "data_refs", "k_data_refs", "v_data_refs"):
            value = getattr(pool, attr, None)
            if isinstance(value, torch.Tensor):
                tensors.append(value)
            elif isinstance(value, (list, tuple)):
                tensors.extend(t for t in value if isinstance(t, torch.Tensor))
        for t in tensors:
            self._by_storage[t.untyped_storage().data_ptr()] = name
        # Pointer tables address per-layer tensors: device buffers and host data_refs.
        per_layer = []
        for attr in ("data_refs", "k_data_refs", "v_data_refs"):
            per_layer.extend(getattr(pool, attr, None) or [])
        for attr in ("kv_buffer", "k_buffer", "v_buffer"):
            value = getattr(pool, attr, None)
            if isinstance(value, (list, tuple)):
                per_layer.extend(value)
        for t in per_layer:
            self._by_pointer.setdefault(t.data_ptr(), t)

    def name_of(self, t: torch.Tensor) -> str:
        name = self._by_storage.get(t.untyped_storage().data_ptr())
        if name is None:
            raise LookupError("a transfer op was handed a buffer of no registered pool")
        return name

    def _layers(self, table) -> list[torch.Tensor]:
        if isinstance(table, (list, tuple)):
            return list(table)
        out = []
        for ptr in table.tolist():
            t = self._by_pointer.get(int(ptr) & ((1 << 64) - 1))
            if t is None:
                raise LookupError(f"a transfer op was handed pointer {int(ptr):#x}, of no registered pool")
            out.append(t)
        return out

    def bytes_between(self, src: str, dst: str) -> int:
        return self.moved[(src, dst)]

    # ---------------------------------------------------------- one copy

    @staticmethod
    def _checked(idx: torch.Tensor, rows: int, pool: str, side: str, op: str) -> torch.Tensor:
        idx = idx.to(torch.int64)
        if idx.numel():
            lo, hi = int(idx.min()), int(idx.max())
            if hi >= rows:
                raise RowOutOfBounds(pool, side, hi, rows, op)
            if lo < 0:
                raise RowOutOfBounds(pool, side, lo, rows, op)
        return idx

    def _copy(self, op, src, src_idx, dst, dst_idx, src_layer=None, dst_layer=None, src_page=0, dst_page=0):
        """dst rows <- src rows; a buffer is addressed as [row, ...], [row, layer, ...] or [page, layer, slot, ...].

        ``*_layer`` selects a layer of a page-first buffer; ``*_page`` > 0 marks a
        page-first-direct buffer whose row r lives at (r // page, layer, r % page).
        """
        src_name, dst_name = self.name_of(src), self.name_of(dst)
        if src_idx.numel() != dst_idx.numel():
            raise ValueError(f"{op}: {src_idx.numel()} source rows for {dst_idx.numel()} destination rows")
        src_rows = src.shape[0] * (src_page or 1)
        dst_rows = dst.shape[0] * (dst_page or 1)
        if dst_name in self.reroute:
            dst_idx = self.reroute[dst_name](dst_idx.to(torch.int64))
        si = self._checked(src_idx, src_rows, src_name, "source", op)
        di = self._checked(dst_idx, dst_rows, dst_name, "destination", op)
        if self.log is not None:
            self.log.append((src_name, dst_name, si.tolist(), di.tolist()))
        if src_page:
            si = si.to(src.device)
            values = src[si // src_page, src_layer, si % src_page]
        elif src_layer is not None:
            values = src[:, src_layer].index_select(0, si.to(src.device))
        else:
            values = src.index_select(0, si.to(src.device))
        values = values.to(dst.device)
        if dst_name in self.sabotage:
            values = self.sabotage[dst_name](values)
        if dst_page:
            di = di.to(dst.device)
            dst[di // dst_page, dst_layer, di % dst_page] = values
        elif dst_layer is not None:
            dst[:, dst_layer].index_copy_(0, di.to(dst.device), values)
        else:
            dst.index_copy_(0, di.to(dst.device), values)
        self.moved[(src_name, dst_name)] += values.numel() * values.element_size()

    # ---------------------------------------------------------- MLA ops

    def transfer_kv_per_layer_mla(self, *, src, dst, src_indices, dst_indices, item_size):
        self._copy("transfer_kv_per_layer_mla", src, src_indices, dst, dst_indices)

    def transfer_kv_per_layer_mla_pf_lf(
        self, *, src, dst, src_indices, dst_indices, layer_id, item_size, src_layout_dim
    ):
        self._copy("transfer_kv_per_layer_mla_pf_lf", src, src_indices, dst, dst_indices, src_layer=layer_id)

    def transfer_kv_all_layer_mla(self, *, src_layers, dst_layers, src_indices, dst_indices, item_size, num_layers):
        for s, d in zip(self._layers(src_layers)[:num_layers], self._layers(dst_layers)[:num_layers], strict=True):
            self._copy("transfer_kv_all_layer_mla", s, src_indices, d, dst_indices)

    def transfer_kv_all_layer_mla_lf_pf(
        self, *, src_layers, dst, src_indices, dst_indices, item_size, dst_layout_dim, num_layers
    ):
        for layer, s in enumerate(self._layers(src_layers)[:num_layers]):
            self._copy("transfer_kv_all_layer_mla_lf_pf", s, src_indices, dst, dst_indices, dst_layer=layer)

    # ---------------------------------------------------------- direct ops (MLA and MHA)

    def transfer_kv_direct(self, *, src_layers, dst_layers, src_indices, dst_indices, page_size):
        src_layers, dst_layers = list(src_layers), list(dst_layers)
        if len(src_layers) != len(dst_layers):
            raise ValueError(f"transfer_kv_direct: {len(src_layers)} source layers for {len(dst_layers)}")
        for s, d in zip(src_layers, dst_layers, strict=True):
            self._copy("transfer_kv_direct", s, src_indices, d, dst_indices)

    def transfer_kv_per_layer_direct_pf_lf(
        self, *, src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id, page_size
    ):
        for s, d in zip(src_ptrs, dst_ptrs, strict=True):  # one page-first-direct buffer per device layer tensor (K, V)
            self._copy(
                "transfer_kv_per_layer_direct_pf_lf", s, src_indices, d, dst_indices,
                src_layer=layer_id, src_page=page_size,
            )

    def transfer_kv_all_layer_direct_lf_pf(self, *, src_ptrs, dst_ptrs, src_indices, dst_indices, page_size):
        src_ptrs, dst_ptrs = list(src_ptrs), list(dst_ptrs)
        layers = len(src_ptrs) // len(dst_ptrs)  # device layers are listed K layers, then V layers
        for j, d in enumerate(dst_ptrs):
            for layer in range(layers):
                self._copy(
                    "transfer_kv_all_layer_direct_lf_pf", src_ptrs[j * layers + layer], src_indices, d,
                    dst_indices, dst_layer=layer, dst_page=page_size,
                )

    # ---------------------------------------------------------- MHA ops

    def transfer_kv_per_layer(self, *, src_k, dst_k, src_v, dst_v, src_indices, dst_indices, item_size):
        self._copy("transfer_kv_per_layer", src_k, src_indices, dst_k, dst_indices)
        self._copy("transfer_kv_per_layer", src_v, src_indices, dst_v, dst_indices)

    def transfer_kv_per_layer_pf_lf(
        self, *, src_k, dst_k, src_v, dst_v, src_indices, dst_indices, layer_id, item_size, src_layout_dim
    ):
        self._copy("transfer_kv_per_layer_pf_lf", src_k, src_indices, dst_k, dst_indices, src_layer=layer_id)
        self._copy("transfer_kv_per_layer_pf_lf", src_v, src_indices, dst_v, dst_indices, src_layer=layer_id)

    def transfer_kv_all_layer(
        self, *, src_k_layers, dst_k_layers, src_v_layers, dst_v_layers, src_indices, dst_indices, item_size,
        num_layers,
    ):
        for table_src, table_dst in ((src_k_layers, dst_k_layers), (src_v_layers, dst_v_layers)):
            for s, d in zip(self._layers(table_src)[:num_layers], self._layers(table_dst)[:num_layers], strict=True):
                self._copy("transfer_kv_all_layer", s, src_indices, d, dst_indices)

    def transfer_kv_all_layer_lf_pf(
        self, *, src_k_layers, dst_k, src_v_layers, dst_v, src_indices, dst_indices, item_size, dst_layout_dim,
        num_layers,
    ):
        for table, dst in ((src_k_layers, dst_k), (src_v_layers, dst_v)):
            for layer, s in enumerate(self._layers(table)[:num_layers]):
                self._copy("transfer_kv_all_layer_lf_pf", s, src_indices, dst, dst_indices, dst_layer=layer)


@contextlib.contextmanager
def triton_interpreted() -> Iterator[None]:
    """Every Triton kernel launched in the block runs in Triton's interpreter, on CPU tensors.

    A ``@triton.jit`` function is a ``JITFunction`` unless ``TRITON_INTERPRET``
    was set when it was decorated (at import). For the block, a launch
    (``kernel[grid](...)``, which calls ``JITFunction.run``) and a call of one
    jit function from another (``JITFunction.__call__``, e.g. ``tl.cdiv``) go to
    an ``InterpretedFunction`` of the same Python function, as they would under
    ``TRITON_INTERPRET=1``. Both are restored on exit.
    """
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    interpreted: dict[int, InterpretedFunction] = {}

    def of(fn: JITFunction) -> InterpretedFunction:
        found = interpreted.get(id(fn))
        if found is None:
            found = interpreted[id(fn)] = InterpretedFunction(fn.fn)
        return found

    def run(self, *args, grid, warmup, **kwargs):
        return of(self).run(*args, grid=grid, warmup=warmup, **kwargs)

    def call(self, *args, **kwargs):
        return of(self)(*args, **kwargs)

    saved = JITFunction.run, JITFunction.__call__
    JITFunction.run, JITFunction.__call__ = run, call
    try:
        yield
    finally:
        JITFunction.run, JITFunction.__call__ = saved


def sgl_kernel_ops() -> object | None:
    """The real ``sgl_kernel.kvcacheio`` on a GPU machine that has it, else None."""
    try:
        return importlib.import_module("sgl_kernel.kvcacheio")
    except Exception:  # not installed, or built for another CUDA/torch
        return None


@contextlib.contextmanager
def substituted(ops: ReferenceOps, *, cuda: bool = False, kernel_ops: object | None = None) -> Iterator[ReferenceOps]:
    """Install the substitutions for the duration of the block; everything is restored on exit.

    ``cuda``: streams, events and pinning are the real CUDA ones and only the
    transfer ops are substituted (by ``kernel_ops`` when given, the real
    sgl_kernel module, else by the reference ops on CUDA tensors).
    """
    from sglang.srt.mem_cache.pool_host import base, common

    saved: list[tuple[object, str, object]] = []
    missing = object()

    def put(module, name: str, value) -> None:
        saved.append((module, name, getattr(module, name, missing)))
        setattr(module, name, value)

    try:
        for module_name in OP_MODULES:
            module = importlib.import_module(module_name)
            for name in ReferenceOps.NAMES:
                source = kernel_ops if kernel_ops is not None and hasattr(kernel_ops, name) else ops
                put(module, name, getattr(source, name))
        device_module = torch.cuda if cuda else CPU_DEVICE_MODULE
        for module_name in DEVICE_MODULE_HOLDERS:
            module = sys.modules.get(module_name)
            if module is None:
                with contextlib.suppress(ImportError):
                    module = importlib.import_module(module_name)
            if module is not None and hasattr(module, "device_module"):
                put(module, "device_module", device_module)
        if not cuda:
            # 0.5.23 added a registration_granularity_bytes argument: accept any.
            put(common, "_cuda_host_register", lambda buffer, *args, **kwargs: None)
            if hasattr(common, "_cuda_host_unregister"):
                put(common, "_cuda_host_unregister", lambda buffer, *args, **kwargs: None)
        put(base, "HICACHE_HOST_MEMORY_RESERVE_BYTES", min(RESERVE_BYTES, base.HICACHE_HOST_MEMORY_RESERVE_BYTES))
        yield ops
    finally:
        for module, name, value in reversed(saved):
            if value is missing:
                delattr(module, name)
            else:
                setattr(module, name, value)
