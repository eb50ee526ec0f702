"""Tests for cosmos3_core.vae.frame_decoder against diffusers 0.42.1 ``AutoencoderKLWan.decode`` (tiny random Wan2.2 VAE,
CPU, fp32): the whole-clip decode, frame by frame through our forward, eager, channels-last and compiled.

The compiled check uses the ``aot_eager`` backend (dynamo tracing with fullgraph + functionalization, seconds);
inductor itself works on CPU here too but takes ~45 s to build the tiny graph, so bench/bench_vae.py --tiny runs it.
"""

import pytest
import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

from cosmos3_core.testing.tiny import _build_vae
from cosmos3_core.vae.frame_decoder import WanFrameDecoder
from cosmos3_core.vae.video import Cosmos3VAE

TOL = 1e-5


@pytest.fixture(scope="module")
def wan():
    return _build_vae(0, torch.Generator().manual_seed(0))


def _z(t, h=2, w=3, seed=0):
    return torch.randn(1, 48, t, h, w, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def _ours(wan, dec: WanFrameDecoder, z: torch.Tensor, after_frame=None) -> torch.Tensor:
    """Our decode of ``z``, frame by frame; ``after_frame(state)`` sees the decoder state after each frame."""
    x, state, frames = wan.post_quant_conv(z), [], []
    for i in range(z.shape[2]):
        frames.append(dec(x[:, :, i:i + 1], state, i == 0))
        if after_frame is not None:
            after_frame(state)
    return unpatchify(torch.cat(frames, dim=2), patch_size=wan.config.patch_size).clamp(-1, 1)


@pytest.mark.parametrize("t", [1, 2, 5])
def test_frame_decoder_matches_diffusers_decode(wan, t):
    z = _z(t, seed=t)
    with torch.no_grad():
        ref = wan.decode(z).sample
    out = _ours(wan, WanFrameDecoder(wan.decoder), z)
    assert out.shape == ref.shape == (1, 3, 1 + 4 * (t - 1), 32, 48)
    assert float(ref.std()) > 1e-2
    assert (out - ref).abs().max().item() <= TOL
    if t == 2:  # channels-last activations and weights: same math, other layout (slow conv3d path on CPU)
        cl = _ours(wan, WanFrameDecoder(wan.decoder, channels_last=True), z)
        assert (cl - ref).abs().max().item() <= TOL
        assert _layouts(wan) == {"channels_last"}
        again = _ours(wan, WanFrameDecoder(wan.decoder), z)  # the default-layout decoder moves them back
        assert _layouts(wan) == {"contiguous"}
        assert (again - ref).abs().max().item() <= TOL


def _layouts(wan) -> set[str]:
    out = set()
    for m in wan.decoder.modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d)):
            fmt = torch.channels_last_3d if m.weight.ndim == 5 else torch.channels_last
            cl, plain = m.weight.is_contiguous(memory_format=fmt), m.weight.is_contiguous()
            if cl != plain:  # both for 1x1 kernels: such a weight has one layout
                out.add("channels_last" if cl else "contiguous" if plain else "other")
    return out


def test_compiled_channels_last_survives_a_host_resetting_the_weights(wan):
    """A compiled channels-last decoder traced over channels-last weights; a host then reloads the weights in the
    default layout (as a state-dict load would): the next clip puts them back first and still decodes correctly."""
    z = _z(3, h=2, w=2, seed=11)
    with torch.no_grad():
        ref = wan.decode(z).sample
    dec = WanFrameDecoder(wan.decoder, compile=True, channels_last=True, compile_backend="aot_eager")
    assert (_ours(wan, dec, z) - ref).abs().max().item() <= TOL
    for m in wan.decoder.modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d)):
            m.weight.data = m.weight.data.contiguous()
    assert _layouts(wan) == {"contiguous"}
    assert (_ours(wan, dec, z) - ref).abs().max().item() <= TOL
    assert _layouts(wan) == {"channels_last"}


