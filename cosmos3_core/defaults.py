"""Every default of a Cosmos3 run and every model constant the pack relies on, in one place.

Node schemas, ``request.resolve``, the plan and the CLIs read these names; nothing else spells the numbers.
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

# Checkpoint recipes: the defaults a checkpoint's publisher gives for one mode. ``request.resolve`` takes each value a
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


# ---------------------------------------------------------------------------------------------- long video
# Windowed generation (long_video.py) and Transfer (transfer.py): the modular Transfer pipeline's defaults.
LONG_NUM_FRAMES = 721  # 30 s at 24 fps (the long-video node's default length)
MAX_LONG_FRAMES = 24 * 60 * 10 + 1  # 10 minutes at 24 fps
TRANSFER_CONDITIONAL_FRAMES = 1  # num_conditional_frames of the modular Transfer pipeline
LONG_CONDITIONAL_FRAMES = 5  # windowed T2V/I2V: 2 clean latent frames, as the reference's V2V default (0, 1)
CONTROL_GUIDANCE = 1.0  # control_guidance of the modular Transfer pipeline (1: no no-control branch)
