"""Action modes (policy / forward dynamics / inverse dynamics) == diffusers 0.42.1's modular Cosmos3 pipeline.

The reference is ``Cosmos3OmniBlocks().init_pipeline(checkpoint)`` (``Cosmos3OmniModularPipeline`` whose auto blocks
pick ``Cosmos3ActionTextStep`` / ``Cosmos3ActionVisionVaeEncoderStep`` / the ``vision_action`` core denoise when an
``action=CosmosActionCondition(...)`` is given), on a tiny random Nano-shaped checkpoint with ``action_gen=True``,
fp32 on the CPU, the same seed (noise order vision, sound, action). Compared: the clean vision latent (bucketed,
encoded and cropped to the content), the prompt token ids (JSON caption), the denoised video latent and the action
outputs (≤ 1e-4). Then every bad input of the issue gives one ValueError naming the argument.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from diffusers import UniPCMultistepScheduler
from diffusers.modular_pipelines.cosmos.modular_blocks_cosmos3 import Cosmos3OmniBlocks
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
    _ACTION_RESOLUTION_BINS,
    _ACTION_VIEWPOINT_TEMPLATES,
    _EMBODIMENT_TO_DOMAIN_ID,
    _EMBODIMENT_TO_RAW_ACTION_DIM,
    CosmosActionCondition,
)
from PIL import Image

from cosmos3_core import api
from cosmos3_core.api import generate
from cosmos3_core.checks import check_action_request
from cosmos3_core.modes import action as act
from cosmos3_core.modes.action import action_prompt_ids, encode_action_condition
from cosmos3_core.pipeline import Cosmos3Pipeline
from cosmos3_core.request import ActionRequest, Request
from support.compare import rel

PROMPT = "robot arm picks up the red cup"
NEGATIVE = "blurry static"
SEED, STEPS, CHUNK = 11, 3, 4


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("nano", sound=True, seed=5)


@pytest.fixture(scope="module")
def ours(checkpoint):
    return Cosmos3Pipeline.load(checkpoint, dtype=torch.float32, device="cpu")


@pytest.fixture(scope="module")
def reference(checkpoint):
    pipe = Cosmos3OmniBlocks().init_pipeline(str(checkpoint))
    pipe.load_components(torch_dtype=torch.float32)
    pipe.disable_safety_checker()
    pipe.scheduler = UniPCMultistepScheduler.from_config(pipe.scheduler.config, flow_shift=10.0, use_karras_sigmas=False)
    return pipe


def _clip(seed: int, frames: int, h: int, w: int) -> np.ndarray:
    return np.random.default_rng(seed).random((frames, h, w, 3)).astype(np.float32)


def _fields(mode: str, clip, *, tier=256, chunk=CHUNK, domain="bridge_orig_lerobot", actions=None, pil=False):
    frames = [Image.fromarray((f * 255).round().astype(np.uint8)) for f in clip] if pil else clip
    kw = dict(mode=mode, chunk_size=chunk, domain_name=domain, resolution_tier=tier)
    if mode == "inverse_dynamics":
        kw["video"] = frames
    else:
        kw["image"] = frames[0]
    if mode == "forward_dynamics":
        kw["raw_actions"] = actions
    return kw


def _actions(chunk=CHUNK, dim=10, seed=3) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((chunk, dim)).astype(np.float32)


# ---------------------------------------------------------------------------------------------- tables
def test_tables_are_the_reference_tables():
    assert act.EMBODIMENT_TO_DOMAIN_ID == _EMBODIMENT_TO_DOMAIN_ID
    assert act.EMBODIMENT_TO_RAW_ACTION_DIM == _EMBODIMENT_TO_RAW_ACTION_DIM
    assert act.VIEWPOINT_FRAMING == _ACTION_VIEWPOINT_TEMPLATES
    assert {str(k): v for k, v in act.RESOLUTION_BINS.items()} == _ACTION_RESOLUTION_BINS


# ---------------------------------------------------------------------------------------------- preprocessing
@pytest.mark.parametrize("h, w, tier, pil, modes", [
    (72, 100, 256, False, act.ACTION_MODES),  # sides floored to 16, no downscale (fits the canvas)
    (400, 600, 256, True, act.ACTION_MODES),  # downscaled (bicubic) into 192x320, padded right (reflect)
    (40, 300, 256, False, ("policy",)),  # very wide: padding taller than the content → replicate
    (130, 130, 480, True, ("forward_dynamics",)),  # 640x640 canvas
])
def test_condition_latent_and_prompt_ids_match_reference(ours, reference, h, w, tier, pil, modes):
    """Vision x0 (bucket, pad, encode, crop) and token ids == the reference's helper steps, for each mode."""
    clip = _clip(h + w, CHUNK + 1, h, w)
    for mode in modes:
        kw = _fields(mode, clip, tier=tier, pil=pil, actions=_actions())
        ref_action = CosmosActionCondition(**{**kw, "raw_actions": torch.from_numpy(kw["raw_actions"])}
                                           if mode == "forward_dynamics" else kw)
        cond = encode_action_condition(ours.vae, ActionRequest(**kw), ours.config)
        # Cosmos3ActionVisionVaeEncoderStep, through the helpers it calls
        conditioning = [ref_action.image] if ref_action.image is not None else ref_action.video
        pixels, image_size, canvas_h, canvas_w = reference._prepare_action_video_conditioning(
            conditioning, tier, CHUNK + 1, device="cpu", dtype=torch.float32)
        ref_x0 = reference._remove_action_video_padding_from_latent(reference._encode_video(pixels).float(), image_size)
        assert cond.x0.shape == ref_x0.shape and cond.canvas == (canvas_h, canvas_w)
        clean = list(cond.clean_frames)
        assert clean == ([0] if mode != "inverse_dynamics" else list(range(ref_x0.shape[2])))
        torch.testing.assert_close(cond.x0[:, :, clean], ref_x0[:, :, clean], rtol=0, atol=1e-5)
        # Cosmos3ActionTextStep → tokenize_prompt(action_mode=…)
        ref_ids = reference.tokenize_prompt(PROMPT, NEGATIVE, num_frames=CHUNK + 1, height=canvas_h, width=canvas_w,
                                            fps=5.0, use_system_prompt=True, action_mode=mode,
                                            action_view_point="wrist_view")
        ids = action_prompt_ids(ours.tokenizer, _with_view(cond, "wrist_view"), PROMPT, NEGATIVE, fps=5.0,
                                use_system_prompt=True)
        assert (ids.cond, ids.uncond) == (list(ref_ids[0]), list(ref_ids[1]))


