"""The Cosmos3 Mixture-of-Transformers, run as two entry points: ``prefill`` (text tower, once per prompt) and
``denoise_step`` (generation tower, once per step, for all guidance branches in one batch).

Mirrors diffusers 0.42.1 ``Cosmos3OmniTransformer.forward`` (models/transformers/transformer_cosmos3.py). That
forward packs ``[text | vision | sound | action]`` into one sequence and runs both towers every step; here the
two towers are split along the line the architecture already draws:

* **Text is independent of generation.** Text tokens get no timestep embedding, sit at positions ``0..L-1`` and
  attend causally to text only; no text query reads a generation key. So each layer's text K/V depends only on the
  prompt (see ``text_kv.py``). ``prefill`` runs the understanding tower once over a prompt and returns a
  ``TextKV``; the result is exact for every step, every fps, resolution and sound setting.
* **The generation tower reads [cached text K/V | its own K/V].** ``denoise_step`` runs only the ``*_moe_gen`` /
  ``add_*`` weights over the vision (+ sound, + action) tokens. Clean (conditioning) latent frames get no timestep
  embedding and zero velocity. With two branches (cond, uncond) every linear layer runs once over the stacked
  batch ``[2, N, D]``; each branch keeps its own rotary offset (``L_b + 15000``) and attends only to its own text
  K/V, even when the two prompts have different lengths. The step does no ``.item()`` or other host sync (but for
  SeaCache's gate, one device→host copy of its distances per step: ``sampling/sea_cache.py``).

Parameter names equal the diffusers checkpoint keys, so ``transformer/*.safetensors`` loads by name (loader.py).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch
from torch import nn

from ..config import Cosmos3Config
from ..kernels.attention import attention, flash4_available
from ..kernels.compile import compiled
from ..kernels.gemv import gemv
from ..kernels.packed import LayerWeights, host_changes_weights
from ..runtime import DEFAULT, RuntimeOptions
from .fp8 import run_linear
from .layers import DecoderLayer, DomainAwareLinear, RMSNorm, TimestepEmbedder, module_rms_norm, project
from .layout import GenLayout, patchify, select_branches, unpatchify
from .precision import StepPrecision
from .rope import apply_rope, rope_tables, text_position_ids
from .text_kv import TextKV


class SequenceParallel(Protocol):
    """What the generation layers need from a sequence-parallel group (``parallel/ulysses.py`` implements it):
    this rank's share of the tokens, and the all-to-alls between token shards and head shards around attention."""

    def shard_tokens(self, x: torch.Tensor) -> torch.Tensor: ...
    def gather_tokens(self, x: torch.Tensor, num_tokens: int) -> torch.Tensor: ...
    def to_heads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple: ...
    def to_tokens(self, out: torch.Tensor) -> torch.Tensor: ...


class StepCache(Protocol):
    """A cache around the generation layer stack for one step (SeaCache: ``sampling/sea_cache.py``'s ``CacheStep``
    implements it). ``run_stack`` decides which rows of the step's batch compute, calls ``stack(branches)`` — the
    stack's output over the target tokens for those branches' rows, ``[len(branches)·N, tokens, D]`` — for the
    branches that have such a row, and returns every row's output over ``target`` (the embedded target tokens,
    ``[B·N, tokens, D]``): computed rows from the stack, the others predicted."""

    def run_stack(self, latents: torch.Tensor, target: torch.Tensor, stack: Callable[[list[int]], torch.Tensor],
                  num_branches: int, dtype: torch.dtype) -> torch.Tensor: ...

# Weights that a generation-only or reasoner-only load may leave out, by module name prefix.
SKIPPABLE_MODULES = ("lm_head", "action_proj_in", "action_proj_out", "action_modality_embed")


@dataclass(frozen=True)
class StepOutput:
    """Velocities ``v = ε − x0`` per branch; exact zeros at clean frames/actions."""

    vision: torch.Tensor  # [B, C, T, h, w]
    sound: torch.Tensor | None  # [B, sound_dim, Ts]
    action: torch.Tensor | None  # [B, Ta, action_dim]


