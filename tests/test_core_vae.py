"""The loader's core ``VAE`` output (ComfyUI's own Wan2.2 VAE over the checkpoint's VAE) in the real ComfyUI 0.3.75.

* ``wan_layout.to_wan_layout`` renames diffusers' ``AutoencoderKLWan`` tensors so that ComfyUI's
  ``comfy.ldm.wan.vae2_2.WanVAE`` loads them strictly (every tensor, no leftovers), and that network then decodes
  and encodes as the pack's ``Cosmos3VAE`` (tiny widths: ComfyUI's class takes them as arguments).
* The output is built on first use only (a second copy of the VAE otherwise for nothing), and a checkpoint whose
  VAE is not the released geometry (``comfy.sd.VAE`` builds only that one) is refused by name when used.
* On a checkpoint with a full-size (random) Wan2.2 TI2V-5B VAE: core VAE Decode, VAE Decode (Tiled) and VAE Encode
  against the pack's own decode / encode, in the in-process host (float outputs) and over HTTP on a real
  ``main.py`` server (PNG / ``.latent`` files).

Tolerances, as measured (fp32, CPU): untiled decode and encode differ from the pack's by float rounding only
(max 1.3e-6 in [0, 1] pixels for the tiny VAE; the bound is 1e-5). PNGs of the same server are 8-bit truncations
of those floats, so a value moves by one level only where it sits within ~1e-6 of a level boundary. VAE Decode
(Tiled) with its default tile (512 px) holds these small frames in one tile and is then the untiled decode (same
bound); with a tile smaller than the frame it is not the untiled decode: each tile is decoded on its own (zero
padding at its borders, and a random VAE's receptive field spans the whole small frame) and the overlaps are
blended, so its frames differ from the pack's at the seams (``TILED_MEAN_ABS``, from the measurement noted there).
"""
from __future__ import annotations

import gc
import json
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from support import comfy_host
from test_workflows import TEST_IMAGE, TINY_NANO, prepared_executor, write_test_inputs

pytestmark = pytest.mark.comfy

FULL = "cosmos3-tiny-nano-wan22vae"  # the tiny transformer with a full-size Wan2.2 TI2V-5B VAE (random, bf16)
H, W, FRAMES = 48, 112, 5  # 3x7 latent: VAE Decode (Tiled) at tile 64 px really tiles (along the width)
# VAE Decode (Tiled) at tile 64 px on that latent (two tiles along the width) against the untiled pack decode:
# measured mean |diff| 0.054, max 0.43 on the random full-size VAE (seams; untiled: 8.3e-7)
TILED_MEAN_ABS = 0.1


def _full_vae_source(tmp_path_factory) -> Path:
    """Built once per session (~20 s, 1.4 GB) and linked into each ComfyUI home that needs it."""
    from diffusers import AutoencoderKLWan

    from cosmos3_core.testing.tiny import build_tiny_checkpoint
    from cosmos3_core.vae.wan_layout import WAN22_TI2V_5B

    path = tmp_path_factory.getbasetemp() / FULL
    if (path / "vae" / "config.json").is_file() and (path / "model_index.json").is_file():
        return path
    tmp = path.with_name(f".{FULL}.{uuid.uuid4().hex[:8]}.part")
    build_tiny_checkpoint(tmp, variant="nano", seed=3, sound=False)
    cfg = json.loads((tmp / "vae" / "config.json").read_text())
    shutil.rmtree(tmp / "vae")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        vae = AutoencoderKLWan(**WAN22_TI2V_5B, latents_mean=cfg["latents_mean"], latents_std=cfg["latents_std"])
    vae.to(torch.bfloat16).save_pretrained(tmp / "vae")
    del vae
    gc.collect()
    tmp.rename(path)
    return path


def _link(models_dir: Path, source: Path) -> None:
    link = models_dir / FULL
    if not link.exists():
        models_dir.mkdir(parents=True, exist_ok=True)
        link.symlink_to(source, target_is_directory=True)


