"""Issue 30 (bad input, round three) through the generation CLI and the core: hostile input files and values.

Each case is one ``error:`` line, exit status 2, never a traceback; the message names the flag or argument, the
value and the fix, never quotes a file's contents, never hints at an unsafe load (pickle) or at a value that would
be refused in turn, and comes before anything is loaded (``not_a_checkpoint``: an empty folder that fails as soon
as anything reads it — a check that runs first answers instead). The Ctrl-C cases are in test_bad_input.py, the
full disk in test_disk_full.py, the nodes in test_bad_input_nodes.py.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from cosmos3_core.checks import check_action_request
from cosmos3_core.cli import common
from cosmos3_core.cli import main as generate
from cosmos3_core.media import write_video
from cosmos3_core.modes import action as act

SECRET = "hunter2-top-secret"
FAST = ["--prompt", "a red car", "--steps", "1", "--device", "cpu", "--dtype", "fp32"]


@pytest.fixture()
def not_a_checkpoint(tmp_path):
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    path = tmp_path_factory.mktemp("inputs") / "start.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 96, 3), dtype=np.uint8)).save(path)
    return path


def one_error(capsys, argv) -> str:
    code = generate.main([str(a) for a in argv])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, (code, err)
    return errors[0]


# -- actions files ---------------------------------------------------------------------------------------------

def _safetensors(path, **tensors):
    from safetensors.numpy import save_file

    save_file(tensors, str(path))


def _write(kind: str, path):
    rows = np.zeros((16, 10), np.float32)
    if kind == "empty.npy":
        np.save(path, np.zeros((0, 10), np.float32))
    elif kind == "empty.json":
        path.write_text("[]")
    elif kind == "objects.npy":
        np.save(path, np.array([{"a": SECRET}], dtype=object), allow_pickle=True)
    elif kind == "text.npy":
        path.write_text(f"{SECRET}\n")
    elif kind == "truncated.npy":
        np.save(path, rows)
        path.write_bytes(path.read_bytes()[:-40])
    elif kind == "complex.npy":
        np.save(path, (rows + 1j).astype(np.complex64))
    elif kind == "inf.npy":
        np.save(path, np.full((16, 10), np.inf, np.float32))
    elif kind == "truncated.safetensors":
        _safetensors(path, actions=rows)
        path.write_bytes(path.read_bytes()[:100])
    elif kind == "two.safetensors":
        _safetensors(path, **{SECRET: rows, "other": rows})
    elif kind == "deep.json":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "strings.json":
        path.write_text(json.dumps({"actions": [[SECRET, 1.0]]}))
    elif kind == "nan.json":
        path.write_text("[[1.0, NaN]]")
    elif kind == "ragged.json":
        path.write_text("[[1.0, 2.0], [3.0]]")
    elif kind == "object.json":
        path.write_text(json.dumps({"rows": [[1.0]], "note": SECRET}))
    elif kind == "passwd":
        path.write_text(f"root:x:0:0:{SECRET}:/root:/bin/bash\n")
    elif kind == "folder.npy":
        path.mkdir()
    return path


ACTION_FILES = {
    "empty.npy": "it holds no actions (shape (0, 10))",
    "empty.json": "it holds no actions (an empty list)",
    "objects.npy": "it holds Python objects (a pickled array), which are never loaded (unsafe)",
    "text.npy": "it is not a NumPy .npy file",
    "truncated.npy": "its data is shorter than its header says ((16, 10) float32): the file is truncated",
    "complex.npy": "it holds complex numbers (complex64); actions are real numbers",
    "inf.npy": "160 of its values are NaN or infinite",
    "truncated.safetensors": "it is not a readable .safetensors file (damaged or truncated)",
    "two.safetensors": "it holds 2 tensors and none is named 'actions'",
    "deep.json": "it is nested too deeply to be a list of action rows",
    "strings.json": "row 1, value 1 is a string, not a number",
    "nan.json": "row 1, value 2 is NaN or infinite",
    "ragged.json": "row 2 has 1 values but row 1 has 2",
    "object.json": "it is a JSON object without an \"actions\" list",
    "passwd": "the extension '(none)' is not an actions format",
    "folder.npy": "is a folder, not a file",
}


@pytest.mark.parametrize("kind", sorted(ACTION_FILES))
def test_bad_actions_files_are_one_message_before_anything_loads(not_a_checkpoint, image, tmp_path, capsys, kind):
    path = _write(kind, tmp_path / kind)
    msg = one_error(capsys, ["--checkpoint", not_a_checkpoint, *FAST, "--action-mode", "forward_dynamics",
                             "--domain-name", "droid_lerobot", "--image", image, "--actions", path,
                             "--out", tmp_path / "o.mp4"])
    assert ACTION_FILES[kind] in msg, msg
    assert str(path) in msg, msg  # the file is named ...
    assert SECRET not in msg and "allow_pickle" not in msg and "chunk_size=0" not in msg, msg  # ... never quoted
    assert "checkpoint" not in msg, msg  # answered before the checkpoint was looked at


def test_the_reader_itself_refuses_the_same_files(tmp_path):
    """The library entry point (Cosmos3 Load Actions calls it too) raises the same one ValueError per file."""
    for kind, needle in ACTION_FILES.items():
        path = _write(kind, tmp_path / kind)
        with pytest.raises(ValueError) as err:
            act.load_actions(path)
        assert needle in str(err.value) and SECRET not in str(err.value), (kind, str(err.value))


def test_good_actions_files_still_read(tmp_path):
    rows = np.random.default_rng(1).standard_normal((8, 10)).astype(np.float32)
    np.save(tmp_path / "a.npy", rows)
    np.save(tmp_path / "ints.npy", np.arange(80, dtype=np.int64).reshape(8, 10))
    (tmp_path / "a.json").write_text(json.dumps({"domain_name": "droid_lerobot", "actions": rows.tolist()}))
    _safetensors(tmp_path / "a.safetensors", actions=rows)
    np.testing.assert_array_equal(act.load_actions(tmp_path / "a.npy"), rows)
    np.testing.assert_array_equal(act.load_actions(tmp_path / "ints.npy"), np.arange(80).reshape(8, 10))
    values, meta = act.load_actions_with_metadata(tmp_path / "a.json")
    np.testing.assert_array_equal(values, rows)
    assert meta == {"domain_name": "droid_lerobot"}
    np.testing.assert_array_equal(act.load_actions(tmp_path / "a.safetensors"), rows)


def test_the_actions_files_domain_name_stands_in_for_the_flag(image, tmp_path):
    """The CLI read an actions file's domain_name (what --actions-out writes) instead of ignoring it."""
    path = tmp_path / "recorded.json"
    act.save_actions(path, np.zeros((16, 9), np.float32), domain_name="av", mode="policy")
    parser = generate.build_parser()
    base = ["--checkpoint", str(tmp_path), "--prompt", "drive", "--out", "o.mp4", "--device", "cpu",
            "--action-mode", "forward_dynamics", "--image", str(image), "--actions", str(path)]
    request = common.request_from_args(parser.parse_args(base))
    assert request.action.domain_name == "av"
    with pytest.raises(ValueError, match=r"^--domain-name droid_lerobot: the actions file .* was recorded for 'av'; "
                                         r"give --domain-name av or other actions\.$"):
        common.request_from_args(parser.parse_args([*base, "--domain-name", "droid_lerobot"]))


