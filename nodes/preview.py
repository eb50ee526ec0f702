"""Latent previews for the sampler's progress bar through ComfyUI's own previewer for Wan2.2 latents."""

from __future__ import annotations

import comfy.latent_formats
import latent_preview


def make_previewer(model):
    """A function normalized-x0 → preview image payload, or ``None`` when previews are off in this host."""
    try:
        previewer = latent_preview.get_previewer(model.generation_patcher.load_device, comfy.latent_formats.Wan22())
    except Exception:  # noqa: BLE001 — a host without Wan2.2 preview support simply shows no preview
        return None
    if previewer is None:
        return None

    def preview(x0):
        return previewer.decode_latent_to_preview_image("JPEG", x0)

    return preview
