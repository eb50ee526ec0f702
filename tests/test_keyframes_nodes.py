"""Cosmos3 First/Last Frame (Keyframes) in the real in-process ComfyUI 0.3.75 host, against diffusers 0.42.1.

Graphs of core LoadImage → Cosmos3FirstLastFrame → Cosmos3KSamplerUniPCDualTower → core SaveLatent (the raw
Wan2.2 latent, read back from its safetensors file) on the host's tiny Nano checkpoint, fp32 on the CPU. The
reference is ``Cosmos3OmniPipeline`` given the same images as a ``video`` (frames written out by hand from the
documented layout, stills by diffusers' ``_preprocess_conditioning_image`` from the pixels LoadImage yields) and
the latent frame indexes as ``condition_frame_indexes_vision``. Bad inputs: one message naming the node and the fix.
"""
from __future__ import annotations

import json
import uuid

import numpy as np
import pytest
import torch
from PIL import Image

from support import comfy_host
from support.compare import rel
from test_workflows import TINY_NANO, prepared_executor

pytestmark = pytest.mark.comfy

H, W, FRAMES, STEPS, SEED, SHIFT = 64, 96, 17, 3, 77, 3.0
PROMPT = "a red ball rolls across a wooden table and stops at the edge"
NEGATIVE = "blurry"
IMAGES = {"start": ("cosmos3_flf_start.png", 80, 120), "mid": ("cosmos3_flf_mid.png", 72, 100),
          "end": ("cosmos3_flf_end.png", 90, 90)}


@pytest.fixture(scope="module")
def host(tiny_checkpoint):
    h = prepared_executor(tiny_checkpoint)
    for i, (name, hh, ww) in enumerate(IMAGES.values()):
        rng = np.random.default_rng(100 + i)
        Image.fromarray(rng.integers(0, 256, (hh, ww, 3), dtype=np.uint8)).save(h.base_dir / "input" / name)
    return h


@pytest.fixture(scope="module")
def reference(host):
    from diffusers import Cosmos3OmniPipeline, UniPCMultistepScheduler

    ref = Cosmos3OmniPipeline.from_pretrained(host.base_dir / "models" / "diffusers" / TINY_NANO,
                                              enable_safety_checker=False, torch_dtype=torch.float32)
    ref.scheduler = UniPCMultistepScheduler.from_config(ref.scheduler.config, flow_shift=SHIFT,
                                                       use_karras_sigmas=False)
    return ref


def flf_graph(*, images=("start", "end"), frame_indexes="", num_frames=FRAMES, text_frames=FRAMES,
              keyframes=None, tag="") -> dict:
    g = {
        "1": {"class_type": "Cosmos3Loader", "inputs": {"checkpoint": TINY_NANO, "dtype": "fp32", "device": "default"}},
        "2": {"class_type": "Cosmos3TextEncode", "inputs": {
            "model": ["1", 0], "prompt": PROMPT + tag, "negative_prompt": NEGATIVE, "width": W, "height": H,
            "num_frames": text_frames, "fps": 24.0}},
        "6": {"class_type": "Cosmos3FirstLastFrame", "inputs": {
            "model": ["1", 0], "width": W, "height": H, "num_frames": num_frames, "frame_indexes": frame_indexes}},
        "7": {"class_type": "Cosmos3KSamplerUniPCDualTower", "inputs": {
            "model": ["1", 0], "text": ["2", 0], "seed": SEED, "steps": STEPS, "cfg": 6.0, "schedule": "flow_shift",
            "shift": SHIFT, "sound": False, "condition": ["6", 0]}},
        "8": {"class_type": "SaveLatent", "inputs": {"samples": ["7", 0],
                                                     "filename_prefix": f"cosmos3_flf/{uuid.uuid4().hex[:8]}"}},
    }
    slots = {"start_image": images[0]}
    if len(images) > 1:
        slots["end_image"] = images[-1]
    if keyframes:
        slots["keyframes"] = keyframes
    for k, (slot, which) in enumerate(slots.items()):
        g[str(10 + k)] = {"class_type": "LoadImage", "inputs": {"image": IMAGES[which][0]}}
        g["6"]["inputs"][slot] = [str(10 + k), 0]
    return g


def loaded(host, which: str) -> torch.Tensor:
    """What LoadImage yields for a test image: ``[1, H, W, 3]`` float32 = uint8 / 255."""
    with Image.open(host.base_dir / "input" / IMAGES[which][0]) as im:
        return torch.from_numpy(np.asarray(im.convert("RGB")).astype(np.float32) / 255.0)[None]


