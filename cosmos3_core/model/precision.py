"""FP8 step policy: which denoising steps run W8A8 (FP8 activations × FP8 weights) and which W8A16 (the FP8 weight
dequantized, an ordinary linear), and for which linear layers.

Mirrors diffusers 0.42.1 ``pipelines/cosmos/mixed_precision.py`` (``Cosmos3MixedPrecisionConfig.resolve``,
``use_high_precision``, ``parse_diffusion_step_policy``, ``_classify_cosmos3_linear``), the policy NVIDIA's ``fp8``
Hub revisions declare in ``transformer/config.json`` under ``quantization_config.runtime.diffusion_step_policy``:

* ``mixed_precision_format`` ``None`` (auto): the checkpoint's declared policy, if any — a distilled FP8 checkpoint
  declares none and runs native (W8A8) at every step; ``"none"``: native at every step; ``"fp8"``: the first/last-N
  schedule even without a declared policy (defaults 3 and 3). ``mixed_precision_first_steps`` /
  ``_last_steps`` / ``_reasoner_policy`` / ``_overlap`` override the policy's fields.
* A step is high precision (W8A16) when it is among the first or last N; a step in both windows follows
  ``overlap`` (``a16``: high, ``native``: W8A8); a 1-step run stays native.
* The policy switches the reference's "generation" linears per step and holds its "reasoner" linears at
  ``reasoner_policy`` (``high_precision`` = W8A16, ``base_precision`` = W8A8) for the whole run; any other FP8
  linear (outside the decoder layers) always runs native. The reference names the two sets by module path
  (``REFERENCE_PATHS``): "generation" = ``self_attn.to_q/to_k/to_v/to_out`` and ``mlp_moe_gen``, "reasoner" =
  ``self_attn.add_q_proj/add_k_proj/add_v_proj/to_add_out`` and ``mlp``. In Cosmos3's attention processor
  ``add_*`` project the generation stream and ``to_*`` the text stream, so the reference's per-step switch acts on
  the text attention and the generation MLP, and its "reasoner" setting on the generation attention and the text
  MLP; that is what is mirrored here (parity), and since the text tower then depends on the step's precision, the
  text K/V is computed once per precision a run uses.

Errors are ``PolicyError`` (a ``ValueError``) naming the argument (``name=value``, with the CLI flag) or the
checkpoint field, the value and the fix. Where the reference only warns or ignores, this refuses instead, never a
silent no-op: ``fp8`` asked of a checkpoint that is not ModelOpt FP8, and an override of the schedule's fields where
no schedule runs (format ``none``, a checkpoint that is not FP8, or one without a declared policy left on auto).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

FORMATS = ("none", "fp8")
REASONER_POLICIES = ("high_precision", "base_precision")
OVERLAP_MODES = ("a16", "native")
W8A16, W8A8 = "W8A16", "W8A8"
# the call's overrides, named as ``Cosmos3OmniPipeline.__call__``'s arguments (``_overlap``: ``resolve``'s)
OVERRIDES = ("mixed_precision_format", "mixed_precision_first_steps", "mixed_precision_last_steps",
             "mixed_precision_reasoner_policy", "mixed_precision_overlap")

# NVIDIA's policy for the Nano / Super / Super-I2V ``fp8`` revisions (the reference's FIRST_LAST_N_FP8_POLICY).
FIRST_LAST_N_FP8_POLICY = {
    "schema_version": 1,
    "type": "first_last_n",
    "index_space": "denoising_loop_iteration",
    "scope": ["transformer"],
    "default_mode": "native",
    "first_steps": {"count": 3, "mode": "a16"},
    "last_steps": {"count": 3, "mode": "a16"},
    "overlap": "a16",
    "reasoner": "a16",
}
REQUIRED_POLICY_FIELDS = ("schema_version", "type", "index_space", "scope", "default_mode", "first_steps",
                          "last_steps", "overlap", "reasoner")
POLICY_FIELD = "transformer/config.json quantization_config.runtime.diffusion_step_policy"
_FIX_POLICY = "the reference (diffusers 0.42.1) rejects it; restore the file from the checkpoint's fp8 revision"

# Linear layers by the reference's path names (``_classify_cosmos3_linear``): (infix, suffixes) of the module name.
REFERENCE_PATHS = {
    "generation": (".mlp_moe_gen.", (".self_attn.to_q", ".self_attn.to_k", ".self_attn.to_v", ".self_attn.to_out")),
    "reasoner": (".mlp.", (".self_attn.add_q_proj", ".self_attn.add_k_proj", ".self_attn.add_v_proj",
                           ".self_attn.to_add_out")),
}


class PolicyError(ValueError):
    """A mixed-precision argument or checkpoint policy the reference rejects."""


def linear_path(name: str) -> str | None:
    """``"generation"`` | ``"reasoner"`` | None for a linear layer's module name, as the reference classifies it."""
    for path, (infix, suffixes) in REFERENCE_PATHS.items():
        if infix in name or name.endswith(suffixes):
            return path
    return None


