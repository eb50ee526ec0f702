"""Fast mode (approximate, opt-in): 8-bit attention for the generation tower, a Triton kernel of our own.

Not a reference behaviour — diffusers 0.42.1 runs bf16 SDPA (exact mode, ``attention.py``, is what the parity
tests hold to diffusers). This computes the same non-causal grouped-query attention as
``scaled_dot_product_attention(q, k, v, enable_gqa=True)`` with both matrix products on 8-bit tensor cores
(SageAttention2's split): ``Q·Kᵀ`` in INT8, ``P·V`` in FP8 (e4m3), accumulating in int32 / fp32.

* **INT8 for the scores**: e4m3's 3 mantissa bits on q and k cost ≈ 7 % relative error on the output of random
  attention (``emulation in tests/test_fp8_attention.py``); INT8 with one scale per token ≈ 1.7 %.
* **keys smoothed** (SageAttention's observation): the per-channel mean over all keys of a head is subtracted
  first. Every score of a query row shifts by the same ``q·mean`` then, which softmax cancels exactly, while the
  e4m3 range is spent on what differs between keys.
* **scales**: one per query token, one per key token (``q ≈ q8·sq``, ``k ≈ k8·sk``, applied to the score tile),
  one per value channel; the softmax probabilities (in ``[0, 1]``) are multiplied by 448 before their
  e4m3 cast and the factor is taken out at the end.
* **online softmax in fp32** (FlashAttention's running max and sum, ``exp2`` with ``log2 e`` folded into the query
  scale); the row sums use the unrounded probabilities.

Layout: ``q`` ``[B, H, Sq, hd]``, ``k``/``v`` ``[B, KV, Sk, hd]`` → bf16 ``[B, H, Sq, hd]``; ``hd`` ∈ {64, 128},
``H`` a multiple of ``KV``. Values are stored transposed (``[B, KV, hd, Sk]``) because Hopper's FP8 tensor-core
instruction wants both operands of ``P·V`` contiguous along the reduction (key) axis.

Needs a CUDA GPU with FP8 tensor cores (compute capability ≥ 8.9) and Triton; on the CPU the kernel runs only
under Triton's interpreter (``TRITON_INTERPRET=1``, how the tests check it against SDPA).
"""

from __future__ import annotations

import math

import torch

try:  # Triton ships with CUDA builds of torch; without it the fast mode says so when asked for
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only on torch builds without Triton
    triton = None

E4M3_MAX = 448.0
INT8_MAX = 127.0
LOG2E = 1.4426950408889634
# Measured on the H200 (bench/bench_generation.py --attention): see BENCHMARKS.md "FP8 fast mode".
BLOCK_M, BLOCK_N, NUM_WARPS, NUM_STAGES = 128, 128, 8, 3


def available() -> bool:
    return triton is not None


def quantize_for_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float, scores_int8: bool = True
) -> tuple[torch.Tensor, ...]:
    """bf16/fp32 q, k, v → (int8 q, q_scale, int8 k, k_scale, e4m3 vᵀ, v_scale) as the kernel reads them.

    ``q_scale`` carries ``sm_scale·log2 e``; ``v8ᵀ`` is ``[B, KV, hd, Sk]``; ``v_scale`` carries the 1/448 of the
    probabilities' cast. Plain tensor ops, so ``torch.compile`` fuses them into the preceding norm/RoPE kernels.
    """
    top = INT8_MAX if scores_int8 else E4M3_MAX

    def to_8bit(x: torch.Tensor) -> torch.Tensor:
        return x.round().to(torch.int8) if scores_int8 else x.to(torch.float8_e4m3fn)

    qf = q.float()
    q_amax = qf.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12)
    q8 = to_8bit(qf * (top / q_amax))
    q_scale = (q_amax / top * (sm_scale * LOG2E)).squeeze(-1)  # [B, H, Sq]
    kf = k.float()
    kf = kf - kf.mean(dim=2, keepdim=True)
    k_amax = kf.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12)
    k8 = to_8bit(kf * (top / k_amax))
    k_scale = (k_amax / top).squeeze(-1)  # [B, KV, Sk]
    vf = v.float()
    v_amax = vf.abs().amax(dim=2, keepdim=True).clamp_min(1e-12)  # [B, KV, 1, hd]
    v8t = (vf * (E4M3_MAX / v_amax)).to(torch.float8_e4m3fn).transpose(2, 3).contiguous()
    v_scale = (v_amax / (E4M3_MAX * E4M3_MAX)).squeeze(2)  # [B, KV, hd]
    return q8, q_scale, k8, k_scale, v8t, v_scale


