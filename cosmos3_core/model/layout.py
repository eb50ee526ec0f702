"""The generation stream's static layout: token order, clean/noisy frames and rotary tables per branch.

Mirrors the packing of diffusers 0.42.1 ``Cosmos3OmniPipeline._prepare_{vision,sound,action}_segment`` and
``Cosmos3OmniTransformer._patchify_and_pack_latents`` / ``_unpatchify_and_unpack_latents``. Everything here is
fixed for a whole generation (it depends on the prompt lengths and the latent shape, never on the step), so it is
built once, before the first step, and the step itself does no host-side work.

Generation stream of one branch: ``[prefix n·T·ph·pw | vision T·ph·pw | sound Ts | action Ta]``. The optional
prefix holds clean vision items packed before the target at the target's own positions (the same mRoPE offset),
as diffusers' modular ``Cosmos3TransferPackSequenceStep`` packs the control latents ``[ctrl_1 … ctrl_n, target]``;
prefix tokens get no timestep embedding and no velocity is read from them. Vision tokens are 2×2 latent
patches in raster (t, h, w) order with features ordered (dy, dx, c), channel fastest; an odd latent height or
width is zero-padded to the patch size (the padded patches still get ``proj_in``'s bias and the timestep
embedding, as in the reference, and are cropped from the output).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from ..config import Cosmos3Config
from .rope import action_position_ids, generation_offset, rope_tables, sound_position_ids, vision_position_ids


@dataclass(frozen=True)
class GenLayout:
    """Static description of one generation's token stream for its guidance branches (cond first)."""

    latent_shape: tuple[int, int, int]  # (T, h, w) of the video latent
    grid: tuple[int, int, int]  # (T, ph, pw) patch grid
    noisy_frames: torch.Tensor  # [T] bool: latent frames that are denoised (the rest are clean conditioning)
    sound_len: int
    action_len: int
    noisy_actions: torch.Tensor | None  # [Ta] bool
    domain_id: torch.Tensor | None  # [1] long: embodiment of the action head
    cos: torch.Tensor  # [B, N_gen, head_dim] rotary tables, one row per branch
    sin: torch.Tensor
    text_lengths: tuple[int, ...]
    prefix: torch.Tensor | None = None  # [n, C, T, h, w] clean vision items packed before the target
    prefix_hidden: tuple[bool, ...] = ()  # per branch: True = this branch does not attend to the prefix

    def key_starts(self) -> list[int]:
        """Per branch, the first own generation token its attention reads (past the prefix when it is hidden)."""
        hidden = self.prefix_hidden or (False,) * self.num_branches
        return [self.num_prefix_tokens if h else 0 for h in hidden]

    @property
    def num_prefix_tokens(self) -> int:
        return 0 if self.prefix is None else self.prefix.shape[0] * self.num_vision_tokens

    @property
    def num_branches(self) -> int:
        return len(self.text_lengths)

    @property
    def num_vision_tokens(self) -> int:
        t, ph, pw = self.grid
        return t * ph * pw

    @property
    def num_tokens(self) -> int:
        return self.num_prefix_tokens + self.num_vision_tokens + self.sound_len + self.action_len


