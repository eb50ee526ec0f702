"""The compiled VAE decoder stages kept on disk whole (``cosmos3_core.kernels.precompiled``): a restarted process loads them
and traces nothing.

Reference: diffusers 0.42.1 ``AutoencoderKLWan.decode`` of the tiny random Wan2.2 VAE (CPU, fp32); every decode
here, compiled or loaded, must give its frames. Backend ``aot_eager`` (Dynamo's full graph through AOT autograd,
seconds on a CPU); ``tests/test_gpu.py`` runs the same restart with inductor on a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cosmos3_core.kernels import precompiled
from cosmos3_core.testing.tiny import _build_vae
from cosmos3_core.vae.video import Cosmos3VAE

REPO = Path(__file__).resolve().parents[1]
TOL = 1e-5

pytestmark = pytest.mark.skipif(not precompiled.aot_supported(), reason="this torch has no AOT compile")


def _latents(t: int, h: int = 2, w: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randn(1, 48, t, h, w, generator=torch.Generator().manual_seed(seed))


def _diffusers_frames(wan, z: torch.Tensor) -> torch.Tensor:
    """diffusers' decode of raw latents ``z`` as ``Cosmos3VAE.decode`` returns frames: ``[F, H, W, 3]`` in [0, 1]."""
    with torch.no_grad():
        video = wan.decode(z.to(wan.device)).sample.cpu()
    return (video[0].float() * 0.5 + 0.5).clamp(0, 1).permute(1, 2, 3, 0)


def _decode(vae: Cosmos3VAE, z: torch.Tensor, compile: bool = True) -> torch.Tensor:
    """Our decode of raw latents ``z`` (``decode`` takes them normalized), with the test's compile backend."""
    with torch.no_grad():
        return vae.decode(vae.normalize(z), chunk_latent_frames=1, compile=compile, compile_backend=vae.test_backend)


def _counts(vae: Cosmos3VAE) -> dict:
    fns = vae.frame_decoder(compile=True, compile_backend=vae.test_backend).precompiled.values()
    return dict(compiled=sum(f.compiled for f in fns), loaded=sum(f.loaded for f in fns))


def _vae(backend: str = "aot_eager", device: str = "cpu") -> Cosmos3VAE:
    vae = Cosmos3VAE(_build_vae(0, torch.Generator().manual_seed(0)).to(device))
    vae.test_backend = backend  # the torch.compile backend this test decodes with
    return vae


def worker(backend: str, device: str) -> dict:
    """One fresh process: a compiled decode; what Dynamo traced; the error against diffusers."""
    from torch._dynamo.utils import compilation_time_metrics

    torch.backends.cudnn.allow_tf32 = False  # CUDA: fp32 convolutions in fp32 on both sides (cuDNN's default: TF32)
    vae = _vae(backend, device)
    z = _latents(3, seed=5)
    out = _decode(vae, z)
    return dict(**_counts(vae), traced=sorted(k for k in compilation_time_metrics if "tracing" in k or "capture" in k),
                err=float((out - _diffusers_frames(vae.vae, z)).abs().max()),
                files=sorted(p.name for p in (Path(os.environ["COSMOS3_CACHE_DIR"]) / "aot").iterdir()))


