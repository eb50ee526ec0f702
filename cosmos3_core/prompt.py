"""Cosmos3 prompt processing: metadata templates, system prompt, chat template, token ids.

Mirrors ``Cosmos3OmniPipeline.tokenize_prompt`` of diffusers 0.42.1 (pipelines/cosmos/pipeline_cosmos3_omni.py,
non-action modes) token for token; architecture.md §9 describes the steps:

1. Metadata sentences are appended with ``_append`` (strip trailing "." from the text, then ``"{text}. {s}"``, or
   just ``s`` for empty text). Video (``num_frames > 1``): duration/FPS then resolution; image: resolution only.
   The negative prompt gets the "is not" forms of the same sentences. Both are switchable.
2. Optional system message — the trained text says "from a give prompt" (sic); do not fix the typo.
3. The checkpoint's own chat template renders ``[system?, user]`` with ``add_generation_prompt=True`` and
   ``add_vision_id=False``; then ``[eos, <|vision_start|>]`` are appended (Qwen: 151645, 151652).

Cond and uncond are tokenized separately and have different lengths. The checkpoint helpers read
``text_tokenizer/``, ``model_index.json`` (``default_use_system_prompt``: True Nano/Super, False Edge) and
``assets/negative_prompt.json`` (NVIDIA's recommended structured negative, a JSON document).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from numbers import Real
from pathlib import Path
from typing import Any

# Exact trained strings (diffusers ``_SYSTEM_PROMPT_*`` and the templates set in ``Cosmos3OmniPipeline.__init__``).
SYSTEM_PROMPT_VIDEO = "You are a helpful assistant who will generate videos from a give prompt."
SYSTEM_PROMPT_IMAGE = "You are a helpful assistant who will generate images from a give prompt."
DURATION_TEMPLATE = "The video is {duration:.1f} seconds long and is of {fps:.0f} FPS."
VIDEO_RESOLUTION_TEMPLATE = "This video is of {height}x{width} resolution."
IMAGE_RESOLUTION_TEMPLATE = "This image is of {height}x{width} resolution."
INVERSE_DURATION_TEMPLATE = "The video is not {duration:.1f} seconds long and is not of {fps:.0f} FPS."
INVERSE_VIDEO_RESOLUTION_TEMPLATE = "This video is not of {height}x{width} resolution."
INVERSE_IMAGE_RESOLUTION_TEMPLATE = "This image is not of {height}x{width} resolution."

VISION_START_TOKEN = "<|vision_start|>"
DEFAULT_MAX_TOKENS = 4096  # the text length serving stacks accept (max_sequence_length=4096)


@dataclass(frozen=True)
class PromptIds:
    """Token ids for one sample: ``cond`` (prompt) and ``uncond`` (negative prompt), each ending
    ``[eos, <|vision_start|>]``. ``cond_text``/``uncond_text`` are the user messages after the metadata
    templates, i.e. exactly the text the chat template wrapped (diffusers' ``cond_text``/``uncond_text``)."""

    cond: list[int]
    uncond: list[int]
    cond_text: str
    uncond_text: str


# --------------------------------------------------------------------------------------------------------------
# Checkpoint helpers


def load_tokenizer(checkpoint_dir):
    """Load ``<checkpoint_dir>/text_tokenizer`` with ``AutoTokenizer`` (offline, no remote code)."""
    from transformers import AutoTokenizer  # deferred: importing transformers is slow

    tok_dir = Path(checkpoint_dir) / "text_tokenizer"
    if not tok_dir.is_dir():
        raise FileNotFoundError(
            f"load_tokenizer: text_tokenizer/ not found under {Path(checkpoint_dir)}; point checkpoint_dir at a "
            "Hub-layout Cosmos3 folder (the one holding model_index.json, transformer/, vae/, text_tokenizer/).")
    try:
        return AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"load_tokenizer: could not load the tokenizer in {tok_dir}: {e}") from e


