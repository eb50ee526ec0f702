"""The FP8 step policy (``cosmos3_core.model.precision``) == diffusers 0.42.1 ``Cosmos3MixedPrecisionConfig``.

Every combination of checkpoint policy (NVIDIA's, edited ones, broken ones, none, other backends) and call-site
override (format, first/last steps, reasoner policy, overlap — valid and invalid values) is resolved by both; where
the reference raises, ours raises a ``PolicyError`` naming the argument or field; otherwise the per-step schedule
(W8A16 / W8A8 / base) is the same for 1–12 steps and so is the reasoner path's setting. The deliberate differences,
both where the reference resolves to "no schedule" and says so at most in a warning: ``mixed_precision_format='fp8'``
on a checkpoint that is not ModelOpt FP8, and a schedule override (first/last steps, reasoner policy, overlap) where
no schedule runs (format ``none``, a checkpoint that is not FP8, one without a declared policy left on auto) are
refused here, by name.
"""

from __future__ import annotations

import copy
import itertools

import pytest
from diffusers.pipelines.cosmos.mixed_precision import Cosmos3MixedPrecisionConfig, _classify_cosmos3_linear

from cosmos3_core.model import precision
from cosmos3_core.model.precision import FIRST_LAST_N_FP8_POLICY, PolicyError, linear_path, resolve

MODELOPT = {"quant_method": "modelopt", "quant_type": "FP8"}


def with_policy(**edits):
    policy = copy.deepcopy(FIRST_LAST_N_FP8_POLICY)
    for key, value in edits.items():
        if value is _DROP:
            del policy[key]
        else:
            policy[key] = value
    return {**MODELOPT, "runtime": {"diffusion_step_policy": policy}}


_DROP = object()

CONFIGS = {
    "none": None,
    "empty": {},
    "distilled": dict(MODELOPT),  # ModelOpt FP8 without a declared policy
    "distilled-null-runtime": {**MODELOPT, "runtime": None},
    "runtime-without-policy": {**MODELOPT, "runtime": {"other": 1}},
    "nvidia": with_policy(),
    "algo-only": {"quant_algo": "FP8", "runtime": {"diffusion_step_policy": FIRST_LAST_N_FP8_POLICY}},
    "first-5": with_policy(first_steps={"count": 5, "mode": "a16"}),
    "first-native": with_policy(first_steps={"count": 4, "mode": "native"}),
    "last-0": with_policy(last_steps={"count": 0, "mode": "a16"}),
    "overlap-native": with_policy(overlap="native"),
    "overlap-upper": with_policy(overlap=" A16 "),
    "reasoner-native": with_policy(reasoner="native"),
    "torchao": {"quant_method": "torchao", "quant_type": "int8wo"},
    "int8-modelopt": {"quant_method": "modelopt", "quant_type": "INT8"},
    # broken policies (the reference raises)
    "runtime-list": {**MODELOPT, "runtime": [1]},
    "policy-list": {**MODELOPT, "runtime": {"diffusion_step_policy": [1]}},
    "missing-overlap": with_policy(overlap=_DROP),
    "schema-2": with_policy(schema_version=2),
    "type-other": with_policy(type="every_other"),
    "index-space": with_policy(index_space="timestep"),
    "default-a16": with_policy(default_mode="a16"),
    "scope-extra": with_policy(scope=["transformer", "vae"]),
    "scope-missing": with_policy(scope=["vae"]),
    "scope-str": with_policy(scope="transformer"),
    "mode-bad": with_policy(first_steps={"count": 3, "mode": "A16"}),
    "count-negative": with_policy(last_steps={"count": -1, "mode": "a16"}),
    "count-bool": with_policy(last_steps={"count": True, "mode": "a16"}),
    "window-int": with_policy(first_steps=3),
    "overlap-bad": with_policy(overlap="both"),
    "reasoner-bad": with_policy(reasoner="high_precision"),
}
FORMATS = [None, "none", "fp8", " FP8", "NONE", "w8a8"]
COUNTS = [None, 0, 2, 10, -1, True]
REASONERS = [None, "high_precision", " Base_Precision", "native"]
OVERLAPS = [None, "a16", "native", "x"]


def reference(config, **kwargs):
    try:
        return Cosmos3MixedPrecisionConfig.resolve(None, quantization_config=copy.deepcopy(config), **kwargs), None
    except (ValueError, TypeError) as exc:
        return None, exc


def ours(config, **kwargs):
    try:
        return resolve(copy.deepcopy(config), **kwargs), None
    except PolicyError as exc:
        return None, exc


def schedules(mp, steps=range(1, 13)):
    return [mp.schedule(n) for n in steps]


def reference_schedules(cfg, steps=range(1, 13)):
    return [tuple(cfg.precision_name(i, n) for i in range(n)) for n in steps]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_override_combination_resolves_like_the_reference(name):
    config = CONFIGS[name]
    compared = refused = 0
    for fmt, first, last, reasoner, overlap in itertools.product(FORMATS, COUNTS, COUNTS, REASONERS, OVERLAPS):
        kwargs = dict(mixed_precision_format=fmt, mixed_precision_first_steps=first,
                      mixed_precision_last_steps=last, mixed_precision_reasoner_policy=reasoner,
                      mixed_precision_overlap=overlap)
        ref, ref_error = reference(config, **kwargs)
        got, error = ours(config, **kwargs)
        if ref_error is not None:
            assert error is not None, (name, kwargs, ref_error)
            refused += 1
            continue
        overridden = any(v is not None for v in (first, last, reasoner, overlap))
        if error is not None:  # the deliberate differences (module docstring)
            assert ref.format == "none", (name, kwargs, error)
            if str(fmt).strip().lower() == "fp8":
                assert "mixed_precision_format='fp8'" in str(error)
            else:
                assert overridden and "has no effect" in str(error), (name, kwargs, error)
            continue
        assert not (ref.format == "none" and overridden), (name, kwargs)  # an ignored override is refused
        assert got.format == ref.format, (name, kwargs)
        assert schedules(got) == reference_schedules(ref), (name, kwargs)
        if ref.enabled:
            assert (got.first_steps, got.last_steps, got.reasoner_policy, got.overlap) == \
                (ref.first_steps, ref.last_steps, ref.reasoner_policy, ref.overlap), (name, kwargs)
        compared += 1
    assert compared + refused > 0


