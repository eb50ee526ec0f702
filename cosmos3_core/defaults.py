"""Every default of a Cosmos3 run and every model constant the pack relies on, in one place.

Node schemas, ``resolve.resolve``, the plan and the CLIs read these names; nothing else spells the numbers.
Values follow diffusers 0.42.1 ``Cosmos3OmniPipeline.__call__`` defaults and the per-mode table of
docs/architecture.md, "Defaults per mode" (the released checkpoints' training tiers), and the recipes checkpoints
publish for a mode (``ClipRecipe``: Cosmos3-Edge's image-to-video).
"""

from __future__ import annotations

from typing import NamedTuple

# ---------------------------------------------------------------------------------------------- model constants
# Wan2.2 VAE (``AutoencoderKLWan``, TI2V-5B geometry): 4× in time, 16× in space, 48 latent channels.
VAE_TEMPORAL_STRIDE = 4
VAE_SPATIAL_STRIDE = 16
LATENT_CHANNELS = 48
# The AVAE sound tokenizer: 48 kHz stereo, hop 1920 samples → 25 latent steps per second.
SOUND_SAMPLING_RATE = 48_000

# ---------------------------------------------------------------------------------------------- request defaults
NUM_FRAMES = 189  # ≈7.9 s at 24 fps: the released models' clip length
WIDTH = 1280
HEIGHT = 720
FPS = 24.0
GUIDANCE = 6.0
SEED = 42
SCHEDULES = ("flow_shift", "karras")
SCHEDULE = "flow_shift"
STEPS_IMAGE = 50
STEPS_VIDEO = 35
BATCH_SIZE = 1

# Action (world-model) modes — policy / forward dynamics / inverse dynamics (docs/architecture.md: the diffusers docs'
# action examples and cosmos-framework agree): 5 fps, 30 steps, no guidance, flow shift 10 with Karras off, no system
# prompt, no negative prompt. Tier and view point: ``CosmosActionCondition``'s defaults. Chunk size and domain are
# the node's / CLI's starting values (the reference has no default for them).
ACTION_FPS = 5.0
ACTION_STEPS = 30
ACTION_GUIDANCE = 1.0
ACTION_SCHEDULE = "flow_shift"
ACTION_SHIFT = 10.0
ACTION_USE_SYSTEM_PROMPT = False
ACTION_NEGATIVE_PROMPT = ""
ACTION_RESOLUTION_TIER = 480
ACTION_VIEW_POINT = "ego_view"
ACTION_CHUNK_SIZE = 16
ACTION_DOMAIN = "bridge_orig_lerobot"

# Checkpoint recipes: the defaults a checkpoint's publisher gives for one mode. ``resolve.resolve`` takes each value a
# request leaves unset from the recipe (a value the user gives always wins); every other mode and checkpoint keeps
# the general defaults above. The nodes cannot follow them (a widget's default is one value for every checkpoint).
class ClipRecipe(NamedTuple):
    """Published defaults of one checkpoint family for one mode."""

    name: str
    width: int
    height: int
    num_frames: int
    steps: int
    guidance: float
    shift: float


# Cosmos3-Edge image-to-video, as its model card publishes it (update of 2026-08-25).
EDGE_IMAGE_TO_VIDEO = ClipRecipe("Cosmos3-Edge image-to-video", width=832, height=480, num_frames=121, steps=20,
                                 guidance=6.0, shift=12.0)

# Request limits: what the nodes' widgets and the request checks allow.
MAX_SIZE = 4096  # pixels per side
MAX_FRAMES = 1025
MAX_STEPS = 200
MAX_GUIDANCE = 20.0
MAX_SHIFT = 50.0
MAX_BATCH_SIZE = 16
MIN_FPS, MAX_FPS = 1.0, 120.0  # frames per second a clip is described and written at
MAX_SEED = 2**64 - 1  # ComfyUI's seed widget range; torch seeds are taken modulo 2**64 too

# Training flow shift by resolution tier (the short side): 720p → 10, 480p → 5, 256p → 3.
SHIFT_BY_TIER = ((704, 10.0), (448, 5.0), (0, 3.0))


def default_steps(num_frames: int) -> int:
    """Per-mode defaults of the reference docs: image 50, video 35."""
    return STEPS_IMAGE if num_frames == 1 else STEPS_VIDEO


def default_shift(height: int, width: int) -> float:
    """Training flow shift of the resolution tier of a ``height`` × ``width`` clip."""
    short = min(height, width)
    return next(shift for floor, shift in SHIFT_BY_TIER if short >= floor)


def pixel_frames(num_latent_frames: int) -> int:
    """Pixel frames that ``num_latent_frames`` latents decode to (1 + 4 per latent after the first)."""
    return 1 + VAE_TEMPORAL_STRIDE * (num_latent_frames - 1) if num_latent_frames > 0 else 0


def latent_frames(num_pixel_frames: int) -> int:
    """Latent frames the Wan2.2 VAE makes of ``num_pixel_frames`` (the first frame alone, then one per 4)."""
    return (num_pixel_frames - 1) // VAE_TEMPORAL_STRIDE + 1


