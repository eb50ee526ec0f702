"""Cosmos3LongVideo: a video past one clip — windowed text/image-to-video, or Transfer from control videos —
written to an mp4 in ComfyUI's output folder while it is generated.

Glue only: ``cosmos3_core.resolve.resolve`` decides the run and ``cosmos3_core.modes.long_video.generate_long``
runs every window; this node places the model
parts through the handle (ComfyUI model management), streams each finished window into the mp4, shows it as a
preview, reports progress per window and step (the cancel point: a cancel leaves a playable mp4 of the finished
windows) and returns the file as a VIDEO (what SaveVideo and the other video nodes take) instead of a giant IMAGE
batch (60 s of 720p would be ~16 GB of float32 frames on the host).
"""

from __future__ import annotations

import os

import comfy.model_management as mm
import comfy.utils
import folder_paths
from comfy_api.latest import InputImpl, io, ui

from ..cosmos3_core import defaults
from ..cosmos3_core.media import OutputError, VideoWriter
from ..cosmos3_core.modes.long_video import generate_long, stopped_writing
from ..cosmos3_core.modes.stream_decode import preview_image
from ..cosmos3_core.modes.transfer import CONTROL_KEYS
from ..cosmos3_core.request import Request
from ..cosmos3_core.resolve import resolve
from ..cosmos3_core.runtime import RuntimeOptions
from ..cosmos3_core.sampling.prompt import WINDOW_PROMPT_SEPARATOR, split_window_prompts
from .errors import node_errors
from .preview import make_previewer
from .types import (
    CATEGORY,
    Cosmos3Model,
    compile_input,
    fast_mode_inputs,
    fast_mode_sampling,
    fps_input,
    frames_input,
    sampling_inputs,
    size_inputs,
)

NODE = "Cosmos3LongVideo"
PROMPT_SEPARATOR = WINDOW_PROMPT_SEPARATOR


