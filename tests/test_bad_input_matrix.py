"""One table of bad inputs over the whole public surface: every entry must fail before running,
with the stated exception type and a message that names the problem.

Complements the per-module tables (test_verify_inputs, test_decoder_properties,
test_generate_cli, test_bench_cli, test_train_tiny, test_loaders): this one walks the categories
of issue #9 (empty, too long, out of range, K <= 0, bad budget/gate, bad temperature/top-p,
mismatched vocabularies, bad tree shapes, unknown names, corrupt files) across every entry
point that takes them. CLI entries assert exit code 2 and one `error:` line on stderr.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asd_jax import (ASDConfig, SamplingConfig, TokenStream, apply_sampling_filters, asd_decode,
                     asd_verify, greedy_verify, ngram_drafter, speculative_sample,
                     tree_asd_verify, tree_greedy_verify, typical_verify)
from asd_jax.draft_tree import TreeShape, lm_tree_drafter
from asd_jax.drafter_api import lm_chain_drafter
from asd_jax.plain_decode import plain_decode
from asd_jax.sampling_keys import categorical_rows
from asd_jax.tree_decode import asd_tree_decode
from models.errors import CheckpointError, UnknownModelError
from tests.fake_lm import fake_lm

V = 32
T = fake_lm(V)
D = lm_chain_drafter(fake_lm(V), 2)
D_OTHER_VOCAB = lm_chain_drafter(fake_lm(V + 1), 2)
P = np.array([[1, 2, 3]], np.int32)
N = np.array([3], np.int32)
DRAFT = np.zeros((1, 2), np.int32)
LOGITS = np.zeros((1, 3, V), np.float32)
SPENT = np.zeros(1, np.float32)
PAPER = ASDConfig(8.0, 0.25, 2)


def decode(**kw):
  args = dict(target=T, target_params=None, drafter=D, drafter_params=None, prompt_BxT=P,
              lengths_B=N, max_new_tokens=4)
  args.update(kw)
  return lambda: asd_decode(**args)


def tree_decode(target=None, drafter=None, **kw):
  def run():
    from models.lm_fns import decoder_fns
    from tests.tiny_models import random_decoder
    fns, params = decoder_fns(random_decoder(seed=0, vocab=V, num_layers=1, hidden=16))
    tgt = fns if target is None else target
    if "max_positions" in kw:
      tgt = dataclasses.replace(tgt, max_positions=kw.pop("max_positions"))
    drf = lm_tree_drafter(fns, TreeShape(2, 2, 3)) if drafter is None else drafter
    return asd_tree_decode(tgt, params, drf, params, kw.pop("prompt", P), kw.pop("lengths", N),
                           max_new_tokens=4, **kw)
  return run


def _decoder(seed, hidden, layers=1):
  from models.lm_fns import decoder_fns
  from tests.tiny_models import random_decoder
  return decoder_fns(random_decoder(seed=seed, vocab=V, num_layers=layers, hidden=hidden))


def other_params(engine, which, mismatch):
  """`which` params ("target" or "drafter") of another model: one with another layer count
  ("arrays": a different number of arrays) or another width ("shapes": same arrays, other
  shapes); everything else right."""
  def run():
    fns, params = _decoder(0, 16)
    other = _decoder(1, 16, layers=2)[1] if mismatch == "arrays" else _decoder(1, 32)[1]
    tparams, dparams = (other, params) if which == "target" else (params, other)
    if engine == "plain":
      return plain_decode(fns, tparams, P, N, max_new_tokens=4)
    if engine == "chain":
      return asd_decode(fns, tparams, lm_chain_drafter(fns, 2), dparams, P, N, max_new_tokens=4)
    return asd_tree_decode(fns, tparams, lm_tree_drafter(fns, TreeShape(2, 2, 3)), dparams, P,
                           N, max_new_tokens=4)
  return run


def config_json(**changes):
  """ModelConfig.from_hf_config of a small valid Llama config.json with `changes` applied."""
  from models.config import ModelConfig
  hf = dict(architectures=["LlamaForCausalLM"], vocab_size=V, hidden_size=16,
            intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, rope_theta=10000.0, rms_norm_eps=1e-5,
            max_position_embeddings=64)
  return lambda: ModelConfig.from_hf_config({**hf, **changes})


def drafter_kind(name, kind):
  from models.drafter_setup import check_drafter_request
  return lambda: check_drafter_request(name, kind, None)


API = [
    # --- empty / too long / out of range -------------------------------------------------
    ("decode: empty prompt", decode(lengths_B=np.array([0])), ValueError, "empty prompt"),
    ("decode: empty batch", decode(prompt_BxT=np.zeros((0, 3), np.int32),
                                   lengths_B=np.zeros(0, np.int32)), ValueError, "empty batch"),
    ("decode: prompt too long", decode(capacity=8), ValueError, "cache slots"),
    ("decode: length > width", decode(lengths_B=np.array([4])), ValueError, "exceed"),
    # prompt (3) + max_new_tokens (4) = 7 positions, one past a 6-position context window
    ("decode: past the context window", decode(target=dataclasses.replace(T, max_positions=6)),
     ValueError, "context window"),
    ("plain: past the context window", lambda: plain_decode(
        dataclasses.replace(T, max_positions=6), None, P, N, max_new_tokens=4), ValueError,
     "context window"),
    ("tree decode: past the context window", tree_decode(max_positions=6), ValueError,
     "context window"),
    ("decode: id >= V", decode(prompt_BxT=np.array([[1, V, 3]])), ValueError,
     "outside the vocabulary"),
    ("decode: id < 0", decode(prompt_BxT=np.array([[1, -1, 3]])), ValueError,
     "outside the vocabulary"),
    ("decode: float ids", decode(prompt_BxT=P.astype(np.float32)), TypeError, "integers"),
    ("decode: max_new_tokens 0", decode(max_new_tokens=0), ValueError, "max_new_tokens"),
    ("decode: max_new_B > max", decode(max_new_B=np.array([9])), ValueError, "max_new_B"),
    ("decode: eos id >= V", decode(eos_ids=(V,)), ValueError, "eos id"),
    ("decode: seed per row, wrong count", decode(seed=np.array([1, 2])), ValueError,
     "one per request"),
    # a raw key [0, 42] was read as two per-row seeds for a batch of two
    ("plain: a PRNG key as seed", lambda: plain_decode(
        T, None, np.array([[1, 2], [3, 4]]), np.array([2, 2]), max_new_tokens=2,
        seed=jax.random.PRNGKey(42)), TypeError, "not a JAX PRNG key"),
    ("decode: a typed PRNG key as seed", decode(seed=jax.random.key(0)), TypeError,
     "not a JAX PRNG key"),
    ("decode: ragged prompt rows", decode(prompt_BxT=[[1, 2, 3], [4]], lengths_B=[3, 1]),
     ValueError, "right-pad the rows"),
    ("plain: empty prompt", lambda: plain_decode(T, None, P, np.array([0]), max_new_tokens=2),
     ValueError, "empty prompt"),
    ("plain: prompt too long", lambda: plain_decode(T, None, P, N, max_new_tokens=4,
                                                    capacity=4), ValueError, "cache slots"),
    # per-row limits were broadcast (two outputs for one prompt) or truncated (2.7 -> 2)
    ("plain: max_new_B of two rows for one", lambda: plain_decode(
        T, None, P, N, max_new_tokens=4, max_new_B=np.array([2, 2])), ValueError,
     "max_new_B must be int[1]"),
    ("plain: max_new_B float", lambda: plain_decode(
        T, None, P, N, max_new_tokens=4, max_new_B=np.array([2.7])), ValueError,
     "max_new_B must be int[1]"),
    ("plain: eos ids a string", lambda: plain_decode(T, None, P, N, max_new_tokens=4,
                                                     eos_ids="45"), TypeError, "eos_ids"),
    ("plain: eos id a float", lambda: plain_decode(T, None, P, N, max_new_tokens=4,
                                                   eos_ids=(4.7,)), TypeError, "eos_ids"),
    ("plain: capacity a float", lambda: plain_decode(T, None, P, N, max_new_tokens=4,
                                                     capacity=64.5), ValueError, "capacity"),
    ("plain: max_new_tokens None", lambda: plain_decode(T, None, P, N, max_new_tokens=None),
     ValueError, "max_new_tokens"),
    ("tree decode: max_new_B of two rows for one", tree_decode(max_new_B=np.array([2, 2])),
     ValueError, "max_new_B must be int[1]"),
    ("verify: id >= V", lambda: greedy_verify(np.full((1, 2), V), LOGITS), ValueError,
     "outside the vocabulary"),
    ("asd_verify: id < 0", lambda: asd_verify(np.full((1, 2), -3), LOGITS, SPENT, PAPER),
     ValueError, "outside the vocabulary"),
    # --- K <= 0 -----------------------------------------------------------------------------
    ("drafter: K=0", lambda: lm_chain_drafter(T, 0), ValueError, "K (draft block length)"),
    ("drafter: K<0", lambda: lm_chain_drafter(T, -2), ValueError, "K (draft block length)"),
    ("verify: K=0", lambda: asd_verify(np.zeros((1, 0), np.int32), LOGITS[:, :1], SPENT, PAPER),
     ValueError, "K=0"),
    # --- budget / gate ----------------------------------------------------------------------
    ("ASDConfig: budget<0", lambda: ASDConfig(-1.0, 0.25, 2), ValueError, "budget"),
    ("ASDConfig: budget nan", lambda: ASDConfig(math.nan, 0.25, 2), ValueError, "budget"),
    ("ASDConfig: budget inf", lambda: ASDConfig(math.inf, 0.25, 2), ValueError, "budget"),
    ("ASDConfig: gate<0", lambda: ASDConfig(8.0, -0.5, 2), ValueError, "gate"),
    ("ASDConfig: gate nan", lambda: ASDConfig(8.0, math.nan, 2), ValueError, "gate"),
    ("ASDConfig: M<0", lambda: ASDConfig(8.0, 0.25, -1), ValueError, "max_exceptions"),
    ("ASDConfig: M past int32", lambda: ASDConfig(8.0, 0.25, 2**40), ValueError,
     "max_exceptions must be in [0, 2147483647]"),
    ("ASDConfig: budget past float32", lambda: ASDConfig(1e40, 0.25, 2), ValueError,
     "budget must be finite in float32"),
    ("ASDConfig: gate past float32", lambda: ASDConfig(8.0, 1e39, 2), ValueError,
     "gate must be finite in float32"),
    ("asd_verify: ledger<0", lambda: asd_verify(DRAFT, LOGITS, -SPENT - 1, PAPER), ValueError,
     ">= 0"),
    ("asd_verify: ledger nan", lambda: asd_verify(DRAFT, LOGITS, SPENT + np.nan, PAPER),
     ValueError, "non-finite"),
    ("decode: asd_config not ASDConfig", decode(rule="asd", asd_config={"budget": 1}),
     TypeError, "ASDConfig"),
    # --- temperature / top-k / top-p ----------------------------------------------------------
    ("SamplingConfig: temperature<0", lambda: SamplingConfig(temperature=-0.5), ValueError,
     "temperature"),
    ("SamplingConfig: temperature nan", lambda: SamplingConfig(temperature=math.nan),
     ValueError, "temperature"),
    ("SamplingConfig: top_p 0", lambda: SamplingConfig(top_p=0.0), ValueError, "top_p"),
    ("SamplingConfig: top_p>1", lambda: SamplingConfig(top_p=1.01), ValueError, "top_p"),
    ("SamplingConfig: top_p nan", lambda: SamplingConfig(top_p=math.nan), ValueError, "top_p"),
    ("SamplingConfig: top_k<0", lambda: SamplingConfig(top_k=-1), ValueError, "top_k"),
    ("SamplingConfig: top_k 1.5", lambda: SamplingConfig(top_k=1.5), ValueError, "top_k"),
    ("SamplingConfig: top_p str", lambda: SamplingConfig(top_p="0.9"), ValueError, "top_p"),
    ("SamplingConfig: min_p<0", lambda: SamplingConfig(1.0, min_p=-0.1), ValueError, "min_p"),
    ("SamplingConfig: repetition_penalty 0", lambda: SamplingConfig(repetition_penalty=0.0),
     ValueError, "repetition_penalty"),
    ("SamplingConfig: presence_penalty > 2", lambda: SamplingConfig(presence_penalty=2.1),
     ValueError, "presence_penalty"),
    ("SamplingConfig: min_p>1", lambda: SamplingConfig(1.0, min_p=1.5), ValueError, "min_p"),
    ("SamplingConfig: min_p nan", lambda: SamplingConfig(1.0, min_p=math.nan), ValueError,
     "min_p"),
    # greedy decoding takes the argmax: a filter beside it would be ignored without a word
    ("SamplingConfig: top_k when greedy", lambda: SamplingConfig(top_k=5), ValueError,
     "top_k=5 filters sampling, but temperature 0 is greedy decoding"),
    ("SamplingConfig: top_p and min_p when greedy", lambda: SamplingConfig(top_p=0.9, min_p=0.1),
     ValueError, "top_p=0.9 and min_p=0.1 filter sampling, but temperature 0"),
    ("filters: temperature<0", lambda: apply_sampling_filters(LOGITS, temperature=-1.0),
     ValueError, "temperature"),
    ("filters: top_p 0", lambda: apply_sampling_filters(LOGITS, top_p=0.0), ValueError, "top_p"),
    ("filters: top_p>1", lambda: apply_sampling_filters(LOGITS, top_p=2.0), ValueError, "top_p"),
    ("filters: V=0", lambda: apply_sampling_filters(np.zeros((1, 0), np.float32)), ValueError,
     "logits must be [..., V] with V >= 1, got shape (1, 0)"),
    ("filters: a scalar", lambda: apply_sampling_filters(np.float32(1.0)), ValueError,
     "logits must be [..., V] with V >= 1, got shape ()"),
    ("per-row keys: wrong count", lambda: categorical_rows(
        jax.random.split(jax.random.key(0), 3), np.zeros((2, V), np.float32)), ValueError,
     f"got 3 keys for logits of shape (2, {V})"),
    ("decode: capacity past int32", decode(capacity=2 ** 31), ValueError,
     "capacity=2147483648 exceeds the int32 range"),
    # far above the context window: it tried to allocate the whole cache (277 GB for SmolLM2)
    ("decode: capacity past the context window", decode(
        target=dataclasses.replace(T, max_positions=64), capacity=2 ** 28), ValueError,
     "capacity=268435456 is more than any request to 'fake' can use (128 slots"),
    ("plain decode: capacity past the context window", lambda: plain_decode(
        dataclasses.replace(T, max_positions=64), None, P, N, max_new_tokens=4,
        capacity=2 ** 28), ValueError, "capacity=268435456 is more than any request"),
    ("tree decode: capacity past the context window", tree_decode(
        max_positions=64, capacity=2 ** 28), ValueError,
     "capacity=268435456 is more than any request"),
    ("spec sample: top_p nan", lambda: speculative_sample(
        DRAFT, LOGITS[:, :2], LOGITS, jax.random.key(0), top_p=math.nan), ValueError, "top_p"),
    # a float32 0 (flushed) or inf temperature made every token NaN-scored or equally likely
    ("SamplingConfig: temperature below float32", lambda: SamplingConfig(temperature=1e-40),
     ValueError, "outside float32's normal range"),
    ("typical: temperature above float32", lambda: typical_verify(
        DRAFT, LOGITS, SPENT, temperature=1e39), ValueError, "outside float32's normal range"),
    ("decode: greedy rule with temperature", decode(sampling=SamplingConfig(temperature=1.0)),
     ValueError, "rule='sample'"),
    ("SamplingConfig: min_tokens < 0", lambda: SamplingConfig(min_tokens=-1), ValueError,
     "min_tokens must be an integer >= 0"),
    ("SamplingConfig: logit_bias past 100", lambda: SamplingConfig(logit_bias={1: 101.0}),
     ValueError, "[-100, 100]"),
    ("SamplingConfig: logit_bias nan", lambda: SamplingConfig(logit_bias={1: math.nan}),
     ValueError, "[-100, 100]"),
    ("decode: logit_bias id past the vocabulary", decode(
        sampling=SamplingConfig(logit_bias={V: -1.0})), ValueError, "outside the vocabulary"),
    ("decode: allowed_token_ids past the vocabulary", decode(
        sampling=SamplingConfig(allowed_token_ids=[1, V])), ValueError,
     "allowed_token_ids names token id 32 outside the vocabulary"),
    ("decode: a bad word past the vocabulary", decode(
        sampling=SamplingConfig(bad_words_ids=[(1, V)])), ValueError,
     "bad_words_ids names token id 32 outside the vocabulary"),
    ("SamplingConfig: an empty bad word", lambda: SamplingConfig(bad_words_ids=[()]),
     ValueError, "empty word"),
    ("SamplingConfig: allowed_token_ids empty", lambda: SamplingConfig(allowed_token_ids=()),
     ValueError, "allowed_token_ids is empty"),
    ("tree decode: min_tokens past max_new_tokens", tree_decode(
        sampling=SamplingConfig(min_tokens=99)), ValueError, "is more than max_new_tokens"),
    # --- custom models and drafters that break their contract (named at trace time) ---------
    # a head wider than the declared vocabulary emitted ids past it
    ("plain: logits wider than vocab_size", lambda: plain_decode(
        dataclasses.replace(fake_lm(V + 16), vocab_size=V), None, P, N, max_new_tokens=2),
     ValueError, "prefill returned logits float32[1, 48], the engine needs float[1, 32]"),
    ("decode: logits wider than vocab_size", decode(
        target=dataclasses.replace(fake_lm(V + 16), vocab_size=V)), ValueError,
     "returned logits float32[1, 48]"),
    # these failed as a bare broadcasting TypeError / a dtype-object error in the verifier
    ("decode: drafter proposes K + 2 tokens", decode(drafter=dataclasses.replace(
        D, propose=lambda p, st, *a: (jnp.zeros((1, 4), jnp.int32), None, st))), ValueError,
     "propose returned draft tokens int32[1, 4], the engine needs int[1, 2]"),
    ("decode: sampled drafter without logits", decode(
        drafter=dataclasses.replace(D, propose=lambda p, st, *a: (
            jnp.zeros((1, 2), jnp.int32), None, st)),
        rule="sample", sampling=SamplingConfig(temperature=1.0)), ValueError,
     "propose must return draft logits float[1, 2, 32], got None"),
    # --- mismatched vocabularies ----------------------------------------------------------------
    ("decode: drafter vocab != target vocab", decode(drafter=D_OTHER_VOCAB), ValueError,
     "drafter vocabulary"),
    ("spec sample: draft logits vocab", lambda: speculative_sample(
        DRAFT, np.zeros((1, 2, V + 1), np.float32), LOGITS, jax.random.key(0)), ValueError,
     "draft_logits"),
    ("tree decode: id >= V", tree_decode(prompt=np.array([[1, V + 5]]), lengths=np.array([2])),
     ValueError, "outside the vocabulary"),
    # --- tree shapes ---------------------------------------------------------------------------
    ("TreeShape: nodes > pool", lambda: TreeShape(2, 2, 7), ValueError, "exceeds"),
    ("TreeShape: depth 0", lambda: TreeShape(0, 2, 2), ValueError, "depth"),
    ("TreeShape: NaN depth", lambda: TreeShape(float("nan"), 2, 2), ValueError,
     "tree depth must be a positive integer"),
    ("TreeShape: top_k None", lambda: TreeShape(2, None, 2), ValueError,
     "tree top_k must be a positive integer"),
    ("TreeShape: nodes 2.5", lambda: TreeShape(2, 2, 2.5), ValueError,
     "tree num_nodes must be a positive integer"),
    ("TreeShape: parse", lambda: TreeShape.parse("3,2"), ValueError, "DEPTH,TOPK,NODES"),
    ("tree verify: parents shape", lambda: tree_greedy_verify(
        np.zeros((1, 3), np.int32), np.array([[-1, 0]]), np.zeros((1, 4, V), np.float32)),
     ValueError, "parents must have shape"),
    ("tree verify: not topological", lambda: tree_asd_verify(
        np.zeros((1, 3), np.int32), np.array([[-1, 2, 0]]), np.zeros((1, 4, V), np.float32),
        SPENT, PAPER), ValueError, "topological"),
    ("tree verify: logits rows", lambda: tree_greedy_verify(
        np.zeros((1, 3), np.int32), np.array([[-1, 0, 0]]), np.zeros((1, 3, V), np.float32)),
     ValueError, "target_logits"),
    ("tree decode: chain drafter", tree_decode(drafter=D), TypeError, "TreeDrafter"),
    ("tree decode: not a target", tree_decode(target=object()), TypeError,
     "target must be LanguageModelFns"),
    ("tree decode: target without tree_forward", tree_decode(target=T), ValueError,
     "tree_forward"),
    ("tree drafter: model without tree_forward", lambda: lm_tree_drafter(T, TreeShape(2, 2, 3)),
     ValueError, "tree_forward"),
    ("tree drafter: shape as a tuple", lambda: lm_tree_drafter(_decoder(0, 16)[0], (3, 2, 6)),
     TypeError, "shape must be a TreeShape"),
    ("tree drafter: not a model", lambda: lm_tree_drafter(object(), TreeShape(2, 2, 3)),
     TypeError, "fns must be LanguageModelFns"),
    # these failed late (JAX's bare top_k error) or ran for minutes and gigabytes
    ("tree drafter: top_k above the vocabulary", lambda: lm_tree_drafter(
        _decoder(0, 16)[0], TreeShape(2, V + 1, 3)), ValueError,
     f"tree top_k={V + 1} exceeds the decoder drafter's vocabulary of {V} tokens"),
    ("tree verify: max_depth > N", lambda: tree_greedy_verify(
        np.zeros((1, 3), np.int32), np.array([[-1, 0, 0]]), np.zeros((1, 4, V), np.float32),
        max_depth=2 * 10 ** 8), ValueError, "max_depth=200000000 exceeds the tree's N=3 nodes"),
    ("tree asd verify: max_depth > N", lambda: tree_asd_verify(
        np.zeros((1, 3), np.int32), np.array([[-1, 0, 0]]), np.zeros((1, 4, V), np.float32),
        SPENT, PAPER, max_depth=4), ValueError, "max_depth=4 exceeds"),
    # --- unknown names --------------------------------------------------------------------------
    ("decode: unknown rule", decode(rule="greedyish"), ValueError, "unknown rule"),
    ("decode: not a drafter", decode(drafter=object()), TypeError, "ChainDrafter"),
    ("lm_chain_drafter: not a model", lambda: lm_chain_drafter(object(), 2), TypeError,
     "needs a LanguageModelFns"),
    ("ngram drafter: vocab 0", lambda: ngram_drafter(2, 0), ValueError, "vocab_size"),
    ("ngram drafter: max_ngram past the cap", lambda: ngram_drafter(2, V, max_ngram=10**6),
     ValueError, "above 32"),
    ("TokenStream: not callable", lambda: TokenStream(5), TypeError, "on_tokens must be callable"),
    ("decode: not a target", decode(target=object()), TypeError, "target must be LanguageModelFns"),
    ("decode: sampling a dict", decode(sampling={"temperature": 0}), TypeError,
     "sampling must be a SamplingConfig or a list with one SamplingConfig per prompt row"),
    ("plain: sampling None", lambda: plain_decode(T, None, P, N, max_new_tokens=2, sampling=None),
     TypeError, "sampling must be a SamplingConfig or a list"),
    ("plain: not a model", lambda: plain_decode(None, None, P, N, max_new_tokens=2), TypeError,
     "fns must be LanguageModelFns"),
    # --- config.json values: each refused by field and value, none replaced or truncated ---------
    ("config.json: linear rope without factor", config_json(rope_scaling={"rope_type": "linear"}),
     ValueError, "rope_scaling of type 'linear' needs a 'factor'"),
    ("config.json: 0 heads, no head_dim", config_json(num_attention_heads=0), ValueError,
     "num_attention_heads must be a positive integer, got 0"),
    ("config.json: 0 kv heads", config_json(num_key_value_heads=0), ValueError,
     "num_key_value_heads must be a positive integer, got 0"),
    ("config.json: rope_theta 0", config_json(rope_theta=0), ValueError,
     "rope_theta must be a finite number > 0, got 0.0"),
    ("config.json: rope_theta < 0", config_json(rope_theta=-1.0), ValueError,
     "rope_theta must be a finite number > 0, got -1.0"),
    ("config.json: rope_theta nan", config_json(rope_theta=math.nan), ValueError,
     "rope_theta must be a finite number > 0, got nan"),
    ("config.json: rope_theta a string", config_json(rope_theta="1e4"), ValueError,
     "rope_theta must be a number, got '1e4'"),
    ("config.json: vocab_size 49152.9", config_json(vocab_size=49152.9), ValueError,
     "vocab_size must be a positive integer, got 49152.9"),
    ("config.json: hidden_size nan", config_json(hidden_size=math.nan), ValueError,
     "hidden_size must be a positive integer, got nan"),
    ("config.json: num_hidden_layers nan", config_json(num_hidden_layers=math.nan), ValueError,
     "num_hidden_layers must be a positive integer, got nan"),
    ("config.json: rms_norm_eps < 0", config_json(rms_norm_eps=-1e-5), ValueError,
     "rms_norm_eps must be a finite number >= 0, got -1e-05"),
    ("config.json: rms_norm_eps nan", config_json(rms_norm_eps=math.nan), ValueError,
     "rms_norm_eps must be a finite number >= 0, got nan"),
    ("config.json: max_position_embeddings 0", config_json(max_position_embeddings=0),
     ValueError, "max_position_embeddings must be a positive integer, got 0"),
    ("config.json: max_position_embeddings < 0", config_json(max_position_embeddings=-8),
     ValueError, "max_position_embeddings must be a positive integer, got -8"),
    ("config.json: rope factor 0", config_json(rope_scaling={"rope_type": "linear", "factor": 0}),
     ValueError, "rope_scaling.factor must be a finite number > 0, got 0.0"),
    ("config.json: rope factor < 0", config_json(
        rope_scaling={"rope_type": "llama3", "factor": -8.0}), ValueError,
     "rope_scaling.factor must be a finite number > 0, got -8.0"),
    ("config.json: llama3 rope high <= low freq factor", config_json(rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0}),
     ValueError, "high_freq_factor (4.0) must be greater than low_freq_factor (4.0)"),
    # --- a drafter kind other than the folder's (an AttributeError deep in the engine before) --
    ("drafter: EAGLE-3 folder as medusa", drafter_kind("smollm2-135m-eagle3", "medusa"),
     ValueError, "'smollm2-135m-eagle3' is of kind 'eagle3', but kind 'medusa' was requested"),
    ("drafter: Medusa folder as eagle3", drafter_kind("smollm2-135m-medusa", "eagle3"),
     ValueError, "'smollm2-135m-medusa' is of kind 'medusa', but kind 'eagle3' was requested"),
    ("drafter: standalone folder as eagle3", drafter_kind("smollm2-135m-standalone", "eagle3"),
     ValueError, "is of kind 'standalone', but kind 'eagle3'"),
    # --- another model's params (the loaders refuse such checkpoints; this is the raw API) ----
    ("plain: params with other arrays", other_params("plain", "target", "arrays"), ValueError,
     "params hold 22 arrays, model 'decoder' has 13: are they another model's parameters?"),
    ("plain: params of other shapes", other_params("plain", "target", "shapes"), ValueError,
     "params: ['embed']['embedding'].value has shape (32, 32), model 'decoder' needs (32, 16)"),
    ("decode: target_params with other arrays", other_params("chain", "target", "arrays"),
     ValueError, "target_params hold 22 arrays"),
    ("decode: drafter_params of other shapes", other_params("chain", "drafter", "shapes"),
     ValueError, "drafter_params: ['embed']['embedding'].value has shape (32, 32)"),
    ("tree decode: target_params of other shapes", other_params("tree", "target", "shapes"),
     ValueError, "target_params: ['embed']['embedding'].value has shape (32, 32)"),
    ("tree decode: drafter_params with other arrays", other_params("tree", "drafter", "arrays"),
     ValueError, "drafter_params hold 22 arrays"),
]


@pytest.mark.parametrize("name, call, error, match", API, ids=[row[0] for row in API])
def test_api_refuses_bad_input(name, call, error, match):
  with pytest.raises(error) as e:
    call()
  assert match in str(e.value), f"{name}: {e.value}"
  assert "\n" not in str(e.value).strip()


def test_the_default_capacity_and_its_bucket_are_never_refused():
  """A request that fills the context window from a prompt padded wider than its rows gets a
  default capacity above window + lookahead (the padded width, rounded up to 64): the cap on
  capacity must allow it, and any capacity up to it, for plain and chain decoding."""
  window = 64
  target = dataclasses.replace(T, max_positions=window)
  prompt = np.zeros((1, 8), np.int32)
  prompt[0, :5] = 3
  lengths = np.array([5], np.int32)
  drafter = lm_chain_drafter(fake_lm(V), 2)
  for capacity in (None, 128):  # plain needs 8 + 59 = 67 slots, chain 70: both round to 128
    out = plain_decode(target, None, prompt, lengths, max_new_tokens=window - 5,
                       capacity=capacity)
    assert int(out.num_generated_B[0]) == window - 5
    out = asd_decode(target, None, drafter, None, prompt, lengths, max_new_tokens=window - 5,
                     capacity=capacity)
    assert int(out.num_generated_B[0]) == window - 5
  with pytest.raises(ValueError, match="capacity=192 is more than any request to 'fake' can "
                     r"use \(128 slots"):
    plain_decode(target, None, prompt, lengths, max_new_tokens=window - 5, capacity=192)


def test_over_long_requests_are_refused_before_the_model_runs():
  """The KV-cache and context-window checks come before any model function is called (or
  traced): a model that fails when touched must still give the one-line ValueError (plain,
  chain and tree engines)."""
  def untouched(*args, **kwargs):
    raise AssertionError("the model ran before the request was checked")

  never = dataclasses.replace(T, forward=untouched, prefill=untouched, init_cache=untouched,
                              max_positions=6)
  drafter = lm_chain_drafter(never, 2)
  cases = [
      (lambda: plain_decode(never, None, P, N, max_new_tokens=2, capacity=4), "cache slots"),
      (lambda: plain_decode(never, None, P, N, max_new_tokens=4), "context window"),
      (lambda: plain_decode(never, None, P, N, max_new_tokens=2, capacity=2 ** 20),
       "more than any request"),
      (lambda: asd_decode(never, None, drafter, None, P, N, max_new_tokens=2, capacity=4),
       "cache slots"),
      (lambda: asd_decode(never, None, drafter, None, P, N, max_new_tokens=4), "context window"),
      (lambda: asd_decode(never, None, drafter, None, P, N, max_new_tokens=2,
                          capacity=2 ** 20), "more than any request"),
  ]
  fns, params = _decoder(0, 16)
  tree_never = dataclasses.replace(fns, forward=untouched, prefill=untouched,
                                   init_cache=untouched, tree_forward=untouched,
                                   move_slots=untouched, max_positions=6)
  tree_drafter = lm_tree_drafter(tree_never, TreeShape(2, 2, 3))
  cases += [
      (lambda: asd_tree_decode(tree_never, params, tree_drafter, params, P, N, max_new_tokens=2,
                               capacity=4), "cache slots"),
      (lambda: asd_tree_decode(tree_never, params, tree_drafter, params, P, N,
                               max_new_tokens=4), "context window"),
      (lambda: asd_tree_decode(tree_never, params, tree_drafter, params, P, N, max_new_tokens=2,
                               capacity=2 ** 20), "more than any request"),
  ]
  for call, match in cases:
    with pytest.raises(ValueError, match=match):
      call()


# --- files: unknown names and corrupt weights (loaders, drafter checkpoints, exporters) ----------

def test_params_of_the_same_shapes_in_another_dtype_or_container_are_accepted():
  """The params check compares shapes only: a bfloat16 copy or a pure dict of the model's own
  params decodes (as it did before the check), and the pure dict gives the same tokens."""
  import flax.nnx as nnx
  import jax.numpy as jnp
  fns, params = _decoder(0, 16)
  want = plain_decode(fns, params, P, N, max_new_tokens=4).tokens_BxN
  pure = nnx.to_pure_dict(params)
  np.testing.assert_array_equal(plain_decode(fns, pure, P, N, max_new_tokens=4).tokens_BxN, want)
  half = jax.tree.map(lambda x: x.astype(jnp.bfloat16) if x.dtype == jnp.float32 else x, params)
  out = asd_decode(fns, half, lm_chain_drafter(fns, 2), pure, P, N, max_new_tokens=4)
  assert out.num_generated_B.tolist() == [4]


def _write(path, data: bytes):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(data)
  return path


def _loader_cases(tmp):
  from models.drafter_checkpoint import export_eagle3, import_eagle3, load_drafter, save_drafter
  from models.drafter_folder import load_standalone_drafter, resolve_drafter
  from models.gguf_file import load_gguf
  from models.hf_folder import load_hf_folder, replace_hf_folder
  from models.registry import load_checkpoint

  bad_json = tmp / "bad_json"
  _write(bad_json / "config.json", b"{not json")
  garbage_st = tmp / "garbage_st"
  _write(garbage_st / "config.json", b'{"architectures": ["LlamaForCausalLM"]}')
  _write(garbage_st / "model.safetensors", b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":")
  no_weights = tmp / "no_weights"
  _write(no_weights / "config.json", b"{}")
  garbage_gguf = _write(tmp / "x.gguf", b"GGUF" + b"\x00" * 7)
  not_gguf = _write(tmp / "weights.bin", b"\x00" * 16)
  drafter_garbage = tmp / "drafter_garbage"
  _write(drafter_garbage / "config.json", b'{"asd_jax_drafter": "eagle3"}')
  _write(drafter_garbage / "model.safetensors", b"\xff" * 12)
  notes = tmp / "notes"
  _write(notes / "notes.txt", b"keep me")
  _write(notes / "sub" / "y", b"and me")
  text_file = _write(tmp / "some_text_file", b"keep me")
  return [
      ("registry: unknown name", lambda: load_checkpoint("no-such-model"), UnknownModelError,
       "unknown model 'no-such-model'"),
      ("registry: not a gguf file", lambda: load_checkpoint(not_gguf), CheckpointError,
       "not a .gguf"),
      ("hf folder: missing", lambda: load_hf_folder(tmp / "missing"), CheckpointError,
       "does not exist"),
      ("hf folder: config not JSON", lambda: load_hf_folder(bad_json), CheckpointError,
       "not valid JSON"),
      ("hf folder: no weights", lambda: load_hf_folder(no_weights), CheckpointError,
       "no weights"),
      ("hf folder: corrupt safetensors", lambda: load_hf_folder(garbage_st), CheckpointError,
       "corrupt or truncated"),
      ("gguf: missing", lambda: load_gguf(tmp / "missing.gguf"), CheckpointError,
       "does not exist"),
      ("gguf: corrupt", lambda: load_gguf(garbage_gguf), CheckpointError,
       "corrupt or truncated"),
      ("drafter: unknown name", lambda: resolve_drafter("no-such-drafter"), UnknownModelError,
       "unknown drafter"),
      ("drafter: folder missing", lambda: load_drafter(tmp / "nope", None), CheckpointError,
       "nope"),
      ("drafter: corrupt weights", lambda: load_drafter(drafter_garbage, None),
       CheckpointError, "drafter_garbage"),
      ("drafter: import_eagle3 of garbage", lambda: import_eagle3(drafter_garbage, None),
       CheckpointError, "drafter_garbage"),
      ("drafter: standalone missing", lambda: load_standalone_drafter(tmp / "nope2"),
       UnknownModelError, "nope2"),
      ("save_drafter: not a drafter", lambda: save_drafter(tmp / "out", object()), TypeError,
       "not a drafter"),
      ("export_eagle3: not EAGLE-3", lambda: export_eagle3(tmp / "out2", object()), TypeError,
       "EAGLE-3"),
      # replacing a folder deletes it: only an earlier drafter export may be replaced
      ("replace_hf_folder: other files", lambda: replace_hf_folder(notes, {}, {}),
       CheckpointError, "notes.txt, sub"),
      ("replace_hf_folder: a file", lambda: replace_hf_folder(text_file, {}, {}),
       CheckpointError, "is not a folder"),
      ("replace_hf_folder: a model folder", lambda: replace_hf_folder(garbage_st, {}, {}),
       CheckpointError, "not a drafter's"),
  ]


_LOADER_IDS = ["registry: unknown name", "registry: not a gguf file", "hf folder: missing",
               "hf folder: config not JSON", "hf folder: no weights",
               "hf folder: corrupt safetensors", "gguf: missing", "gguf: corrupt",
               "drafter: unknown name", "drafter: folder missing", "drafter: corrupt weights",
               "drafter: import_eagle3 of garbage", "drafter: standalone missing",
               "save_drafter: not a drafter", "export_eagle3: not EAGLE-3",
               "replace_hf_folder: other files", "replace_hf_folder: a file",
               "replace_hf_folder: a model folder"]


@pytest.mark.parametrize("name", _LOADER_IDS)
def test_loaders_and_exporters_refuse_bad_files(name, tmp_path):
  cases = {row[0]: row for row in _loader_cases(tmp_path)}
  _, call, error, match = cases[name]
  with pytest.raises(error) as e:
    call()
  assert match in str(e.value), f"{name}: {e.value}"


# --- command lines ---------------------------------------------------------------------------

GENERATE = [
    (["--prompt", "hi", "--draft", "self", "--k", "0"], "--k must be a positive integer"),
    (["--prompt", "hi", "--draft", "self", "--budget", "-1"], "ASDConfig.budget must be >= 0"),
    (["--prompt", "hi", "--draft", "self", "--budget", "nan"], "ASDConfig.budget must be finite"),
    (["--prompt", "hi", "--draft", "self", "--gate", "inf"], "ASDConfig.gate must be finite"),
    (["--prompt", "hi", "--draft", "self", "--max-exceptions", "-1"], "max_exceptions"),
    (["--prompt", "hi", "--draft", "self", "--tree", "3,2"], "DEPTH,TOPK,NODES"),
    (["--prompt", "hi", "--draft", "self", "--tree", "2,2,9"], "exceeds"),
    (["--prompt", "hi", "--rule", "asd"], "needs a drafter"),
    (["--prompt", "hi", "--temperature", "nan"], "temperature"),
    (["--prompt", "hi", "--top-p", "1.5"], "top_p"),
    (["--prompt", "hi", "--top-k", "-3"], "top_k"),
    (["--prompt-ids", "1,,x"], "empty entry"),
    (["--prompt", "hi", "--draft", "ngram:x"], "bad n-gram drafter name 'ngram:x'"),
    (["--prompt", "hi", "--draft", "ngram:3-2"], "min_ngram (3) must be <= max_ngram (2)"),
    # the lookup is unrolled once per n-gram size: this one compiled for minutes
    (["--prompt", "hi", "--draft", "ngram:1000000"], "max_ngram 1000000 is above 32"),
    (["--prompt", "hi", "--draft", "self", "--tree", ""], "DEPTH,TOPK,NODES"),  # not "chain"
    # float32 flushes it to 0: the logits became NaN and the answer token 0 six times
    (["--prompt", "hi", "--temperature", "1e-40"], "outside float32's normal range"),
    (["--prompt", "hi", "--target", ""], "the model name is empty"),
    (["--prompt", "hi", "--temperature", "1e39"], "outside float32's normal range"),
    (["--prompt", "hi", "--draft", "ngram", "--tree", "2,2,3"], "chains only"),
    (["--prompt", "hi", "--draft", "some/folder", "--drafter", "ngram"],
     "needs an n-gram drafter name"),
    (["--prompt", "hi", "--seed", "-1"], "seed must be in"),
    (["--prompt", "hi", "--top-k", "5"], "top_k=5 filters sampling, but temperature 0 is greedy"),
    (["--prompt", "hi", "--min-p", "0.1"], "min_p=0.1 filters sampling"),
    (["--prompt", "hi", "--temperature", "1", "--min-p", "1.5"], "min_p must be in [0, 1]"),
    (["--prompt", "hi", "--repetition-penalty", "0"], "repetition_penalty must be a finite"),
    (["--prompt", "hi", "--repetition-penalty", "nan"], "repetition_penalty must be a finite"),
    (["--prompt", "hi", "--presence-penalty", "2.5"], "presence_penalty must be a number in"),
    (["--prompt", "hi", "--frequency-penalty=-inf"], "frequency_penalty must be a number in"),
]


@pytest.mark.parametrize("argv, message", GENERATE, ids=[" ".join(a) for a, _ in GENERATE])
def test_generate_cli_fails_fast_with_one_line(argv, message, capsys, no_model_load):
  from asd_jax.generate import main
  with pytest.raises(SystemExit) as e:
    main(argv)
  err = capsys.readouterr().err.strip()
  assert e.value.code == 2, err
  assert err.startswith("error: ") and message in err and "\n" not in err


BENCH = [
    (["--mode", "spec", "--k", "0"], "--k must be positive"),
    (["--mode", "spec", "--tree", "2,2"], "DEPTH,TOPK,NODES"),
    (["--target", "no-such-model", "--num-prompts", "1"], "unknown model 'no-such-model'"),
    (["--mode", "spec", "--tree", ""], "DEPTH,TOPK,NODES"),
    (["--mode", "spec", "--draft", "ngram:100"], "max_ngram 100 is above 32"),
    # a misspelt row name used to fail only after the model load
    (["--mode", "spec", "--draft", "ngram", "--quality", "--quality-rows", "ours_plain"],
     "--quality-rows: ours_plain; this run's own rows are ours_plain_greedy, ngram_chain_k4_strict"),
    # these used to fail only after every row had run, or never
    (["--json", "."], "--json . is a folder, not a file"),
    (["--mode", "suite", "--drift-tol", "nan"],
     "--drift-tol must be a finite number >= 0, got nan"),
    # each of these used to get one message naming four flags
    (["--mode", "suite", "--drift-tol", "-1"], "--drift-tol must be a finite number >= 0, got -1"),
    (["--mode", "suite", "--calibrate-prompts", "-1"], "--calibrate-prompts must be >= 0"),
    (["--mode", "suite", "--quality-max-new-tokens", "0"],
     "--quality-max-new-tokens must be positive, got 0"),
    (["--mode", "suite", "--calibrate-max-new-tokens", "0"],
     "--calibrate-max-new-tokens must be positive, got 0"),
    (["--mode", "suite", "--suite", "mt_bench", "--num-prompts", "80"], "would overlap"),
    # plain rows only: these were dropped without a word
    (["--mode", "ar", "--tree", "2,2,3", "--quality"], "--tree, --quality only apply to"),
    (["--draft", "ngram"], "--draft only applies to --mode spec or suite"),
    # padded every call with 255 dummy rows: 130 s instead of 12 s
    (["--mode", "ar", "--suite", "mt_bench", "--num-prompts", "1", "--batch-size", "256"],
     "--batch-size 256 exceeds the prompts per suite this run has (mt_bench 1, --num-prompts 1)"),
]


@pytest.mark.parametrize("argv, message", BENCH, ids=[" ".join(a) for a, _ in BENCH])
def test_bench_cli_one_line_errors(argv, message, capsys, tmp_path, monkeypatch, no_model_load):
  from asd_jax import bench
  monkeypatch.setenv("ASD_JAX_CACHE_DIR", str(tmp_path / "cache"))
  with pytest.raises(SystemExit) as e:
    bench.main(argv + ["--skip-transformers"])
  err = capsys.readouterr().err
  assert e.value.code == 2, err
  assert err.startswith("error: ") and message in err


def test_bench_without_torch_refuses_its_transformers_rows_first(capsys, tmp_path, monkeypatch,
                                                                no_model_load):
  """asd-jax does not require torch; the transformers rows need it. Without it, a run that
  would make them says so before the model loads (it died importing torch after the load)."""
  import importlib.util
  from asd_jax import bench
  real_find_spec = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "torch" else real_find_spec(name, *a))
  monkeypatch.setenv("ASD_JAX_CACHE_DIR", str(tmp_path / "cache"))
  for argv in (["--mode", "ar"], ["--mode", "suite", "--draft", "ngram"]):
    with pytest.raises(SystemExit) as e:
      bench.main(argv + ["--json", str(tmp_path / "out.json")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: the transformers rows"), err
    assert "--skip-transformers" in err
  # Skipped, they do not stand in the way: the run gets as far as loading the model.
  with pytest.raises(AssertionError, match="the model was loaded"):
    bench.main(["--mode", "ar", "--skip-transformers", "--json", str(tmp_path / "out.json")])


TRAIN = [
    (["--config=tiny", "--mesh=0x1"], "mesh"),
    (["--config=tiny", "--set", "steps"], "override"),
    (["--config=tiny", "--set", "no_such_field=1"], "no_such_field"),
    (["--config=tiny_nope"], "unknown training preset 'tiny_nope'"),
    # optimiser and bookkeeping fields: NaN parameters after one step, or a division by zero
    # mid-run, if they got that far
    (["--config=tiny", "--set", "lr=nan"], "lr must be a finite number > 0, got nan"),
    (["--config=tiny", "--set", "clip_norm=0"], "clip_norm must be > 0"),
    (["--config=tiny", "--set", "lr=0"], "lr must be a finite number > 0, got 0"),
    (["--config=tiny", "--set", "lr=-0.001"], "lr must be a finite number > 0, got -0.001"),
    (["--config=tiny", "--set", "b1=1"], "b1 must be in [0, 1)"),
    (["--config=tiny", "--set", "b1=-0.1"], "b1 must be in [0, 1)"),
    (["--config=tiny", "--set", "b2=1"], "b2 must be in [0, 1)"),
    (["--config=tiny", "--set", "b2=-0.5"], "b2 must be in [0, 1)"),
    (["--config=tiny", "--set", "ckpt_every=0"], "ckpt_every must be positive"),
    (["--config=tiny", "--set", "log_every=0"], "log_every must be positive"),
    (["--config=tiny", "--set", "warmup_steps=-1"], "warmup_steps must be >= 0"),
    (["--config=tiny", "--set", "eval_tree=1,0"], "eval_tree must be (depth, top-k)"),
    (["--config=tiny", "--set", "eval_tree=(1,0)"], "expected comma-separated integers"),
    # loss weights: NaN or inf trains to a NaN drafter and still exits 0
    (["--config=tiny", "--set", "ttt_step_decay=nan"], "ttt_step_decay must be a finite number"),
    (["--config=tiny", "--set", "ttt_step_decay=-3"], "ttt_step_decay must be a finite number"),
    (["--config=tiny", "--set", "vsd_eta=inf"], "vsd_eta must be a finite number >= 0, got inf"),
    (["--config=tiny", "--set", "vsd_lambda_wl=inf"], "vsd_lambda_wl must be a finite number"),
    (["--config=tiny", "--set", "data_seed=-1"], "data_seed must be >= 0"),
    # longer than the target's positions: a ~10 TB allocation before this check
    (["--config=tiny", "--set", "seq_len=100000"], "seq_len=100000 exceeds the target's 512"),
    # dataset fields: negative counts sliced silently, a zero batch crashed mid-build
    (["--config=tiny", "--set", "data.num_prompts=-5"], "data.num_prompts must be positive"),
    (["--config=tiny", "--set", "data.gen_batch=0"], "data.gen_batch must be positive"),
    (["--config=tiny", "--set", "data.gen_batch=-1"], "data.gen_batch must be positive"),
    (["--config=tiny", "--set", "data.prompt_seed=-1"], "data.prompt_seed must be >= 0"),
]


@pytest.mark.parametrize("argv, message", TRAIN, ids=[" ".join(a) for a, _ in TRAIN])
def test_train_cli_one_line_errors(argv, message, capsys, tmp_path):
  from vsd_jax.train import main
  code = main(argv + ["--workdir", str(tmp_path / "w"), "--no-progress"])
  err = capsys.readouterr().err
  assert code == 2, err
  assert message in err
