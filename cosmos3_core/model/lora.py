"""LoRA-family files for Cosmos3: read LoRA, LoKr and LoHa safetensors files as trainers save them, map their keys
onto the transformer's linear layers (diffusers module names, the same as this core's parameters:
``layers.3.self_attn.add_q_proj``, ``layers.3.mlp_moe_gen.down_proj``, ``proj_in``, ...) and compute each layer's
weight change.

Formats, each with the definition it follows (``s`` is the layer's scale, ``strength`` the user's multiplier;
the patched weight is ``W + strength · s · ΔW``):

* **LoRA**, ``ΔW = up · down``: PEFT/diffusers ``<m>.lora_A[.default].weight`` ``[r, in]`` + ``<m>.lora_B…``
  ``[out, r]`` (diffusers 0.42.1 ``load_lora_adapter``), ``s = lora_alpha / r`` (``/ sqrt(r)`` with ``use_rslora``)
  from the file's ``lora_adapter_metadata`` (PEFT ``LoraConfig`` fields, ``transformer.``-prefixed as diffusers
  writes them; ``alpha_pattern``/``rank_pattern`` matched like PEFT, by module-name suffix) or, for PEFT's own
  ``adapter_model.safetensors``, the ``adapter_config.json`` beside it; else ``1``. kohya/LyCORIS LoCon
  ``<m>.lora_down.weight`` / ``lora_up.weight`` with a per-layer ``alpha`` tensor: ``s = alpha / r``.
* **LoKr** (LyCORIS 4.1.3 ``modules/lokr.py``, the format SimpleTuner trains Cosmos3 with), ``ΔW = kron(W1, W2)``:
  ``W1 = lokr_w1`` or ``lokr_w1_a · lokr_w1_b``; ``W2 = lokr_w2`` or ``lokr_w2_a · lokr_w2_b`` or, Tucker,
  ``lokr_w2_aᵀ · lokr_t2 · lokr_w2_b``. ``s = alpha / r`` with ``r`` the rank of the factorised side; ``1`` when
  both sides are full matrices (LyCORIS ignores alpha then).
* **LoHa** (LyCORIS ``modules/loha.py``), ``ΔW = (hada_w1_a · hada_w1_b) ⊙ (hada_w2_a · hada_w2_b)`` (Tucker:
  ``hada_wi_aᵀ · hada_ti · hada_wi_b``), ``s = alpha / r``, ``r`` = rows of ``hada_w1_b``.

For LoCon, LoKr and LoHa a missing or zero ``alpha`` means ``alpha = r`` (``s = 1``), as LyCORIS and kohya define it.
Key prefixes: ``transformer.``, ``base_model.model.``, ``diffusion_model.`` (dotted module names) and ``lora_unet_``,
``lycoris_``, ``lora_transformer_`` (dots written as underscores, resolved against the checkpoint's layer names).
One file may mix formats layer by layer (LyCORIS presets do). Other adapter formats (DoRA, OFT/BOFT, GLoRA, IA3,
full diffs, ...) are refused by name.

``read_lora`` returns module name → ``LoraPatch``; ``LoraPatch.delta()`` is ``s · ΔW`` and ``merge_lora`` adds
``strength · s · ΔW`` into a core model's weights (the library path; a tensor-parallel model's shards each take
their slice of it). ComfyUI computes the same deltas itself
through its weight adapters (``nodes/lora.py``). Every problem is one ``LoraError`` naming the file, the offending
key or value and the fix: unreadable files, non-finite tensors, bad alpha/rank values, unknown formats, keys for
layers this checkpoint lacks, shapes that do not fit.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch.distributed.tensor import DTensor

DOTTED_PREFIXES = ("transformer.", "base_model.model.", "diffusion_model.")
FLAT_PREFIXES = ("lora_unet_", "lycoris_", "lora_transformer_")
METADATA_KEY = "lora_adapter_metadata"
SUPPORTED = ("LoRA (PEFT/diffusers lora_A/lora_B, kohya/LyCORIS lora_down/lora_up), LyCORIS LoKr (lokr_*) and "
             "LyCORIS LoHa (hada_*)")

# key suffix → (format, part)
PARTS = {
    "lora_A.weight": ("lora", "down"), "lora_B.weight": ("lora", "up"),
    "lora_A.default.weight": ("lora", "down"), "lora_B.default.weight": ("lora", "up"),
    "lora_down.weight": ("lora", "down"), "lora_up.weight": ("lora", "up"),
    **{f"lokr_{p}": ("lokr", p) for p in ("w1", "w1_a", "w1_b", "w2", "w2_a", "w2_b", "t2")},
    **{f"hada_{p}": ("loha", p) for p in ("w1_a", "w1_b", "w2_a", "w2_b", "t1", "t2")},
    "alpha": (None, "alpha"),
}
# key suffix → the format it belongs to, for the formats refused by name
UNSUPPORTED = {
    "dora_scale": "DoRA (dora_scale)", "lora_magnitude_vector": "DoRA (PEFT lora_magnitude_vector)",
    "lora_magnitude_vector.weight": "DoRA (PEFT lora_magnitude_vector)",
    "oft_blocks": "OFT/BOFT (LyCORIS oft_blocks)", "rescale": "OFT/BOFT (LyCORIS rescale)",
    "oft_r": "OFT (PEFT oft_r)", "oft_R": "OFT (oft_R)", "boft_R": "BOFT (PEFT boft_R)", "boft_s": "BOFT (PEFT boft_s)",
    **{f"{p}.weight": "GLoRA" for p in ("a1", "a2", "b1", "b2", "bm")},
    "on_input": "IA3 (LyCORIS)", "ia3_l": "IA3 (PEFT ia3_l)", "ia3_l.weight": "IA3 (PEFT ia3_l)",
    "diff": "full weight difference (diff)", "diff_b": "full bias difference (diff_b)",
    "set_weight": "weight replacement (set_weight)",
    "w_norm": "norm-layer tuning (w_norm)", "b_norm": "norm-layer tuning (b_norm)",
    "lora_mid.weight": "LoCon Tucker (lora_mid, for convolutions)", "lokr_t1": "LoKr Tucker t1 (for convolutions)",
    "lora_embedding_A": "PEFT embedding LoRA", "lora_embedding_B": "PEFT embedding LoRA",
    "vera_lambda_b": "VeRA", "vera_lambda_d": "VeRA",
    "lambda_layer": "T-LoRA", "q_layer.weight": "T-LoRA", "p_layer.weight": "T-LoRA",
}
# this checkpoint's own layers that are not patchable linear layers of the towers
UNPATCHABLE = {"lm_head": "output layer (lm_head, the reasoner's vocabulary projection)",
               "embed_tokens": "token embedding (embed_tokens)"}
_SUFFIXES = sorted([*PARTS, *UNSUPPORTED], key=len, reverse=True)


class LoraError(ValueError):
    """A LoRA file that cannot be applied to this checkpoint."""


@dataclass(frozen=True)
class LoraPatch:
    """One linear layer's adapter: ``kind`` ("lora" | "lokr" | "loha"), its tensors by part name (lora: ``up``,
    ``down``; lokr: ``w1``/``w1_a``/``w1_b``, ``w2``/``w2_a``/``w2_b``/``t2``; loha: ``w1_a``, ``w1_b``, ``w2_a``,
    ``w2_b``[, ``t1``, ``t2``]; Tucker cores squeezed to 2-D), the scale ``s`` and the file's key for messages."""

    kind: str
    tensors: Mapping[str, torch.Tensor]
    scale: float
    key: str

    @property
    def shape(self) -> tuple[int, int]:
        """The ``[out, in]`` weight this patch changes."""
        t = self.tensors
        if self.kind == "lora":
            return int(t["up"].shape[0]), int(t["down"].shape[1])
        if self.kind == "loha":
            return _side_shape(t, 1)
        (a, c), (b, d) = _side_shape(t, 1), _side_shape(t, 2)
        return a * b, c * d

    def factor(self, i: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """LoKr's ``W1``/``W2`` or LoHa's ``i``-th Hadamard factor, unscaled."""
        return _side({k: v.to(dtype) for k, v in self.tensors.items()}, i)

    def delta(self, dtype: torch.dtype = torch.float32, device=None,
              index: tuple[slice, slice] | None = None) -> torch.Tensor:
        """``s · ΔW`` as an ``[out, in]`` tensor, or its ``index`` part (a tensor-parallel rank's rows/columns; a
        LoRA computes only that part, from the matching rows of ``up`` and columns of ``down``)."""
        t = {k: v.to(device=device, dtype=dtype) for k, v in self.tensors.items()}
        if self.kind == "lora":
            up, down = t["up"], t["down"]
            if index is not None:
                up, down = up[index[0]], down[:, index[1]]
            return (up @ down).mul_(self.scale)
        if self.kind == "loha":
            dw = _side(t, 1) * _side(t, 2)
        else:
            dw = torch.kron(_side(t, 1), _side(t, 2))
        return (dw if index is None else dw[index]) * self.scale


def _side(t: Mapping[str, torch.Tensor], i: int) -> torch.Tensor:
    """LoKr's W1/W2 or LoHa's i-th Hadamard factor: ``w{i}``, ``w{i}_a · w{i}_b`` or, Tucker,
    ``w{i}_aᵀ · t{i} · w{i}_b`` (``[r, m]ᵀ · [r, r] · [r, n]``)."""
    if f"w{i}" in t:
        return t[f"w{i}"]
    a, b, core = t[f"w{i}_a"], t[f"w{i}_b"], t.get(f"t{i}")
    return a @ b if core is None else a.t() @ core @ b


def _side_shape(t: Mapping[str, torch.Tensor], i: int) -> tuple[int, int]:
    if f"w{i}" in t:
        return int(t[f"w{i}"].shape[0]), int(t[f"w{i}"].shape[1])
    a, b = t[f"w{i}_a"], t[f"w{i}_b"]
    return int(a.shape[1] if f"t{i}" in t else a.shape[0]), int(b.shape[1])


# ------------------------------------------------------------------------------------------------ reading

def _split(key: str) -> tuple[str, str, bool] | None:
    """``key`` → (module key, suffix, flat naming) or None when no known suffix ends it."""
    for suffix in _SUFFIXES:
        if key.endswith("." + suffix):
            module = key[: -len(suffix) - 1]
            for prefix in DOTTED_PREFIXES:
                if module.startswith(prefix):
                    return module[len(prefix):], suffix, False
            for prefix in FLAT_PREFIXES:
                if module.startswith(prefix):
                    return module[len(prefix):], suffix, True
            return module, suffix, False
    return None


def _number(value, what: str, name: str, positive_int: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and positive_int:
        ok = float(value).is_integer() and value > 0
    elif ok:
        ok = value > 0  # an alpha: a LoRA scales its change by alpha / r, a negative one flips it
    if not ok:
        kind = "a positive integer" if positive_int else "a positive finite number"
        raise LoraError(f"LoRA {name}: {what} is {value!r} ({type(value).__name__}); it must be {kind}. The file's "
                        "adapter settings are damaged — fix that value or save the LoRA again.")
    return float(value)


def _peft_config(raw: dict | None, path: Path, name: str) -> dict:
    """PEFT LoraConfig fields (r, lora_alpha, use_rslora, alpha_pattern, rank_pattern), validated."""
    values, where = None, METADATA_KEY
    if raw and METADATA_KEY in raw:
        try:
            values = json.loads(raw[METADATA_KEY])
        except json.JSONDecodeError as exc:
            raise LoraError(f"LoRA {name}: its {METADATA_KEY} is not JSON ({exc}); the file is damaged.") from exc
    elif path.name == "adapter_model.safetensors" and (path.parent / "adapter_config.json").is_file():
        where = "adapter_config.json"
        try:
            values = json.loads((path.parent / where).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise LoraError(f"LoRA {name}: the {where} beside it cannot be read ({exc}); fix or delete it.") from exc
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise LoraError(f"LoRA {name}: its {where} is not a JSON object; the file is damaged.")
    if where == METADATA_KEY:  # diffusers writes "<prefix>.<LoraConfig field>"
        values = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in values.items()}
    elif values.get("peft_type", "LORA") != "LORA":
        raise LoraError(f"LoRA {name} is a PEFT {values['peft_type']} adapter ({where}); supported: {SUPPORTED}.")
    out = {}
    for field, positive_int in (("r", True), ("lora_alpha", False)):
        if values.get(field) is not None:
            out[field] = _number(values[field], f"{field} in its {where}", name, positive_int)
    for field, positive_int in (("rank_pattern", True), ("alpha_pattern", False)):
        patterns = values.get(field) or {}
        if not isinstance(patterns, dict):
            raise LoraError(f"LoRA {name}: {field} in its {where} is {patterns!r}; it must map module names to "
                            "numbers. Fix that value or save the LoRA again.")
        out[field] = {k: _number(v, f"{field}[{k!r}] in its {where}", name, positive_int) for k, v in patterns.items()}
    out["use_rslora"] = bool(values.get("use_rslora"))
    if values.get("use_dora"):
        raise LoraError(f"LoRA {name} is a DoRA adapter (use_dora in its {where}); supported: {SUPPORTED}.")
    return out


def _pattern_value(patterns: dict, module: str, default):
    for pattern, value in (patterns or {}).items():
        if module == pattern or module.endswith("." + pattern):
            return value
        try:
            if re.fullmatch(pattern.lstrip("^"), module):
                return value
        except re.error:  # not a regular expression: only the suffix match above applies
            pass
    return default


def _resolve(groups: dict, shapes: Mapping, name: str) -> dict[str, tuple[str, bool]]:
    """checkpoint module name → its group ``(module key, flat)`` in the file; unknown modules are one error listing
    the first few."""
    flat_names: dict[str, str | None] = {}
    for module in shapes:
        flat = module.replace(".", "_")
        flat_names[flat] = None if flat in flat_names else module  # None: two layers share the flat spelling
    out, unknown = {}, []
    for key, flat in sorted(groups):
        # a flat key is resolved by its spelling; a dotted one directly (or by spelling, for prefix-less flat keys)
        module = flat_names.get(key) if flat else (key if key in shapes else flat_names.get(key))
        if module is None:
            unknown.append(key)
        elif module in out:
            raise LoraError(f"LoRA {name}: layer {module} appears twice (as {out[module][0]!r} and {key!r}); "
                            "the file is damaged.")
        else:
            out[module] = (key, flat)
    own = [k for k in unknown if k.split(".")[-1] in UNPATCHABLE]
    if own and len(own) == len(unknown):
        raise LoraError(f"LoRA {name} patches {own[:3]}, the checkpoint's own {UNPATCHABLE[own[0].split('.')[-1]]}, "
                        "which LoRAs cannot change here (only the transformer's linear layers); use a LoRA "
                        "trained without it (PEFT: leave it out of target_modules).")
    if unknown:
        raise LoraError(
            f"LoRA {name} does not fit this checkpoint: {len(unknown)} of its {len(groups)} modules are not Cosmos3 "
            f"linear layers (e.g. {unknown[:3]}); it was trained for another model (or another Cosmos3 size)."
        )
    return out


def _alpha(parts: dict, key: str, name: str) -> float | None:
    alpha = parts.pop("alpha", None)
    if alpha is None:
        return None
    if alpha.numel() != 1:
        raise LoraError(f"LoRA {name}: {key}.alpha has shape {tuple(alpha.shape)}; it must be one number.")
    value = float(alpha.double().item())
    if not value >= 0:
        raise LoraError(f"LoRA {name}: {key}.alpha is {value:g}; it must be a positive number (0 means alpha = rank). "
                        "A negative alpha flips the LoRA — use a negative strength for that.")
    return value or None  # 0 means "alpha = rank", as LyCORIS and kohya read it


def _matrix(parts: dict, part: str, key: str, name: str, allow_4d: bool = False) -> torch.Tensor:
    t = parts[part]
    if allow_4d and t.ndim == 4 and tuple(t.shape[2:]) == (1, 1):
        t = t[:, :, 0, 0]
    if t.ndim != 2:
        raise LoraError(f"LoRA {name}: {key} {part} has shape {tuple(t.shape)}; a linear layer's adapter needs "
                        "2-D matrices — the file is damaged or made for convolution layers.")
    return t


def _check_parts(kind: str, parts: dict, key: str, name: str) -> None:
    """Every tensor a ``kind`` adapter needs is there (LoKr: each side whole or as a pair; LoHa: Tucker cores both
    or none)."""
    if kind == "lokr":
        for side in ("1", "2"):
            full, pair = f"w{side}" in parts, f"w{side}_a" in parts or f"w{side}_b" in parts
            if full == pair or (pair and not {f"w{side}_a", f"w{side}_b"} <= set(parts)):
                raise LoraError(f"LoRA {name}: {key} needs lokr_w{side} or both lokr_w{side}_a and lokr_w{side}_b "
                                f"(it has {sorted('lokr_' + p for p in parts)}); the file is incomplete.")
        return
    names = ({"down": "lora_A/lora_down", "up": "lora_B/lora_up"} if kind == "lora"
             else {p: "hada_" + p for p in ("w1_a", "w1_b", "w2_a", "w2_b", "t1", "t2")})
    missing = [p for p in (("down", "up") if kind == "lora" else ("w1_a", "w1_b", "w2_a", "w2_b")) if p not in parts]
    if kind == "loha" and ("t1" in parts) != ("t2" in parts):
        missing.append("t2" if "t1" in parts else "t1")
    if missing:
        raise LoraError(f"LoRA {name}: {key} has no {', '.join(names[p] for p in missing)} weight; the file is "
                        "incomplete.")


@dataclass(frozen=True)
class _Adapter:
    """One layer's adapter tensors as read, with what the messages about them name."""

    tensors: dict
    key: str  # the layer's key in the file
    name: str  # the file's name

    def mismatch(self, detail: str) -> LoraError:
        shapes = ", ".join(f"{p} {tuple(v.shape)}" for p, v in sorted(self.tensors.items()))
        return LoraError(f"LoRA {self.name}: rank mismatch at {self.key}: {shapes} ({detail}); the file is damaged "
                         "or not made for linear layers.")

    def rank_zero(self) -> LoraError:
        return LoraError(f"LoRA {self.name}: {self.key} has rank 0; it changes nothing and cannot be scaled — the "
                         "file is damaged.")


def _lora_scale(adapter: _Adapter, alpha: float | None, module: str, config: dict) -> float:
    """``alpha / r`` (PEFT's ``rank_pattern``/``alpha_pattern``/``use_rslora`` where the file has no alpha)."""
    down, up = adapter.tensors["down"], adapter.tensors["up"]
    if down.shape[0] != up.shape[1]:
        raise adapter.mismatch("lora_A/down is [r, in] and lora_B/up [out, r] with the same r")
    r = int(down.shape[0])
    if r == 0:
        raise LoraError(f"LoRA {adapter.name}: {adapter.key} has rank 0 (lora_A/down {tuple(down.shape)}, "
                        f"lora_B/up {tuple(up.shape)}): it changes nothing and cannot be scaled; the file is damaged.")
    if alpha is not None:
        return alpha / r
    rank = _pattern_value(config.get("rank_pattern"), module, config.get("r", r))
    alpha = _pattern_value(config.get("alpha_pattern"), module, config.get("lora_alpha", rank))
    return alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r


def _factor_rank(adapter: _Adapter, side: str, prefix: str, roles: tuple[str, str]) -> int:
    """The rank of one factorised side (``w{side}_a @ w{side}_b``, or Tucker with core ``t{side}``)."""
    a, b, core = adapter.tensors[f"w{side}_a"], adapter.tensors[f"w{side}_b"], adapter.tensors.get(f"t{side}")
    if core is None and a.shape[1] != b.shape[0]:
        raise adapter.mismatch(f"{prefix}_w{side}_a is [{roles[0]}, r] and {prefix}_w{side}_b [r, {roles[1]}]")
    if core is not None and not (core.shape[0] == a.shape[0] and core.shape[1] == b.shape[0]):
        raise adapter.mismatch(f"Tucker: {prefix}_t{side} is [r, r], {prefix}_w{side}_a [r, {roles[0]}], "
                               f"{prefix}_w{side}_b [r, {roles[1]}]")
    return int(b.shape[0])


def _loha_scale(adapter: _Adapter, alpha: float | None, _module: str, _config: dict) -> float:
    ranks = [_factor_rank(adapter, side, "hada", ("out", "in")) for side in ("1", "2")]
    if 0 in ranks:
        raise adapter.rank_zero()
    if _side_shape(adapter.tensors, 1) != _side_shape(adapter.tensors, 2):
        raise adapter.mismatch("both Hadamard factors must have the layer's [out, in] shape")
    return (alpha / ranks[0]) if alpha is not None else 1.0


def _lokr_scale(adapter: _Adapter, alpha: float | None, _module: str, _config: dict) -> float:
    tensors, ranks = adapter.tensors, []
    if "w1_a" in tensors:  # no core on this side (lokr_t1 is refused when the file is read)
        ranks.append(_factor_rank(adapter, "1", "lokr", ("a", "c")))
    if "w2_a" in tensors:
        ranks.append(_factor_rank(adapter, "2", "lokr", ("b", "d")))
    elif "t2" in tensors:
        raise adapter.mismatch("lokr_t2 goes with lokr_w2_a and lokr_w2_b, not with a full lokr_w2")
    if len(set(ranks)) > 1:
        raise adapter.mismatch("both factorised sides must share one rank")
    if 0 in ranks:
        raise adapter.rank_zero()
    return 1.0 if not ranks or alpha is None else alpha / ranks[0]


_SCALES = {"lora": _lora_scale, "loha": _loha_scale, "lokr": _lokr_scale}


def _build(kind: str, parts: dict, key: str, module: str, config: dict, name: str) -> LoraPatch:
    """One layer's patch: its tensors checked (present, 2-D, ranks that agree) and its scale."""
    alpha = _alpha(parts, key, name)
    _check_parts(kind, parts, key, name)
    tensors = {p: _matrix(parts, p, key, name, allow_4d=p.startswith("t")) for p in parts}
    scale = _SCALES[kind](_Adapter(tensors, key, name), alpha, module, config)
    return LoraPatch(kind, tensors, float(scale), key)


def _read_tensors(path: Path, name: str) -> tuple[dict | None, dict[str, torch.Tensor]]:
    """The file's metadata and tensors, all finite."""
    if path.is_dir():
        raise LoraError(f"LoRA {name} is a folder, not a LoRA file; pick the .safetensors file inside it (or rename "
                        "the folder).")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            raw_meta = f.metadata()
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise LoraError(f"LoRA {name} cannot be read ({exc}); it is damaged or not a safetensors file — "
                        "download it again.") from exc
    for key, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise LoraError(f"LoRA {name}: tensor {key} holds {bad} NaN/inf values; the file is damaged (or its "
                            "training diverged) — download it again or use an earlier checkpoint of that training.")
    return raw_meta, tensors


def _group(tensors: dict[str, torch.Tensor], name: str) -> tuple[dict, dict]:
    """``(module, flat)`` → its parts, and → its one adapter kind; every key in a layout this loader reads."""
    groups: dict[tuple[str, bool], dict[str, torch.Tensor]] = {}
    kinds: dict[tuple[str, bool], set[str]] = {}
    refused, other = {}, []
    for key, tensor in tensors.items():
        split = _split(key)
        if split is None:
            other.append(key)
            continue
        module, suffix, flat = split
        if suffix in UNSUPPORTED:
            refused.setdefault(UNSUPPORTED[suffix], key)
            continue
        kind, part = PARTS[suffix]
        parts = groups.setdefault((module, flat), {})
        if part in parts:
            raise LoraError(f"LoRA {name}: {module} has two {suffix} tensors (e.g. {key}); the file is damaged.")
        parts[part] = tensor
        if kind:
            kinds.setdefault((module, flat), set()).add(kind)
    if refused:
        found = "; ".join(f"{fmt}, e.g. {key}" for fmt, key in refused.items())
        raise LoraError(f"LoRA {name} is in a format Cosmos3 LoRA Loader does not read: {found}. Supported: "
                        f"{SUPPORTED}.")
    if other:
        raise LoraError(f"LoRA {name}: {len(other)} keys are in no LoRA layout this loader reads (e.g. {other[:3]}); "
                        f"supported: {SUPPORTED}.")
    _check_kinds(groups, kinds, name)
    return groups, kinds


def _check_kinds(groups: dict, kinds: dict, name: str) -> None:
    """Some adapter weights, none without a kind (an alpha alone), none of two kinds."""
    if not kinds:
        raise LoraError(f"LoRA {name} holds no adapter weights; it is not a LoRA file (supported: {SUPPORTED}).")
    lonely = [m for m in groups if m not in kinds]
    if lonely:
        raise LoraError(f"LoRA {name}: {[m for m, _ in lonely][:3]} have an alpha but no weights; the file is "
                        "incomplete.")
    mixed = [m for m, k in kinds.items() if len(k) > 1]
    if mixed:
        raise LoraError(f"LoRA {name}: {mixed[0][0]} mixes {' and '.join(sorted(kinds[mixed[0]]))} tensors; "
                        "the file is damaged.")


def read_lora(path: str | Path, shapes: Mapping[str, tuple[int, int]]) -> dict[str, LoraPatch]:
    """module name → ``LoraPatch`` for every adapted layer of a LoRA/LoKr/LoHa safetensors file, checked against
    ``shapes`` (the checkpoint's linear layers: module name → ``(out, in)``)."""
    path = Path(path)
    name = path.name
    raw_meta, tensors = _read_tensors(path, name)
    config = _peft_config(raw_meta, path, name)
    groups, kinds = _group(tensors, name)
    out = {}
    for module, group in _resolve(groups, shapes, name).items():
        (kind,) = kinds[group]
        patch = _build(kind, dict(groups[group]), group[0], module, config, name)
        if tuple(patch.shape) != tuple(shapes[module]):
            out_f, in_f = shapes[module]
            raise LoraError(
                f"LoRA {name}: {module} is [{out_f}, {in_f}] in this checkpoint but the {kind} patch gives "
                f"{list(patch.shape)}; it was trained for another Cosmos3 size (Nano/Edge/Super) — use a LoRA made "
                "for this checkpoint."
            )
        out[module] = patch
    return out


# ------------------------------------------------------------------------------------------------ applying

def linear_shapes(model: torch.nn.Module) -> dict[str, tuple[int, int]]:
    """module name → ``(out, in)`` for every linear layer of a core (or diffusers) transformer: the checkpoint's
    shapes, also for a tensor-parallel model (whose ``weight_sharding`` knows them)."""
    sharding = getattr(model, "weight_sharding", None)
    shapes = {}
    for n, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            shape = (m.out_features, m.in_features) if sharding is None else sharding.source(n + ".weight", m.weight)[0]
            shapes[n] = (int(shape[0]), int(shape[1]))
    return shapes


def check_strength(strength: float, what: str = "strength") -> float:
    if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not math.isfinite(strength):
        raise LoraError(f"{what} is {strength!r}; it must be a finite number (1 = as trained, 0 = off).")
    return float(strength)


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor-parallel parameter (its storage), or the tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


MAX_RELATIVE_CHANGE = 1000.0  # ‖strength · s · ΔW‖ / ‖W‖ beyond which a patch saturates the model (issue 39)


def _delta_norm_bound(patch: LoraPatch) -> float:
    """An upper bound of ``‖ΔW‖_F`` (unscaled) from the factors alone, in float64 (no ``[out, in]`` product):
    ``‖AB‖ ≤ ‖A‖‖B‖``, ``‖A ⊙ B‖ ≤ ‖A‖‖B‖``, ``‖A ⊗ B‖ = ‖A‖‖B‖``."""
    t = {k: v.double() for k, v in patch.tensors.items()}

    def side(i: int) -> float:
        if f"w{i}" in t:
            return float(t[f"w{i}"].norm())
        n = float(t[f"w{i}_a"].norm()) * float(t[f"w{i}_b"].norm())
        return n * float(t[f"t{i}"].norm()) if f"t{i}" in t else n

    if patch.kind == "lora":
        return float(t["up"].norm()) * float(t["down"].norm())
    return side(1) * side(2)


@torch.no_grad()
def check_patch(patch: LoraPatch, weight: torch.Tensor, module: str, name: str, strength: float = 1.0,
                dtype: torch.dtype = torch.float32) -> None:
    """Refuse a patch that would wreck its layer silently: ``strength · s · ΔW`` not finite in the compute ``dtype``
    (an alpha of 1e300 passes as a Python float, then overflows), or more than ``MAX_RELATIVE_CHANGE`` times the
    size of the weight it patches (alpha 1e30 or weights ×1e15: the model saturates and every such LoRA gives the
    same output). ``weight`` is the layer's current weight (any device and dtype). Cheap unless the factors' bound
    is already out of range: then the change is computed on the weight's device, in float32."""
    coefficient = abs(float(strength) * patch.scale)
    if coefficient == 0.0:
        return
    limit = torch.finfo(dtype).max if dtype.is_floating_point else torch.finfo(torch.float32).max
    w_norm = max(float(weight.detach().float().norm()), 1e-12)
    bound = coefficient * _delta_norm_bound(patch)
    if math.isfinite(bound) and bound <= MAX_RELATIVE_CHANGE * w_norm and bound < limit / 2:
        return
    delta = patch.delta(torch.float32, device=weight.device) * float(strength)
    amax = float(delta.abs().max()) if delta.numel() else 0.0
    if not math.isfinite(amax) or amax + float(weight.detach().float().abs().max()) >= limit:
        raise LoraError(f"LoRA {name}: its change to {module} ({patch.key}, scale {patch.scale:g}) does not fit "
                        f"{str(dtype).removeprefix('torch.')} (it overflows to inf/NaN); its alpha or weights are "
                        "absurd — the file is damaged or was saved with a wrong alpha.")
    ratio = float(delta.norm()) / w_norm
    if not math.isfinite(ratio) or ratio > MAX_RELATIVE_CHANGE:
        raise LoraError(f"LoRA {name}: at strength {strength:g} it changes {module} ({patch.key}, scale "
                        f"{patch.scale:g}) by {ratio:.3g} times that weight's own size (more than "
                        f"{MAX_RELATIVE_CHANGE:g}×): the model would saturate and ignore the LoRA. Its alpha or "
                        "weights are absurd — use a sane file, or a far smaller strength.")


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A tensor-parallel parameter gathered whole (to compare a patch with the whole weight), or the tensor itself."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def _compute_dtype(weight: torch.Tensor) -> torch.dtype:
    return weight.dtype if weight.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64) \
        else torch.bfloat16  # FP8 storage computes in bf16


@torch.no_grad()
def merge_lora(model: torch.nn.Module, patches: Mapping[str, LoraPatch], strength: float = 1.0,
               name: str = "file") -> None:
    """``W += strength · s · ΔW`` in place for every patched layer of ``model`` (computed in fp32, stored back in the
    weight's dtype; a ModelOpt ``scale_weight`` is honoured). Strength 0 leaves the weights untouched. Reload the
    checkpoint to undo. A tensor-parallel model merges each rank's slice of ``ΔW`` into its shard; a GGUF-quantized
    layer (``gguf_quants.GgufLinear``) keeps its blocks and adds ``strength · s · ΔW`` after dequantizing, per call."""
    strength = check_strength(strength)
    if strength == 0.0:
        return
    for module_name, patch in patches.items():  # all checked before the first weight changes
        check_patch(patch, _whole(model.get_submodule(module_name).weight), module_name, name, strength,
                    _compute_dtype(model.get_submodule(module_name).weight))
    sharding = getattr(model, "weight_sharding", None)
    for module_name, patch in patches.items():
        layer = model.get_submodule(module_name)
        if getattr(layer, "qtype", None) is not None:  # GGUF blocks stay as they are: the patch adds at each call
            layer.add_patch(patch, strength)
            continue
        index = None if sharding is None else sharding.source(module_name + ".weight", layer.weight)[1]
        weight = _local(layer.weight)
        scale = getattr(layer, "scale_weight", None)
        scale = None if scale is None else _local(scale).float()
        dense = weight.float() * (1.0 if scale is None else scale)
        dense += strength * patch.delta(device=weight.device, index=index)
        if scale is not None:
            dense /= scale
        weight.copy_(dense.to(weight.dtype))
