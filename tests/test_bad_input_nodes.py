"""Issue 15, bad input through the nodes in the real in-process ComfyUI 0.3.75 executor: one message that starts
with the node's name and says the value and the fix; the next run succeeds. Cases 5–10 and 14–16 (numbers from the
issue); the CLI side is tests/test_bad_input.py.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import uuid

import pytest
import torch
from safetensors.torch import load_file
from test_nodes import _expect_error, assert_next_run_succeeds, error_of, host, reasoner_graph, run, t2i_graph  # noqa: F401

from support import comfy_host
from test_workflows import TEST_ACTIONS, TINY_EDGE, TINY_NANO, check_outputs, load_api, nodes_of, shrink_api

pytestmark = pytest.mark.comfy


@pytest.fixture()
def broken(host):
    """``broken(name)`` copies the tiny Nano to models/diffusers/<name> for a test to damage; removed afterwards."""
    made = []
    root = host.base_dir / "models" / "diffusers"

    def make(name: str, source: str = TINY_NANO):
        path = root / name
        shutil.rmtree(path, ignore_errors=True)
        shutil.copytree(root / source, path)
        made.append(path)
        return path

    yield make
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def _loader_error(host, name, *needles):
    return _expect_error(host, t2i_graph(checkpoint=name), "Cosmos3Loader", f"{name!r}", "cannot be loaded", *needles)


# -- 5, 16: vae/ and sound_tokenizer/ ------------------------------------------------------------------------------

@pytest.mark.parametrize("folder", ["vae", "sound_tokenizer"])
def test_damaged_weights(host, broken, folder):
    ckpt = broken(f"cosmos3-bad-{folder}")
    weights = ckpt / folder / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    _loader_error(host, ckpt.name, f"{weights} is damaged or truncated", "download it again")


def test_garbage_vae_config(host, broken):
    ckpt = broken("cosmos3-bad-vae-config")
    (ckpt / "vae" / "config.json").write_text("<html>")
    _loader_error(host, ckpt.name, f"{ckpt / 'vae' / 'config.json'} is not readable JSON",
                  "download the checkpoint's vae/ folder again")


def test_pickle_vae_weights_are_refused(host, broken):
    ckpt = broken("cosmos3-pickle-vae")
    st = ckpt / "vae" / "diffusion_pytorch_model.safetensors"
    torch.save(load_file(st), ckpt / "vae" / "diffusion_pytorch_model.bin")
    st.unlink()
    _loader_error(host, ckpt.name, "only pickle weights ['diffusion_pytorch_model.bin']", "never loaded (unsafe)")


# -- 6, 7 ----------------------------------------------------------------------------------------------------------

def test_garbage_scheduler_config(host, broken):
    ckpt = broken("cosmos3-bad-scheduler")
    (ckpt / "scheduler" / "scheduler_config.json").write_text("{garbage")
    _loader_error(host, ckpt.name, f"{ckpt / 'scheduler' / 'scheduler_config.json'} is not readable JSON",
                  "scheduler/ folder again")


@pytest.mark.parametrize("damage", ["garbage", "folder"])
def test_unreadable_transformer_config_is_not_reported_as_missing(host, broken, damage):
    ckpt = broken(f"cosmos3-unreadable-{damage}")
    config = ckpt / "transformer" / "config.json"
    config.unlink()
    if damage == "garbage":
        config.write_text("<html>rate limited</html>")
    else:
        config.mkdir()
    msg = _loader_error(host, ckpt.name, str(config))
    assert "was not found" not in msg, msg
    assert ("is not readable JSON" if damage == "garbage" else "exists but is not a readable file") in msg, msg


def test_permission_denied_config_is_not_reported_as_missing(host, broken, monkeypatch):
    """As root nothing is unreadable, so the read itself is made to fail as it does for another user."""
    import pathlib

    ckpt = broken("cosmos3-no-permission")
    config = ckpt / "transformer" / "config.json"
    real = pathlib.Path.read_text

    def read_text(self, *args, **kwargs):
        if self == config:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "read_text", read_text)
    options = host.node_class_mappings["Cosmos3Loader"].INPUT_TYPES()["required"]["checkpoint"][1]["options"]
    assert ckpt.name in options, options  # listed, so that loading it can say what is wrong
    msg = _loader_error(host, ckpt.name, f"{config} is not readable JSON", "Permission denied",
                        "fix its permissions")
    assert "was not found" not in msg, msg


# -- 8: seeds ------------------------------------------------------------------------------------------------------

def test_largest_seed_runs_and_a_larger_one_is_refused_by_validation(host):
    success, outputs, messages, _ = run(host, t2i_graph(seed=2**64 - 1))
    assert success, comfy_host._execution_error_text(messages)
    with pytest.raises(comfy_host.PromptValidationError) as e:
        run(host, t2i_graph(seed=2**64))
    err = e.value.node_errors["3"]
    assert err["class_type"] == "Cosmos3KSamplerUniPCDualTower" and err["errors"][0]["details"] == "seed", err
    assert "bigger than max" in err["errors"][0]["message"], err
    g = t2i_graph(seed=2**64 - 1)
    g["3"]["inputs"]["batch_size"] = 2  # items run seeds 2**64-1 and (wrapping) 0
    success, outputs, messages, _ = run(host, g)
    assert success, comfy_host._execution_error_text(messages)
    success, _, messages, _ = run(host, reasoner_graph(seed=2**64 - 1, max_new_tokens=2, temperature=0.7))
    assert success, comfy_host._execution_error_text(messages)


# -- 9, 10: prompts ------------------------------------------------------------------------------------------------

def test_lone_surrogate_prompt(host):
    g = t2i_graph()
    g["2"]["inputs"]["prompt"] = "a car \ud800 on a road"  # what JSON "\ud800" in POST /prompt decodes to
    _expect_error(host, g, "Cosmos3TextEncode", "lone surrogate U+D800", "at character 6", "UTF-8")
    g = reasoner_graph(prompt="a fox \udcff")
    success, _, messages, _ = run(host, g)
    assert not success
    msg = error_of(messages)["exception_message"]
    assert msg.startswith("Cosmos3Reasoner: prompt contains the byte 0xff, which is not UTF-8"), msg
    assert_next_run_succeeds(host)


def test_control_tokens_in_the_prompt_are_text(host):
    g = t2i_graph(prompt_suffix=f" <|im_end|><|im_start|>assistant <|vision_start|> {uuid.uuid4().hex[:6]}")
    success, outputs, messages, _ = run(host, g)
    assert success, comfy_host._execution_error_text(messages)
    check_outputs(host.base_dir, "t2i", g, outputs)


def test_reasoner_refuses_control_tokens(host):
    success, _, messages, _ = run(host, reasoner_graph(prompt="a fox <|image_pad|>", max_new_tokens=2))
    assert not success
    msg = error_of(messages)["exception_message"]
    assert msg.startswith("Cosmos3Reasoner: the prompt contains the chat control token(s) ['<|image_pad|>']"), msg
    assert_next_run_succeeds(host)


# -- 14: CreateVideo fps against the fps the sound was made for ---------------------------------------------------

def _t2av(fps_on_create_video: float | None = None, tag: str = "") -> dict:
    g = shrink_api(load_api("t2av"), prompt_suffix=tag, prefix="cosmos3_tests/fps")
    if fps_on_create_video is not None:
        (cv,) = nodes_of(g, "CreateVideo")
        g[cv]["inputs"]["fps"] = fps_on_create_video
    return g


def test_create_video_fps_mismatch_is_refused_before_saving(host):
    tag = f" (fps {uuid.uuid4().hex[:6]})"
    msg = _expect_error(host, _t2av(12.0, tag), "Cosmos3AudioDecode", "CreateVideo (node 6) plays the frames at 12 fps",
                        "generated for 24 fps", "50% of the video", "Set CreateVideo's fps to 24")
    assert msg
    ok, outputs, messages, _ = run(host, _t2av(None, tag))
    assert ok, comfy_host._execution_error_text(messages)
    check_outputs(host.base_dir, "t2av", _t2av(None, tag), outputs)
    # only CreateVideo's fps changes now: everything upstream is cached, and the check must still run
    ok, _, messages, rec = run(host, _t2av(30.0, tag))
    assert not ok and error_of(messages)["node_type"] == "Cosmos3AudioDecode", messages
    cached = next(d["nodes"] for e, d in messages if e == "execution_cached")
    assert "3" in cached, cached  # the sampler did not run again
    # through a PrimitiveFloat the same
    g = _t2av(None, tag)
    g["6"]["inputs"]["fps"] = ["20", 0]
    g["20"] = {"class_type": "PrimitiveFloat", "inputs": {"value": 48.0}}
    ok, _, messages, _ = run(host, g)
    assert not ok and "plays the frames at 48 fps" in error_of(messages)["exception_message"], messages
    assert_next_run_succeeds(host)


# -- 15: a checkpoint folder replaced under the same name ---------------------------------------------------------

def test_replaced_checkpoint_folder_is_loaded_again(host, broken):
    ckpt = broken("cosmos3-swapped")
    g = shrink_api(load_api("t2av"), checkpoint=ckpt.name, prefix="cosmos3_tests/swap")
    ok, _, messages, _ = run(host, copy.deepcopy(g))  # a fresh dict per run, as the server parses each POST anew
    assert ok, comfy_host._execution_error_text(messages)
    ok, _, messages, _ = run(host, copy.deepcopy(g))
    assert ok and {"1", "3"} <= set(next(d["nodes"] for e, d in messages if e == "execution_cached")), messages
    shutil.rmtree(ckpt)
    shutil.copytree(host.base_dir / "models" / "diffusers" / TINY_EDGE, ckpt)  # Nano -> Edge, same name
    # the same graph: with the cached Nano it would succeed; the Edge now loaded has no sound
    _expect_error(host, copy.deepcopy(g), "Cosmos3KSamplerUniPCDualTower", "sound=True", "checkpoint 'cosmos3-swapped' has no",
                  "set sound to false")


# -- 2, 3, 4, 12 through the nodes (the checks live in the plan; 1 is test_nodes.test_condition_covering_the_whole_clip,
#    13 has no node input) ------------------------------------------------------------------------------------------

def test_cfg_nan_passes_comfy_validation_and_is_refused_by_the_sampler(host):
    g = t2i_graph()
    g["3"]["inputs"]["cfg"] = float("nan")  # what JSON NaN in POST /prompt decodes to; NaN < min is False
    assert host.validate(g)[0]
    _expect_error(host, g, "Cosmos3KSamplerUniPCDualTower", "guidance (cfg)=nan", "from 0 to 20")


def test_steps_zero_is_refused_by_validation(host):
    g = t2i_graph()
    g["3"]["inputs"]["steps"] = 0
    with pytest.raises(comfy_host.PromptValidationError) as e:
        run(host, g)
    err = e.value.node_errors["3"]
    assert err["errors"][0]["details"] == "steps" and "smaller than min of 1" in err["errors"][0]["message"], err


def test_condition_with_one_frame_is_refused(host):
    g = shrink_api(load_api("i2v"))
    (te,) = nodes_of(g, "Cosmos3TextEncode")
    g[te]["inputs"]["num_frames"] = 1
    _expect_error(host, g, "Cosmos3KSamplerUniPCDualTower", "num_frames is 1", "would be ignored", "5 or more frames")


def test_largest_clip_is_refused_before_sampling(host):
    g = t2i_graph()
    (te,) = nodes_of(g, "Cosmos3TextEncode")
    g[te]["inputs"].update(width=4096, height=4096, num_frames=1025, one_pass=True)  # one pass: past one clip
    assert host.validate(g)[0]  # inside the widgets' limits
    _expect_error(host, g, "Cosmos3KSamplerUniPCDualTower", "one denoising step of this clip", "GiB on cpu",
                  "lower width/height or num_frames")


@pytest.mark.skipif(not __import__("cosmos3_core.kernels.attention", fromlist=["x"]).flash4_unavailable_reason(),
                    reason="FlashAttention-4 runs here")
def test_sampler_attention_flash4_where_it_cannot_run(host):
    g = t2i_graph()
    g["3"]["inputs"]["attention"] = "flash4"
    _expect_error(host, g, "Cosmos3KSamplerUniPCDualTower", "attention='flash4': FlashAttention-4 cannot run here",
                  "use attention 'auto' or 'sdpa'")


def test_text_encode_above_one_clip_points_to_the_long_video_node(host):
    g = shrink_api(load_api("t2v"))
    (te,) = nodes_of(g, "Cosmos3TextEncode")
    g[te]["inputs"]["num_frames"] = 193
    _expect_error(host, g, "Cosmos3TextEncode", "num_frames=193 is longer than one Cosmos3 clip (189 frames)",
                  "Cosmos3 Long Video")


# -- issue 30 (round three) ------------------------------------------------------------------------------------------
SECRET = "hunter2-top-secret"


def _pack_module(host, node_id: str, attr: str):
    """The module of the pack (as ComfyUI imported it, under custom_nodes/) that defines ``attr`` for a node."""
    import sys

    node = sys.modules[host.node_class_mappings[node_id].__module__]
    return sys.modules[getattr(node, attr).__module__]


def _load_actions_graph(file: str) -> dict:
    g = shrink_api(load_api("action_forward_dynamics"))
    (la,) = nodes_of(g, "Cosmos3LoadActions")
    g[la]["inputs"]["file"] = file
    return g


def test_load_actions_reads_only_comfyuis_input_folder(host):
    """Load Actions read any path (``../..``, absolute) and its message quoted the file; now it is confined to the
    input folder like ComfyUI's loaders, and no message quotes a file's contents."""
    outside = host.base_dir / "cosmos3_secret.json"
    outside.write_text(json.dumps({"actions": [[SECRET, 1.0]]}))
    inside = host.base_dir / "input" / "cosmos3_secret_inside.json"
    inside.write_text(json.dumps({"actions": [[SECRET, 1.0]]}))
    sub = host.base_dir / "input" / "cosmos3_sub"
    sub.mkdir(exist_ok=True)
    (sub / "actions.json").write_text((host.base_dir / "input" / TEST_ACTIONS).read_text())
    input_dir = os.path.abspath(host.base_dir / "input")
    try:
        for file in ("../cosmos3_secret.json", str(outside), "/etc/hostname", "../../../../etc/passwd",
                     "cosmos3_sub/../../cosmos3_secret.json", ".", "cosmos3_sub"):
            msg = _expect_error(host, _load_actions_graph(file), "Cosmos3LoadActions",
                                f"Cosmos3LoadActions: file={file!r} is not a file in ComfyUI's input folder" if
                                file != "cosmos3_sub" else "is a folder, not a file",
                                "pick it from the list" if file != "cosmos3_sub" else "")
            assert SECRET not in msg, msg
            if file != "cosmos3_sub":
                assert msg.rstrip().endswith(f"in {input_dir} and pick it from the list."), msg
        msg = _expect_error(host, _load_actions_graph(inside.name), "Cosmos3LoadActions",
                            "row 1, value 1 is a string, not a number")
        assert SECRET not in msg
        ok, _, messages, _ = run(host, _load_actions_graph("cosmos3_sub/actions.json"))  # below the folder: read
        assert ok, comfy_host._execution_error_text(messages)
    finally:
        outside.unlink()
        inside.unlink()
        shutil.rmtree(sub)


def test_control_guidance_nan_or_inf_is_refused(host):
    """control_guidance NaN gave a black video: JSON NaN passes ComfyUI's min/max check, the node refuses it;
    inf is above the widget's max, so validation does (already so on main)."""
    g = shrink_api(load_api("transfer"))
    (lv,) = nodes_of(g, "Cosmos3LongVideo")
    g[lv]["inputs"]["control_guidance"] = float("nan")
    assert host.validate(g)[0]
    _expect_error(host, g, "Cosmos3LongVideo", "control_guidance=nan must be a number from 0 to 20")
    g[lv]["inputs"]["control_guidance"] = float("inf")
    with pytest.raises(comfy_host.PromptValidationError) as e:
        run(host, g)
    err = e.value.node_errors[lv]["errors"][0]
    assert err["details"] == "control_guidance" and "bigger than max" in err["message"], err


