"""A run's ``RuntimeOptions`` reach every mode, and a forced kernel that cannot run is one clear error in each.

* Honoured: with ``attention="sdpa"`` every attention call of a whole run — the text tower's prefill and every
  generation-tower step — is made on the SDPA route, for a plain clip, windows, Transfer and an action run (the
  library path the CLI and nodes share); the torchrun-parallel run is checked in tests/test_parallel.py.
* Refused: ``--attention flash4`` where FlashAttention-4 cannot run (every CI machine: no Hopper GPU) is one
  ``error:`` line and exit status 2, before anything loads, in every CLI mode — plain, windows, Transfer, action,
  ``--cfg-parallel`` and the reasoner; and one message naming the node in the sampler and Long Video nodes
  (tests/test_bad_input_nodes.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cosmos3_core import media
from cosmos3_core.api import generate
from cosmos3_core.kernels.attention import flash4_unavailable_reason
from cosmos3_core.pipeline import Cosmos3Pipeline
from cosmos3_core.request import ActionRequest, Request
from cosmos3_core.resolve import resolve
from cosmos3_core.runtime import RuntimeOptions

H, W = 32, 48
PROMPT = "a red robot walking on the street at night"
COMMON = dict(prompt=PROMPT, height=H, width=W, steps=2, seed=3)


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("nano", sound=True, seed=4)


@pytest.fixture(scope="module")
def pipe(checkpoint):
    return Cosmos3Pipeline.load(checkpoint, dtype=torch.float32, device="cpu")


def _clip(frames: int) -> np.ndarray:
    return np.random.default_rng(frames).random((frames, H, W, 3)).astype(np.float32)


REQUESTS = {
    "clip": lambda: Request(**COMMON, num_frames=9, sound=True),
    "windows": lambda: Request(**COMMON, num_frames=13, frames_per_chunk=9),
    "transfer": lambda: Request(**COMMON, controls={"edge": _clip(9)}, frames_per_chunk=5),
    "action": lambda: Request(prompt=PROMPT, steps=2, seed=3, action=ActionRequest(
        mode="policy", chunk_size=4, domain_name="bridge_orig_lerobot", resolution_tier=256, image=_clip(1)[0])),
}


@pytest.mark.parametrize("mode", sorted(REQUESTS))
def test_the_attention_route_reaches_every_call_of_every_mode(pipe, mode, monkeypatch):
    from cosmos3_core.model import transformer

    seen = []
    real = transformer.attention

    def recording(q, k, v, **kwargs):
        seen.append(kwargs.get("backend", "auto"))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(transformer, "attention", recording)
    request = REQUESTS[mode]()
    request.options = RuntimeOptions(attention="sdpa")
    assert resolve(request, pipe.info).mode == mode
    generate(pipe, request)
    layers = pipe.config.num_hidden_layers
    assert len(seen) > 2 * layers  # the prefill and every layer of every step went through the entry point
    assert set(seen) == {"sdpa"}, sorted(set(seen))


def test_options_are_per_run(pipe, monkeypatch):
    """A run with ``sdpa`` leaves nothing behind: the next run (default options) is on ``auto``."""
    from cosmos3_core.model import transformer

    seen = []
    real = transformer.attention
    monkeypatch.setattr(transformer, "attention",
                        lambda q, k, v, **kw: seen.append(kw.get("backend", "auto")) or real(q, k, v, **kw))
    generate(pipe, Request(**COMMON, num_frames=1, options=RuntimeOptions(attention="sdpa")))
    first = len(seen)
    generate(pipe, Request(**COMMON, num_frames=1))
    assert set(seen[:first]) == {"sdpa"} and set(seen[first:]) == {"auto"}


needs_no_flash4 = pytest.mark.skipif(not flash4_unavailable_reason(), reason="FlashAttention-4 runs here")


@pytest.fixture(scope="module")
def media_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("option_inputs")
    media.write_video(d / "edge.mp4", _clip(9), 24.0)
    from PIL import Image

    Image.fromarray((_clip(1)[0] * 255).astype(np.uint8)).save(d / "start.png")
    return d


CLI_MODES = {
    "clip": [],
    "windows": ["--num-frames", "193"],  # above one clip: windows by default
    "transfer": ["--control", "edge={edge}"],
    "action": ["--action-mode", "policy", "--image", "{image}", "--domain-name", "bridge_orig_lerobot",
               "--chunk-size", "4", "--resolution-tier", "256", "--height", "720", "--width", "1280"],
    "cfg_parallel": ["--cfg-parallel"],
}


@needs_no_flash4
@pytest.mark.parametrize("mode", sorted(CLI_MODES))
def test_flash4_where_it_cannot_run_is_one_error_in_every_cli_mode(checkpoint, media_files, tmp_path, capsys, mode):
    from cosmos3_core.cli import main

    extra = [a.format(edge=media_files / "edge.mp4", image=media_files / "start.png") for a in CLI_MODES[mode]]
    shape = [] if mode == "action" else ["--height", str(H), "--width", str(W)]
    code = main.main(["--checkpoint", str(checkpoint), "--prompt", PROMPT, "--out", str(tmp_path / "o.mp4"),
                      "--device", "cpu", "--attention", "flash4", *shape, *extra])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("error: attention='flash4': FlashAttention-4 cannot run here ("), lines[0]
    assert "use attention 'auto' or 'sdpa'" in lines[0]
    assert not (tmp_path / "o.mp4").exists()


@needs_no_flash4
def test_flash4_where_it_cannot_run_is_one_error_in_the_reasoner_cli(checkpoint, capsys):
    from cosmos3_core.cli import reason

    code = reason.main(["--checkpoint", str(checkpoint), "--prompt", "hi", "--device", "cpu", "--attention", "flash4"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: attention='flash4': FlashAttention-4 cannot run here"), err
