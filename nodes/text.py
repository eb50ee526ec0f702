"""Cosmos3TextEncode: prompt + negative prompt + clip shape → both guidance branches' cached text K/V.

The text tower runs here and only here. ComfyUI caches this node's output, so re-queuing with a new seed, step
count or guidance re-uses the K/V without touching the text tower. The clip shape set here (width, height,
frames, fps) is what the prompts describe and what every downstream node reads.
"""

from __future__ import annotations

import comfy.model_management as mm
from comfy_api.latest import io

from ..cosmos3_core import defaults
from ..cosmos3_core.resolve import resolve_clip
from ..cosmos3_core.runtime import RuntimeOptions
from .errors import node_errors
from .types import CATEGORY, Cosmos3Model, Cosmos3Text, fps_input, frames_input, size_inputs


class Cosmos3TextEncode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Cosmos3TextEncode",
            display_name="Cosmos3 Text Encode",
            category=CATEGORY,
            description="Runs the understanding tower once over the prompt and the negative prompt; the sampler "
                        "re-uses their K/V at every step.",
            inputs=[
                Cosmos3Model.Input("model", tooltip="The loaded checkpoint (its text tower runs here)."),
                io.String.Input("prompt", multiline=True, default="",
                                tooltip="What to generate. Long structured (JSON) prompts work best."),
                io.String.Input("negative_prompt", multiline=True, default="",
                                tooltip="Leave empty to use the checkpoint's assets/negative_prompt.json "
                                        "(or no negative prompt when the checkpoint has none). Must stay empty "
                                        "for a distilled (*-4Step) checkpoint: it has no negative branch."),
                *size_inputs("Clip width in pixels (a multiple of 16); every downstream node uses it."),
                frames_input("1 for an image, else 4k+1 (93, 121, 189, …)."),
                fps_input("Frame rate the prompt describes and the video is made for."),
                io.Boolean.Input("one_pass", default=False, optional=True,
                                 tooltip=f"Allow num_frames above one clip ({defaults.NUM_FRAMES}) as a single pass "
                                         "(the models were trained on clips up to that length). Longer videos are "
                                         "made in windows by Cosmos3 Long Video."),
            ],
            outputs=[Cosmos3Text.Output(display_name="text",
                                        tooltip="Both guidance branches' cached text K/V and the clip shape.")],
        )

    @classmethod
    def execute(cls, model, prompt: str, negative_prompt: str, width: int, height: int, num_frames: int,
                fps: float, one_pass: bool = False) -> io.NodeOutput:
        pipe = model.pipeline
        shape = dict(num_frames=num_frames, height=height, width=width, fps=fps)
        negative = negative_prompt if negative_prompt.strip() else None
        with node_errors("Cosmos3TextEncode"):
            resolve_clip(prompt, negative, **shape, checkpoint=pipe.info, one_pass=one_pass)
            ids = pipe.tokenize(prompt, negative, **shape)
        model.load_text_tower(text_length=ids.prefill_tokens)
        text = pipe.prefill_prompts(ids, **shape, options=RuntimeOptions())
        return io.NodeOutput(text.to(mm.intermediate_device()))