@dataclass(frozen=True)
class MixedPrecision:
    """A resolved first/last-N schedule (``format="none"``: every FP8 linear native at every step)."""

    format: str = "none"
    first_steps: int = 3
    last_steps: int = 3
    reasoner_policy: str = "high_precision"
    overlap: str = "a16"
    forced: bool = False  # mixed_precision_format='fp8' was asked for (refused where W8A8 cannot run)

    @property
    def enabled(self) -> bool:
        return self.format != "none"

    def high_precision(self, step_index: int, num_steps: int) -> bool:
        """Whether step ``step_index`` of ``num_steps`` runs the generation path W8A16 (the reference's
        ``use_high_precision``)."""
        if num_steps <= 0:
            raise PolicyError(f"num_steps={num_steps} must be positive.")
        if not 0 <= step_index < num_steps:
            raise PolicyError(f"step_index={step_index} must be in [0, {num_steps}).")
        if num_steps == 1:
            return False
        in_first = step_index < self.first_steps
        in_last = step_index >= num_steps - self.last_steps
        if in_first and in_last:
            return self.overlap == "a16"
        return in_first or in_last

    def precision_name(self, step_index: int, num_steps: int) -> str:
        """``"W8A16"`` | ``"W8A8"``, or ``"base"`` when disabled (the reference's trace entries)."""
        if not self.enabled:
            return "base"
        return W8A16 if self.high_precision(step_index, num_steps) else W8A8

    def schedule(self, num_steps: int) -> tuple[str, ...]:
        return tuple(self.precision_name(i, num_steps) for i in range(num_steps))

    def modes(self, step_index: int, num_steps: int) -> "StepPrecision":
        """What each class of FP8 linear runs at this step."""
        if not self.enabled:
            return StepPrecision(W8A8, W8A8, W8A8)
        gen = W8A16 if self.high_precision(step_index, num_steps) else W8A8
        reasoner = W8A16 if self.reasoner_policy == "high_precision" else W8A8
        return StepPrecision(gen, reasoner, W8A8)

    def describe(self) -> str:
        """One line for logs and the nodes: the policy in effect."""
        if not self.enabled:
            return "FP8 native (W8A8 at every step)"
        return (f"FP8 W8A16 for the first {self.first_steps} and last {self.last_steps} steps, W8A8 between; "
                f"reasoner path {self.reasoner_policy}, overlap {self.overlap}")


class StepPrecision(NamedTuple):
    """The mode (``"W8A16"`` | ``"W8A8"``) of each class of FP8 linear in one step: the reference's "generation"
    and "reasoner" paths, and every other FP8 linear (``other``). A plain tuple of strings, so a compiled layer
    that takes it as an argument guards on its values."""

    generation: str
    reasoner: str
    other: str

    def mode_of(self, path: str | None) -> str:
        """The mode of an FP8 linear on the reference's ``path`` (``linear_path``: "generation", "reasoner", None)."""
        return self.generation if path == "generation" else self.reasoner if path == "reasoner" else self.other