class Cosmos3Transformer(nn.Module):
    def __init__(
        self, config: Cosmos3Config, skip_modules: Sequence[str] = (), linear: type[nn.Linear] = nn.Linear
    ):
        super().__init__()
        unknown = set(skip_modules) - set(SKIPPABLE_MODULES)
        if unknown:
            raise ValueError(f"skip_modules {sorted(unknown)} not skippable; choose from {SKIPPABLE_MODULES}.")
        self.config = config
        self.skip_modules = tuple(skip_modules)
        self.execution_device: torch.device | None = None
        self.fp8_checkpoint = None  # weights.Fp8Checkpoint of an FP8 load (loader.py), read by the step policy
        self.weight_sharding = None  # loader.WeightSharding of a tensor-parallel load (parallel/tensor.py)
        d, kind, eps = config.hidden_size, config.norm_kind, config.rms_norm_eps
        self.embed_tokens = nn.Embedding(config.vocab_size, d)
        self.layers = nn.ModuleList(DecoderLayer(config, linear) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(d, eps, kind)
        self.norm_moe_gen = RMSNorm(d, eps, kind)
        self.lm_head = None if "lm_head" in skip_modules else linear(d, config.vocab_size, bias=False)
        self.proj_in = linear(config.patch_latent_dim, d, bias=True)
        self.proj_out = linear(d, config.patch_latent_dim, bias=True)
        self.time_embedder = TimestepEmbedder(d, linear)
        if config.sound_gen:
            self.audio_proj_in = linear(config.sound_dim, d, bias=True)
            self.audio_proj_out = linear(d, config.sound_dim, bias=True)
            self.audio_modality_embed = nn.Parameter(torch.zeros(d))
        self.has_action = config.action_gen and not set(skip_modules) & set(SKIPPABLE_MODULES[1:])
        if config.action_gen and self.has_action:
            n = config.num_embodiment_domains
            self.action_proj_in = DomainAwareLinear(config.action_dim, d, n)
            self.action_proj_out = DomainAwareLinear(d, config.action_dim, n)
            self.action_modality_embed = nn.Parameter(torch.zeros(d))

    # ------------------------------------------------------------------ helpers
    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype (a norm's: linear weights may be stored narrower, see ``weights.py``)."""
        return self.norm_moe_gen.weight.dtype

    @property
    def device(self) -> torch.device:
        """Where the generation tower runs (the text tower may live elsewhere, see ``towers.py``): the
        ``execution_device`` a model manager set (its layers may then stream weights from elsewhere), else where
        ``proj_in`` lives."""
        return self.execution_device or self.proj_in.weight.device

    # ------------------------------------------------------------------ text tower
    def prefill(self, token_ids: torch.Tensor | Sequence[int], attention_backend: str = "auto",
                precision: StepPrecision | None = None) -> TextKV:
        """Run the understanding tower over one prompt; return every layer's K/V as the generation tower reads it."""
        return self.prefill_many([token_ids], attention_backend, precision)[0]

    @torch.no_grad()
    def prefill_many(self, prompts: Sequence[torch.Tensor | Sequence[int]], attention_backend: str = "auto",
                     precision: StepPrecision | None = None) -> list[TextKV]:
        """``prefill`` of several prompts (a guidance pair) in one pass of the understanding tower: their tokens
        are stacked as rows of every projection and MLP (the tower's weights are read, and each kernel launched,
        once for all of them), and each prompt attends causally to itself only, at its own positions ``0..L-1``.
        Every row's arithmetic is that of a prompt run alone; the batched pass only saves launches and weight
        reads (an eager prefill is launch-bound: about as long for 60 tokens as for 1,500 on an H200).
        ``precision``: the FP8 modes of the steps the K/V is for (``precision.StepPrecision``; the reference
        re-runs this tower at every step, in that step's modes: ``precision.py``); None: every linear's ``forward``."""
        ids = [torch.as_tensor(p, dtype=torch.long).reshape(-1) for p in prompts]
        if not ids or any(t.numel() == 0 for t in ids):
            raise ValueError("prefill: the prompt has no tokens.")
        cfg = self.config
        all_ids = torch.cat(ids)
        if int(all_ids.max()) >= cfg.vocab_size or int(all_ids.min()) < 0:
            raise ValueError(
                f"prefill: token id {int(all_ids.max())} is outside the vocabulary ({cfg.vocab_size}); "
                "the tokenizer does not belong to this checkpoint."
            )
        lengths = [t.numel() for t in ids]
        bounds = list(zip(itertools.accumulate([0] + lengths[:-1]), itertools.accumulate(lengths)))
        n = all_ids.numel()
        device, dtype = self.embed_tokens.weight.device, self.embed_tokens.weight.dtype  # the text tower's
        cos, sin = rope_tables(text_position_ids(max(lengths), cfg), cfg, dtype, device)
        if len(ids) > 1:  # every prompt at positions 0..L-1
            cos, sin = (torch.cat([t[:m] for m in lengths]) for t in (cos, sin))
        h = self.embed_tokens(all_ids.to(device))  # [ΣL, D]
        shape = (cfg.num_hidden_layers, self.layers[0].self_attn.num_kv_heads)  # this rank's heads (tensor parallel)
        keys = [torch.empty(*shape, m, cfg.head_dim, dtype=dtype, device=device) for m in lengths]
        values = [torch.empty_like(k) for k in keys]
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            q, k, v = text_qkv(layer, h, precision=precision)
            gen_norm = attn.k_norm_und_for_gen  # Edge: the generation tower reads separately normed text keys
            k_for_gen = apply_rope(k if gen_norm is None else gen_norm(k), cos, sin)
            for (a, b), kj, vj in zip(bounds, keys, values):
                kj[i] = k_for_gen[a:b].transpose(0, 1)
                vj[i] = v[a:b].transpose(0, 1)
            if i == last:
                break  # the last layer's text output feeds nothing the generation tower reads
            q, k = apply_rope(q, cos, sin), (k_for_gen if gen_norm is None else apply_rope(k, cos, sin))
            outs = [attention(q[a:b].transpose(0, 1)[None], k[a:b].transpose(0, 1)[None],
                              v[a:b].transpose(0, 1)[None], causal=True, backend=attention_backend)[0].transpose(0, 1)
                    for a, b in bounds]
            out = outs[0] if len(outs) == 1 else torch.cat(outs)
            h = text_layer_output(layer, h, out.reshape(n, -1), precision=precision)
        return [TextKV(kj, vj, t.cpu()) for kj, vj, t in zip(keys, values, ids)]

    # ------------------------------------------------------------------ generation tower
    def _embed_generation_tokens(
        self, latents: torch.Tensor, timestep: torch.Tensor, layout: GenLayout,
        sound: torch.Tensor | None, action: torch.Tensor | None, precision: StepPrecision | None = None,
    ) -> torch.Tensor:
        """Input embeddings of the generation stream ``[N, tokens, D]``, one row per batch item (shared by every
        guidance branch)."""
        cfg, dtype = self.config, self.dtype
        scaled_t = timestep.reshape(1) * cfg.timestep_scale  # int64 step index → fp32, as the reference
        t_emb = self.time_embedder(scaled_t).to(dtype)  # [1, D]
        items = latents.reshape(-1, *latents.shape[-4:]).to(dtype)  # [N, C, T, h, w]
        vision = run_linear(self.proj_in, torch.stack([patchify(item, cfg.latent_patch_size) for item in items]),
                            precision)
        n = vision.shape[0]
        t, ph, pw = layout.grid
        vision = vision.view(n, t, ph * pw, -1)
        vision = torch.where(layout.noisy_frames.view(1, t, 1, 1), vision + t_emb, vision).view(n, t * ph * pw, -1)
        parts = [vision]
        if layout.prefix is not None:  # clean items at the target's positions: no timestep embedding
            prefix = [run_linear(self.proj_in, patchify(item.to(dtype), cfg.latent_patch_size), precision)
                      for item in layout.prefix]
            parts.insert(0, torch.cat(prefix).unsqueeze(0).expand(n, -1, -1))
        if layout.sound_len:
            if sound is None:
                raise ValueError("denoise_step: the layout has a sound stream but no sound latent was given.")
            s = sound.reshape(n, cfg.sound_dim, -1).transpose(1, 2).to(dtype)  # [N, Ts, Cs]
            parts.append(run_linear(self.audio_proj_in, s, precision) + self.audio_modality_embed + t_emb)  # all noisy
        if layout.action_len:
            if action is None or not self.has_action:
                raise ValueError("denoise_step: the layout has an action stream but no action latent/head.")
            a = self.action_proj_in(action.reshape(n, layout.action_len, -1).to(dtype), layout.domain_id)
            a = a + self.action_modality_embed
            parts.append(torch.where(layout.noisy_actions.view(1, -1, 1), a + t_emb, a))
        return torch.cat(parts, dim=1) if len(parts) > 1 else vision

    @torch.no_grad()
    def denoise_step(
        self,
        latents: torch.Tensor,
        timestep: torch.Tensor,
        text: Sequence[TextKV],
        layout: GenLayout,
        sound: torch.Tensor | None = None,
        action: torch.Tensor | None = None,
        sequence_parallel: SequenceParallel | None = None,
        options: RuntimeOptions = DEFAULT,
        precision: StepPrecision | None = None,
        cache: StepCache | None = None,
    ) -> StepOutput:
        """One generation-tower pass for ``len(text)`` branches × ``N`` batch items in one batch, with the run's
        kernels (``options``: the attention route, and the compiled generation layer when ``compile``).

        ``latents`` ``[N, C, T, h, w]`` (any float dtype); ``timestep`` the scheduler's integer timestep as a
        0-dim tensor (the model embeds ``t·0.001``); ``sound`` ``[N, sound_dim, Ts]``; ``action``
        ``[N, Ta, action_dim]``. Output rows are branch-major: ``[cond × N | uncond × N]``.
        ``sequence_parallel`` (``parallel/ulysses.py``): the layers run over this rank's share of the tokens and
        ``text`` holds this rank's share of the K/V heads; the stream is gathered back before the heads.
        ``precision``: the step's FP8 modes (``precision.StepPrecision``; None: every linear's ``forward``).
        ``cache``: this step's cache around the layer stack (``StepCache``; SeaCache): rows it predicts skip the
        stack, which runs only for the branches with a row that computes.
        """
        assert len(text) == layout.num_branches, (len(text), layout.num_branches)
        b, start = len(text), layout.num_prefix_tokens
        x = self._embed_generation_tokens(latents, timestep, layout, sound, action, precision)  # [N, tokens, D]
        # branches differ only through their text K/V and RoPE: rows [branch 0 × N | branch 1 × N]
        x = x.repeat(b, 1, 1)  # a real copy: every layer then gets the same strides (one compiled graph)
        if cache is None:
            out = self._stack(x, text, layout, sequence_parallel, options, precision)[:, start:]
            return self._heads(out, layout, precision)  # velocities: the target only
        items = x.shape[0] // b

        def stack(branches: list[int]) -> torch.Tensor:
            rows = x if len(branches) == b else x[[j * items + k for j in branches for k in range(items)]]
            return self._stack(rows, [text[j] for j in branches], select_branches(layout, branches),
                               sequence_parallel, options, precision)[:, start:]

        return self._heads(cache.run_stack(latents, x[:, start:], stack, b, self.dtype), layout, precision)

    def _stack(self, x, text, layout, sequence_parallel, options, precision):
        """``norm_moe_gen(layers(x))``: the layer stack over the rows of ``x`` (SeaCache's boundary)."""
        cos, sin, sp = layout.cos, layout.sin, sequence_parallel
        if sp is not None:
            x, cos, sin = sp.shard_tokens(x), sp.shard_tokens(cos), sp.shard_tokens(sin)
        layer_fn = generation_layer_fn(options)
        starts = layout.key_starts()
        for i, layer in enumerate(self.layers):
            x = layer_fn(layer, x, cos, sin, [kv.keys[i] for kv in text], [kv.values[i] for kv in text], sp, starts,
                         options.attention, precision)
        if sp is not None:
            x = sp.gather_tokens(x, layout.num_tokens)
        return self.norm_moe_gen(x)

    def _heads(self, x: torch.Tensor, layout: GenLayout, precision: StepPrecision | None = None) -> StepOutput:
        """The modality heads over the target's tokens ``x`` (the prefix already dropped)."""
        cfg = self.config
        nv = layout.num_vision_tokens
        vision = unpatchify(run_linear(self.proj_out, x[:, :nv], precision), layout, cfg.latent_channel,
                            cfg.latent_patch_size)
        vision = vision.masked_fill(~layout.noisy_frames.view(1, 1, -1, 1, 1), 0.0)
        sound = action = None
        if layout.sound_len:
            sound = run_linear(self.audio_proj_out, x[:, nv : nv + layout.sound_len], precision).transpose(1, 2)
        if layout.action_len:
            a = self.action_proj_out(x[:, nv + layout.sound_len :], layout.domain_id)
            action = a.masked_fill(~layout.noisy_actions.view(1, -1, 1), 0.0)
        return StepOutput(vision, sound, action)


def generation_layer_fn(options: RuntimeOptions) -> Callable:
    """``generation_layer``, or where ``options.compiles`` its ``torch.compile``d version (kernels/compile.py): one
    graph shared by every layer (the layer's weights are graph inputs) that fuses the norms, RoPE and activations — same
    math, other rounding of the intermediates. Shapes are static except the prompt lengths (the text K/V's length
    dimension is dynamic): one graph per generation shape (resolution × frames, branches, batch, streams, attention
    route), the same in every process whatever the prompts and whatever ran before, each kept on disk whole and
    keyed also by whether FlashAttention-4 can run here. A call that cannot be saved (host weight hooks, a sequence-
    parallel group) goes through plain ``torch.compile``, which allows graph breaks."""
    if not options.compiles:
        return generation_layer
    return compiled(generation_layer, backend=options.compile_backend, fullgraph=False,
                    dynamic_dims=_prompt_length_dims, key_extra=flash4_available, aot_allowed=_no_weight_hooks)


def _prompt_length_dims(args: tuple) -> list[tuple[torch.Tensor, int]]:
    """The dynamic sizes of a ``generation_layer`` call: each text K/V's length dimension (``[KV, L, hd]``)."""
    return [(t, 1) for t in (*args[4], *args[5])]


def _no_weight_hooks(args: tuple) -> bool:
    """Whether a ``generation_layer`` call's layer computes with its parameters as they are: no host per-call cast
    or weight function (``comfy.ops`` weight streaming, on-the-fly LoRA) and no forward hooks (a tensor-parallel
    layer's, which exchange partial sums), which only plain ``torch.compile``'s in-process guards can follow."""
    return not any(host_changes_weights(m) or m._forward_pre_hooks or m._forward_hooks for m in args[0].modules())


def text_qkv(layer: DecoderLayer, h: torch.Tensor, norm=module_rms_norm, weights: LayerWeights | None = None,
             precision: StepPrecision | None = None):
    """The text tower's attention inputs over ``h`` ``[L, D]``: q ``[L, H, hd]`` and k ``[L, KV, hd]`` after the
    per-head QK-norm (Nano/Super; Edge has none) and before RoPE, and v ``[L, KV, hd]``. ``norm(module, x)`` applies
    an RMSNorm with the caller's reference rounding (the generator: diffusers'; the reasoner: transformers').
    ``weights`` (a one-row decode step, packed.py): ``qkv`` = ``to_q/to_k/to_v`` packed as one matrix, one GEMV.
    ``precision``: the step's FP8 modes (``fp8.run_linear``)."""
    attn = layer.self_attn
    n = h.shape[0]
    x = norm(layer.input_layernorm, h)
    if weights is None or weights.qkv is None:
        q, k, v = (run_linear(m, x, precision) for m in (attn.to_q, attn.to_k, attn.to_v))
    else:
        q, k, v = gemv(x, weights.qkv, weights.route).split([attn.to_q.out_features, attn.to_k.out_features,
                                              attn.to_v.out_features], dim=-1)
    q = q.reshape(n, attn.num_heads, attn.head_dim)
    k = k.reshape(n, attn.num_kv_heads, attn.head_dim)
    v = v.reshape(n, attn.num_kv_heads, attn.head_dim)
    if attn.norm_q is not None:
        q, k = norm(attn.norm_q, q), norm(attn.norm_k, k)
    return q, k, v


def text_layer_output(layer: DecoderLayer, h: torch.Tensor, attn_out: torch.Tensor, norm=module_rms_norm,
                      weights: LayerWeights | None = None, precision: StepPrecision | None = None):
    """The rest of a text-tower layer: output projection, residual, MLP; ``attn_out`` ``[L, H·hd]``. ``weights``,
    ``precision``: as ``text_qkv``'s (``o``, and the MLP's)."""
    h = h + project(layer.self_attn.to_out, attn_out, weights.o if weights is not None else None,
                    weights.route if weights is not None else "auto", precision)
    return h + layer.mlp(norm(layer.post_attention_layernorm, h), weights, precision)


def generation_layer(
    layer: DecoderLayer,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    text_keys: list[torch.Tensor],
    text_values: list[torch.Tensor],
    sequence_parallel: SequenceParallel | None = None,
    key_starts: list[int] | None = None,
    attention_backend: str = "auto",
    precision: StepPrecision | None = None,
) -> torch.Tensor:
    """One generation-tower layer over ``x`` ``[B·N, tokens, D]`` (rows branch-major, ``N`` items per branch);
    branch ``j`` (rotary table ``cos[j]``) attends to ``[text_keys[j] | its own K]`` (its own keys from
    ``key_starts[j]`` on: past a prefix hidden from it). ``precision``: the step's FP8 modes (``fp8.run_linear``).

    With ``sequence_parallel`` ``x`` holds this rank's tokens: attention runs on all tokens of this rank's heads
    (an all-to-all before and after it); everything else is per token."""
    attn = layer.self_attn
    b = len(text_keys)
    rows, n, _ = x.shape
    items = rows // b
    y = layer.input_layernorm_moe_gen(x)
    q = attn.norm_added_q(run_linear(attn.add_q_proj, y, precision).view(b, items, n, attn.num_heads, attn.head_dim))
    k = attn.norm_added_k(run_linear(attn.add_k_proj, y, precision).view(b, items, n, attn.num_kv_heads,
                                                                         attn.head_dim))
    v = run_linear(attn.add_v_proj, y, precision).view(b, items, n, attn.num_kv_heads, attn.head_dim)
    cos, sin = cos[:, None], sin[:, None]  # [B, 1, tokens, hd]: one table per branch, shared by its items
    q = apply_rope(q, cos, sin).transpose(2, 3)  # [B, N, H, tokens, hd]
    k = apply_rope(k, cos, sin).transpose(2, 3)  # [B, N, KV, tokens, hd]
    v = v.transpose(2, 3)
    if sequence_parallel is not None:
        q, k, v = sequence_parallel.to_heads(q, k, v)  # all tokens, this rank's heads
    outs = []
    for j in range(b):  # each branch attends to its own prompt's K/V only
        s = key_starts[j] if key_starts else 0
        keys = torch.cat([text_keys[j].expand(items, -1, -1, -1), k[j, :, :, s:]], dim=2)  # [N, KV, L_j + …, hd]
        vals = torch.cat([text_values[j].expand(items, -1, -1, -1), v[j, :, :, s:]], dim=2)
        outs.append(attention(q[j], keys, vals, backend=attention_backend))
    out = torch.cat(outs)  # [B·N, H, tokens, hd]
    if sequence_parallel is not None:
        out = sequence_parallel.to_tokens(out)  # this rank's tokens, all heads
    out = out.transpose(1, 2).reshape(rows, n, -1)  # [B·N, tokens, H·hd]
    x = x + run_linear(attn.to_add_out, out, precision)
    return x + layer.mlp_moe_gen(layer.post_attention_layernorm_moe_gen(x), precision=precision)
