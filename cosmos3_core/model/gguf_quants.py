"""GGML block quantization (the weight types of a GGUF file) dequantized in PyTorch, and the linear layer that keeps
its weight quantized and dequantizes it at each call.

The block layouts are ggml's (``ggml-common.h`` ``block_q8_0`` … ``block_q6_K``), as the ``gguf`` package's
``gguf/quants.py`` decodes them in NumPy; ``dequantize`` computes each type with the same float32 operations in the
same order, so its result equals ``gguf.quants.dequantize`` bit for bit (tests/test_gguf.py), on any device.
A tensor of ``n`` values is ``n / block`` blocks of ``type_size`` bytes; ``d``/``dmin`` are little-endian fp16:

* ``Q8_0`` (32 values, 34 bytes): ``d``, 32 × int8 ``q`` — ``d · q``.
* ``Q4_0`` (32, 18): ``d``, 16 bytes of nibbles (values 0–15 low nibbles, 16–31 high) — ``d · (q − 8)``.
* ``Q4_1`` (32, 20): ``d``, ``m``, 16 bytes of nibbles — ``d · q + m``.
* ``Q5_0`` (32, 22): ``d``, 4 bytes ``qh`` (bit ``j``: the fifth bit of value ``j``), 16 bytes of nibbles —
  ``d · (q − 16)``.
* ``Q5_1`` (32, 24): ``d``, ``m``, ``qh``, nibbles — ``d · q + m``.
* ``Q4_K`` (256, 144): ``d``, ``dmin``, 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32, 128 bytes of
  nibbles — ``d·sc · q − dmin·m``.
* ``Q5_K`` (256, 176): ``d``, ``dmin``, the 12 scale bytes, 32 bytes ``qh``, 128 bytes of nibbles — as Q4_K with a
  fifth bit.
* ``Q6_K`` (256, 210): 128 bytes low nibbles, 64 bytes of 2-bit highs, 16 × int8 scales, ``d`` —
  ``d·sc · (q − 32)``.
* ``F32``, ``F16``, ``BF16``: plain values.

``GgufLinear`` is the model's linear layer for a weight read quantized from a GGUF file (``model/loader.py``): the
weight stays ``uint8`` ``[out, in / block · type_size]`` in memory (a quarter to a half of bf16) and each call
dequantizes it in float32, adds the LoRA patches given to it (``add_patch``: ``strength · s · ΔW``, computed from
the patch's factors at each call, never stored dense), rounds once to the input's dtype and runs ``F.linear``.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import nn

QK_K = 256


class QuantType(NamedTuple):
    """One GGML type: its id in a GGUF file, values per block and bytes per block."""

    name: str
    id: int
    block: int
    type_size: int


TYPES = {t.id: t for t in (
    QuantType("F32", 0, 1, 4), QuantType("F16", 1, 1, 2), QuantType("BF16", 30, 1, 2),
    QuantType("Q4_0", 2, 32, 18), QuantType("Q4_1", 3, 32, 20), QuantType("Q5_0", 6, 32, 22),
    QuantType("Q5_1", 7, 32, 24), QuantType("Q8_0", 8, 32, 34),
    QuantType("Q4_K", 12, QK_K, 144), QuantType("Q5_K", 13, QK_K, 176), QuantType("Q6_K", 14, QK_K, 210),
)}
BY_NAME = {t.name: t for t in TYPES.values()}
PLAIN = ("F32", "F16", "BF16")
QUANTIZED = tuple(name for name in BY_NAME if name not in PLAIN)


def _half(b: torch.Tensor) -> torch.Tensor:
    """Little-endian fp16 from a ``[n, 2]`` byte column, as float32 ``[n, 1]``."""
    return b.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor, width: int) -> torch.Tensor:
    """Low then high nibbles of each run of ``width`` bytes: ``[n, k·width]`` → ``[n, k, 2, width]`` (uint8)."""
    n = qs.shape[0]
    shifts = torch.tensor([0, 4], dtype=torch.uint8, device=qs.device).view(1, 1, 2, 1)
    return (qs.reshape(n, -1, 1, width) >> shifts) & 0x0F


def _high_bits(qh: torch.Tensor) -> torch.Tensor:
    """The 32 bits of a little-endian uint32 per block (``[n, 4]`` bytes) as ``[n, 32]`` uint8 0/1: bit ``j`` is bit
    ``j % 8`` of byte ``j // 8`` (worked in bytes: no wider integer per value)."""
    shifts = torch.arange(8, dtype=torch.uint8, device=qh.device)
    return ((qh.unsqueeze(2) >> shifts) & 1).reshape(qh.shape[0], 32)