@pytest.mark.parametrize("call_mode", [False, True], ids=["called_outside", "called_inside"])
def test_weights_loaded_under_inference_mode_change_layout_and_stay_inference_tensors(call_mode):
    """ComfyUI loads models under inference mode: moving such weights channels-last (and back) keeps them inference
    tensors that decode in either mode and that the host can still patch in place under inference mode."""
    with torch.inference_mode():
        wan = _build_vae(0, torch.Generator().manual_seed(0))
    z = _z(2, seed=5)
    with torch.inference_mode():
        ref = wan.decode(z).sample
    convs = [m for m in wan.decoder.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d))]
    for channels_last in (True, False):
        with torch.inference_mode(call_mode):
            out = _ours(wan, WanFrameDecoder(wan.decoder, channels_last=channels_last), z)
        assert (out - ref).abs().max().item() <= TOL
        assert _layouts(wan) == {"channels_last" if channels_last else "contiguous"}
        assert all(m.weight.is_inference() for m in convs)
    with torch.inference_mode(), torch.no_grad():
        convs[0].weight.mul_(1.0)


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_histories_are_made_once_and_overwritten_in_place(wan, compile):
    """Frame 0 makes one two-frame history per causal conv; later frames overwrite those same tensors (nothing
    allocated per frame, nothing aliasing a conv input) and the output still equals diffusers'."""
    z = _z(4, h=2, w=2, seed=13)
    with torch.no_grad():
        ref = wan.decode(z).sample
    dec = WanFrameDecoder(wan.decoder, compile=compile, channels_last=True, compile_backend="aot_eager")
    seen = []

    def same_histories(state):
        ids = [[(id(h), h.data_ptr()) for h in stage] for stage in state]
        assert ids == (seen or [ids])[0]
        assert all(h.shape[2] == 2 and h.untyped_storage().nbytes() == h.numel() * h.element_size()
                   for stage in state for h in stage)
        seen.append(ids)

    out = _ours(wan, dec, z, after_frame=same_histories)
    assert len(seen) == z.shape[2]
    assert (out - ref).abs().max().item() <= TOL


def test_compiled_steady_frames_match_eager(wan):
    z = _z(4, h=3, w=2, seed=7)
    eager = _ours(wan, WanFrameDecoder(wan.decoder), z)
    compiled = _ours(wan, WanFrameDecoder(wan.decoder, compile=True, compile_backend="aot_eager"), z)
    assert (compiled - eager).abs().max().item() <= TOL


def test_vae_decode_compile_switch(wan):
    """Cosmos3VAE.decode(compile=True) goes through the compiled frame decoder and gives the eager frames."""
    vae = Cosmos3VAE(wan)
    lat = _z(3, seed=3)
    eager = vae.decode(lat, chunk_latent_frames=2)
    compiled = vae.decode(lat, chunk_latent_frames=2, compile=True, compile_backend="aot_eager")
    assert vae.frame_decoder(compile=True, compile_backend="aot_eager").precompiled  # the stages went through torch.compile
    assert (compiled - eager).abs().max().item() <= TOL


def test_frame_decoder_rejects_misuse(wan):
    dec = WanFrameDecoder(wan.decoder)
    with pytest.raises(ValueError, match="one latent frame"):
        dec(torch.zeros(1, 48, 2, 2, 2), [], True)
    with pytest.raises(ValueError, match="first=True"):
        dec(torch.zeros(1, 48, 1, 2, 2), [], False)
    with pytest.raises(ValueError, match="Wan2.2"):
        WanFrameDecoder(type("Wan21Decoder", (), {"up_blocks": [torch.nn.Identity()]})())


def test_compiled_decode_has_room_for_many_sizes_in_every_context(wan):
    """torch (≥ 2.14) keeps compile settings per context, and ComfyUI runs each prompt in a fresh asyncio task (a
    copy of the worker thread's context), so a setting made during one prompt is gone in the next. Each compiled
    decode must therefore raise Dynamo's recompile limit itself: three sizes in three fresh contexts need 3 × 4
    graphs of the up-block stage, over Dynamo's default limit of 8 (which fails a fullgraph compile)."""
    import contextvars

    vae = Cosmos3VAE(wan)
    for h, w in ((2, 2), (2, 4), (4, 2)):
        lat = _z(2, h=h, w=w, seed=h * 10 + w)
        compiled = contextvars.Context().run(lambda lat=lat: vae.decode(lat, compile=True, compile_backend="aot_eager"))
        assert (compiled - vae.decode(lat)).abs().max().item() <= TOL
