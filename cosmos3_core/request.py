"""The vocabulary of a Cosmos3 run: what a user asks (``Request``), what a checkpoint decides (``CheckpointInfo``)
and what a run is once nothing is left to decide (``Resolved``, with its ``Sampling``).

A ``Request`` holds the arguments of diffusers 0.42.1 ``Cosmos3OmniPipeline.__call__``, of the modular Transfer and
action pipelines (``CosmosActionCondition``: ``ActionRequest``) and of the windowed long video, plus the per-run
``RuntimeOptions``; ``None`` means "the default". ``resolve.resolve`` turns a request into a ``Resolved`` run — every
default and every check, once, before any model work; the stages (``pipeline.py``) and modes (``modes/``) take only
resolved values. This module decides nothing: it only names things, so every layer from ``pipeline.py`` up may
import it.

The modes (``MODES``): ``clip`` (text/image/video to an image or one clip), ``windows`` (a video past one clip,
in windows), ``transfer`` (a video steered by control videos), ``action`` (policy, forward and inverse dynamics).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

from . import defaults
from .config import CheckpointError, Cosmos3Config
from .model import precision
from .model.loader import read_fp8_checkpoint
from .model.weights import Fp8Checkpoint
from .runtime import DEFAULT, RuntimeOptions
from .sampling.distilled import DistilledSchedule, read_distilled
from .sampling.prompt import default_negative_prompt, default_use_system_prompt
from .sampling.sea_cache import SeaCacheConfig

MODES = ("clip", "windows", "transfer", "action")


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint decides about a run, read from its small files (no weights): its transformer config,
    whether it is distilled (and its schedule), whether it can make sound, its default prompts."""

    name: str
    config: Cosmos3Config
    distilled: DistilledSchedule | None
    has_sound: bool  # a sound head (config.sound_gen) and a sound_tokenizer/ to decode it
    default_negative_prompt: str
    default_use_system_prompt: bool
    native_flow_schedule: bool = False  # model_index.json's use_native_flow_schedule
    fp8: Fp8Checkpoint | None = None  # an FP8 transformer (or one loaded for approximate FP8 compute)

    @classmethod
    def read(cls, checkpoint_dir: str | Path, config: Cosmos3Config | None = None, *,
             fp8_compute: bool = False) -> "CheckpointInfo":
        """``fp8_compute``: the checkpoint as it loads for approximate FP8 compute (the CLI's
        ``--weight-dtype fp8_e4m3fn_fast``; a loaded pipeline's info says so itself)."""
        root = Path(checkpoint_dir)
        if not root.is_dir():
            raise CheckpointError(f"checkpoint folder {root} does not exist or is not a folder; give the downloaded "
                                  "Cosmos3 checkpoint folder.")
        config = config or Cosmos3Config.from_checkpoint(root)
        index = _read_model_index(root)
        distilled = read_distilled(root)
        system = default_use_system_prompt(root)
        if distilled is not None and distilled.default_use_system_prompt is not None:
            system = distilled.default_use_system_prompt  # diffusers reads it from modular_model_index.json
        return cls(name=root.name, config=config, distilled=distilled,
                   has_sound=bool(config.sound_gen) and (root / "sound_tokenizer").is_dir(),
                   default_negative_prompt=default_negative_prompt(root), default_use_system_prompt=system,
                   native_flow_schedule=bool(index.get("use_native_flow_schedule", False)),
                   fp8=read_fp8_checkpoint(root, fp8_compute))

    @property
    def has_action(self) -> bool:
        return bool(self.config.action_gen)

    @property
    def is_edge(self) -> bool:
        """Cosmos3-Edge's architecture (relu² MLP, Nemotron norms), as the reasoner and the layers tell it apart."""
        return self.config.hidden_act == "relu2"


