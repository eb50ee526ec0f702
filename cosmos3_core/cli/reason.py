"""Command-line reasoner: ``python -m cosmos3_core.reason --checkpoint DIR --prompt TEXT [--image P | --video P]``.

Answers a question (``--task question``), captions an image/video for image-to-video (``caption``) or expands a
short idea into the structured JSON prompt the generator works best with (``expand``), and prints the text to
stdout. Only the understanding tower (+ ``lm_head``) and, for media, ``vision_encoder/`` are loaded
(``model.loader.load_text_tower``). Plays the role of transformers' ``Cosmos3OmniForConditionalGeneration`` /
``Cosmos3EdgeForConditionalGeneration`` ``generate`` examples. A user mistake exits with one ``error:`` line on
stderr and status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import math

from ..checks import check_options
from ..config import DTYPES
from . import common


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cosmos3_core.reason", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, help="local Cosmos3 checkpoint folder (Hub layout)")
    p.add_argument("--prompt", required=True, help="the question, the idea to expand, or caption guidance")
    media = p.add_mutually_exclusive_group()
    media.add_argument("--image", default=None, help="an image file to look at")
    media.add_argument("--video", default=None, help="a video file to look at (frames sampled at ~2 fps)")
    p.add_argument("--task", choices=("question", "caption", "expand"), default="question")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-video-frames", type=int, default=2048, help="frames read from --video at most")
    common.add_run_options(p, attention_help="attention kernels: auto (the grouped-head decode route, SDPA "
                                              "elsewhere), sdpa (always PyTorch SDPA), flash4 (FlashAttention-4)")
    return p


def _check_args(args: argparse.Namespace):
    from ..reasoner.reasoner import SamplingParams

    ckpt = common.check_input_paths(args)
    check_options(common.runtime_options(args))
    if args.task == "caption" and args.image is None and args.video is None:
        raise ValueError("--task caption needs --image or --video.")
    if (args.image or args.video) and not (ckpt / "vision_encoder").is_dir():
        raise ValueError(f"checkpoint {ckpt} has no vision_encoder/ folder, so it cannot look at images or video.")
    if not args.prompt.strip() and args.task != "caption":
        raise ValueError(f"--prompt is empty; --task {args.task} needs a question or an idea.")
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, repetition_penalty=args.repetition_penalty, seed=args.seed)
    params.validate()
    return params


def run(args: argparse.Namespace) -> str:
    from .. import media
    from ..reasoner.reasoner import Cosmos3Reasoner

    params = _check_args(args)
    image = video = fps = None
    if args.image:
        image = media.read_image(args.image)
    if args.video:
        video, fps = media.read_video(args.video, max_frames=args.max_video_frames)
        if not math.isfinite(fps) or fps <= 0:
            fps = 24.0  # the reference processors' fallback when a container has no rate
    reasoner = Cosmos3Reasoner.load(args.checkpoint, dtype=DTYPES[args.dtype], device=args.device)
    out = reasoner.generate(args.prompt, task=args.task, image=image, video=video, fps=fps, params=params,
                            options=common.runtime_options(args))
    return out.text


def main(argv: list[str] | None = None) -> int:
    ok, text = common.run_reporting_user_errors(run, build_parser().parse_args(argv))
    if not ok:
        return 2
    print(text)
    return 0

