"""Per-latent-frame causal decode of the Wan2.2 VAE decoder, written for speed over diffusers' own parameters.

Spec: diffusers 0.42.1 ``WanDecoder3d.forward`` (models/autoencoders/autoencoder_kl_wan.py) as driven by
``AutoencoderKLWan._decode``: one latent frame per call, ``first_chunk=True`` for frame 0, a feature cache carrying
the last ``CACHE_T = 2`` input frames of every temporal causal conv. The module (``vae.decoder``) and its parameters
are diffusers'; only the forward is ours. Same math, fewer memory passes:

* Causal conv cache as a *history*: every temporal-kernel-3 conv keeps the last two frames of its (conceptually
  zero-padded) input. Frame 0 sees zeros, which is exactly diffusers' causal zero padding plus its one-frame cache
  growing to two; the ``upsample3d`` time conv is skipped on frame 0 and starts from zeros on frame 1 (diffusers'
  ``"Rep"`` marker). The conv input ``[history | new frames]`` is one buffer that the producer writes straight into
  (RMS-norm + SiLU output lands in its slice), the spatial zero padding is the conv's own ``padding`` instead of an
  ``F.pad`` copy, and only the two-frame history is copied out. Diffusers copies the input three times (clone of
  the cache frames, ``cat``, ``F.pad``).
* RMS norm (``WanRMS_norm``: ``F.normalize(x.float(), dim=1) * sqrt(C) * gamma``) + SiLU: the fp32 norm is a
  reduction, the rest three in-place passes over the low-precision tensor (diffusers materializes fp32 copies);
  under ``torch.compile`` inductor fuses all of it into the conv-input write.
* ``DupUp3D`` shortcut (channel repeat + pixel shuffle) is added through a broadcast view instead of two copies;
  ``WanUpsample`` (nearest-exact x2) runs in the input dtype (nearest is a copy: identical values) on the 5-D tensor,
  followed by the 2-D conv as a ``(1, 3, 3)`` conv3d over a view of its weight (no ``[b*t]`` permute copies).
* Each history is one two-frame buffer per causal conv, made on a clip's first frame and overwritten in place on
  every later frame once its conv input has read it: no allocation per frame, and a history never aliases its
  conv input. (Returned as a fresh ``clone`` of the input's last frames instead, a channels-last slice is already
  dense, so inductor drops the clone as a no-op and returns a view that keeps each whole ``[history | frames]``
  buffer alive until the next frame: 16.3 GiB peak at 720p against 9.5 GiB contiguous, docs/benchmark-log.md.)
* Channels-last (``channels_last=True``, the default on CUDA): activations *and* the decoder's convolution weights
  in ``channels_last_3d`` (2-D weights ``channels_last``), the layout cuDNN's implicit-GEMM kernels read. With
  contiguous activations cuDNN transposes every conv's input and output (``nchwToNhwc``/``nhwcToNchw``: 18 of
  127 GPU ms per 720p latent frame compiled, docs/benchmark-log.md); with channels-last activations over contiguous
  weights it transposes the weights on every call instead. Each decoder puts the weights in its own layout when a
  clip (or tile) starts, so a compiled graph always sees the layout it was traced with, whatever a host did to the
  parameters in between (a reload, another decoder).
* Optional ``torch.compile`` (static sizes unless ``dynamic_size``) of the steady-state frame (every frame but the
  first, which has its own shapes and ``first_chunk`` path and runs eager), one graph per stage (input + mid block, each
  up block, head) so that a graph's buffers are freed between stages. Each stage graph is kept on disk whole
  (``precompiled.PrecompiledFunction``): a restarted process loads it instead of tracing the stage again. With
  ``dynamic_size=True`` a stage's graph has the frame's height and width dynamic: one graph for every size and tile.

Results equal diffusers' decode up to float rounding (tests/test_vae_decoder.py, fp32). Only the Wan2.2 layout
(``is_residual=True``: ``WanResidualUpBlock``) is supported; anything else is refused with a clear message.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels.caches import prepare_compile
from ..kernels.precompiled import PrecompiledFunction

HISTORY = 2  # frames of context a temporal-kernel-3 causal conv needs (diffusers' CACHE_T)


class WanFrameDecoder:
    """``decoder(x_frame, state, first)`` → decoder output of one latent frame (before unpatchify/clamp).

    ``state`` is a list owned by the caller: pass ``[]`` for a new clip (or tile); it holds one history list per
    stage (input + mid block, each up block, head), made on the first frame and overwritten in place after that.
    ``first`` must be True exactly for the clip's first latent frame. Compiled, each stage is its own static-shape
    graph.
    """

    def __init__(self, decoder: torch.nn.Module, *, compile: bool | str = False, channels_last: bool = False,
                 compile_backend: str = "inductor", dynamic_size: bool = False):
        from diffusers.models.autoencoders.autoencoder_kl_wan import WanResidualUpBlock

        if not all(isinstance(b, WanResidualUpBlock) for b in decoder.up_blocks):
            raise ValueError("WanFrameDecoder: only the Wan2.2 VAE decoder (is_residual=True, WanResidualUpBlock) is "
                             f"supported; got up blocks {[type(b).__name__ for b in decoder.up_blocks]}.")
        self.dec = decoder
        self.channels_last = channels_last
        self.compile, self.compile_backend = compile, compile_backend
        self.dynamic_size = dynamic_size  # compiled stages with the frame's height and width dynamic
        self.precompiled: dict = {}  # stage function -> its PrecompiledFunction (compile=True)

    def __call__(self, x: torch.Tensor, state: list, first: bool) -> torch.Tensor:
        if x.shape[2] != 1:
            raise ValueError(f"WanFrameDecoder: decodes one latent frame per call, got {x.shape[2]} frames.")
        if not first and not state:
            raise ValueError("WanFrameDecoder: an empty state needs first=True (the clip's first latent frame).")
        # a fresh dense frame (not a view into the clip): a compiled graph sees the same strides/offset each call
        x = x.contiguous(memory_format=torch.channels_last_3d if self.channels_last else torch.contiguous_format)
        d = self.dec
        if first:
            conv_weights_to_layout(d, self.channels_last)
            if self.compile:
                prepare_compile()  # on-disk caches and the recompile limit, in this clip's context (caches.py)
        stages = [(_stage_in, d)] + [(_stage_up, b) for b in d.up_blocks] + [(_stage_out, d)]
        if first:
            state[:] = [None] * len(stages)
        for k, (fn, module) in enumerate(stages):
            x, state[k] = self._run(fn, first)(module, x, state[k], first, self.channels_last)
        return x

    def _run(self, fn, first: bool):
        """The stage eager (first frame, or compile off) or through its compiled version, kept on disk."""
        if not self.compile or first:
            return fn
        if fn not in self.precompiled:
            self.precompiled[fn] = PrecompiledFunction(
                fn, backend=self.compile_backend, dynamic_dims=_spatial_dims if self.dynamic_size else None,
                compile_missing=self.compile != "cached")
        return self.precompiled[fn]


def _spatial_dims(args: tuple) -> list[tuple[torch.Tensor, int]]:
    """A stage call's height and width dimensions (of the frame and of every history)."""
    _, x, hist, _, _ = args
    return [(t, d) for t in (x, *(hist or ())) for d in (3, 4)]