def run_worker(cache: Path, backend: str = "aot_eager", device: str = "cpu") -> dict:
    """``worker`` in a fresh process on the cache folder ``cache`` (tests/test_gpu.py runs it with inductor)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_", "TORCH_COMPILE"))}
    env.update(COSMOS3_CACHE_DIR=str(cache), PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                                             os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, __file__, backend, device], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COSMOS3_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_restarted_process_loads_every_stage_and_traces_nothing(tmp_path):
    first = run_worker(tmp_path / "cache")
    assert first["compiled"] >= 3 and first["loaded"] == 0 and "bytecode_tracing" in first["traced"]
    assert len(first["files"]) == first["compiled"]
    second = run_worker(tmp_path / "cache")
    assert second["loaded"] == first["compiled"] and second["compiled"] == 0
    assert second["traced"] == []  # Dynamo never traced: every stage came from disk
    assert second["files"] == first["files"]
    assert first["err"] <= TOL and second["err"] <= TOL


def test_each_size_and_mode_gets_its_own_artifact(cache):
    vae = _vae()
    for i, (h, w) in enumerate(((2, 3), (3, 2))):
        z = _latents(2, h, w, seed=i)
        assert (_decode(vae, z) - _diffusers_frames(vae.vae, z)).abs().max().item() <= TOL
    stages = 2 + len(vae.vae.decoder.up_blocks)  # input + mid block, each up block, head: one graph each
    assert _counts(vae) == dict(compiled=2 * stages, loaded=0)
    files = set((cache / "aot").iterdir())
    assert len(files) == 2 * stages
    z = _latents(2, seed=9)
    with torch.inference_mode():  # ComfyUI decodes under inference mode: other tensors to Dynamo, other graphs
        out = vae.decode(vae.normalize(z), chunk_latent_frames=1, compile=True, compile_backend=vae.test_backend)
    assert (out - _diffusers_frames(vae.vae, z)).abs().max().item() <= TOL
    assert len(set((cache / "aot").iterdir())) > len(files)


def test_dynamic_size_stages_serve_every_size_and_tile_with_one_graph_each(cache):
    """``dynamic_size`` (what a CUDA decode uses): two sizes and a tiled decode whose tiles differ in size run on one
    graph per stage (and sizes of 1), and every frame equals diffusers' decode (its tiled decode for the tiled one)."""
    from cosmos3_core.vae.frame_decoder import WanFrameDecoder

    vae = _vae()
    vae._frame_decoders[(True, "aot_eager", False)] = WanFrameDecoder(vae.vae.decoder, compile=True,
                                                                      compile_backend="aot_eager", dynamic_size=True)
    stages = 2 + len(vae.vae.decoder.up_blocks)
    for i, (h, w) in enumerate(((2, 3), (3, 5))):
        z = _latents(2, h, w, seed=20 + i)
        assert (_decode(vae, z) - _diffusers_frames(vae.vae, z)).abs().max().item() <= TOL
    assert _counts(vae) == dict(compiled=stages, loaded=0)
    z = _latents(2, 5, 7, seed=30)  # 80x112 pixels in 64-pixel tiles every 48: tiles 4, 2 and 1 latents across
    with torch.no_grad():
        tiled = vae.decode(vae.normalize(z), chunk_latent_frames=1, compile=True, compile_backend="aot_eager",
                           tile=True, tile_sample_size=64, tile_sample_stride=48)
        wan = vae.vae
        wan.enable_tiling(tile_sample_min_height=64, tile_sample_min_width=64, tile_sample_stride_height=48,
                          tile_sample_stride_width=48)
        try:
            ref = _diffusers_frames(wan, z)
        finally:
            wan.disable_tiling()
    assert (tiled - ref).abs().max().item() <= TOL
    # one tile is one latent column wide: Dynamo specializes sizes of 1, so the two stages that see a width of 1
    # get one graph more each; every other tile ran on the graphs of the first size
    assert _counts(vae) == dict(compiled=stages + 2, loaded=0)


def test_an_unloadable_artifact_is_rebuilt(cache, caplog):
    z = _latents(2, seed=2)
    vae = _vae()
    _decode(vae, z)
    files = sorted((cache / "aot").iterdir())
    for f in files:  # a file cut short, or written by another torch
        f.write_bytes(f.read_bytes()[:100])
    again = _vae()
    out = _decode(again, z)
    assert (out - _diffusers_frames(again.vae, z)).abs().max().item() <= TOL
    assert _counts(again) == dict(compiled=len(files), loaded=0)
    assert "could not load" in caplog.text
    third = _vae()  # the rebuilt files load
    _decode(third, z)
    assert _counts(third) == dict(compiled=0, loaded=len(files))


