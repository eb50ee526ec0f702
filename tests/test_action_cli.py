"""``python -m cosmos3_core.generate --action-mode ...``: files read back, and one ``error:`` line per bad input.

The numbers are checked against diffusers in test_action.py; here the CLI plumbing: the mode's inputs, the action
defaults (5 fps, chunk_size + 1 frames at the input's content size), ``--actions-out`` without the padding and
``--latents-out``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image
from safetensors.torch import load_file

from cosmos3_core.cli import main as generate
from cosmos3_core.media import probe_media, write_video

BASE = ["--prompt", "robot arm picks up the cup", "--steps", "2", "--device", "cpu", "--dtype", "fp32",
        "--chunk-size", "4", "--resolution-tier", "256", "--domain-name", "bridge_orig_lerobot"]


@pytest.fixture(scope="module")
def nano(tiny_checkpoint):
    return tiny_checkpoint("nano", sound=False, seed=3)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("action_inputs")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (72, 100, 3), dtype=np.uint8)).save(d / "start.png")
    write_video(d / "clip.mp4", rng.random((5, 64, 96, 3)).astype(np.float32), 5)
    np.save(d / "actions.npy", rng.standard_normal((4, 10)).astype(np.float32))
    return d


@pytest.fixture
def cli(capsys):
    """``generate.main`` in-process (the subprocess path is covered by test_cli.py): returncode, stdout, stderr."""
    def call(*args: str):
        code = generate.main(list(args))
        captured = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=captured.out, stderr=captured.err)
    return call


def test_policy_writes_video_actions_and_latents(cli, nano, inputs, tmp_path):
    out, acts, lat = tmp_path / "policy.mp4", tmp_path / "actions.json", tmp_path / "lat.safetensors"
    r = cli("--checkpoint", str(nano), *BASE, "--action-mode", "policy", "--image", str(inputs / "start.png"),
            "--out", str(out), "--actions-out", str(acts), "--latents-out", str(lat))
    assert r.returncode == 0, r.stderr
    info = probe_media(out)  # 72x100 → floored to 64x96, fits the 192x320 canvas unscaled → 64x96 content
    assert (info["video_frames"], info["width"], info["height"]) == (5, 96, 64)
    assert info["fps"] == pytest.approx(5.0)
    saved = json.loads(acts.read_text())
    assert saved["domain_name"] == "bridge_orig_lerobot" and saved["mode"] == "policy"
    assert np.asarray(saved["actions"]).shape == (4, 10) and np.isfinite(saved["actions"]).all()
    assert tuple(load_file(lat)["video_latent"].shape) == (1, 48, 2, 4, 6)


def test_forward_and_inverse_dynamics(cli, nano, inputs, tmp_path):
    r = cli("--checkpoint", str(nano), *BASE, "--action-mode", "forward_dynamics", "--image",
            str(inputs / "start.png"), "--actions", str(inputs / "actions.npy"), "--out", str(tmp_path / "fd.mp4"))
    assert r.returncode == 0, r.stderr
    assert probe_media(tmp_path / "fd.mp4")["video_frames"] == 5
    acts = tmp_path / "id.npy"
    r = cli("--checkpoint", str(nano), *BASE, "--action-mode", "inverse_dynamics", "--video",
            str(inputs / "clip.mp4"), "--out", str(tmp_path / "id.mp4"), "--actions-out", str(acts))
    assert r.returncode == 0, r.stderr
    a = np.load(acts, allow_pickle=False)
    assert a.shape == (4, 10) and a.dtype == np.float32 and np.isfinite(a).all()


@pytest.mark.parametrize("extra, needle", [
    (["--actions", "x.npy"], "--actions needs --action-mode"),
    (["--action-mode", "policy", "--domain-name", "spaceship", "--image", "IMG"], "domain_name='spaceship'"),
    (["--action-mode", "policy", "--num-frames", "9", "--image", "IMG"], "num_frames / height / width do not apply"),
    (["--action-mode", "inverse_dynamics", "--image", "IMG"], "needs a video"),
    (["--action-mode", "forward_dynamics", "--image", "IMG"], "needs actions"),
    (["--action-mode", "inverse_dynamics", "--video", "CLIP", "--chunk-size", "8"], "set chunk_size=4"),
    (["--action-mode", "forward_dynamics", "--image", "IMG", "--actions-out", "a.npy", "--actions", "ACTS"],
     "forward dynamics predicts no actions"),
])
def test_bad_action_arguments_exit_2_with_one_line(cli, nano, inputs, tmp_path, extra, needle):
    extra = [{"IMG": str(inputs / "start.png"), "CLIP": str(inputs / "clip.mp4"),
              "ACTS": str(inputs / "actions.npy")}.get(a, a) for a in extra]
    base = [a for a in BASE]
    if "--domain-name" in extra:
        i = base.index("--domain-name")
        del base[i:i + 2]
    if "--chunk-size" in extra:
        i = base.index("--chunk-size")
        del base[i:i + 2]
    r = cli("--checkpoint", str(nano), *base, *extra, "--out", str(tmp_path / "x.mp4"))
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: ") and needle in lines[-1], r.stderr[-2000:]
    assert "Traceback" not in r.stderr