def conv_weights_to_layout(module: torch.nn.Module, channels_last: bool) -> int:
    """Store every Conv2d/Conv3d weight under ``module`` channels-last (or contiguous); returns how many moved.
    Same values, same parameters (``.data`` re-pointed); a no-op for weights already in that layout."""
    moved = 0
    for m in module.modules():
        if not isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d)):
            continue
        w = m.weight
        fmt = (torch.channels_last_3d if w.ndim == 5 else torch.channels_last) if channels_last else \
            torch.contiguous_format
        if not w.is_contiguous(memory_format=fmt):
            # of the weight's own kind whatever mode the caller runs in (a parameter keeps its kind across
            # ``.data =``): an inference tensor as a host loading under inference mode made it, else a normal one
            with torch.inference_mode(w.is_inference()), torch.no_grad():
                w.data = w.detach().contiguous(memory_format=fmt)
            moved += 1
    return moved


# ------------------------------------------------------------------ the network, in stages
def _stage_in(d: torch.nn.Module, x: torch.Tensor, hist: list | None, first: bool, cl: bool):
    """conv_in + mid block (resnet, attention, resnet)."""
    c = _Cursor(hist, cl)
    x = _causal_conv(d.conv_in, c.input(x))
    mid = d.mid_block
    x = _resblock(mid.resnets[0], x, c)
    for attn, res in zip(mid.attentions, mid.resnets[1:]):
        x = _resblock(res, attn(x), c)
    return x, c.out


