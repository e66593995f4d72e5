"""EAGLE-3 drafter: fused target features + one decoder layer + a reduced draft vocabulary.

Shape notation: see models/kv_cache.py, plus Vt target vocab, Vd draft vocab, F feature width
(3D for fused target features, D for the drafter's own hidden state).

Architecture, as vLLM (`vllm/model_executor/models/llama_eagle3.py`) and SGLang
(`python/sglang/srt/models/llama_eagle3.py`) run EAGLE-3 checkpoints:

    fused_BxTxD = fc(concat(low, mid, high))            # Linear 3D -> D, no bias
    x_BxTx2D    = concat(input_norm(embed(tokens)), hidden_norm(h))   # embeds first
    h'          = h + o_proj(attention(x))              # q/k/v read 2D, o_proj writes D
    h'          = h' + mlp(post_attn_norm(h'))
    logits      = lm_head(final_norm(h'))               # over the Vd draft ids

The residual is the *un-normed* input hidden state h (vLLM's default `norm_before_residual`
false). `h'` (before the final norm) is what EAGLE-3 feeds back as `h` at later draft steps.

Fused layers: EAGLE-3 (SafeAILab/EAGLE `modeling_llama_kv.py`, vLLM
`get_eagle3_aux_hidden_state_layers`, SGLang `set_eagle3_layers_to_capture`) captures the
residual stream *entering* layers 2, L//2 and L-3. `Decoder(hidden_layers=...)` returns layer
*outputs*, so the same features are hidden_layers (1, L//2 - 1, L - 4): (1, 14, 26) for
SmolLM2's 30 layers (SpecForge writes the same default as output indices).

Alignment (vLLM `EagleProposer.propose`: token ids shifted left by one, positions and hidden
states not): row p pairs the features of target position p with the token at p + 1 (the one
those features predicted), uses RoPE position p, and predicts the token at p + 2. Later draft
steps repeat this with the previous step's out_hidden at the next position.

Draft vocabulary (EAGLE-3 convention): draft id d is target id d + d2t[d]; t2d[v] says whether
target id v has a draft id. Draft ids are the chosen target ids in increasing order.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np

from asd_jax.request_checks import ParamShapes, param_shapes
from models.config import DTYPES, ModelConfig, RopeScaling, rope_inverse_frequencies
from models.cached_attention import BlockMask, block_mask
from models.few_rows_matmul import few_rows_matmul
from models.kv_cache import KVCache
from models.llama import MLP, Attention, RMSNorm, chain_visibility, linear
from models.lm_fns import ARCHITECTURES_KEPT

_F32 = jnp.float32
MASKED_LOGIT = -1e30  # finite, so 0 * logit stays 0 in regret/probability arithmetic


def eagle3_default_layers(num_layers: int) -> tuple[int, int, int]:
  """EAGLE-3's low/mid/high features as `Decoder` hidden_layers (outputs of layers)."""
  return (1, num_layers // 2 - 1, num_layers - 4)


@dataclasses.dataclass(frozen=True)
class Eagle3Config:
  """Static description of an EAGLE-3 drafter for one target (hashable; static under jit)."""

  hidden_size: int  # D: the target's width, which is also the drafter's
  target_vocab_size: int  # Vt
  draft_vocab_size: int  # Vd <= Vt
  num_heads: int
  num_kv_heads: int
  head_dim: int
  intermediate_size: int
  target_num_layers: int
  fused_layers: tuple[int, ...] | None = None  # `Decoder` hidden_layers; None: EAGLE-3 default
  rms_norm_eps: float = 1e-5
  rope_theta: float = 10000.0
  rope_scaling: RopeScaling | None = None
  max_position_embeddings: int = 8192
  dtype: str = "float32"

  def __post_init__(self):
    if self.dtype not in DTYPES:
      raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
    layers = (eagle3_default_layers(self.target_num_layers) if self.fused_layers is None
              else tuple(int(i) for i in self.fused_layers))
    object.__setattr__(self, "fused_layers", layers)  # normalise lists to a hashable tuple
    if len(layers) != 3 or list(layers) != sorted(layers) or not all(
        -1 <= i < self.target_num_layers for i in layers):
      raise ValueError(f"fused_layers must be 3 ascending layer indices in [-1, "
                       f"{self.target_num_layers - 1}] (ascending: the checkpoint layout "
                       f"concatenates low, mid, high), got {layers}")
    if not 0 < self.draft_vocab_size <= self.target_vocab_size:
      raise ValueError(f"draft_vocab_size={self.draft_vocab_size} must be in "
                       f"[1, target_vocab_size={self.target_vocab_size}]")
    self.layer_config()  # validates heads / sizes

  @classmethod
  def for_target(cls, target: ModelConfig, draft_vocab_size: int | None = None,
                 fused_layers: tuple[int, ...] | None = None, dtype: str | None = None,
                 **overrides) -> "Eagle3Config":
    """A drafter whose layer has the target layer's shape, RoPE and norm epsilon."""
    return cls(hidden_size=target.hidden_size, target_vocab_size=target.vocab_size,
               draft_vocab_size=draft_vocab_size or target.vocab_size,
               num_heads=target.num_heads, num_kv_heads=target.num_kv_heads,
               head_dim=target.head_dim, intermediate_size=target.intermediate_size,
               target_num_layers=target.num_layers, fused_layers=fused_layers,
               rms_norm_eps=target.rms_norm_eps, rope_theta=target.rope_theta,
               rope_scaling=target.rope_scaling,
               max_position_embeddings=target.max_position_embeddings,
               dtype=dtype or target.dtype, **overrides)

  def layer_config(self) -> ModelConfig:
    """The one-layer Llama config of the drafter's layer (and of its KV cache)."""
    return ModelConfig(
        vocab_size=self.target_vocab_size, hidden_size=self.hidden_size,
        intermediate_size=self.intermediate_size, num_layers=1, num_heads=self.num_heads,
        num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, rope_theta=self.rope_theta,
        rms_norm_eps=self.rms_norm_eps, tie_embeddings=False, rope_scaling=self.rope_scaling,
        max_position_embeddings=self.max_position_embeddings, dtype=self.dtype)

  def with_dtype(self, dtype: str) -> "Eagle3Config":
    return dataclasses.replace(self, dtype=dtype)


class _WideInputAttention(Attention):
  """Llama attention whose q/k/v read the 2D-wide [embeds; hidden] input; o_proj writes D."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    super().__init__(dataclasses.replace(cfg, hidden_size=2 * cfg.hidden_size), rngs)
    self.o_proj = linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, jnp.dtype(cfg.dtype),
                         rngs)


class Eagle3Layer(nnx.Module):
  """EAGLE-3's `midlayer`."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    dtype = jnp.dtype(cfg.dtype)
    self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
    self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
    self.attn = _WideInputAttention(cfg, rngs)
    self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
    self.mlp = MLP(cfg, rngs)

  def __call__(self, embeds_BxTxD, hidden_BxTxD, positions_BxT, mask: BlockMask, k_cache,
               v_cache, slots_BxT, inv_freq):
    x_BxTx2D = jnp.concatenate([self.input_norm(embeds_BxTxD), self.hidden_norm(hidden_BxTxD)],
                               axis=-1)
    attn_out, k_cache, v_cache = self.attn(x_BxTx2D, positions_BxT, mask, k_cache, v_cache,
                                           slots_BxT, inv_freq)
    h_BxTxD = hidden_BxTxD + attn_out
    h_BxTxD = h_BxTxD + self.mlp(self.post_attn_norm(h_BxTxD))
    return h_BxTxD, k_cache, v_cache


class Eagle3Drafter(nnx.Module):
  """The EAGLE-3 drafter. Use `eagle3_fns` (pure functions over its state) inside jit.

  `embed` is the target's token embedding; checkpoints do not store it by default and the
  loader hands this module the target's buffer.
  """

  def __init__(self, cfg: Eagle3Config, rngs: nnx.Rngs):
    self.cfg = cfg
    layer_cfg = cfg.layer_config()
    dtype = jnp.dtype(cfg.dtype)
    d = cfg.hidden_size
    self.embed = nnx.Embed(cfg.target_vocab_size, d, dtype=dtype, param_dtype=dtype,
                           embedding_init=nnx.initializers.normal(0.02), rngs=rngs)
    self.fc = linear(3 * d, d, dtype, rngs)
    self.layer = Eagle3Layer(layer_cfg, rngs)
    self.final_norm = RMSNorm(d, cfg.rms_norm_eps, dtype)
    self.lm_head = linear(d, cfg.draft_vocab_size, dtype, rngs)
    # Identity map until a frequency-ranked one is set: draft ids = the lowest Vd target ids.
    self.d2t = nnx.Variable(jnp.zeros((cfg.draft_vocab_size,), jnp.int32))
    self.t2d = nnx.Variable(jnp.arange(cfg.target_vocab_size) < cfg.draft_vocab_size)
    self.inv_freq = nnx.Variable(jnp.asarray(rope_inverse_frequencies(layer_cfg), _F32))

  def fuse(self, features_BxTxF) -> jax.Array:
    """Target features [B, T, 3D] (or the Decoder's hidden [B, T, 3, D]) -> fused [B, T, D]."""
    if features_BxTxF.ndim == 4:
      features_BxTxF = features_BxTxF.reshape(*features_BxTxF.shape[:2], -1)
    return self.fc(features_BxTxF.astype(self.fc.kernel.dtype))

  def __call__(self, tokens_BxT, features_BxTxF, positions_BxT, cache: KVCache, *,
               slots_BxT=None, visible_BxTxS=None):
    """Draft logits for T new tokens; writes their K/V into the drafter's 1-layer cache.

    The feature width selects the path (it is static, so this costs nothing under jit):
    F == 3D: fused target features (first draft step after a target forward), passed
    through `fc`; F == D: the drafter's own output hidden state from the previous step.

    Returns (logits float32 [B, T, Vd], out_hidden [B, T, D] before the final norm, cache).
    """
    d = self.cfg.hidden_size
    if features_BxTxF.ndim == 4 or features_BxTxF.shape[-1] == 3 * d:
      hidden_BxTxD = self.fuse(features_BxTxF)
    elif features_BxTxF.shape[-1] == d:
      hidden_BxTxD = features_BxTxF.astype(self.fc.kernel.dtype)
    else:
      raise ValueError(f"features must be [B, T, {3 * d}] (fused target) or [B, T, {d}] "
                       f"(drafter hidden), got {features_BxTxF.shape}")
    if slots_BxT is None:
      slots_BxT = positions_BxT
    if visible_BxTxS is None:
      visible_BxTxS = chain_visibility(slots_BxT, positions_BxT, cache.capacity)
    mask = block_mask(slots_BxT, visible_BxTxS, cache.capacity)
    hidden_BxTxD, k, v = self.layer(self.embed(tokens_BxT), hidden_BxTxD, positions_BxT, mask,
                                    cache.k[0], cache.v[0], slots_BxT, self.inv_freq[...])
    logits_BxTxVd = few_rows_matmul(self.final_norm(hidden_BxTxD), self.lm_head.kernel[...],
                                    preferred_element_type=_F32)
    return logits_BxTxVd, hidden_BxTxD, KVCache(k=(k,), v=(v,))


def init_eagle3(cfg: Eagle3Config, seed: int = 0, target=None) -> Eagle3Drafter:
  """A randomly initialised drafter; with `target` (a Decoder) it holds the target's embedding."""
  model = Eagle3Drafter(cfg, nnx.Rngs(seed))
  if target is not None:
    emb = getattr(target, "model", target).embed.embedding[...]
    if tuple(emb.shape) != (cfg.target_vocab_size, cfg.hidden_size):
      raise ValueError(f"target embedding {tuple(emb.shape)} does not fit this drafter "
                       f"({cfg.target_vocab_size}, {cfg.hidden_size})")
    model.embed.embedding.set_value(jnp.asarray(emb, jnp.dtype(cfg.dtype)))
  return model


@dataclasses.dataclass(frozen=True, eq=False)
class Eagle3Fns:
  """Pure functions of one EAGLE-3 drafter. Hashes by identity (a static jit argument).

  step(params, tokens_BxT, features_BxTxF, positions_BxT, cache, *, slots_BxT=None,
       visible_BxTxS=None) -> (draft_logits_BxTxVd f32, out_hidden_BxTxD, cache)
      `eagle3_step`. F == 3D: fused target features (first step); F == D: own hidden state.
  fuse(params, features_BxTx3D) -> fused_BxTxD
      The `fc` projection alone (`step` applies it itself to 3D-wide features).
  to_target_ids(params, draft_ids) -> target ids (same shape, int32)
  init_cache(batch_size, capacity) -> a 1-layer KVCache
  param_shapes: the arrays the params must have (asd_jax.request_checks.param_shapes).
  """

  step: Callable[..., tuple[jax.Array, jax.Array, KVCache]]
  fuse: Callable[..., jax.Array]
  to_target_ids: Callable[..., jax.Array]
  init_cache: Callable[[int, int], KVCache]
  cfg: Eagle3Config
  param_shapes: tuple | None = None


def eagle3_fns(model: Eagle3Drafter) -> tuple[Eagle3Fns, Any]:
  """Returns (fns, params): pure callables over the drafter and its state (split outside jit).

  Drafters of the same architecture get the same fns object, so the decode loop and the tree
  drafter built on them are reused, not compiled again (models.lm_fns.ARCHITECTURES_KEPT)."""
  graphdef, params = nnx.split(model)
  return _eagle3_fns(graphdef, model.cfg, param_shapes(params)), params


@functools.lru_cache(maxsize=ARCHITECTURES_KEPT)
def _eagle3_fns(graphdef: nnx.GraphDef, cfg: Eagle3Config, shapes: ParamShapes) -> Eagle3Fns:
  def step(params, tokens_BxT, features_BxTxF, positions_BxT, cache, *, slots_BxT=None,
           visible_BxTxS=None):
    return nnx.merge(graphdef, params)(tokens_BxT, features_BxTxF, positions_BxT, cache,
                                       slots_BxT=slots_BxT, visible_BxTxS=visible_BxTxS)

  def fuse(params, features_BxTxF):
    return nnx.merge(graphdef, params).fuse(features_BxTxF)

  def to_target_ids(params, draft_ids):
    return draft_to_target_ids(params["d2t"][...], draft_ids)

  def init_cache(batch_size: int, capacity: int) -> KVCache:
    return KVCache.create(cfg.layer_config(), batch_size, capacity)

  return Eagle3Fns(step=step, fuse=fuse, to_target_ids=to_target_ids, init_cache=init_cache,
                   cfg=cfg, param_shapes=shapes)


def draft_to_target_ids(d2t_Vd: jax.Array, draft_ids: jax.Array) -> jax.Array:
  """Target ids of draft ids (any shape): d + d2t[d]."""
  draft_ids = draft_ids.astype(jnp.int32)
  return draft_ids + d2t_Vd[draft_ids].astype(jnp.int32)


def draft_logits_to_target(d2t_Vd: jax.Array, logits_BxTxVd: jax.Array,
                           target_vocab_size: int) -> jax.Array:
  """Scatters draft-vocab logits onto the target vocabulary; other ids get MASKED_LOGIT.

  For lossless sampling, whose draft distribution must live on the target's ids.
  """
  target_ids_Vd = draft_to_target_ids(d2t_Vd, jnp.arange(d2t_Vd.shape[0]))
  out = jnp.full((*logits_BxTxVd.shape[:-1], target_vocab_size), MASKED_LOGIT,
                 logits_BxTxVd.dtype)
  return out.at[..., target_ids_Vd].set(logits_BxTxVd)


def reduced_vocab_map(counts_Vt, draft_vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
  """The frequency-ranked draft vocabulary: (d2t int64 [Vd], t2d bool [Vt]).

  Keeps the `draft_vocab_size` most frequent target ids (ties: the lower id, so unseen ids
  fill up from the bottom as in EAGLE-3's reference), numbered in increasing id order.
  """
  counts_Vt = np.asarray(counts_Vt)
  if counts_Vt.ndim != 1 or not 0 < draft_vocab_size <= counts_Vt.shape[0]:
    raise ValueError(f"need counts [Vt] and 0 < draft_vocab_size <= Vt; got counts "
                     f"{counts_Vt.shape}, draft_vocab_size={draft_vocab_size}")
  if (counts_Vt < 0).any():
    raise ValueError("token counts must be non-negative")
  kept = np.sort(np.argsort(-counts_Vt, kind="stable")[:draft_vocab_size])
  t2d_Vt = np.zeros(counts_Vt.shape[0], bool)
  t2d_Vt[kept] = True
  return (kept - np.arange(draft_vocab_size)).astype(np.int64), t2d_Vt


def set_vocab_map(model: Eagle3Drafter, d2t_Vd, t2d_Vt) -> None:
  """Installs a draft vocabulary map after checking that d2t and t2d describe the same ids."""
  d2t_Vd, t2d_Vt = np.asarray(d2t_Vd), np.asarray(t2d_Vt, bool)
  check_vocab_map(d2t_Vd, t2d_Vt, model.cfg)
  model.d2t.set_value(jnp.asarray(d2t_Vd, jnp.int32))
  model.t2d.set_value(jnp.asarray(t2d_Vt))


def check_vocab_map(d2t_Vd: np.ndarray, t2d_Vt: np.ndarray, cfg: Eagle3Config) -> None:
  """Raises ValueError unless d2t maps draft ids to distinct target ids, exactly those in t2d."""
  vd, vt = cfg.draft_vocab_size, cfg.target_vocab_size
  if d2t_Vd.shape != (vd,) or t2d_Vt.shape != (vt,):
    raise ValueError(f"d2t must be [{vd}] and t2d [{vt}], got {d2t_Vd.shape}, {t2d_Vt.shape}")
  target = np.arange(vd) + d2t_Vd.astype(np.int64)
  if (target < 0).any() or (target >= vt).any() or len(np.unique(target)) != vd:
    raise ValueError("d2t must map draft ids to distinct target ids in [0, Vt)")
  if not np.array_equal(np.flatnonzero(t2d_Vt), np.sort(target)):
    raise ValueError("t2d does not mark exactly the target ids that d2t maps to")
