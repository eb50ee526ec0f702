"""Cosmos3 prompt processing: metadata templates, system prompt, chat template, token ids.

Mirrors ``Cosmos3OmniPipeline.tokenize_prompt`` of diffusers 0.42.1 (pipelines/cosmos/pipeline_cosmos3_omni.py,
non-action modes) token for token, in these steps:

1. Metadata sentences are appended with ``_append`` (strip trailing "." from the text, then ``"{text}. {s}"``, or
   just ``s`` for empty text). Video (``num_frames > 1``): duration/FPS then resolution; image: resolution only.
   The negative prompt gets the "is not" forms of the same sentences. Both are switchable.
2. Optional system message — the trained text says "from a give prompt" (sic); do not fix the typo.
3. The checkpoint's own chat template renders ``[system?, user]`` with ``add_generation_prompt=True`` and
   ``add_vision_id=False``; then ``[eos, <|vision_start|>]`` are appended (Qwen: 151645, 151652).

User text is text. The reference tokenizes the rendered chat as one string, so a control token typed into a
prompt (``<|im_start|>``, ``<|vision_start|>``, ``<|image_pad|>`` …) would become that control token and forge
the chat structure. Here a prompt that contains one is tokenized in three pieces: the template before the user
text and after it as the reference does (their control tokens stay control tokens), and the user text — joined to
the template's plain text around it, exactly the span the tokenizer would encode as one piece anyway — with
``split_special_tokens=True``, i.e. as the characters it is made of. Prompts without such strings take the
reference path unchanged (token-for-token parity); for them both ways give the same ids (tested on the real Qwen
BPE tokenizer). Non-special added tokens (``<tool_call>``) are ordinary vocabulary and stay as they are. A prompt
that is not valid Unicode text (a non-UTF-8 byte from the command line, a lone surrogate from JSON) is refused
with its position.

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

    @property
    def prefill_tokens(self) -> int:
        """Rows of the one text-tower pass that prefills both prompts (``Cosmos3Pipeline.prefill_prompts``); at most
        this many: equal prompts and a distilled checkpoint prefill ``cond`` alone."""
        return len(self.cond) + len(self.uncond)


# --------------------------------------------------------------------------------------------------------------
# Checkpoint helpers


WINDOW_PROMPT_SEPARATOR = "---"  # a line holding only this separates a long video's per-window prompts


def split_window_prompts(text: str) -> list[str]:
    """A long video's per-window prompts: ``text`` split at lines that hold only ``---`` (spaces or tabs around it
    allowed; ``\n``, ``\r\n`` and ``\r`` line endings alike), each part stripped. A leading, trailing or doubled
    separator gives an empty prompt (refused by the resolver, naming the window), never a separator inside a prompt."""
    parts: list[list[str]] = [[]]
    for line in text.splitlines():
        if line.strip() == WINDOW_PROMPT_SEPARATOR:
            parts.append([])
        else:
            parts[-1].append(line)
    return ["\n".join(lines).strip() for lines in parts]


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


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}).") from e


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
    value = _read_json(path)
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
    value = _read_json(path)
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


def check_text(value: str, name: str) -> None:
    """Refuse a string that is not valid Unicode text (it cannot be tokenized): a lone surrogate, which is what a
    non-UTF-8 command-line byte becomes in Python (``surrogateescape``) or what JSON's ``"\\ud800"`` decodes to."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(value[exc.start])
        what = (f"the byte 0x{code - 0xDC00:02x}, which is not UTF-8," if 0xDC80 <= code <= 0xDCFF
                else f"a lone surrogate U+{code:04X}, which is not a character,")
        raise ValueError(f"{name} contains {what} at character {exc.start}; give the text as UTF-8 "
                         "(re-save the file or fix the terminal encoding) or remove that character.") from None


def control_tokens(tokenizer) -> list[str]:
    """The tokenizer's special (control) token strings, longest first."""
    found = {str(t) for t in getattr(tokenizer, "all_special_tokens", [])}
    added = getattr(tokenizer, "added_tokens_decoder", {}).values()
    found |= {t.content for t in added if getattr(t, "special", False)}
    return sorted((t for t in found if t), key=len, reverse=True)


def control_tokens_in(tokenizer, text: str) -> list[str]:
    """The control-token strings that occur in ``text`` (user text), in the order of ``control_tokens``."""
    return [t for t in control_tokens(tokenizer) if t in text]


def _messages(text: str, system_prompt: str | None) -> list[dict]:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
    messages.append({"role": "user", "content": text})
    return messages


def _render(tokenizer, text: str, system_prompt: str | None) -> str:
    return tokenizer.apply_chat_template(_messages(text, system_prompt), tokenize=False, add_generation_prompt=True,
                                         add_vision_id=False)