@dataclass
class ActionRequest:
    """One action-mode run: the fields of diffusers' ``CosmosActionCondition``.

    ``raw_actions`` ``[chunk_size, raw_action_dim]`` drive forward dynamics (required there, ignored nowhere else:
    giving them to another mode is an error). ``image`` (one frame) or ``video`` (``[F, H, W, 3]`` in [0, 1], a
    uint8 array or a list of PIL frames): policy and forward dynamics start from the first frame; inverse dynamics
    reads exactly ``chunk_size + 1`` frames. ``view_point`` ``None`` drops the caption's framing field.
    """

    mode: str  # one of defaults.ACTION_MODES
    chunk_size: int
    domain_name: str
    resolution_tier: int = defaults.ACTION_RESOLUTION_TIER
    raw_actions: Any = None
    image: Any = None
    video: Any = None
    view_point: str | None = defaults.ACTION_VIEW_POINT

    @property
    def raw_action_dim(self) -> int:
        return defaults.EMBODIMENT_TO_RAW_ACTION_DIM[self.domain_name]

    @property
    def num_frames(self) -> int:
        """Pixel frames the run spans: one more than the action transitions."""
        return self.chunk_size + 1


@dataclass(frozen=True)
class SamplingRequest:
    """What a sampler is asked (the sampling arguments of ``Request``; ``None``: the default). The fast modes: an
    NVIDIA FP8 checkpoint's step policy (diffusers' ``mixed_precision_*`` arguments; ``None``: the checkpoint's
    policy) and SeaCache (``None``: off)."""

    seed: int = defaults.SEED
    steps: int | None = None
    guidance: float | None = None
    schedule: str = defaults.SCHEDULE
    shift: float | None = None
    sound: bool = False
    guidance_interval: tuple[float, float] | None = None
    batch_size: int = defaults.BATCH_SIZE
    mixed_precision_format: str | None = None  # none | fp8
    mixed_precision_first_steps: int | None = None
    mixed_precision_last_steps: int | None = None
    mixed_precision_reasoner_policy: str | None = None  # high_precision | base_precision
    mixed_precision_overlap: str | None = None  # a16 | native
    sea_cache: SeaCacheConfig | None = None

    def mixed_precision_overrides(self) -> dict[str, Any]:
        """The ``mixed_precision_*`` arguments, as ``model.precision.resolve`` takes them."""
        return {name: getattr(self, name) for name in precision.OVERRIDES}


_SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingRequest))


@dataclass
class Request:
    """What a user asks for. ``None`` means "the default" (``resolve.resolve`` decides it)."""

    prompt: str | Sequence[str] = ""  # windows: one prompt, or one per window
    negative_prompt: str | None = None
    # the clip
    num_frames: int | None = None  # None: 189 (Transfer: the controls' length; action: chunk_size + 1)
    height: int | None = None  # None: 720 (a checkpoint recipe's; action: the input's size)
    width: int | None = None  # None: 1280 (likewise)
    fps: float | None = None
    # sampling (``SamplingRequest``'s fields)
    seed: int = defaults.SEED
    steps: int | None = None
    guidance: float | None = None
    schedule: str = defaults.SCHEDULE
    shift: float | None = None
    sound: bool = False
    guidance_interval: tuple[float, float] | None = None
    batch_size: int = defaults.BATCH_SIZE
    use_system_prompt: bool | None = None
    # conditioning: an image (image-to-video) or a video (video-to-video; windows: its first frames seed window 1)
    image: Any = None
    video: Any = None
    condition_latent_frames: Sequence[int] = (0, 1)
    keep: str = "first"
    # long video: windows of frames_per_chunk frames, each seeded by the previous one's last conditional_frames
    frames_per_chunk: int | None = None
    conditional_frames: int | None = None
    one_pass: bool = False  # num_frames above one clip as a single pass instead of windows
    # Transfer: {edge|blur|depth|seg|wsm: frames [F, H, W, 3] in [0, 1]}
    controls: Mapping[str, Any] | None = None
    control_guidance: float | None = None  # None: 1 (the controls as given)
    control_guidance_interval: tuple[float, float] | None = None
    # action (world-model) modes
    action: ActionRequest | None = None
    # fast modes (``SamplingRequest``'s)
    mixed_precision_format: str | None = None
    mixed_precision_first_steps: int | None = None
    mixed_precision_last_steps: int | None = None
    mixed_precision_reasoner_policy: str | None = None
    mixed_precision_overlap: str | None = None
    sea_cache: SeaCacheConfig | None = None
    # how it runs
    options: RuntimeOptions = field(default_factory=lambda: DEFAULT)

    def sampling_request(self) -> SamplingRequest:
        """The sampler's part of this request."""
        return SamplingRequest(**{name: getattr(self, name) for name in _SAMPLING_FIELDS})


