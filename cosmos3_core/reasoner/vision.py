"""The reasoner's eyes: vision encoder loading, CPU-side prompt/pixel preparation and 3-D mRoPE position ids.

Mirrors transformers 5.24.0:

* **Nano/Super** — ``Cosmos3OmniForConditionalGeneration`` (models/cosmos3_omni, a Qwen3-VL subclass): the vision
  tower is ``Qwen3VLVisionModel`` (models/qwen3_vl/modeling_qwen3_vl.py) — patch 16, temporal patch 2, 2×2
  merger, plus *deepstack* mergers whose features are added to the text hidden states after the first decoder
  layers. Processor ``Qwen3VLProcessor`` = ``Qwen2VLImageProcessor`` + ``Qwen3VLVideoProcessor``.
* **Edge** — ``Cosmos3EdgeForConditionalGeneration`` (models/cosmos3_edge): ``Cosmos3EdgeVisionModel`` (SigLIP2-
  style, learned 16×16 position grid resized per frame) + ``Cosmos3EdgePatchMerger`` (LayerNorm, 2×2 group,
  MLP to the text width). Processor ``Cosmos3EdgeProcessor`` (block-major patches, one timestamped span per frame).

The towers are transformers' own modules, loaded from the checkpoint's ``vision_encoder/`` folder by name (flat
``blocks.*``/``merger.*`` Nano keys, ``model.visual.*``/``model.projector.*`` Edge keys; safetensors only).
Pixels are patchified by the checkpoint's own processor classes (``AutoProcessor`` on the repo root, else the
family's processor built around ``text_tokenizer/``), so the number of ``<|image_pad|>``/``<|video_pad|>``
tokens is known when the prompt is rendered. ``mrope_position_ids`` reproduces ``get_rope_index`` of both
models (text runs count up by one; a vision run of grid (t, h, w) gets t/h/w = start + index, then the cursor
advances by max(h, w)/merge; videos are split into one t=1 grid per temporal patch). The encoder returns one
text-space token per merged 2×2 block, in prompt order.
"""

from __future__ import annotations

import itertools
import json
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from ..config import CheckpointError

FAMILIES = ("nano", "edge")
_DROP_CONFIG_KEYS = ("architectures", "transformers_version", "_name_or_path", "dtype", "torch_dtype")


def checkpoint_family(checkpoint_dir: str | Path) -> str:
    """``"edge"`` for relu2 checkpoints (Cosmos3-Edge), else ``"nano"`` (Nano/Super: Qwen3-VL reasoner)."""
    from ..config import Cosmos3Config

    return "edge" if Cosmos3Config.from_checkpoint(checkpoint_dir).hidden_act == "relu2" else "nano"


# --------------------------------------------------------------------------------------------------------------
# Vision encoder


@dataclass
class VisionFeatures:
    """One text-space token per merged 2×2 block (``embeds [N, D]``) + Nano's deepstack features (``[N, D]`` each)."""

    embeds: torch.Tensor
    deepstack: list[torch.Tensor] = field(default_factory=list)


class VisionEncoder(nn.Module):
    """transformers' vision tower (+ Edge projector) behind one call: ``(pixel_values, grid_thw) -> VisionFeatures``."""

    def __init__(self, family: str, visual: nn.Module, projector: nn.Module | None, spatial_merge_size: int):
        super().__init__()
        self.family = family
        self.visual = visual
        self.projector = projector
        self.spatial_merge_size = spatial_merge_size

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @torch.no_grad()
    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> VisionFeatures:
        pixel_values = pixel_values.to(device=self.device, dtype=self.dtype)
        grid_thw = grid_thw.to(self.device)
        if self.family == "nano":
            out = self.visual(pixel_values, grid_thw=grid_thw, return_dict=True)
            return VisionFeatures(out.pooler_output, list(out.deepstack_features or []))
        out = self.visual(pixel_values, grid_thw=grid_thw, return_dict=True)
        return VisionFeatures(self.projector(out.last_hidden_state), [])


