"""Custom ComfyUI socket types of the pack (core types — IMAGE, LATENT, AUDIO — are used at the edges)."""

from __future__ import annotations

from comfy_api.latest import io

Cosmos3Model = io.Custom("COSMOS3_MODEL")  # nodes.model_handle.Cosmos3ModelHandle
Cosmos3Text = io.Custom("COSMOS3_TEXT")  # cosmos3_core.pipeline.TextConditioning (both branches' text K/V)
Cosmos3Condition = io.Custom("COSMOS3_CONDITION")  # nodes.condition.ConditionLatents
Cosmos3Sound = io.Custom("COSMOS3_SOUND")  # nodes.sampler.SoundLatent
Cosmos3Action = io.Custom("COSMOS3_ACTION")  # cosmos3_core.modes.action.ActionCondition (action modes)
Cosmos3Actions = io.Custom("COSMOS3_ACTIONS")  # nodes.action.ActionVectors (action vectors [T, width])

CATEGORY = "Cosmos3"
COMPILE_MODES = ["auto", "on", "off"]  # RuntimeOptions.compile (cosmos3_core/runtime.py)


def compile_input(what: str) -> io.Combo.Input:
    """The ``compile`` input of the nodes that run the model (``what``: what ``on`` compiles, and what it gains)."""
    return io.Combo.Input("compile", options=COMPILE_MODES, default="auto", optional=True,
                          tooltip=f"auto: torch.compile where it pays (a CUDA GPU with Triton), kept on disk; on: "
                                  f"{what} (an error where torch.compile cannot run); off: eager.")
