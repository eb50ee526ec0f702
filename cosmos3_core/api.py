"""The library's front door: ``generate`` runs a whole ``Request`` (resolve once, then its mode), and ``plan``
builds one run's plan from sampling arguments (resolve the sampler's stage, then ``Cosmos3Pipeline.plan``).

| mode         | asks for                                                         | runs                        |
|--------------|------------------------------------------------------------------|-----------------------------|
| ``clip``     | text/image/video → an image or one clip (≤ 189 frames)           | ``clip.generate_clip``      |
| ``windows``  | a video past one clip (``num_frames`` > 189 or frames_per_chunk) | ``long_video.generate_long``|
| ``transfer`` | a video steered by control videos (edge/blur/depth/seg/wsm)      | ``long_video.generate_long``|
| ``action``   | policy / forward dynamics / inverse dynamics (``ActionRequest``) | ``action.generate_action``  |

(the runners live in ``modes/``)

``generate`` returns a ``GenerationOutput``; a windowed or Transfer video is collected whole in memory there
(``FrameCollector``) — stream it to a file with ``generate_long`` and a sink instead (what the CLI and the ComfyUI
node do).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Callable

from .modes.action import ActionCondition, generate_action
from .modes.action import plan as action_plan
from .modes.clip import generate_clip
from .modes.long_video import generate_long
from .modes.stream_decode import FrameCollector
from .pipeline import Cosmos3Pipeline, GenerationOutput
from .request import ConditionLatents, Request, Resolved, SamplingRequest
from .resolve import resolve, resolve_sampler
from .runtime import DEFAULT, RuntimeOptions
from .sampling.plan import Prepare, SamplePlan, no_prepare

__all__ = ["GENERATORS", "generate", "plan"]


def _windows(pipe: Cosmos3Pipeline, resolved: Resolved, callback=None, decode: bool = True) -> GenerationOutput:
    frames = FrameCollector()

    def progress(k: int, n: int, step: int, total: int, preview) -> None:
        if callback is not None:
            callback(k * total + step, n * total, preview)

    result = generate_long(pipe, resolved, [frames], progress=progress)
    return GenerationOutput(latents=None, sound_latent=None, frames=frames.frames(), waveform=frames.waveform(),
                            timings={"denoise": sum(result.timings["denoise"]),
                                     "decode": sum(result.timings["decode"])})


GENERATORS: dict[str, Callable[..., GenerationOutput]] = {
    "clip": generate_clip,
    "windows": _windows,
    "transfer": _windows,
    "action": generate_action,
}


def generate(pipe: Cosmos3Pipeline, request: Request, callback=None, decode: bool = True) -> GenerationOutput:
    """Resolve ``request`` on ``pipe``'s checkpoint (every default and check, before any model work) and run its
    mode. ``callback(step, total, x0_preview)`` after every denoising step (windows: counted over all windows)."""
    resolved = resolve(request, pipe.info)
    return GENERATORS[resolved.mode](pipe, resolved, callback=callback, decode=decode)


_SAMPLING_ARGS = frozenset(f.name for f in fields(SamplingRequest))


def plan(pipe: Cosmos3Pipeline, text, *, x0=None, clean_frames=(), action: ActionCondition | None = None,
         generator=None, device=None, options: RuntimeOptions = DEFAULT, prepare: Prepare = no_prepare,
         **sampling_args) -> SamplePlan:
    """The plan of one run on encoded ``text`` (a ``TextConditioning``): the sampling arguments (``seed``,
    ``steps``, ``guidance``, …, the fields of ``SamplingRequest``) resolved for the sampler's stage, then
    ``Cosmos3Pipeline.plan`` — the stages a Python user chains by hand, with the checks a sampler node gets.
    ``x0``/``clean_frames``: clean latents of the clip ``text`` describes; ``action``: an action run's condition
    (``modes.action.encode_action_condition``); ``prepare``: a model manager's hook (``Cosmos3Pipeline.plan``)."""
    unknown = sorted(set(sampling_args) - _SAMPLING_ARGS)
    if unknown:
        raise TypeError(f"plan: unknown arguments {unknown}; the sampling arguments are {sorted(_SAMPLING_ARGS)}.")
    condition = None if x0 is None else ConditionLatents(x0, tuple(clean_frames), text.height, text.width, "latents")
    sampling = resolve_sampler(pipe.info, text, SamplingRequest(**sampling_args), condition=condition,
                               action=action)
    if action is not None:
        return action_plan(pipe, text, action, sampling, device=device, options=options, prepare=prepare)
    return pipe.plan(text, sampling, x0=x0, clean_frames=clean_frames, generator=generator, device=device,
                     options=options, prepare=prepare)
