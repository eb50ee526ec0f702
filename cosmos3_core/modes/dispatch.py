"""The mode table: which function generates each mode of a resolved request, and ``generate`` for a whole
``Request`` (resolve once, then run the mode). The CLI router and the library share it.

| mode       | asks for                                                      | runs                          |
|------------|---------------------------------------------------------------|-------------------------------|
| ``clip``     | text/image/video → an image or one clip (≤ 189 frames)        | ``modes.clip.generate_clip``        |
| ``windows``  | a video past one clip (``num_frames`` > 189 or frames_per_chunk) | ``modes.long_video.generate_long`` |
| ``transfer`` | a video steered by control videos (edge/blur/depth/seg/wsm)   | ``modes.long_video.generate_long`` |
| ``action``   | policy / forward dynamics / inverse dynamics (``ActionRequest``) | ``modes.action.generate_action``   |

``generate`` returns a ``GenerationOutput``; a windowed or Transfer video is collected whole in memory there
(``FrameCollector``) — stream it to a file with ``generate_long`` and a sink instead (what the CLI and the ComfyUI
node do).
"""

from __future__ import annotations

from typing import Callable

from ..pipeline import Cosmos3Pipeline, GenerationOutput
from ..request import Request, resolve
from .action import generate_action
from .clip import generate_clip
from .long_video import generate_long
from .stream_decode import FrameCollector


def _windows(pipe: Cosmos3Pipeline, run, callback=None, decode: bool = True) -> GenerationOutput:
    frames = FrameCollector()

    def progress(k: int, n: int, step: int, total: int, preview) -> None:
        if callback is not None:
            callback(k * total + step, n * total, preview)

    result = generate_long(pipe, run, [frames], progress=progress)
    return GenerationOutput(latents=None, sound_latent=None, frames=frames.frames(), waveform=frames.waveform(),
                            timings={"denoise": sum(result.timings["denoise"]),
                                     "decode": sum(result.timings["decode"])})


MODES: dict[str, Callable[..., GenerationOutput]] = {
    "clip": generate_clip,
    "windows": _windows,
    "transfer": _windows,
    "action": generate_action,
}


def generate(pipe: Cosmos3Pipeline, request: Request, callback=None, decode: bool = True) -> GenerationOutput:
    """Resolve ``request`` on ``pipe``'s checkpoint (every default and check, before any model work) and run its
    mode. ``callback(step, total, x0_preview)`` after every denoising step (windows: counted over all windows)."""
    run = resolve(request, pipe.info)
    return MODES[run.mode](pipe, run, callback=callback, decode=decode)
