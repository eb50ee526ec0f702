"""Weights moved to the GPU through pinned staging buffers (``cosmos3_core.kernels.host_copy``), and ComfyUI's load of
the pack's towers going through them (``nodes/model_handle.Cosmos3Patcher``).

On the CPU the copier's buffers are ordinary memory and each copy synchronous — the same slicing into ring slots,
so a tensor must come out byte for byte as it went in, whatever its dtype and however many slots it spans. The
ComfyUI test runs the real host's ``load_models_gpu`` on a tiny checkpoint with a LoRA: with staging the loaded
tower equals ComfyUI's own load bit for bit, the patched weights still come from ComfyUI's patching, and the
unload restores the checkpoint's weights. On a CUDA device, the same from a memory-mapped safetensors file through
pinned buffers (the path a restarted server takes)."""

from __future__ import annotations

import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from cosmos3_core.kernels.host_copy import StagedCopier

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.uint8, torch.int64, torch.bool]


def source(dtype: torch.dtype, shape=(37, 29), seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 50).to(dtype)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.cpu().reshape(-1).view(torch.uint8), b.cpu().reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_arrives_byte_for_byte_across_slots(dtype):
    copier = StagedCopier("cpu", slot_bytes=256, slots=3, min_bytes=0)
    tensors = [source(dtype, shape, seed) for seed, shape in enumerate([(37, 29), (5,), (3, 4, 5), (1, 2048), ()])]
    out = [copier.copy(t) for t in tensors]  # more pieces than slots: the ring wraps many times
    copier.finish()
    for t, o in zip(tensors, out):
        assert same_bytes(o, t) and o.data_ptr() != t.data_ptr()
    assert copier.staged_bytes == sum(t.numel() * t.element_size() for t in tensors)


class Tagged(torch.Tensor):
    """A tensor subclass (as ComfyUI's QuantizedTensor is one): its bytes may not be all of it."""


def test_small_strided_and_subclass_tensors_go_by_plain_to():
    copier = StagedCopier("cpu", slot_bytes=256, slots=2, min_bytes=1024)
    small = source(torch.float32, (4, 4))
    strided = source(torch.float32, (64, 64)).t()
    tagged = source(torch.float32, (64, 64)).as_subclass(Tagged)
    for t in (small, strided, tagged):
        assert copier.copy(t) is t  # Tensor.to to its own device
    assert copier.staged_bytes == 0
    big = source(torch.float32, (64, 64))
    assert same_bytes(copier.copy(big), big) and copier.staged_bytes == big.nbytes


def test_other_devices_are_refused():
    with pytest.raises(ValueError, match="CUDA device"):
        StagedCopier("meta")


def test_refused_pinned_memory_moves_the_rest_by_plain_to_with_one_warning(monkeypatch, caplog):
    def refuse(*args, **kwargs):
        raise RuntimeError("CUDA error: out of memory (cudaHostAlloc)")

    copier = StagedCopier("cpu", slot_bytes=256, slots=2, min_bytes=0)
    tensors = [source(torch.float32, (8, 8), seed) for seed in range(3)]
    monkeypatch.setattr(torch, "empty", refuse)
    with caplog.at_level("WARNING"):
        out = [copier.copy(t) for t in tensors]
    assert all(o is t for o, t in zip(out, tensors)) and copier.staged_bytes == 0
    said = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(said) == 1 and "pinned memory" in said[0] and "Tensor.to" in said[0], said


def test_finish_lets_the_buffers_go_and_a_later_copy_works():
    copier = StagedCopier("cpu", slot_bytes=64, slots=2, min_bytes=0)
    first = source(torch.bfloat16, (10, 10))
    with copier:
        assert same_bytes(copier.copy(first), first)
    assert copier._buffers == []
    second = source(torch.bfloat16, (9, 11), seed=3)
    assert same_bytes(copier.copy(second), second)


# -------------------------------------------------------------------------------------------- ComfyUI's load