def test_nvidia_policy_schedule():
    mp = resolve(CONFIGS["nvidia"])
    assert mp.schedule(8) == ("W8A16",) * 3 + ("W8A8",) * 2 + ("W8A16",) * 3
    assert mp.schedule(4) == ("W8A16",) * 4  # every step is in a window
    assert mp.schedule(1) == ("W8A8",)  # a 1-step run keeps the base path, as vLLM-Omni
    assert resolve(CONFIGS["distilled"]).schedule(4) == ("base",) * 4  # distilled: native W8A8 throughout
    assert resolve(CONFIGS["overlap-native"], mixed_precision_first_steps=3,
                   mixed_precision_last_steps=3).schedule(4) == ("W8A16", "W8A8", "W8A8", "W8A16")  # 1, 2 in both


def test_step_modes_follow_the_reference_paths():
    mp = resolve(CONFIGS["nvidia"])
    assert mp.modes(0, 10) == ("W8A16", "W8A16", "W8A8")
    assert mp.modes(5, 10) == ("W8A8", "W8A16", "W8A8")
    base = resolve(CONFIGS["nvidia"], mixed_precision_reasoner_policy="base_precision")
    assert base.modes(5, 10) == ("W8A8", "W8A8", "W8A8")
    assert resolve(CONFIGS["distilled"]).modes(0, 4) == ("W8A8", "W8A8", "W8A8")


@pytest.mark.parametrize("name", [
    "layers.0.self_attn.to_q", "layers.3.self_attn.to_k", "layers.3.self_attn.to_v", "layers.3.self_attn.to_out",
    "layers.0.self_attn.add_q_proj", "layers.0.self_attn.add_k_proj", "layers.0.self_attn.add_v_proj",
    "layers.1.self_attn.to_add_out", "layers.0.mlp.gate_proj", "layers.0.mlp.up_proj", "layers.2.mlp.down_proj",
    "layers.0.mlp_moe_gen.gate_proj", "layers.0.mlp_moe_gen.down_proj", "proj_in", "proj_out", "lm_head",
    "time_embedder.linear_1", "audio_proj_in", "audio_proj_out", "layers.0.self_attn.norm_q",
])
def test_linear_classification_is_the_references(name):
    assert linear_path(name) == _classify_cosmos3_linear(name)


@pytest.mark.parametrize("kwargs, words", [
    (dict(mixed_precision_format="w8a8"), ["mixed_precision_format='w8a8'", "none, fp8",
                                           "CLI: --mixed-precision-format"]),
    (dict(mixed_precision_first_steps=-1), ["mixed_precision_first_steps=-1", "non-negative",
                                            "CLI: --mixed-precision-first-steps"]),
    (dict(mixed_precision_last_steps="3"), ["mixed_precision_last_steps='3'"]),
    (dict(mixed_precision_reasoner_policy="native"), ["mixed_precision_reasoner_policy='native'", "high_precision"]),
    (dict(mixed_precision_overlap="x"), ["mixed_precision_overlap='x'", "a16, native"]),
])
def test_bad_overrides_name_the_argument_value_and_fix(kwargs, words):
    with pytest.raises(PolicyError) as info:
        resolve(CONFIGS["nvidia"], **kwargs)
    message = str(info.value)
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("config, fmt, name, value, why", [
    ("nvidia", "none", "mixed_precision_first_steps", 2, "runs W8A8 at every step"),
    ("distilled", None, "mixed_precision_overlap", "native", "declares no step policy"),
    ("none", None, "mixed_precision_last_steps", 1, "is not FP8"),
])
def test_an_override_without_a_schedule_is_refused_not_ignored(config, fmt, name, value, why):
    with pytest.raises(PolicyError, match=f"{name}={value!r} has no effect: .*{why}.*drop it"):
        resolve(CONFIGS[config], mixed_precision_format=fmt, **{name: value})


@pytest.mark.parametrize("name, field", [("schema-2", "schema_version=2"), ("mode-bad", "first_steps.mode='A16'"),
                                         ("scope-extra", "scope="), ("missing-overlap", "['overlap']"),
                                         ("reasoner-bad", "reasoner='high_precision'")])
def test_bad_checkpoint_policy_names_the_field(name, field):
    with pytest.raises(PolicyError) as info:
        resolve(CONFIGS[name])
    assert precision.POLICY_FIELD in str(info.value) and field in str(info.value)
    assert "fp8 revision" in str(info.value)


def test_fp8_on_a_bf16_checkpoint_is_refused():
    assert resolve(None).format == "none"
    with pytest.raises(PolicyError, match="fp8_e4m3fn_fast"):
        resolve(None, mixed_precision_format="fp8")
    assert resolve(CONFIGS["nvidia"], mixed_precision_format="fp8").forced
    assert not resolve(CONFIGS["nvidia"]).forced
