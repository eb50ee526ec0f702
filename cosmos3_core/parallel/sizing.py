"""What one rank of a parallel layout holds: its parameters and one denoising step's working memory, computed from
the model's sizes (no weights, no GPU) — the numbers behind README's and docs/design.md's layout tables.

* ``per_rank_parameters``: the module tree built on ``meta`` with ``tensor.style_of``'s rule (the one
  ``TensorParallel.shard`` applies; tests/test_tensor_parallel.py checks it against loaded shards): column- and
  row-parallel weights and the vocabulary-parallel embedding are split T ways (key/value projections repeated where
  T exceeds the key/value heads), everything else is replicated.
* ``per_rank_step_bytes``: ``model.towers.step_memory_required``'s model of one step (the residual stream, q/k/v,
  the MLP's four ``F``-wide tensors, one branch's attention K/V, RoPE tables, the text K/V; checked against an H200
  for one GPU) for one rank: CFG-parallel runs one branch, Ulysses ``1/U`` of the tokens (attention over all of them
  for ``1/U`` of the heads), tensor parallel ``1/T`` of the heads and of the MLP width. With no parallelism it equals
  ``step_memory_required``.

Computed, not measured: peaks on GPUs also hold the allocator's slack, NCCL buffers and (on rank 0) the VAE decode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import Cosmos3Config
from .mesh import check_tp
from .tensor import KV_PROJECTIONS, style_of

GIB = 2**30


@dataclass(frozen=True)
class RankParameters:
    """Parameters of one rank: ``layer_linears`` (the decoder layers' linear weights: FP8 in a ModelOpt checkpoint),
    ``other`` (everything else: embedding, norms, heads) and ``total`` (the whole model's)."""

    layer_linears: int
    other: int
    total: int

    @property
    def mine(self) -> int:
        return self.layer_linears + self.other

    def bytes(self, linear_bytes: int = 2, other_bytes: int = 2) -> int:
        """Bytes at ``linear_bytes`` per decoder-layer linear weight (2: bf16, 1: FP8) and ``other_bytes`` else."""
        return self.layer_linears * linear_bytes + self.other * other_bytes


def per_rank_parameters(config: Cosmos3Config, tp: int, skip_modules=("lm_head",)) -> RankParameters:
    """One rank's parameters under tensor-parallel degree ``tp`` (a generation load leaves ``lm_head`` out)."""
    from ..model.transformer import Cosmos3Transformer

    check_tp(tp, config.num_attention_heads, config.num_key_value_heads)
    with torch.device("meta"):
        model = Cosmos3Transformer(config, skip_modules=skip_modules)
    repeat = max(1, tp // config.num_key_value_heads)
    linears = other = total = 0
    for module_name, module in model.named_modules():
        style = style_of(module_name)
        for pname, p in module.named_parameters(recurse=False):
            n = p.numel()
            total += n
            if style in ("colwise", "vocab") or (style == "rowwise" and pname == "weight"):
                n = -(-n * (repeat if module_name.rpartition(".")[2] in KV_PROJECTIONS else 1) // tp)
            if style in ("colwise", "rowwise") and pname == "weight":
                linears += n
            else:
                other += n
    return RankParameters(linears, other, total)


def per_rank_step_bytes(config: Cosmos3Config, num_tokens: int, text_lengths: list[int], *, cfg_parallel: bool = False,
                        ulysses: int = 1, tp: int = 1, dtype: torch.dtype = torch.bfloat16) -> int:
    """One rank's working memory of one ``denoise_step`` beyond its weights (10 % headroom), for ``text_lengths``
    (one per guidance branch: 2 with guidance) and ``num_tokens`` generation tokens per branch."""
    elem = torch.empty((), dtype=dtype).element_size()
    lengths = text_lengths[:1] if cfg_parallel else list(text_lengths)  # the branches this rank runs
    b, hd = len(lengths), config.head_dim
    n = -(-num_tokens // ulysses)  # this rank's tokens
    q = config.q_width // tp
    kv = max(config.kv_width // tp, hd)  # a key/value head repeated on several ranks is still one head here
    per_token = 3 * config.hidden_size + 2 * q + 2 * kv + 4 * config.intermediate_size // tp
    activations = b * n * per_token * elem
    kv_heads = max(kv // ulysses, hd)  # attention: every token of this rank's heads (Ulysses: 1/U of them)
    branch_kv = 2 * (num_tokens + max(lengths)) * kv_heads * elem
    rope = 2 * b * n * hd * elem
    text = sum(2 * config.num_hidden_layers * kv_heads * length * elem for length in lengths)
    return int(1.1 * (activations + branch_kv + rope + text))
