"""Cosmos3Reasoner: ask the checkpoint's understanding tower about an image/video, caption it for image-to-video, or
expand a short idea into the structured JSON prompt the generator expects. Output: a STRING for Cosmos3TextEncode.

Glue only over ``cosmos3_core.reasoner.reasoner.Cosmos3Reasoner`` (which mirrors transformers'
``Cosmos3OmniForConditionalGeneration`` / ``Cosmos3EdgeForConditionalGeneration`` ``generate``). The reasoner
shares the loaded transformer's text weights (``handle.get_reasoner()``, cached on the model handle); the vision
encoder and ``lm_head`` are read from the checkpoint folder on first use and sent back to the offload device after
each run. Progress is reported every few tokens, and an interrupt ends the run at the next report. The inputs after
``image`` are optional widgets with defaults, so API graphs written for the earlier stub (model, prompt) still run.
"""

from __future__ import annotations

import comfy.model_management as mm
import comfy.utils
from comfy_api.latest import io

from ..cosmos3_core.checks import check_options
from ..cosmos3_core.reasoner.reasoner import SamplingParams
from ..cosmos3_core.reasoner.tasks import TASKS, postprocess
from ..cosmos3_core.runtime import RuntimeOptions
from .errors import node_errors
from .types import CATEGORY, Cosmos3Model, compile_input

NODE = "Cosmos3Reasoner"

MAX_NEW_TOKENS = 8192
CHECK_EVERY = 4  # tokens between progress updates / interrupt checks (the decode loop's only host syncs)


class Cosmos3Reasoner(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Cosmos3Reasoner",
            display_name="Cosmos3 Reasoner",
            category=CATEGORY,
            description="Runs the checkpoint's reasoner (the understanding tower as a vision-language model): answer "
                        "a question, caption an image/video for image-to-video, or expand an idea into a JSON "
                        "prompt for Cosmos3 Text Encode.",
            inputs=[
                Cosmos3Model.Input("model", tooltip="The loaded checkpoint (its text tower reasons)."),
                io.String.Input("prompt", multiline=True, default="",
                                tooltip="question: what to ask · caption: optional focus · expand: the short idea"),
                io.Image.Input("image", optional=True,
                               tooltip="One image, or a batch of frames read as a video at `fps`."),
                io.Combo.Input("task", options=list(TASKS), default="expand", optional=True,
                               tooltip="question: free answer · caption: describe the image/video as the start of "
                                       "a video · expand: structured JSON prompt for the generator"),
                io.Int.Input("max_new_tokens", default=1024, min=1, max=MAX_NEW_TOKENS, optional=True,
                             tooltip="Most tokens to write; the answer stops earlier at its end token."),
                io.Float.Input("temperature", default=0.7, min=0.0, max=2.0, step=0.05, optional=True,
                               tooltip="0 = greedy (deterministic, ignores top_p/top_k)"),
                io.Float.Input("top_p", default=0.8, min=0.01, max=1.0, step=0.01, optional=True,
                               tooltip="Nucleus sampling: keep the most likely tokens up to this total probability."),
                io.Int.Input("top_k", default=20, min=0, max=1000, optional=True, tooltip="0 = off"),
                io.Float.Input("repetition_penalty", default=1.0, min=0.5, max=2.0, step=0.01, optional=True,
                               tooltip="1 = off; applied over the prompt and the generated tokens"),
                io.Int.Input("seed", default=0, min=0, max=0xFFFFFFFFFFFFFFFF, control_after_generate=True,
                             optional=True, tooltip="Sampling seed (unused when temperature is 0)."),
                io.Float.Input("fps", optional=True, default=24.0, min=0.1, max=240.0, step=0.1,
                               tooltip="Frame rate of an image batch given as video (frames are sampled ~2 per "
                                       "second and timestamped)."),
                compile_input("the decode step, which auto compiles too (fuses each layer's small kernels; on an "
                              "H200 Nano 123 → 210 tokens/s, Edge 265 → 564) after a one-off warm-up of a few "
                              "seconds per process"),
            ],
            outputs=[io.String.Output(display_name="text", tooltip="The answer, caption or JSON prompt.")],
        )

    @classmethod
    def execute(cls, model, prompt: str, image=None, task: str = "expand", max_new_tokens: int = 1024,
                temperature: float = 0.7, top_p: float = 0.8, top_k: int = 20, repetition_penalty: float = 1.0,
                seed: int = 0, fps: float | None = None, compile: str = "auto") -> io.NodeOutput:
        params = SamplingParams(max_new_tokens=int(max_new_tokens), temperature=float(temperature), top_k=int(top_k),
                                top_p=float(top_p), repetition_penalty=float(repetition_penalty),
                                seed=int(seed))
        still = video = None
        fps = float(fps) if fps is not None else 24.0
        with node_errors(NODE):
            if image is not None:
                frames = image.detach().cpu()
                if frames.ndim == 3:
                    frames = frames[None]
                if frames.ndim != 4 or frames.shape[0] < 1:
                    raise ValueError(f"image has shape {tuple(image.shape)}; expected [B, H, W, C].")
                still, video = (frames[0], None) if frames.shape[0] == 1 else (None, frames)
            params.validate()
            options = RuntimeOptions(compile=compile)
            check_options(options)
            reasoner = model.get_reasoner()
            prepared = reasoner.prepare(prompt, task=task, image=still, video=video, fps=fps)

        total = min(params.max_new_tokens, max(reasoner.max_context - prepared.length, 1))
        model.load_text_tower(text_length=prepared.length + total)
        bar = comfy.utils.ProgressBar(total)

        def on_tokens(done: int, _total: int) -> None:
            mm.throw_exception_if_processing_interrupted()
            bar.update_absolute(done, total)

        try:
            with node_errors(NODE):
                ids, _reason = reasoner.generate_ids(prepared, params, callback=on_tokens, check_every=CHECK_EVERY,
                                                     options=options)
        finally:
            reasoner.offload(mm.unet_offload_device())
        bar.update_absolute(total, total)
        text = postprocess(task, reasoner.processor.tokenizer.decode(ids, skip_special_tokens=True))
        if not text.strip():
            raise ValueError(
                f"Cosmos3Reasoner: the model produced no text (stopped by {_reason} after {len(ids)} tokens); "
                "raise max_new_tokens, change the prompt or the seed, or lower the temperature."
            )
        return io.NodeOutput(text)
