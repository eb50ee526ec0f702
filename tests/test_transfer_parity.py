"""Transfer (control videos, windowed) == diffusers 0.42.1 modular Cosmos3 Transfer pipeline on one tiny checkpoint.

The reference is ``Cosmos3OmniBlocks`` (modular_pipelines/cosmos) run with ``control_videos``: its chunk loop
(``Cosmos3TransferChunkDenoiseStep``) is observed from outside — every transformer call's inputs and output through a
forward hook, every chunk's final latents at ``Cosmos3TransferDecodeChunkStep`` — and its stitched frames are its
``output_type="np"`` result. fp32 on the CPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import Cosmos3OmniPipeline, UniPCMultistepScheduler
from diffusers.modular_pipelines.cosmos import Cosmos3OmniBlocks
from diffusers.modular_pipelines.cosmos import decoders as ref_decoders

from cosmos3_core.model.layout import Prefix, build_layout
from cosmos3_core.pipeline import Cosmos3Pipeline
from support.compare import rel

H, W, SEED, SHIFT = 32, 48, 11, 3.0
PROMPT = "a robot arm picks up a red cup on the table"
NEGATIVE = "blurry low quality video"


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("nano", sound=False, seed=5)


@pytest.fixture(scope="module")
def ours(checkpoint):
    return Cosmos3Pipeline.load(checkpoint, dtype=torch.float32, device="cpu")


@pytest.fixture(scope="module")
def reference(checkpoint):
    std = Cosmos3OmniPipeline.from_pretrained(checkpoint, enable_safety_checker=False, torch_dtype=torch.float32)
    pipe = Cosmos3OmniBlocks().init_pipeline()
    pipe.update_components(**{k: v for k, v in std.components.items() if v is not None})
    pipe.disable_safety_checker()
    pipe.scheduler = UniPCMultistepScheduler.from_config(
        std.scheduler.config, flow_shift=SHIFT, use_karras_sigmas=False
    )
    return pipe


def control_clip(seed: int, frames: int) -> np.ndarray:
    """A smooth random clip ``[F, H, W, 3]`` in [0, 1] (ComfyUI IMAGE layout) at the generation size."""
    rng = np.random.default_rng(seed)
    base = rng.random((1, H // 8, W // 8, 3), dtype=np.float32)
    drift = rng.random((frames, 1, 1, 3), dtype=np.float32) * 0.3
    clip = np.clip(base + drift * np.linspace(0, 1, frames, dtype=np.float32)[:, None, None, None], 0, 1)
    return np.repeat(np.repeat(clip, 8, axis=1), 8, axis=2)


def run_reference(reference, monkeypatch, controls: dict, **kwargs):
    """Run the modular Transfer pipeline; return (stitched frames, per-chunk latents, transformer calls)."""
    chunks, calls = [], []
    real_decode_chunk = ref_decoders.Cosmos3TransferDecodeChunkStep.__call__

    def recording_decode_chunk(self, components, state):
        chunks.append(state.get("latents").detach().clone())
        return real_decode_chunk(self, components, state)

    monkeypatch.setattr(ref_decoders.Cosmos3TransferDecodeChunkStep, "__call__", recording_decode_chunk)

    def hook(_module, _args, kw, out):
        calls.append(({k: v for k, v in kw.items()}, out[0][-1].detach().clone()))

    handle = reference.transformer.register_forward_hook(hook, with_kwargs=True)
    try:
        out = reference(
            prompt=PROMPT, negative_prompt=NEGATIVE, control_videos=controls, height=H, width=W,
            generator=torch.Generator("cpu").manual_seed(SEED), output_type="np", output="videos", **kwargs,
        )
    finally:
        handle.remove()
    return out, chunks, calls


def test_packed_control_step_matches_diffusers_forward(ours, reference, monkeypatch):
    """One transformer pass over [text | ctrl_1 … ctrl_n | target] == diffusers' forward on the sequence its own
    ``Cosmos3TransferPackSequenceStep`` packed (two controls, a seeded later chunk, with and without controls)."""
    controls = {"edge": control_clip(1, 9), "depth": control_clip(2, 9)}
    _, _, calls = run_reference(
        reference, monkeypatch, controls, num_video_frames_per_chunk=5, num_conditional_frames=1,
        num_inference_steps=1, guidance_scale=6.0, control_guidance=2.0,
    )
    assert len(calls) == 2 * 3  # 2 chunks × (cond_full, cond_no_control, uncond_full)
    model = ours.transformer
    seen_prefix = set()
    for kw, ref_v in calls:
        items = kw["vision_tokens"]
        target = items[-1]
        noisy = kw["vision_noisy_frame_indexes"][-1].tolist()
        clean = [i for i in range(target.shape[2]) if i not in noisy]
        prefix = torch.cat(items[:-1]) if len(items) > 1 else None
        seen_prefix.add((len(items) - 1, tuple(clean)))
        text = model.prefill(kw["input_ids"].tolist())
        layout = build_layout(model.config, [text.length], target.shape[2:], 24.0, clean_frames=clean,
                              prefix=None if prefix is None else Prefix(prefix))
        out = model.denoise_step(target, kw["vision_timesteps"][0], [text], layout)
        assert rel(out.vision[0], ref_v[0]) <= 1e-5
    assert seen_prefix == {(2, ()), (0, ()), (2, (0,)), (0, (0,))}


def test_three_branches_in_one_batch_match_the_three_reference_passes(ours, reference, monkeypatch):
    """cond_full, cond_no_control and uncond_full as one batched step (the control prefix hidden from the middle
    branch's attention) == the reference's three separate passes of each step."""
    controls = {"blur": control_clip(3, 9)}
    _, _, calls = run_reference(
        reference, monkeypatch, controls, num_video_frames_per_chunk=5, num_conditional_frames=1,
        num_inference_steps=2, guidance_scale=4.0, control_guidance=1.5,
    )
    assert len(calls) == 2 * 2 * 3
    model = ours.transformer
    for start in range(0, len(calls), 3):
        (full, v_full), (noctrl, v_noctrl), (uncond, v_uncond) = calls[start : start + 3]
        assert len(full["vision_tokens"]) == len(uncond["vision_tokens"]) == 2 and len(noctrl["vision_tokens"]) == 1
        target = full["vision_tokens"][-1]
        noisy = full["vision_noisy_frame_indexes"][-1].tolist()
        clean = [i for i in range(target.shape[2]) if i not in noisy]
        cond_kv, uncond_kv = model.prefill(full["input_ids"].tolist()), model.prefill(uncond["input_ids"].tolist())
        layout = build_layout(
            model.config, [cond_kv.length, cond_kv.length, uncond_kv.length], target.shape[2:], 24.0,
            clean_frames=clean, prefix=Prefix(full["vision_tokens"][0], (False, True, False)),
        )
        out = model.denoise_step(target, full["vision_timesteps"][0], [cond_kv, cond_kv, uncond_kv], layout)
        for j, ref_v in enumerate((v_full, v_noctrl, v_uncond)):
            assert rel(out.vision[j], ref_v[0]) <= 1e-5
        assert rel(v_full, v_noctrl) > 1e-3  # the control really changes the prediction


def test_transfer_over_four_chunks_matches_modular_pipeline(ours, reference, monkeypatch):
    """Every chunk's final latents and the stitched frames == the modular Transfer pipeline: two controls, a seed
    video for chunk 0, two conditional frames, a last chunk whose controls are reflect-padded, nested guidance with
    the text guidance gated off for the last step."""
    from cosmos3_core.modes.long_video import generate_long
    from cosmos3_core.modes.stream_decode import FrameCollector
    from cosmos3_core.request import Request
    from cosmos3_core.resolve import resolve

    controls = {"depth": control_clip(4, 12), "edge": control_clip(5, 12)}  # given out of canonical order
    seed_video = control_clip(6, 3)
    kwargs = dict(num_video_frames_per_chunk=5, num_conditional_frames=2, num_first_chunk_conditional_frames=2,
                  num_inference_steps=3, guidance_scale=4.0, control_guidance=1.5, guidance_interval=(500, 1000))
    ref_frames, ref_chunks, _ = run_reference(reference, monkeypatch, controls, video=seed_video, **kwargs)

    collector, latents = FrameCollector(), []
    result = generate_long(
        ours,
        resolve(Request(
            prompt=PROMPT, negative_prompt=NEGATIVE, controls=controls, video=seed_video, frames_per_chunk=5,
            conditional_frames=2, height=H, width=W, steps=3, guidance=4.0, control_guidance=1.5,
            guidance_interval=(500, 1000), seed=SEED, schedule="flow_shift", shift=SHIFT,
        ), ours.info),
        [collector], latents_sink=lambda k, lat: latents.append(lat.clone()),
    )
    assert result.geometry.num_windows == len(ref_chunks) == 4
    for ours_lat, ref_lat in zip(latents, ref_chunks):
        assert ours_lat.shape == ref_lat.shape
        assert rel(ours_lat, ref_lat) <= 1e-4
    frames = collector.frames()
    assert frames.shape == ref_frames.shape == (12, H, W, 3)
    assert rel(frames, ref_frames) <= 1e-4


def test_cli_transfer_latents_and_frames_out_match_modular_pipeline(checkpoint, ours, reference, monkeypatch,
                                                                    tmp_path):
    """``generate --control edge=FILE.mp4 --latents-out --frames-out`` over 3 windows == the modular pipeline fed
    the same decoded control frames; the mp4 holds the stitched frames, 8-bit."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from safetensors.torch import load_file

    from cosmos3_core import media

    clip = media.write_video(tmp_path / "edge.mp4", control_clip(7, 11), 24.0)
    controls = {"edge": media.read_video(clip)[0]}
    ref_frames, ref_chunks, _ = run_reference(
        reference, monkeypatch, controls, num_video_frames_per_chunk=5, num_conditional_frames=1,
        num_inference_steps=2, guidance_scale=4.0,
    )
    out, lat, frames = tmp_path / "out.mp4", tmp_path / "lat.safetensors", tmp_path / "frames.safetensors"
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run(
        [sys.executable, "-m", "cosmos3_core.generate", "--checkpoint", str(checkpoint), "--prompt", PROMPT,
         "--negative-prompt", NEGATIVE, "--control", f"edge={clip}", "--frames-per-chunk", "5",
         "--conditional-frames", "1", "--height", str(H), "--width", str(W), "--steps", "2", "--guidance", "4",
         "--seed", str(SEED), "--shift", str(SHIFT), "--device", "cpu", "--dtype", "fp32", "--out", str(out),
         "--latents-out", str(lat), "--frames-out", str(frames)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(root)}, timeout=600,
    )
    assert r.returncode == 0, r.stderr
    saved = load_file(lat)
    assert sorted(saved) == [f"video_latent_{k:03d}" for k in range(3)] and len(ref_chunks) == 3
    for k, ref_lat in enumerate(ref_chunks):
        assert rel(saved[f"video_latent_{k:03d}"], ours.vae.denormalize(ref_lat)) <= 1e-4
    stitched = load_file(frames)["frames"]
    assert stitched.shape == ref_frames.shape == (11, H, W, 3)
    assert rel(stitched, ref_frames) <= 1e-4
    written, _ = media.read_video(out)
    assert written.shape == (11, H, W, 3)
    same = media.read_video(media.write_video(tmp_path / "same.mp4", stitched, 24.0))[0]
    # the streamed mp4 is the stitched frames through the same encoder (x264 may vary under heavy CPU load)
    assert np.array_equal(written, same) or np.abs(written - stitched.numpy()).mean() <= 1.25 * np.abs(
        same - stitched.numpy()).mean()