def test_comfyui_load_through_staging_equals_its_own_load(host, monkeypatch, tmp_path):
    import comfy.model_management as mm
    from test_lora import TARGETS, linear_shapes, write_lora

    pack = host.node_class_mappings["Cosmos3Loader"].__module__.split(".nodes.")[0]
    handle_module = sys.modules[f"{pack}.nodes.model_handle"]
    copier_cls = sys.modules[f"{pack}.cosmos3_core.kernels.host_copy"].StagedCopier
    base = host.node_class_mappings["Cosmos3Loader"].execute(checkpoint="cosmos3-tiny-nano", dtype="fp32",
                                                             device="cpu").result[0]
    loras = host.base_dir / "models" / "loras"
    loras.mkdir(parents=True, exist_ok=True)
    write_lora(loras / "cosmos3_staging_test.safetensors", linear_shapes(base.pipeline.transformer),
               targets=TARGETS[:2], rank=2, alpha=2.0, seed=9)
    patched = host.node_class_mappings["Cosmos3LoraLoader"].execute(
        model=base, lora_name="cosmos3_staging_test.safetensors", strength=0.8).result[0]
    patcher = patched.generation_patcher
    original = {k: v.clone() for k, v in patcher.model.state_dict().items()}

    mm.unload_all_models()
    mm.load_models_gpu([patcher])  # ComfyUI's own load: no staging on a CPU
    comfy_loaded = {k: v.clone() for k, v in patcher.model.state_dict().items()}
    mm.unload_all_models()
    assert any(not torch.equal(comfy_loaded[k], original[k]) for k in original)  # the LoRA is merged at load

    copiers = []

    def staging(device_to):
        copiers.append(copier_cls(device_to, slot_bytes=4096, slots=3, min_bytes=0))
        return copiers[-1]

    monkeypatch.setattr(handle_module, "staging_copier", staging)
    pointers = {k: p.data_ptr() for k, p in patcher.model.named_parameters()}
    mm.load_models_gpu([patcher])
    staged = patcher.model.state_dict()
    assert staged.keys() == comfy_loaded.keys()
    assert all(same_bytes(staged[k], comfy_loaded[k]) for k in staged)
    unpatched = [k for k in pointers if k not in patcher.patches]
    moved = [k for k in unpatched if dict(patcher.model.named_parameters())[k].data_ptr() != pointers[k]]
    assert len(copiers) == 1 and moved == unpatched  # every weight no patch changes came through the buffers
    assert copiers[0].staged_bytes == sum(original[k].nbytes for k in unpatched) and copiers[0]._buffers == []
    assert patcher._copier is None
    mm.unload_all_models()
    assert all(torch.equal(v, original[k]) for k, v in patcher.model.state_dict().items())  # the LoRA undone
    mm.load_models_gpu([patched.text_patcher])  # the other tower stages too
    assert len(copiers) == 2 and copiers[1].staged_bytes > 0
    vae_pointers = [p.data_ptr() for p in patched.vae_patcher.model.parameters()]
    mm.load_models_gpu([patched.vae_patcher])  # the VAE does not: ComfyUI's Module.to
    assert len(copiers) == 2 and [p.data_ptr() for p in patched.vae_patcher.model.parameters()] == vae_pointers
    mm.unload_all_models()


def _staging_into(monkeypatch, host, copiers: list, fail_at: int | None = None):
    """Make the pack's ComfyUI load stage on the CPU (small slots) into ``copiers``; the ``fail_at``-th copy raises."""
    pack = host.node_class_mappings["Cosmos3Loader"].__module__.split(".nodes.")[0]
    copier_cls = sys.modules[f"{pack}.cosmos3_core.kernels.host_copy"].StagedCopier

    class Failing(copier_cls):
        def copy(self, tensor):
            self.calls = getattr(self, "calls", 0) + 1
            if self.calls == fail_at:
                raise RuntimeError("copy failed (test)")
            return super().copy(tensor)

    def staging(device_to):
        copiers.append(Failing(device_to, slot_bytes=4096, slots=3, min_bytes=0))
        return copiers[-1]

    monkeypatch.setattr(sys.modules[f"{pack}.nodes.model_handle"], "staging_copier", staging)


