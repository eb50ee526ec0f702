"""cosmos3_core.sampling.prompt vs diffusers 0.42.1 ``Cosmos3OmniPipeline.tokenize_prompt`` (token for token).

The reference pipeline is loaded from tiny checkpoints (``cosmos3_core.testing.tiny``), so it uses the same offline
WordLevel tokenizer and Qwen-style chat template as our code. Run:
``/root/.cache/cosmos3/venv/bin/python -m pytest -q tests/test_prompt.py``
"""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from cosmos3_core.checks import check_clip, check_prompt
from cosmos3_core.sampling.prompt import (
    PromptIds,
    default_negative_prompt,
    default_use_system_prompt,
    encode_prompts,
    load_tokenizer,
)

diffusers = pytest.importorskip("diffusers")


@pytest.fixture(scope="module")
def nano_dir(tiny_checkpoint):
    return tiny_checkpoint("nano")


@pytest.fixture(scope="module")
def edge_dir(tiny_checkpoint):
    return tiny_checkpoint("edge")


@pytest.fixture(scope="module")
def tok(nano_dir):
    return load_tokenizer(nano_dir)


def _pipe(ckpt):
    return diffusers.Cosmos3OmniPipeline.from_pretrained(str(ckpt), enable_safety_checker=False)


@pytest.fixture(scope="module")
def nano_pipe(nano_dir):
    return _pipe(nano_dir)


@pytest.fixture(scope="module")
def edge_pipe(edge_dir):
    return _pipe(edge_dir)


VIDEO = dict(num_frames=9, height=64, width=96, fps=24.0)
IMAGE = dict(num_frames=1, height=64, width=96, fps=24.0)