def reference_latent(host, reference, prompt, order, indexes, owner, num_frames=FRAMES) -> torch.Tensor:
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import _preprocess_conditioning_image

    stills = [((_preprocess_conditioning_image(loaded(host, w).permute(0, 3, 1, 2), H, W)[0] + 1) / 2)
              .permute(1, 2, 0).numpy() for w in order]
    video = np.stack([stills[i] for i in owner]).astype(np.float32)
    out = reference(prompt=prompt, negative_prompt=NEGATIVE, video=video, condition_frame_indexes_vision=indexes,
                    num_frames=num_frames, height=H, width=W, fps=24.0, num_inference_steps=STEPS,
                    guidance_scale=6.0, generator=torch.Generator("cpu").manual_seed(SEED), output_type="latent")
    return out.video  # normalized latents


def saved_latent(host, outputs) -> torch.Tensor:
    """The SaveLatent file of a run, normalized with the checkpoint's per-channel mean/std."""
    from safetensors.torch import load_file

    item = outputs["8"]["latents"][0]
    raw = load_file(host.base_dir / "output" / item["subfolder"] / item["filename"])["latent_tensor"]
    cfg = json.loads((host.base_dir / "models" / "diffusers" / TINY_NANO / "vae" / "config.json").read_text())
    mean = torch.tensor(cfg["latents_mean"]).view(1, -1, 1, 1, 1)
    std = torch.tensor(cfg["latents_std"]).view(1, -1, 1, 1, 1)
    return (raw.double() - mean) / std


@pytest.mark.parametrize("case", ["first_last", "middle_keyframe"])
def test_node_matches_diffusers(host, reference, case):
    if case == "first_last":  # indexes left empty: start at latent 0, end at the last (4 for 17 frames)
        tag = " (flf)"
        graph = flf_graph(tag=tag)
        order, indexes, owner = ("start", "end"), [0, 4], [0] * 7 + [1] * 10
    else:
        tag = " (keyframe)"
        graph = flf_graph(keyframes="mid", frame_indexes="0, 2, 4", tag=tag)
        order, indexes, owner = ("start", "mid", "end"), [0, 2, 4], [0] * 3 + [1] * 8 + [2] * 6
    outputs = host.run_ok(graph)
    ours = saved_latent(host, outputs)
    ref = reference_latent(host, reference, PROMPT + tag, order, indexes, owner)
    assert ours.shape == ref.shape == (1, 48, 5, H // 16, W // 16)
    assert rel(ours, ref) <= 1e-4


def _error(host, graph, node_type: str, *needles: str) -> str:
    ok, _, messages = host.run(graph)
    assert not ok, f"expected {node_type} to fail"
    (err,) = [d for e, d in messages if e == "execution_error"]
    assert err["node_type"] == node_type, err
    msg = err["exception_message"]
    assert msg.startswith(node_type), msg
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    return msg


def test_num_frames_must_match_the_text_encode(host):
    _error(host, flf_graph(num_frames=13), "Cosmos3KSamplerUniPCDualTower", "num_frames=13", "num_frames=17",
           "same num_frames")


def test_size_mismatch_names_first_last_frame(host):
    """The sampler's size check names the node that made the condition (issue 39: it named VAE Encode (Condition),
    which was not in the graph)."""
    g = flf_graph()
    g["6"]["inputs"]["width"] = W + 16
    msg = _error(host, g, "Cosmos3KSamplerUniPCDualTower", f"encoded at {W + 16}x{H}",
                 "on Cosmos3 First/Last Frame and Cosmos3 Text Encode")
    assert "VAE Encode" not in msg, msg


@pytest.mark.parametrize("frame_indexes, needles", [
    ("0, 5", ("frame index 5", "0 … 4", "latent frame")),
    ("0; 4", ("'0; 4'", "'0, 47'")),
    ("4, 0", ("strictly increasing",)),
    ("0", ("1 frame indexes", "2 keyframe images")),
    ("0, 1_0", ("'0, 1_0'", "'0, 47'")),  # int() would read 1_0 as 10 (issue 39)
])
def test_bad_frame_indexes(host, frame_indexes, needles):
    _error(host, flf_graph(frame_indexes=frame_indexes), "Cosmos3FirstLastFrame", *needles)


def test_a_batch_as_start_image_is_refused(host):
    g = flf_graph()
    g["20"] = {"class_type": "RepeatImageBatch", "inputs": {"image": g["6"]["inputs"]["start_image"], "amount": 2}}
    g["6"]["inputs"]["start_image"] = ["20", 0]
    _error(host, g, "Cosmos3FirstLastFrame", "start_image is a batch of 2 images", "keyframes")


def test_one_frame_is_refused(host):
    """The widget's range starts at 5 (the canvas offers 5, 9, 13, …); ComfyUI refuses 1 before any node runs."""
    with pytest.raises(comfy_host.PromptValidationError) as err:
        host.run(flf_graph(num_frames=1, text_frames=1))
    assert "num_frames" in str(err.value) and "smaller than min of 5" in str(err.value), err.value


def test_the_next_run_succeeds(host):
    assert host.run_ok(flf_graph(tag=" (after errors)"))
