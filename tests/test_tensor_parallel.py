"""Tensor parallel (``--tp``) on ``torch.distributed`` (gloo, CPU, spawned ranks) == one process.

Two spawns. **2 ranks, TP 2** on the tiny Nano (4/2 heads: one key/value head per rank): T2AV and I2V clips through
``parallel.run.generate``, an action-policy run through ``modes.action.generate_action`` (under ``--tp`` alone every
mode is its own single-process code on a sharded model), the tiny distilled
Super-shaped checkpoint (8/1 heads: its one key/value head repeated on both ranks) image-to-video, and a ModelOpt
FP8 export of the Nano (its W8A16 steps; the per-tensor scales replicated); each rank's parameter bytes and which
tensors it read whole; and last a rank that exits mid-run, whose peer must fail within seconds with one
``ParallelError``. **4 ranks**: TP 4 (then a LoRA merged into its shards), CFG-parallel × TP 2 and Ulysses 2 × TP 2
on the Nano (TP 4 repeats its key/value heads), TP 4 and CFG-parallel × TP 2 on a Super-shaped checkpoint with
sound.

Every rank's latents (and sound / action latents) are compared with this process's single-process run of the same
request on the unsharded checkpoint: fp32, ≤ 1e-5 relative (the row-parallel layers add their partial sums in
another order: the difference measured here is 2–3e-6), and the ranks' copies are bitwise equal. The single-process
runs themselves are tied to diffusers by test_generation_parity.py, test_action.py, test_distilled.py and
test_fp8_parity.py. Per-rank parameter bytes equal ``tensor.per_rank_parameters`` (the rule that sizes the docs'
table), which for the full-size Nano and Super is 1/T plus the same small replicated part at every T. Ranks and
this process use one CPU thread; the ranks are forks of a ``forkserver`` that imported torch, diffusers and the core
once (spawned ranks would each spend ~10 s importing them on a 2-core CI machine).
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from PIL import Image
from safetensors.torch import load_file, save_file

from support.compare import rel

H, W, F, STEPS, SEED, SHIFT = 64, 96, 9, 2, 11, 3.0
PROMPT = "a red robot walking on the street at night"
NEGATIVE = "blurry low quality video"
# column- and row-parallel layers of both towers, key/value projections (repeated heads at TP 4), a replicated one
LORA_TARGETS = ("layers.0.self_attn.add_q_proj", "layers.1.self_attn.add_v_proj", "layers.0.self_attn.to_add_out",
                "layers.1.mlp_moe_gen.down_proj", "layers.0.self_attn.to_k", "layers.1.mlp.up_proj", "proj_in")
FOUR = {"nano": [(False, 1, 4), (True, 1, 2), (False, 2, 2)], "super": [(False, 1, 4), (True, 1, 2)]}
DEATH_STEP = 2
# imported once by the fork server (no threads, no process group), not by every rank: a rank starts in a second
PRELOAD = ["torch", "torch.distributed.tensor.parallel", "diffusers",
           "diffusers.models.autoencoders.autoencoder_kl_wan",
           "diffusers.models.autoencoders.autoencoder_cosmos3_audio",
           "cosmos3_core.pipeline",
           "cosmos3_core.api", "cosmos3_core.parallel.run", "cosmos3_core.parallel.tensor",
           "test_tensor_parallel"]


# ---------------------------------------------------------------------------------------------- the requests
def _image() -> Image.Image:
    return Image.fromarray(np.random.default_rng(4).integers(0, 256, (80, 100, 3), dtype=np.uint8))


def _requests(kind: str):
    """The ``Request`` of each named run (the same in every rank and in this process)."""
    from cosmos3_core.request import ActionRequest, Request

    clip = dict(prompt=PROMPT, num_frames=F, height=H, width=W, seed=SEED)
    guided = dict(clip, negative_prompt=NEGATIVE, steps=STEPS, guidance=6.0, shift=SHIFT)
    frame = np.random.default_rng(1).random((72, 100, 3)).astype(np.float32)
    return {
        "nano": {"t2av": Request(**guided, sound=True), "i2v": Request(**guided, image=_image()),
                 "t2v": Request(**guided),
                 "policy": Request(prompt=PROMPT, negative_prompt=NEGATIVE, steps=STEPS, guidance=3.0, seed=SEED,
                                   action=ActionRequest(mode="policy", chunk_size=4, domain_name="bridge_orig_lerobot",
                                                        resolution_tier=256, image=frame))},
        "super": {"t2av": Request(**guided, sound=True)},
        "distilled": {"i2v": Request(**clip, image=_image())},
        "fp8": {"t2v": Request(**guided, mixed_precision_first_steps=STEPS)},  # W8A16 at every step
    }[kind]


def _generate(pipe, request, mesh=None):
    """A clip through ``parallel.run.generate`` on ``mesh``, or any mode's own ``generate`` (one process, or a
    model sharded by ``--tp`` alone)."""
    from cosmos3_core.api import generate
    from cosmos3_core.parallel import run
    from cosmos3_core.resolve import resolve

    if mesh is not None and request.action is None:
        return run.generate(pipe, resolve(request, pipe.info), mesh, decode=False)
    return generate(pipe, request, decode=False)


def _tensors(out) -> dict[str, torch.Tensor]:
    fields = {"latents": out.latents, "sound": out.sound_latent, "action": out.action}
    return {k: v.contiguous() for k, v in fields.items() if v is not None}


def _lora(checkpoint: Path, path: Path) -> Path:
    from test_lora import linear_shapes, write_lora

    from cosmos3_core.model.loader import load_transformer

    shapes = linear_shapes(load_transformer(checkpoint, dtype=torch.float32, skip_modules=("lm_head",)))
    return write_lora(path, shapes, targets=LORA_TARGETS, rank=4, alpha=8.0, seed=2)


# ---------------------------------------------------------------------------------------------- spawned ranks
def _rank_main(rank: int, world: int, port: int, ckpts: dict, out: str) -> None:
    try:
        torch.set_num_threads(1)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
        import torch.distributed as dist

        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
        (_two_ranks if world == 2 else _four_ranks)(rank, {k: Path(v) for k, v in ckpts.items()}, Path(out))
    except BaseException:
        (Path(out) / f"error_r{rank}.txt").write_text(traceback.format_exc())
        raise


def _load(checkpoint: Path, cfg_parallel=False, ulysses=1, tp=2):
    from cosmos3_core.config import Cosmos3Config
    from cosmos3_core.parallel.mesh import init_parallel
    from cosmos3_core.parallel.tensor import TensorParallel
    from cosmos3_core.pipeline import Cosmos3Pipeline

    cfg = Cosmos3Config.from_checkpoint(checkpoint)
    mesh = init_parallel(cfg_parallel, ulysses, tp=tp, guidance=6.0, num_heads=cfg.num_attention_heads,
                         num_kv_heads=cfg.num_key_value_heads, device_type="cpu")
    pipe = Cosmos3Pipeline.load(checkpoint, dtype=torch.float32, sharding=TensorParallel(mesh.tp_mesh, cfg))
    return pipe, mesh


def _two_ranks(rank: int, ckpts: dict[str, Path], out: Path) -> None:
    from cosmos3_core.model import loader
    from cosmos3_core.parallel.tensor import local_parameter_bytes

    reads, real_read = [], loader._read
    loader._read = lambda f, path, name, shape=None, index=None: reads.append((name, index is None)) or real_read(
        f, path, name, shape, index)
    try:
        pipe, mesh = _load(ckpts["nano"])
    finally:
        loader._read = real_read
    whole = sorted(name for name, is_whole in reads if is_whole)
    (out / f"reads_r{rank}.txt").write_text("\n".join([str(local_parameter_bytes(pipe.transformer)), *whole]))
    for name, request in _requests("nano").items():
        if name != "t2v":
            save_file(_tensors(_generate(pipe, request, mesh)), out / f"nano_{name}_r{rank}.safetensors")
    for kind in ("distilled", "fp8"):
        other, other_mesh = _load(ckpts[kind])
        for name, request in _requests(kind).items():
            save_file(_tensors(_generate(other, request, other_mesh)), out / f"{kind}_{name}_r{rank}.safetensors")
        if kind == "fp8":
            q = other.transformer.layers[0].self_attn.add_q_proj
            (out / f"fp8_r{rank}.txt").write_text(f"{q.weight.to_local().dtype} {q.weight.to_local().shape[0]} "
                                                  f"{q.scale_weight.placements} {float(q.scale_weight.full_tensor())}")
    _die(rank, pipe, mesh, out)


def _die(rank: int, pipe, mesh, out: Path) -> None:
    """Rank 1 exits inside step ``DEATH_STEP``; rank 0 must fail fast with one clear message."""
    from dataclasses import replace

    from cosmos3_core.parallel import run
    from cosmos3_core.parallel.mesh import ParallelError
    from cosmos3_core.resolve import resolve

    def die(step, total, preview):
        if rank == 1 and step == DEATH_STEP - 1:
            os._exit(3)

    start = time.perf_counter()
    try:
        request = replace(_requests("nano")["t2av"], steps=4, sound=False)
        run.generate(pipe, resolve(request, pipe.info), mesh, decode=False, callback=die)
        message = "no error"
    except ParallelError as exc:
        message = str(exc)
    (out / "death.txt").write_text(f"{time.perf_counter() - start:.3f}\n{message}")


def _four_ranks(rank: int, ckpts: dict[str, Path], out: Path) -> None:
    from cosmos3_core.model.lora import linear_shapes, merge_lora, read_lora
    from cosmos3_core.parallel.tensor import local_parameter_bytes

    for kind, layouts in FOUR.items():
        for cfg_parallel, ulysses, tp in layouts:
            pipe, mesh = _load(ckpts[kind], cfg_parallel, ulysses, tp)
            name = _layout(cfg_parallel, ulysses, tp)
            (out / f"{kind}_{name}_bytes_r{rank}.txt").write_text(str(local_parameter_bytes(pipe.transformer)))
            result = _generate(pipe, _requests(kind)["t2av"], mesh)
            save_file(_tensors(result), out / f"{kind}_{name}_r{rank}.safetensors")
            if kind == "nano" and tp == 4:  # a LoRA merged into the shards (key/value heads repeated here)
                model = pipe.transformer
                merge_lora(model, read_lora(ckpts["lora"], linear_shapes(model)), strength=0.8)
                result = _generate(pipe, _requests("nano")["t2v"], mesh)
                save_file(_tensors(result), out / f"nano_lora_r{rank}.safetensors")


def _layout(cfg_parallel: bool, ulysses: int, tp: int) -> str:
    return f"cfg{2 if cfg_parallel else 1}_u{ulysses}_tp{tp}"


def _cli_rank(rank: int, world: int, port: int, argv: list[str], out: str) -> None:
    """What ``torchrun --nproc-per-node {world} -m cosmos3_core.generate {argv}`` runs as rank ``rank``: torchrun's
    environment, then the CLI's ``main``; its output and exit status go to files."""
    from contextlib import redirect_stderr, redirect_stdout

    from cosmos3_core.cli import main as cli

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    with open(Path(out) / f"cli_r{rank}.txt", "w") as f, redirect_stdout(f), redirect_stderr(f):
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code
    (Path(out) / f"cli_code_r{rank}.txt").write_text(str(code))