CASES = {
    "video_sys_negNone": ("A red car on a road", None, VIDEO, True, True, True),
    "video_nosys_negEmpty": ("A red car on a road", "", VIDEO, False, True, True),
    "video_sys_negText": ("A robot arm picks up a cup", "blurry low quality", VIDEO, True, True, True),
    "image_sys_negText": ("A cat on a table", "blurry, grainy.", IMAGE, True, True, True),
    "image_nosys_negNone": ("A cat on a table", None, IMAGE, False, True, True),
    "no_templates": ("A dog running", "static", VIDEO, True, False, False),
    "duration_only": ("A dog running", "static", VIDEO, True, True, False),
    "resolution_only": ("A dog running", None, VIDEO, False, False, True),
    "image_no_resolution": ("A dog running", "dark", IMAGE, True, True, False),
    "trailing_period": ("A cat walks slowly.", "jerky.", VIDEO, True, True, True),
    "trailing_periods": ("A cat walks slowly...", "...", VIDEO, True, True, True),
    "long_video_30fps": ("ocean water at night", None, dict(num_frames=121, height=720, width=1280, fps=30),
                         True, True, True),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_matches_diffusers_tokenize_prompt(case, tok, nano_pipe):
    prompt, neg, geo, sys_prompt, dur, res = CASES[case]
    templates = tuple(name for name, on in (("duration", dur), ("resolution", res)) if on)
    ours = encode_prompts(tok, prompt, neg, use_system_prompt=sys_prompt, templates=templates, **geo)
    ref_cond, ref_uncond = nano_pipe.tokenize_prompt(
        prompt, neg, use_system_prompt=sys_prompt, add_duration_template=dur, add_resolution_template=res, **geo)
    assert isinstance(ours, PromptIds)
    assert ours.cond == ref_cond
    assert ours.uncond == ref_uncond
    for ids in (ours.cond, ours.uncond):  # Qwen-style ending, and only one system block when enabled
        toks = tok.convert_ids_to_tokens(ids)
        assert toks[-4:] == ["<|im_start|>", "assistant", "<|im_end|>", "<|vision_start|>"]
        assert (toks[1] == "system") == sys_prompt


@pytest.mark.parametrize("variant", ["nano", "edge"])
def test_checkpoint_default_system_prompt_matches_pipeline_default(variant, request):
    ckpt = request.getfixturevalue(f"{variant}_dir")
    pipe = request.getfixturevalue(f"{variant}_pipe")
    tok = load_tokenizer(ckpt)
    use_sys = default_use_system_prompt(ckpt)
    assert use_sys is (variant == "nano")
    neg = default_negative_prompt(ckpt)
    ours = encode_prompts(tok, "A robot in a kitchen.", neg, use_system_prompt=use_sys, **VIDEO)
    assert (ours.cond, ours.uncond) == pipe.tokenize_prompt("A robot in a kitchen.", neg, **VIDEO)


def test_fraction_fps_matches_float(tok, nano_pipe):
    geo = dict(num_frames=121, height=480, width=848)
    ours = encode_prompts(tok, "A cat", "dark", fps=Fraction(30000, 1001), use_system_prompt=True, **geo)
    ref = nano_pipe.tokenize_prompt("A cat", "dark", fps=30000 / 1001, use_system_prompt=True, **geo)
    assert (ours.cond, ours.uncond) == ref
    assert ours.cond_text == "A cat. The video is 4.0 seconds long and is of 30 FPS. This video is of 480x848 resolution."


def test_rendered_texts_spelled_out(tok):
    v = encode_prompts(tok, "A cat walks.", None, use_system_prompt=True, **VIDEO)
    assert v.cond_text == ("A cat walks. The video is 0.4 seconds long and is of 24 FPS. "
                           "This video is of 64x96 resolution.")
    assert v.uncond_text == ("The video is not 0.4 seconds long and is not of 24 FPS. "
                             "This video is not of 64x96 resolution.")
    i = encode_prompts(tok, "A cat", "blurry", use_system_prompt=False, **IMAGE)
    assert i.cond_text == "A cat. This image is of 64x96 resolution."
    assert i.uncond_text == "blurry. This image is not of 64x96 resolution."
    off = encode_prompts(tok, "A cat.", None, use_system_prompt=False, templates=(), **VIDEO)
    assert (off.cond_text, off.uncond_text) == ("A cat.", "")  # no template: text untouched, period kept


def test_system_prompt_keeps_trained_typo(tok):
    ids = encode_prompts(tok, "A cat", None, use_system_prompt=True, **VIDEO).cond
    rendered = tok.decode(ids)
    assert "generate videos from a give prompt" in rendered
    ids = encode_prompts(tok, "A cat", None, use_system_prompt=True, **IMAGE).cond
    assert "generate images from a give prompt" in tok.decode(ids)


# ---------------------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize("bad", ["", "   ", "\n\t"])
def test_empty_prompt_rejected(bad):
    """The resolver's check of a prompt (``encode_prompts`` takes only checked prompts)."""
    with pytest.raises(ValueError, match="^prompt is empty"):
        check_prompt(bad)


def test_overlong_prompt_rejected(tok):
    long_prompt = " ".join(["cat"] * 5000)
    with pytest.raises(ValueError, match=r"prompt is \d+ tokens .* limit of 4096"):
        encode_prompts(tok, long_prompt, use_system_prompt=True, **VIDEO)
    ids = encode_prompts(tok, "A cat", "dark", use_system_prompt=True, **VIDEO)
    n = max(len(ids.cond), len(ids.uncond))
    encode_prompts(tok, "A cat", "dark", use_system_prompt=True, max_tokens=n, **VIDEO)  # exactly at limit: ok
    with pytest.raises(ValueError, match=rf"negative_prompt is \d+ tokens .* limit of {n}"):
        encode_prompts(tok, "A cat", "dark " * 50, use_system_prompt=True, max_tokens=n, **VIDEO)


def test_bad_arguments():
    """The resolver's checks of what a text encode is given (``encode_prompts`` takes only checked values)."""
    with pytest.raises(ValueError, match=r"^prompt=\['A cat'\] must be a string"):
        check_prompt(["A cat"])
    with pytest.raises(ValueError, match="^fps=0 must be a number from 1 to 120"):
        check_clip(9, 64, 96, 0)
    with pytest.raises(ValueError, match=r"^num_frames=0 must be 1 \(an image\) or 4k\+1"):
        check_clip(0, 64, 96, 24)


def test_tokenizer_without_vision_start_rejected(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({"<unk>": 0, "<|im_end|>": 1, "cat": 2}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    plain = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="<|im_end|>")
    with pytest.raises(ValueError, match="vision_start"):
        encode_prompts(plain, "cat", use_system_prompt=False, **VIDEO)


def test_load_tokenizer_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="text_tokenizer/ not found"):
        load_tokenizer(tmp_path)


# ---------------------------------------------------------------------------------------------------------
# checkpoint helpers


def test_default_negative_prompt_formats(tmp_path, nano_dir):
    raw = json.loads((nano_dir / "assets" / "negative_prompt.json").read_text())
    assert default_negative_prompt(nano_dir) == json.dumps(raw)  # what the diffusers docs pass
    assert default_negative_prompt(tmp_path) == ""  # no assets/
    assets = tmp_path / "assets"
    assets.mkdir()
    f = assets / "negative_prompt.json"
    f.write_text(json.dumps({"negative_prompt": "blurry, static"}))
    assert default_negative_prompt(tmp_path) == "blurry, static"
    f.write_text(json.dumps({"negative_prompt": {"summary": "bad"}}))  # non-string field: whole document
    assert default_negative_prompt(tmp_path) == '{"negative_prompt": {"summary": "bad"}}'
    f.write_text('"plain text negative"')
    assert default_negative_prompt(tmp_path) == "plain text negative"
    f.write_text('[\n  "a",\n  "b"\n]\n')
    assert default_negative_prompt(tmp_path) == '["a", "b"]'
    f.write_text("{not json")
    with pytest.raises(ValueError, match="negative_prompt.json is not valid JSON"):
        default_negative_prompt(tmp_path)


def test_default_use_system_prompt_file_rules(tmp_path):
    assert default_use_system_prompt(tmp_path) is True  # no model_index.json
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "Cosmos3OmniPipeline"}))
    assert default_use_system_prompt(tmp_path) is True  # key absent
    (tmp_path / "model_index.json").write_text(json.dumps({"default_use_system_prompt": False}))
    assert default_use_system_prompt(tmp_path) is False
    (tmp_path / "model_index.json").write_text(json.dumps({"default_use_system_prompt": "no"}))
    with pytest.raises(ValueError, match="expected true or false"):
        default_use_system_prompt(tmp_path)
