"""Tensor parallelism: both towers' decoder-layer linears sharded Megatron-style over the mesh's ``tp`` dimension,
built with ``torch.distributed.tensor`` (DTensor ``parallelize_module``, ``ColwiseParallel``/``RowwiseParallel``).

The scheme is Megatron-LM's (Shoeybi et al. 2019), as torchtitan and vLLM apply it to Llama/Qwen blocks and the
seed engine (PhyAI's Cosmos3 guide, ``--tp N``) to Cosmos3: in every decoder layer of both towers

* ``to_q/to_k/to_v``, ``add_q_proj/add_k_proj/add_v_proj`` and the MLPs' ``gate_proj``/``up_proj`` are
  **column-parallel** (``ColwiseParallel``: weight ``Shard(0)``, the output features — attention heads, MLP
  channels — split across ranks; no communication);
* ``to_out``, ``to_add_out`` and the MLPs' ``down_proj`` are **row-parallel** (``RowwiseParallel``: weight
  ``Shard(1)``; each rank's partial sums are added by one all-reduce);

so a layer costs two all-reduces of its ``[tokens, D]`` output per tower pass, and attention runs per rank on its
own heads with no exchange (the generation tower's attention reads the text K/V of those heads only, so each rank's
prefill keeps just its heads: the text K/V is sharded like the weights). ``embed_tokens`` is vocabulary-parallel
(``RowwiseParallel`` of an ``nn.Embedding``: rows ``Shard(0)``, one all-reduce per prompt). Everything else — the
norms, the per-head q/k norms, ``proj_in/proj_out``, the time embedder, the sound and action heads — is replicated
(Nano: 0.3 % of the parameters).

Heads: rank ``t`` of ``T`` owns query heads ``[t·H/T, (t+1)·H/T)``. When ``T`` divides the key/value heads it owns
``KV/T`` of them; when ``T`` is a multiple of ``KV`` (the tiny Super-shaped checkpoint's one KV head at any ``T``,
Nano's 8 at ``T = 16``) the key/value projections are treated as the checkpoint's weight with every head repeated
``T/KV`` times — what grouped-query attention reads anyway — so ``Shard(0)`` hands rank ``t`` KV head
``t // (T/KV)``, the one its query heads read. ``check_tp`` refuses every other degree.

Weights load sharded (model/loader.py's ``sharding=``): the model is built on ``meta``, ``TensorParallel.shard``
parallelizes it there (placements only, no storage), and each rank reads only its slice of every sharded tensor
from the safetensors files (``get_slice``; ``source`` maps a parameter's local shard to checkpoint rows/columns). A
ModelOpt FP8 checkpoint's tensorwise scales (``scale_weight``) are replicated. LoRA merges into the shards
(model/lora.py computes each rank's slice of the weight change).

A failed all-reduce (a rank died, or timed out) raises one ``ParallelError`` naming the exchange (``mesh.guarded``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from ..config import Cosmos3Config
from .mesh import check_tp, guarded

COLWISE = ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "gate_proj", "up_proj")
ROWWISE = ("to_out", "to_add_out", "down_proj")
KV_PROJECTIONS = ("to_k", "to_v", "add_k_proj", "add_v_proj")
VOCAB_PARALLEL = ("embed_tokens",)


def style_of(module_name: str) -> str | None:
    """How the module ``module_name`` (a ``Cosmos3Transformer`` module path) is split: ``"colwise"``,
    ``"rowwise"``, ``"vocab"`` or None (replicated)."""
    if module_name in VOCAB_PARALLEL:
        return "vocab"
    parts = module_name.split(".")
    if len(parts) < 4 or parts[0] != "layers" or parts[2] not in ("self_attn", "mlp", "mlp_moe_gen"):
        return None
    return "colwise" if parts[-1] in COLWISE else "rowwise" if parts[-1] in ROWWISE else None


def _distribute(module: nn.Module, mesh: DeviceMesh, placements: dict[str, object]) -> None:
    """Every direct parameter of ``module`` as a DTensor on ``mesh``: ``placements[name]``, else replicated (a
    ModelOpt ``scale_weight``). Each rank keeps its own shard (``src_data_rank=None``: no exchange; on ``meta``
    this only records the layout)."""
    for name, param in list(module.named_parameters(recurse=False)):
        placement = placements.get(name, Replicate())
        shard = distribute_tensor(param, mesh, [placement], src_data_rank=None)
        module.register_parameter(name, nn.Parameter(shard, requires_grad=False))


def _finish_all_reduce(outputs, done):
    """Wait for a row-parallel all-reduce inside ``guarded`` (eager), so a dead peer is reported here, once."""
    with guarded("tensor-parallel all-reduce"):
        out = done(outputs)
        wait = getattr(out, "wait", None)
        return wait() if callable(wait) and not torch.compiler.is_compiling() else out


class _Colwise(ColwiseParallel):
    """``ColwiseParallel`` whose non-weight parameters (an FP8 layer's scalar ``scale_weight``) are replicated."""

    def _partition_linear_fn(self, name, module, device_mesh):
        _distribute(module, device_mesh, {"weight": Shard(0), "bias": Shard(0)})


class _Rowwise(RowwiseParallel):
    """``RowwiseParallel`` (bias and scalars replicated) whose all-reduce fails as one ``ParallelError``."""

    def _partition_linear_fn(self, name, module, device_mesh):
        _distribute(module, device_mesh, {"weight": Shard(1)})

    def _partition_embedding_fn(self, name, module, device_mesh):
        _distribute(module, device_mesh, {"weight": Shard(0)})

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        done = lambda o: RowwiseParallel._prepare_output_fn(output_layouts, use_local_output, mod, o,  # noqa: E731
                                                            device_mesh)
        return _finish_all_reduce(outputs, done)


def tp_plan(model: nn.Module) -> dict[str, object]:
    """``parallelize_module``'s plan for ``model``: module path → parallel style, for the modules it has."""
    styles = {"colwise": _Colwise, "rowwise": _Rowwise, "vocab": lambda: _Rowwise(input_layouts=Replicate())}
    return {name: styles[style]() for name, _ in model.named_modules() if (style := style_of(name)) is not None}


@dataclass(frozen=True)
class TensorParallel:
    """The weight sharding of a tensor-parallel load (model/loader.py's ``WeightSharding``) over the 1-D ``mesh``
    (the ``tp`` dimension of ``ParallelMesh``) for a model of ``config``."""

    mesh: DeviceMesh
    config: Cosmos3Config

    def __post_init__(self):
        check_tp(self.degree, self.config.num_attention_heads, self.config.num_key_value_heads)
        if self.config.intermediate_size % self.degree:  # every Cosmos3 MLP width divides by 2..1024
            raise ValueError(f"--tp {self.degree}: the MLP width {self.config.intermediate_size} does not split "
                             f"{self.degree} ways; choose a degree that divides it.")

    @property
    def degree(self) -> int:
        return self.mesh.size()

    @property
    def rank(self) -> int:
        return self.mesh.get_local_rank()

    @property
    def kv_repeat(self) -> int:
        """How many ranks share one key/value head (1: the heads are split)."""
        return max(1, self.degree // self.config.num_key_value_heads)

    # ------------------------------------------------------------------ the model
    def shard(self, model: nn.Module) -> None:
        """Parallelize ``model`` (built on ``meta``) in place: local head counts, replicated KV heads, DTensor
        placements. Its parameters then have their global shapes and no storage; the loader fills them."""
        cfg, t = self.config, self.degree
        for layer in model.layers:
            attn = layer.self_attn
            attn.num_heads = cfg.num_attention_heads // t
            attn.num_kv_heads = max(1, cfg.num_key_value_heads // t)
            if self.kv_repeat > 1:
                for name in KV_PROJECTIONS:
                    setattr(attn, name, _repeated_heads(getattr(attn, name), self.kv_repeat))
        parallelize_module(model, self.mesh, tp_plan(model))
        model.weight_sharding = self

    # ------------------------------------------------------------------ the checkpoint
    def source(self, name: str, param: torch.Tensor) -> tuple[tuple[int, ...], tuple[slice, ...] | None]:
        """(the checkpoint shape of tensor ``name``, this rank's slice of it; None: all of it) for the model's
        parameter ``param`` (a DTensor after ``shard``, or a plain replicated tensor)."""
        if not isinstance(param, DTensor):
            return tuple(param.shape), None
        shape = tuple(param.shape)
        local, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        index = tuple(slice(o, o + n) for o, n in zip(offset, local))
        module = name.rpartition(".")[0]
        if self.kv_repeat > 1 and module.rpartition(".")[2] in KV_PROJECTIONS and param.ndim >= 1:
            hd, rep = self.config.head_dim, self.kv_repeat
            shape = (shape[0] // rep, *shape[1:])
            head = offset[0] // hd // rep  # the repeated head this rank's rows are a copy of
            index = (slice(head * hd, head * hd + local[0]), *index[1:])
        if all(s.start == 0 and s.stop == n for s, n in zip(index, shape)):
            return shape, None
        return shape, index

    @staticmethod
    def place(local: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        """The model's parameter from this rank's ``local`` part (``param``: the meta-sharded parameter)."""
        if not isinstance(param, DTensor):
            return local
        return DTensor.from_local(local, param.device_mesh, param.placements, run_check=False,
                                  shape=param.shape, stride=param.stride())


def _repeated_heads(linear: nn.Linear, repeat: int) -> nn.Linear:
    """A key/value projection (on ``meta``) whose output is the original's heads each ``repeat`` times."""
    return type(linear)(linear.in_features, linear.out_features * repeat, bias=linear.bias is not None,
                        device="meta", dtype=linear.weight.dtype)


def local_parameter_bytes(model: nn.Module) -> int:
    """The bytes of ``model``'s parameters this rank holds (a DTensor counts its local shard only)."""
    total = 0
    for p in model.parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        total += local.numel() * local.element_size()
    return total
