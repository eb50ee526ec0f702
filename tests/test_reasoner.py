"""Reasoner (cosmos3_core.reasoner.reasoner / vision / reason CLI) vs transformers' Cosmos3 reasoner classes, CPU fp32.

The tiny Hub-layout checkpoint (cosmos3_core.testing.tiny + tiny_reasoner) is loaded both by
``Cosmos3OmniForConditionalGeneration`` / ``Cosmos3EdgeForConditionalGeneration`` (``from_pretrained`` on the repo
root: key renaming, generation keys dropped) and by our code sharing one ``Cosmos3Transformer``.

Run: /root/.cache/cosmos3/venv/bin/python -m pytest -q tests/test_reasoner.py
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from cosmos3_core.model.loader import load_transformer  # noqa: E402
from cosmos3_core.model.towers import tower_module  # noqa: E402
from cosmos3_core.reasoner.reasoner import Cosmos3Reasoner, SamplingParams, process_logits, sample_token
from cosmos3_core.reasoner.tasks import build_messages, postprocess
from cosmos3_core.reasoner.vision import load_processor, load_vision_encoder, mrope_position_ids  # noqa: E402
from cosmos3_core.runtime import RuntimeOptions

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
HF_CLASSES = {"nano": "Cosmos3OmniForConditionalGeneration", "edge": "Cosmos3EdgeForConditionalGeneration"}
PROMPT = "the robot arm picks up a red cup on the kitchen table"
MAX_REL = {}  # filled by the parity tests, printed at the end


@pytest.fixture(scope="module", params=["nano", "edge"])
def family(request):
    return request.param


@pytest.fixture(scope="module")
def ckpts(tiny_checkpoint):
    return {v: tiny_checkpoint(v, seed=0, reasoner=True) for v in ("nano", "edge")}


@pytest.fixture(scope="module")
def setup(ckpts, family):
    root = ckpts[family]
    hf = getattr(transformers, HF_CLASSES[family]).from_pretrained(str(root), dtype=torch.float32).eval()
    transformer = load_transformer(root, dtype=torch.float32, device="cpu")
    reasoner = Cosmos3Reasoner(transformer, load_processor(root), checkpoint_dir=root)
    return root, hf, reasoner


def _media(kind):
    rng = np.random.default_rng(1)
    if kind == "image":
        return dict(image=rng.random((50, 70, 3), dtype=np.float32))
    if kind == "video":
        return dict(video=rng.random((30, 40, 60, 3), dtype=np.float32), fps=12.0)
    return {}


def _hf_inputs(reasoner, p):
    mm = torch.zeros_like(p.input_ids)
    mm[p.input_ids == reasoner.special["image"]] = 1
    mm[p.input_ids == reasoner.special["video"]] = 2
    # explicit mask: the tiny vocabulary maps "<"/">" of frame timestamps to id 0, which generate would take for pad
    kw = dict(input_ids=p.input_ids[None], mm_token_type_ids=mm[None], attention_mask=torch.ones_like(mm)[None])
    if p.pixel_values is not None:
        kw.update(pixel_values=p.pixel_values, image_grid_thw=p.image_grid_thw)
    if p.pixel_values_videos is not None:
        kw.update(pixel_values_videos=p.pixel_values_videos, video_grid_thw=p.video_grid_thw)
    return kw


# ---------------------------------------------------------------------------------------------------- parity


@pytest.mark.parametrize("kind", ["text", "image", "video"])
def test_logits_match_transformers(setup, family, kind):
    _, hf, reasoner = setup
    p = reasoner.prepare(PROMPT, **_media(kind))
    assert p.has_vision == (kind != "text")
    ours = reasoner.prefill(p, all_logits=True)
    hf.model.rope_deltas = None
    with torch.no_grad():
        ref = hf(**_hf_inputs(reasoner, p)).logits[0]
    assert ours.shape == ref.shape
    rel = ((ours - ref).abs().max() / ref.abs().max()).item()
    MAX_REL[f"{family}/{kind}"] = rel
    print(f"\n{family} {kind}: L={p.length} max relative logit error {rel:.3e}")
    assert rel <= 1e-4
    last = reasoner.prefill(p)  # the default returns only the last position
    torch.testing.assert_close(last, ours[-1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["text", "image", "video"])
def test_greedy_20_tokens_match_transformers(setup, family, kind):
    _, hf, reasoner = setup
    p = reasoner.prepare(PROMPT, **_media(kind))
    kw = _hf_inputs(reasoner, p)
    saved, hf_saved = reasoner.eos_token_ids, hf.generation_config.eos_token_id
    try:  # eos off on both sides: 20 full tokens
        reasoner.eos_token_ids = []
        hf.generation_config.eos_token_id = None
        ids, reason = reasoner.generate_ids(p, SamplingParams(max_new_tokens=20))
        hf.model.rope_deltas = None
        ref = hf.generate(**kw, do_sample=False, max_new_tokens=20)[0, p.length:].tolist()
        assert reason == "length" and len(ids) == 20
        assert ids == ref
    finally:
        reasoner.eos_token_ids, hf.generation_config.eos_token_id = saved, hf_saved
    # with the checkpoint's eos ids both stop at the same place
    ids, _ = reasoner.generate_ids(p, SamplingParams(max_new_tokens=20))
    hf.model.rope_deltas = None
    ref = hf.generate(**kw, do_sample=False, max_new_tokens=20)[0, p.length:].tolist()
    assert ids == [t for t in ref if t not in reasoner.eos_token_ids][: len(ids)]
    assert len(ref) in (len(ids), len(ids) + 1)


@pytest.mark.parametrize("kind", ["image", "video"])
def test_vision_encoder_and_positions_match_transformers(setup, family, kind):
    root, hf, reasoner = setup
    p = reasoner.prepare("what is this", **_media(kind))
    pixels, grid = (p.pixel_values, p.image_grid_thw) if kind == "image" else (p.pixel_values_videos, p.video_grid_thw)
    feats = load_vision_encoder(root, torch.float32, "cpu")(pixels, grid)
    with torch.no_grad():
        ref = hf.model.get_image_features(pixels, grid, return_dict=True)
    torch.testing.assert_close(feats.embeds, torch.cat(ref.pooler_output), rtol=0, atol=0)
    assert len(feats.deepstack) == (2 if family == "nano" else 0)
    for ours, theirs in zip(feats.deepstack, getattr(ref, "deepstack_features", None) or []):
        torch.testing.assert_close(ours, torch.cat(theirs), rtol=0, atol=0)
    assert feats.embeds.shape[0] == int((p.input_ids == reasoner.special[kind]).sum())  # one token per 2x2 block
    kw = _hf_inputs(reasoner, p)
    pos, delta = hf.model.get_rope_index(kw["input_ids"], kw["mm_token_type_ids"], image_grid_thw=p.image_grid_thw,
                                         video_grid_thw=p.video_grid_thw)
    assert torch.equal(pos[:, 0], p.position_ids)
    assert int(delta) + p.length == p.next_position


def test_mrope_rejects_mismatched_grid():
    ids = torch.tensor([1, 6, 6, 6, 2])
    with pytest.raises(ValueError, match="placeholder"):
        mrope_position_ids(ids, torch.tensor([[1, 4, 4]]), None, 6, 7, 2)


# ---------------------------------------------------------------------------------------------------- sharing


def test_no_second_copy_of_text_weights(setup, family):
    _, _, reasoner = setup
    tr = reasoner.transformer
    text = tower_module(tr, "text")
    ptrs = {p.data_ptr() for p in text.parameters()}
    assert reasoner.lm_head is tr.lm_head and tr.lm_head.weight.data_ptr() in ptrs
    assert reasoner.transformer.embed_tokens.weight.data_ptr() == tr.embed_tokens.weight.data_ptr()
    own = [p for m in (reasoner.lm_head,) for p in m.parameters()]
    assert all(p.data_ptr() in ptrs for p in own)
    # generation after load allocates no parameters: the module tree is unchanged
    n_before = sum(1 for _ in tr.parameters())
    reasoner.generate_ids(reasoner.prepare(PROMPT), SamplingParams(max_new_tokens=3))
    assert sum(1 for _ in tr.parameters()) == n_before


def test_lm_head_loaded_separately_when_generator_skipped_it(ckpts, family):
    root = ckpts[family]
    tr = load_transformer(root, dtype=torch.float32, device="cpu", skip_modules=("lm_head",))
    r = Cosmos3Reasoner(tr, load_processor(root), checkpoint_dir=root)
    assert tr.lm_head is None and r.lm_head is not None
    full = Cosmos3Reasoner(load_transformer(root, dtype=torch.float32), load_processor(root), checkpoint_dir=root)
    p = r.prepare(PROMPT)
    torch.testing.assert_close(r.prefill(p), full.prefill(p), rtol=0, atol=0)


def test_text_tower_only_load_matches(ckpts, family):
    root = ckpts[family]
    light = Cosmos3Reasoner.load(root, dtype=torch.float32)
    assert light.transformer.layers[0].self_attn.add_q_proj.weight.is_meta  # generation tower not loaded
    full = Cosmos3Reasoner(load_transformer(root, dtype=torch.float32), load_processor(root), checkpoint_dir=root)
    p = full.prepare(PROMPT, **_media("image"))
    torch.testing.assert_close(light.prefill(p, all_logits=True), full.prefill(p, all_logits=True), rtol=0, atol=0)


def test_cache_values_equal_generator_text_kv(setup, family):
    _, _, reasoner = setup
    p = reasoner.prepare(PROMPT)
    reasoner.prefill(p)
    kv = reasoner.transformer.prefill(p.input_ids)
    n = p.length
    torch.testing.assert_close(reasoner.cache.values[:, :, :n], kv.values, rtol=1e-5, atol=1e-5)
    same_keys = torch.allclose(reasoner.cache.keys[:, :, :n], kv.keys, rtol=1e-5, atol=1e-5)
    assert same_keys == (family == "nano")  # Edge's generator reads k_norm_und_for_gen(k), not the text keys


# ---------------------------------------------------------------------------------------------------- sampling


def test_logit_processing_matches_transformers():
    from transformers.generation.logits_process import (
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 300, generator=gen) * 3
    ids = torch.randint(0, 300, (1, 40), generator=gen)
    seen = torch.zeros(300, dtype=torch.bool)
    seen[ids[0]] = True
    params = SamplingParams(temperature=0.7, top_k=50, top_p=0.9, repetition_penalty=1.3)
    ref = logits.clone()
    for proc in (RepetitionPenaltyLogitsProcessor(1.3), TemperatureLogitsWarper(0.7), TopKLogitsWarper(50),
                 TopPLogitsWarper(0.9)):
        ref = proc(ids, ref)
    torch.testing.assert_close(process_logits(logits[0], seen, params), ref[0], rtol=0, atol=0)


def test_sampling_is_seeded_and_top_k_1_is_greedy(setup):
    _, _, reasoner = setup
    p = reasoner.prepare(PROMPT)
    hot = SamplingParams(max_new_tokens=12, temperature=1.5, top_p=0.95, seed=7)
    a, b = reasoner.generate_ids(p, hot)[0], reasoner.generate_ids(p, hot)[0]
    assert a == b
    greedy = reasoner.generate_ids(p, SamplingParams(max_new_tokens=12))[0]
    assert reasoner.generate_ids(p, SamplingParams(max_new_tokens=12, temperature=0.8, top_k=1, seed=3))[0] == greedy
    seen = torch.zeros(10, dtype=torch.bool)
    logits = torch.tensor([0.0, 5.0, 1.0, -2.0, 0.5, 0.1, 0.2, 0.3, 0.4, 4.9])
    assert sample_token(logits, seen, SamplingParams(), None).tolist() == [1]


def test_should_stop_and_callback(setup):
    _, _, reasoner = setup
    calls, saved = [], reasoner.eos_token_ids
    reasoner.eos_token_ids = []
    try:
        ids, reason = reasoner.generate_ids(reasoner.prepare(PROMPT), SamplingParams(max_new_tokens=40),
                                            should_stop=lambda: len(calls) >= 2,
                                            callback=lambda d, t: calls.append((d, t)), check_every=3)
    finally:
        reasoner.eos_token_ids = saved
    assert reason == "cancelled" and calls == [(3, 40), (6, 40)] and len(ids) == 6


def test_decode_step_has_static_shapes(setup):
    _, _, reasoner = setup
    p = reasoner.prepare(PROMPT)
    reasoner.prefill(p, cache_len=p.length + 8)
    size = reasoner.cache.max_len
    token = torch.tensor([5])
    a = reasoner.decode_step(token, torch.tensor(p.length), torch.tensor(p.next_position))
    b = reasoner.decode_step(token, torch.tensor(p.length + 1), torch.tensor(p.next_position + 1))
    assert a.shape == b.shape == (reasoner.config.vocab_size,) and reasoner.cache.max_len == size


def test_compiled_decode_is_one_graph_without_recompiles_and_matches_transformers(setup, family):
    """``RuntimeOptions(compile=True)``: one traced graph serves every layer and step (aot_eager here: the tracing, not
    inductor's kernels, is what can recompile or break), and greedy decoding with a repetition penalty — picked
    inside the step — still equals transformers' ``generate``."""
    from torch._dynamo.utils import counters

    _, hf, reasoner = setup
    p = reasoner.prepare(PROMPT)
    kw = _hf_inputs(reasoner, p)
    params = SamplingParams(max_new_tokens=12, repetition_penalty=1.3)
    saved, hf_saved = reasoner.eos_token_ids, hf.generation_config.eos_token_id
    torch._dynamo.reset()
    graphs = counters["stats"]["unique_graphs"]
    try:
        reasoner.eos_token_ids = []
        hf.generation_config.eos_token_id = None
        options = RuntimeOptions(compile=True, compile_backend="aot_eager")
        ids, _ = reasoner.generate_ids(p, params, options=options)
        assert counters["stats"]["unique_graphs"] - graphs == 1  # both layers, all steps
        with torch._dynamo.config.patch(error_on_recompile=True):
            assert reasoner.generate_ids(p, params, options=options)[0] == ids
        hf.model.rope_deltas = None
        ref = hf.generate(**kw, do_sample=False, max_new_tokens=12, repetition_penalty=1.3)[0, p.length:].tolist()
        assert ids == ref
        reasoner.graph_sampling = False  # the pick outside the step: the same tokens
        assert reasoner.generate_ids(p, params, options=options)[0] == ref
    finally:
        reasoner.eos_token_ids, hf.generation_config.eos_token_id = saved, hf_saved
        reasoner.graph_sampling = True
        torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------------- errors / tasks


def test_errors(setup, tmp_path):
    _, _, reasoner = setup
    image = _media("image")["image"]
    no_vision = Cosmos3Reasoner(reasoner.transformer, reasoner.processor, checkpoint_dir=tmp_path)
    with pytest.raises(ValueError, match="vision_encoder"):
        no_vision.generate("what is this", image=image)
    with pytest.raises(ValueError, match="empty"):
        reasoner.generate("   ")
    with pytest.raises(ValueError, match="empty"):
        reasoner.generate("", task="expand")
    with pytest.raises(ValueError, match="caption"):
        reasoner.generate("", task="caption")
    with pytest.raises(ValueError, match="task"):
        reasoner.generate(PROMPT, task="poem")
    with pytest.raises(ValueError, match="fps"):
        reasoner.generate(PROMPT, video=_media("video")["video"])
    short = Cosmos3Reasoner(reasoner.transformer, reasoner.processor, checkpoint_dir=reasoner.checkpoint_dir,
                            max_context=8)
    with pytest.raises(ValueError, match="context"):
        short.generate(PROMPT)
    for bad in (dict(max_new_tokens=0), dict(temperature=-1.0), dict(top_p=0.0), dict(top_k=-2),
                dict(repetition_penalty=0.0)):
        with pytest.raises(ValueError):
            reasoner.generate(PROMPT, params=SamplingParams(**bad))


def test_task_presets_and_outputs(setup):
    _, _, reasoner = setup
    msgs = build_messages("expand", "a cat", has_image=False)
    assert msgs[0]["role"] == "system" and "JSON" in msgs[0]["content"] and msgs[-1]["content"].endswith("a cat")
    cap = build_messages("caption", "", has_image=True)
    assert cap[-1]["content"][0] == {"type": "image"} and "video" in cap[-1]["content"][1]["text"]
    assert postprocess("expand", 'Sure:\n```json\n{"summary": "a cat", "actions": []}\n```') == \
        json.dumps({"summary": "a cat", "actions": []})
    assert postprocess("expand", "not json") == "not json"
    out = reasoner.generate(PROMPT, task="caption", image=_media("image")["image"],
                            params=SamplingParams(max_new_tokens=8))
    assert isinstance(out.text, str) and out.prompt_tokens > 0 and out.stop_reason in ("eos", "length")
    # the root processor's template renders plain-text chats exactly like text_tokenizer/ (the generator's)
    chat = [{"role": "user", "content": "a cat"}]
    gen_tok = transformers.AutoTokenizer.from_pretrained(str(reasoner.checkpoint_dir / "text_tokenizer"))
    assert reasoner.processor.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        gen_tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


# ---------------------------------------------------------------------------------------------------- CLI


def _cli(*args):
    return subprocess.run([PYTHON, "-m", "cosmos3_core.reason", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def test_cli(ckpts, tmp_path):
    from cosmos3_core import media

    root = ckpts["nano"]
    png = media.write_png(tmp_path / "in.png", np.random.default_rng(0).random((48, 64, 3), dtype=np.float32))
    mp4 = media.write_video(tmp_path / "in.mp4", np.random.default_rng(1).random((12, 48, 64, 3), dtype=np.float32), 8)
    common = ("--checkpoint", root, "--device", "cpu", "--dtype", "fp32", "--max-new-tokens", 6)
    r = _cli(*common, "--prompt", PROMPT)
    assert r.returncode == 0, r.stderr
    ref = Cosmos3Reasoner.load(root, dtype=torch.float32).generate(PROMPT, params=SamplingParams(max_new_tokens=6))
    assert r.stdout.rstrip("\n") == ref.text
    for extra in (("--image", png, "--task", "caption"), ("--video", mp4), ("--task", "expand", "--temperature",
                                                                           0.8, "--top-k", 5, "--seed", 3)):
        r = _cli(*common, "--prompt", PROMPT, *extra)
        assert r.returncode == 0, r.stderr
    opts = common[2:]
    for args in ((*common, "--prompt", PROMPT, "--image", tmp_path / "missing.png"), (*common, "--prompt", "  "),
                 (*common, "--prompt", "", "--task", "caption"), (*common, "--prompt", PROMPT, "--top-p", 0),
                 ("--checkpoint", tmp_path / "nowhere", *opts, "--prompt", PROMPT)):
        r = _cli(*args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), (args, r.stderr)


def test_cli_image_without_vision_encoder(ckpts, tmp_path):
    import shutil

    from cosmos3_core import media

    root = tmp_path / "novision"
    shutil.copytree(ckpts["edge"], root, ignore=shutil.ignore_patterns("vision_encoder"))
    png = media.write_png(tmp_path / "in.png", np.zeros((32, 32, 3), dtype=np.float32))
    r = _cli("--checkpoint", root, "--device", "cpu", "--dtype", "fp32", "--prompt", "what", "--image", png)
    assert r.returncode == 2 and r.stderr.startswith("error:") and "vision_encoder" in r.stderr


def test_report_max_relative_errors():
    print("\nmax relative logit errors:", json.dumps({k: f"{v:.2e}" for k, v in sorted(MAX_REL.items())}))


def test_text_only_checkpoint_without_reasoner_parts(tiny_checkpoint):
    """A generation-only folder (no root processor, no vision_encoder/): text questions work, media is refused."""
    root = tiny_checkpoint("edge", seed=0)
    tr = load_transformer(root, dtype=torch.float32, skip_modules=("lm_head",))
    r = Cosmos3Reasoner(tr, load_processor(root), checkpoint_dir=root)
    out = r.generate(PROMPT, task="expand", params=SamplingParams(max_new_tokens=5))
    assert out.prompt_tokens > 0 and len(out.token_ids) <= 5
    with pytest.raises(ValueError, match="vision_encoder"):
        r.generate("what is this", image=np.zeros((32, 32, 3), np.float32))


def test_reasoner_parts_keep_generation_loading(ckpts, family):
    """The added root files do not disturb the diffusers pipeline or our generator loader."""
    import diffusers

    from cosmos3_core.pipeline import Cosmos3Pipeline

    root = ckpts[family]
    pipe = diffusers.Cosmos3OmniPipeline.from_pretrained(str(root), enable_safety_checker=False)
    assert pipe.transformer.config.hidden_act == ("silu" if family == "nano" else "relu2")
    ours = Cosmos3Pipeline.load(root, dtype=torch.float32)
    assert ours.transformer.lm_head is None  # the generator skips it; the reasoner reads it on demand
    index = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]
    assert not any("moe_gen" in k or "add_q_proj" in k for k in index)
    assert {f.split("/")[0] for f in index.values()} == {"transformer", "vision_encoder"}