def _chat_ids(tokenizer, text: str, system_prompt: str | None) -> list[int]:
    if control_tokens_in(tokenizer, text):
        return chat_ids_user_text_as_text(tokenizer, text, system_prompt)
    enc = tokenizer.apply_chat_template(_messages(text, system_prompt), tokenize=True, add_generation_prompt=True,
                                        add_vision_id=False, return_dict=True)
    return [int(i) for i in enc["input_ids"]]


def chat_ids_user_text_as_text(tokenizer, text: str, system_prompt: str | None) -> list[int]:
    """Chat-template ids in which control-token strings inside ``text`` are plain characters (module docstring)."""
    marker = "\x00cosmos3-user-text\x00"
    head, found, tail = _render(tokenizer, marker, system_prompt).partition(marker)
    if not found or head + text + tail != _render(tokenizer, text, system_prompt):
        tokens = control_tokens_in(tokenizer, text)
        raise ValueError(f"the prompt contains the chat-template control token(s) {tokens}, "
                         "which this checkpoint's chat template cannot keep as plain text; remove them.")
    specials = control_tokens(tokenizer)
    cut_head = max((head.rfind(t) + len(t) for t in specials if t in head), default=0)
    cut_tail = min((tail.find(t) for t in specials if t in tail), default=len(tail))

    def encode(piece: str, as_text: bool) -> list[int]:
        if not piece:
            return []
        ids = tokenizer(piece, add_special_tokens=False, split_special_tokens=as_text)["input_ids"]
        return [int(i) for i in ids]

    return (encode(head[:cut_head], False) + encode(head[cut_head:] + text + tail[:cut_tail], True)
            + encode(tail[cut_tail:], False))


def _check_args(prompt, negative_prompt, num_frames, height, width, fps, max_tokens) -> None:
    """Invariants of checked arguments (the resolver's ``checks.check_prompt`` / ``check_clip`` give the messages)."""
    assert isinstance(prompt, str) and prompt.strip(), prompt
    assert negative_prompt is None or isinstance(negative_prompt, str), negative_prompt
    assert all(isinstance(v, int) and v >= 1 for v in (num_frames, height, width, max_tokens))
    assert isinstance(fps, Real) and math.isfinite(float(fps)) and fps > 0, fps


TEMPLATES = ("duration", "resolution")  # tokenize_prompt's add_duration_template / add_resolution_template


def encode_prompts(tokenizer, prompt: str, negative_prompt: str | None = None, *, num_frames: int, height: int,
                   width: int, fps: float, use_system_prompt: bool, templates: tuple[str, ...] = TEMPLATES,
                   max_tokens: int = DEFAULT_MAX_TOKENS) -> PromptIds:
    """Token ids of ``prompt`` (cond) and ``negative_prompt`` (uncond; ``None`` means ``""``), as
    ``Cosmos3OmniPipeline.tokenize_prompt`` builds them. ``num_frames == 1`` selects the image templates and
    system prompt. ``fps`` may be an int, float or ``Fraction``. ``templates``: which of the reference's metadata
    sentences to add (``TEMPLATES``: both, its default). Either sequence longer than ``max_tokens`` (special tokens
    included) is an error."""
    _check_args(prompt, negative_prompt, num_frames, height, width, fps, max_tokens)
    fps = float(fps)  # Fraction.__format__ has no "f" before Python 3.12; float formats identically
    if negative_prompt is None:
        negative_prompt = ""
    system_prompt = None
    if use_system_prompt:
        system_prompt = SYSTEM_PROMPT_IMAGE if num_frames == 1 else SYSTEM_PROMPT_VIDEO

    common = dict(num_frames=num_frames, height=height, width=width, fps=fps,
                  add_duration_template="duration" in templates, add_resolution_template="resolution" in templates)
    cond_text = apply_templates(prompt, **common)
    uncond_text = apply_templates(negative_prompt, negative=True, **common)
    return branch_ids(tokenizer, cond_text, uncond_text, system_prompt, max_tokens,
                      after="templates and chat formatting", fix="shorten it (or raise max_tokens)")


def branch_ids(tokenizer, cond_text: str, uncond_text: str, system_prompt: str | None, max_tokens: int, *,
               after: str, fix: str) -> PromptIds:
    """Both branches' ids as the reference packs them: the chat-formatted text, then ``[eos, <|vision_start|>]``;
    a branch longer than ``max_tokens`` is refused, naming it."""
    eos, vision_start = _special_ids(tokenizer)
    cond = _chat_ids(tokenizer, cond_text, system_prompt) + [eos, vision_start]
    uncond = _chat_ids(tokenizer, uncond_text, system_prompt) + [eos, vision_start]
    for name, ids in (("prompt", cond), ("negative_prompt", uncond)):
        if len(ids) > max_tokens:
            raise ValueError(f"{name} is {len(ids)} tokens after {after}, over the limit of {max_tokens}; {fix}.")
    return PromptIds(cond=cond, uncond=uncond, cond_text=cond_text, uncond_text=uncond_text)