def _q8_0(b):
    return b[:, 2:].contiguous().view(torch.int8).float().mul_(_half(b[:, :2]))


def _q4_0(b):
    q = _nibbles(b[:, 2:], 16).reshape(b.shape[0], -1).to(torch.int8) - 8
    return q.float().mul_(_half(b[:, :2]))


def _q4_1(b):
    q = _nibbles(b[:, 4:], 16).reshape(b.shape[0], -1).float()
    return q.mul_(_half(b[:, :2])).add_(_half(b[:, 2:4]))


def _q5(b, offset: int):
    low = _nibbles(b[:, offset + 4:], 16).reshape(b.shape[0], -1)
    return low | (_high_bits(b[:, offset:offset + 4]) << 4)


def _q5_0(b):
    return (_q5(b, 2).to(torch.int8) - 16).float().mul_(_half(b[:, :2]))


def _q5_1(b):
    return _q5(b, 4).float().mul_(_half(b[:, :2])).add_(_half(b[:, 2:4]))


def _scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 six-bit scales and mins of a K-quant block from its 12 bytes."""
    n = scales.shape[0]
    d, m, m_d = scales.reshape(n, 3, 4).split(1, dim=1)
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mins = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc.reshape(n, 8), mins.reshape(n, 8)


def _k_scales(b):
    n = b.shape[0]
    sc, mins = _scale_min(b[:, 4:16])
    d = (_half(b[:, :2]) * sc.float()).reshape(n, -1, 1)
    dm = (_half(b[:, 2:4]) * mins.float()).reshape(n, -1, 1)
    return d, dm


def _q4_k(b):
    n = b.shape[0]
    d, dm = _k_scales(b)
    q = _nibbles(b[:, 16:], 32).reshape(n, -1, 32).float()
    return q.mul_(d).sub_(dm).reshape(n, QK_K)


def _q5_k(b):
    n = b.shape[0]
    d, dm = _k_scales(b)
    low = _nibbles(b[:, 48:], 32).reshape(n, -1, 32)
    bits = torch.arange(8, dtype=torch.uint8, device=b.device).view(1, 1, 8, 1)
    high = ((b[:, 16:48].reshape(n, -1, 1, 32) >> bits) & 1).reshape(n, -1, 32)
    return (low | (high << 4)).float().mul_(d).sub_(dm).reshape(n, QK_K)


def _q6_k(b):
    n = b.shape[0]
    scales = b[:, 192:208].contiguous().view(torch.int8).float()
    d = (_half(b[:, 208:210]) * scales).reshape(n, QK_K // 16, 1)
    low = _nibbles(b[:, :128], 64).reshape(n, -1, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device).view(1, 1, 4, 1)
    high = ((b[:, 128:192].reshape(n, -1, 1, 32) >> shifts) & 0x03).reshape(n, -1, 32)
    q = ((low | (high << 4)).to(torch.int8) - 32).reshape(n, QK_K // 16, -1).float()
    return q.mul_(d).reshape(n, QK_K)


_BLOCKS = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1,
           "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}


def dequantize(data: torch.Tensor, qtype: QuantType, shape: tuple[int, ...]) -> torch.Tensor:
    """float32 ``shape`` from ``data``, the tensor's bytes (``uint8``, any shape) in GGML type ``qtype``."""
    raw = data.reshape(-1)
    if qtype.name == "F32":
        return raw.view(torch.float32).reshape(shape)
    if qtype.name == "F16":
        return raw.view(torch.float16).float().reshape(shape)
    if qtype.name == "BF16":
        return raw.view(torch.bfloat16).float().reshape(shape)
    return _BLOCKS[qtype.name](raw.reshape(-1, qtype.type_size)).reshape(shape)