def _stage_up(block: torch.nn.Module, x: torch.Tensor, hist: list | None, first: bool, cl: bool):
    """``WanResidualUpBlock``: resnets, upsampler, + DupUp3D shortcut of the block input."""
    c = _Cursor(hist, cl)
    x_in = x
    for res in block.resnets:
        x = _resblock(res, x, c)
    if block.upsampler is not None:
        x = _upsample(block.upsampler, x, c, first)
    if block.avg_shortcut is not None:
        _dup_up_add_(x, x_in, block.avg_shortcut, first)
    return x, c.out


def _stage_out(d: torch.nn.Module, x: torch.Tensor, hist: list | None, first: bool, cl: bool):
    """Head: RMS norm + SiLU + conv_out."""
    c = _Cursor(hist, cl)
    return _causal_conv(d.conv_out, c.input(x, d.norm_out)), c.out


class _Cursor:
    """Walks the history list in call order and collects the next frame's histories."""

    def __init__(self, hist: list | None, channels_last: bool):
        self.hist, self.out = hist, []
        self.fmt = torch.channels_last_3d if channels_last else torch.contiguous_format

    def input(self, x: torch.Tensor, norm: torch.nn.Module | None = None) -> torch.Tensor:
        """Conv input ``[history | f(x)]`` (f = RMS norm + SiLU when ``norm`` is given, else identity); records the
        next history (its last two frames)."""
        b, ch, t, h, w = x.shape
        buf = torch.empty(b, ch, HISTORY + t, h, w, dtype=x.dtype, device=x.device, memory_format=self.fmt)
        hist = None if self.hist is None else self.hist[len(self.out)]
        if hist is None:
            buf[:, :, :HISTORY].zero_()
        else:
            buf[:, :, :HISTORY].copy_(hist)
        if norm is None:
            buf[:, :, HISTORY:].copy_(x)
        else:
            _rms_silu(x, norm, buf[:, :, HISTORY:])
        if hist is None:  # a clip's first frame: the history buffer is born here
            hist = buf[:, :, -HISTORY:].clone(memory_format=torch.preserve_format)
        else:  # later frames overwrite it in place, after ``buf`` has read it (see the module docstring)
            hist.copy_(buf[:, :, -HISTORY:])
        self.out.append(hist)
        return buf

    def skip(self, like: torch.Tensor) -> None:
        """First frame of an ``upsample3d``: its time conv does not run; the next frame starts from zeros."""
        b, ch, _, h, w = like.shape
        self.out.append(like.new_zeros(b, ch, HISTORY, h, w))


def _rms_silu(x: torch.Tensor, norm: torch.nn.Module, out: torch.Tensor) -> None:
    """``out = silu(F.normalize(x.float(), dim=1).to(x.dtype) * sqrt(C) * gamma)`` (WanRMS_norm, channel-first, no
    bias) with the norm reduced in fp32, then three passes in ``x``'s dtype (eager) or one fused kernel (compiled)."""
    if not isinstance(norm.bias, float) or norm.bias != 0.0 or not norm.channel_first:
        raise ValueError("WanFrameDecoder: expected channel-first WanRMS_norm without bias (Wan2.2 decoder).")
    inv = torch.linalg.vector_norm(x, dim=1, keepdim=True, dtype=torch.float32)
    inv = (norm.scale / inv.clamp_min(1e-12)).to(x.dtype)  # F.normalize's eps
    if torch.compiler.is_compiling():  # inductor fuses this into one write of ``out`` (out= views break dynamo)
        out.copy_(F.silu(x * inv * norm.gamma))
        return
    torch.mul(x, inv, out=out)
    out.mul_(norm.gamma)
    F.silu(out, inplace=True)


def _causal_conv(conv: torch.nn.Module, buf: torch.Tensor) -> torch.Tensor:
    """A ``WanCausalConv3d`` over ``[history | x]``: no temporal padding left, spatial padding by the conv."""
    pad = conv._padding  # (w, w, h, h, 2*t, 0)
    if pad[4] != HISTORY or conv.stride != (1, 1, 1):
        raise ValueError(f"WanFrameDecoder: unexpected causal conv padding {pad} / stride {conv.stride}.")
    return F.conv3d(buf, conv.weight, conv.bias, padding=(0, pad[2], pad[0]))