def _read_json(path: Path, who: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{who}: {path} is not valid JSON ({e}).") from e


def default_negative_prompt(checkpoint_dir, filename: str = "negative_prompt.json") -> str:
    """The checkpoint's recommended negative prompt from ``assets/<filename>``, or ``""`` if there is none.

    Rule: a JSON object whose ``"negative_prompt"`` field is a string gives that string; a top-level JSON
    string gives itself; any other JSON value (NVIDIA's file is a structured "bad video" caption object) is
    passed as its re-serialization ``json.dumps(value)`` — default separators ``", "``/``": "`` and ASCII
    escapes, exactly what the diffusers Cosmos3 docs (``negative_prompt=json.dumps(json.load(f))``) feed the
    pipeline. Formatting of the file itself (indentation, key spacing) therefore does not matter.
    """
    path = Path(checkpoint_dir) / "assets" / filename
    if not path.is_file():
        return ""
    value = _read_json(path, "default_negative_prompt")
    if isinstance(value, dict) and isinstance(value.get("negative_prompt"), str):
        return value["negative_prompt"]
    if isinstance(value, str):
        return value
    return json.dumps(value)


def default_use_system_prompt(checkpoint_dir) -> bool:
    """``default_use_system_prompt`` from ``model_index.json`` (True Nano/Super, False Edge); True if absent."""
    path = Path(checkpoint_dir) / "model_index.json"
    if not path.is_file():
        return True
    value = _read_json(path, "default_use_system_prompt")
    flag = value.get("default_use_system_prompt", True) if isinstance(value, dict) else True
    if not isinstance(flag, bool):
        raise ValueError(f"default_use_system_prompt: {path} has default_use_system_prompt={flag!r}; "
                         "expected true or false.")
    return flag


# --------------------------------------------------------------------------------------------------------------
# Templates and tokenization


def _append(base: str, addition: str) -> str:
    """diffusers' ``_append``: drop trailing periods of ``base``, then join with ". " (or start fresh)."""
    base = base.rstrip(".")
    return f"{base}. {addition}" if base else addition


def apply_templates(text: str, *, num_frames: int, height: int, width: int, fps: float, negative: bool = False,
                    add_duration_template: bool = True, add_resolution_template: bool = True) -> str:
    """Append the duration/FPS (video only) and resolution sentences ("is not" forms when ``negative``)."""
    is_image = num_frames == 1
    if not is_image and add_duration_template:
        template = INVERSE_DURATION_TEMPLATE if negative else DURATION_TEMPLATE
        text = _append(text, template.format(duration=num_frames / fps, fps=fps))
    if add_resolution_template:
        if is_image:
            template = INVERSE_IMAGE_RESOLUTION_TEMPLATE if negative else IMAGE_RESOLUTION_TEMPLATE
        else:
            template = INVERSE_VIDEO_RESOLUTION_TEMPLATE if negative else VIDEO_RESOLUTION_TEMPLATE
        text = _append(text, template.format(height=height, width=width))
    return text


def _special_ids(tokenizer) -> tuple[int, int]:
    """``(eos, <|vision_start|>)`` ids; a tokenizer without them is not a Cosmos3 text tokenizer."""
    eos = tokenizer.eos_token_id
    vs = tokenizer.convert_tokens_to_ids(VISION_START_TOKEN)
    if eos is None:
        raise ValueError("encode_prompts: the tokenizer has no eos_token; load the checkpoint's text_tokenizer/ "
                         "(its tokenizer_config.json sets eos_token = <|im_end|>).")
    if vs is None or vs == tokenizer.unk_token_id:
        raise ValueError(f"encode_prompts: the tokenizer has no {VISION_START_TOKEN} token; load the checkpoint's "
                         "text_tokenizer/ rather than a generic tokenizer.")
    return int(eos), int(vs)


def _chat_ids(tokenizer, text: str, system_prompt: str | None) -> list[int]:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
    messages.append({"role": "user", "content": text})
    enc = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, add_vision_id=False,
                                        return_dict=True)
    return [int(i) for i in enc["input_ids"]]


def _check_args(prompt, negative_prompt, num_frames, height, width, fps, max_tokens) -> None:
    if not isinstance(prompt, str):
        raise TypeError(f"encode_prompts: prompt must be a str, got {type(prompt).__name__}.")
    if not prompt.strip():
        raise ValueError("encode_prompts: prompt is empty; describe the scene to generate (a JSON-upsampled "
                         "caption works best), or use negative_prompt for what to avoid.")
    if negative_prompt is not None and not isinstance(negative_prompt, str):
        raise TypeError(f"encode_prompts: negative_prompt must be a str or None, got "
                        f"{type(negative_prompt).__name__}.")
    for name, v in (("num_frames", num_frames), ("height", height), ("width", width), ("max_tokens", max_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"encode_prompts: {name} must be a positive int, got {v!r}.")
    if isinstance(fps, bool) or not isinstance(fps, Real) or not math.isfinite(float(fps)) or fps <= 0:
        raise ValueError(f"encode_prompts: fps must be a positive number, got {fps!r}.")


def encode_prompts(tokenizer, prompt: str, negative_prompt: str | None = None, *, num_frames: int, height: int,
                   width: int, fps: float, use_system_prompt: bool, add_duration_template: bool = True,
                   add_resolution_template: bool = True, max_tokens: int = DEFAULT_MAX_TOKENS) -> PromptIds:
    """Token ids of ``prompt`` (cond) and ``negative_prompt`` (uncond; ``None`` means ``""``), as
    ``Cosmos3OmniPipeline.tokenize_prompt`` builds them. ``num_frames == 1`` selects the image templates and
    system prompt. ``fps`` may be an int, float or ``Fraction``. Either sequence longer than ``max_tokens``
    (special tokens included) is an error."""
    _check_args(prompt, negative_prompt, num_frames, height, width, fps, max_tokens)
    fps = float(fps)  # Fraction.__format__ has no "f" before Python 3.12; float formats identically
    eos, vision_start = _special_ids(tokenizer)
    if negative_prompt is None:
        negative_prompt = ""
    system_prompt = None
    if use_system_prompt:
        system_prompt = SYSTEM_PROMPT_IMAGE if num_frames == 1 else SYSTEM_PROMPT_VIDEO

    common = dict(num_frames=num_frames, height=height, width=width, fps=fps,
                  add_duration_template=add_duration_template, add_resolution_template=add_resolution_template)
    cond_text = apply_templates(prompt, **common)
    uncond_text = apply_templates(negative_prompt, negative=True, **common)
    cond = _chat_ids(tokenizer, cond_text, system_prompt) + [eos, vision_start]
    uncond = _chat_ids(tokenizer, uncond_text, system_prompt) + [eos, vision_start]
    for name, ids in (("prompt", cond), ("negative_prompt", uncond)):
        if len(ids) > max_tokens:
            raise ValueError(f"encode_prompts: {name} is {len(ids)} tokens after templates and chat formatting, "
                             f"over the limit of {max_tokens}; shorten it (or raise max_tokens).")
    return PromptIds(cond=cond, uncond=uncond, cond_text=cond_text, uncond_text=uncond_text)