def test_a_weight_layout_change_is_a_new_signature(cache):
    """The same module with its conv weights in another memory layout fails the loaded graphs' guards: the call
    compiles the graphs for the new layout instead of running the old ones, and the frames stay right."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

    from cosmos3_core.vae.frame_decoder import WanFrameDecoder, conv_weights_to_layout

    wan = _vae().vae
    z = _latents(2, seed=4)
    with torch.no_grad():
        ref = wan.decode(z).sample
        dec = WanFrameDecoder(wan.decoder, compile=True, compile_backend="aot_eager")
        x = wan.post_quant_conv(z)
        state = []
        dec(x[:, :, :1], state, True)
        dec(x[:, :, 1:2], state, False)
        stages = sum(f.compiled for f in dec.precompiled.values())
        state = []
        first = dec(x[:, :, :1], state, True)  # a new clip puts the weights in the decoder's layout (contiguous)
        assert conv_weights_to_layout(wan.decoder, True) > 0  # a host moves them behind the decoder's back
        second = dec(x[:, :, 1:2], state, False)
    assert sum(f.compiled for f in dec.precompiled.values()) == 2 * stages
    out = unpatchify(torch.cat([first, second], dim=2), patch_size=wan.config.patch_size).clamp(-1, 1)
    assert (out - ref).abs().max().item() <= TOL


def test_without_aot_compile_it_is_plain_torch_compile(cache, monkeypatch, caplog):
    monkeypatch.setattr(precompiled, "aot_supported", lambda: False)
    vae = _vae()
    z = _latents(2, seed=6)
    assert (_decode(vae, z) - _diffusers_frames(vae.vae, z)).abs().max().item() <= TOL
    assert _counts(vae) == dict(compiled=0, loaded=0)
    assert not (cache / "aot").exists()


class _HostFlagged(torch.nn.Linear):
    cast = False  # a host's flag: its class's value until a host writes it onto the layer (as ComfyUI's unpatch does)


def _twice_flagged(m, x):
    return torch.nn.functional.linear(x, m.weight.double().float() if m.cast else m.weight, m.bias) * 2


def test_graphs_whose_guards_differ_are_kept_side_by_side(cache, caplog):
    """Two calls of one signature whose graphs' guards differ on state the signature does not describe (one layer
    holds the host's flag in its ``__dict__``, the other only its class's): each graph gets its own file, and a new
    process loads each of them without compiling. Before, the second graph replaced the first on disk, so a server
    that had met both compiled again at every start (the soak's small-card episode)."""
    plain, written = _HostFlagged(4, 4), _HostFlagged(4, 4)
    written.cast = False
    x = torch.randn(2, 4)
    with torch.no_grad():
        first = precompiled.PrecompiledFunction(_twice_flagged, backend="aot_eager")
        first(plain, x)
        second = precompiled.PrecompiledFunction(_twice_flagged, backend="aot_eager")  # a new process
        second(written, x)
        assert (first.compiled, second.compiled, second.loaded) == (1, 1, 0)
        assert "no graph kept on disk for this call fits its inputs" in caplog.text
        assert len(list((cache / "aot").iterdir())) == 2
        third = precompiled.PrecompiledFunction(_twice_flagged, backend="aot_eager")
        assert torch.equal(third(written, x), written(x) * 2) and torch.equal(third(plain, x), plain(x) * 2)
    assert (third.compiled, third.loaded) == (0, 2)


def test_a_call_with_weight_hooks_goes_through_plain_torch_compile(cache):
    """``aot_allowed`` false (a host's per-call weight hook, which a saved artifact's guards cannot follow): the call
    runs through plain ``torch.compile`` and nothing is saved; the hook's effect is in the result."""
    lin = torch.nn.Linear(4, 4)

    def twice(m, x):
        w = m.weight_function[0](m.weight) if getattr(m, "weight_function", None) else m.weight
        return torch.nn.functional.linear(x, w, m.bias) * 2

    fn = precompiled.PrecompiledFunction(twice, backend="aot_eager",
                                         aot_allowed=lambda args: not getattr(args[0], "weight_function", None))
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert torch.allclose(fn(lin, x), lin(x) * 2)
        assert fn.compiled == 1 and len(list((cache / "aot").iterdir())) == 1
        lin.weight_function = [lambda w: -w]
        assert torch.allclose(fn(lin, x), torch.nn.functional.linear(x, -lin.weight, lin.bias) * 2)
        assert fn.compiled == 1 and fn.loaded == 0 and len(list((cache / "aot").iterdir())) == 1
        lin.weight_function = []  # the hook removed (a host loaded the weights whole): saved graphs again
        y = torch.randn(3, 4)
        assert torch.allclose(fn(lin, y), lin(y) * 2)
    assert fn.compiled == 2 and len(list((cache / "aot").iterdir())) == 2


if __name__ == "__main__":
    print(json.dumps(worker(*sys.argv[1:3])))


def test_cached_only_compiles_nothing_and_uses_what_is_on_disk(cache):
    """``compile="cached"`` (what ``compile="auto"`` gives the VAE decode): with an empty cache every stage runs
    eagerly and nothing is written; once a compiled decode has written the stages, a new process's cached-only
    decode loads every one of them. Frames equal diffusers' decode each time."""
    z = _latents(2, seed=11)
    vae = _vae()
    with torch.no_grad():
        eager = vae.decode(vae.normalize(z), chunk_latent_frames=1, compile="cached", compile_backend="aot_eager")
    assert (eager - _diffusers_frames(vae.vae, z)).abs().max().item() <= TOL
    fns = vae.frame_decoder(compile="cached", compile_backend="aot_eager").precompiled.values()
    stages = 2 + len(vae.vae.decoder.up_blocks)  # one signature per stage
    assert sum(f.eager for f in fns) == stages and sum(f.compiled + f.loaded for f in fns) == 0
    assert not (cache / "aot").exists() or not any((cache / "aot").iterdir())
    _decode(vae, z)  # compile=True: compiles and writes every stage
    written = len(list((cache / "aot").iterdir()))
    assert written == stages
    again = _vae()  # a new VAE object: no graphs in memory, the files on disk
    with torch.no_grad():
        out = again.decode(again.normalize(z), chunk_latent_frames=1, compile="cached", compile_backend="aot_eager")
    assert (out - _diffusers_frames(again.vae, z)).abs().max().item() <= TOL
    fns = again.frame_decoder(compile="cached", compile_backend="aot_eager").precompiled.values()
    assert sum(f.loaded for f in fns) == written and sum(f.compiled + f.eager for f in fns) == 0


def test_an_unwritable_cache_folder_is_a_warning_and_an_uncached_compile(tmp_path, monkeypatch, caplog):
    """``COSMOS3_CACHE_DIR`` that cannot be written (here: under a regular file): one warning naming the folder and
    the fix, the decode compiles into a temporary folder and equals diffusers' frames."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("COSMOS3_CACHE_DIR", str(blocker / "cache"))
    z = _latents(2, seed=12)
    vae = _vae()
    out = _decode(vae, z)
    assert (out - _diffusers_frames(vae.vae, z)).abs().max().item() <= TOL
    assert _counts(vae)["compiled"] > 0
    assert f"compile cache folder {blocker / 'cache'} cannot be written" in caplog.text
    assert "set COSMOS3_CACHE_DIR to a writable folder" in caplog.text