def _raw_latent(checkpoint: Path, seed: int = 0) -> torch.Tensor:
    """Raw Wan2.2 latents (as the sampler's LATENT holds them) of a 5-frame 48x112 clip."""
    cfg = json.loads((checkpoint / "vae" / "config.json").read_text())
    z = torch.randn(1, 48, 2, H // 16, W // 16, generator=torch.Generator().manual_seed(seed))
    return z * torch.tensor(cfg["latents_std"]).view(1, -1, 1, 1, 1) + torch.tensor(cfg["latents_mean"]).view(1, -1, 1, 1, 1)


@pytest.fixture(scope="module")
def host(tiny_checkpoint):
    return prepared_executor(tiny_checkpoint)


# -------------------------------------------------------------------------------------------- the rename

def test_rename_loads_strictly_into_comfyui_wan22_vae_and_matches_the_pack(host):
    import comfy.ldm.wan.vae2_2 as comfy_wan

    from cosmos3_core.vae.video import load_vae
    from cosmos3_core.vae.wan_layout import to_wan_layout

    pack = load_vae(host.base_dir / "models" / "diffusers" / TINY_NANO)  # base_dim 8, decoder 16, 1 res block
    cfg = pack.vae.config
    net = comfy_wan.WanVAE(dim=cfg.base_dim, dec_dim=cfg.decoder_base_dim, z_dim=48, dim_mult=list(cfg.dim_mult),
                           num_res_blocks=cfg.num_res_blocks, attn_scales=[],
                           temperal_downsample=list(cfg.temperal_downsample)).eval()
    sd = to_wan_layout(pack.vae.state_dict())
    assert all(sd[k].data_ptr() == v.data_ptr() for k, v in zip(sd, pack.vae.state_dict().values()))  # no copy
    net.load_state_dict(sd, strict=True)
    raw = torch.randn(1, 48, 3, 2, 3, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = pack.decode(pack.normalize(raw))  # [9, 32, 48, 3] in [0, 1]
        theirs = ((net.decode(raw).clamp(-1, 1) + 1) / 2).clamp(0, 1)[0].permute(1, 2, 3, 0)
        assert ours.shape == theirs.shape == (9, 32, 48, 3)
        assert (ours - theirs).abs().max().item() <= 1e-5
        pixels = torch.rand(1, 3, 9, 32, 48, generator=torch.Generator().manual_seed(2)) * 2 - 1
        enc_ours, enc_theirs = pack.denormalize(pack.encode(pixels)), net.encode(pixels)
        assert (enc_ours - enc_theirs).abs().max().item() <= 1e-5 * enc_theirs.abs().max().item()


def test_rename_refuses_unknown_tensors():
    from cosmos3_core.vae.wan_layout import to_wan_layout

    with pytest.raises(ValueError, match=r"unknown Wan2.2 VAE tensor 'decoder.extra.weight'"):
        to_wan_layout({"decoder.conv_in.weight": torch.zeros(1), "decoder.extra.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="unknown resnet tensor"):
        to_wan_layout({"encoder.down_blocks.0.resnets.0.norm3.gamma": torch.zeros(1)})


# -------------------------------------------------------------------------------------------- built on first use

def test_core_vae_encode_of_a_tiny_image_is_one_message(host):
    """Core VAE Encode of a 7x7 image raised PyTorch's kernel-size error from the encoder (issue 39); the size is
    checked first (before the VAE is even built)."""
    import nodes as comfy_nodes

    _handle, vae = host.node_class_mappings["Cosmos3Loader"].execute(checkpoint=TINY_NANO, dtype="fp32",
                                                                      device="cpu").result
    for encode in (lambda px: comfy_nodes.VAEEncode().encode(vae, px),
                   lambda px: comfy_nodes.VAEEncodeTiled().encode(vae, px, 512, 64)):
        with pytest.raises(ValueError, match=r"^VAE Encode \(Cosmos3 Load Checkpoint's vae\): the image is 7x7; "
                                             r"Cosmos3's Wan2.2 VAE needs at least 16x16 pixels"):
            encode(torch.rand(1, 7, 7, 3))
    assert not vae.cosmos3_built


def test_vae_output_is_built_on_first_use_and_refuses_a_non_released_vae(host):
    import comfy.sd

    handle, vae = host.node_class_mappings["Cosmos3Loader"].execute(checkpoint=TINY_NANO, dtype="fp32",
                                                                     device="cpu").result
    assert isinstance(vae, comfy.sd.VAE) and not vae.cosmos3_built
    assert vae.get_ram_usage() == 0  # what ComfyUI's RAM-pressure cache reads: nothing held yet
    assert "first_stage_model" not in vae.__dict__
    with pytest.raises(ValueError, match=r"^Cosmos3Loader: the vae output cannot be built .*base_dim=8 .*"
                                         r"Cosmos3 VAE Decode"):
        vae.decode(torch.zeros(1, 48, 1, 2, 3))
    assert not vae.cosmos3_built
    # the same through a graph: core VAE Decode reports it with the loader's message
    from test_workflows import load_api, shrink_api

    g = shrink_api(load_api("t2i"), prefix="cosmos3_core_vae/tiny")
    (dec,) = [k for k, v in g.items() if v["class_type"] == "Cosmos3VAEDecode"]
    g[dec] = {"class_type": "VAEDecode", "inputs": {"samples": g[dec]["inputs"]["samples"], "vae": ["1", 1]}}
    ok, _, messages = host.run(g)
    assert not ok
    (err,) = [d for e, d in messages if e == "execution_error"]
    assert err["node_type"] == "VAEDecode" and err["exception_message"].startswith("Cosmos3Loader: the vae output")


# -------------------------------------------------------------------------------------------- full-size VAE

@pytest.fixture(scope="module")
def full_checkpoint(host, tmp_path_factory) -> Path:
    source = _full_vae_source(tmp_path_factory)
    _link(host.base_dir / "models" / "diffusers", source)
    return source


def test_core_vae_nodes_match_the_pack_in_process(host, full_checkpoint):
    nodes = host.node_class_mappings
    handle, vae = nodes["Cosmos3Loader"].execute(checkpoint=FULL, dtype="fp32", device="cpu").result
    try:
        raw = _raw_latent(full_checkpoint)
        pack = nodes["Cosmos3VAEDecode"].execute(model=handle, samples={"samples": raw}).result[0]
        assert pack.shape == (FRAMES, H, W, 3) and float(pack.std()) > 0.05
        assert not vae.cosmos3_built  # the pack's own decode never builds it
        core = nodes["VAEDecode"]().decode(vae, {"samples": raw})[0]
        assert vae.cosmos3_built and vae.get_ram_usage() > 0
        assert core.shape == pack.shape
        untiled = (core - pack).abs().max().item()
        assert untiled <= 1e-5, untiled
        tiled = nodes["VAEDecodeTiled"]()
        one_tile = tiled.decode(vae, {"samples": raw}, tile_size=512, overlap=64, temporal_size=64,
                                temporal_overlap=8)[0]  # the node's defaults: one tile holds the frame
        assert one_tile.shape == pack.shape and (one_tile - pack).abs().max().item() <= 1e-5
        seams = tiled.decode(vae, {"samples": raw}, tile_size=64, overlap=32, temporal_size=64,
                             temporal_overlap=8)[0]
        assert seams.shape == pack.shape and torch.isfinite(seams).all()
        d = (seams - pack).abs()
        print(f"tiled (64 px) vs pack: mean {d.mean().item():.3e} max {d.max().item():.3e}; untiled max {untiled:.3e}")
        assert 0 < d.mean().item() <= TILED_MEAN_ABS  # it did tile (seams), and only seams differ
        # encode: the pack's frames back to latents, as the pack encodes them (posterior mode, raw latents)
        enc = nodes["VAEEncode"]().encode(vae, pack)[0]["samples"]
        pipe_vae = handle.pipeline.vae
        ref = pipe_vae.denormalize(pipe_vae.encode(pack.permute(3, 0, 1, 2)[None] * 2 - 1))
        assert enc.shape == ref.shape == (1, 48, 2, H // 16, W // 16)
        rel = float((enc - ref).norm() / ref.norm())
        print(f"encode rel {rel:.3e}")
        assert rel <= 1e-5, rel
    finally:
        del handle, vae
        gc.collect()


def _pngs(base: Path, ui: dict) -> np.ndarray:
    files = [base / "output" / i["subfolder"] / i["filename"] for i in ui["images"]]
    return np.stack([np.asarray(Image.open(f).convert("RGB"), dtype=np.int16) for f in files])


def test_core_vae_nodes_on_a_real_server(host, full_checkpoint, tmp_path_factory):
    """Over HTTP: the sampler's LATENT through Cosmos3 VAE Decode, core VAE Decode and core VAE Decode (Tiled, its
    defaults), each to Save Image; a test image through core VAE Encode to Save Latent, against the pack's encode."""
    from safetensors.torch import load_file

    from cosmos3_core.vae.video import load_vae

    base = comfy_host.comfy_home(tmp_path_factory.mktemp("core_vae_server"))
    _link(base / "models" / "diffusers", full_checkpoint)
    write_test_inputs(base / "input")
    # the pack's own encode of what the graph encodes (5 copies of the 120x80 test image; ComfyUI's VAE Encode crops
    # the width to 112 around the centre), computed before the server holds its two copies of the VAE
    img = np.asarray(Image.open(base / "input" / TEST_IMAGE).convert("RGB"), dtype=np.float32) / 255.0
    pixels = torch.from_numpy(img[:, 4:116])[None].repeat(5, 1, 1, 1)  # [5, 80, 112, 3]
    pack_vae = load_vae(full_checkpoint, dtype=torch.float32)
    expected = pack_vae.denormalize(pack_vae.encode(pixels.permute(3, 0, 1, 2)[None] * 2 - 1))
    del pack_vae
    gc.collect()

    def save(images, prefix):
        return {"class_type": "SaveImage", "inputs": {"images": images, "filename_prefix": f"core_vae/{prefix}"}}

    graph = {
        "1": {"class_type": "Cosmos3Loader", "inputs": {"checkpoint": FULL, "dtype": "fp32", "device": "default"}},
        "2": {"class_type": "Cosmos3TextEncode", "inputs": {
            "model": ["1", 0], "prompt": "a lighthouse at dusk", "negative_prompt": "", "width": W, "height": H,
            "num_frames": FRAMES, "fps": 24.0}},
        "3": {"class_type": "Cosmos3KSamplerUniPCDualTower", "inputs": {
            "model": ["1", 0], "text": ["2", 0], "seed": 5, "steps": 2, "cfg": 6.0, "schedule": "flow_shift",
            "shift": 3.0, "sound": False}},
        "4": {"class_type": "Cosmos3VAEDecode", "inputs": {"model": ["1", 0], "samples": ["3", 0],
                                                           "chunk_latent_frames": 1, "tiled": False}},
        "5": save(["4", 0], "pack"),
        "6": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["1", 1]}},
        "7": save(["6", 0], "core"),
        "8": {"class_type": "VAEDecodeTiled", "inputs": {"samples": ["3", 0], "vae": ["1", 1], "tile_size": 512,
                                                         "overlap": 64, "temporal_size": 64, "temporal_overlap": 8}},
        "9": save(["8", 0], "tiled"),
        "10": {"class_type": "LoadImage", "inputs": {"image": TEST_IMAGE}},
        "11": {"class_type": "RepeatImageBatch", "inputs": {"image": ["10", 0], "amount": 5}},
        "12": {"class_type": "VAEEncode", "inputs": {"pixels": ["11", 0], "vae": ["1", 1]}},
        "13": {"class_type": "SaveLatent", "inputs": {"samples": ["12", 0], "filename_prefix": "core_vae/encode"}},
    }
    with comfy_host.ComfyServer(base, require_pack=True) as srv:
        entry = srv.run(graph, timeout=1200)
    assert entry["status"]["status_str"] == "success", entry["status"]
    out = entry["outputs"]
    pack, core, tiled = (_pngs(base, out[k]) for k in ("5", "7", "9"))
    assert pack.shape == core.shape == tiled.shape == (FRAMES, H, W, 3) and pack.std() > 5
    for name, png in (("core", core), ("tiled", tiled)):  # 8-bit truncations of floats 1e-6 apart
        diff = np.abs(png - pack)
        assert diff.max() <= 1 and (diff > 0).mean() <= 1e-3, (name, diff.max(), (diff > 0).mean())
    item = out["13"]["latents"][0]
    got = load_file(base / "output" / item["subfolder"] / item["filename"])["latent_tensor"]
    assert got.shape == expected.shape == (1, 48, 2, 80 // 16, 112 // 16)
    rel = float((got - expected).norm() / expected.norm())
    assert rel <= 1e-5, rel