def _modelopt_fp8_backend(quantization_config: Mapping | None, has_fp8_linears: bool) -> bool:
    """The reference's ``_is_modelopt_fp8_backend``: a ``modelopt`` method or an FP8 algorithm, or (neither
    declared) FP8 linear layers in the model."""
    q = quantization_config or {}
    method = _method(q)
    if method is not None and method != "modelopt":
        return False
    algo = str(q.get("quant_algo") or q.get("quant_type") or "").upper()
    if algo and "FP8" not in algo:
        return False
    if method == "modelopt" or "FP8" in algo:
        return True
    return bool(has_fp8_linears)


def resolve(
    quantization_config: Mapping | None,
    *,
    has_fp8_linears: bool = False,
    mixed_precision_format: str | None = None,
    mixed_precision_first_steps: int | None = None,
    mixed_precision_last_steps: int | None = None,
    mixed_precision_reasoner_policy: str | None = None,
    mixed_precision_overlap: str | None = None,
) -> MixedPrecision:
    """The schedule from the checkpoint's ``quantization_config`` and the call's overrides (the reference's
    ``Cosmos3MixedPrecisionConfig.resolve``; ``has_fp8_linears`` stands for its scan of the loaded modules)."""
    fmt = None if mixed_precision_format is None else str(mixed_precision_format).strip().lower()
    if fmt is not None and fmt not in FORMATS:
        raise PolicyError(f"mixed_precision_format={mixed_precision_format!r} must be one of {', '.join(FORMATS)} "
                          "(or unset: follow the checkpoint's policy; CLI: --mixed-precision-format).")
    overrides = {
        "mixed_precision_first_steps": _count(mixed_precision_first_steps, "mixed_precision_first_steps"),
        "mixed_precision_last_steps": _count(mixed_precision_last_steps, "mixed_precision_last_steps"),
        "mixed_precision_reasoner_policy": _choice(mixed_precision_reasoner_policy, REASONER_POLICIES,
                                                   "mixed_precision_reasoner_policy"),
        "mixed_precision_overlap": _choice(mixed_precision_overlap, OVERLAP_MODES, "mixed_precision_overlap"),
    }
    q = dict(quantization_config or {})
    fp8 = _modelopt_fp8_backend(q, has_fp8_linears)
    if fmt == "fp8" and not fp8:
        raise PolicyError(
            f"mixed_precision_format='fp8' applies to NVIDIA ModelOpt FP8 checkpoints (the fp8 revision), but this "
            f"checkpoint's transformer is {_method(q) or 'not quantized'}; load the fp8 revision, or this one with "
            "approximate FP8 compute (CLI: --weight-dtype fp8_e4m3fn_fast), or leave mixed_precision_format unset.")
    parsed = checkpoint_policy(q) if fp8 and fmt != "none" else None  # a broken policy fails even when overridden
    if fmt == "none" or not fp8 or (parsed is None and fmt != "fp8"):
        given = [f"{name}={value!r}" for name, value in overrides.items() if value is not None]
        if given:
            why = ("mixed_precision_format='none' runs W8A8 at every step" if fmt == "none" else
                   "the checkpoint is not FP8" if not fp8 else
                   "the checkpoint declares no step policy (a distilled FP8 checkpoint runs W8A8 at every step)")
            fix = "" if not fp8 or fmt == "none" else "; or set mixed_precision_format to fp8 to run the schedule"
            raise PolicyError(f"{', '.join(given)} has no effect: {why}; drop it{fix}.")
        return MixedPrecision("none")
    base = parsed or MixedPrecision("fp8")
    first, last, reasoner, overlap = overrides.values()
    return MixedPrecision(
        "fp8", forced=fmt == "fp8",
        first_steps=base.first_steps if first is None else first,
        last_steps=base.last_steps if last is None else last,
        reasoner_policy=base.reasoner_policy if reasoner is None else reasoner,
        overlap=base.overlap if overlap is None else overlap,
    )


def checkpoint_policy(quantization_config: Mapping) -> MixedPrecision | None:
    """The declared ``runtime.diffusion_step_policy`` as a schedule, None when there is none (a distilled FP8
    checkpoint). Validated as the reference does: a missing or unknown field fails closed."""
    runtime = quantization_config.get("runtime")
    if runtime is None:
        return None
    if not isinstance(runtime, Mapping):
        raise PolicyError(f"transformer/config.json: quantization_config.runtime={runtime!r} must be a mapping or "
                          f"null; {_FIX_POLICY}.")
    policy = runtime.get("diffusion_step_policy")
    if policy is None:
        return None
    return parse_step_policy(policy, quantization_config)


