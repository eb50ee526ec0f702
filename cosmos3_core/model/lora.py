"""LoRA files for Cosmos3: read a PEFT-format safetensors file and map it onto the transformer's linear layers.

Mirrors what diffusers 0.42.1 ``PeftAdapterMixin.load_lora_adapter`` accepts for ``Cosmos3OmniTransformer``
(``loaders/peft.py``, ``utils/peft_utils.py``): keys ``[transformer.]<module>.lora_A.weight`` (``[r, in]``) and
``<module>.lora_B.weight`` (``[out, r]``), where ``<module>`` is the diffusers module name — the same names as this
core's parameters (``layers.3.self_attn.add_q_proj``, ``layers.3.mlp_moe_gen.down_proj``, ...). The scale of each
pair is ``lora_alpha / r`` (``lora_alpha / sqrt(r)`` with ``use_rslora``) from the file's ``lora_adapter_metadata``
(PEFT ``LoraConfig`` fields, ``transformer.``-prefixed as diffusers writes them; ``alpha_pattern``/``rank_pattern``
matched like PEFT, by module-name suffix), else ``1`` (PEFT's default ``lora_alpha = r`` when nothing says otherwise).

The result is a plain mapping module name → ``LoraPair``; applying it (``W + strength·scale·B·A``) is the host's
business: ComfyUI patches the weights through its ModelPatcher (``nodes/lora.py``).
Every problem is one ``LoraError`` naming the file, the offending keys and the fix: unknown modules (a LoRA for
another model), ranks that disagree between A and B or shapes that do not fit the layer, unreadable files, DoRA.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

PREFIXES = ("transformer.", "base_model.model.")
METADATA_KEY = "lora_adapter_metadata"


class LoraError(ValueError):
    """A LoRA file that cannot be applied to this checkpoint."""


@dataclass(frozen=True)
class LoraPair:
    down: torch.Tensor  # lora_A [r, in]
    up: torch.Tensor  # lora_B [out, r]
    scale: float  # lora_alpha / r (or / sqrt(r) for rsLoRA)

    @property
    def rank(self) -> int:
        return int(self.down.shape[0])


def _strip(key: str) -> str:
    for prefix in PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix):]
    return key


def _metadata(raw: dict | None, name: str) -> dict:
    if not raw or METADATA_KEY not in raw:
        return {}
    try:
        values = json.loads(raw[METADATA_KEY])
    except json.JSONDecodeError as exc:
        raise LoraError(f"LoRA {name}: its {METADATA_KEY} is not JSON ({exc}); the file is damaged.") from exc
    return {_strip(k): v for k, v in values.items()}


def _pattern_value(patterns: dict, module: str, default):
    for pattern, value in (patterns or {}).items():
        if module == pattern or module.endswith("." + pattern) or re.fullmatch(pattern.lstrip("^"), module):
            return value
    return default


def read_lora(path: str | Path) -> dict[str, LoraPair]:
    """module name → ``LoraPair`` for every pair in a PEFT-format LoRA safetensors file (no model needed)."""
    path = Path(path)
    name = path.name
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            raw_meta = f.metadata()
            tensors = {_strip(k): f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise LoraError(f"LoRA {name} cannot be read ({exc}); it is damaged or not a safetensors file — "
                        "download it again.") from exc
    meta = _metadata(raw_meta, name)
    if meta.get("use_dora") or any(k.endswith("lora_magnitude_vector") for k in tensors):
        raise LoraError(f"LoRA {name} is a DoRA adapter; only plain LoRA (lora_A/lora_B) is supported.")
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    other = []
    for key, tensor in tensors.items():
        m = re.fullmatch(r"(.+)\.lora_([AB])(?:\.default)?\.weight", key)
        if m is None:
            other.append(key)
            continue
        pairs.setdefault(m.group(1), {})[m.group(2)] = tensor
    if other:
        raise LoraError(f"LoRA {name}: {len(other)} keys are not PEFT lora_A/lora_B weights (e.g. {other[:3]}); "
                        "use a LoRA saved by diffusers/PEFT for Cosmos3.")
    if not pairs:
        raise LoraError(f"LoRA {name} holds no lora_A/lora_B weights; it is not a LoRA file.")
    out = {}
    for module, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            missing = "lora_B" if "A" in ab else "lora_A"
            raise LoraError(f"LoRA {name}: {module} has no {missing}.weight; the file is incomplete.")
        down, up = ab["A"], ab["B"]
        if down.ndim != 2 or up.ndim != 2 or down.shape[0] != up.shape[1]:
            raise LoraError(
                f"LoRA {name}: rank mismatch at {module}: lora_A {tuple(down.shape)} and lora_B {tuple(up.shape)} "
                "must be [r, in] and [out, r] with the same r; the file is damaged or not a LoRA for linear layers."
            )
        r = int(down.shape[0])
        rank = _pattern_value(meta.get("rank_pattern"), module, meta.get("r", r))
        alpha = _pattern_value(meta.get("alpha_pattern"), module, meta.get("lora_alpha", rank))
        scale = alpha / math.sqrt(r) if meta.get("use_rslora") else alpha / r
        out[module] = LoraPair(down, up, float(scale))
    return out


def check_fits(lora: dict[str, LoraPair], weights: dict[str, torch.Size], name: str) -> None:
    """Every LoRA module must be a linear layer of this checkpoint (``weights``: module → weight shape) and fit it."""
    unknown = sorted(m for m in lora if m not in weights)
    if unknown:
        raise LoraError(
            f"LoRA {name} does not fit this checkpoint: {len(unknown)} of its {len(lora)} modules are not Cosmos3 "
            f"linear layers (e.g. {unknown[:3]}); it was trained for another model (or another Cosmos3 size)."
        )
    for module, pair in lora.items():
        out_features, in_features = weights[module]
        if pair.up.shape[0] != out_features or pair.down.shape[1] != in_features:
            raise LoraError(
                f"LoRA {name}: {module} is [{out_features}, {in_features}] in this checkpoint but the LoRA gives "
                f"lora_B {tuple(pair.up.shape)} · lora_A {tuple(pair.down.shape)}; it was trained for another "
                "Cosmos3 size (Nano/Edge/Super) — use a LoRA made for this checkpoint."
            )

