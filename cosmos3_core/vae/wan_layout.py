"""The checkpoint's Wan2.2 VAE in the original Wan2.2 key layout (the one ComfyUI's own Wan2.2 VAE loads).

A Cosmos3 checkpoint's ``vae/`` holds diffusers 0.42.1 ``AutoencoderKLWan`` weights
(models/autoencoders/autoencoder_kl_wan.py). The original Wan2.2 code (Wan-Video/Wan2.2 ``wan/modules/vae2_2.py``;
ComfyUI 0.3.75 ``comfy/ldm/wan/vae2_2.py`` is that network) names the same tensors differently and nothing else
differs: every tensor keeps its shape and values. ``to_wan_layout`` is that rename:

=================================================  =============================================================
diffusers                                           Wan2.2
=================================================  =============================================================
``quant_conv`` / ``post_quant_conv``                ``conv1`` / ``conv2``
``{encoder,decoder}.conv_in``                       ``{encoder,decoder}.conv1``
``{encoder,decoder}.norm_out`` / ``.conv_out``      ``{encoder,decoder}.head.0`` / ``.head.2``
``*.mid_block.resnets.0`` / ``.attentions.0`` /      ``*.middle.0`` / ``.middle.1`` / ``.middle.2``
``.resnets.1``
``encoder.down_blocks.i.resnets.j``                 ``encoder.downsamples.i.downsamples.j``
``encoder.down_blocks.i.downsampler``               ``encoder.downsamples.i.downsamples.<number of resnets>``
``decoder.up_blocks.i.resnets.j``                   ``decoder.upsamples.i.upsamples.j``
``decoder.up_blocks.i.upsampler``                   ``decoder.upsamples.i.upsamples.<number of resnets>``
resnet ``norm1`` / ``conv1`` / ``norm2`` /           ``residual.0`` / ``residual.2`` / ``residual.3`` /
``conv2`` / ``conv_shortcut``                       ``residual.6`` / ``shortcut``
=================================================  =============================================================

(in a resnet's ``residual`` sequence 1 and 4 are SiLU, 5 dropout; the attention block's ``norm``, ``to_qkv`` and
``proj`` keep their names). ComfyUI 0.3.75's ``comfy.sd.VAE(sd=...)`` recognises a Wan2.2 VAE by
``decoder.middle.0.residual.0.gamma`` and ``decoder.upsamples.0.upsamples.0.residual.2.weight`` and then always
builds the released TI2V-5B geometry (``WAN22_TI2V_5B``); ``geometry_problem`` says when a checkpoint's VAE is
another one (the tiny test checkpoints are).
"""

from __future__ import annotations

import re
from typing import Mapping

import torch

# the released Wan2.2 TI2V-5B VAE (every Cosmos3 checkpoint's vae/config.json): what ComfyUI's Wan2.2 VAE builds
WAN22_TI2V_5B = {
    "base_dim": 160, "decoder_base_dim": 256, "z_dim": 48, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2,
    "attn_scales": [], "temperal_downsample": [False, True, True], "is_residual": True, "in_channels": 12,
    "out_channels": 12, "patch_size": 2, "scale_factor_spatial": 16, "scale_factor_temporal": 4,
}

_TOP = {"quant_conv": "conv1", "post_quant_conv": "conv2"}
_OWN = {"conv_in": "conv1", "norm_out": "head.0", "conv_out": "head.2"}
_MID = {"resnets.0": "middle.0", "attentions.0": "middle.1", "resnets.1": "middle.2"}
_RESNET = {"norm1": "residual.0", "conv1": "residual.2", "norm2": "residual.3", "conv2": "residual.6",
           "conv_shortcut": "shortcut"}
_BLOCK = re.compile(r"^(encoder\.down_blocks|decoder\.up_blocks)\.(\d+)\.(resnets\.(\d+)|downsampler|upsampler)\.(.+)$")
_MIDKEY = re.compile(r"^(encoder|decoder)\.mid_block\.(resnets\.\d+|attentions\.0)\.(.+)$")


def _resnet_part(rest: str, key: str) -> str:
    head, _, tail = rest.partition(".")
    if head not in _RESNET:
        raise ValueError(f"to_wan_layout: unknown resnet tensor {key!r}")
    return f"{_RESNET[head]}.{tail}"


def to_wan_layout(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers ``AutoencoderKLWan`` state dict → the same tensors (not copied) under the original Wan2.2 names.

    Raises ``ValueError`` naming the first key it does not know (never a silently dropped tensor)."""
    resnets: dict[tuple[str, int], int] = {}  # (block kind, block index) -> number of resnets
    for key in state_dict:
        m = _BLOCK.match(key)
        if m and m.group(4) is not None:
            slot = (m.group(1), int(m.group(2)))
            resnets[slot] = max(resnets.get(slot, 0), int(m.group(4)) + 1)
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        top, _, rest = key.partition(".")
        if top in _TOP:
            new = f"{_TOP[top]}.{rest}"
        elif (m := _BLOCK.match(key)) is not None:
            kind, block, part, j, tail = m.groups()
            side, seq = ("encoder", "downsamples") if kind.startswith("encoder") else ("decoder", "upsamples")
            if j is not None:
                new = f"{side}.{seq}.{block}.{seq}.{j}.{_resnet_part(tail, key)}"
            else:  # the block's resampler comes after its resnets
                new = f"{side}.{seq}.{block}.{seq}.{resnets.get((kind, int(block)), 0)}.{tail}"
        elif (m := _MIDKEY.match(key)) is not None:
            side, part, tail = m.groups()
            new = f"{side}.{_MID[part]}." + (_resnet_part(tail, key) if part.startswith("resnets") else tail)
        elif top in ("encoder", "decoder") and rest.partition(".")[0] in _OWN:
            head, _, tail = rest.partition(".")
            new = f"{top}.{_OWN[head]}.{tail}"
        else:
            raise ValueError(f"to_wan_layout: unknown Wan2.2 VAE tensor {key!r} (not a diffusers AutoencoderKLWan "
                             "state dict?)")
        if new in out:
            raise ValueError(f"to_wan_layout: {key!r} and another tensor both map to {new!r}")
        out[new] = tensor
    return out


def geometry_problem(config: Mapping) -> str | None:
    """None when a VAE config (``vae/config.json``) is the Wan2.2 TI2V-5B geometry, else what differs."""
    diffs = []
    for name, want in WAN22_TI2V_5B.items():
        have = config.get(name)
        have = list(have) if isinstance(have, (list, tuple)) else have
        if name == "decoder_base_dim" and have is None:  # diffusers: None means base_dim
            have = config.get("base_dim")
        if have != want:
            diffs.append(f"{name}={have!r} (Wan2.2 TI2V-5B: {want!r})")
    return "; ".join(diffs) or None