def _spawn(world: int, ckpts, out: Path, target=_rank_main) -> list[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("forkserver")  # the server imports the heavy modules once; each rank is a fork of it
    ctx.set_forkserver_preload(PRELOAD)
    args = {k: str(v) for k, v in ckpts.items()} if isinstance(ckpts, dict) else ckpts
    procs = [ctx.Process(target=target, args=(r, world, port, args, str(out))) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 600
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
def ckpts(tiny_checkpoint, tmp_path_factory):
    from cosmos3_core.testing.fp8 import build_fp8_checkpoint

    root = tmp_path_factory.mktemp("tp")
    nano = tiny_checkpoint("nano", sound=True, seed=7)
    return {"nano": nano, "super": tiny_checkpoint("super", sound=True, seed=3),
            "distilled": tiny_checkpoint("super", sound=False, seed=3, distilled=True),
            "fp8": build_fp8_checkpoint(nano, root / "fp8"), "lora": _lora(nano, root / "lora.safetensors")}


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def spawned(request, ckpts, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"tp_world{request.param}")
    return request.param, out, _spawn(request.param, ckpts, out)


@pytest.fixture(scope="module")
def single(ckpts):
    """This process's runs of every request on the unsharded checkpoints (one CPU thread)."""
    from cosmos3_core.model.lora import linear_shapes, merge_lora, read_lora
    from cosmos3_core.pipeline import Cosmos3Pipeline

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        want, pipes = {}, {}
        for kind in ("nano", "super", "distilled", "fp8"):
            pipes[kind] = pipe = Cosmos3Pipeline.load(ckpts[kind], dtype=torch.float32)
            want.update({f"{kind}_{name}": _tensors(_generate(pipe, r)) for name, r in _requests(kind).items()})
        model = pipes["nano"].transformer
        merge_lora(model, read_lora(ckpts["lora"], linear_shapes(model)), strength=0.8)
        want["nano_lora"] = _tensors(_generate(pipes["nano"], _requests("nano")["t2v"]))
    finally:
        torch.set_num_threads(threads)
    return want, pipes


def _check_ranks(out: Path, stem: str, want: dict[str, torch.Tensor], world: int) -> None:
    ranks = [load_file(out / f"{stem}_r{r}.safetensors") for r in range(world)]
    for r, got in enumerate(ranks):
        assert sorted(got) == sorted(want), f"{stem} rank {r}"
        for field, value in want.items():
            assert torch.equal(got[field], ranks[0][field]), f"{stem} {field} rank {r}"  # the copies agree exactly
            assert rel(got[field], value) <= 1e-5, f"{stem} {field} rank {r}: {rel(got[field], value):.2e}"


# ---------------------------------------------------------------------------------------------- equality
def test_tensor_parallel_equals_single_process(spawned, single):
    """T2AV, I2V, action policy, distilled, FP8 (TP 2); TP 4 (+ a LoRA), CFG × TP 2, Ulysses × TP 2 (4 ranks)."""
    world, out, _ = spawned
    want = single[0]
    if world == 2:
        for stem in ("nano_t2av", "nano_i2v", "nano_policy", "distilled_i2v", "fp8_t2v"):
            _check_ranks(out, stem, want[stem], world)
        assert set(want["nano_t2av"]) == {"latents", "sound"} and "action" in want["nano_policy"]
        return
    for kind, layouts in FOUR.items():
        for layout in layouts:
            _check_ranks(out, f"{kind}_{_layout(*layout)}", want[f"{kind}_t2av"], world)
    _check_ranks(out, "nano_lora", want["nano_lora"], world)
    assert rel(want["nano_lora"]["latents"], want["nano_t2v"]["latents"]) > 1e-3  # the LoRA changed the model


def test_fp8_checkpoint_loads_sharded_with_replicated_scales(spawned):
    world, out, _ = spawned
    if world != 2:
        pytest.skip("the FP8 checkpoint runs in the 2-rank spawn")
    for r in range(2):
        dtype, rows, placements, scale = (out / f"fp8_r{r}.txt").read_text().split(" ", 3)
        assert dtype == "torch.float8_e4m3fn" and int(rows) == 256  # 2 of the 4 query heads × 128
        assert placements.startswith("(Replicate()") and float(scale) > 0


def test_each_rank_reads_and_holds_its_share(spawned, single):
    """No rank reads a sharded tensor whole; its parameter bytes are the ones ``per_rank_parameters`` computes."""
    from cosmos3_core.parallel.sizing import per_rank_parameters
    from cosmos3_core.parallel.tensor import style_of

    world, out, _ = spawned
    pipes = single[1]
    if world == 2:
        for r in range(2):
            held, *whole = (out / f"reads_r{r}.txt").read_text().splitlines()
            assert whole and not [n for n in whole if style_of(n.rpartition(".")[0]) is not None], f"rank {r}"
            assert int(held) == 4 * per_rank_parameters(pipes["nano"].config, 2).mine  # fp32
        return
    for kind, layouts in FOUR.items():
        for layout in layouts:
            counts = per_rank_parameters(pipes[kind].config, layout[2])
            mine, total = counts.mine, counts.total
            for r in range(world):
                held = int((out / f"{kind}_{_layout(*layout)}_bytes_r{r}.txt").read_text())
                assert held == 4 * mine < 4 * total, (kind, layout, r)


def test_dead_rank_makes_the_other_fail_fast(spawned):
    world, out, exitcodes = spawned
    if world != 2:
        pytest.skip("the failure scenario runs in the 2-rank spawn")
    assert exitcodes == [0, 3]
    seconds, message = (out / "death.txt").read_text().split("\n", 1)
    assert float(seconds) < 30
    assert message.startswith("rank 0: tensor-parallel all-reduce failed — another rank stopped"), message
    assert "start it again" in message and "\n" not in message


# ---------------------------------------------------------------------------------------------- sizes
@pytest.mark.parametrize("variant", ["nano", "super"])
def test_full_size_models_hold_one_tp_th_per_rank(variant):
    """Nano 14.55 B and Super 63.24 B parameters in a generation load (no ``lm_head``): a rank holds 1/T of them
    plus the same replicated modules at every T (norms, the modality heads, the time embedder: Nano 37.5 M, Super
    52.7 M parameters, under 0.3 % of the model)."""
    from cosmos3_core.config import Cosmos3Config
    from cosmos3_core.parallel.sizing import per_rank_parameters
    from cosmos3_core.testing.fullsize import NANO, SUPER

    config = Cosmos3Config.from_dict(NANO if variant == "nano" else SUPER)
    total = per_rank_parameters(config, 1).total
    assert abs(total / 1e9 - {"nano": 14.55, "super": 63.24}[variant]) < 0.01  # without lm_head (0.62 / 0.78 B)
    replicated = set()
    for tp in (2, 4, 8):
        mine = per_rank_parameters(config, tp).mine
        replicated.add(round((mine * tp - total) / (tp - 1)))  # mine = (total - R) / T + R
    assert len(replicated) == 1 and 0 < replicated.pop() < 0.003 * total


def test_step_memory_per_rank():
    """One process: the single-GPU model of one step (``step_memory_required``, checked on an H200). CFG-parallel
    halves the branches, TP divides the head- and MLP-wide tensors, Ulysses the tokens."""
    from cosmos3_core.config import Cosmos3Config
    from cosmos3_core.model.towers import step_memory_required
    from cosmos3_core.parallel.sizing import per_rank_step_bytes
    from cosmos3_core.testing.fullsize import NANO

    config, tokens, texts = Cosmos3Config.from_dict(NANO), 44160, [300, 120]  # 720p/189f, both branches
    one = per_rank_step_bytes(config, tokens, texts)
    assert one == step_memory_required(config, tokens, texts, torch.bfloat16)
    cfg2 = per_rank_step_bytes(config, tokens, texts, cfg_parallel=True)
    tp2, u2 = (per_rank_step_bytes(config, tokens, texts, **kw) for kw in (dict(tp=2), dict(ulysses=2)))
    assert 0.45 * one < cfg2 < 0.55 * one
    assert 0.55 * one < tp2 < 0.7 * one  # the residual stream (3·D per token) is not split
    assert 0.45 * one < u2 < 0.55 * one


# ---------------------------------------------------------------------------------------------- torchrun CLI
ACTION_ARGS = ["--prompt", "robot arm picks up the cup", "--steps", "2", "--device", "cpu", "--dtype", "fp32",
               "--chunk-size", "4", "--resolution-tier", "256", "--domain-name", "bridge_orig_lerobot",
               "--action-mode", "policy"]


def test_torchrun_cli_runs_an_action_mode_under_tp(ckpts, tmp_path):
    """``--tp 2`` alone runs a non-clip mode: rank 0 writes the clip, the actions and the latents (equal to the
    one-process CLI's), rank 1 takes part in every exchange and writes nothing."""
    from cosmos3_core.cli import main as cli

    Image.fromarray(np.random.default_rng(0).integers(0, 256, (72, 100, 3), dtype=np.uint8)).save(tmp_path / "in.png")
    base = ["--checkpoint", str(ckpts["nano"]), *ACTION_ARGS, "--image", str(tmp_path / "in.png")]
    files = lambda tag: ["--out", str(tmp_path / f"{tag}.mp4"), "--latents-out",  # noqa: E731
                         str(tmp_path / f"{tag}.safetensors"), "--actions-out", str(tmp_path / f"{tag}.npy")]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert cli.main(base + files("one")) == 0
    finally:
        torch.set_num_threads(threads)
    assert _spawn(2, base + files("tp") + ["--tp", "2"], tmp_path, target=_cli_rank) == [0, 0]
    logs = [(tmp_path / f"cli_r{r}.txt").read_text() for r in range(2)]
    assert [(tmp_path / f"cli_code_r{r}.txt").read_text() for r in range(2)] == ["0", "0"], logs
    assert logs[0].count("wrote ") == 1 and "wrote" not in logs[1] and "step 2/2" not in logs[1]
    for tag in ("one", "tp"):
        assert (tmp_path / f"{tag}.mp4").stat().st_size > 0
    one, tp = (load_file(tmp_path / f"{tag}.safetensors")["video_latent"] for tag in ("one", "tp"))
    assert rel(tp, one) <= 1e-5
    actions = [torch.from_numpy(np.load(tmp_path / f"{tag}.npy")) for tag in ("one", "tp")]
    assert actions[0].shape == (4, 10) and rel(actions[1], actions[0]) <= 1e-5


def test_torchrun_cli_bad_layout_is_one_error_line_from_rank_0(ckpts, tmp_path):
    argv = ["--checkpoint", str(ckpts["super"]), "--prompt", PROMPT, "--device", "cpu", "--num-frames", "9",
            "--height", "64", "--width", "96", "--out", str(tmp_path / "x.mp4"), "--tp", "2", "--ulysses", "2"]
    _spawn(2, argv, tmp_path, target=_cli_rank)
    logs = [(tmp_path / f"cli_r{r}.txt").read_text() for r in range(2)]
    assert [(tmp_path / f"cli_code_r{r}.txt").read_text() for r in range(2)] == ["2", "2"], logs
    errors = [line for line in logs[0].splitlines() if line.startswith("error:")]
    assert errors == ["error: world size 2: no --cfg-parallel (1) × --ulysses 2 × --tp 2 needs exactly 4 processes; "
                      "launch torchrun --nproc-per-node 4 or change the degrees."], logs[0]
    assert "error" not in logs[1] and "Traceback" not in logs[0] + logs[1]
    assert not (tmp_path / "x.mp4").exists()


# ---------------------------------------------------------------------------------------------- bad input
def test_tp_degree_must_split_the_heads():
    from cosmos3_core.parallel.mesh import check_layout

    nano, super_ = dict(num_heads=32, num_kv_heads=8), dict(num_heads=64, num_kv_heads=8)
    with pytest.raises(ValueError, match=r"^--tp 3: the tensor-parallel degree must divide the model's 32 query "
                                         r"heads and divide or be a multiple of its 8 key/value heads; choose one of "
                                         r"\[1, 2, 4, 8, 16, 32\]\.$"):
        check_layout(3, False, 1, tp=3, guidance=6.0, **nano)
    with pytest.raises(ValueError, match=r"--tp 6: .*choose one of \[1, 2, 4, 8, 16, 32, 64\]"):
        check_layout(6, False, 1, tp=6, guidance=6.0, **super_)
    with pytest.raises(ValueError, match="--tp 0: the tensor-parallel degree must be at least 1"):
        check_layout(1, False, 1, tp=0, guidance=6.0, **nano)
    for tp in (1, 2, 4, 8, 16):  # 16 > 8 KV heads: each key/value head on two ranks
        check_layout(tp, False, 1, tp=tp, guidance=6.0, **nano)
    check_layout(16, True, 1, tp=8, guidance=6.0, **nano)  # CFG 2 × TP 8 on 16 GPUs


def test_world_size_must_equal_cfg_times_ulysses_times_tp():
    from cosmos3_core.parallel.mesh import check_layout

    with pytest.raises(ValueError, match=r"^world size 4: --cfg-parallel \(2\) × --ulysses 1 × --tp 4 needs exactly 8 "
                                         r"processes; launch torchrun --nproc-per-node 8 or change the degrees\.$"):
        check_layout(4, True, 1, tp=4, guidance=6.0, num_heads=32, num_kv_heads=8)
    check_layout(8, True, 1, tp=4, guidance=6.0, num_heads=32, num_kv_heads=8)
    check_layout(8, True, 2, tp=2, guidance=6.0, num_heads=32, num_kv_heads=8)


def test_ulysses_under_tp_splits_each_ranks_heads():
    """With --tp T a rank holds H/T query heads; Ulysses must split those (the tiny Nano's 4/2 heads at TP 2: 2/1)."""
    from cosmos3_core.parallel.mesh import check_layout

    with pytest.raises(ValueError, match=r"^--ulysses 4: the Ulysses degree must divide each --tp 2 rank's 2 query "
                                         r"heads and divide or be a multiple of its 1 key/value heads; choose one of "
                                         r"\[1, 2\]\.$"):
        check_layout(8, False, 4, tp=2, guidance=6.0, num_heads=4, num_kv_heads=2)
    check_layout(4, False, 2, tp=2, guidance=6.0, num_heads=4, num_kv_heads=2)