@dataclass(frozen=True)
class Sampling:
    """The sampling values of a run, every default filled and every value checked."""

    seed: int
    steps: int
    guidance: float
    schedule: str
    shift: float | None  # None: a distilled checkpoint's fixed schedule
    sound: bool
    guidance_interval: tuple[float, float] | None
    batch_size: int
    distilled: bool  # the checkpoint's few-step schedule (sampling/distilled.py) instead of UniPC
    mixed_precision: precision.MixedPrecision | None = None  # the FP8 step policy (None: the model is not FP8)
    sea_cache: SeaCacheConfig | None = None

    @property
    def use_cfg(self) -> bool:
        return self.guidance != 1.0


@dataclass(frozen=True)
class ConditionLatents:
    """Clean latent frames a clip is conditioned on (image-to-video, video-to-video, keyframes), encoded at the
    clip's ``height`` × ``width``; ``num_frames``: the clip length it was made for (keyframes; ``None``: any)."""

    x0: Any  # torch.Tensor [1, 48, k, h, w] normalized clean latent frames
    clean_frames: tuple[int, ...]
    height: int
    width: int
    mode: str  # "image-to-video" | "video-to-video" | "keyframes" | "latents"
    num_frames: int | None = None


@dataclass(frozen=True)
class WindowGeometry:
    """The chunk geometry of a windowed or Transfer video (``Cosmos3TransferSetupStep``): ``chunk_frames`` pixel
    frames per window (4k+1), ``stride = chunk_frames − conditional_frames``, ``num_windows = 1 + ceil((total −
    chunk) / stride)``; the last window is generated whole and the stitched clip is cut to ``total_frames``."""

    total_frames: int  # pixel frames of the stitched output
    chunk_frames: int  # pixel frames generated per window (4k+1)
    conditional_frames: int  # frames each later window takes from the previous window's tail
    stride: int  # pixel frames between window starts
    num_windows: int

    def start(self, index: int) -> int:
        """First output frame that window ``index`` covers."""
        return index * self.stride

    def keep_range(self, index: int) -> tuple[int, int]:
        """Frames ``[a, b)`` of window ``index``'s decoded clip that go to the output (overlap dropped, end cut)."""
        first = 0 if index == 0 else self.conditional_frames
        end = min(self.chunk_frames, self.total_frames - self.start(index))
        return first, max(first, end)

    def windows_within(self, frames: int) -> int:
        """How many windows lie whole in the first ``frames`` output frames."""
        return sum(1 for k in range(self.num_windows) if self.start(k) + self.keep_range(k)[1] <= frames)

    @property
    def latent_frames(self) -> int:
        return defaults.latent_frames(self.chunk_frames)


@dataclass(frozen=True)
class Resolved:
    """A run with nothing left to decide (``resolve.resolve``)."""

    mode: str
    prompts: tuple[str, ...]  # one, or one per window
    negative_prompt: str | None  # None: the checkpoint's default is rendered by the tokenizer step
    num_frames: int  # the whole output (windows: total frames)
    height: int
    width: int
    fps: float
    use_system_prompt: bool
    sampling: Sampling
    options: RuntimeOptions
    image: Any = None
    video: Any = None
    condition_latent_frames: tuple[int, ...] = (0, 1)
    keep: str = "first"
    windows: WindowGeometry | None = None  # windows, transfer
    controls: dict | None = None  # transfer: preprocessed control clips, canonical key order
    control_guidance: float = defaults.CONTROL_GUIDANCE
    control_guidance_interval: tuple[float, float] | None = None
    action: ActionRequest | None = None  # checked against the checkpoint
    recipe: str | None = None  # the checkpoint recipe the mode's defaults came from (``resolve.checkpoint_recipe``)
    recipe_defaults: tuple[tuple[str, Any], ...] = ()  # (name, value) the request left unset, taken from it

    @property
    def prompt(self) -> str:
        return self.prompts[0]

    @property
    def chunk_frames(self) -> int:
        """Frames of one generated clip (a window's length for windows and Transfer)."""
        return self.windows.chunk_frames if self.windows is not None else self.num_frames


def _read_model_index(root: Path) -> dict:
    path = root / "model_index.json"
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}).") from exc
    return value if isinstance(value, dict) else {}


__all__ = ["ActionRequest", "CheckpointInfo", "ConditionLatents", "MODES", "Request", "Resolved", "Sampling",
           "SamplingRequest", "WindowGeometry"]
