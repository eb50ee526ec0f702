"""Multi-process generation on ``torch.distributed`` (gloo, CPU, spawned ranks) == one process == diffusers.

One spawn of 2 ranks runs CFG-parallel and Ulysses-2; one spawn of 4 ranks runs Ulysses-4 (the tiny checkpoint has
4 query / 2 key-value heads, so U = 4 also exercises the replicated key/value head) and CFG-parallel × Ulysses-2.
Each configuration generates T2V, T2AV and T2V with a guidance interval (its second step runs the cond branch alone,
which CFG-parallel broadcasts) — fp32, 2 steps — through ``cosmos3_core.parallel.run.generate``, and a T2AV batch of
2 (ComfyUI's batch_size) through ``pipeline.plan`` + ``run`` with the ``ParallelDenoiser``; the test
compares every rank's latents with this process's ``api.generate`` (≤ 1e-5 relative) and with diffusers
0.42.1 ``Cosmos3OmniPipeline`` (≤ 1e-4, the parity tolerance of test_generation_parity.py). Both spawns also run
the tile-parallel VAE decode (compared with the one-rank tiled decode, which test_vae.py ties to diffusers'
``tiled_decode``); the 2-rank spawn ends with a rank that exits mid-run, and the other must raise a
``ParallelError`` within seconds instead of hanging. The bad-input rules are pure functions, tested directly.

Ranks and this process all use one CPU thread, so their GEMMs block alike.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from cosmos3_core import api
from support.compare import rel

H, W, F, STEPS, SEED, SHIFT = 64, 96, 9, 2, 11, 3.0
PROMPT = "a red robot walking on the street at night"
NEGATIVE = "blurry low quality video"
MODES = {"t2v": False, "t2av": True}  # name: sound
BATCH = dict(seed=SEED, steps=STEPS, shift=SHIFT, sound=True, batch_size=2)  # "t2av_batch2": plan + run
INTERVAL = (990.0, 1000.0)  # "t2v_interval": step 1 (t = 999) guided, step 2 cond only (CFG-parallel: a broadcast)
CONFIGS = {2: [(True, 1), (False, 2)], 4: [(False, 4), (True, 2)]}  # world: [(cfg_parallel, ulysses)]
TILE = dict(tile_sample_size=48, tile_sample_stride=32)  # 6 tiles of unequal size on a 4 x 6 latent
DEATH_STEP = 2


def _request(pipe, sound: bool, steps: int = STEPS, interval: tuple[float, float] | None = None, **options):
    """The resolved clip request every rank (and the single-device run) generates (``options``: RuntimeOptions)."""
    from cosmos3_core.request import Request
    from cosmos3_core.resolve import resolve
    from cosmos3_core.runtime import RuntimeOptions

    return resolve(Request(prompt=PROMPT, negative_prompt=NEGATIVE, num_frames=F, height=H, width=W, fps=24.0,
                           steps=steps, guidance=6.0, seed=SEED, shift=SHIFT, sound=sound, guidance_interval=interval,
                           options=RuntimeOptions(**options)),
                   pipe.info)


def _vae_latents() -> torch.Tensor:
    return torch.randn(1, 48, 2, 4, 6, generator=torch.Generator().manual_seed(5))


def _name(cfg_parallel: bool, ulysses: int, mode: str, rank: int) -> str:
    return f"{'cfg2' if cfg_parallel else 'cfg1'}_u{ulysses}_{mode}_r{rank}.safetensors"


# ---------------------------------------------------------------------------------------------- spawned ranks
def _rank_main(rank: int, world: int, port: int, checkpoint: str, out: str) -> None:
    try:
        _rank_body(rank, world, port, checkpoint, Path(out))
    except BaseException:
        (Path(out) / f"error_r{rank}.txt").write_text(traceback.format_exc())
        raise


def _rank_body(rank: int, world: int, port: int, checkpoint: str, out: Path) -> None:
    import torch.distributed as dist

    from cosmos3_core.parallel import run
    from cosmos3_core.parallel.denoiser import ParallelDenoiser
    from cosmos3_core.parallel.mesh import ParallelError, init_parallel
    from cosmos3_core.parallel.vae import decode_parallel
    from cosmos3_core.pipeline import Cosmos3Pipeline

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    pipe = Cosmos3Pipeline.load(checkpoint, dtype=torch.float32)
    cfg = pipe.config
    for cfg_parallel, ulysses in CONFIGS[world]:
        mesh = init_parallel(cfg_parallel, ulysses, guidance=6.0, num_heads=cfg.num_attention_heads,
                             num_kv_heads=cfg.num_key_value_heads, device_type="cpu")
        for mode, sound in MODES.items():
            result = run.generate(pipe, _request(pipe, sound), mesh, decode=False)
            tensors = {"latents": result.latents.contiguous()}
            if result.sound_latent is not None:
                tensors["sound"] = result.sound_latent.contiguous()
            save_file(tensors, out / _name(cfg_parallel, ulysses, mode, rank))
        result = run.generate(pipe, _request(pipe, False, interval=INTERVAL), mesh, decode=False)
        save_file({"latents": result.latents.contiguous()}, out / _name(cfg_parallel, ulysses, "t2v_interval", rank))
        denoiser = ParallelDenoiser(pipe.transformer, mesh)  # a batch of 2 (ComfyUI's batch_size) with sound
        text = run.encode_text_local(pipe, denoiser, _request(pipe, True))
        batch = pipe.run(api.plan(pipe, text, **BATCH), denoiser=denoiser)
        save_file({"latents": batch.latents.contiguous(), "sound": batch.sound.contiguous()},
                  out / _name(cfg_parallel, ulysses, "t2av_batch2", rank))
    # the run's attention route reaches every attention call of a parallel run (prefill and Ulysses steps)
    from cosmos3_core.model import transformer

    seen, real = [], transformer.attention
    transformer.attention = lambda q, k, v, **kw: seen.append(kw.get("backend", "auto")) or real(q, k, v, **kw)
    try:
        run.generate(pipe, _request(pipe, True, attention="sdpa"), mesh, decode=False)
    finally:
        transformer.attention = real
    (out / f"attention_r{rank}.txt").write_text(f"{len(seen)} {' '.join(sorted(set(seen)))}")
    frames = decode_parallel(pipe.vae, _vae_latents(), **TILE)
    save_file({"frames": frames}, out / f"vae_r{rank}.safetensors")
    if world != 2:
        return
    # a rank that dies mid-run: rank 1 exits inside step DEATH_STEP, rank 0 must fail fast with a clear message
    mesh = init_parallel(True, 1, guidance=6.0, num_heads=cfg.num_attention_heads,
                         num_kv_heads=cfg.num_key_value_heads, device_type="cpu")

    def die(step, total, preview):
        if rank == 1 and step == DEATH_STEP - 1:
            os._exit(3)

    start = time.perf_counter()
    try:
        run.generate(pipe, _request(pipe, False, steps=4), mesh, decode=False, callback=die)
        message = "no error"
    except ParallelError as exc:
        message = str(exc)
    (out / "death.txt").write_text(f"{time.perf_counter() - start:.3f}\n{message}")


def _spawn(world: int, checkpoint: Path, out: Path) -> list[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, str(checkpoint), str(out))) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 900
    for p in procs:
        p.join(max(1.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    errors = sorted(out.glob("error_r*.txt"))
    assert not errors, "\n".join(e.read_text() for e in errors)
    return [p.exitcode for p in procs]


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("nano", sound=True, seed=7)


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def spawned(request, checkpoint, tmp_path_factory):
    world = request.param
    out = tmp_path_factory.mktemp(f"world{world}")
    exitcodes = _spawn(world, checkpoint, out)
    return world, out, exitcodes


@pytest.fixture(scope="module")
def single(checkpoint):
    """This process's generation and tiled decode, and diffusers' latents, on one CPU thread."""
    from diffusers import Cosmos3OmniPipeline, UniPCMultistepScheduler

    from cosmos3_core.modes.clip import generate_clip
    from cosmos3_core.pipeline import Cosmos3Pipeline

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pipe = Cosmos3Pipeline.load(checkpoint, dtype=torch.float32)
        ours = {mode: generate_clip(pipe, _request(pipe, sound), decode=False) for mode, sound in MODES.items()}
        ours["t2v_interval"] = generate_clip(pipe, _request(pipe, False, interval=INTERVAL), decode=False)
        r = _request(pipe, True)
        text = pipe.encode_text(r.prompt, r.negative_prompt, num_frames=F, height=H, width=W, fps=24.0)
        ours["t2av_batch2"] = pipe.run(api.plan(pipe, text, **BATCH))
        frames = pipe.vae.decode(_vae_latents(), tile=True, **TILE)
        ref = Cosmos3OmniPipeline.from_pretrained(checkpoint, enable_safety_checker=False, torch_dtype=torch.float32)
        ref.scheduler = UniPCMultistepScheduler.from_config(ref.scheduler.config, flow_shift=SHIFT,
                                                            use_karras_sigmas=False)
        diffusers_latents = {
            mode: ref(prompt=PROMPT, negative_prompt=NEGATIVE, num_frames=F, height=H, width=W, fps=24.0,
                      num_inference_steps=STEPS, guidance_scale=6.0, enable_sound=sound, output_type="latent",
                      generator=torch.Generator("cpu").manual_seed(SEED)).video
            for mode, sound in MODES.items()
        }
    finally:
        torch.set_num_threads(threads)
    return ours, frames, diffusers_latents, pipe


# ---------------------------------------------------------------------------------------------- equality
def test_parallel_generation_equals_single_process_and_diffusers(spawned, single):
    world, out, _ = spawned
    ours, _, diffusers_latents, _ = single
    for cfg_parallel, ulysses in CONFIGS[world]:
        for mode, sound in MODES.items():
            want = ours[mode]
            ranks = [load_file(out / _name(cfg_parallel, ulysses, mode, r)) for r in range(world)]
            for r, got in enumerate(ranks):
                where = f"cfg_parallel={cfg_parallel} ulysses={ulysses} {mode} rank {r}"
                assert got["latents"].shape == want.latents.shape, where
                assert torch.equal(got["latents"], ranks[0]["latents"]), where  # the ranks' copies agree exactly
                assert rel(got["latents"], want.latents) <= 1e-5, where
                assert rel(got["latents"], diffusers_latents[mode]) <= 1e-4, where
                if sound:
                    assert torch.equal(got["sound"], ranks[0]["sound"]), where
                    assert rel(got["sound"], want.sound_latent) <= 1e-5, where
                else:
                    assert "sound" not in got, where
        where = f"cfg_parallel={cfg_parallel} ulysses={ulysses} t2v with a guidance interval"
        for r in range(world):
            got = load_file(out / _name(cfg_parallel, ulysses, "t2v_interval", r))["latents"]
            assert rel(got, ours["t2v_interval"].latents) <= 1e-5, where
            assert rel(got, ours["t2v"].latents) > 1e-3, where  # the cond-only step really changed the result
        where = f"cfg_parallel={cfg_parallel} ulysses={ulysses} t2av, a batch of 2"
        want = ours["t2av_batch2"]
        assert want.latents.shape[0] == 2 and want.sound.shape[0] == 2
        for r in range(world):
            got = load_file(out / _name(cfg_parallel, ulysses, "t2av_batch2", r))
            assert rel(got["latents"], want.latents) <= 1e-5, where
            assert rel(got["sound"], want.sound) <= 1e-5, where


def test_the_attention_route_reaches_every_call_of_a_parallel_run(spawned, single):
    """``attention="sdpa"`` in the request: every attention call of the last configuration's run (text prefill, every
    step of every layer, with CFG-parallel and/or Ulysses-2) is made on that route, on every rank."""
    world, out, _ = spawned
    layers = single[3].config.num_hidden_layers
    for r in range(world):
        count, routes = (out / f"attention_r{r}.txt").read_text().split(" ", 1)
        assert int(count) > STEPS * layers and routes == "sdpa", f"rank {r}: {count} calls on {routes!r}"


def test_parallel_vae_decode_equals_single_rank_tiled_decode(spawned, single):
    world, out, _ = spawned
    want = single[1]
    assert want.shape == (5, 64, 96, 3)
    for r in range(world):
        assert torch.equal(load_file(out / f"vae_r{r}.safetensors")["frames"], want), f"rank {r}"


def test_dead_rank_makes_the_other_fail_fast(spawned):
    world, out, exitcodes = spawned
    if world != 2:
        pytest.skip("the failure scenario runs in the 2-rank spawn")
    assert exitcodes == [0, 3]  # rank 0 returned normally after reporting; rank 1 is the one that died
    seconds, message = (out / "death.txt").read_text().split("\n", 1)
    assert float(seconds) < 30  # the process group's timeout is 60 s: a closed connection is noticed at once
    assert message.startswith("rank 0: CFG-parallel all-gather of the branch velocities failed")
    assert "another rank stopped" in message and "start it again" in message


# ---------------------------------------------------------------------------------------------- bad input
def test_world_size_must_equal_the_product_of_the_degrees():
    from cosmos3_core.parallel.mesh import check_layout

    with pytest.raises(ValueError, match=r"world size 3: --cfg-parallel \(2\) × --ulysses 2 needs exactly 4 "
                                         r"processes; launch torchrun --nproc-per-node 4"):
        check_layout(3, True, 2, guidance=6.0, num_heads=32, num_kv_heads=8)
    with pytest.raises(ValueError, match="world size 4: no --cfg-parallel"):
        check_layout(4, False, 2, guidance=6.0, num_heads=32, num_kv_heads=8)
    check_layout(4, True, 2, guidance=6.0, num_heads=32, num_kv_heads=8)  # 2 x 2 on 4 ranks is fine


def test_ulysses_degree_must_split_the_heads():
    from cosmos3_core.parallel.mesh import check_layout

    with pytest.raises(ValueError, match=r"--ulysses 3: .* 4 query heads .* 2 key/value heads; choose one of \[1, 2, 4\]"):
        check_layout(3, False, 3, guidance=6.0, num_heads=4, num_kv_heads=2)  # the tiny checkpoint's heads
    with pytest.raises(ValueError, match=r"--ulysses 6: .*choose one of \[1, 2, 4, 8, 16, 32\]"):
        check_layout(6, False, 6, guidance=6.0, num_heads=32, num_kv_heads=8)  # Nano's heads
    with pytest.raises(ValueError, match="--ulysses 0"):
        check_layout(1, False, 0, guidance=6.0, num_heads=32, num_kv_heads=8)
    for u in (1, 2, 4, 8, 16):  # 16 > 8 KV heads: each rank reads one replicated KV head
        check_layout(u, False, u, guidance=6.0, num_heads=32, num_kv_heads=8)


def test_cfg_parallel_needs_two_branches():
    from cosmos3_core.parallel.mesh import check_layout

    with pytest.raises(ValueError, match="--cfg-parallel: guidance 1 runs one branch"):
        check_layout(2, True, 1, guidance=1.0, num_heads=32, num_kv_heads=8)
    check_layout(2, False, 2, guidance=1.0, num_heads=32, num_kv_heads=8)  # Ulysses alone is fine at guidance 1


def test_unequal_devices_are_refused():
    from cosmos3_core.parallel.mesh import check_same_devices

    check_same_devices(["NVIDIA H200 143771 MiB"] * 4)
    with pytest.raises(ValueError, match=r"unequal devices \(rank 0: NVIDIA H200 143771 MiB, rank 1: NVIDIA A100-SXM4-40GB "
                                         r"40960 MiB\); .*same GPU model and memory.*CUDA_VISIBLE_DEVICES"):
        check_same_devices(["NVIDIA H200 143771 MiB", "NVIDIA A100-SXM4-40GB 40960 MiB"])


def test_launch_without_torchrun_is_refused(monkeypatch):
    import torch.distributed as dist

    from cosmos3_core.parallel.mesh import init_parallel

    if dist.is_initialized():
        pytest.skip("a process group exists in this process")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="launch with torchrun --nproc-per-node N"):
        init_parallel(True, 1, guidance=6.0, num_heads=32, num_kv_heads=8, device_type="cpu")


# ---------------------------------------------------------------------------------------------- two local devices
def test_branches_on_two_local_devices_equal_single_process_and_diffusers(checkpoint, single):
    """The in-process option (ComfyUI's two-GPU guidance): logic and numbers on two CPU "devices"; the concurrency
    of two real GPUs is not exercised here."""
    from cosmos3_core.model.towers import tower_module
    from cosmos3_core.parallel.devices import BranchDevices
    from cosmos3_core.pipeline import Cosmos3Pipeline

    ours, _, diffusers_latents, _ = single
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pipe = Cosmos3Pipeline.load(checkpoint, dtype=torch.float32)
        split = BranchDevices(pipe.transformer, ["cpu", "cpu"])
        replica = split.replicas[1]
        assert all(p.is_meta for p in tower_module(replica, "text").parameters())  # no text tower in the replica
        model_gen = list(tower_module(pipe.transformer, "generation").parameters())
        for p, q in zip(model_gen, tower_module(replica, "generation").parameters()):
            assert torch.equal(p, q) and p.data_ptr() != q.data_ptr()  # a real copy
        calls = []
        hook = replica.proj_in.register_forward_hook(lambda *a: calls.append(1))
        for mode, sound in MODES.items():
            text = pipe.encode_text(PROMPT, NEGATIVE, num_frames=F, height=H, width=W, fps=24.0)
            got = pipe.run(api.plan(pipe, text, seed=SEED, steps=STEPS, shift=SHIFT, sound=sound), denoiser=split)
            assert rel(got.latents, ours[mode].latents) <= 1e-5, mode
            assert rel(got.latents, diffusers_latents[mode]) <= 1e-4, mode
            if sound:
                assert rel(got.sound[0], ours[mode].sound_latent) <= 1e-5
        text = pipe.encode_text(PROMPT, NEGATIVE, num_frames=F, height=H, width=W, fps=24.0)
        got = pipe.run(api.plan(pipe, text, **BATCH), denoiser=split)  # a batch of 2 (ComfyUI's batch_size)
        assert rel(got.latents, ours["t2av_batch2"].latents) <= 1e-5
        assert rel(got.sound, ours["t2av_batch2"].sound) <= 1e-5
        hook.remove()
        assert len(calls) == 3 * STEPS  # the replica ran the uncond branch of every step
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(ValueError, match="the two guidance branches need two devices, got 1"):
        BranchDevices(pipe.transformer, ["cpu"])


# ---------------------------------------------------------------------------------------------- torchrun CLI
def test_torchrun_cli_cfg_parallel_writes_the_single_process_clip(checkpoint, single, tmp_path):
    """The entry point: ``torchrun --nproc-per-node 2 -m cosmos3_core.generate ... --cfg-parallel`` on gloo."""
    ours, _, _, pipe = single
    root = Path(__file__).resolve().parents[1]
    out, latents = tmp_path / "clip.mp4", tmp_path / "latents.safetensors"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port)]
    args = ["-m", "cosmos3_core.generate", "--checkpoint", str(checkpoint), "--prompt", PROMPT, "--negative-prompt",
            NEGATIVE, "--num-frames", str(F), "--height", str(H), "--width", str(W), "--steps", str(STEPS),
            "--seed", str(SEED), "--shift", str(SHIFT), "--device", "cpu", "--dtype", "fp32", "--cfg-parallel",
            "--out", str(out), "--latents-out", str(latents)]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(torchrun + args, capture_output=True, text=True, env=env, timeout=600, cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("wrote ") == 1  # rank 0 alone reports and writes
    assert out.stat().st_size > 0
    got = load_file(latents)["video_latent"]
    assert rel(got, pipe.vae.denormalize(ours["t2v"].latents)) <= 1e-5
