"""The Templates page of this pack: the order of its cards and the picture on each.

ComfyUI's Templates dialog shows a pack's ``example_workflows/<Title>.json`` as a card titled by the file name, with
``<Title>.jpg`` as its picture, in the order ``/api/workflow_templates`` lists them (a glob: the file system's order);
a pack cannot give a card a description (frontend 1.32.9 repeats the title under it, 1.58.1 shows none). So the
picture says what the template does and what it needs: a card rendered here with the mode's name, its inputs → its
outputs, and the checkpoint it expects, coloured by what it makes. ``CARDS`` lists the templates in the order the
dialog shows them (the common modes first); ``web/template_order.json`` carries that order to the pack's frontend
extension (``web/cosmos3_templates.js``), which sorts the pack's cards by it.

    python example_workflows/thumbnails.py          # rewrite every <Title>.jpg and web/template_order.json

Only Pillow is needed (its built-in font, so every machine draws the same picture).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

HERE = Path(__file__).resolve().parent
ORDER_FILE = HERE.parent / "web" / "template_order.json"
SIZE = (480, 320)  # 3:2, as both frontends crop a card's picture
SCALE = 2  # drawn at twice the size, then reduced: smooth edges in a JPEG
BACKGROUND = (24, 26, 32)
INK, DIM = (240, 242, 246), (150, 156, 168)
CHIP_H, PITCH = 36, 44  # a chip's height and the distance between two (unscaled px)


@dataclass(frozen=True)
class Kind:
    label: str
    accent: tuple[int, int, int]


SOUND = Kind("VIDEO + SOUND", (45, 196, 170))
VIDEO = Kind("VIDEO", (78, 140, 255))
IMAGE = Kind("IMAGE", (245, 176, 65))
LONG = Kind("LONG VIDEO", (160, 110, 245))
FAST = Kind("4 STEPS", (240, 98, 120))
WORLD = Kind("WORLD MODEL", (110, 200, 90))


@dataclass(frozen=True)
class Card:
    title: str  # the workflow's file name without .json (the card's title)
    name: str  # the mode, as the picture shows it
    kind: Kind
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    model: str


CLIP = "720p video, 7.9 s"  # 1280x720, 189 frames at 24 fps
NANO = "Cosmos3-Nano"
CARDS = (
    Card("Cosmos3 Video with Sound", "Video with Sound", SOUND, ("prompt",), (CLIP, "stereo sound"), NANO),
    Card("Cosmos3 Text to Video", "Text to Video", VIDEO, ("prompt",), (CLIP,), NANO),
    Card("Cosmos3 Image to Video", "Image to Video", VIDEO, ("start image", "prompt"), (CLIP,), NANO),
    Card("Cosmos3 Text to Image", "Text to Image", IMAGE, ("prompt",), ("1280x720 image",), NANO),
    Card("Cosmos3 First+Last Frame", "First + Last Frame", VIDEO, ("first image", "last image", "prompt"), (CLIP,),
         NANO),
    Card("Cosmos3 Video to Video", "Video to Video", VIDEO, ("your clip", "prompt"), ("its continuation", CLIP),
         NANO),
    Card("Cosmos3 Auto-Prompt I2V", "Auto-Prompt I2V", VIDEO, ("start image",), ("caption (Reasoner)", CLIP),
         NANO),
    Card("Cosmos3 Long Video (30 s)", "Long Video", LONG, ("prompt",), ("720p video, 30 s", "189-frame windows"),
         NANO),
    Card("Cosmos3 Transfer (Canny)", "Transfer (Canny)", LONG, ("your clip", "prompt"), ("new video,", "same edges"),
         NANO),
    Card("Cosmos3 Edge I2V (480p)", "Edge Image to Video", VIDEO, ("start image", "prompt"), ("480p video, 5 s",),
         "Cosmos3-Edge"),
    Card("Cosmos3 Super 4-Step T2I", "Text to Image, 4 steps", FAST, ("prompt",), ("1280x720 image",),
         "Super-Text2Image-4Step"),
    Card("Cosmos3 Super 4-Step I2V", "Image to Video, 4 steps", FAST, ("start image", "prompt"), (CLIP,),
         "Super-Image2Video-4Step"),
    Card("Cosmos3 Action Policy", "Action Policy", WORLD, ("start frame", "instruction"),
         ("future video", "robot actions"), NANO),
    Card("Cosmos3 Forward Dynamics", "Forward Dynamics", WORLD, ("start frame", "robot actions"),
         ("the video they make",), NANO),
    Card("Cosmos3 Inverse Dynamics", "Inverse Dynamics", WORLD, ("robot clip",), ("its robot actions",), NANO),
)


def font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size * SCALE)


def chip(draw: ImageDraw.ImageDraw, x: float, y: float, text: str, fill, room: float, size: int = 23) -> None:
    """A rounded label ``size`` px high at (x, y) (unscaled px), its text made smaller if wider than ``room``."""
    f = font(size)
    while draw.textlength(text, font=f) / SCALE + 20 > room and f.size > 16 * SCALE:
        f = ImageFont.load_default(size=f.size - SCALE)
    w, h = draw.textlength(text, font=f) / SCALE + 20, CHIP_H
    draw.rounded_rectangle([x * SCALE, y * SCALE, (x + w) * SCALE, (y + h) * SCALE], radius=9 * SCALE, fill=fill)
    draw.text(((x + 10) * SCALE, (y + h / 2) * SCALE), text, font=f, fill=INK, anchor="lm")


def arrow(draw: ImageDraw.ImageDraw, x: float, y: float, color) -> None:
    """→ centred at (x, y) (the built-in font has no arrow glyph)."""
    s = SCALE
    draw.line([(x - 14) * s, y * s, (x + 6) * s, y * s], fill=color, width=4 * s)
    draw.polygon([((x + 14) * s, y * s), ((x + 2) * s, (y - 9) * s), ((x + 2) * s, (y + 9) * s)], fill=color)


def column(draw: ImageDraw.ImageDraw, x: float, mid: float, texts, fill, room: float) -> None:
    top = mid - (len(texts) * PITCH - (PITCH - CHIP_H)) / 2
    for i, text in enumerate(texts):
        chip(draw, x, top + i * PITCH, text, fill, room)


def render(card: Card) -> Image.Image:
    w, h = SIZE
    s = SCALE
    im = Image.new("RGB", (w * s, h * s), BACKGROUND)
    draw = ImageDraw.Draw(im)
    accent = card.kind.accent
    soft = tuple(int(0.3 * a + 0.7 * b) for a, b in zip(accent, BACKGROUND))
    draw.rectangle([0, 0, w * s, 10 * s], fill=accent)
    draw.text((24 * s, 36 * s), card.kind.label, font=font(19), fill=accent, anchor="lm", stroke_width=1,
              stroke_fill=accent)
    title = font(40 if len(card.name) <= 18 else 32)
    draw.text((24 * s, 80 * s), card.name, font=title, fill=INK, anchor="lm", stroke_width=2, stroke_fill=INK)
    mid = 182
    column(draw, 24, mid, card.inputs, (54, 58, 68), room=170)
    arrow(draw, 214, mid, accent)
    column(draw, 240, mid, card.outputs, soft, room=216)
    draw.line([24 * s, 258 * s, (w - 24) * s, 258 * s], fill=(58, 62, 72), width=s)
    draw.text((24 * s, 288 * s), "model", font=font(19), fill=DIM, anchor="lm")
    draw.text((90 * s, 288 * s), card.model, font=font(23), fill=INK, anchor="lm", stroke_width=1, stroke_fill=INK)
    return im.resize(SIZE, Image.LANCZOS)


def thumbnail_path(card: Card) -> Path:
    return HERE / f"{card.title}.jpg"


def write_all() -> list[Path]:
    written = []
    for card in CARDS:
        render(card).save(thumbnail_path(card), "JPEG", quality=95, subsampling=0)  # sharp text
        written.append(thumbnail_path(card))
    ORDER_FILE.parent.mkdir(exist_ok=True)
    ORDER_FILE.write_text(json.dumps([card.title for card in CARDS], indent=2) + "\n")
    return written


if __name__ == "__main__":
    for path in write_all():
        print(path)
