"""Cosmos3Reasoner: registered now so workflows can name it; the reasoner lands with issue [4/5]."""

from __future__ import annotations

from comfy_api.latest import io

from .types import CATEGORY, Cosmos3Model


class Cosmos3Reasoner(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Cosmos3Reasoner",
            display_name="Cosmos3 Reasoner",
            category=CATEGORY,
            description="Describe images/video or expand a short idea into a structured prompt (not available yet).",
            is_experimental=True,
            inputs=[
                Cosmos3Model.Input("model"),
                io.String.Input("prompt", multiline=True, default=""),
                io.Image.Input("image", optional=True),
            ],
            outputs=[io.String.Output(display_name="text")],
        )

    @classmethod
    def execute(cls, model, prompt: str, image=None) -> io.NodeOutput:
        raise NotImplementedError(
            f"Cosmos3Reasoner: the reasoner is not available for checkpoint {model.name!r} yet — this version of "
            "the pack has no vision encoder or token decoder. Write the prompt by hand in Cosmos3 Text Encode."
        )