def test_partial_loads_stage_each_weight_once(host, monkeypatch):
    import comfy.model_management as mm

    handle = host.node_class_mappings["Cosmos3Loader"].execute(checkpoint="cosmos3-tiny-nano", dtype="fp32",
                                                               device="cpu").result[0]
    patcher = handle.generation_patcher
    original = {k: v.clone() for k, v in patcher.model.state_dict().items()}
    total = sum(p.nbytes for p in patcher.model.parameters())
    copiers: list = []
    _staging_into(monkeypatch, host, copiers)
    mm.unload_all_models()
    patcher.partially_load(patcher.load_device, total // 3)  # ComfyUI's partial load: some layers stay offloaded
    assert patcher.model.model_lowvram and 0 < copiers[0].staged_bytes < total
    patcher.partially_load(patcher.load_device, total)  # more room: the rest loads; what is loaded is not moved again
    assert sum(c.staged_bytes for c in copiers) == total
    assert all(torch.equal(v, original[k]) for k, v in patcher.model.state_dict().items())
    patcher.detach()


def test_a_failed_staged_load_leaves_the_next_load_working(host, monkeypatch):
    import comfy.model_management as mm

    handle = host.node_class_mappings["Cosmos3Loader"].execute(checkpoint="cosmos3-tiny-nano", dtype="fp32",
                                                               device="cpu").result[0]
    patcher = handle.generation_patcher
    original = {k: v.clone() for k, v in patcher.model.state_dict().items()}
    copiers: list = []
    _staging_into(monkeypatch, host, copiers, fail_at=5)
    mm.unload_all_models()
    with pytest.raises(RuntimeError, match="copy failed"):
        mm.load_models_gpu([patcher])
    assert patcher._copier is None and copiers[0]._buffers == []
    _staging_into(monkeypatch, host, copiers)
    mm.unload_all_models()
    mm.load_models_gpu([patcher])
    assert copiers[-1].staged_bytes > 0
    assert all(torch.equal(v, original[k]) for k, v in patcher.model.state_dict().items())
    mm.unload_all_models()


def test_staging_follows_comfyuis_pinned_memory_switch(host, monkeypatch):
    import comfy.model_management as mm

    pack = host.node_class_mappings["Cosmos3Loader"].__module__.split(".nodes.")[0]
    staging_copier = sys.modules[f"{pack}.nodes.model_handle"].staging_copier
    assert staging_copier(torch.device("cpu")) is None and staging_copier(None) is None
    monkeypatch.setattr(mm, "MAX_PINNED_MEMORY", 1 << 30)
    assert type(staging_copier(torch.device("cuda", 0))).__name__ == "StagedCopier"
    monkeypatch.setattr(mm, "MAX_PINNED_MEMORY", -1)  # --disable-pinned-memory
    assert staging_copier(torch.device("cuda", 0)) is None


# ------------------------------------------------------------------------- the core loader (the CLI's load)

def _nbytes_staged(model, min_bytes: int) -> int:
    return sum(t.nbytes for t in model.state_dict().values() if t.nbytes >= min_bytes)


@pytest.fixture(scope="module")
def loads(tiny_checkpoint, tmp_path_factory):
    """The checkpoints a load reads as stored: fp32 (cast on the host before staging), bf16, NVIDIA's FP8 layout,
    and a Q8_0 GGUF of the generation weights."""
    from cosmos3_core.model.gguf_write import write_gguf
    from cosmos3_core.testing.fp8 import build_fp8_checkpoint
    from cosmos3_core.testing.fullsize import write_random_checkpoint

    nano = tiny_checkpoint("nano", seed=0)
    root = tmp_path_factory.mktemp("staged-loads")
    write_gguf(nano, root / "nano-q8.gguf", "Q8_0")
    return {"fp32": (nano, {}),
            "bf16": (write_random_checkpoint(root / "bf16", "nano", tiny=True, log=lambda _: None), {}),
            "fp8": (build_fp8_checkpoint(nano, root / "fp8"), {}),
            "q8_0": (nano, {"gguf_file": root / "nano-q8.gguf"})}


@pytest.mark.parametrize("stored", ["fp32", "bf16", "fp8", "q8_0"])
def test_core_load_through_staging_equals_its_plain_load(loads, stored, monkeypatch):
    """``load_transformer`` moving every tensor through the ring (CPU buffers here, slots far smaller than the
    tensors) holds the same dtypes, shapes and bits as its load by ``Tensor.to``, and staged what it should."""
    from cosmos3_core.model import loader

    ckpt, kwargs = loads[stored]
    plain = loader.load_transformer(ckpt, dtype=torch.bfloat16, skip_modules=("lm_head",), **kwargs)
    copiers = []

    def copier_to(device, pinned_staging):
        copiers.append(StagedCopier("cpu", slot_bytes=512, slots=3, min_bytes=16))
        return copiers[-1]

    monkeypatch.setattr(loader, "_copier_to", copier_to)
    staged = loader.load_transformer(ckpt, dtype=torch.bfloat16, skip_modules=("lm_head",), **kwargs)
    a, b = staged.state_dict(), plain.state_dict()
    assert set(a) == set(b)
    for k in b:
        assert same_bytes(a[k], b[k]), k
    assert len(copiers) == 1 and copiers[0]._buffers == []  # finished
    assert copiers[0].staged_bytes == _nbytes_staged(staged, 16) > 0
    assert [type(m) for m in staged.modules()] == [type(m) for m in plain.modules()]


def test_a_failed_core_load_ends_its_staging(loads, monkeypatch, tmp_path):
    """A damaged shard fails the load with the loader's own message, the copier is finished, and the next load
    works."""
    import shutil

    from cosmos3_core.config import CheckpointError
    from cosmos3_core.model import loader

    ckpt = shutil.copytree(loads["bf16"][0], tmp_path / "ckpt")
    shard = sorted((ckpt / "transformer").glob("*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    copiers = []
    monkeypatch.setattr(loader, "_copier_to", lambda device, pinned_staging: copiers.append(
        StagedCopier("cpu", slot_bytes=512, slots=2, min_bytes=256)) or copiers[-1])
    with pytest.raises(CheckpointError, match="damaged|truncated|incomplete"):
        loader.load_transformer(ckpt, dtype=torch.bfloat16, skip_modules=("lm_head",))
    assert copiers[0]._buffers == []
    model = loader.load_transformer(loads["bf16"][0], dtype=torch.bfloat16, skip_modules=("lm_head",))
    assert copiers[1].staged_bytes == _nbytes_staged(model, 256) > 0


def test_core_load_passes_its_staging_switch(loads, monkeypatch):
    import contextlib

    from cosmos3_core.model import loader

    asked = []
    monkeypatch.setattr(loader, "_copier_to", lambda device, staging: asked.append((str(device), staging))
                        or contextlib.nullcontext())
    for staging in (True, False):
        loader.load_transformer(loads["bf16"][0], skip_modules=("lm_head",), pinned_staging=staging)
    assert asked == [("cpu", True), ("cpu", False)]


def test_close_after_a_failed_load_logs_instead_of_hiding_its_error(monkeypatch, caplog):
    """A copier left by a failed load whose wait fails too (a GPU in error) raises the load's error, not its own."""
    copier = StagedCopier("cpu", slot_bytes=256, slots=2, min_bytes=0)
    copier.copy(source(torch.float32))

    def broken_finish():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(copier, "finish", broken_finish)
    with caplog.at_level("WARNING"), pytest.raises(KeyError, match="the load's own"):
        with copier:
            raise KeyError("the load's own")
    assert "could not be waited for" in caplog.text and copier._buffers == []
    with pytest.raises(RuntimeError, match="illegal memory access"):
        with copier:  # no load error: the wait's error is the one raised
            pass


def test_core_load_stages_only_to_a_gpu():
    from cosmos3_core.model.loader import _copier_to

    assert isinstance(_copier_to(torch.device("cuda", 0)), StagedCopier)
    assert isinstance(_copier_to("cuda"), StagedCopier)
    for device, staging in (("cpu", True), ("cuda", False)):
        with _copier_to(device, staging) as copier:
            assert copier is None


# -------------------------------------------------------------------------------------------- CUDA

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_memory_mapped_checkpoint_reaches_the_gpu_byte_for_byte(tmp_path):
    tensors = {f"w{i}": source(dtype, (513, 1031), i) for i, dtype in enumerate(DTYPES)}
    tensors["big"] = source(torch.bfloat16, (4096, 4099), 11)  # spans several 1 MiB slots
    save_file(tensors, str(tmp_path / "w.safetensors"))
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt", device="cpu") as f:
        mapped = {k: f.get_tensor(k) for k in f.keys()}
    copier = StagedCopier(torch.device("cuda"), slot_bytes=1 << 20, slots=3, min_bytes=1 << 10)
    torch.cuda._sleep(int(3e8))  # the GPU starts late: a buffer refilled before its read would show in the bytes
    out = {k: copier.copy(t) for k, t in mapped.items()}
    check = {k: o.sum(dtype=torch.float64) if o.is_floating_point() and o.element_size() > 1 else None
             for k, o in out.items()}  # a kernel after the copies on the same stream sees them done
    copier.finish()
    assert copier._buffers == [] and copier.staged_bytes > tensors["big"].nbytes
    for k, t in tensors.items():
        assert out[k].is_cuda and same_bytes(out[k], t), k
        if check[k] is not None:
            assert check[k].item() == t.to(out[k].device).sum(dtype=torch.float64).item()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_core_load_to_the_gpu_stages_and_equals_the_host_load(loads, monkeypatch):
    """The CLI's load straight to the GPU (``load_transformer(device="cuda")``) goes through pinned buffers and
    holds the bits of the host load, for each way a checkpoint is stored."""
    from cosmos3_core.model import loader

    for stored, (ckpt, kwargs) in loads.items():
        on_host = loader.load_transformer(ckpt, dtype=torch.bfloat16, skip_modules=("lm_head",), **kwargs)
        assert isinstance(loader._copier_to("cuda", True), StagedCopier)
        made = []  # every tensor through a ring of 2 small buffers: it wraps many times, the GPU started late
        monkeypatch.setattr(loader, "_copier_to", lambda device, staging: made.append(
            StagedCopier(device, slot_bytes=4096, slots=2, min_bytes=16)) or made[-1])
        torch.cuda._sleep(int(3e8))
        on_gpu = loader.load_transformer(ckpt, dtype=torch.bfloat16, device="cuda", skip_modules=("lm_head",), **kwargs)
        monkeypatch.undo()
        a, b = on_gpu.state_dict(), on_host.state_dict()
        for k in b:
            assert a[k].is_cuda and same_bytes(a[k], b[k]), (stored, k)
        assert len(made) == 1 and made[0].staged_bytes == _nbytes_staged(on_gpu, 16), stored
