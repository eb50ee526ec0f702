"""Bad input, round four (issue 39; ``shared/reference/bad-input-2026-12-05.md``): each class that was silently wrong
or poorly worded, through the core and, where the node is what a user meets, through the real ComfyUI host.

LoRA: a change that overflows the compute dtype (PEFT ``lora_alpha`` 1e300), or dwarfs the weight it patches (kohya
alpha 1e30, weights ×1e15: the model saturates and two LoRAs give the same output), is refused naming the file; rank
0 and a negative alpha are refused; a LoRA on ``lm_head`` is told it patches the checkpoint's own output layer; a
folder named ``*.safetensors`` is called a folder.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from test_lora import TARGETS, linear_shapes, write_lora

from cosmos3_core.model.lora import LoraError, check_patch, read_lora


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    from cosmos3_core.model.loader import load_transformer

    return load_transformer(tiny_checkpoint("nano", seed=0), dtype=torch.float32)


@pytest.fixture(scope="module")
def shapes(model):
    return linear_shapes(model)


def _kohya(path, shapes, module, rank=4, alpha=None, scale=1.0, seed=0):
    out_f, in_f = shapes[module]
    g = torch.Generator().manual_seed(seed)
    flat = "lora_unet_" + module.replace(".", "_")
    sd = {f"{flat}.lora_down.weight": torch.randn(rank, in_f, generator=g) * 0.05 * scale,
          f"{flat}.lora_up.weight": torch.randn(out_f, rank, generator=g) * 0.05 * scale}
    if alpha is not None:
        sd[f"{flat}.alpha"] = torch.tensor(float(alpha))
    save_file(sd, str(path))
    return path


def _check_all(lora, model, name, strength=1.0, dtype=torch.float32):
    for module, patch in lora.items():
        check_patch(patch, model.get_submodule(module).weight, module, name, strength, dtype)


def test_huge_metadata_alpha_overflow_is_refused(shapes, model, tmp_path):
    path = write_lora(tmp_path / "meta_alpha_huge.safetensors", shapes, alpha=1e300)
    lora = read_lora(path, shapes)  # a finite Python float: only its product with the weights overflows
    with pytest.raises(LoraError, match=r"LoRA meta_alpha_huge.safetensors: its change to .* does not fit float32 "
                                        r"\(it overflows to inf/NaN\)"):
        _check_all(lora, model, path.name)


@pytest.mark.parametrize("case", ["alpha_huge", "weights_1e15"])
def test_saturating_lora_is_refused(case, shapes, model, tmp_path):
    m = TARGETS[0]
    path = _kohya(tmp_path / f"{case}.safetensors", shapes, m, alpha=1e30 if case == "alpha_huge" else 4.0,
                  scale=1.0 if case == "alpha_huge" else 1e15)
    lora = read_lora(path, shapes)
    with pytest.raises(LoraError, match=rf"LoRA {case}.safetensors: at strength 1 it changes {m} .* times that "
                                        r"weight's own size \(more than 1000×\)"):
        _check_all(lora, model, path.name)


def test_a_sane_lora_passes_at_any_allowed_strength(shapes, model, tmp_path):
    lora = read_lora(write_lora(tmp_path / "sane.safetensors", shapes, rank=4, alpha=8.0), shapes)
    for strength in (-10.0, 1.0, 10.0):
        _check_all(lora, model, "sane.safetensors", strength, torch.bfloat16)


def test_fp16_overflow_is_judged_in_the_compute_dtype(shapes, model, tmp_path):
    """A change of 1e5 fits float32 but not float16 (max 65504)."""
    m = TARGETS[0]
    out_f, in_f = shapes[m]
    path = tmp_path / "big.safetensors"
    down = torch.zeros(1, in_f)
    down[0, 0] = 1.0
    up = torch.zeros(out_f, 1)
    up[0, 0] = 1e5
    save_file({f"transformer.{m}.lora_A.weight": down, f"transformer.{m}.lora_B.weight": up}, str(path))
    lora = read_lora(path, shapes)
    with pytest.raises(LoraError, match="does not fit float16"):
        _check_all(lora, model, path.name, dtype=torch.float16)


def test_rank_zero_is_refused(shapes, tmp_path):
    m = TARGETS[0]
    out_f, in_f = shapes[m]
    path = tmp_path / "rank0.safetensors"
    save_file({f"transformer.{m}.lora_A.weight": torch.zeros(0, in_f),
               f"transformer.{m}.lora_B.weight": torch.zeros(out_f, 0)}, str(path))
    with pytest.raises(LoraError, match=rf"LoRA rank0.safetensors: {m} has rank 0 .* the file is damaged"):
        read_lora(path, shapes)


def test_negative_alpha_is_refused(shapes, tmp_path):
    path = _kohya(tmp_path / "alpha_neg.safetensors", shapes, TARGETS[0], alpha=-4.0)
    with pytest.raises(LoraError, match=r"alpha is -4; it must be a positive number .* use a negative strength"):
        read_lora(path, shapes)
    meta = write_lora(tmp_path / "meta_neg.safetensors", shapes, alpha=-8.0)
    with pytest.raises(LoraError, match=r"lora_alpha in its lora_adapter_metadata is -8.0 .* positive finite number"):
        read_lora(meta, shapes)
    zero = _kohya(tmp_path / "alpha_zero.safetensors", shapes, TARGETS[0], alpha=0.0)
    assert read_lora(zero, shapes)[TARGETS[0]].scale == 1.0  # kohya: alpha 0 means alpha = rank


def test_lm_head_lora_names_the_checkpoints_own_layer(shapes, tmp_path):
    path = tmp_path / "lm_head_only.safetensors"
    save_file({"transformer.lm_head.lora_A.weight": torch.randn(4, 256),
               "transformer.lm_head.lora_B.weight": torch.randn(1024, 4)}, str(path))
    towers = {m: s for m, s in shapes.items() if m != "lm_head"}  # the node's targets: the towers' linear layers
    with pytest.raises(LoraError) as info:
        read_lora(path, towers)
    msg = str(info.value)
    assert "the checkpoint's own output layer (lm_head" in msg and "another model" not in msg, msg


def test_folder_named_safetensors_is_called_a_folder(shapes, tmp_path):
    (tmp_path / "dir.safetensors").mkdir()
    with pytest.raises(LoraError, match=r"LoRA dir.safetensors is a folder, not a LoRA file"):
        read_lora(tmp_path / "dir.safetensors", shapes)


# -------------------------------------------------------------------------------------------- through the node
@pytest.mark.comfy
def test_lora_node_refuses_wrecking_loras_and_folders(host, tmp_path):
    from test_bad_input_nodes import _expect_error

    from cosmos3_core.model.loader import load_transformer
    from test_workflows import load_api, nodes_of, shrink_api

    loras = host.base_dir / "models" / "loras"
    loras.mkdir(parents=True, exist_ok=True)
    g = shrink_api(load_api("t2i"))
    (loader,) = nodes_of(g, "Cosmos3Loader")
    tiny = load_transformer(host.base_dir / "models" / "diffusers" / g[loader]["inputs"]["checkpoint"],
                            dtype=torch.float32)
    write_lora(loras / "cosmos3_r4_huge.safetensors", linear_shapes(tiny), alpha=1e300)
    (loras / "cosmos3_r4_dir.safetensors").mkdir(exist_ok=True)
    for name, needle in (("cosmos3_r4_huge.safetensors", "does not fit float32"),
                         ("cosmos3_r4_dir.safetensors", "is a folder")):
        graph = json.loads(json.dumps(g))
        graph["20"] = {"class_type": "Cosmos3LoraLoader",
                       "inputs": {"model": [loader, 0], "lora_name": name, "strength": 1.0}}
        for nid, node in graph.items():
            if nid != "20" and node["inputs"].get("model") == [loader, 0]:
                node["inputs"]["model"] = ["20", 0]
        _expect_error(host, graph, "Cosmos3LoraLoader", needle, name)


# -------------------------------------------------------------------------------------------- Long Video prompts
@pytest.mark.parametrize("text, want", [
    ("a cat\r\n---\r\na dog", ["a cat", "a dog"]),  # Windows line endings
    ("a cat\n--- \na dog", ["a cat", "a dog"]),  # a trailing space on the separator line
    ("a cat\n\t---\na dog", ["a cat", "a dog"]),
    ("a cat\r---\ra dog", ["a cat", "a dog"]),  # old Mac line endings
    ("---\na cat\n---\na dog", ["", "a cat", "a dog"]),  # leading: an empty window, refused by the resolver
    ("---\n---", ["", "", ""]),
    ("a cat\n---\n---\na dog", ["a cat", "", "a dog"]),  # doubled: an empty middle window
    ("a cat\n---\n", ["a cat", ""]),
    ("a cat --- a dog", ["a cat --- a dog"]),  # not on a line of its own: part of the prompt
    ("a cat\n----\na dog", ["a cat\n----\na dog"]),
    ("  one prompt  ", ["one prompt"]),
])
def test_window_prompt_separators(text, want):
    from cosmos3_core.sampling.prompt import split_window_prompts

    assert split_window_prompts(text) == want


@pytest.mark.comfy
@pytest.mark.parametrize("prompt, needle", [("---\r\na cat\r\n---\r\na dog", "prompt 1 of 3 (window 1) is empty"),
                                            ("a cat\n---\n---\na dog", "prompt 2 of 3 (window 2) is empty")])
def test_long_video_separator_never_leaks_into_a_prompt(host, prompt, needle):
    from test_bad_input_nodes import _expect_error

    from test_workflows import load_api, nodes_of, shrink_api

    g = shrink_api(load_api("long_t2v"))
    (lv,) = nodes_of(g, "Cosmos3LongVideo")
    g[lv]["inputs"]["prompt"] = prompt
    _expect_error(host, g, "Cosmos3LongVideo", needle)


# -------------------------------------------------------------------------------------------- CLI flags and files
def _cli_error(tiny_checkpoint, tmp_path, capsys, *extra) -> str:
    from test_bad_input import FAST, one_error

    from cosmos3_core.cli import main as generate

    argv = ["--checkpoint", str(tiny_checkpoint("nano", seed=3)), *FAST, "--out", str(tmp_path / "out.mp4"), *extra]
    return one_error(generate.main, argv, capsys)


def test_one_pass_with_frames_per_chunk_is_a_conflict(tiny_checkpoint, tmp_path, capsys):
    msg = _cli_error(tiny_checkpoint, tmp_path, capsys, "--one-pass", "--frames-per-chunk", "9")
    assert msg == ("error: one_pass asks for one clip but frames_per_chunk=9 asks for windows of that length; drop "
                   "one of them (CLI: --one-pass, --frames-per-chunk)."), msg


def test_empty_control_video_names_the_argument(tiny_checkpoint, tmp_path, capsys):
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    msg = _cli_error(tiny_checkpoint, tmp_path, capsys, "--control", f"edge={empty}")
    assert msg.startswith(f"error: --control edge={empty}: not a readable video: it is empty (0 bytes)."), msg
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(b"not a video at all" * 10)
    msg = _cli_error(tiny_checkpoint, tmp_path, capsys, "--control", f"edge={garbage}")
    assert msg.startswith(f"error: --control edge={garbage}: not a readable video:") and "Errno" not in msg, msg


# -------------------------------------------------------------------------------------------- Transfer controls
def _clip(path, frames: int, w: int = 96, h: int = 64):
    import numpy as np

    from cosmos3_core.media import write_video

    rng = np.random.default_rng(frames)
    write_video(path, (rng.random((frames, h, w, 3)) * 255).astype(np.uint8), 24)
    return path


@pytest.mark.parametrize("kind", ["png", "one_frame"])
def test_still_image_or_one_frame_control_is_refused(kind, tiny_checkpoint, tmp_path, capsys):
    if kind == "png":
        import numpy as np
        from PIL import Image

        control = tmp_path / "img96x64.png"
        Image.fromarray((np.random.default_rng(0).random((64, 96, 3)) * 255).astype(np.uint8)).save(control)
    else:
        control = _clip(tmp_path / "one.mp4", 1)
    msg = _cli_error(tiny_checkpoint, tmp_path, capsys, "--control", f"edge={control}", "--num-frames", "9")
    assert "the control videos have 1 frame (a still image?)" in msg and "at least 5 frames" in msg, msg


def test_short_control_gives_a_notice_and_a_window_its_own_length(tiny_checkpoint, tmp_path, capsys):
    """A 9-frame control with num_frames 13 and no --frames-per-chunk: a notice that the video has 9 frames, one
    9-frame window (not a 189-frame one), and --latents-out agrees with the mp4 (3 latent frames)."""
    from safetensors.torch import load_file

    from cosmos3_core.cli import main as generate
    from cosmos3_core.media import probe_media

    out, lat = tmp_path / "t.mp4", tmp_path / "t.safetensors"
    argv = ["--checkpoint", str(tiny_checkpoint("nano", seed=3)), "--prompt", "a road", "--height", "64", "--width",
            "96", "--num-frames", "13", "--steps", "1", "--device", "cpu", "--dtype", "fp32", "--control",
            f"edge={_clip(tmp_path / 'nine.mp4', 9)}", "--out", str(out), "--latents-out", str(lat)]
    assert generate.main(argv) == 0
    err = capsys.readouterr().err  # the CLI prints the core's notes on stderr
    assert "the control videos have 9 frames, fewer than num_frames=13; the video will have 9 frames" in err, err
    assert probe_media(out)["video_frames"] == 9
    latents = load_file(str(lat))
    assert [t.shape[2] for t in latents.values()] == [3], {k: t.shape for k, t in latents.items()}


def test_transfer_window_is_capped_at_the_video():
    from cosmos3_core.resolve import transfer_window

    assert [transfer_window(189, n) for n in (5, 9, 10, 13, 189, 400)] == [5, 9, 13, 13, 189, 189]
    assert transfer_window(9, 100) == 9


@pytest.mark.comfy
def test_long_video_refuses_a_still_image_as_control(host):
    from test_bad_input_nodes import _expect_error

    from test_workflows import TEST_IMAGE, load_api, nodes_of, shrink_api

    g = shrink_api(load_api("transfer"), prefix="cosmos3_tests/tr_still")
    (lv,) = nodes_of(g, "Cosmos3LongVideo")
    g["40"] = {"class_type": "LoadImage", "inputs": {"image": TEST_IMAGE}}
    g[lv]["inputs"]["edge"] = ["40", 0]
    for nid in [n for n, v in g.items() if v["class_type"] in ("LoadVideo", "GetVideoComponents", "Canny")]:
        del g[nid]
    _expect_error(host, g, "Cosmos3LongVideo", "the control videos have 1 frame (a still image?)")
    assert not list((host.base_dir / "output" / "cosmos3_tests").glob("tr_still*")), "a refused run wrote a file"