class Cosmos3LongVideo(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        controls = [io.Image.Input(key, optional=True, tooltip=f"Transfer: a {key} control video (IMAGE batch, e.g. "
                                   "from ComfyUI's preprocessors); all controls must have the same frames and size.")
                    for key in CONTROL_KEYS]
        return io.Schema(
            node_id=NODE,
            display_name="Cosmos3 Long Video (windows → mp4)",
            category=CATEGORY,
            description="Generates a video of any length as overlapping windows, each seeded by the previous "
                        "window's last frames, and writes it to an mp4 while it runs. With control videos connected "
                        "it is Cosmos3 Transfer (steered by edge/blur/depth/seg/wsm maps).",
            inputs=[
                Cosmos3Model.Input("model", tooltip="The loaded Cosmos3 checkpoint (Load Cosmos3 Checkpoint)."),
                io.String.Input("prompt", multiline=True, default="",
                                tooltip=f"What to generate. One prompt for the whole video, or one per window "
                                        f"separated by lines holding only {PROMPT_SEPARATOR}."),
                io.String.Input("negative_prompt", multiline=True, default="",
                                tooltip="Empty: the checkpoint's negative prompt (text/image-to-video) or none "
                                        "(Transfer, as the reference)."),
                *size_inputs("Video width in pixels (a multiple of 16)."),
                frames_input("Total frames, 4k+1 (721 = 30 s at 24 fps). With control videos: at most this many of "
                             "their frames (all of them when they are shorter).", default=defaults.LONG_NUM_FRAMES,
                             minimum=5, maximum=defaults.MAX_LONG_FRAMES),
                io.Int.Input("frames_per_chunk", default=defaults.NUM_FRAMES, min=5, max=defaults.MAX_FRAMES, step=4,
                             tooltip="Frames generated per window, 4k+1 (one Cosmos3 clip: up to 189)."),
                io.Int.Input("conditional_frames", default=-1, min=-1, max=defaults.MAX_FRAMES,
                             tooltip=f"Frames each window takes from the previous window's end (-1: "
                                     f"{defaults.LONG_CONDITIONAL_FRAMES} for text/image-to-video, "
                                     f"{defaults.TRANSFER_CONDITIONAL_FRAMES} for Transfer)."),
                fps_input("Frame rate the prompt describes and the mp4 is written at."),
                *sampling_inputs(seed="Noise seed of the whole video (one generator feeds every window in order).",
                                 steps="Denoising steps per window.",
                                 cfg="Guidance scale; 1 runs the conditional branch only.",
                                 shift="Flow shift; 0 = by resolution (720p 10, 480p 5, 256p 3)."),
                io.Boolean.Input("sound", default=False,
                                 tooltip="Each window also generates its own sound track (Nano/Super; not with "
                                         "control videos). Tracks are cut at the window seams."),
                io.Float.Input("control_guidance", default=defaults.CONTROL_GUIDANCE, min=0.0,
                               max=defaults.MAX_GUIDANCE, step=0.1, round=0.01,
                               tooltip="Transfer: strength of the controls (1 = as given; other values add a pass "
                                       "without them and extrapolate)."),
                io.String.Input("filename_prefix", default="cosmos3/long_video",
                                tooltip="Where the mp4 goes under ComfyUI's output folder (windows are appended as "
                                        "they finish)."),
                io.Image.Input("image", optional=True, tooltip="Image-to-video: the first window starts from it."),
                io.Image.Input("video", optional=True,
                               tooltip="Its first conditional_frames frames seed the first window."),
                *controls,
                compile_input("the generation layer, which auto compiles too, and the VAE decoder, which auto runs "
                              "compiled only from graphs already on disk"),
                io.Combo.Input("attention", options=["auto", "sdpa", "flash4"], default="auto", optional=True,
                               tooltip="Attention kernels. auto: FlashAttention-4 (if flash-attn-4 is installed) on "
                                       "Hopper GPUs for long sequences, else PyTorch SDPA. sdpa: always SDPA (the "
                                       "reference's route). flash4: require it."),
                *fast_mode_inputs(),
            ],
            outputs=[io.Video.Output(display_name="video",
                                     tooltip="The finished mp4 (already saved in the output folder), for preview or "
                                             "further VIDEO nodes.")],
            is_output_node=True,
        )

    @classmethod
    def execute(cls, model, prompt: str, negative_prompt: str, width: int, height: int, num_frames: int,
                frames_per_chunk: int, conditional_frames: int, fps: float, seed: int, steps: int, cfg: float,
                schedule: str, shift: float, sound: bool, control_guidance: float, filename_prefix: str,
                image=None, video=None, compile: str = "auto", attention: str = "auto", sea_cache: bool = False,
                sea_cache_threshold: float = 0.25, mixed_precision_format: str = "auto",
                **control_inputs) -> io.NodeOutput:
        controls = {k: v for k, v in control_inputs.items() if k in CONTROL_KEYS and v is not None} or None
        prompts = split_window_prompts(prompt)
        with node_errors(NODE):
            if image is not None and image.shape[0] != 1:
                raise ValueError(f"image holds {image.shape[0]} frames; connect one image for image-to-video (or "
                                 "connect the frames to `video`, whose first frames then seed the first window).")
            fast = fast_mode_sampling(sea_cache, sea_cache_threshold, mixed_precision_format)
        request = Request(
            prompt=prompts[0] if len(prompts) == 1 else prompts,
            negative_prompt=negative_prompt if negative_prompt.strip() else None,
            num_frames=num_frames, frames_per_chunk=frames_per_chunk,
            conditional_frames=None if conditional_frames < 0 else conditional_frames, height=height, width=width,
            fps=fps, steps=steps, guidance=cfg, seed=seed, schedule=schedule, shift=shift or None, sound=sound,
            image=None if image is None else image[0], video=video, controls=controls,
            # the widget always sends a value: its default on a node without controls asks for nothing
            control_guidance=None if controls is None and control_guidance == defaults.CONTROL_GUIDANCE
            else control_guidance,
            options=RuntimeOptions(attention=attention, compile=compile, device_type=model.generation_device.type),
            **fast,
        )
        pipe = model.pipeline
        with node_errors(NODE):
            resolved = resolve(request, pipe.info)

        bar = comfy.utils.ProgressBar(1)
        latent_preview = make_previewer(model)

        def progress(k: int, windows: int, step: int, total: int, x0) -> None:
            mm.throw_exception_if_processing_interrupted()
            bar.update_absolute(k * total + step, windows * total, latent_preview(x0) if latent_preview else None)

        folder, filename, counter, subfolder, _ = folder_paths.get_save_image_path(
            filename_prefix, folder_paths.get_output_directory(), width, height)
        file = f"{filename}_{counter:05}_.mp4"
        path = os.path.join(folder, file)
        with node_errors(NODE):
            try:  # closed (playable) on a cancel too; a full disk keeps the windows written whole (fragmented)
                with VideoWriter(path, fps, width, height, audio=sound, fragmented=True) as writer:
                    generate_long(pipe, resolved, [writer.append, _window_preview(bar)], progress=progress,
                                  device=model.generation_device, prepare=model.prepare)
            except OutputError as exc:
                raise ValueError(f"could not write {exc.path} (filename_prefix={filename_prefix!r}): "
                                 f"{stopped_writing(exc, resolved.windows)}") from None
        return io.NodeOutput(InputImpl.VideoFromFile(path),
                             ui=ui.PreviewVideo([ui.SavedResult(file, subfolder, io.FolderType.output)]))


def _window_preview(bar):
    """A sink showing each finished window's last frame on the node's progress bar."""
    def sink(frames, _audio) -> None:
        bar.update_absolute(bar.current, bar.total, ("JPEG", preview_image(frames), 512))
    return sink
