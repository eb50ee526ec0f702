"""Cosmos3KSamplerUniPCDualTower: UniPC flow sampling with both guidance branches as one batched step.

Reads the clip shape from Cosmos3TextEncode's output; runs only the generation tower (the text K/V is cached).
Progress: a ComfyUI progress bar advances every step with a latent preview; it is also the cancel point.
"""

from __future__ import annotations

from dataclasses import dataclass

import comfy.model_management as mm
import comfy.utils
import torch
from comfy_api.latest import io

from ..cosmos3_core import defaults
from ..cosmos3_core.checks import check_options
from ..cosmos3_core.modes import action as action_mode
from ..cosmos3_core.request import SamplingRequest
from ..cosmos3_core.resolve import resolve_sampler
from ..cosmos3_core.runtime import RuntimeOptions
from ..cosmos3_core.sampling.sea_cache import SeaCacheConfig
from .action import ActionVectors
from .errors import node_errors
from .preview import make_previewer
from .types import (
    CATEGORY,
    Cosmos3Action,
    Cosmos3Actions,
    Cosmos3Condition,
    Cosmos3Model,
    Cosmos3Sound,
    Cosmos3Text,
    compile_input,
    fast_mode_inputs,
    fast_mode_sampling,
    sampling_inputs,
)


@dataclass(frozen=True)
class SoundLatent:
    latent: torch.Tensor  # [64, Ts] on the intermediate device
    num_frames: int
    fps: float