# -- action counts and chunk sizes -------------------------------------------------------------------------------

def test_count_hints_never_propose_a_chunk_size_that_is_refused():
    """Empty actions hinted "set chunk_size=0" (refused in turn: a loop); 6 actions hinted chunk_size=6 (a clip of
    7 frames, refused); a chunk size that works is still proposed."""
    def message(**kw):
        request = act.ActionRequest(**{"mode": "forward_dynamics", "chunk_size": 4, "domain_name": "droid_lerobot",
                                       "image": np.zeros((64, 96, 3), np.float32), **kw})
        with pytest.raises(ValueError) as err:
            check_action_request(request)
        return str(err.value)

    msg = message(raw_actions=np.zeros((0, 10), np.float32))
    assert "0 actions were given but chunk_size=4 needs exactly 4" in msg and "chunk_size=0" not in msg, msg
    msg = message(raw_actions=np.zeros((6, 10), np.float32))
    assert msg.endswith("; pass 4 actions.") and "chunk_size=6" not in msg, msg
    assert "set chunk_size=8 or pass 4 actions" in message(raw_actions=np.zeros((8, 10), np.float32))
    msg = message(mode="inverse_dynamics", image=None, video=np.zeros((7, 64, 96, 3), np.float32))
    assert msg.endswith("the video has 7; trim the video to 5 frames.") and "chunk_size=6" not in msg, msg