def _with_view(cond, view):
    import dataclasses

    return dataclasses.replace(cond, view_point=view)


@pytest.mark.parametrize("view, frames, fps, h, w", [(None, 5, 5.0, 192, 320), ("ego_view", 17, 5.0, 640, 640),
                                                       ("concat_view", 301, 4.0, 480, 832)])
def test_caption_matches_reference(view, frames, fps, h, w, reference):
    ours = act.action_caption(" picks up cup ", view_point=view, num_frames=frames, fps=fps, height=h, width=w)
    ref = reference._build_action_json_prompt(" picks up cup ", view_point=view, num_frames=frames, fps=fps,
                                              height=h, width=w)
    assert ours == ref and json.loads(ours)["resolution"] == {"H": h, "W": w}


# ---------------------------------------------------------------------------------------------- whole runs
@pytest.mark.parametrize("mode, guidance, sound, chunk", [
    ("policy", 1.0, False, CHUNK), ("forward_dynamics", 1.0, False, CHUNK), ("inverse_dynamics", 1.0, False, CHUNK),
    ("policy", 3.0, True, CHUNK),  # vision_sound_action core denoise + two-pass CFG on all three streams
    ("inverse_dynamics", 3.0, True, CHUNK),  # every vision latent clean: only the actions (and sound) are denoised
    ("inverse_dynamics", 1.0, False, 8),  # 9 frames, 3 latents (chunk sizes that are not multiples of 4 are
    # refused: upstream silently drops the frames past the last whole latent, test_bad_action_input_names_argument)
])
def test_action_generation_matches_reference(ours, reference, mode, guidance, sound, chunk):
    """Video latent and unpadded actions == Cosmos3OmniModularPipeline(action=CosmosActionCondition(...))."""
    clip = _clip(1, chunk + 1, 72, 100)
    kw = _fields(mode, clip, chunk=chunk, actions=_actions(chunk=chunk))
    ref_kw = {**kw, "raw_actions": torch.from_numpy(kw["raw_actions"])} if mode == "forward_dynamics" else kw
    ref = reference(prompt=PROMPT, negative_prompt=NEGATIVE, action=CosmosActionCondition(**ref_kw), fps=5.0,
                    num_inference_steps=STEPS, guidance_scale=guidance, enable_sound=sound, use_system_prompt=False,
                    generator=torch.Generator("cpu").manual_seed(SEED), output_type="latent")
    out = generate(ours, Request(action=ActionRequest(**kw), prompt=PROMPT, negative_prompt=NEGATIVE, steps=STEPS,
                                 guidance=guidance, seed=SEED, sound=sound), decode=False)
    ref_latents = ref.values["latents"]
    assert out.latents.shape == ref_latents.shape
    assert rel(out.latents, ref_latents) <= 1e-4
    assert rel(out.action, ref.values["action_latents"]) <= 1e-4 or mode == "forward_dynamics"
    if mode == "forward_dynamics":  # actions are the given ones (frozen), none are predicted
        assert ref.values["action"] is None and out.actions is None
        torch.testing.assert_close(out.action[:, :10], torch.from_numpy(kw["raw_actions"]), rtol=0, atol=0)
        assert not out.action[:, 10:].any()
    else:
        (ref_actions,) = ref.values["action"]
        assert out.actions.shape == ref_actions.shape == (chunk, 10)
        assert rel(out.actions, ref_actions) <= 1e-4
        assert not out.action[:, 10:].any(), "padding channels must stay zero"
    if sound:
        assert rel(out.sound_latent, ref.values["sound_latents"]) <= 1e-4
    if mode == "inverse_dynamics":  # the given video is kept as is
        assert rel(out.latents, ref_latents) == 0.0 or rel(out.latents, ref_latents) <= 1e-6