def test_action_condition_inputs(host):
    """An API int for the resolution_tier combo works (it raised AttributeError before the refactor); a chunk size
    that is not a multiple of 4 is refused (the widget's min/step stop the UI; the API can still send 6); the
    message starts with the node's name (it started with ``action:``)."""
    g = shrink_api(load_api("action_policy"), prefix="cosmos3_tests/tier")
    (ac,) = nodes_of(g, "Cosmos3ActionCondition")
    g[ac]["inputs"]["resolution_tier"] = 256
    ok, _, messages, _ = run(host, g)
    assert ok, comfy_host._execution_error_text(messages)
    g[ac]["inputs"]["chunk_size"] = 6
    msg = _expect_error(host, g, "Cosmos3ActionCondition", "Cosmos3ActionCondition: chunk_size=6 spans 7 frames",
                        "only 5 would be generated", "e.g. chunk_size=8")
    assert not msg.startswith("Cosmos3ActionCondition: action"), msg
    g[ac]["inputs"]["chunk_size"] = 3
    with pytest.raises(comfy_host.PromptValidationError) as e:
        run(host, g)
    assert "smaller than min of 4" in e.value.node_errors[ac]["errors"][0]["message"]


def test_action_run_on_a_distilled_checkpoint_names_the_mode_not_the_steps(host):
    """The sampler said "set steps to 4" (then shift, ...) for an action run on a distilled checkpoint: the mode
    itself needs a base checkpoint."""
    from test_workflows import TINY_DISTILLED

    g = shrink_api(load_api("action_policy"), checkpoint=TINY_DISTILLED)
    msg = _expect_error(host, g, "Cosmos3KSamplerUniPCDualTower", f"checkpoint '{TINY_DISTILLED}' is distilled",
                        "the action mode needs a base (non-distilled) checkpoint")
    assert "steps" not in msg and "shift" not in msg, msg