def packed_shape(shape: tuple[int, ...], qtype: QuantType) -> tuple[int, ...]:
    """The ``uint8`` shape a tensor of ``shape`` takes in type ``qtype`` (rows of whole blocks)."""
    return (*shape[:-1], shape[-1] // qtype.block * qtype.type_size)


class GgufLinear(nn.Linear):
    """A linear layer whose weight may be GGML-quantized (``quantize_as``: set before the weights are assigned);
    a plain weight computes as ``nn.Linear``. See the module docstring."""

    qtype: QuantType | None = None

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.patches: list = []

    def quantize_as(self, qtype: QuantType) -> None:
        """Make ``weight`` an empty ``uint8`` tensor of ``qtype``'s packed shape (on the weight's device: ``meta``
        while the model is built), for the loader to assign the file's bytes to."""
        self.qtype = qtype
        shape = packed_shape((self.out_features, self.in_features), qtype)
        self.weight = nn.Parameter(torch.empty(shape, dtype=torch.uint8, device=self.weight.device),
                                   requires_grad=False)

    def add_patch(self, patch, strength: float) -> None:
        """Add ``strength · patch.delta()`` (``model.lora.LoraPatch``) to the weight at every call."""
        self.patches.append((patch, float(strength)))

    def dense_weight(self, weight: torch.Tensor | None = None) -> torch.Tensor:
        """The float32 weight (``weight``: these bytes instead of ``self.weight``, e.g. streamed to the device),
        LoRA patches added."""
        weight = self.weight if weight is None else weight
        if self.qtype is None:  # a copy where patches are added in place: never the stored weight itself
            dense = weight.to(torch.float32, copy=bool(self.patches))
        else:
            dense = dequantize(weight, self.qtype, (self.out_features, self.in_features))
        for patch, strength in self.patches:  # one delta at a time, scaled and added in place
            dense.add_(patch.delta(device=dense.device).mul_(strength))
        return dense

    def call_workspace_bytes(self, dtype: torch.dtype) -> int:
        """The most memory a call adds beyond the stored bytes, input and output (``weights.linear_call_workspace``):
        per value the float32 weight, at most 2 bytes more while the blocks unpack (the unpacking works in bytes and
        in place: tests/test_linear_workspace.py measures each type) or 4 while a LoRA delta is added, and the
        weight's copy in ``dtype``."""
        if self.qtype is None and not self.patches:
            return 0
        extra = 4 if self.patches else 2
        return (4 + extra + torch.empty((), dtype=dtype).element_size()) * self.in_features * self.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.qtype is None and not self.patches:
            return super().forward(x)
        return self.forward_with(x, self.weight, self.bias)

    def forward_with(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     weight_functions: Sequence[Callable[[torch.Tensor], torch.Tensor]] = ()) -> torch.Tensor:
        """The layer on ``x`` with ``weight``/``bias`` (this layer's, or copies a host streamed to ``x``'s device),
        each of ``weight_functions`` (a host's weight patches) applied to the float32 weight in turn."""
        dense = self.dense_weight(weight)
        if weight_functions and dense.data_ptr() == weight.data_ptr():
            dense = dense.clone()  # a plain float32 weight is its own dense weight: host patches must not touch it
        for fn in weight_functions:
            dense = fn(dense)
        return F.linear(x, dense.to(x.dtype), None if bias is None else bias.to(x.dtype))
