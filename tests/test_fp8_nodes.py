"""FP8 W8A8 inside ComfyUI (real ComfyUI 0.3.75 host, CPU; the FP8 GEMM emulated exactly, ``fp8_gemm="emulate"``):

* NVIDIA's ModelOpt FP8 checkpoint loaded by Load Cosmos3 Checkpoint runs the core's W8A16/W8A8 step policy in the
  pack's ComfyUI layers (``StreamingFp8Linear``): a whole run equals the core's, bit for bit, fully loaded and with
  every layer streamed by ComfyUI's partial load;
* ``fp8_e4m3fn_fast`` (a bf16 checkpoint's weights rounded to FP8 at load, dynamic activation scales) likewise equals
  the core's approximate mode; on a device without FP8 GEMMs the loader stores fp8_e4m3fn instead (W8A16) and says so
  once;
* ComfyUI's ``--fast fp8_matrix_mult`` (or a bare ``--fast``) makes ``fp8_e4m3fn`` the same FP8 compute as
  ``fp8_e4m3fn_fast`` where the card has FP8 tensor cores, and leaves it FP8 storage (W8A16, silently, as ComfyUI's own
  fallback) elsewhere; without the flag, or with other ``--fast`` features only, ``fp8_e4m3fn`` is FP8 storage;
* a LoRA on FP8 weights gets each patched weight a new FP8 scale (its own ``amax / 448``: nothing clipped) and the
  merged weight (the dequantized FP8 weight plus ``up @ down · alpha/rank · strength``, within e4m3 rounding), the
  same whether ComfyUI merges it at load or the layer patches per call; strength 0 and the unpatched model afterwards
  are the model as before, bit for bit.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys

import pytest
import torch
from safetensors import safe_open
from test_lora import write_lora

from support.compare import rel
from test_workflows import TINY_NANO

MODELOPT = "cosmos3-test-nano-modelopt"


@pytest.fixture(scope="module")
def setup(host):
    from cosmos3_core.testing.fp8 import build_fp8_checkpoint

    root = host.base_dir / "models" / "diffusers"
    if not (root / MODELOPT).is_dir():
        build_fp8_checkpoint(root / TINY_NANO, root / MODELOPT)
    pack = host.node_class_mappings["Cosmos3Loader"].__module__.split(".nodes.")[0]
    loras = host.base_dir / "models" / "loras"
    loras.mkdir(parents=True, exist_ok=True)
    handle = load(host, MODELOPT)
    shapes = {n: (m.out_features, m.in_features) for n, m in handle.pipeline.transformer.named_modules()
              if isinstance(m, torch.nn.Linear)}
    write_lora(loras / "cosmos3_fp8_test.safetensors", shapes, rank=4, alpha=8.0, seed=5)
    return root, pack


def load(host, checkpoint, **kw):
    return host.node_class_mappings["Cosmos3Loader"].execute(checkpoint=checkpoint, dtype="fp32", device="cpu",
                                                             **kw).result[0]


def run(pack: str, pipe, patchers=(), lowvram: bool = False) -> torch.Tensor:
    """A 7-step T2I run (NVIDIA's policy: W8A16 for the first and last 3 steps, W8A8 at the middle one) of ``pipe`` with the
    FP8 GEMM emulated, through the pack's own copy of the core when ``pack`` is given (else the tests' copy); the
    ``patchers`` loaded by ComfyUI first (fully, or every layer streamed)."""
    import comfy.model_management as mm

    core = f"{pack}.cosmos3_core" if pack else "cosmos3_core"
    api, request, runtime = (importlib.import_module(f"{core}.{m}") for m in ("api", "request", "runtime"))
    mm.unload_all_models()
    for p in patchers:
        if lowvram:
            p.patch_model(device_to=p.load_device, lowvram_model_memory=1)
        else:
            mm.load_models_gpu([p])
    try:
        options = runtime.RuntimeOptions(fp8_gemm="emulate", compile="off")
        req = request.Request(prompt="a red robot", height=32, width=48, num_frames=1, steps=7, seed=3,
                              options=options)
        return api.generate(pipe, req, decode=False).latents
    finally:
        if lowvram:
            for p in patchers:
                p.unpatch_model(device_to=p.offload_device)


def towers(handle):
    return [handle.text_patcher, handle.generation_patcher]


def test_modelopt_checkpoint_runs_the_cores_w8a8_policy_in_comfyui(host, setup):
    from cosmos3_core.pipeline import Cosmos3Pipeline

    root, pack = setup
    handle = load(host, MODELOPT)
    layer = handle.pipeline.transformer.layers[0].self_attn.to_q
    assert type(layer).__name__ == "StreamingFp8Linear" and layer.has_w8a8 and layer.path is not None
    core = Cosmos3Pipeline.load(root / MODELOPT, dtype=torch.float32)
    ref = run("", core)
    w8a16 = run("", Cosmos3Pipeline.load(root / MODELOPT, dtype=torch.float32, storage_dtype=torch.float32))
    assert rel(ref, w8a16) > 1e-4  # the W8A8 steps really ran (and differ from a dequantized model)
    for lowvram in (False, True):
        assert torch.equal(run(pack, handle.pipeline, towers(handle), lowvram), ref), lowvram


def test_fp8_e4m3fn_fast_equals_the_cores_approximate_mode(host, setup, caplog):
    from cosmos3_core.pipeline import Cosmos3Pipeline

    root, pack = setup
    handle_cls = sys.modules[f"{pack}.nodes.model_handle"].Cosmos3ModelHandle
    handle = handle_cls.load(TINY_NANO, root / TINY_NANO, torch.float32, "cpu", fp8_compute=True)
    assert handle.pipeline.transformer.fp8_checkpoint.approximate
    ref = run("", Cosmos3Pipeline.load(root / TINY_NANO, dtype=torch.float32, fp8_compute=True))
    assert torch.equal(run(pack, handle.pipeline, towers(handle)), ref)
    with caplog.at_level(logging.WARNING):  # the CPU has no FP8 GEMMs: FP8 storage, W8A16, said once
        fallback = load(host, TINY_NANO, weight_dtype="fp8_e4m3fn_fast")
    said = [r.getMessage() for r in caplog.records if "fp8_e4m3fn_fast needs FP8 tensor cores" in r.getMessage()]
    assert len(said) == 1 and "stored as fp8_e4m3fn and computed W8A16" in said[0], said
    assert fallback.pipeline.transformer.fp8_checkpoint is None
    assert fallback.pipeline.transformer.layers[0].mlp.up_proj.weight.dtype == torch.float8_e4m3fn


def host_fast(monkeypatch, *argv: str) -> None:
    """ComfyUI's ``args.fast`` as ``main.py <argv>`` sets it: its own parser, then cli_args' normalisation (no
    ``--fast``: nothing; a bare ``--fast``: every feature; else the features named); monkeypatch restores it."""
    from comfy import cli_args

    fast = cli_args.parser.parse_args(list(argv)).fast
    fast = set() if fast is None else set(cli_args.PerformanceFeature) if fast == [] else set(fast)
    monkeypatch.setattr(cli_args.args, "fast", fast)


@pytest.mark.parametrize("argv, fp8_card, compute", [
    ((), True, False),                                # no --fast: fp8_e4m3fn is FP8 storage (W8A16) on any card
    (("--fast", "fp16_accumulation"), True, False),   # another --fast feature only: the same
    (("--fast", "fp8_matrix_mult"), True, True),      # FP8 compute (W8A8, approximate) on an FP8 card
    (("--fast",), True, True),                        # a bare --fast enables every feature, fp8_matrix_mult too
    (("--fast", "fp8_matrix_mult"), False, False),    # no FP8 tensor cores (the CPU): FP8 storage, W8A16
])
def test_comfyuis_fast_fp8_matrix_mult_makes_fp8_e4m3fn_fp8_compute(host, setup, monkeypatch, caplog, argv,
                                                                   fp8_card, compute):
    """ComfyUI's ``--fast fp8_matrix_mult`` computes FP8 weights in FP8 where the card can (comfy.ops
    ``pick_operations``); the loader maps it onto the pack's W8A8: ``weight_dtype`` fp8_e4m3fn loads as
    fp8_e4m3fn_fast does. An FP8 card is simulated (the loader's ``device_fp8_problem`` says none); without one the
    weights stay FP8 storage with no notice — the user asked for fp8_e4m3fn, which is what they get, as ComfyUI's
    own fallback is silent."""
    _, pack = setup
    host_fast(monkeypatch, *argv)
    if fp8_card:
        monkeypatch.setattr(sys.modules[f"{pack}.nodes.loader"], "device_fp8_problem", lambda device: None)
    with caplog.at_level(logging.INFO):
        handle = load(host, TINY_NANO, weight_dtype="fp8_e4m3fn")
        plain = load(host, TINY_NANO, weight_dtype="auto")
    model = handle.pipeline.transformer
    assert model.layers[0].mlp.up_proj.weight.dtype == torch.float8_e4m3fn
    if compute:  # the weights rounded at load with per-tensor scales, the W8A8 forward labelled approximate
        assert model.fp8_checkpoint is not None and model.fp8_checkpoint.approximate
        assert type(model.layers[0].mlp.up_proj).__name__ == "StreamingFp8Linear"
    else:
        assert model.fp8_checkpoint is None
    said = [r.getMessage() for r in caplog.records if "FP8 tensor cores" in r.getMessage()]
    assert not said, said
    # weight_dtype auto is the checkpoint's own dtype whatever --fast says: no FP8 at all
    assert plain.pipeline.transformer.fp8_checkpoint is None
    assert plain.pipeline.transformer.layers[0].mlp.up_proj.weight.dtype == torch.float32


def lora_deltas(path, strength: float) -> dict[str, torch.Tensor]:
    """Each target layer's weight delta as the LoRA convention defines it, from the PEFT file's own tensors:
    ``lora_B (up) @ lora_A (down) · lora_alpha / rank · strength`` (float64)."""
    with safe_open(str(path), "pt") as f:
        alpha = json.loads(f.metadata()["lora_adapter_metadata"])["transformer.lora_alpha"]
        tensors = {k: f.get_tensor(k).double() for k in f.keys()}
    out = {}
    for key, down in tensors.items():
        if key.endswith(".lora_A.weight"):
            up = tensors[key.replace(".lora_A.", ".lora_B.")]
            out[key[len("transformer."):-len(".lora_A.weight")]] = up @ down * (alpha / down.shape[0]) * strength
    return out


def test_lora_on_fp8_weights_recomputes_the_scale(host, setup):
    root, pack = setup
    node = host.node_class_mappings["Cosmos3LoraLoader"]
    base = load(host, MODELOPT)
    model = base.pipeline.transformer
    plain = run(pack, base.pipeline, towers(base))
    before = {n: (m.weight.clone(), m.scale_weight.clone(), m.w8a8_weight_scale.clone())
              for n, m in model.named_modules() if type(m).__name__ == "StreamingFp8Linear"
              and m.weight.dtype == torch.float8_e4m3fn}
    zero = node.execute(model=base, lora_name="cosmos3_fp8_test.safetensors", strength=0.0).result[0]
    assert zero is base  # strength 0: no patch at all (ComfyUI would re-round every patched FP8 weight)

    patched = node.execute(model=base, lora_name="cosmos3_fp8_test.safetensors", strength=4.0).result[0]
    streamed = run(pack, patched.pipeline, towers(patched), lowvram=True)
    merged = run(pack, patched.pipeline, towers(patched))  # stays loaded: inspect the merged layers
    assert torch.equal(merged, streamed) and rel(merged, plain) > 1e-3
    deltas = lora_deltas(host.base_dir / "models" / "loras" / "cosmos3_fp8_test.safetensors", strength=4.0)
    grown, merged_layers = 0, []
    for name, (w, scale, _) in before.items():
        m = model.get_submodule(name)
        if torch.equal(m.weight, w):
            assert name not in deltas
            continue  # not a LoRA target
        dense = m.weight.float() * m.scale_weight
        assert torch.equal(m.scale_weight, m.w8a8_weight_scale)
        assert abs(float(dense.abs().amax()) / float(m.scale_weight) - 448.0) < 1e-3  # its own amax / 448
        grown += float(m.scale_weight) > 1.01 * float(scale)  # a fixed scale would have clipped these
        # The merged weight: the checkpoint's dequantized FP8 weight plus the LoRA delta (from the file itself),
        # rounded to e4m3 once with the new scale s. e4m3 keeps 3 mantissa bits: round-to-nearest errs by at most
        # 2^-4 of |x| for a normal x = w/s, and by half the subnormal step (2^-9 / 2 = 2^-10, times s) below 2^-6;
        # so |err| <= 2^-4 |w| + 2^-10 s per element and, summed in L2, the relative error of the layer is at most
        # 2^-4 + 2^-10 s sqrt(n) / ||w|| (+ 1e-5 for fp32 arithmetic of the merge and of this check).
        want = w.double() * scale.double() + deltas[name]
        got = m.weight.double() * m.scale_weight.double()
        s = float(m.scale_weight)
        bound = 2**-4 + 2**-10 * s * want.numel() ** 0.5 / float(want.norm()) + 1e-5
        err = float((got - want).norm() / want.norm())
        assert err <= bound, (name, err, bound)
        assert float((w.double() * scale.double() - want).norm() / want.norm()) > 2 * bound  # the delta shows
        merged_layers.append(name)
    assert grown > 0 and sorted(merged_layers) == sorted(n for n in deltas if n in before)

    assert torch.equal(run(pack, base.pipeline, towers(base)), plain)  # unpatched: weights and scales restored
    for name, (w, scale, scale_b) in before.items():
        m = model.get_submodule(name)
        assert torch.equal(m.weight, w) and torch.equal(m.scale_weight, scale) and torch.equal(m.w8a8_weight_scale,
                                                                                               scale_b)


def test_the_w8a8_text_rerun_asks_for_the_text_tower_and_counts_its_memory(host, setup):
    """NVIDIA's policy re-runs the text tower in the W8A8 steps' modes while the plan is made: each plan first asks
    the model manager for the text tower (the handle's ``prepare``, which loads it with room for the pass — on a
    small card the generation tower may hold the GPU) and re-runs it on the model it samples (a LoRA'd one may differ
    from the encode's), holds each distinct K/V once and counts it in the room the step asks for; under guidance 1
    only the prompt is re-run."""
    import comfy.model_management as mm

    _, pack = setup
    core = f"{pack}.cosmos3_core"
    api, runtime = (importlib.import_module(f"{core}.{m}") for m in ("api", "runtime"))
    handle = load(host, MODELOPT)
    pipe = handle.pipeline
    options = runtime.RuntimeOptions(fp8_gemm="emulate", compile="off")
    shape = dict(num_frames=1, height=32, width=48, fps=24.0)
    ids = pipe.tokenize("a red robot", None, **shape)
    mm.unload_all_models()
    handle.load_text_tower(ids.prefill_tokens)
    text = pipe.prefill_prompts(ids, **shape, options=options).to(mm.intermediate_device())
    calls = []

    def prepare(part, need):
        calls.append((part, need, pipe.prefill_count))
        handle.prepare(part, need)

    def plan(guidance=6.0, **kw):
        return api.plan(pipe, text, seed=3, steps=7, guidance=guidance, device=handle.generation_device,
                        options=kw.pop("options", options), prepare=prepare)

    def kv_bytes(kvs):
        return sum(kv.keys.nbytes + kv.values.nbytes for kv in kvs)

    before = pipe.prefill_count
    first = plan()
    assert calls == [("text", ids.prefill_tokens, before)] and pipe.prefill_count == before + 2
    assert [g.precision.generation for g in first.guidance] == ["W8A16"] * 3 + ["W8A8"] + ["W8A16"] * 3
    w8a8 = first.guidance[3].text
    assert len(w8a8) == 2 and all(torch.equal(kv.token_ids, b.token_ids) for kv, b in zip(w8a8, first.guidance[0].text))
    assert {id(kv) for g in first.guidance for kv in g.text} == {id(kv) for kv in first.guidance[0].text + w8a8}
    plain = plan(options=runtime.RuntimeOptions(compile="off"))  # no FP8 GEMMs on the CPU: W8A16 throughout
    assert all(g.text == plain.guidance[0].text for g in plain.guidance) and len(calls) == 1
    assert first.memory_required == plain.memory_required + kv_bytes(w8a8)
    assert torch.equal(pipe.run(first).latents, pipe.run(plan()).latents)  # each plan re-runs it: same K/V
    assert len(calls) == 2 and pipe.prefill_count == before + 4

    one = plan(guidance=1.0)  # the cond branch alone: the negative prompt is not re-run
    assert calls[-1] == ("text", len(ids.cond), before + 4) and pipe.prefill_count == before + 5
    assert [len(g.text) for g in one.guidance] == [1] * 7
    assert one.memory_required == plan(guidance=1.0, options=runtime.RuntimeOptions(
        compile="off")).memory_required + kv_bytes(one.guidance[3].text)


# ---------------------------------------------------------------------------------------------- the card
def test_a_card_too_small_is_one_message_naming_the_fix(host, setup, monkeypatch):
    """A card whose memory cannot hold the step's working memory, the weights that cannot stream and one streamed
    layer is refused before it loads (720p/189f on a simulated 1 GiB card: the tiny model's step needs ≈1.4 GiB); an out-of-memory error inside the steps is the
    same fix, once; the next run works."""
    from test_workflows import load_api, shrink_api

    _, pack = setup
    handle_module = sys.modules[f"{pack}.nodes.model_handle"]
    graph = shrink_api(load_api("t2v"), prefix="cosmos3_card/t2v", width=1280, height=720, frames=189)
    monkeypatch.setattr(handle_module, "card_memory", lambda device: (2**30, "a simulated 1 GiB card"))
    ok, _, messages = host.run(graph, prompt_id="card-small")
    err = next(d for e, d in messages if e == "execution_error")
    assert not ok and err["node_type"] == "Cosmos3KSamplerUniPCDualTower", err
    msg = err["exception_message"]
    assert msg.startswith("Cosmos3KSamplerUniPCDualTower: a simulated 1 GiB card has 1.0 GiB, but this run needs at "
                          "least ") and "weights that cannot stream" in msg and "lower width, height or num_frames" in msg
    monkeypatch.undo()

    pipeline = sys.modules[f"{pack}.cosmos3_core.pipeline"].Cosmos3Pipeline

    def out_of_memory(self, plan, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(pipeline, "run", out_of_memory)
    ok, _, messages = host.run(shrink_api(load_api("t2v"), prefix="cosmos3_card/oom", seed=9), prompt_id="card-oom")
    msg = next(d for e, d in messages if e == "execution_error")["exception_message"]
    assert not ok and msg.startswith("Cosmos3KSamplerUniPCDualTower: out of GPU memory (it asked for 2.00 GiB "
                                     "more). To fit, lower width"), msg
    monkeypatch.undo()
    assert host.run_ok(shrink_api(load_api("t2v"), prefix="cosmos3_card/after", seed=10))
