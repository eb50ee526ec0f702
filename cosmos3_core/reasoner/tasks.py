"""The reasoner's task presets: the chat messages of each task (``question``, ``caption`` — an image or video
described as a video's first moments —, ``expand`` — a short idea expanded into the structured JSON prompt the
generator was trained on) and the answer's post-processing. The wording is ours; the message layout (media
placeholders first in the user turn) follows the reference docs of transformers 5.24.0 ``Cosmos3Omni*``.
"""

from __future__ import annotations

import json

TASKS = ("question", "caption", "expand")

CAPTION_INSTRUCTION = (
    "Describe this {media} as the first moments of a video that will be generated from it. Write one dense "
    "paragraph in the present tense that covers: the main subjects and their appearance (clothing, materials, "
    "colors, size and position in the frame); what each subject is doing and how it is about to move; the setting "
    "and background; the lighting, time of day and weather; and the camera's framing, angle and motion. Describe "
    "only what is visible or clearly implied, be concrete and physical, and do not use lists or a preamble."
)
CAPTION_FOCUS = " The video should show the following: {prompt}"
EXPAND_SYSTEM_PROMPT = (
    "You write prompts for a video generation model. Expand the user's short idea into one detailed, physically "
    "plausible shot. Answer with a single JSON object and nothing else (no markdown, no commentary), with these "
    'keys: "summary" (one sentence), "subjects" (a list of objects with "description": appearance, clothing or '
    'material, size and position in frame), "actions" (a list of objects with "time", e.g. "0-2s", and '
    '"description", in order), "environment" (an object with "setting", "time_of_day", "weather", '
    '"background"), "lighting", "cinematography" (an object with "framing", "camera_angle", "camera_motion", '
    '"lens"), "style" and "audio". Keep every value concrete and visual, describe motion with physical detail '
    "(speed, direction, contact, weight), keep it to a single continuous shot, and add no on-screen text, logos "
    "or cuts unless the idea asks for them."
)
EXPAND_MEDIA_NOTE = "Use the attached {media} as the starting point: keep its subjects, setting and look. "


def build_messages(task: str, prompt: str, *, has_image: bool = False, has_video: bool = False,
                   system_prompt: str | None = None) -> list[dict]:
    """Chat messages of a task preset; media placeholders come first in the user turn (as in the reference docs)."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}.")
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be a string, got {type(prompt).__name__}.")
    if has_image and has_video:
        raise ValueError("give an image or a video, not both.")
    prompt = prompt.strip()
    media = "video" if has_video else "image" if has_image else None
    if task == "caption":
        if media is None:
            raise ValueError("task 'caption' describes an image or a video; connect one (or use task 'question').")
        text = CAPTION_INSTRUCTION.format(media=media) + (CAPTION_FOCUS.format(prompt=prompt) if prompt else "")
    elif not prompt:
        raise ValueError(f"the prompt is empty; task {task!r} needs a question or an idea to work from.")
    elif task == "expand":
        text = (EXPAND_MEDIA_NOTE.format(media=media) if media else "") + f"Idea: {prompt}"
        system_prompt = EXPAND_SYSTEM_PROMPT if system_prompt is None else system_prompt
    else:
        text = prompt
    # plain-string content without media, so text-only chat templates (text_tokenizer/'s) render it too
    content = [{"type": media}, {"type": "text", "text": text}] if media else text
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user", "content": content}]


def postprocess(task: str, text: str) -> str:
    """``expand``: the JSON object of the answer (code fences and chatter dropped) when it parses; else as is."""
    text = text.strip()
    if task != "expand":
        return text
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        try:
            return json.dumps(json.loads(text[start:end + 1]), ensure_ascii=False)
        except json.JSONDecodeError:
            pass
    return text
