"""Variable verification width (ChainDrafter.draft_length / verify_widths): the engine verifies
the smallest declared width covering every active row's draft length, a plain step when all
are 0, and what it verifies never changes the output."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from asd_jax.drafter_api import ChainDrafter
from asd_jax.spec_decode import asd_decode
from tests.fake_lm import fake_lm

V, K = 32, 4


def counting_drafter(needs_B, verify_widths=(1, 2)) -> ChainDrafter:
  """Proposes the fake target's own continuation (always right) and asks, per row, for a fixed
  number of its K tokens to be verified: needs_B[b]."""
  needs = jnp.asarray(needs_B, jnp.int32)

  def propose(params, state, recent_Bx2, positions_Bx2, rng, sampling):
    draft_BxK = (recent_Bx2[:, 1:] + 1 + jnp.arange(K)[None]) % V
    return draft_BxK.astype(jnp.int32), None, state

  return ChainDrafter(prefill=lambda *a: jnp.zeros((), jnp.int32), propose=propose,
                      num_draft=K, vocab_size=V, name="counting",
                      draft_length=lambda state: needs, verify_widths=verify_widths)


def _run(needs_B, max_new_B=None, max_new=12):
  b = len(needs_B)
  prompt = np.tile(np.array([[3, 4]], np.int32), (b, 1))
  out = asd_decode(fake_lm(vocab_size=V), None, counting_drafter(needs_B), None, prompt,
                   np.full((b,), 2, np.int32), max_new_tokens=max_new, max_new_B=max_new_B)
  counting = [(5 + i) % V for i in range(max_new)]
  tokens = np.asarray(out.tokens_BxN)
  for r in range(b):
    n = max_new if max_new_B is None else max_new_B[r]
    assert tokens[r, :n].tolist() == counting[:n]
  return np.asarray(out.stats.rounds_B), np.asarray(out.stats.accepted_B)


@pytest.mark.parametrize("need,width", [(0, 0), (1, 1), (2, 2), (3, 4), (4, 4)])
def test_one_row_gets_the_smallest_width_covering_its_length(need, width):
  # Every draft token is right, so each round accepts exactly the verified width: the first
  # token comes from the prefill, the other 11 in rounds of width + 1. The last round's output
  # is cut at max_new_tokens and only its committed drafts count.
  rounds, accepted = _run([need])
  assert int(rounds[0]) == -(-11 // (width + 1))
  last_round_tokens = 11 - (int(rounds[0]) - 1) * (width + 1)
  assert int(accepted[0]) == width * (int(rounds[0]) - 1) + min(width, last_round_tokens)


def test_a_batch_verifies_for_its_longest_active_row():
  rounds, accepted = _run([0, 2])
  assert rounds.tolist() == [4, 4] and accepted.tolist() == [8, 8]  # both at width 2
  # Row 0 asks for 4 but stops after 2 tokens; row 1 (asking for 1) gets width 4 in the first
  # round only: 1 + 5 tokens, then rounds of 2 for the other 6.
  rounds, accepted = _run([4, 1], max_new_B=[2, 12])
  assert int(rounds[1]) == 4 and int(accepted[1]) == 4 + 3


def test_bad_widths_are_refused():
  noop = dict(prefill=lambda *a: None, propose=lambda *a: None, num_draft=4, vocab_size=V)
  for widths in [(0,), (4,), (2, 1), (1, 1), (1.5,)]:
    with pytest.raises(ValueError, match="verify_widths must be increasing integers in"):
      ChainDrafter(**noop, draft_length=lambda s: s, verify_widths=widths)
  with pytest.raises(ValueError, match="verify_widths need draft_length"):
    ChainDrafter(**noop, verify_widths=(1,))
  assert ChainDrafter(**noop).widths == (4,)


@pytest.mark.parametrize("with_store", [False, True])
def test_asd_rows_do_not_depend_on_a_batch_that_widens_their_round(with_store):
  """A row whose n-gram lookup finds nothing drafts filler (its last token repeated). When
  another row of its batch widens the round, ASD with a budget must not accept that filler as
  exceptions: the row gets the verdict on its own draft, as it does alone (a plain step).
  Before, the batched row here spent 5.5 of its budget on 3 filler exceptions."""
  from asd_jax.asd_config import ASDConfig
  from asd_jax.ngram_drafter import ngram_drafter
  from asd_jax.ngram_store import build_store
  from models.lm_fns import decoder_fns
  from tests.tiny_models import random_decoder
  vocab = 61
  fns, params = decoder_fns(random_decoder(seed=14, vocab=vocab, num_layers=1, hidden=32))
  store = build_store([[7, 8, 9, 10, 11, 12]], vocab, min_n=2, max_n=3) if with_store else None
  drafter = ngram_drafter(3, vocab, max_ngram=2, min_ngram=2, store=store)
  # Row 0 repeats itself, so its lookup matches at once; row 1 matches nothing.
  prompt = np.array([[5, 9, 5, 9, 5, 9], [44, 47, 53, 0, 3, 59]], np.int32)
  lengths = np.array([6, 6], np.int32)
  kw = dict(max_new_tokens=10, rule="asd", asd_config=ASDConfig(10.0, 5.0, 3))
  tables = None if store is None else store.tables
  both = asd_decode(fns, params, drafter, tables, prompt, lengths, **kw)
  for row in range(2):
    alone = asd_decode(fns, params, drafter, tables, prompt[row:row + 1], lengths[row:row + 1],
                       **kw)
    np.testing.assert_array_equal(np.asarray(both.tokens_BxN)[row],
                                  np.asarray(alone.tokens_BxN)[0])
    for field in ("asd_spent_B", "asd_exceptions_B"):
      np.testing.assert_array_equal(np.asarray(getattr(both.stats, field))[row],
                                    np.asarray(getattr(alone.stats, field))[0])
