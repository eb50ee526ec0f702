"""Packed projections: linear layers that read the same input stored as row blocks of one weight tensor.

A batch-1 decode step is a chain of matrix-vector products, each bound by reading its weight once. Reading the
text tower's ``to_q``/``to_k``/``to_v`` (and the SiLU MLP's ``gate_proj``/``up_proj``) as one ``[Σ out, in]``
matrix is one GEMV instead of three (two). On an H200 (docs/benchmark-log.md, full-size bf16): cuBLAS reads each
of Edge's 4 MB ``to_k``/``to_v`` matrices at 0.34 TB/s (a 12 µs launch-and-tail floor), so one token's projections
take 1.81 ms split and 1.14 ms packed (Nano: 4.45 → 3.93 ms); the compiled, graphed decode goes 361 → 511 tokens/s
(Edge) and 169 → 191 (Nano).

``packed_weight(linears)`` returns that matrix as a *view* over the layers' own storage. When their weights are
not yet adjacent rows of one tensor it first moves them there (one new tensor per group, each parameter's
``.data`` re-pointed at its row block), so the model's memory does not grow and every other user of the modules
(prefill, the generation tower, ``state_dict``) keeps reading the same values through the same parameters. A host
that later moves or replaces a parameter (a device move, a LoRA patch) simply breaks the adjacency; the next call
packs again from the current values. Callers should not keep the returned view beyond one generation: it holds the
storage alive.

Packing applies only to plain ``nn.Linear`` layers without bias, on one device, in one floating dtype, whose
forward is ``F.linear(x, weight)``: layers that cast or patch their weight at each call (FP8 storage, a host's
per-call weight hooks or weight streaming) are left alone (``None``) and run module by module.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
from torch import nn

_COMPUTE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)  # not FP8 storage


def host_changes_weights(m: nn.Module) -> bool:
    """Whether a host changes ``m``'s weight or bias at each call: ComfyUI's ``comfy.ops`` layers flag a per-call cast
    or weight streaming with ``comfy_cast_weights`` and per-call patches (on-the-fly LoRA) with ``weight_function`` /
    ``bias_function``."""
    return bool(getattr(m, "comfy_cast_weights", False) or getattr(m, "weight_function", None)
                or getattr(m, "bias_function", None))


def _plain(m: nn.Module) -> bool:
    """An ``nn.Linear`` computing exactly ``F.linear(x, m.weight)``: no bias, no per-call cast or weight hooks."""
    return (isinstance(m, nn.Linear) and m.bias is None and m.weight.dtype in _COMPUTE_DTYPES
            and not host_changes_weights(m))


def _adjacent(weights: Sequence[torch.Tensor]) -> bool:
    first = weights[0]
    storage, offset, width = first.untyped_storage().data_ptr(), first.storage_offset(), first.shape[1]
    for w in weights:
        if (not w.is_contiguous() or w.shape[1] != width or w.untyped_storage().data_ptr() != storage
                or w.storage_offset() != offset):
            return False
        offset += w.numel()
    return True


def packed_weight(linears: Sequence[nn.Module]) -> torch.Tensor | None:
    """``[Σ out_features, in_features]``: the layers' weights as consecutive row blocks of one tensor (a view, no
    copy once packed), or None if they cannot be packed (see the module docstring)."""
    if len(linears) < 2 or not all(_plain(m) for m in linears):
        return None
    weights = [m.weight for m in linears]
    first = weights[0]
    inference = first.is_inference()
    if any(w.dtype != first.dtype or w.device != first.device or w.shape[1] != first.shape[1]
           or w.is_inference() != inference for w in weights):
        return None
    if not _adjacent(weights):
        # the packed tensor is of the weights' own kind whatever mode the caller runs in: inference tensors (a host
        # such as ComfyUI loads models under inference mode) stay inference tensors, normal ones stay normal and
        # writable in place outside inference mode; a parameter's TensorImpl keeps its kind across ``.data =``
        with torch.inference_mode(inference), torch.no_grad():
            packed = torch.cat([w.detach() for w in weights])
            start = 0
            for m in linears:
                n = m.weight.shape[0]
                m.weight.data = packed[start:start + n]
                start += n
    first = linears[0].weight.detach()
    return first.as_strided((sum(m.weight.shape[0] for m in linears), first.shape[1]), (first.shape[1], 1))


class LayerWeights(NamedTuple):
    """A text-tower layer's projections as plain weight tensors for a one-row (batch-1 decode) step, each read by one
    GEMV (gemv.py): ``qkv`` and ``gate_up`` packed (``packed_weight``), ``o``/``up``/``down`` as stored. None where
    the module must run itself (not a plain bias-free ``nn.Linear``, see the module docstring; ``up`` is given only
    for relu² MLPs, ``gate_up`` only for SiLU ones). ``route``: the GEMV route they are read on (gemv.py)."""

    qkv: torch.Tensor | None = None
    gate_up: torch.Tensor | None = None
    o: torch.Tensor | None = None
    up: torch.Tensor | None = None
    down: torch.Tensor | None = None
    route: str = "auto"


def plain_weight(m: nn.Module) -> torch.Tensor | None:
    """``m.weight`` if ``m`` computes exactly ``F.linear(x, m.weight)``, else None."""
    return m.weight if _plain(m) else None
