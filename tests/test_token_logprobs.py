"""logprobs=True: every engine returns each output token's log-probability under the target,
equal to one teacher-forced forward over prompt + output, whatever rule committed the token;
top_logprobs=L adds the L most likely tokens of that forward at each output position."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asd_jax.asd_config import ASDConfig
from asd_jax.draft_tree import TreeShape, lm_tree_drafter
from asd_jax.drafter_api import lm_chain_drafter
from asd_jax.plain_decode import plain_decode
from asd_jax.sampling import SamplingConfig
from asd_jax.spec_decode import asd_decode
from asd_jax.stop_strings import StopStrings
from asd_jax.tree_decode import asd_tree_decode
from models.lm_fns import decoder_fns
from tests.tiny_models import perturbed_copy, random_decoder, random_prompts

VOCAB = 61
_TARGET = random_decoder(seed=0, vocab=VOCAB, num_layers=2)
_FNS, _PARAMS = decoder_fns(_TARGET)
# A loose drafter, so ASD accepts mismatches and sampling rejects some drafts.
_, _DRAFT_PARAMS = decoder_fns(perturbed_copy(_TARGET, 0.5, seed=5))
_CHAIN = lm_chain_drafter(_FNS, 3)
_TREE = lm_tree_drafter(_FNS, TreeShape(depth=3, top_k=2, num_nodes=6))
# Gate 0 would be strict (spec: r_i / q_i <= g); a wide gate lets ASD commit mismatches.
_LOOSE_ASD = ASDConfig(budget=50.0, gate=10.0, max_exceptions=3)


def _teacher_forced(prompt, output) -> np.ndarray:
  """log p(. | prompt, output[:i]) for each output position i (rows of V) from one causal
  forward."""
  seq = np.array([list(prompt) + list(output)], np.int32)
  w = seq.shape[1]
  logits, _, _ = _FNS.forward(_PARAMS, seq, jnp.arange(w, dtype=jnp.int32)[None],
                              _FNS.init_cache(1, w))
  logp = jax.nn.log_softmax(np.asarray(logits[0], np.float32), axis=-1)
  return np.asarray(logp)[len(prompt) - 1:w - 1]


def _engine(name):
  if name == "plain":
    return lambda **kw: plain_decode(_FNS, _PARAMS, **kw)
  if name == "chain":
    return lambda **kw: asd_decode(_FNS, _PARAMS, _CHAIN, _DRAFT_PARAMS, **kw)
  return lambda **kw: asd_tree_decode(_FNS, _PARAMS, _TREE, _DRAFT_PARAMS, **kw)


@pytest.mark.parametrize("engine,rule", [
    ("plain", None), ("chain", "strict"), ("chain", "asd"), ("chain", "sample"),
    ("tree", "strict"), ("tree", "asd"), ("tree", "sample")])
def test_logprobs_equal_a_teacher_forced_forward(engine, rule):
  prompt, lengths = random_prompts(np.random.RandomState(0), 3, 9, VOCAB)
  top = 4
  kw = dict(prompt_BxT=prompt, lengths_B=lengths, max_new_tokens=16, logprobs=True,
            top_logprobs=top, max_new_B=np.array([16, 11, 16], np.int32))
  if rule is not None:
    kw.update(rule=rule, asd_config=_LOOSE_ASD)
  if rule == "sample":
    kw.update(sampling=SamplingConfig(temperature=0.8, top_k=20), seed=3)
  result = _engine(engine)(**kw)
  assert result.logprobs_BxN.shape == (3, 16) and result.logprobs_BxN.dtype == jnp.float32
  assert result.top_token_ids_BxNxL.shape == (3, 16, top)
  assert result.top_token_ids_BxNxL.dtype == jnp.int32
  assert result.top_logprobs_BxNxL.shape == (3, 16, top)
  below_argmax = 0
  for b in range(3):
    n = int(result.num_generated_B[b])
    output = np.asarray(result.tokens_BxN[b, :n]).tolist()
    got = np.asarray(result.logprobs_BxN[b])
    logp_NxV = _teacher_forced(prompt[b, :lengths[b]].tolist(), output)
    expected = logp_NxV[np.arange(n), output]
    np.testing.assert_allclose(got[:n], expected, atol=2e-4, err_msg=f"row {b}")
    assert (got[n:] == 0).all()
    assert (got[:n] <= 0).all()
    below_argmax += int((expected < logp_NxV.max(axis=1) - 1e-3).sum())
    # The top L: the forward's L largest log p, most likely first, and each id's own log p
    # (near-ties may order two ids either way; their values still match).
    top_ids = np.asarray(result.top_token_ids_BxNxL[b])
    top_lp = np.asarray(result.top_logprobs_BxNxL[b])
    np.testing.assert_allclose(top_lp[:n], -np.sort(-logp_NxV, axis=1)[:, :top], atol=2e-4,
                               err_msg=f"row {b}")
    np.testing.assert_allclose(top_lp[:n], np.take_along_axis(logp_NxV, top_ids[:n], axis=1),
                               atol=2e-4, err_msg=f"row {b}")
    assert (np.diff(top_lp[:n], axis=1) <= 0).all()
    assert (top_ids[n:] == -1).all() and (top_lp[n:] == 0).all()
    if rule in (None, "strict"):  # greedy: each token is the target's argmax
      assert (top_ids[:n, 0] == output).all()
  if rule in ("asd", "sample"):
    # Tokens the target did not find most likely were committed: a check that could fail.
    assert below_argmax > 0
  else:
    assert below_argmax == 0


def test_logprobs_stop_with_the_tokens_at_a_stop_string():
  prompt, lengths = random_prompts(np.random.RandomState(1), 1, 7, VOCAB)
  full = plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=12, logprobs=True)
  stop_at = np.asarray(full.tokens_BxN[0]).tolist()[4]
  stop = StopStrings((f"<{stop_at}>",), lambda ids: "".join(f"<{t}>" for t in ids))
  for engine in ("plain", "chain", "tree"):
    result = _engine(engine)(prompt_BxT=prompt, lengths_B=lengths, max_new_tokens=12,
                             logprobs=True, stop=stop)
    n = int(result.num_generated_B[0])
    assert n <= 5
    np.testing.assert_allclose(result.logprobs_BxN[0, :n], full.logprobs_BxN[0, :n], atol=2e-4)
    assert (np.asarray(result.logprobs_BxN[0, n:]) == 0).all()


def test_without_logprobs_there_are_none_and_a_wrong_flag_is_refused():
  prompt, lengths = random_prompts(np.random.RandomState(2), 1, 5, VOCAB)
  assert plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=3).logprobs_BxN is None
  assert asd_decode(_FNS, _PARAMS, _CHAIN, _DRAFT_PARAMS, prompt, lengths,
                    max_new_tokens=3).logprobs_BxN is None
  assert plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=3,
                      logprobs=True).top_logprobs_BxNxL is None
  bad = [(dict(logprobs="yes"), TypeError, "logprobs must be bool"),
         (dict(logprobs=True, top_logprobs=True), TypeError, "top_logprobs must be int"),
         (dict(logprobs=True, top_logprobs=2.0), TypeError, "top_logprobs must be int"),
         (dict(logprobs=True, top_logprobs=-1), ValueError, "top_logprobs must be >= 0"),
         (dict(logprobs=True, top_logprobs=VOCAB + 1), ValueError,
          f"more than the vocabulary's {VOCAB} tokens"),
         (dict(top_logprobs=3), ValueError, "needs logprobs=True")]
  for engine in ("plain", "chain", "tree"):
    for flags, error, message in bad:
      with pytest.raises(error, match=message):
        _engine(engine)(prompt_BxT=prompt, lengths_B=lengths, max_new_tokens=3, **flags)