@pytest.mark.parametrize("chunk, frames, fix", [("3", 1, 4), ("6", 5, 8), ("1", 1, 4)])
def test_a_chunk_size_that_is_not_a_multiple_of_4_is_refused(not_a_checkpoint, image, tmp_path, capsys, chunk,
                                                             frames, fix):
    """--chunk-size 3 gave a 1-frame video silently (4 frames are 1 latent, decoded to 1 frame)."""
    msg = one_error(capsys, ["--checkpoint", not_a_checkpoint, *FAST, "--action-mode", "policy", "--domain-name",
                             "droid_lerobot", "--image", image, "--chunk-size", chunk, "--out", tmp_path / "o.mp4"])
    assert msg == (f"error: chunk_size={chunk} spans {int(chunk) + 1} frames, but a Cosmos3 clip has 4k+1 frames "
                   f"(the VAE keeps the first frame, then 4 per latent), so only {frames} would be generated; use a "
                   f"multiple of 4, e.g. chunk_size={fix}."), msg


# -- values of the run ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1"])
def test_control_guidance_that_is_not_a_number_from_0_to_20(not_a_checkpoint, tmp_path, capsys, value):
    """--control-guidance NaN/inf/negative gave a black video and exit 0 (already refused on main by resolve)."""
    edge = write_video(tmp_path / "edge.mp4", np.random.default_rng(0).random((9, 32, 32, 3)).astype(np.float32), 24)
    msg = one_error(capsys, ["--checkpoint", not_a_checkpoint, *FAST, "--height", "32", "--width", "32", "--control",
                             f"edge={edge}", f"--control-guidance={value}", "--out", tmp_path / "o.mp4"])
    assert msg == (f"error: control_guidance={float(value)!r} must be a number from 0 to 20 (1 = the controls as "
                   "given)."), msg


@pytest.mark.parametrize("value, fix", [("1", "try 5"), ("8", "try 5")])
def test_frames_per_chunk_hints(not_a_checkpoint, tmp_path, capsys, value, fix):
    """--frames-per-chunk 1 hinted a value that is refused in turn; 8 was reported as num_frames=8."""
    msg = one_error(capsys, ["--checkpoint", not_a_checkpoint, *FAST, "--height", "32", "--width", "32",
                             "--num-frames", "21", "--frames-per-chunk", value, "--out", tmp_path / "o.mp4"])
    assert msg.startswith(f"error: frames_per_chunk={value} must be 4k+1") and msg.rstrip(".").endswith(fix), msg


