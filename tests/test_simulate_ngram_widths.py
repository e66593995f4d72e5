"""scripts/simulate_ngram_widths.py replays the engine exactly: on the engine's own strict
output for a request decoded alone, its round count and accepted tokens equal what asd_decode
reported, with and without the store's narrower widths."""

import numpy as np
import pytest

from asd_jax.ngram_drafter import ngram_drafter
from asd_jax.ngram_store import build_store
from asd_jax.plain_decode import plain_decode
from asd_jax.spec_decode import asd_decode
from models.lm_fns import decoder_fns
from scripts.simulate_ngram_widths import (StoreLookup, engine_rule, full_k_drafter,
                                           full_k_rule, replay)
from tests.tiny_models import random_decoder, random_prompts

VOCAB = 61


@pytest.mark.parametrize("k", [2, 4])
def test_replay_counts_equal_the_engine(k):
  fns, params = decoder_fns(random_decoder(seed=k, vocab=VOCAB, num_layers=2))
  prompt, lengths = random_prompts(np.random.RandomState(k), 3, 16, 5)
  other, other_len = random_prompts(np.random.RandomState(50 + k), 6, 16, 5)
  stored = np.asarray(plain_decode(fns, params, other, other_len, max_new_tokens=30).tokens_BxN)
  store = build_store([list(a) for a in stored], VOCAB, min_n=2, max_n=4)
  lookup = StoreLookup(store)
  cost = {w: 1.0 for w in range(k + 1)}
  longer = np.asarray(plain_decode(fns, params, prompt, lengths, max_new_tokens=30 + k).tokens_BxN)
  with_widths = ngram_drafter(k, VOCAB, store=store)
  # Control: the same drafter verifying every draft at full K.
  for rule, drafter in ((engine_rule, with_widths), (full_k_rule, full_k_drafter(with_widths))):
    for row in range(prompt.shape[0]):  # one request per call: in a batch rows share widths
      out = asd_decode(fns, params, drafter, store.tables, prompt[row:row + 1],
                       lengths[row:row + 1], max_new_tokens=30)
      strict = np.asarray(out.tokens_BxN)[0].tolist()
      # The replay reads the target's greedy continuation past the cap, where the last round's
      # drafts may reach (these seeds have no near-tie, so strict == plain).
      assert strict == longer[row, :30].tolist()
      answer = [(list(prompt[row, :lengths[row]]), longer[row].tolist())]
      got = replay(answer, lookup, k, rule, cost, max_new_tokens=30)
      assert got["rounds"] == int(out.stats.rounds_B[0])
      assert got["accepted"] == int(out.stats.accepted_B[0])
      assert got["tokens"] == 29  # all but the prefill's token