if triton is not None:

    @triton.jit
    def _score_tile(q, k_ptrs, ks_ptrs, row_scale, cols, seq_k, MASKED: tl.constexpr):
        if MASKED:
            k = tl.load(k_ptrs, mask=(cols < seq_k)[:, None], other=0.0)
            ks = tl.load(ks_ptrs, mask=cols < seq_k, other=0.0)
        else:
            k = tl.load(k_ptrs)
            ks = tl.load(ks_ptrs)
        if k.dtype == tl.int8:
            s = tl.dot(q, tl.trans(k), out_dtype=tl.int32).to(tl.float32)
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * row_scale[:, None] * ks[None, :]
        if MASKED:
            s = tl.where((cols < seq_k)[None, :], s, float("-inf"))
        return s

    @triton.jit
    def _accumulate(s, m_i, l_i, acc, vt_ptrs, cols, seq_k, MASKED: tl.constexpr):
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED:
            vt = tl.load(vt_ptrs, mask=(cols < seq_k)[None, :], other=0.0)
        else:
            vt = tl.load(vt_ptrs)
        p8 = (p * 448.0).to(tl.float8e4nv)
        acc = tl.dot(p8, tl.trans(vt), acc * alpha[:, None])
        return m_new, l_i, acc

    @triton.jit
    def _attention_8bit_kernel(
        Q, QS, K, KS, VT, VS, O,
        stride_qb, stride_qh, stride_qs,
        stride_kb, stride_kh, stride_ks,
        stride_vb, stride_vh, stride_vd,
        stride_ob, stride_oh, stride_os,
        num_heads, group, seq_q, seq_k,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // num_heads
        h = pid_bh % num_heads
        kv = h // group
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, HEAD_DIM)
        cols = tl.arange(0, BLOCK_N)
        row_ok = rows < seq_q

        q = tl.load(Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_qs + dims[None, :],
                    mask=row_ok[:, None], other=0.0)
        row_scale = tl.load(QS + pid_bh * seq_q + rows, mask=row_ok, other=0.0)
        k_ptrs = K + b * stride_kb + kv * stride_kh + cols[:, None] * stride_ks + dims[None, :]
        ks_ptrs = KS + (b * (num_heads // group) + kv) * seq_k + cols
        vt_ptrs = VT + b * stride_vb + kv * stride_vh + dims[:, None] * stride_vd + cols[None, :]

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        full_tiles = seq_k // BLOCK_N
        for _ in range(0, full_tiles):
            s = _score_tile(q, k_ptrs, ks_ptrs, row_scale, cols, seq_k, False)
            m_i, l_i, acc = _accumulate(s, m_i, l_i, acc, vt_ptrs, cols, seq_k, False)
            k_ptrs += BLOCK_N * stride_ks
            ks_ptrs += BLOCK_N
            vt_ptrs += BLOCK_N
            cols += BLOCK_N
        if full_tiles * BLOCK_N < seq_k:
            s = _score_tile(q, k_ptrs, ks_ptrs, row_scale, cols, seq_k, True)
            m_i, l_i, acc = _accumulate(s, m_i, l_i, acc, vt_ptrs, cols, seq_k, True)

        vs = tl.load(VS + (b * (num_heads // group) + kv) * HEAD_DIM + dims)
        out = acc * (1.0 / l_i)[:, None] * vs[None, :]
        tl.store(O + b * stride_ob + h * stride_oh + rows[:, None] * stride_os + dims[None, :],
                 out.to(O.dtype.element_ty), mask=row_ok[:, None])


def attention_8bit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **launch) -> torch.Tensor:
    """Non-causal attention of ``q`` ``[B, H, Sq, hd]`` over ``k``/``v`` ``[B, KV, Sk, hd]``, 8-bit inside."""
    if triton is None:
        raise RuntimeError("8-bit attention needs Triton (it ships with CUDA builds of PyTorch).")
    hd = q.shape[-1]
    if hd not in (64, 128) or q.shape[1] % k.shape[1] or v.shape != k.shape:
        raise ValueError(f"attention_8bit: unsupported shapes q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)} (head dim 64 or 128, query heads a multiple of key/value heads).")
    quantized = quantize_for_attention(q, k, v, 1.0 / math.sqrt(hd))
    return attention_8bit_quantized(*quantized, out_dtype=q.dtype, **launch)


def attention_8bit_quantized(
    q8: torch.Tensor,
    q_scale: torch.Tensor,
    k8: torch.Tensor,
    k_scale: torch.Tensor,
    v8t: torch.Tensor,
    v_scale: torch.Tensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    block_m: int = BLOCK_M,
    block_n: int = BLOCK_N,
    num_warps: int = NUM_WARPS,
    num_stages: int = NUM_STAGES,
) -> torch.Tensor:
    """The kernel alone, on ``quantize_for_attention``'s outputs."""
    b, h, seq_q, hd = q8.shape
    kv, seq_k = k8.shape[1], k8.shape[2]
    q8, k8 = q8.contiguous(), k8.contiguous()
    out = torch.empty(b, h, seq_q, hd, dtype=out_dtype, device=q8.device)
    grid = (triton.cdiv(seq_q, block_m), b * h)
    _attention_8bit_kernel[grid](
        q8, q_scale.contiguous(), k8, k_scale.contiguous(), v8t, v_scale.contiguous(), out,
        q8.stride(0), q8.stride(1), q8.stride(2),
        k8.stride(0), k8.stride(1), k8.stride(2),
        v8t.stride(0), v8t.stride(1), v8t.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        h, h // kv, seq_q, seq_k,
        HEAD_DIM=hd, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps, num_stages=num_stages,
    )
    return out