def valid_frames(num_frames: int, minimum: int = 1) -> int:
    """The nearest valid clip length (4k+1) at or below ``num_frames``, and at least ``minimum``: what a message
    suggests for a frame count the VAE cannot take whole."""
    return max(minimum, (int(num_frames) - 1) // VAE_TEMPORAL_STRIDE * VAE_TEMPORAL_STRIDE + 1)


# ---------------------------------------------------------------------------------------------- long video
# Windowed generation (long_video.py) and Transfer (transfer.py): the modular Transfer pipeline's defaults.
LONG_NUM_FRAMES = 721  # 30 s at 24 fps (the long-video node's default length)
MAX_LONG_FRAMES = 24 * 60 * 10 + 1  # 10 minutes at 24 fps
TRANSFER_CONDITIONAL_FRAMES = 1  # num_conditional_frames of the modular Transfer pipeline
LONG_CONDITIONAL_FRAMES = 5  # windowed T2V/I2V: 2 clean latent frames, as the reference's V2V default (0, 1)
MIN_CONTROL_FRAMES = 5  # the shortest Cosmos3 clip (4k+1): Transfer follows its controls frame by frame
CONTROL_GUIDANCE = 1.0  # control_guidance of the modular Transfer pipeline (1: no no-control branch)


# ---------------------------------------------------------------------------------------------- action modes
# The reference tables of the action (world-model) modes: diffusers 0.42.1
# ``pipelines/cosmos/pipeline_cosmos3_omni.py``.
ACTION_MODES = ("policy", "forward_dynamics", "inverse_dynamics")
# diffusers 0.42.1 pipeline_cosmos3_omni.py ``_ACTION_RESOLUTION_BINS``: per tier, aspect ratio (h/w) → canvas (h, w).
RESOLUTION_BINS: dict[int, dict[str, tuple[int, int]]] = {
    256: {"1.0": (256, 256), "0.8": (256, 320), "1.25": (320, 256), "0.6": (192, 320),
          "1.6666666666666667": (320, 192)},
    480: {"1.0": (640, 640), "0.7391304347826086": (544, 736), "1.3529411764705883": (736, 544),
          "0.5769230769230769": (480, 832), "1.7333333333333334": (832, 480)},
    704: {"1.0": (960, 960), "0.7647058823529411": (832, 1088), "1.3076923076923077": (1088, 832),
          "0.55": (704, 1280), "1.8181818181818181": (1280, 704)},
    720: {"1.0": (960, 960), "0.7536231884057971": (832, 1104), "1.3269230769230769": (1104, 832),
          "0.5625": (720, 1280), "1.7777777777777777": (1280, 720)},
}
# ``_ACTION_VIEWPOINT_TEMPLATES``: the trained framing sentences of the caption's ``cinematography.framing``.
VIEWPOINT_FRAMING = {
    "ego_view": "This video is captured from a first-person perspective looking at the scene.",
    "third_person_view": ("This video is captured from a third-person perspective looking towards the agent from the "
                          "front."),
    "wrist_view": "This video is captured from a wrist-mounted camera.",
    "concat_view": "This video contains concatenated views from multiple camera perspectives.",
}
# ``_EMBODIMENT_TO_DOMAIN_ID``: the embodiment's row of the domain-aware action projections.
EMBODIMENT_TO_DOMAIN_ID = {
    "no_action": 0, "av": 1, "camera_pose": 2, "hand_pose": 3, "pusht": 4, "libero": 5, "umi": 6,
    "bridge_orig_lerobot": 7, "droid_lerobot": 8, "robomind-franka": 8, "galbot": 9, "robomind-franka-dual": 12,
    "robomind-ur": 13, "agibotworld": 15, "agibot_gear_gripper": 15, "agibot_gear_gripper_ext": 15, "fractal": 20,
}
# ``_EMBODIMENT_TO_RAW_ACTION_DIM``: the unpadded action width; domains absent here (no_action, libero) have none
# and the reference refuses them for action inference.
EMBODIMENT_TO_RAW_ACTION_DIM = {
    "av": 9, "camera_pose": 9, "pusht": 2, "umi": 10, "bridge_orig_lerobot": 10, "droid_lerobot": 10,
    "robomind-franka": 10, "robomind-franka-dual": 20, "robomind-ur": 10, "galbot": 30, "agibotworld": 29,
    "agibot_gear_gripper": 29, "agibot_gear_gripper_ext": 29, "fractal": 10, "hand_pose": 57,
}
DOMAINS = tuple(sorted(EMBODIMENT_TO_RAW_ACTION_DIM))  # the embodiments action inference supports
RESOLUTION_TIERS = tuple(RESOLUTION_BINS)
VIEW_POINTS = tuple(VIEWPOINT_FRAMING)
# the caption's aspect_ratio labels, in the reference's order
ACTION_ASPECT_RATIOS = ("1,1", "4,3", "3,4", "16,9", "9,16")