def test_an_empty_window_prompt_is_refused_before_the_first_window(not_a_checkpoint, tmp_path, capsys):
    msg = one_error(capsys, ["--checkpoint", not_a_checkpoint, "--prompt", "a red car", "--prompt", "  ",
                             "--prompt", "a blue car", "--steps", "1", "--device", "cpu", "--height", "32",
                             "--width", "32", "--num-frames", "13", "--frames-per-chunk", "5",
                             "--conditional-frames", "1", "--out", tmp_path / "o.mp4"])
    assert msg == ("error: prompt 2 of 3 (window 2) is empty; describe what each window shows, or give one prompt "
                   "for the whole video."), msg


@pytest.fixture(scope="module")
def distilled(tiny_checkpoint):
    return tiny_checkpoint("nano", seed=0, distilled=True)


@pytest.mark.parametrize("mode", ["action", "windows"])
def test_distilled_checkpoint_in_action_or_windows_mode_hints_nothing_not_given(distilled, image, tmp_path,
                                                                                 capsys, mode):
    """The message said to change steps/shift, which the user never gave; now it names the mode and the fix
    (already so on main: resolve refuses the mode before any sampling default)."""
    extra = (["--action-mode", "policy", "--domain-name", "droid_lerobot", "--image", image] if mode == "action"
             else ["--height", "32", "--width", "32", "--num-frames", "13", "--frames-per-chunk", "9"])
    msg = one_error(capsys, ["--checkpoint", distilled, *FAST[:2], "--device", "cpu", *extra,
                             "--out", tmp_path / "o.mp4"])
    assert msg == (f"error: checkpoint '{distilled.name}' is distilled (a fixed few-step schedule for one clip); the "
                   f"{mode} mode needs a base (non-distilled) checkpoint."), msg
    assert "steps" not in msg and "shift" not in msg


# -- images, folders ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("side", [10_000, 20_000])  # above PIL's 89-megapixel limit (a warning), above twice it
def test_a_decompression_bomb_image_is_refused_before_it_is_decoded(not_a_checkpoint, tmp_path, capsys, side):
    bomb = tmp_path / "bomb.png"
    Image.new("1", (side, side)).save(bomb)  # a few kB on disk, 1-5 GB as float frames
    msg = one_error(capsys, ["--checkpoint", not_a_checkpoint, *FAST, "--height", "32", "--width", "32",
                             "--num-frames", "5", "--image", bomb, "--out", tmp_path / "o.mp4"])
    assert msg == (f"error: read_image: {bomb} has more than 89 megapixels, which this reader refuses (a "
                   "decompression-bomb guard); downscale it first (Cosmos3 generates at most 4096 pixels a side)."), msg


def test_folders_are_reported_as_folders(not_a_checkpoint, tmp_path, capsys):
    from cosmos3_core import media

    folder = tmp_path / "clips"
    folder.mkdir()
    msg = one_error(capsys, ["--checkpoint", not_a_checkpoint, *FAST, "--height", "32", "--width", "32",
                             "--control", f"edge={folder}", "--out", tmp_path / "o.mp4"])
    assert msg == f"error: --control edge={folder}: {folder} is a folder, not a video file.", msg
    for read in (media.read_image, media.read_video):
        with pytest.raises(ValueError, match=f"^{read.__name__}: {folder} is a folder, not a file; give the file "):
            read(folder)


@pytest.mark.parametrize("flag, value", [("--temperature", "inf"), ("--temperature", "nan"), ("--top-p", "nan"),
                                         ("--repetition-penalty", "inf")])
def test_reasoner_sampling_values_must_be_finite(not_a_checkpoint, capsys, flag, value):
    """NaN/inf refused wherever a float enters: inf passed the reasoner's range checks (a temperature of inf samples
    uniformly, a repetition penalty of inf zeroes the logits it touches)."""
    from cosmos3_core.cli import reason

    code = reason.main(["--checkpoint", str(not_a_checkpoint), "--prompt", "hi", "--device", "cpu", f"{flag}={value}"])
    err = capsys.readouterr().err
    name = flag[2:].replace("-", "_")
    assert code == 2 and err.strip() == f"error: {name} must be a finite number, got {float(value)!r}.", err
