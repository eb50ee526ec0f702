"""Ulysses sequence parallelism for the generation tower: tokens sharded across ranks, attention sharded by heads.

The DeepSpeed-Ulysses scheme (Jacobs et al. 2023, as sglang and vLLM-Omni run it for Cosmos3): every op of a
generation layer except attention is per token, so each of the ``U`` ranks of a group runs them on its ``N/U``
tokens. Around attention one all-to-all turns ``[B, H, N/U, hd]`` (this rank's tokens, every head) into
``[B, H/U, N, hd]`` (every token, this rank's heads) and a second one turns the output back. The text K/V, which
the generation tokens also attend to, is cached per prompt; each rank keeps only its heads of it
(``shard_text``). The transport is ``torch.distributed.all_to_all_single`` / ``all_gather`` on the mesh's
``ulysses`` group (NCCL on GPUs, gloo on CPUs).

Grouped-query attention: rank ``r`` owns query heads ``[r·H/U, (r+1)·H/U)``. When ``U`` divides the key/value
heads it owns ``KV/U`` of them; when ``U`` is a multiple of ``KV`` (e.g. Nano's 8 KV heads at ``U = 16``, or the
tiny test checkpoint's 2 at ``U = 4``) every rank's query heads read one key/value head, which is replicated
before the exchange. ``mesh.check_heads`` rejects every other degree.

A stream whose token count ``N`` is not a multiple of ``U`` is zero-padded at the end; the padded keys are cut
before attention (no real token ever reads them) and the padded rows are dropped when the stream is gathered.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..model.text_kv import TextKV
from .mesh import check_heads, guarded


class SequenceParallel:
    """Sequence ↔ head resharding for one Ulysses group (``degree`` ranks, this one at ``rank``)."""

    def __init__(self, group: dist.ProcessGroup, num_heads: int, num_kv_heads: int):
        self.group = group
        self.degree = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        check_heads(self.degree, num_heads, num_kv_heads)
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self._kv_repeat = max(1, self.degree // num_kv_heads)  # > 1: every rank reads one replicated KV head
        self._num_tokens = 0  # real stream length, set by shard_tokens for to_heads' key cut

    # ------------------------------------------------------------------ text K/V
    def kv_heads(self) -> slice:
        """This rank's key/value heads (of the model's ``num_kv_heads``)."""
        if self._kv_repeat > 1:
            head = self.rank // self._kv_repeat
            return slice(head, head + 1)
        per = self.num_kv_heads // self.degree
        return slice(self.rank * per, (self.rank + 1) * per)

    def shard_text(self, kv: TextKV) -> TextKV:
        """This rank's heads of a prompt's cached K/V (a copy: the full cache can be freed)."""
        heads = self.kv_heads()
        return TextKV(kv.keys[:, heads].clone(), kv.values[:, heads].clone(), kv.token_ids)

    # ------------------------------------------------------------------ tokens
    def shard_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, N, ...]`` → this rank's ``[B, ceil(N/U), ...]`` (zero-padded at the end of the stream)."""
        n = x.shape[1]
        self._num_tokens = n
        local = -(-n // self.degree)
        pad = local * self.degree - n
        if pad:
            x = F.pad(x, (0, 0) * (x.ndim - 2) + (0, pad))
        return x[:, self.rank * local : (self.rank + 1) * local]

    def gather_tokens(self, x: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """Every rank's ``[B, n, ...]`` → the whole stream ``[B, num_tokens, ...]`` on every rank."""
        parts = [torch.empty_like(x) for _ in range(self.degree)]
        with guarded("Ulysses all-gather of the token stream"):
            dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=1)[:, :num_tokens]

    # ------------------------------------------------------------------ attention layout
    def to_heads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """``[..., heads, n, hd]`` per rank (its tokens) → ``[..., heads/U, N, hd]`` (every token, its heads);
        keys and values are cut to the real stream length."""
        if self._kv_repeat > 1:
            k = k.repeat_interleave(self._kv_repeat, dim=-3)
            v = v.repeat_interleave(self._kv_repeat, dim=-3)
        n = self._num_tokens
        return self._seq_to_heads(q), self._seq_to_heads(k)[..., :n, :], self._seq_to_heads(v)[..., :n, :]

    def to_tokens(self, out: torch.Tensor) -> torch.Tensor:
        """Attention output ``[..., H/U, N_padded, hd]`` → ``[..., H, n, hd]`` (this rank's tokens, every head)."""
        *lead, hl, total, hd = out.shape
        u = self.degree
        x = out.reshape(-1, hl, u, total // u, hd).permute(2, 0, 1, 3, 4).contiguous()  # [dest rank, R, H/U, n, hd]
        recv = torch.empty_like(x)  # [source rank = head block, R, H/U, n, hd]
        with guarded("Ulysses all-to-all (heads to tokens)"):
            dist.all_to_all_single(recv, x, group=self.group)
        return recv.permute(1, 0, 2, 3, 4).reshape(*lead, u * hl, total // u, hd)

    def _seq_to_heads(self, x: torch.Tensor) -> torch.Tensor:
        *lead, h, n, hd = x.shape
        u = self.degree
        send = x.reshape(-1, u, h // u, n, hd).transpose(0, 1).contiguous()  # [dest rank = head block, R, h/U, n, hd]
        recv = torch.empty_like(send)  # [source rank = token block, R, h/U, n, hd]
        with guarded("Ulysses all-to-all (tokens to heads)"):
            dist.all_to_all_single(recv, send, group=self.group)
        return recv.permute(1, 2, 0, 3, 4).reshape(*lead, h // u, u * n, hd)
