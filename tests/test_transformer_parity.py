"""prefill + denoise_step == diffusers 0.42.1 ``Cosmos3OmniTransformer.forward`` on the same tiny checkpoint (fp32).

The reference inputs are packed by the diffusers pipeline's own segment builders (``_prepare_*_segment``), so the
positions, indexes and masks on the reference side come from diffusers, not from us.
"""

from __future__ import annotations

import types

import pytest
import torch
from diffusers import Cosmos3OmniTransformer
from diffusers.models.transformers import transformer_cosmos3 as dtc
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline

from cosmos3_core.config import Cosmos3Config
from cosmos3_core.model.layout import ActionTokens, build_layout
from cosmos3_core.model.loader import load_transformer
from cosmos3_core.model.rope import action_position_ids, rope_tables, sound_position_ids, vision_position_ids
from support.compare import rel

RTOL = 1e-5


@pytest.fixture(scope="module", params=["nano", "edge"])
def models(request, tiny_checkpoint):
    variant = request.param
    path = tiny_checkpoint(variant, seed=3)
    ours = load_transformer(path, dtype=torch.float32)
    ref = Cosmos3OmniTransformer.from_pretrained(path, subfolder="transformer", torch_dtype=torch.float32).eval()
    return variant, ours, ref


def reference_step(ref, ids, latents, timestep, fps, clean, sound=None, action=None, domain=7, clean_actions=()):
    """Run diffusers' forward for one branch, packing inputs with the pipeline's own segment builders."""
    pipe = types.SimpleNamespace(transformer=ref, vae_scale_factor_temporal=4)
    text = Cosmos3OmniPipeline._prepare_text_segment(pipe, list(ids), "cpu")
    vis = Cosmos3OmniPipeline._prepare_vision_segment(
        pipe, latents, bool(clean), text["vision_start_temporal_offset"], fps, text["und_len"], "cpu", list(clean)
    )
    curr = text["und_len"] + vis["num_vision_tokens"]
    segs, mrope = {}, [text["text_mrope_ids"], vis["vision_mrope_ids"]]
    if sound is not None:
        snd = Cosmos3OmniPipeline._prepare_sound_segment(pipe, sound, text["vision_start_temporal_offset"], 25.0, curr, "cpu")
        segs.update(snd)
        mrope.append(snd["sound_mrope_ids"])
        curr += snd["sound_len"]
    if action is not None:
        act = Cosmos3OmniPipeline._prepare_action_segment(
            pipe, action, list(clean_actions), text["vision_start_temporal_offset"], fps, curr, "cpu"
        )
        segs.update(act)
        mrope.append(act["action_mrope_ids"])
        curr += act["action_len"]
    t = lambda n: torch.full((n,), timestep)  # noqa: E731 — int64, as the pipeline passes it
    out = ref(
        input_ids=text["input_ids"], text_indexes=text["text_indexes"], position_ids=torch.cat(mrope, dim=1),
        und_len=text["und_len"], sequence_length=curr, vision_tokens=[latents],
        vision_token_shapes=vis["vision_token_shapes"], vision_sequence_indexes=vis["vision_sequence_indexes"],
        vision_mse_loss_indexes=vis["vision_mse_loss_indexes"], vision_timesteps=t(vis["num_noisy_vision_tokens"]),
        vision_noisy_frame_indexes=vis["vision_noisy_frame_indexes"],
        sound_tokens=None if sound is None else [sound], sound_token_shapes=segs.get("sound_token_shapes"),
        sound_sequence_indexes=segs.get("sound_sequence_indexes"), sound_mse_loss_indexes=segs.get("sound_mse_loss_indexes"),
        sound_timesteps=None if sound is None else t(segs["sound_len"]),
        sound_noisy_frame_indexes=segs.get("sound_noisy_frame_indexes"),
        action_tokens=None if action is None else [action], action_token_shapes=segs.get("action_token_shapes"),
        action_sequence_indexes=segs.get("action_sequence_indexes"),
        action_mse_loss_indexes=segs.get("action_mse_loss_indexes"),
        action_timesteps=None if action is None else t(segs["num_noisy_action_tokens"]),
        action_noisy_frame_indexes=segs.get("action_noisy_frame_indexes"),
        action_domain_ids=None if action is None else [torch.tensor([domain])],
        return_dict=False,
    )
    return out