class Cosmos3KSamplerUniPCDualTower(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Cosmos3KSamplerUniPCDualTower",
            display_name="Cosmos3 KSampler UniPC (Dual Tower)",
            category=CATEGORY,
            description="Denoises the video (and sound) latent with the generation tower; the text tower's K/V "
                        "comes cached from Cosmos3 Text Encode. Both guidance branches run as one batch. A "
                        "distilled (*-4Step) checkpoint runs its own fixed schedule with one branch: steps 4, cfg 1.",
            inputs=[
                Cosmos3Model.Input("model", tooltip="The loaded checkpoint (its generation tower runs)."),
                Cosmos3Text.Input("text", tooltip="From Cosmos3 Text Encode: the prompts' K/V and the clip shape."),
                *sampling_inputs(seed="Noise seed; the same seed and settings give the same result.",
                                 steps=f"{defaults.STEPS_VIDEO} for video, {defaults.STEPS_IMAGE} for images. A "
                                       "distilled (*-4Step) checkpoint fixes it: its schedule's length (4).",
                                 cfg="Guidance scale; 1 runs the conditional branch only. A distilled (*-4Step) "
                                     "checkpoint fixes it at 1 (guidance is baked in).",
                                 shift="Flow shift; 0 = by resolution (720p 10, 480p 5, 256p 3). Keep 0 (and "
                                       "flow_shift) for a distilled checkpoint: its schedule is fixed."),
                io.Boolean.Input("sound", default=False, tooltip="Generate a sound track too (Nano/Super)."),
                Cosmos3Condition.Input("condition", optional=True,
                                       tooltip="Image-to-video / video-to-video latents from Cosmos3 VAE Encode "
                                               "(Condition), or first/last frame and keyframes from Cosmos3 "
                                               "First/Last Frame."),
                compile_input("the generation layer, which auto compiles too (~1.3x faster per step after a "
                              "one-off compile per new size), and the VAE decoder, which auto runs compiled only "
                              "from graphs already on disk"),
                io.Int.Input("batch_size", default=defaults.BATCH_SIZE, min=1, max=defaults.MAX_BATCH_SIZE,
                             optional=True,
                             tooltip="Generate this many results in one run (seeds seed … seed+batch_size−1, each the "
                                     "same as its own single run); they share every denoising step's forward pass."),
                Cosmos3Action.Input("action", optional=True,
                                    tooltip="Action modes: Cosmos3 Action Condition's action (its text goes to text). "
                                            f"The action models run at {defaults.ACTION_STEPS} steps, cfg "
                                            f"{defaults.ACTION_GUIDANCE:g}, shift {defaults.ACTION_SHIFT:g}."),
                io.Combo.Input("attention", options=["auto", "sdpa", "flash4"], default="auto", optional=True,
                               tooltip="Attention kernels. auto: FlashAttention-4 (if the optional flash-attn-4 "
                                       "package is installed) on Hopper GPUs for long sequences, else PyTorch SDPA. "
                                       "sdpa: always PyTorch SDPA (the reference's route). flash4: require it."),
                *fast_mode_inputs(),
            ],
            outputs=[io.Latent.Output(display_name="latent",
                                      tooltip="Wan2.2 video latent [1, 48, T, h, w]; decode with Cosmos3 VAE Decode."),
                     Cosmos3Sound.Output(display_name="sound", tooltip="Sound latent (empty when sound is off); "
                                                                        "decode with Cosmos3 Audio Decode."),
                     Cosmos3Actions.Output(display_name="actions", tooltip="Predicted actions (action modes); "
                                                                           "see Cosmos3 actions nodes.")],
        )

    @classmethod
    def execute(cls, model, text, seed: int, steps: int, cfg: float, schedule: str, shift: float, sound: bool,
                condition=None, compile: str = "auto", batch_size: int = defaults.BATCH_SIZE,
                action=None, attention: str = "auto", sea_cache: bool = False,
                sea_cache_threshold: float = SeaCacheConfig.threshold,
                mixed_precision_format: str = "auto") -> io.NodeOutput:
        pipe = model.pipeline
        who = "Cosmos3KSamplerUniPCDualTower"
        with node_errors(who):
            options = RuntimeOptions(attention=attention, compile=compile, device_type=model.generation_device.type)
            check_options(options)
            asked = SamplingRequest(seed=seed, steps=steps, guidance=cfg, schedule=schedule, shift=shift or None,
                                    sound=sound, batch_size=batch_size,
                                    **fast_mode_sampling(sea_cache, sea_cache_threshold, mixed_precision_format))
            sampling = resolve_sampler(pipe.info, text, asked, condition=condition, action=action)
            if action is not None:  # action modes: the plan takes the mode's clean latents and action stream
                plan = action_mode.plan(pipe, text, action, sampling, device=model.generation_device, options=options,
                                        prepare=model.prepare)
            else:
                x0, clean = (None, ()) if condition is None else (condition.x0, condition.clean_frames)
                plan = pipe.plan(text, sampling, x0=x0, clean_frames=clean, device=model.generation_device,
                                 options=options, prepare=model.prepare)
        with node_errors(who):  # a card too small for this run: the fix, before any out-of-memory error
            model.load_generation_tower(plan.memory_required)

        bar = comfy.utils.ProgressBar(plan.steps)
        preview = make_previewer(model)

        def on_step(step: int, total: int, x0_pred: torch.Tensor) -> None:
            bar.update_absolute(step, total, preview(x0_pred) if preview else None)

        # Cosmos3GuidanceOnTwoGPUs: the negative branch runs on the handle's second GPU (None: one device)
        denoiser = model.branch_denoiser() if sampling.use_cfg else None
        # SeaCache with the two-GPU guidance split, a failed compile: one message; out of memory (what
        # check_card_memory could not foresee): one line from errors.with_out_of_memory_message
        with node_errors(who):
            result = pipe.run(plan, callback=on_step, denoiser=denoiser)
        out = mm.intermediate_device()
        latent = {"samples": pipe.vae.denormalize(result.latents).to(out)}
        sound_latent = None
        if result.sound is not None:
            sound_latent = SoundLatent(result.sound.to(out), text.num_frames, text.fps)
        actions = None  # [Ta, width] ([N, Ta, width] for a batch)
        if action is not None and action.predicts_actions:
            values = action_mode.unpadded_actions(result.action, action)
            actions = ActionVectors(values[0] if len(values) == 1 else values, action.domain_name, action.mode)
        return io.NodeOutput(latent, sound_latent, actions)
