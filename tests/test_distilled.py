"""Distilled 4-step checkpoints == diffusers 0.42.1 ``Cosmos3DistilledModularPipeline`` on a tiny checkpoint.

The tiny checkpoint is Super-shaped (8/1 heads: Super's 8:1 GQA, query width 1.6x the hidden size) in the
distilled layout (``modular_model_index.json`` with ``distilled_sigmas``, a stochastic FlowMatchEuler scheduler).
fp32 on the CPU, same CPU generator on both sides: the reference draws the initial noise and every step's SDE noise
from it, so the latents only match if ours draws the same numbers in the same order.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from diffusers import ModularPipeline

from cosmos3_core.config import CheckpointError
from cosmos3_core.distilled import read_distilled
from cosmos3_core.tiny import DISTILLED_SIGMAS, build_tiny_checkpoint

H, W, SEED = 64, 96, 1234
PROMPT = "a red robot walking on the street at night"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_tiny_checkpoint(tmp_path_factory.mktemp("super4step"), variant="super", seed=5, distilled=True)


def _reference_blocks(path) -> tuple[str, list | None]:
    pipe = ModularPipeline.from_pretrained(str(path))
    return type(pipe._blocks).__name__, getattr(pipe.config, "distilled_sigmas", None)


def _variant(checkpoint, tmp_path, edit):
    """A copy of the checkpoint's small files (weights symlinked) with ``modular_model_index.json`` edited."""
    out = tmp_path / "variant"
    shutil.copytree(checkpoint, out, symlinks=True, ignore=shutil.ignore_patterns("*.safetensors"))
    for src in checkpoint.rglob("*.safetensors"):
        (out / src.relative_to(checkpoint)).symlink_to(src)
    path = out / "modular_model_index.json"
    index = json.loads(path.read_text())
    edited = edit(index)
    if edited is None:
        path.unlink()
    else:
        path.write_text(json.dumps(edited))
    return out


RECOGNITION = {
    "as_shipped": lambda i: i,
    "omni_class": lambda i: {**i, "_class_name": "Cosmos3OmniModularPipeline"},  # the blocks decide
    "unknown_blocks": lambda i: {**i, "_blocks_class_name": "SequentialPipelineBlocks"},  # -> class default
    "unknown_blocks_omni": lambda i: {**i, "_blocks_class_name": "NoSuchBlocks",
                                      "_class_name": "Cosmos3OmniModularPipeline"},
    "omni_blocks": lambda i: {**i, "_blocks_class_name": "Cosmos3OmniBlocks"},
    "no_modular_index": lambda i: None,
    "other_sigmas": lambda i: {**i, "distilled_sigmas": [1.0, 0.75, 0.5]},
}


@pytest.mark.parametrize("case", sorted(RECOGNITION))
def test_recognised_exactly_as_diffusers_does(checkpoint, tmp_path, case):
    """``read_distilled`` says distilled iff diffusers builds the distilled blocks, with the same sigmas."""
    path = _variant(checkpoint, tmp_path, RECOGNITION[case])
    blocks, ref_sigmas = _reference_blocks(path)
    ours = read_distilled(path)
    assert (ours is not None) == (blocks == "Cosmos3DistilledBlocks"), (case, blocks)
    if ours is not None:
        assert list(ours.sigmas) == [float(s) for s in ref_sigmas]
        assert ours.steps == len(ref_sigmas)
    assert (case in ("as_shipped", "omni_class", "unknown_blocks", "other_sigmas")) == (ours is not None)


@pytest.mark.parametrize("key", ["distilled_sigmas", "_blocks_class_name"])
def test_distilled_index_without_key_is_a_clear_error(checkpoint, tmp_path, key):
    """diffusers fails on these files too (no schedule / no blocks); ours says which key is missing."""
    path = _variant(checkpoint, tmp_path, lambda i: {k: v for k, v in i.items() if k != key})
    with pytest.raises(CheckpointError, match=f"no {key}"):
        read_distilled(path)


def test_schedule_is_the_checkpoints(checkpoint):
    schedule = read_distilled(checkpoint)
    assert list(schedule.sigmas) == DISTILLED_SIGMAS and schedule.steps == 4
    scheduler = schedule.make_scheduler()
    assert scheduler.config.stochastic_sampling
    assert torch.equal(scheduler.sigmas, torch.tensor(DISTILLED_SIGMAS + [0.0]))
