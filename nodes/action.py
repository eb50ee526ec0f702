"""Action (world-model) nodes: Cosmos3ActionCondition, Cosmos3SaveActions, Cosmos3LoadActions.

Cosmos3ActionCondition turns IMAGE frames (+ actions for forward dynamics) and the fields of diffusers'
``CosmosActionCondition`` into the two things the sampler needs: the action condition (clean latents, clean actions,
embodiment) and the text K/V of the action caption (a JSON document describing the clip, as the action models were
trained; no metadata templates). Wire both outputs into Cosmos3 KSampler UniPC (Dual Tower) — ``text`` and
``action`` — and take the sampler's ``actions`` output into Cosmos3 Save Actions. All decisions live in
``cosmos3_core.modes.action``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import comfy.model_management as mm
import folder_paths
import torch
from comfy_api.latest import io

from ..cosmos3_core import defaults
from ..cosmos3_core.modes import action as core
from ..cosmos3_core.request import ActionRequest
from ..cosmos3_core.resolve import resolve_action
from ..cosmos3_core.runtime import RuntimeOptions
from .errors import node_errors
from .types import CATEGORY, Cosmos3Action, Cosmos3Actions, Cosmos3Model, Cosmos3Text

ACTION_FILE_SUFFIXES = (".npy", ".json", ".safetensors")
NO_VIEW_POINT = "none"


@dataclass(frozen=True)
class ActionVectors:
    """Action vectors between nodes: ``values`` ``[T, raw_action_dim]`` float32 on the CPU."""

    values: torch.Tensor
    domain_name: str | None = None
    mode: str | None = None


class Cosmos3ActionCondition(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Cosmos3ActionCondition",
            display_name="Cosmos3 Action Condition",
            category=CATEGORY,
            description="World-model modes: policy (start frame + prompt → future video + actions), forward dynamics "
                        "(start frame + actions → video), inverse dynamics (video → actions). Encodes the frames and "
                        "the prompt's action caption; feed both outputs to Cosmos3 KSampler UniPC "
                        "(Dual Tower).",
            inputs=[
                Cosmos3Model.Input("model", tooltip="The loaded checkpoint (trained with an action head)."),
                io.Image.Input("image", tooltip="Policy / forward dynamics: the start frame (the first of a batch). "
                                                "Inverse dynamics: exactly chunk_size + 1 frames."),
                io.Combo.Input("mode", options=list(core.ACTION_MODES), default="policy",
                               tooltip="policy: frame + instruction → video and actions; forward dynamics: frame + "
                                       "actions → video; inverse dynamics: clip → actions."),
                io.Combo.Input("domain_name", options=list(core.DOMAINS), default=defaults.ACTION_DOMAIN,
                               tooltip="Embodiment: selects the action head's weights and the action width."),
                io.Int.Input("chunk_size", default=defaults.ACTION_CHUNK_SIZE, min=4, max=defaults.MAX_FRAMES - 1,
                             step=4, tooltip="Actions per chunk, a multiple of 4; the clip spans chunk_size + 1 "
                                             "frames."),
                io.Combo.Input("resolution_tier", options=[str(t) for t in core.RESOLUTION_TIERS],
                               default=str(defaults.ACTION_RESOLUTION_TIER),
                               tooltip="Canvas tier; pick the one closest to the input's native resolution "
                                       "(frames are only downscaled, never upscaled)."),
                io.Combo.Input("view_point", options=list(core.VIEW_POINTS) + [NO_VIEW_POINT],
                               default=defaults.ACTION_VIEW_POINT, tooltip="Camera framing sentence of the caption."),
                io.String.Input("prompt", multiline=True, default="", tooltip="What the agent does (policy)."),
                io.String.Input("negative_prompt", multiline=True, default="",
                                tooltip="Used raw (only with cfg > 1 on the sampler)."),
                io.Float.Input("fps", default=defaults.ACTION_FPS, min=1.0, max=120.0, step=0.5,
                               tooltip="Frame rate the action models were trained at (5)."),
                io.Boolean.Input("use_system_prompt", default=defaults.ACTION_USE_SYSTEM_PROMPT,
                                 tooltip="Prepend the checkpoint's system prompt (the action models use none)."),
                Cosmos3Actions.Input("actions", optional=True,
                                     tooltip="Forward dynamics: chunk_size actions (Cosmos3 Load Actions)."),
            ],
            outputs=[Cosmos3Text.Output(display_name="text", tooltip="The instruction's text K/V; to the sampler."),
                     Cosmos3Action.Output(display_name="action", tooltip="The action stream; to the sampler.")],
        )

    @classmethod
    def execute(cls, model, image: torch.Tensor, mode: str, domain_name: str, chunk_size: int,
                resolution_tier: str, view_point: str, prompt: str, negative_prompt: str, fps: float,
                use_system_prompt: bool, actions: ActionVectors | None = None) -> io.NodeOutput:
        who = "Cosmos3ActionCondition"
        with node_errors(who):
            if not isinstance(image, torch.Tensor) or image.ndim != 4 or image.shape[-1] not in (3, 4):
                shape = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
                raise ValueError(f"image has shape {shape}; expected a ComfyUI IMAGE [frames, H, W, 3].")
            if actions is not None and actions.domain_name not in (None, domain_name):
                raise ValueError(f"the actions are for domain_name={actions.domain_name!r} but domain_name is "
                                 f"{domain_name!r}; pick the embodiment the actions were recorded with.")
        frames = image[..., :3]
        request = ActionRequest(
            mode=mode, chunk_size=chunk_size, domain_name=domain_name,
            resolution_tier=int(resolution_tier) if str(resolution_tier).isdigit() else resolution_tier,
            raw_actions=None if actions is None else actions.values,
            image=frames[0] if frames.shape[0] == 1 else None, video=frames if frames.shape[0] > 1 else None,
            view_point=None if view_point == NO_VIEW_POINT else view_point,
        )
        pipe = model.pipeline
        with node_errors(who):
            resolve_action(pipe.info, request, prompt, negative_prompt, fps)
            model.load_vae(core.encode_latent_shape(request, pipe.vae))
            condition = core.encode_action_condition(pipe.vae, request, pipe.config)
            ids = core.action_prompt_ids(pipe.tokenizer, condition, prompt, negative_prompt, fps=fps,
                                         use_system_prompt=use_system_prompt)
        model.load_text_tower(text_length=ids.prefill_tokens)
        text = core.prefill(pipe, ids, condition, fps=fps, options=RuntimeOptions())
        out = mm.intermediate_device()
        return io.NodeOutput(text.to(out), condition.to(out))


class Cosmos3SaveActions(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Cosmos3SaveActions",
            display_name="Cosmos3 Save Actions",
            category=CATEGORY,
            description="Writes the sampler's predicted actions [chunk_size, action width] to the output folder "
                        "as JSON ({domain_name, mode, actions}) or .npy.",
            inputs=[
                Cosmos3Actions.Input("actions", tooltip="The sampler's predicted actions."),
                io.String.Input("filename_prefix", default="cosmos3/actions",
                                tooltip="File name prefix under ComfyUI's output folder."),
                io.Combo.Input("format", options=["json", "npy"], default="json",
                               tooltip="json: {\"actions\": [[...], ...]}; npy: a NumPy array."),
            ],
            outputs=[],
            is_output_node=True,
        )

    @classmethod
    def execute(cls, actions: ActionVectors | None, filename_prefix: str, format: str) -> io.NodeOutput:
        with node_errors("Cosmos3SaveActions"):  # a full disk too: one message, no file left
            if actions is None:
                raise ValueError("the sampler predicted no actions — only policy and inverse dynamics do (forward "
                                 "dynamics takes actions; other modes have none).")
            if format not in ("json", "npy"):
                raise ValueError(f"format={format!r} is not one of ['json', 'npy'].")
            output_dir = folder_paths.get_output_directory()
            folder, name, counter, subfolder, _ = folder_paths.get_save_image_path(filename_prefix, output_dir)
            filename = f"{name}_{counter:05}_.{format}"
            core.save_actions(os.path.join(folder, filename), actions.values, domain_name=actions.domain_name,
                              mode=actions.mode)
        return io.NodeOutput(ui={"actions": [{"filename": filename, "subfolder": subfolder, "type": "output"}]})


class Cosmos3LoadActions(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        files = sorted(f for f in os.listdir(folder_paths.get_input_directory())
                       if f.lower().endswith(ACTION_FILE_SUFFIXES)) if os.path.isdir(
            folder_paths.get_input_directory()) else []
        return io.Schema(
            node_id="Cosmos3LoadActions",
            display_name="Cosmos3 Load Actions",
            category=CATEGORY,
            description="Reads actions [T, action width] from ComfyUI's input folder: .npy, .json (a list of rows "
                        "or {\"actions\": rows}, as Cosmos3 Save Actions writes) or .safetensors.",
            inputs=[io.Combo.Input("file", options=files, tooltip="A file in ComfyUI/input.")],
            outputs=[Cosmos3Actions.Output(display_name="actions",
                                           tooltip="The actions, rows of the embodiment's width.")],
        )

    @classmethod
    def execute(cls, file: str) -> io.NodeOutput:
        with node_errors("Cosmos3LoadActions"):
            values, meta = core.load_actions_with_metadata(input_file(file))
        return io.NodeOutput(ActionVectors(torch.from_numpy(values), meta.get("domain_name"), meta.get("mode")))

    @classmethod
    def fingerprint_inputs(cls, file: str):
        try:
            path = input_file(file)
        except ValueError:
            return file  # execute says what is wrong
        return os.path.getmtime(path) if os.path.isfile(path) else file


def input_file(file) -> str:
    """The path of ``file`` inside ComfyUI's input folder, as the list of Cosmos3 Load Actions shows it (a name,
    or a path below the folder); any other path — absolute, climbing out with ``..``, or another folder's
    ``[output]`` / ``[temp]`` annotation — is refused, as ComfyUI's own loaders only read their folders."""
    root = os.path.abspath(folder_paths.get_input_directory())
    name = file if isinstance(file, str) else None
    if name and name.endswith(" [input]"):
        name = name[: -len(" [input]")]
    inside = bool(name) and not os.path.isabs(name) and ".." not in name.replace("\\", "/").split("/")
    path = os.path.abspath(os.path.join(root, name)) if inside else root
    if not path.startswith(root + os.sep):
        raise ValueError(f"file={file!r} is not a file in ComfyUI's input folder; put the actions file "
                         f"({', '.join(ACTION_FILE_SUFFIXES)}) in {root} and pick it from the list.")
    return path