def parse_step_policy(policy: Any, quantization_config: Mapping | None = None) -> MixedPrecision:
    """Validate one ``diffusion_step_policy`` (schema 1, ``first_last_n``) — the reference's
    ``parse_diffusion_step_policy`` — into a schedule."""
    if not isinstance(policy, Mapping):
        raise PolicyError(f"{POLICY_FIELD}={policy!r} must be a mapping; {_FIX_POLICY}.")
    missing = [name for name in REQUIRED_POLICY_FIELDS if name not in policy]
    if missing:
        raise PolicyError(f"{POLICY_FIELD} lacks the field(s) {missing}; {_FIX_POLICY}.")
    expected = {"schema_version": 1, "type": "first_last_n", "index_space": "denoising_loop_iteration",
                "default_mode": "native"}
    for name, want in expected.items():
        if policy[name] != want:
            raise PolicyError(f"{POLICY_FIELD}.{name}={policy[name]!r} is not supported (only {want!r}); "
                              f"{_FIX_POLICY}.")
    scope = policy["scope"]
    if not isinstance(scope, (list, tuple)) or not all(isinstance(s, str) for s in scope) \
            or "transformer" not in scope or any(s != "transformer" for s in scope):
        raise PolicyError(f"{POLICY_FIELD}.scope={scope!r} must be ['transformer']; {_FIX_POLICY}.")
    algo = str((quantization_config or {}).get("quant_algo") or (quantization_config or {}).get("quant_type") or "")
    if algo and "FP8" not in algo.upper():
        raise PolicyError(f"transformer/config.json: quantization_config quant_algo/quant_type={algo!r} is not FP8; "
                          "the step policy applies to ModelOpt FP8 checkpoints only.")
    first = _window(policy["first_steps"], "first_steps")
    last = _window(policy["last_steps"], "last_steps")
    overlap = str(policy["overlap"]).strip().lower()
    if overlap not in OVERLAP_MODES:
        raise PolicyError(f"{POLICY_FIELD}.overlap={policy['overlap']!r} must be 'a16' or 'native'; {_FIX_POLICY}.")
    reasoner = {"a16": "high_precision", "native": "base_precision"}.get(policy["reasoner"]) \
        if isinstance(policy["reasoner"], str) else None
    if reasoner is None:
        raise PolicyError(f"{POLICY_FIELD}.reasoner={policy['reasoner']!r} must be 'a16' or 'native'; "
                          f"{_FIX_POLICY}.")
    return MixedPrecision("fp8", first, last, reasoner, overlap)


def _window(spec: Any, name: str) -> int:
    if not isinstance(spec, Mapping):
        raise PolicyError(f"{POLICY_FIELD}.{name}={spec!r} must be a mapping with count and mode; {_FIX_POLICY}.")
    mode = spec.get("mode")
    if not isinstance(mode, str) or mode not in ("a16", "native"):
        raise PolicyError(f"{POLICY_FIELD}.{name}.mode={mode!r} must be 'a16' or 'native'; {_FIX_POLICY}.")
    count = spec.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise PolicyError(f"{POLICY_FIELD}.{name}.count={count!r} must be a non-negative integer; {_FIX_POLICY}.")
    return 0 if mode == "native" else count


def _count(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PolicyError(f"{name}={value!r} must be a non-negative integer (steps; e.g. 3), or unset to follow the "
                          f"checkpoint's policy (CLI: --{name.replace('_', '-')}).")
    return value


def _choice(value: Any, options: tuple[str, ...], name: str) -> str | None:
    if value is None:
        return None
    text = str(value).strip().lower()
    if text not in options:
        raise PolicyError(f"{name}={value!r} must be one of {', '.join(options)} (or unset: follow the checkpoint's "
                          f"policy; CLI: --{name.replace('_', '-')}).")
    return text


def _method(q: Mapping) -> str | None:
    value = q.get("quant_method")
    value = getattr(value, "value", value)
    text = "" if value is None else str(value).strip().lower()
    return text or None