def patch_grid(latent_shape: Sequence[int], patch: int) -> tuple[int, int, int]:
    t, h, w = latent_shape
    return t, -(-h // patch), -(-w // patch)


@dataclass(frozen=True)
class ActionTokens:
    """The action stream of a layout: ``length`` actions, the ``clean`` (given) ones, the embodiment's domain."""

    length: int
    clean: tuple[int, ...] = ()
    domain_id: int | None = None


@dataclass(frozen=True)
class Prefix:
    """Clean vision items ``latents`` ``[n, C, T, h, w]`` (Transfer's control latents) of the target's latent shape,
    packed before it at the same positions. ``hidden[j]`` hides them from branch ``j``'s attention: its target
    tokens then see only the text and the target, exactly a pass without the prefix (Transfer's no-control branch)
    while all branches still run as one batch (the prefix tokens' own outputs are unused)."""

    latents: torch.Tensor
    hidden: tuple[bool, ...] = ()


def build_layout(
    config: Cosmos3Config,
    text_lengths: Sequence[int],
    latent_shape: Sequence[int],
    fps: float,
    *,
    clean_frames: Sequence[int] = (),
    sound_len: int = 0,
    action: ActionTokens | None = None,
    prefix: Prefix | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> GenLayout:
    """Build the layout for branches whose prompts have ``text_lengths`` tokens (cond first, then uncond)."""
    assert len(text_lengths) >= 1 and (not sound_len or config.sound_gen) and (action is None or config.action_gen)
    action_len = 0 if action is None else int(action.length)
    t = int(latent_shape[0])
    grid = patch_grid(latent_shape, config.latent_patch_size)
    noisy = torch.ones(t, dtype=torch.bool)
    for idx in clean_frames:
        assert 0 <= idx < t, f"clean frame {idx} is outside the latent's {t} frames"
        noisy[idx] = False
    prefix_hidden = () if prefix is None else prefix.hidden
    if prefix is not None:
        assert prefix.latents.ndim == 5 and tuple(prefix.latents.shape[2:]) == tuple(int(s) for s in latent_shape)
        assert not prefix.hidden or len(prefix.hidden) == len(text_lengths)
        prefix = prefix.latents.to(device)
    items = 1 + (0 if prefix is None else prefix.shape[0])
    positions = []
    for length in text_lengths:
        offset = generation_offset(int(length), config)
        parts = [vision_position_ids(grid, offset, fps, config)] * items
        if sound_len:
            parts.append(sound_position_ids(sound_len, offset, config))
        if action_len:
            parts.append(action_position_ids(action_len, offset, fps, config))
        positions.append(torch.cat(parts, dim=1))
    cos, sin = rope_tables(torch.stack(positions), config, dtype, device)
    noisy_actions = None
    if action_len:
        noisy_actions = torch.ones(action_len, dtype=torch.bool)
        noisy_actions[list(action.clean)] = False
        noisy_actions = noisy_actions.to(device)
    return GenLayout(
        latent_shape=tuple(int(s) for s in latent_shape),
        grid=grid,
        noisy_frames=noisy.to(device),
        sound_len=int(sound_len),
        action_len=int(action_len),
        noisy_actions=noisy_actions,
        domain_id=None if action is None or action.domain_id is None else torch.tensor(
            [action.domain_id], dtype=torch.long, device=device),
        cos=cos,
        sin=sin,
        text_lengths=tuple(int(n) for n in text_lengths),
        prefix=prefix,
        prefix_hidden=tuple(bool(h) for h in prefix_hidden),
    )


def patchify(latents: torch.Tensor, patch: int) -> torch.Tensor:
    """``[C, T, h, w]`` → ``[T·ph·pw, p·p·C]`` (zero-padding h, w up to the patch size)."""
    c, t, h, w = latents.shape
    pad_h, pad_w = (-h) % patch, (-w) % patch
    if pad_h or pad_w:
        latents = F.pad(latents, (0, pad_w, 0, pad_h))
    ph, pw = (h + pad_h) // patch, (w + pad_w) // patch
    x = latents.reshape(c, t, ph, patch, pw, patch)
    return x.permute(1, 2, 4, 3, 5, 0).reshape(t * ph * pw, patch * patch * c)  # (t,h,w) rows, (dy,dx,c) cols


def unpatchify(tokens: torch.Tensor, layout: GenLayout, channels: int, patch: int) -> torch.Tensor:
    """``[B, T·ph·pw, p·p·C]`` → ``[B, C, T, h, w]`` (padding cropped)."""
    b = tokens.shape[0]
    t, ph, pw = layout.grid
    _, h, w = layout.latent_shape
    x = tokens.reshape(b, t, ph, pw, patch, patch, channels)
    x = x.permute(0, 6, 1, 2, 4, 3, 5).reshape(b, channels, t, ph * patch, pw * patch)
    return x[:, :, :, :h, :w]


def select_branches(layout: GenLayout, indexes: Sequence[int]) -> GenLayout:
    """The layout of the branches ``indexes`` (in that order); the layout itself when that is all of them."""
    indexes = list(indexes)
    if indexes == list(range(layout.num_branches)):
        return layout
    if len(indexes) == 1:
        return select_branch(layout, indexes[0])
    return dataclasses.replace(
        layout, cos=layout.cos[indexes], sin=layout.sin[indexes],
        text_lengths=tuple(layout.text_lengths[j] for j in indexes),
        prefix_hidden=tuple(layout.prefix_hidden[j] for j in indexes) if layout.prefix_hidden else (),
    )


def select_branch(layout: GenLayout, index: int) -> GenLayout:
    """The one-branch layout of branch ``index`` (e.g. the cond branch alone, or for sequential guidance)."""
    return dataclasses.replace(
        layout,
        cos=layout.cos[index : index + 1],
        sin=layout.sin[index : index + 1],
        text_lengths=(layout.text_lengths[index],),
        prefix_hidden=layout.prefix_hidden[index : index + 1],
    )