def _read_vision_state(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    files = ([folder / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
             if index.is_file() else sorted(folder.glob("*.safetensors")))
    if not files:
        raise CheckpointError(f"{folder}: no *.safetensors weights; the vision_encoder/ download is incomplete.")
    state: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            state.update(load_file(str(path)))
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointError(f"{path} is damaged or truncated ({exc}); download it again.") from exc
    return state


def _strip(state: dict[str, torch.Tensor], prefixes: Sequence[str]) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in state.items():
        for p in prefixes:
            if name.startswith(p):
                name = name[len(p):]
                break
        out[name] = t
    return out


def _assign(module: nn.Module, state: dict[str, torch.Tensor], folder: Path, dtype, device) -> None:
    expected = module.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    bad = [k for k in set(expected) & set(state) if tuple(expected[k].shape) != tuple(state[k].shape)]
    if missing or unexpected or bad:
        raise CheckpointError(
            f"{folder}: vision weights do not match its config.json — {len(missing)} missing (e.g. {missing[:3]}), "
            f"{len(unexpected)} unexpected (e.g. {unexpected[:3]}), {len(bad)} of another shape (e.g. {bad[:3]}).")
    module.load_state_dict({k: v.to(device=device, dtype=dtype) for k, v in state.items()}, strict=True, assign=True)


def _check_materialized(module: nn.Module, folder: Path) -> None:
    left = [n for n, b in module.named_buffers() if b.is_meta]
    if left:
        raise CheckpointError(f"{folder}: buffers {left[:3]} were not materialized; unsupported vision config.")


def _vision_config_dict(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{path} not found; the vision_encoder/ folder is incomplete.")
    try:
        values = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not readable JSON ({exc}).") from exc
    vision = dict(values.get("vision_config") or values)
    for key in _DROP_CONFIG_KEYS + ("model_type",):
        vision.pop(key, None)
    return vision


def has_vision_encoder(checkpoint_dir: str | Path) -> bool:
    return (Path(checkpoint_dir) / "vision_encoder" / "config.json").is_file()


def load_vision_encoder(checkpoint_dir: str | Path, dtype: torch.dtype = torch.bfloat16,
                        device: torch.device | str = "cpu", family: str | None = None) -> VisionEncoder:
    """Build the family's transformers vision tower from ``<checkpoint_dir>/vision_encoder`` and load its weights."""
    folder = Path(checkpoint_dir) / "vision_encoder"
    if not folder.is_dir():
        raise ValueError(f"checkpoint {Path(checkpoint_dir)} has no vision_encoder/ folder, so the reasoner cannot "
                         "look at images or video; download the whole repository or drop the image/video input.")
    family = family or checkpoint_family(checkpoint_dir)
    vision_values = _vision_config_dict(folder)
    state = _read_vision_state(folder)
    if family == "nano":
        from transformers import Qwen3VLVisionConfig, Qwen3VLVisionModel

        cfg = Qwen3VLVisionConfig(**{k: v for k, v in vision_values.items() if not k.startswith("_")})
        cfg._attn_implementation = "sdpa"
        with torch.device("meta"):
            visual = Qwen3VLVisionModel(cfg)
        _assign(visual, _strip(state, ("model.visual.", "visual.", "vision_encoder.")), folder, dtype, device)
        visual.rotary_pos_emb = type(visual.rotary_pos_emb)(cfg).to(device)  # non-persistent inv_freq buffers
        _check_materialized(visual, folder)
        return VisionEncoder("nano", visual.eval(), None, cfg.spatial_merge_size).requires_grad_(False)

    from transformers import Cosmos3EdgeVisionConfig
    from transformers.models.cosmos3_edge.modeling_cosmos3_edge import Cosmos3EdgePatchMerger, Cosmos3EdgeVisionModel

    cfg = Cosmos3EdgeVisionConfig(**{k: v for k, v in vision_values.items() if not k.startswith("_")})
    cfg._attn_implementation = "sdpa"
    visual_state = {k[len("model.visual."):]: v for k, v in state.items() if k.startswith("model.visual.")}
    proj_state = {k[len("model.projector."):]: v for k, v in state.items() if k.startswith("model.projector.")}
    if "linear_fc1.weight" not in proj_state or "linear_fc2.weight" not in proj_state:
        raise CheckpointError(f"{folder}: no model.projector.* weights; this is not a Cosmos3-Edge vision encoder.")
    shape_cfg = types.SimpleNamespace(  # the merger reads only these four numbers
        vision_config=cfg, projector_hidden_size=proj_state["linear_fc1.weight"].shape[0],
        text_config=types.SimpleNamespace(hidden_size=proj_state["linear_fc2.weight"].shape[0]))
    with torch.device("meta"):
        visual = Cosmos3EdgeVisionModel(cfg)
        projector = Cosmos3EdgePatchMerger(shape_cfg)
    _assign(visual, visual_state, folder, dtype, device)
    _assign(projector, proj_state, folder, dtype, device)
    _check_materialized(visual, folder)
    return VisionEncoder("edge", visual.eval(), projector.eval(), cfg.spatial_merge_size).requires_grad_(False)


# --------------------------------------------------------------------------------------------------------------
# Processor and prompt preparation


def load_processor(checkpoint_dir: str | Path, family: str | None = None):
    """The checkpoint's multimodal processor: ``AutoProcessor`` on the repo root (as on the Hub); failing that, the
    family's processor class around ``text_tokenizer/`` with the root's image/video processor configs if present,
    else the reference defaults (Qwen3-VL: patch 16, merge 2, temporal 2, mean/std 0.5; Edge: class defaults)."""
    from transformers import AutoImageProcessor, AutoProcessor, AutoVideoProcessor

    root = Path(checkpoint_dir)
    if (root / "processor_config.json").is_file() or (root / "preprocessor_config.json").is_file():
        try:
            proc = AutoProcessor.from_pretrained(str(root), local_files_only=True)
            if hasattr(proc, "image_processor") and hasattr(proc, "tokenizer"):
                return proc
        except (OSError, ValueError, TypeError, KeyError):
            pass  # e.g. processor configs without tokenizer files at the root: compose below
    from ..sampling.prompt import load_tokenizer

    tok = load_tokenizer(root)

    def configured(auto, filename):
        if not (root / filename).is_file():
            return None
        try:
            return auto.from_pretrained(str(root), local_files_only=True)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"load_processor: {root / filename} could not be loaded: {exc}") from exc

    image = configured(AutoImageProcessor, "preprocessor_config.json")
    video = configured(AutoVideoProcessor, "video_preprocessor_config.json")
    if (family or checkpoint_family(root)) == "nano":
        from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

        half = [0.5, 0.5, 0.5]  # Qwen3-VL's preprocessor_config.json values
        image = image or Qwen2VLImageProcessor(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=half,
                                               image_std=half, size={"shortest_edge": 65536, "longest_edge": 16777216})
        video = video or Qwen3VLVideoProcessor(image_mean=half, image_std=half, cap_pixels_per_frame=False,
                                               size={"shortest_edge": 4096, "longest_edge": 25165824})
        return Qwen3VLProcessor(image_processor=image, tokenizer=tok, video_processor=video,
                                chat_template=tok.chat_template)
    from transformers import Cosmos3EdgeImageProcessor, Cosmos3EdgeProcessor, Cosmos3EdgeVideoProcessor

    return Cosmos3EdgeProcessor(image_processor=image or Cosmos3EdgeImageProcessor(), tokenizer=tok,
                                video_processor=video or Cosmos3EdgeVideoProcessor(), chat_template=tok.chat_template)


def special_token_ids(processor, strict: bool = True) -> dict[str, int]:
    """Ids of the image/video placeholders (from the processor, which reads them off the tokenizer); a missing one
    is an error, or ``-1`` with ``strict=False`` (text-only use)."""
    tok = processor.tokenizer
    out = {}
    for name, attr in (("image", "image_token"), ("video", "video_token")):
        token = getattr(processor, attr, None) or f"<|{name}_pad|>"
        tid = tok.convert_tokens_to_ids(token)
        if tid is None or tid == tok.unk_token_id:
            if strict:
                raise ValueError(f"the checkpoint's tokenizer has no {token} token; it cannot take images or video.")
            tid = -1
        out[name] = int(tid)
    return out


def to_uint8_frames(x, who: str) -> np.ndarray:
    """``[H,W,3]`` / ``[F,H,W,3]`` float in [0, 1] or uint8 (numpy or torch) → uint8 numpy (RGB)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        x = x.numpy() if x.dtype == torch.uint8 else x.float().numpy()
    x = np.asarray(x)
    if x.ndim not in (3, 4) or x.shape[-1] not in (1, 3, 4):
        raise ValueError(f"{who}: expected RGB pixels [H, W, 3] or frames [F, H, W, 3], got shape {tuple(x.shape)}.")
    if x.shape[-1] == 4:
        x = x[..., :3]
    if x.shape[-1] == 1:
        x = np.repeat(x, 3, axis=-1)
    if x.dtype != np.uint8:
        if not np.issubdtype(x.dtype, np.floating):
            raise ValueError(f"{who}: expected float pixels in [0, 1] or uint8, got dtype {x.dtype}.")
        x = np.round(np.clip(x.astype(np.float32), 0.0, 1.0) * 255.0).astype(np.uint8)
    return np.ascontiguousarray(x)


@dataclass
class PreparedPrompt:
    """A rendered, tokenized prompt with its pixels, all on the CPU; ``position_ids [3, L]`` are the mRoPE ids."""

    input_ids: torch.Tensor  # [L] long
    position_ids: torch.Tensor  # [3, L] long
    next_position: int  # mRoPE cursor of the first generated token (max position + 1)
    text: str
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    pixel_values_videos: torch.Tensor | None = None
    video_grid_thw: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return int(self.input_ids.numel())

    @property
    def has_vision(self) -> bool:
        return self.pixel_values is not None or self.pixel_values_videos is not None


def mrope_position_ids(input_ids, image_grid_thw: torch.Tensor | None, video_grid_thw: torch.Tensor | None,
                       image_token_id: int, video_token_id: int, spatial_merge_size: int) -> tuple[torch.Tensor, int]:
    """``get_rope_index`` of Cosmos3Omni/Cosmos3Edge for one sequence → ``([3, L] long, max + 1)``."""
    ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(-1)
    kinds = torch.zeros_like(ids)
    kinds[ids == image_token_id] = 1
    kinds[ids == video_token_id] = 2
    grids = {1: iter([] if image_grid_thw is None else image_grid_thw.tolist()), 2: iter([])}
    if video_grid_thw is not None:  # one t=1 grid per temporal patch: timestamps separate the frames
        grids[2] = iter([[1, h, w] for t, h, w in video_grid_thw.tolist() for _ in range(t)])
    parts, cursor, m = [], 0, spatial_merge_size
    for kind, run in itertools.groupby(kinds.tolist()):
        n = len(list(run))
        if kind == 0:
            parts.append(torch.arange(n).view(1, -1).expand(3, -1) + cursor)
            cursor += n
            continue
        grid = next(grids[kind], None)
        if grid is None or grid[0] * (grid[1] // m) * (grid[2] // m) != n:
            raise ValueError(f"the prompt has a run of {n} {'image' if kind == 1 else 'video'} placeholder tokens "
                             f"that matches no vision grid ({grid}); render prompts with the checkpoint's processor.")
        t, h, w = grid[0], grid[1] // m, grid[2] // m
        tt, hh, ww = torch.meshgrid(torch.arange(t), torch.arange(h) + cursor, torch.arange(w) + cursor, indexing="ij")
        parts.append(torch.stack([tt + cursor, hh, ww]).reshape(3, -1))
        cursor += max(grid[1], grid[2]) // m
    if not parts:
        raise ValueError("the prompt has no tokens.")
    pos = torch.cat(parts, dim=1).long()
    return pos, int(pos.max()) + 1


def prepare_prompt(processor, messages: list[dict[str, Any]], *, images: Sequence = (), videos: Sequence = (),
                   spatial_merge_size: int = 2) -> PreparedPrompt:
    """Render ``messages`` with the processor's chat template, patchify the media and compute mRoPE ids.

    ``images``: RGB ``[H, W, 3]`` arrays (float [0, 1] or uint8); ``videos``: ``(frames [F, H, W, 3], fps)``
    pairs — frames are sampled by the processor (≈2 per second, as the reference) and timestamped from ``fps``.
    Placeholders in ``messages`` (``{"type": "image"}`` / ``{"type": "video"}``) must match the media in order.
    """
    from transformers.video_utils import VideoMetadata

    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    kwargs: dict[str, Any] = {}
    if images:
        kwargs["images"] = [to_uint8_frames(im, "image") for im in images]
    if videos:
        frames, metas = [], []
        for clip, fps in videos:
            clip = to_uint8_frames(clip, "video")
            if clip.ndim != 4 or clip.shape[0] < 2:
                raise ValueError("video: a video needs at least 2 frames [F, H, W, 3]; pass a single frame as image.")
            if not fps or not 0 < float(fps) < float("inf"):
                raise ValueError(f"video: fps must be a positive finite number, got {fps!r}.")
            frames.append(clip)
            metas.append(VideoMetadata(total_num_frames=clip.shape[0], fps=float(fps),
                                       duration=clip.shape[0] / float(fps)))
        kwargs.update(videos=frames, video_metadata=metas, do_sample_frames=True, return_metadata=True)
    enc = processor(text=[text], return_tensors="pt", **kwargs)
    ids = enc["input_ids"][0].long()
    special = special_token_ids(processor)
    image_grid, video_grid = enc.get("image_grid_thw"), enc.get("video_grid_thw")
    positions, next_position = mrope_position_ids(ids, image_grid, video_grid, special["image"], special["video"],
                                                  spatial_merge_size)
    return PreparedPrompt(ids, positions, next_position, text, enc.get("pixel_values"), image_grid,
                          enc.get("pixel_values_videos"), video_grid)


__all__ = ["FAMILIES", "PreparedPrompt", "VisionEncoder", "VisionFeatures", "checkpoint_family", "has_vision_encoder",
           "load_processor", "load_vision_encoder", "mrope_position_ids", "prepare_prompt", "special_token_ids",
           "to_uint8_frames"]
