"""The loader's core ``VAE`` output: ComfyUI's own Wan2.2 VAE over the checkpoint's VAE weights.

``comfy.sd.VAE(sd=...)`` (ComfyUI 0.3.75 ``comfy/sd.py``) is handed the loaded checkpoint VAE's tensors renamed to
the original Wan2.2 layout (``cosmos3_core.vae.wan_layout.to_wan_layout``: a pure rename), so core VAE Decode,
VAE Decode (Tiled), VAE Encode and every node that takes a ``VAE`` work on the pack's ``LATENT`` (raw Wan2.2
latents ``[N, 48, T, h, w]``) as on any Wan2.2 latent.

Built on first use: ``comfy.sd.VAE`` copies the weights into its own module (its own dtype, device and
``ModelPatcher``), which would double the VAE's memory for a user who never connects the output. The object is a
``comfy.sd.VAE`` whose ``__init__`` runs when any of its attributes is first read — every ``VAE`` method starts by
reading one — and ``get_ram_usage`` (ComfyUI's RAM-pressure cache asks every cached output) answers 0 until then.
Once built it holds a second copy of the VAE (Wan2.2 TI2V-5B: 705 M parameters, 1.4 GB in bf16 / 2.8 GB in fp32)
for as long as ComfyUI keeps the loader's output.
"""

from __future__ import annotations

import comfy.sd
import torch

from ..cosmos3_core.vae.wan_layout import geometry_problem, to_wan_layout

_STATE = "_cosmos3_state"  # "lazy" | "building" | "built"
MIN_ENCODE_PIXELS = 16  # Wan2.2 works in 16-pixel blocks: a smaller image reaches its convolutions empty


def check_encode_size(pixel_samples) -> None:
    """A core VAE Encode of an image smaller than one 16-pixel block: one message instead of PyTorch's kernel-size
    error from deep inside the encoder."""
    shape = tuple(getattr(pixel_samples, "shape", ()))
    if len(shape) >= 3 and min(shape[-3], shape[-2]) < MIN_ENCODE_PIXELS:
        raise ValueError(f"VAE Encode (Cosmos3 Load Checkpoint's vae): the image is {shape[-2]}x{shape[-3]}; Cosmos3's "
                         f"Wan2.2 VAE needs at least {MIN_ENCODE_PIXELS}x{MIN_ENCODE_PIXELS} pixels — resize or pad "
                         "the image first (e.g. Upscale Image).")


class Cosmos3CoreVAE(comfy.sd.VAE):
    """``comfy.sd.VAE`` built on first use from a loaded ``Cosmos3VAE`` (``cosmos3_core.vae.video``)."""

    def __init__(self, vae, device: torch.device | None, checkpoint: str):  # comfy.sd.VAE.__init__: in _cosmos3_build
        self.__dict__.update({_STATE: "lazy", "_cosmos3_vae": vae, "_cosmos3_device": device,
                              "_cosmos3_checkpoint": checkpoint})

    @property
    def cosmos3_built(self) -> bool:
        return self.__dict__.get(_STATE) == "built"

    def __getattr__(self, name: str):
        # only reached for attributes not set yet: build, then look again
        if name.startswith("__") or self.__dict__.get(_STATE) != "lazy":
            raise AttributeError(name)
        self._cosmos3_build()
        return getattr(self, name)

    def encode(self, pixel_samples):
        check_encode_size(pixel_samples)
        return super().encode(pixel_samples)

    def encode_tiled(self, pixel_samples, *args, **kwargs):
        check_encode_size(pixel_samples)
        return super().encode_tiled(pixel_samples, *args, **kwargs)

    def get_ram_usage(self):
        return super().get_ram_usage() if self.cosmos3_built else 0

    def _cosmos3_build(self) -> None:
        d = self.__dict__
        module = d["_cosmos3_vae"].vae  # the diffusers AutoencoderKLWan inside the pack's Cosmos3VAE
        problem = geometry_problem(dict(module.config))
        if problem:
            raise ValueError(
                f"Cosmos3Loader: the vae output cannot be built for checkpoint {d['_cosmos3_checkpoint']!r}: ComfyUI's "
                f"Wan2.2 VAE holds only the released Wan2.2 TI2V-5B VAE, and this checkpoint's vae/ differs "
                f"({problem}). Decode with Cosmos3 VAE Decode instead (it takes the same LATENT)."
            )
        sd = to_wan_layout(module.state_dict())  # views of the pack's tensors; comfy.sd.VAE copies them
        d[_STATE] = "building"
        try:
            comfy.sd.VAE.__init__(self, sd=sd, device=d["_cosmos3_device"])
            have = set(self.first_stage_model.state_dict())
            if have != set(sd):
                raise ValueError(f"ComfyUI's Wan2.2 VAE has tensors {sorted(have - set(sd))[:3]} the checkpoint "
                                 f"lacks and lacks {sorted(set(sd) - have)[:3]}")
        except (RuntimeError, ValueError, KeyError) as exc:
            d[_STATE] = "lazy"
            raise ValueError(f"Cosmos3Loader: the vae output cannot be built for checkpoint "
                             f"{d['_cosmos3_checkpoint']!r} ({str(exc).splitlines()[0]}); decode with Cosmos3 VAE "
                             "Decode instead.") from exc
        d[_STATE] = "built"

    def __repr__(self) -> str:
        state = "built" if self.cosmos3_built else "not built yet"
        return f"Cosmos3CoreVAE({self.__dict__.get('_cosmos3_checkpoint')!r}, {state})"
