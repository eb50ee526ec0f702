"""The Cosmos3 reasoner: the understanding tower of a loaded ``Cosmos3Transformer`` run as a causal VLM.

Mirrors transformers 5.24.0 ``Cosmos3OmniForConditionalGeneration`` (Qwen3-VL text model + deepstack;
models/qwen3_vl/modeling_qwen3_vl.py ``Qwen3VLTextModel``) and ``Cosmos3EdgeForConditionalGeneration``
(models/cosmos3_edge, Llama-style text model with relu² MLP), and their ``generate`` (greedy / sampling with
``RepetitionPenaltyLogitsProcessor`` → temperature → top-k → top-p, stop at eos). No second copy of the text
weights: the reasoner reads ``embed_tokens``, the und layers (``to_q/k/v/out``, ``norm_q/k``, ``mlp``, layer
norms), ``norm`` and ``lm_head`` of the *same* transformer instance the generator uses (``lm_head`` is read from the
checkpoint when the generator loaded the transformer without it). ``k_norm_und_for_gen`` (Edge) is the
generation pathway's and is not used here — ``Cosmos3Transformer.prefill`` returns keys as the *generator* reads
them; this module runs the text tower's own forward, including the last layer, ``norm`` and ``lm_head``. The task
presets (question, caption, expand) are ``tasks.py``'s; the tower's loaders (``load_text_tower``, ``load_lm_head``) are
``model/loader.py``'s.

* ``prefill`` embeds the prompt, scatters the vision tokens over the ``<|image_pad|>``/``<|video_pad|>`` positions
  (Nano: adds the deepstack features after the first decoder layers, as ``Qwen3VLTextModel``), runs the causal
  tower writing every layer's K/V into a preallocated static cache ``[layers, kv_heads, max_len, head_dim]`` and
  returns the last position's logits.
* ``decode_step`` runs one token with static shapes: the cache slot and the mRoPE cursor are 0-dim tensors, the
  RoPE rotation is looked up in the cache's table, each layer (``decode_layer``) writes K/V with ``index_copy_`` and
  attends over the whole cache under a mask (attention.py's decode route: grouped heads, no expanded copy), each
  projection one GEMV (``decode_weights``: gemv.py's Triton kernel on CUDA, q/k/v and gate/up packed) — no
  ``.item()``, so the step can be ``torch.compile``d (``RuntimeOptions.compile``) and CUDA-graph captured. Positions
  past the prompt are ``max(prompt positions) + 1 + i`` on all three axes (transformers' ``rope_deltas``).
* ``generate_ids`` advances the cursor in place after each step, and for greedy decoding picks the token (penalty,
  argmax, ``seen`` update) inside the step too, so on CUDA one graph replay per token does all of it; a random draw
  stays outside the graph (the generator's state is not captured).
* Norms use transformers' rounding (``weight * normed.to(input dtype)``), identical to the generator's in fp32.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from .. import defaults
from ..config import Cosmos3Config
from ..kernels.attention import attention
from ..kernels.compile import compiled
from ..kernels.cuda_graph import GraphedCall
from ..kernels.packed import LayerWeights, packed_weight, plain_weight
from ..model.layers import project, transformers_rms_norm
from ..model.loader import load_lm_head, load_text_tower
from ..model.rope import apply_rope, rope_tables
from ..model.towers import tower_module
from ..model.transformer import Cosmos3Transformer, text_layer_output, text_qkv
from ..runtime import DEFAULT, RuntimeOptions
from .tasks import build_messages, postprocess
from .vision import (
    PreparedPrompt,
    VisionEncoder,
    VisionFeatures,
    checkpoint_family,
    has_vision_encoder,
    load_processor,
    load_vision_encoder,
    prepare_prompt,
    special_token_ids,
)

DEFAULT_MAX_CONTEXT = 32768  # tokens; the cache is allocated per call at the size needed (multiple of 256)
_CACHE_ROUND = 256

@dataclass(frozen=True)
class SamplingParams:
    """``temperature == 0`` is greedy (top-k/top-p ignored); ``top_k == 0`` / ``top_p == 1`` disable those filters."""

    max_new_tokens: int = 512
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int = 0

    def validate(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {self.max_new_tokens!r}.")
        for name in ("temperature", "top_p", "repetition_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}.")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}.")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}.")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= defaults.MAX_SEED:
            raise ValueError(f"seed={self.seed!r} must be an integer from 0 to 2**64-1.")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty!r}.")


@dataclass
class ReasonerOutput:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    stop_reason: str  # "eos" | "length" | "cancelled"


class StaticKVCache:
    """Preallocated per-layer keys/values ``[layers, kv_heads, max_len, head_dim]`` (RoPE'd keys, text tower's own),
    and the RoPE table ``[2 (cos, sin), max_len, head_dim]`` of text positions ``0..max_len-1`` (a generated token
    sits at the same mRoPE position on all three axes), so a decode step looks its rotation up by index."""

    def __init__(self, config: Cosmos3Config, max_len: int, dtype: torch.dtype, device: torch.device):
        shape = (config.num_hidden_layers, config.num_key_value_heads, max_len, config.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.positions = torch.arange(max_len, device=device)
        self.rope = torch.stack(rope_tables(self.positions.expand(3, -1), config, dtype, device))

    @property
    def max_len(self) -> int:
        return self.keys.shape[2]

    def fits(self, n: int, dtype: torch.dtype, device: torch.device) -> bool:
        return n <= self.max_len and self.keys.dtype == dtype and self.keys.device == device


def process_logits(logits: torch.Tensor, seen: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """transformers' processors in generate's order: repetition penalty (over ``seen`` = prompt + generated ids),
    then, when sampling, temperature, top-k, top-p. fp32 ``logits [V]`` → filtered logits (static shapes)."""
    if params.repetition_penalty != 1.0:
        penalized = torch.where(logits < 0, logits * params.repetition_penalty, logits / params.repetition_penalty)
        logits = torch.where(seen, penalized, logits)
    if params.temperature == 0:
        return logits
    logits = logits / params.temperature
    if params.top_k > 0:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1])).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False)
        remove = sorted_logits.softmax(-1).cumsum(-1) <= (1 - params.top_p)
        remove[-1] = False  # keep at least one token
        logits = logits.masked_fill(remove.scatter(0, order, remove), float("-inf"))
    return logits


def sample_token(logits: torch.Tensor, seen: torch.Tensor, params: SamplingParams,
                 generator: torch.Generator | None) -> torch.Tensor:
    """Next token ``[1]``: argmax when greedy, else a draw from the filtered distribution. No host sync."""
    logits = process_logits(logits, seen, params)
    if params.temperature == 0:
        return logits.argmax(-1, keepdim=True)
    probs = logits.softmax(-1)
    noise = torch.empty_like(probs).exponential_(generator=generator)  # argmax(p / Exp(1)) ~ Categorical(p)
    return (probs / noise).argmax(-1, keepdim=True)


def rope_qkv(layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, weights: LayerWeights | None = None):
    """A text-tower layer's q, k (RoPE applied) and v over ``h`` ``[L, D]``, with transformers' norm rounding."""
    q, k, v = text_qkv(layer, h, transformers_rms_norm, weights)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def layer_output(layer, h: torch.Tensor, attn_out: torch.Tensor, weights: LayerWeights | None = None) -> torch.Tensor:
    """A text-tower layer's output given its attention output ``[L, H·hd]`` (transformers' norm rounding)."""
    return text_layer_output(layer, h, attn_out, transformers_rms_norm, weights)


def decode_layer(layer, h: torch.Tensor, rope: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                 slot: torch.Tensor, mask: torch.Tensor, weights: LayerWeights | None = None,
                 attention_backend: str = "auto") -> torch.Tensor:
    """One text-tower layer for one token ``h`` ``[1, D]``: writes its RoPE'd key and value at ``slot`` (``[1]``) of
    this layer's cache ``keys``/``values`` ``[KV, max_len, hd]`` and attends over the cache under ``mask``
    ``[max_len]``; ``rope`` ``[2, 1, hd]`` is the token's cos/sin; ``weights`` the layer's projections for GEMVs
    (``decode_weights``) or None; ``attention_backend`` the run's attention route. A function of tensors and the
    layer alone, so one ``torch.compile`` of it serves every layer (``RuntimeOptions.compile``).

    The layer runs on ``[1, 1, D]`` rows, as transformers' ``[batch, length, D]``: each projection then ends in a
    view, so inductor keeps every residual add a separate element-wise rounding, as eager does, instead of folding a
    2-D ``h + x @ W.T`` into ``addmm`` (one rounding where the reference has two, and on CUDA a copy of ``h`` into
    the output before each such GEMV)."""
    h = h.view(1, 1, -1)
    q, k, v = rope_qkv(layer, h, rope[0], rope[1], weights)
    keys.index_copy_(1, slot, k.transpose(0, 1))
    values.index_copy_(1, slot, v.transpose(0, 1))
    out = attention(q.transpose(0, 1)[None], keys[None], values[None], mask=mask.view(1, 1, 1, -1),
                    backend=attention_backend)
    return layer_output(layer, h, out[0].transpose(0, 1).reshape(1, 1, -1), weights).view(1, -1)


def decode_weights(transformer: Cosmos3Transformer, route: str = "auto") -> list[LayerWeights]:
    """Per text-tower layer, the weights a batch-1 decode step reads with one GEMV each (gemv.py): ``to_q/to_k/to_v``
    and (SiLU MLP) ``gate_proj/up_proj`` packed into one matrix each (packed.py: views over the layer's own weights,
    packing them in place the first time), ``to_out``, ``up_proj`` (relu² MLP) and ``down_proj`` as stored; None
    where a module cannot be read that way (it then runs itself), all read on the GEMV ``route``
    (``RuntimeOptions.gemv``). docs/benchmark-log.md has the measured effect."""
    out = []
    for layer in transformer.layers:
        attn, mlp = layer.self_attn, layer.mlp
        silu = mlp.act == "silu"
        out.append(LayerWeights(
            qkv=packed_weight([attn.to_q, attn.to_k, attn.to_v]),
            gate_up=packed_weight([mlp.gate_proj, mlp.up_proj]) if silu else None,
            o=plain_weight(attn.to_out), up=None if silu else plain_weight(mlp.up_proj),
            down=plain_weight(mlp.down_proj), route=route))
    return out


def _eos_ids(checkpoint_dir: Path | None, tokenizer) -> list[int]:
    ids = []
    path = None if checkpoint_dir is None else checkpoint_dir / "generation_config.json"
    if path is not None and path.is_file():
        value = json.loads(path.read_text()).get("eos_token_id")
        ids += value if isinstance(value, list) else [value] if isinstance(value, int) else []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return sorted(set(ids))


@dataclass
class _Decode:
    """One decode's state: the tokens ``seen`` (the repetition penalty's), the sampling generator and ``step``, the
    model after a token — its logits, or where ``in_step`` the greedy pick itself (``Cosmos3Reasoner._decode``)."""

    seen: torch.Tensor
    params: SamplingParams
    gen: torch.Generator | None
    step: Callable[[torch.Tensor], torch.Tensor]
    in_step: bool

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        """The token ``logits`` give under ``params``, marked seen."""
        token = sample_token(logits, self.seen, self.params, self.gen)
        self.seen.index_fill_(0, token, True)
        return token

    def next(self, token: torch.Tensor) -> torch.Tensor:
        """The token after ``token``."""
        return self.step(token) if self.in_step else self.pick(self.step(token))


class Cosmos3Reasoner:
    """Causal VLM over a ``Cosmos3Transformer``'s understanding tower (see the module docstring)."""

    def __init__(self, transformer: Cosmos3Transformer, processor, *, checkpoint_dir: str | Path | None = None,
                 vision: VisionEncoder | None = None, lm_head: nn.Module | None = None,
                 eos_token_ids: Sequence[int] | None = None, max_context: int = DEFAULT_MAX_CONTEXT,
                 family: str | None = None):
        self.transformer = transformer
        self.config = transformer.config
        self.processor = processor
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.family = family or ("edge" if self.config.hidden_act == "relu2" else "nano")
        self._vision = vision
        if transformer.lm_head is not None:
            self.lm_head = transformer.lm_head
        elif lm_head is not None:
            self.lm_head = lm_head
        elif self.checkpoint_dir is not None:
            w = transformer.embed_tokens.weight
            self.lm_head = load_lm_head(self.checkpoint_dir, self.config, w.dtype, w.device)
        else:
            raise ValueError("Cosmos3Reasoner: the transformer has no lm_head; pass lm_head= or checkpoint_dir=.")
        self.eos_token_ids = list(eos_token_ids) if eos_token_ids is not None else _eos_ids(
            self.checkpoint_dir, processor.tokenizer)
        self.max_context = int(max_context)
        self.graph_sampling = True  # greedy picks happen inside the decode step (inside the graph)
        self.pack_projections = True  # decode reads each projection by one GEMV, q/k/v and gate/up packed (packed.py)
        self.special = special_token_ids(processor, strict=False)
        self.cache: StaticKVCache | None = None

    # ------------------------------------------------------------------ loading / placement
    @classmethod
    def load(cls, checkpoint_dir: str | Path, *, dtype: torch.dtype = torch.bfloat16, device="cpu",
             transformer: Cosmos3Transformer | None = None,
             max_context: int = DEFAULT_MAX_CONTEXT) -> "Cosmos3Reasoner":
        """Reasoner for a checkpoint folder; with ``transformer=`` it shares that (generator's) instance."""
        root = Path(checkpoint_dir)
        if transformer is None:
            transformer = load_text_tower(root, dtype=dtype, device=device)
        return cls(transformer, load_processor(root, checkpoint_family(root)), checkpoint_dir=root,
                   max_context=max_context)

    @property
    def device(self) -> torch.device:
        return self.transformer.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.transformer.embed_tokens.weight.dtype

    @property
    def has_vision(self) -> bool:
        return self._vision is not None or (self.checkpoint_dir is not None and has_vision_encoder(self.checkpoint_dir))

    def vision_encoder(self) -> VisionEncoder:
        """The vision tower, loaded from ``vision_encoder/`` on first use and kept on the text tower's device."""
        if self._vision is None:
            if not self.has_vision:
                where = self.checkpoint_dir or "this checkpoint"
                raise ValueError(f"{where} has no vision_encoder/ folder, so the reasoner cannot look at images or "
                                 "video; download the whole repository or drop the image/video input.")
            self._vision = load_vision_encoder(self.checkpoint_dir, self.dtype, self.device, self.family)
        if self._vision.device != self.device:
            self._vision.to(self.device)
        return self._vision

    def offload(self, device: torch.device | str = "cpu") -> None:
        """Move what the reasoner owns (vision tower, a separately loaded ``lm_head``, the cache) off the GPU."""
        if self._vision is not None:
            self._vision.to(device)
        if self.lm_head is not self.transformer.lm_head:
            self.lm_head.to(device)
        self.cache = None

    def _sync_devices(self) -> None:
        if self.lm_head.weight.device != self.device:
            self.lm_head.to(self.device)

    def _ensure_cache(self, needed: int) -> StaticKVCache:
        if self.cache is None or not self.cache.fits(needed, self.dtype, self.device):
            size = min(self.max_context, -(-needed // _CACHE_ROUND) * _CACHE_ROUND)
            self.cache = StaticKVCache(self.config, size, self.dtype, self.device)
        return self.cache

    # ------------------------------------------------------------------ the text tower
    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[N, hd]`` for mRoPE ids ``[3, N]`` (the generator's tables: rope.py)."""
        return rope_tables(positions, self.config, self.dtype, self.device)

    def _logits(self, h: torch.Tensor, route: str = "auto") -> torch.Tensor:
        x = transformers_rms_norm(self.transformer.norm, h)
        return project(self.lm_head, x, plain_weight(self.lm_head), route).float()  # one row (a decode step): a GEMV

    def embed(self, prompt: PreparedPrompt) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
        """Input embeddings ``[L, D]`` with vision tokens scattered in; visual positions and deepstack features."""
        ids = prompt.input_ids.to(self.device)
        h = self.transformer.embed_tokens(ids)
        visual_pos, deepstack = [], []
        for kind, pixels, grid in (("image", prompt.pixel_values, prompt.image_grid_thw),
                                   ("video", prompt.pixel_values_videos, prompt.video_grid_thw)):
            if pixels is None:
                continue
            feats: VisionFeatures = self.vision_encoder()(pixels, grid)
            pos = (ids == self.special[kind]).nonzero().view(-1)
            if pos.numel() != feats.embeds.shape[0]:
                raise ValueError(f"the prompt has {pos.numel()} {kind} placeholder tokens but the vision encoder "
                                 f"produced {feats.embeds.shape[0]} tokens.")
            h = h.index_copy(0, pos, feats.embeds.to(h.dtype))
            visual_pos.append(pos)
            deepstack.append(feats.deepstack)
        if not visual_pos:
            return h, None, []
        pos = torch.cat(visual_pos)
        layers = [torch.cat(f).to(h.dtype) for f in zip(*deepstack)] if all(deepstack) else []
        return h, pos, layers

    @torch.no_grad()
    def prefill(self, prompt: PreparedPrompt, *, all_logits: bool = False, cache_len: int | None = None,
                options: RuntimeOptions = DEFAULT) -> torch.Tensor:
        """Run the prompt through the tower, fill the static cache ``[:L]``; logits of the last (or every) position."""
        n = prompt.length
        if n == 0:
            raise ValueError("the prompt has no tokens.")
        if n >= self.max_context:
            raise ValueError(f"the prompt is {n} tokens after chat formatting and vision tokens, over the reasoner's "
                             f"context of {self.max_context}; shorten it or use a smaller image / shorter video.")
        self._sync_devices()
        cache = self._ensure_cache(max(n + 1, cache_len or 0))
        h, visual_pos, deepstack = self.embed(prompt)
        cos, sin = self._rope(prompt.position_ids.to(self.device))
        for i, layer in enumerate(self.transformer.layers):
            q, k, v = rope_qkv(layer, h, cos, sin)
            cache.keys[i, :, :n] = k.transpose(0, 1)
            cache.values[i, :, :n] = v.transpose(0, 1)
            out = attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], causal=True,
                            backend=options.attention)
            h = layer_output(layer, h, out[0].transpose(0, 1).reshape(n, -1))
            if i < len(deepstack):  # Qwen3VLTextModel._deepstack_process
                h = h.index_add(0, visual_pos, deepstack[i])
        logits = self._logits(h if all_logits else h[-1:])
        return logits if all_logits else logits[0]

    @torch.no_grad()
    def decode_step(self, token: torch.Tensor, cache_index: torch.Tensor, rope_position: torch.Tensor,
                    weights: Sequence[LayerWeights] | None = None, options: RuntimeOptions = DEFAULT) -> torch.Tensor:
        """One token ``[1]`` at cache slot ``cache_index``, mRoPE position ``rope_position`` (0-dim) → logits.
        ``weights``: ``decode_weights(self.transformer)`` taken for this generation (None: module by module).
        ``options.compile``: each layer through one ``torch.compile``d ``decode_layer`` (whole graph: it fuses the
        norms, RoPE, cache writes, softmax and SiLU·mul around the GEMMs; Nano 123 → 210 tokens/s, Edge 265 → 564
        on an H200 with the Triton GEMV, BENCHMARKS.md)."""
        cache = self.cache
        h = self.transformer.embed_tokens(token.view(1))
        rope = cache.rope.index_select(1, rope_position.view(1))
        slot = cache_index.view(1)
        mask = cache.positions <= cache_index
        layer_fn = (compiled(decode_layer, aot=False, fullgraph=True, backend=options.compile_backend)
                    if options.compiles else decode_layer)
        for i, layer in enumerate(self.transformer.layers):
            h = layer_fn(layer, h, rope, cache.keys[i], cache.values[i], slot, mask,
                         weights[i] if weights is not None else None, options.attention)
        return self._logits(h, options.gemv)[0]

    # ------------------------------------------------------------------ prompts and generation
    def prepare(self, prompt: str, *, task: str = "question", image=None, video=None, fps: float | None = None,
                system_prompt: str | None = None) -> PreparedPrompt:
        """Render a task preset (``question`` | ``caption`` | ``expand``) with the checkpoint's chat template.

        A prompt holding a chat control token (``<|image_pad|>``, ``<|im_start|>`` …) is refused, not tokenized as
        text: the processor expands ``<|image_pad|>``/``<|video_pad|>`` by string replacement before tokenizing, so
        a typed one would be taken for a real media placeholder (and ``<|im_start|>`` for a new chat turn)."""
        from ..sampling.prompt import check_text, control_tokens_in

        check_text(prompt, "prompt")
        typed = control_tokens_in(self.processor.tokenizer, prompt)
        if typed:
            raise ValueError(f"the prompt contains the chat control token(s) {typed}; the reasoner would read them as "
                             "real image/video placeholders or chat turns. Remove them from the prompt.")
        if image is not None or video is not None:
            if not self.has_vision:
                self.vision_encoder()  # raises the clear "no vision_encoder/" error
            special_token_ids(self.processor)  # raises if the tokenizer has no placeholder tokens
        if video is not None and fps is None:
            raise ValueError("a video input needs its fps (frames per second) for the frame timestamps.")
        messages = build_messages(task, prompt, has_image=image is not None, has_video=video is not None,
                                  system_prompt=system_prompt)
        merge = int(getattr(self.processor.image_processor, "merge_size", 2))
        return prepare_prompt(self.processor, messages, images=[image] if image is not None else [],
                              videos=[(video, fps)] if video is not None else [], spatial_merge_size=merge)

    @torch.no_grad()
    def generate_ids(self, prompt: PreparedPrompt, params: SamplingParams = SamplingParams(), *,
                     should_stop: Callable[[], bool] | None = None,
                     callback: Callable[[int, int], None] | None = None, check_every: int = 4,
                     options: RuntimeOptions = DEFAULT) -> tuple[list[int], str]:
        """Token ids after the prompt (eos excluded) and the stop reason. ``should_stop``/``callback(done, total)``
        are called every ``check_every`` tokens — the only host syncs of the loop. ``options``: the run's kernels
        (runtime.py: attention and GEMV routes, compiled decode layer, CUDA graphs)."""
        params.validate()
        options = options.on(self.device)  # compile="auto" depends on the device
        if options.compiles:
            from ..kernels.compile import prepared

            prepared()
        total = min(params.max_new_tokens, self.max_context - prompt.length)
        logits = self.prefill(prompt, cache_len=prompt.length + total, options=options)
        if prompt.next_position + total > self.cache.max_len:  # the RoPE table covers positions < max_len
            raise ValueError(f"prompt position {prompt.next_position} + {total} new tokens exceeds the cache of "
                             f"{self.cache.max_len}; lower max_new_tokens.")
        decode = self._decode(prompt, params, options, vocab=logits.shape[-1])
        out = torch.full((total,), -1, dtype=torch.long, device=self.device)
        token, done, reason = decode.pick(logits), 0, "length"
        for step in range(total):
            out[step:step + 1] = token
            done = step + 1
            if done % check_every == 0 or done == total:
                host = out[:done].tolist()
                if any(t in self.eos_token_ids for t in host):
                    reason = "eos"
                    break
                if callback is not None:
                    callback(done, total)
                if should_stop is not None and should_stop():
                    reason = "cancelled"
                    break
            if done == total:
                break
            token = decode.next(token)
        ids = out[:done].tolist()
        for i, t in enumerate(ids):
            if t in self.eos_token_ids:
                return ids[:i], "eos"
        return ids, reason

    def _decode(self, prompt: PreparedPrompt, params: SamplingParams, options: RuntimeOptions,
                vocab: int) -> "_Decode":
        """The decode after ``prompt``'s prefill: the cursor over the static cache, the tokens seen, and the step —
        on CUDA one graph over the static cache (batch-1 decode is launch-bound, ~500 kernels a token), but only with
        the whole tower resident (a model manager streaming weights from the CPU cannot be captured). Greedy picks
        are part of the step; a random draw stays outside (its generator state is not captured)."""
        device = self.device
        seen = torch.zeros(vocab, dtype=torch.bool, device=device)
        seen[prompt.input_ids.to(device).clamp(0, vocab - 1)] = True
        gen = torch.Generator(device=device).manual_seed(int(params.seed)) if params.temperature > 0 else None
        cache_index = torch.tensor(prompt.length, device=device)  # the decode cursor, advanced in place by `advance`
        rope_position = torch.tensor(prompt.next_position, device=device)
        # each projection (group) read by one GEMV (views over the weights; dropped when the decode is, so a host
        # that moves the weights afterwards frees their old storage)
        weights = decode_weights(self.transformer, options.gemv) if self.pack_projections else None

        def advance(token: torch.Tensor) -> torch.Tensor:
            """Logits after ``token``; the cursor moves on by one (in place: inside the graph when captured)."""
            logits = self.decode_step(token, cache_index, rope_position, weights, options)
            cache_index.add_(1)
            rope_position.add_(1)
            return logits

        def advance_greedy(token: torch.Tensor) -> torch.Tensor:
            """``advance`` and the greedy pick (repetition penalty over ``seen``, argmax), marking it seen."""
            picked = sample_token(advance(token), seen, params, None)
            seen.index_fill_(0, picked, True)
            return picked

        resident = all(p.device == device for p in tower_module(self.transformer, "text").parameters())
        graphs = options.cuda_graphs and device.type == "cuda" and resident
        in_step = params.temperature == 0 and self.graph_sampling
        fn = advance_greedy if in_step else advance
        return _Decode(seen, params, gen, GraphedCall(fn) if graphs else fn, in_step)

    def generate(self, prompt: str, *, task: str = "question", image=None, video=None, fps: float | None = None,
                 params: SamplingParams = SamplingParams(), should_stop: Callable[[], bool] | None = None,
                 callback: Callable[[int, int], None] | None = None,
                 system_prompt: str | None = None, options: RuntimeOptions = DEFAULT) -> ReasonerOutput:
        """Answer / caption / expand: render, prefill, decode, detokenize (``expand`` returns the JSON object)."""
        prepared = self.prepare(prompt, task=task, image=image, video=video, fps=fps, system_prompt=system_prompt)
        ids, reason = self.generate_ids(prepared, params, should_stop=should_stop, callback=callback,
                                        options=options)
        text = self.processor.tokenizer.decode(ids, skip_special_tokens=True)
        return ReasonerOutput(postprocess(task, text), ids, prepared.length, reason)


__all__ = ["Cosmos3Reasoner", "ReasonerOutput", "SamplingParams", "StaticKVCache", "decode_layer", "process_logits",
           "sample_token"]
