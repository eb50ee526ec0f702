"""Custom ComfyUI socket types of the pack (core types — IMAGE, LATENT, AUDIO — are used at the edges)."""

from __future__ import annotations

from comfy_api.latest import io

from ..cosmos3_core import defaults

Cosmos3Model = io.Custom("COSMOS3_MODEL")  # nodes.model_handle.Cosmos3ModelHandle
Cosmos3Text = io.Custom("COSMOS3_TEXT")  # cosmos3_core.pipeline.TextConditioning (both branches' text K/V)
Cosmos3Condition = io.Custom("COSMOS3_CONDITION")  # cosmos3_core.request.ConditionLatents
Cosmos3Sound = io.Custom("COSMOS3_SOUND")  # nodes.sampler.SoundLatent
Cosmos3Action = io.Custom("COSMOS3_ACTION")  # cosmos3_core.modes.action.ActionCondition (action modes)
Cosmos3Actions = io.Custom("COSMOS3_ACTIONS")  # nodes.action.ActionVectors (action vectors [T, width])

CATEGORY = "Cosmos3"
COMPILE_MODES = ["auto", "on", "off"]  # RuntimeOptions.compile (cosmos3_core/runtime.py)


# ---------------------------------------------------------------------------------------------- shared widgets
# The clip-shape and sampling widgets every node that takes them declares through these (same ids, ranges and steps;
# each node says in its tooltip what the value means there). Their order is the saved workflows' widget order.
def size_inputs(width_tooltip: str, height_tooltip: str | None = None) -> list:
    """``width`` and ``height`` in pixels, multiples of 16 (``defaults.VAE_SPATIAL_STRIDE``)."""
    stride = defaults.VAE_SPATIAL_STRIDE
    return [io.Int.Input("width", default=defaults.WIDTH, min=stride, max=defaults.MAX_SIZE, step=stride,
                         tooltip=width_tooltip),
            io.Int.Input("height", default=defaults.HEIGHT, min=stride, max=defaults.MAX_SIZE, step=stride,
                         tooltip=height_tooltip or width_tooltip.replace("width", "height"))]


def frames_input(tooltip: str, *, default: int = defaults.NUM_FRAMES, minimum: int = 1,
                 maximum: int = defaults.MAX_FRAMES) -> io.Int.Input:
    """``num_frames``: 1 or 4k+1, stepped by the VAE's temporal stride."""
    return io.Int.Input("num_frames", default=default, min=minimum, max=maximum, step=defaults.VAE_TEMPORAL_STRIDE,
                        tooltip=tooltip)


def fps_input(tooltip: str, default: float = defaults.FPS) -> io.Float.Input:
    return io.Float.Input("fps", default=default, min=defaults.MIN_FPS, max=defaults.MAX_FPS, step=0.5,
                          tooltip=tooltip)


def sampling_inputs(*, seed: str, steps: str, cfg: str, shift: str) -> list:
    """``seed``, ``steps``, ``cfg``, ``schedule``, ``shift`` (0: by resolution), with each node's tooltips."""
    return [
        io.Int.Input("seed", default=defaults.SEED, min=0, max=defaults.MAX_SEED, control_after_generate=True,
                     tooltip=seed),
        io.Int.Input("steps", default=defaults.STEPS_VIDEO, min=1, max=defaults.MAX_STEPS, tooltip=steps),
        io.Float.Input("cfg", default=defaults.GUIDANCE, min=1.0, max=defaults.MAX_GUIDANCE, step=0.1, round=0.01,
                       tooltip=cfg),
        io.Combo.Input("schedule", options=list(defaults.SCHEDULES), default=defaults.SCHEDULE,
                       tooltip="flow_shift: linear flow sigmas with the shift below; karras: the checkpoint's "
                               "released scheduler config."),
        io.Float.Input("shift", default=0.0, min=0.0, max=defaults.MAX_SHIFT, step=0.5, tooltip=shift),
    ]


def compile_input(what: str) -> io.Combo.Input:
    """The ``compile`` input of the nodes that run the model (``what``: what ``on`` compiles, and what it gains)."""
    return io.Combo.Input("compile", options=COMPILE_MODES, default="auto", optional=True,
                          tooltip=f"auto: torch.compile where it pays (a CUDA GPU with Triton), kept on disk; on: "
                                  f"{what} (an error where torch.compile cannot run); off: eager.")


MIXED_PRECISION_CHOICES = ["auto", "none", "fp8"]  # auto: the checkpoint's policy (mixed_precision_format None)


def fast_mode_inputs() -> list:
    """The optional fast-mode inputs of the nodes that sample (appended last): SeaCache and an NVIDIA FP8
    checkpoint's step-policy format."""
    return [
        io.Boolean.Input("sea_cache", default=False, optional=True,
                         tooltip="SeaCache (diffusers' step cache): on steps whose spectral indicator barely changes, "
                                 "reuse the layer stack's residual instead of running it. Faster, approximate. Needs 8 "
                                 "or more steps (not for the *-4Step checkpoints)."),
        io.Float.Input("sea_cache_threshold", default=0.25, min=0.0, max=10.0, step=0.05, optional=True,
                       tooltip="SeaCache's accumulated-change budget before the stack runs again; larger reuses "
                               "more steps (diffusers' default 0.25)."),
        io.Combo.Input("mixed_precision_format", options=MIXED_PRECISION_CHOICES, default="auto", optional=True,
                       tooltip="NVIDIA FP8 (ModelOpt) checkpoints: auto follows the checkpoint's step policy, none "
                               "asks W8A8 at every step, fp8 the first/last-3-steps schedule. In ComfyUI the FP8 "
                               "layers run W8A16 (weights dequantized; the log says so); fp8 is refused there."),
    ]


def fast_mode_sampling(sea_cache: bool, sea_cache_threshold: float, mixed_precision_format: str) -> dict:
    """The fast-mode fields of ``request.SamplingRequest`` those inputs ask for."""
    from ..cosmos3_core.sampling.sea_cache import SeaCacheConfig

    if mixed_precision_format not in MIXED_PRECISION_CHOICES:
        raise ValueError(f"mixed_precision_format={mixed_precision_format!r} is not one of "
                         f"{', '.join(MIXED_PRECISION_CHOICES)}.")
    return dict(mixed_precision_format=None if mixed_precision_format == "auto" else mixed_precision_format,
                sea_cache=SeaCacheConfig(threshold=sea_cache_threshold) if sea_cache else None)
