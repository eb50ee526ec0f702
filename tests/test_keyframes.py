"""First + last frame / keyframe conditioning (``conditioning.encode_keyframes``) against diffusers 0.42.1.

The reference is ``Cosmos3OmniPipeline`` given the stills as a ``video`` and their latent frame indexes as
``condition_frame_indexes_vision`` (how vLLM-Omni's FL2V recipe conditions a first and a last image). The clip handed
to diffusers is written out here frame by frame from the documented layout (each still fills its latent's pixel
frames, a gap between two keyframes is split in half between them, frames before the first keyframe show the first
still) and its stills are made by diffusers' own ``_preprocess_conditioning_image``. Tiny random checkpoint, fp32, CPU.

Run: bash tests/run.sh tests/test_keyframes.py
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import Cosmos3OmniPipeline, UniPCMultistepScheduler
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import _preprocess_conditioning_image
from PIL import Image

from cosmos3_core import api
from cosmos3_core.pipeline import Cosmos3Pipeline
from cosmos3_core.sampling.conditioning import encode_keyframes, keyframe_indexes
from support.compare import rel

H, W, STEPS, SEED, SHIFT = 64, 96, 3, 4321, 3.0
PROMPT = "a robot arm pours water from a glass into a jar"
NEGATIVE = "blurry"

# (num_frames, latent frame indexes, pixel frame -> which still), written out by hand from the layout
CASES = {
    "first_last": (17, [0, 4], [0] * 7 + [1] * 10),
    "start_middle_end": (17, [0, 2, 4], [0] * 3 + [1] * 8 + [2] * 6),
    "start_middle": (13, [0, 2], [0] * 3 + [1] * 6),
    "late_start": (13, [1, 3], [0] * 7 + [1] * 6),
}


def _image(seed: int, h: int = 80, w: int = 100) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def reference_clip(images, owner) -> np.ndarray:
    """The ``video`` diffusers takes: ``[F, H, W, 3]`` float in [0, 1], frame f showing still ``owner[f]``."""
    stills = [((_preprocess_conditioning_image(im, H, W)[0] + 1.0) / 2.0).permute(1, 2, 0).numpy() for im in images]
    return np.stack([stills[i] for i in owner]).astype(np.float32)


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("nano", seed=11)


@pytest.fixture(scope="module")
def ours(checkpoint):
    return Cosmos3Pipeline.load(checkpoint, dtype=torch.float32, device="cpu")


@pytest.fixture(scope="module")
def reference(checkpoint):
    ref = Cosmos3OmniPipeline.from_pretrained(checkpoint, enable_safety_checker=False, torch_dtype=torch.float32)
    ref.scheduler = UniPCMultistepScheduler.from_config(ref.scheduler.config, flow_shift=SHIFT,
                                                       use_karras_sigmas=False)
    return ref


@pytest.mark.parametrize("case", sorted(CASES))
def test_clean_latents_match_the_reference_video_path(ours, reference, case):
    """x0 at the clean frames == the pipeline's own prepare_latents on the hand-written clip; the rest is zero."""
    num_frames, indexes, owner = CASES[case]
    images = [_image(20 + i) for i in range(len(indexes))]
    x0, clean = encode_keyframes(ours.vae, images, indexes, num_frames=num_frames, height=H, width=W)
    with torch.no_grad():
        out = reference.prepare_latents(
            video=reference_clip(images, owner), condition_frame_indexes_vision=indexes, num_frames=num_frames,
            height=H, width=W, device="cpu", dtype=torch.float32, generator=torch.Generator().manual_seed(0))
    latents, mask = out[0], out[5]
    assert clean == torch.nonzero(mask[:, 0, 0] > 0).flatten().tolist() == indexes
    assert x0.shape == latents.shape == (1, 48, (num_frames - 1) // 4 + 1, H // 16, W // 16)
    assert (x0[:, :, clean] - latents[:, :, clean]).abs().max().item() <= 1e-5
    noisy = [i for i in range(x0.shape[2]) if i not in clean]
    assert torch.count_nonzero(x0[:, :, noisy]) == 0


@pytest.mark.parametrize("case", ["first_last", "start_middle_end", "start_middle"])
def test_final_latents_match_reference(ours, reference, case):
    num_frames, indexes, owner = CASES[case]
    images = [_image(30 + i) for i in range(len(indexes))]
    ref = reference(
        prompt=PROMPT, negative_prompt=NEGATIVE, video=reference_clip(images, owner),
        condition_frame_indexes_vision=indexes, num_frames=num_frames, height=H, width=W, fps=24.0,
        num_inference_steps=STEPS, guidance_scale=6.0, generator=torch.Generator("cpu").manual_seed(SEED),
        output_type="latent",
    ).video
    text = ours.encode_text(PROMPT, NEGATIVE, num_frames=num_frames, height=H, width=W, fps=24.0)
    x0, clean = encode_keyframes(ours.vae, images, indexes, num_frames=num_frames, height=H, width=W)
    plan = api.plan(ours, text, seed=SEED, steps=STEPS, guidance=6.0, schedule="flow_shift", shift=SHIFT, x0=x0,
                     clean_frames=clean)
    out = ours.run(plan).latents
    assert out.shape == ref.shape
    assert rel(out, ref) <= 1e-4
    # the keyframes stay as encoded (up to the UniPC update's float rounding, as in the reference)
    assert (out[:, :, clean] - x0[:, :, clean]).abs().max().item() <= 1e-5


def test_default_indexes_spread_from_first_to_last():
    assert keyframe_indexes(1, 189) == [0]
    assert keyframe_indexes(2, 189) == [0, 47]  # vLLM-Omni's FL2V recipe for 189 frames
    assert keyframe_indexes(3, 189) == [0, 24, 47]  # round(23.5) = 24 (banker's rounding: 23.5 -> 24)
    assert keyframe_indexes(2, 9) == [0, 2]


@pytest.mark.parametrize("kwargs, needle", [
    (dict(count=2, num_frames=17, frame_indexes=[0, 5]), "outside the latent timeline"),
    (dict(count=2, num_frames=17, frame_indexes=[3, 1]), "strictly increasing"),
    (dict(count=2, num_frames=17, frame_indexes=[0]), "one latent frame index per image"),
    (dict(count=2, num_frames=17, frame_indexes=[0, -1]), "non-negative"),
    (dict(count=2, num_frames=17, frame_indexes="0, 4"), "list of ints"),
    (dict(count=3, num_frames=9), "fill all 3 latent frames"),
    (dict(count=2, num_frames=1), "at least 5"),
    (dict(count=2, num_frames=18), r"4k\+1"),
])
def test_bad_keyframes_are_refused_clearly(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        keyframe_indexes(**kwargs)