def ours_step(model, ids_list, latents, timestep, fps, clean, sound=None, action=None, domain=7, clean_actions=()):
    kvs = model.prefill_many(ids_list)  # both branches' prompts in one text-tower pass, as the pipeline runs them
    layout = build_layout(
        model.config, [kv.length for kv in kvs], latents.shape[2:], fps, clean_frames=clean,
        sound_len=0 if sound is None else sound.shape[1],
        action=None if action is None else ActionTokens(action.shape[0], tuple(clean_actions), domain),
    )
    return model.denoise_step(latents, torch.tensor(timestep), kvs, layout, sound=sound, action=action)


CASES = {
    # name: (latent T, h, w, clean frames, fps, sound)
    "image": (1, 4, 6, (), 24.0, False),
    "video": (3, 4, 6, (), 24.0, False),
    "video_odd_height_cond0": (3, 5, 6, (0,), 16.0, False),
    "video_sound": (3, 4, 6, (), 24.0, True),
    "video_sound_cond0_odd": (2, 3, 5, (0,), 30.0, True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_single_branch_matches_diffusers(models, case):
    variant, ours, ref = models
    t_len, h, w, clean, fps, with_sound = CASES[case]
    if with_sound and not ours.config.sound_gen:
        pytest.skip("edge has no sound head")
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, ours.config.vocab_size, (23,), generator=g).tolist()
    latents = torch.randn(1, 48, t_len, h, w, generator=g)
    sound = torch.randn(64, 9, generator=g) if with_sound else None
    ref_v, ref_s, _ = reference_step(ref, ids, latents, 937, fps, clean, sound)
    out = ours_step(ours, [ids], latents, 937, fps, clean, sound)
    assert out.vision.shape == (1, 48, t_len, h, w)
    assert rel(out.vision[0], ref_v[0][0]) <= RTOL
    for f in clean:
        assert torch.count_nonzero(out.vision[0, :, f]) == 0  # conditioned frames: exact zero velocity
    if with_sound:
        assert rel(out.sound[0], ref_s[0]) <= RTOL


def test_action_stream_matches_diffusers(models):
    variant, ours, ref = models
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, ours.config.vocab_size, (17,), generator=g).tolist()
    latents = torch.randn(1, 48, 2, 4, 4, generator=g)
    action = torch.randn(4, 64, generator=g)
    ref_v, _, ref_a = reference_step(ref, ids, latents, 500, 5.0, (0,), action=action, clean_actions=(0, 1))
    out = ours_step(ours, [ids], latents, 500, 5.0, (0,), action=action, clean_actions=(0, 1))
    assert rel(out.vision[0], ref_v[0][0]) <= RTOL
    assert rel(out.action[0], ref_a[0]) <= RTOL
    assert torch.count_nonzero(out.action[0, :2]) == 0


def test_batched_branches_with_unequal_prompts_equal_single_steps(models):
    variant, ours, _ = models
    g = torch.Generator().manual_seed(2)
    cond = torch.randint(0, ours.config.vocab_size, (31,), generator=g).tolist()
    uncond = torch.randint(0, ours.config.vocab_size, (12,), generator=g).tolist()
    latents = torch.randn(1, 48, 3, 5, 4, generator=g)
    sound = torch.randn(64, 7, generator=g) if ours.config.sound_gen else None
    both = ours_step(ours, [cond, uncond], latents, 600, 24.0, (0,), sound)
    one = ours_step(ours, [cond], latents, 600, 24.0, (0,), sound)
    two = ours_step(ours, [uncond], latents, 600, 24.0, (0,), sound)
    assert both.vision.shape[0] == 2
    assert rel(both.vision[0], one.vision[0]) <= 1e-6
    assert rel(both.vision[1], two.vision[0]) <= 1e-6
    assert rel(both.vision[0], both.vision[1]) > 1e-3  # the branches really differ
    if sound is not None:
        assert rel(both.sound[1], two.sound[0]) <= 1e-6