# ---------------------------------------------------------------------------------------------- bad input
def _req(**over):
    base = dict(mode="policy", chunk_size=CHUNK, domain_name="bridge_orig_lerobot", resolution_tier=256,
                image=_clip(0, 1, 64, 96)[0])
    base.update(over)
    return ActionRequest(**base)


BAD = {
    "unknown mode": (dict(mode="dreaming"), "action_mode='dreaming'"),
    "chunk 0": (dict(chunk_size=0), "chunk_size=0"),
    "chunk 3": (dict(chunk_size=3), "chunk_size=3 spans 4 frames, but a Cosmos3 clip has 4k\\+1 frames .* only 1 "
                                    "would be generated; use a multiple of 4, e.g. chunk_size=4"),
    "chunk 6": (dict(chunk_size=6), "only 5 would be generated; use a multiple of 4, e.g. chunk_size=8"),
    "unknown domain": (dict(domain_name="spaceship"), "domain_name='spaceship'"),
    "domain without width": (dict(domain_name="libero"), "domain_name='libero'"),
    "tier": (dict(resolution_tier=360), "resolution_tier=360"),
    "view point": (dict(view_point="drone"), "view_point='drone'"),
    "no frames": (dict(image=None), "needs a start image"),
    "image and video": (dict(video=_clip(0, 5, 64, 96)), "both image and video"),
    "inverse without video": (dict(mode="inverse_dynamics"), "needs a video"),
    "inverse frame count": (dict(mode="inverse_dynamics", image=None, video=_clip(0, 3, 64, 96)),
                            "video has 3"),
    "forward without actions": (dict(mode="forward_dynamics"), "needs actions"),
    "forward wrong count": (dict(mode="forward_dynamics", raw_actions=_actions(chunk=CHUNK + 2)),
                            f"6 actions were given but chunk_size={CHUNK}"),
    "forward wrong width": (dict(mode="forward_dynamics", raw_actions=_actions(dim=7)), "7-dim"),
    "forward too wide": (dict(mode="forward_dynamics", raw_actions=_actions(dim=80)), "above this checkpoint's action_dim=64"),
    "forward 1-d": (dict(mode="forward_dynamics", raw_actions=np.zeros(10, np.float32)), "shape (10,)"),
    "forward nan": (dict(mode="forward_dynamics", raw_actions=np.full((CHUNK, 10), np.nan, np.float32)), "NaN"),
    "policy with actions": (dict(raw_actions=_actions()), "only forward_dynamics takes actions"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_action_input_names_argument(case, ours):
    over, needle = BAD[case]
    with pytest.raises(ValueError) as err:
        check_action_request(_req(**over), ours.config)
    assert re.search(needle, str(err.value)) or needle in str(err.value), str(err.value)


def test_action_mode_on_checkpoint_without_action_head_or_too_narrow(ours):
    import dataclasses

    with pytest.raises(ValueError, match="this checkpoint has no action head .*action_gen is false"):
        check_action_request(_req(), dataclasses.replace(ours.config, action_gen=False))
    narrow = dataclasses.replace(ours.config, action_dim=16)
    with pytest.raises(ValueError, match="domain_name='galbot' has 30-dim actions, above this checkpoint's action_dim=16"):
        check_action_request(_req(domain_name="galbot"), narrow)


def test_checkpoint_without_action_head_is_refused(tiny_checkpoint):
    ckpt = tiny_checkpoint("edge", sound=False, seed=1, action=False)
    pipe = Cosmos3Pipeline.load(ckpt, dtype=torch.float32, device="cpu")
    assert not pipe.config.action_gen
    with pytest.raises(ValueError, match=r"^this checkpoint has no action head"):
        generate(pipe, Request(action=_req(), prompt=PROMPT, steps=1), decode=False)


def test_plain_text_encode_is_refused_for_an_action_run(ours):
    cond = encode_action_condition(ours.vae, _req(), ours.config)
    h, w = cond.output_size
    plain = ours.encode_text(PROMPT, "", num_frames=CHUNK + 1, height=h, width=w, fps=5.0)
    with pytest.raises(ValueError, match="^the text was not encoded for this action condition"):
        api.plan(ours, plain, action=cond)


def test_action_files_round_trip(tmp_path):
    a = _actions()
    for name in ("a.npy", "a.json"):
        act.save_actions(tmp_path / name, a, domain_name="bridge_orig_lerobot", mode="policy")
        np.testing.assert_array_equal(act.load_actions(tmp_path / name), a)
    from safetensors.numpy import save_file

    save_file({"actions": a}, str(tmp_path / "a.safetensors"))
    np.testing.assert_array_equal(act.load_actions(tmp_path / "a.safetensors"), a)
    (tmp_path / "bad.json").write_text('{"actions": [[1, 2], [3]]}')
    with pytest.raises(ValueError, match="bad.json"):
        act.load_actions(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="does not exist"):
        act.load_actions(tmp_path / "missing.npy")
    with pytest.raises(ValueError, match=".npy or .json"):
        act.save_actions(tmp_path / "a.txt", a)