def _resblock(m: torch.nn.Module, x: torch.Tensor, c: _Cursor) -> torch.Tensor:
    """``WanResidualBlock``: shortcut (1x1x1 conv if the width changes) + conv2(norm2(conv1(norm1(x)))); eval."""
    sc = m.conv_shortcut
    h = x if isinstance(sc, torch.nn.Identity) else F.conv3d(x, sc.weight, sc.bias)
    y = _causal_conv(m.conv1, c.input(x, m.norm1))
    y = _causal_conv(m.conv2, c.input(y, m.norm2))
    return y.add_(h)


def _upsample(m: torch.nn.Module, x: torch.Tensor, c: _Cursor, first: bool) -> torch.Tensor:
    """``WanResample`` upsample2d / upsample3d: (time conv doubling the frames, except on the first frame), then
    nearest-exact x2 in space and a 3x3 conv per frame."""
    if m.mode == "upsample3d":
        if first:
            c.skip(x)
        else:
            b, ch, t, h, w = x.shape
            y = _causal_conv(m.time_conv, c.input(x))  # [b, 2*ch, t, h, w]: channel halves = frame pairs
            x = torch.empty(b, ch, 2 * t, h, w, dtype=y.dtype, device=y.device, memory_format=c.fmt)
            x.unflatten(2, (t, 2)).copy_(y.unflatten(1, (2, ch)).permute(0, 2, 3, 1, 4, 5))  # frame 2i+s = half s
    elif m.mode != "upsample2d":
        raise ValueError(f"WanFrameDecoder: unexpected resample mode {m.mode!r} in the decoder.")
    up, conv = m.resample[0], m.resample[1]
    if up.mode != "nearest-exact" or tuple(up.scale_factor) != (2.0, 2.0):
        raise ValueError(f"WanFrameDecoder: unexpected upsample {up.mode} x{up.scale_factor}.")
    x = F.interpolate(x, scale_factor=(1.0, 2.0, 2.0), mode="nearest-exact")
    return F.conv3d(x, conv.weight.unsqueeze(2), conv.bias, padding=(0, *conv.padding))


def _dup_up_add_(out: torch.Tensor, x: torch.Tensor, m: torch.nn.Module, first: bool) -> None:
    """``out += DupUp3D(x, first_chunk=first)`` without materializing the shortcut.

    DupUp3D repeats each input channel ``r`` times and unshuffles channel groups (``out_ch``, ``ft``, ``fs``, ``fs``)
    into (channel, time, height, width) sub-positions; when ``r`` is the product of the trailing sub-position
    sizes (Wan2.2: 8 = 2*2*2, and 2), that is a broadcast of ``x`` viewed as (out_ch, leading sub-positions).
    """
    ft, fs, r, co = m.factor_t, m.factor_s, m.repeats, m.out_channels
    b, _, t, h, w = x.shape
    radices = [ft, fs, fs]
    k, prod = 0, 1
    while prod < r and k < 3:
        prod *= radices[2 - k]
        k += 1
    if prod != r or (first and t != 1):
        out.add_(m(x, first_chunk=first))  # general layout: materialize as diffusers does
        return
    lead = radices[:3 - k]
    src = x.unflatten(1, (co, *lead)) if lead else x.unflatten(1, (co,))
    for _ in range(k):
        src = src.unsqueeze(1 + len(lead) + 1)  # singleton sub-position dims after the leading ones
    # src: [b, co, ft', fs', fs', t, h, w] with broadcast (size-1) dims for the repeated sub-positions
    if first and ft > 1:  # frame 0: diffusers keeps only the last of the ft duplicated frames
        if lead:  # the time sub-position is a real dim of src (not broadcast)
            src = src[:, :, ft - 1:]
        tgt_t, tgt_ft = 1, 1
    else:
        tgt_t, tgt_ft = t, ft
    tgt = out.unflatten(4, (w, fs)).unflatten(3, (h, fs)).unflatten(2, (tgt_t, tgt_ft))
    tgt = tgt.permute(0, 1, 3, 5, 7, 2, 4, 6)  # [b, co, ft, fs, fs, t, h, w]
    tgt.add_(src)