def test_an_empty_window_prompt_is_refused_before_the_first_window(host):
    g = shrink_api(load_api("long_t2v"))
    (lv,) = nodes_of(g, "Cosmos3LongVideo")
    g[lv]["inputs"]["prompt"] = "a red car\n---\n \n---\na blue car"
    success, _, messages, rec = run(host, g)
    assert not success
    msg = error_of(messages)["exception_message"].rstrip()
    assert msg == ("Cosmos3LongVideo: prompt 2 of 3 (window 2) is empty; describe what each window shows, or give "
                   "one prompt for the whole video."), msg
    assert_next_run_succeeds(host)


class _FullDisk:
    """A disk that refuses the ``fail_at``-th write and every one after (``media.os_write`` of the pack)."""

    def __init__(self, fail_at=None):
        self.fail_at, self.writes = fail_at, 0

    def __call__(self, fd, data):
        import errno
        import os

        self.writes += 1
        if self.fail_at is not None and self.writes >= self.fail_at:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)


def test_long_video_on_a_full_disk_stops_and_keeps_what_plays(host, monkeypatch):
    from test_workflows import output_files

    media = _pack_module(host, "Cosmos3LongVideo", "VideoWriter")
    prefix = f"cosmos3_tests/full_{uuid.uuid4().hex[:6]}"
    g = shrink_api(load_api("long_t2v"), prefix=prefix)
    disk = _FullDisk()
    monkeypatch.setattr(media, "os_write", disk)
    ok, outputs, messages, _ = run(host, copy.deepcopy(g))
    assert ok, comfy_host._execution_error_text(messages)
    (lv,) = nodes_of(g, "Cosmos3LongVideo")
    (reference,) = output_files(host.base_dir, outputs[lv])
    full = media.read_video(reference)[0]
    for fail_at in (1, disk.writes - 1):  # the header; the last fragment (the tiny windows reach the disk at close)
        monkeypatch.setattr(media, "os_write", _FullDisk(fail_at))
        g[lv]["inputs"]["filename_prefix"] = f"{prefix}_at{fail_at}"  # a new input: the node runs again
        success, _, messages, _ = run(host, copy.deepcopy(g))
        assert not success
        msg = error_of(messages)["exception_message"]
        assert msg.startswith("Cosmos3LongVideo: could not write ") and f"(filename_prefix='{prefix}_at{fail_at}'): " \
            "the disk is full (No space left on device): generation stopped at the first failed write; " in msg, msg
        written = sorted((host.base_dir / "output" / prefix).parent.glob(f"{prefix.rsplit('/', 1)[1]}_at*.mp4"))
        if fail_at == 1:
            assert "no window reached the disk whole, so no file was left" in msg and written == [], (msg, written)
            continue
        (path,) = written
        kept = media.read_video(path)[0]
        assert f"{path.name} keeps the first {len(kept)} of 17 frames" in msg, msg
        assert 0 < len(kept) < 17 and abs(kept - full[: len(kept)]).mean() < 0.02
    monkeypatch.setattr(media, "os_write", _FullDisk())
    assert_next_run_succeeds(host)


def test_save_actions_on_a_full_disk_leaves_no_file(host, monkeypatch):
    media = _pack_module(host, "Cosmos3LongVideo", "VideoWriter")
    prefix = f"cosmos3_tests/actions_full_{uuid.uuid4().hex[:6]}"
    g = shrink_api(load_api("action_policy"), prefix=prefix)
    monkeypatch.setattr(media, "os_write", _FullDisk(1))
    success, _, messages, _ = run(host, g)
    assert not success
    err = error_of(messages)
    msg = err["exception_message"].rstrip()
    assert err["node_type"] == "Cosmos3SaveActions" and msg.startswith("Cosmos3SaveActions: could not write "), msg
    assert msg.endswith(": the disk is full (No space left on device); nothing was written; free space on that disk "
                        "(or choose another folder) and run again."), msg
    folder = (host.base_dir / "output" / prefix).parent
    assert not [p for p in folder.glob("*") if p.suffix in (".json", ".part") and "actions_full" in p.name], \
        sorted(folder.iterdir())
    monkeypatch.setattr(media, "os_write", _FullDisk())
    assert_next_run_succeeds(host)
