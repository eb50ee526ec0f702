"""Cosmos3 transformer configuration, read from a checkpoint's ``transformer/config.json``.

Mirrors the constructor of diffusers 0.42.1 ``Cosmos3OmniTransformer`` (``@register_to_config``): the same field
names and the same defaults (the released Nano values), so a Hub ``config.json`` maps onto it one to one. Nano,
Super and Edge differ only by values:

* Nano  — hidden 4096, 36 layers, 32/8 heads, SwiGLU (``silu``), Qwen-style RMSNorm, text QK-norm, sound head.
* Super — hidden 5120, 64 layers, 64/8 heads: the query width (64·128 = 8192) is not the hidden size.
* Edge  — hidden 2048, 28 layers, ``relu2`` MLP, Nemotron RMSNorm (fp32 weight multiply), no text QK-norm but an
  extra ``k_norm_und_for_gen`` on the text keys the generation tower reads, θ = 1e8, no sound head.

Unknown keys (the Hub files carry legacy ones such as ``model_type`` or ``use_moe``) are ignored; a missing key
that has no default, or a value of the wrong kind, is an error naming the file and the key.

Checkpoints of the family that diffusers 0.42.1 cannot run, and so neither can this pack, are refused by name
before anything loads (``unsupported_checkpoint``): their transformer config carries the export contract of another
architecture — Cosmos3-Nano-Sim-Transfer and -Sim-Bimanual (``cosmos3_nano_sim_bimanual``, formerly
``cosmos_dreams``: causal chunk-by-chunk rollouts over a K/V history, 4-step self-forcing students),
Cosmos3-Nano-Sim-Auto (``cosmos3_nano_sim_auto``) and Cosmos3-Nano-Transfer-Auto (``backbone_type:
cosmos3_multiview`` with a ``multiview`` block: block-sparse cross-camera attention and rig view embeddings). The
markers are the ones vLLM-Omni's and SGLang's loaders for those models read.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# Weight dtypes by the names the CLIs and nodes offer.
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class CheckpointError(ValueError):
    """A checkpoint folder or file is missing, damaged or belongs to another model."""


@dataclass(frozen=True)
class Cosmos3Config:
    """Architecture of one Cosmos3 Mixture-of-Transformers checkpoint (defaults = Nano)."""

    hidden_size: int = 4096
    intermediate_size: int = 12288
    num_hidden_layers: int = 36
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    attention_bias: bool = False
    hidden_act: str = "silu"  # "silu" (SwiGLU, Nano/Super) or "relu2" (Edge)
    rms_norm_eps: float = 1e-6
    qk_norm_for_text: bool = True
    use_und_k_norm_for_gen: bool = False
    rope_theta: float = 5e6
    rope_scaling: dict | None = None
    rope_axes_dim: tuple[int, int, int] | None = None  # resolved in __post_init__ (mrope_section)
    vocab_size: int = 151936
    latent_channel: int = 48
    latent_patch_size: int = 2
    patch_latent_dim: int = 192
    base_fps: int = 24
    enable_fps_modulation: bool = True
    unified_3d_mrope_reset_spatial_ids: bool = True
    unified_3d_mrope_temporal_modality_margin: int = 15000
    timestep_scale: float = 0.001
    sound_gen: bool = False
    sound_dim: int | None = None
    sound_latent_fps: float = 25.0
    action_gen: bool = False
    action_dim: int | None = None
    num_embodiment_domains: int = 32
    source: str = field(default="<defaults>", compare=False, repr=False)

    def __post_init__(self) -> None:
        axes = self.rope_axes_dim
        if axes is None:
            axes = (self.rope_scaling or {}).get("mrope_section", [24, 20, 20])
        object.__setattr__(self, "rope_axes_dim", tuple(int(a) for a in axes))
        where = self.source
        if self.hidden_act not in ("silu", "relu2"):
            raise CheckpointError(f"{where}: hidden_act={self.hidden_act!r} is not a Cosmos3 value (silu or relu2).")
        if sum(self.rope_axes_dim) * 2 != self.head_dim:
            raise CheckpointError(
                f"{where}: rope sections {list(self.rope_axes_dim)} must sum to head_dim/2 = {self.head_dim // 2}."
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise CheckpointError(
                f"{where}: num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}."
            )
        if self.patch_latent_dim != self.latent_channel * self.latent_patch_size**2:
            raise CheckpointError(
                f"{where}: patch_latent_dim={self.patch_latent_dim} must equal latent_channel·patch² = "
                f"{self.latent_channel * self.latent_patch_size ** 2}."
            )
        if self.sound_gen and not self.sound_dim:
            raise CheckpointError(f"{where}: sound_gen is true but sound_dim is missing.")
        if self.action_gen and not self.action_dim:
            raise CheckpointError(f"{where}: action_gen is true but action_dim is missing.")

    # ------------------------------------------------------------------ derived
    @property
    def norm_kind(self) -> str:
        """``"nemotron"`` for relu2 models (Edge), ``"qwen"`` otherwise — they round at different points."""
        return "nemotron" if self.hidden_act == "relu2" else "qwen"

    @property
    def family(self) -> str:
        """Which released model this geometry is: ``Edge`` (the relu2 MLP), ``Super`` (8 query heads per K/V head:
        64/8) or ``Nano`` (32/8) — the geometry, whatever the folder is called. The tiny test checkpoints keep the
        marks (Super-shaped 8/1, Nano-shaped 4/2)."""
        if self.hidden_act == "relu2":
            return "Edge"
        return "Super" if self.num_attention_heads >= 8 * self.num_key_value_heads else "Nano"

    @property
    def q_width(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_key_value_heads * self.head_dim

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "<dict>") -> "Cosmos3Config":
        known = [f.name for f in dataclasses.fields(cls) if f.name != "source"]
        kwargs: dict[str, Any] = {}
        for name in known:
            if name not in values:
                continue
            value = values[name]
            expected = _KINDS.get(name)
            if expected is not None and value is not None and not isinstance(value, expected):
                raise CheckpointError(
                    f"{source}: key {name!r} has value {value!r} of type {type(value).__name__}; "
                    f"expected {' or '.join(t.__name__ for t in expected)}."
                )
            kwargs[name] = value
        return cls(**kwargs, source=source)

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str | Path) -> "Cosmos3Config":
        """Read ``<checkpoint_dir>/transformer/config.json`` (or a ``transformer`` folder given directly)."""
        path = transformer_dir(checkpoint_dir) / "config.json"
        if (path.exists() or path.is_symlink()) and not path.is_file():
            raise CheckpointError(
                f"{path} exists but is not a readable file (a folder or a broken link); replace it with the "
                "checkpoint's transformer/config.json."
            )
        if not path.is_file():
            raise CheckpointError(
                f"{path} not found: a Cosmos3 checkpoint folder holds transformer/config.json "
                "(download the whole nvidia/Cosmos3-* repository folder, not single files)."
            )
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(
                f"{path} is not readable JSON ({exc}); fix its permissions or download it again."
            ) from exc
        if not isinstance(values, dict):
            raise CheckpointError(f"{path} holds a JSON {type(values).__name__}, not a config object; download it "
                                  "again.")
        unsupported = unsupported_checkpoint(values)
        if unsupported:
            raise CheckpointError(f"{path.parent.parent}: {unsupported}")
        class_name = values.get("_class_name")
        if class_name is not None and class_name != "Cosmos3OmniTransformer":
            raise CheckpointError(
                f"{path} describes a {class_name!r}, not a Cosmos3OmniTransformer: this folder holds another model."
            )
        for required in _REQUIRED:
            if required not in values:
                raise CheckpointError(f"{path}: required key {required!r} is missing.")
        return cls.from_dict(values, source=str(path))


_NOT_RUN = ("diffusers 0.42.1 has no pipeline for it, and this pack runs what diffusers runs (the bidirectional "
             "Cosmos3 models: Nano, Super, Edge, their 4-step and policy checkpoints); run as one of those it "
             "would give wrong video, so it is refused before loading. Run it with NVIDIA's cosmos-framework or "
             "vLLM-Omni.")
_CAUSAL = ("a causal model that generates the video chunk by chunk (4 latent frames at a time after the first, each "
           "attending to the K/V of the chunks already committed) with a 4-step self-forcing schedule, ")


def unsupported_checkpoint(config: dict[str, Any]) -> str | None:
    """Why a ``transformer/config.json`` (as a dict) belongs to a Cosmos3 model this pack cannot run, or ``None``."""
    sim = config.get("cosmos3_nano_sim_bimanual") or config.get("cosmos_dreams")
    if isinstance(sim, dict):
        conditioning = sim.get("conditioning") if isinstance(sim.get("conditioning"), dict) else {}
        if conditioning.get("mode") == "control_video":
            return ("this is Cosmos3-Nano-Sim-Transfer, " + _CAUSAL + "driven by one control video (edge, blur, "
                    "depth or seg) whose chunks the target attends causally; diffusers' Transfer pipeline denoises "
                    "the whole clip at once with UniPC and its distilled pipeline takes no control video. " + _NOT_RUN)
        return ("this is Cosmos3-Nano-Sim-Bimanual, " + _CAUSAL + "conditioned on robot actions as per-frame tokens "
                "interleaved with the video tokens; diffusers' action pipeline denoises one clip at once. " + _NOT_RUN)
    if isinstance(config.get("cosmos3_nano_sim_auto"), dict):
        return ("this is Cosmos3-Nano-Sim-Auto, the causal chunk-by-chunk version of Cosmos3-Nano-Transfer-Auto "
                "(several driving cameras, optional LiDAR). " + _NOT_RUN)
    if config.get("backbone_type") == "cosmos3_multiview" or isinstance(config.get("multiview"), dict):
        return ("this is Cosmos3-Nano-Transfer-Auto, a multi-camera driving model: up to 11 cameras in one sequence "
                "with block-sparse cross-camera attention, a rig view embedding per camera (rig_view_embed), one "
                "caption per camera and optional LiDAR (lidar_vae/); diffusers runs one camera. " + _NOT_RUN)
    return None


# Keys every real transformer/config.json carries; a file without them is not a Cosmos3 transformer config.
_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size")

_INT = (int,)
_FLOAT = (int, float)
_BOOL = (bool,)
_KINDS: dict[str, tuple[type, ...]] = {
    "hidden_size": _INT, "intermediate_size": _INT, "num_hidden_layers": _INT, "num_attention_heads": _INT,
    "num_key_value_heads": _INT, "head_dim": _INT, "vocab_size": _INT, "latent_channel": _INT,
    "latent_patch_size": _INT, "patch_latent_dim": _INT, "base_fps": _FLOAT, "num_embodiment_domains": _INT,
    "unified_3d_mrope_temporal_modality_margin": _INT, "rms_norm_eps": _FLOAT, "rope_theta": _FLOAT,
    "timestep_scale": _FLOAT, "sound_latent_fps": _FLOAT, "attention_bias": _BOOL, "qk_norm_for_text": _BOOL,
    "use_und_k_norm_for_gen": _BOOL, "enable_fps_modulation": _BOOL, "sound_gen": _BOOL, "action_gen": _BOOL,
    "unified_3d_mrope_reset_spatial_ids": _BOOL, "hidden_act": (str,), "rope_scaling": (dict,),
    "rope_axes_dim": (list, tuple),
}


def transformer_dir(checkpoint_dir: str | Path) -> Path:
    root = Path(checkpoint_dir)
    return root if root.name == "transformer" else root / "transformer"