def test_prefill_kv_equals_reference_internal_kv_and_is_step_independent(models, monkeypatch):
    """The text K/V diffusers' generation pathway reads, captured inside its forward under different latents,
    timesteps, fps and sound, all equal our one prefill (|Δ| tiny) — so the cache is exact. The prompt is prefilled
    second of a pair in one pass (as a guidance pair is), behind a prompt of another length; that one is checked
    against the reference too."""
    variant, ours, ref = models
    g = torch.Generator().manual_seed(9)
    other = torch.randint(0, ours.config.vocab_size, (8,), generator=g).tolist()
    ids = torch.randint(0, ours.config.vocab_size, (19,), generator=g).tolist()
    kv_other, kv = ours.prefill_many([other, ids])
    assert (kv_other.length, kv.length) == (8, 19)
    kv_copy = (kv.keys.clone(), kv.values.clone())
    captured = []
    real = dtc.dispatch_attention_fn

    def spy(q, k, v, *, is_causal=False, **kw):
        if not is_causal:  # the generation pathway: keys = [text | gen]
            captured.append((k[0].clone(), v[0].clone()))  # [text | gen] keys; the text rows are compared
        return real(q, k, v, is_causal=is_causal, **kw)

    monkeypatch.setattr(dtc, "dispatch_attention_fn", spy)
    settings = [(999, 24.0, False, 0), (17, 10.0, False, 1), (500, 24.0, True, 2)]
    for timestep, fps, with_sound, seed in settings:
        if with_sound and not ours.config.sound_gen:
            continue
        gg = torch.Generator().manual_seed(seed)
        latents = torch.randn(1, 48, 3, 4, 4, generator=gg)
        sound = torch.randn(64, 5, generator=gg) if with_sound else None
        captured.clear()
        reference_step(ref, ids, latents, timestep, fps, (), sound)
        assert len(captured) == ours.config.num_hidden_layers
        for layer, (k_ref, v_ref) in enumerate(captured):  # reference layout [L, KV, hd]
            assert rel(kv.keys[layer].transpose(0, 1), k_ref[: len(ids)]) <= RTOL
            assert rel(kv.values[layer].transpose(0, 1), v_ref[: len(ids)]) <= RTOL
        ours_step(ours, [ids], latents, timestep, fps, (), sound)
    assert torch.equal(kv.keys, kv_copy[0]) and torch.equal(kv.values, kv_copy[1])  # steps never write the cache
    captured.clear()
    reference_step(ref, other, torch.randn(1, 48, 1, 4, 4, generator=g), 999, 24.0, ())
    assert len(captured) == ours.config.num_hidden_layers
    for layer, (k_ref, v_ref) in enumerate(captured):
        assert rel(kv_other.keys[layer].transpose(0, 1), k_ref[: len(other)]) <= RTOL
        assert rel(kv_other.values[layer].transpose(0, 1), v_ref[: len(other)]) <= RTOL


def test_position_ids_equal_the_pipeline_builders():
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import get_3d_mrope_ids_vae_tokens

    cfg = Cosmos3Config()
    for grid, fps in [((48, 23, 40), 24.0), ((1, 45, 80), 24.0), ((5, 3, 4), 16.0), ((3, 2, 2), 23.976)]:
        ref, _ = get_3d_mrope_ids_vae_tokens(*grid, 15123, fps=fps, base_fps=24.0, temporal_compression_factor=4)
        assert torch.equal(vision_position_ids(grid, 15123, fps, cfg), ref.float())
    ref, _ = get_3d_mrope_ids_vae_tokens(197, 1, 1, 15050, fps=25.0, base_fps=24.0, temporal_compression_factor=1)
    assert torch.equal(sound_position_ids(197, 15050, cfg), ref.float())
    ref, _ = get_3d_mrope_ids_vae_tokens(
        16, 1, 1, 15050, fps=5.0, base_fps=24.0, temporal_compression_factor=1,
        base_temporal_compression_factor=4, start_frame_offset=1,
    )
    assert torch.equal(action_position_ids(16, 15050, 5.0, cfg), ref.float())


def test_rope_tables_equal_reference_rotary():
    cfg = Cosmos3Config()
    rotary = dtc.Cosmos3VLTextRotaryEmbedding(128, cfg.rope_theta, cfg.rope_axes_dim)
    pos = torch.stack([torch.arange(300.0) * 0.7 + 15000, torch.arange(300.0) % 23, torch.arange(300.0) % 40])
    ref_cos, ref_sin = rotary(pos.unsqueeze(1), "cpu", torch.float32)
    cos, sin = rope_tables(pos, cfg, torch.float32)
    assert torch.equal(cos, ref_cos[0]) and torch.equal(sin, ref_sin[0])
