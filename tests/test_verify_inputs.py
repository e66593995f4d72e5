"""Bad input fails at the Python boundary, before tracing, with an error that names it."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asd_jax.asd_config import ASDConfig, PAPER, PRESETS, STRICT, preset_with
from asd_jax.asd_verify import asd_verify
from asd_jax.greedy_verify import greedy_verify
from asd_jax.spec_sampling import speculative_sample, tree_speculative_sample
from asd_jax.tree_verify import tree_asd_verify, tree_greedy_verify
from asd_jax.typical_acceptance import typical_verify

B, K, V = 2, 3, 5
DRAFT = np.zeros((B, K), np.int32)
LOGITS = np.zeros((B, K + 1, V), np.float32)
SPENT = np.zeros(B, np.float32)


@pytest.mark.parametrize("field, value, error", [
    ("budget", -1.0, ValueError), ("budget", math.inf, ValueError),
    ("budget", math.nan, ValueError), ("gate", -0.1, ValueError), ("gate", math.inf, ValueError),
    ("max_exceptions", -1, ValueError), ("max_exceptions", 1.5, TypeError),
    ("budget", "8", TypeError), ("normalize_q", 1, TypeError),
])
def test_config_rejects_bad_fields(field, value, error):
  fields = dict(budget=8.0, gate=0.25, max_exceptions=2)
  fields[field] = value
  with pytest.raises(error, match=field):
    ASDConfig(**fields)


def test_config_presets_and_hashing():
  assert (PAPER.budget, PAPER.gate, PAPER.max_exceptions) == (8.0, 0.25, 2)
  assert PRESETS["exploratory"] == ASDConfig(12, 0.5, 2)
  assert STRICT.is_strict and not PAPER.is_strict
  assert ASDConfig(8, 0.25, 2) == PAPER and hash(ASDConfig(8, 0.25, 2)) == hash(PAPER)
  with pytest.raises(Exception):
    PAPER.budget = 1.0


CHAIN_RULES = {
    "greedy": lambda d, z, s=SPENT: greedy_verify(d, z, s),
    "asd": lambda d, z, s=SPENT: asd_verify(d, z, s, PAPER),
    "typical": lambda d, z, s=SPENT: typical_verify(d, z, s),
    "sample": lambda d, z, s=SPENT: speculative_sample(d, np.zeros(d.shape + (z.shape[-1],)),
                                                       z, jax.random.key(0)),
}


def test_preset_with_replaces_only_the_fields_given():
  assert preset_with("paper") == PAPER
  assert preset_with("paper", budget=None, gate=None) == PAPER  # None keeps the preset's value
  assert preset_with("exploratory", max_exceptions=1) == ASDConfig(12, 0.5, 1)
  assert preset_with("strict", budget=3.0, normalize_q=True) == ASDConfig(3.0, 0.0, 0, True)
  with pytest.raises(ValueError, match="unknown ASD preset 'fast'; choose one of paper, "):
    preset_with("fast")
  with pytest.raises(ValueError, match="ASDConfig.budget must be >= 0"):
    preset_with("paper", budget=-1.0)  # a replaced value is checked like any other


@pytest.mark.parametrize("rule", CHAIN_RULES)
@pytest.mark.parametrize("draft, logits, error, match", [
    (np.zeros((B, 0), np.int32), np.zeros((B, 1, V), np.float32), ValueError, "K=0"),
    (DRAFT, np.zeros((B, K, V), np.float32), ValueError, "target_logits must have shape"),
    (DRAFT, np.zeros((B + 1, K + 1, V), np.float32), ValueError, "target_logits"),
    (DRAFT.astype(np.float32), LOGITS, TypeError, "integer"),
    (DRAFT[0], LOGITS, ValueError, "2-D"),
    (DRAFT, LOGITS.astype(np.int32), TypeError, "floating"),
    (np.full((B, K), V, np.int32), LOGITS, ValueError, "outside the vocabulary"),
    (np.full((B, K), -1, np.int32), LOGITS, ValueError, "outside the vocabulary"),
    (np.full((B, K), 2**32 + 1, np.int64), LOGITS, ValueError, "int32"),
])
def test_chain_rules_reject_bad_blocks(rule, draft, logits, error, match):
  with pytest.raises(error, match=match):
    CHAIN_RULES[rule](draft, logits)


@pytest.mark.parametrize("spent, match", [
    (np.zeros(B + 1), "shape"), (np.full(B, -1.0), ">= 0"), (np.full(B, np.nan), "non-finite"),
    (np.array(["a", "b"]), "real"),
])
def test_ledger_is_checked(spent, match):
  with pytest.raises((ValueError, TypeError), match=match):
    asd_verify(DRAFT, LOGITS, spent, PAPER)


def test_config_type_and_rule_settings_are_checked():
  with pytest.raises(TypeError, match="ASDConfig"):
    asd_verify(DRAFT, LOGITS, SPENT, {"budget": 8})
  with pytest.raises(ValueError, match="posterior_alpha"):
    typical_verify(DRAFT, LOGITS, posterior_alpha=-1.0)
  with pytest.raises(ValueError, match="temperature"):
    typical_verify(DRAFT, LOGITS, temperature=0.0)
  with pytest.raises(ValueError, match="top_p"):
    speculative_sample(DRAFT, LOGITS[:, :K], LOGITS, jax.random.key(0), top_p=0.0)
  with pytest.raises(ValueError, match="draft_logits"):
    speculative_sample(DRAFT, LOGITS, LOGITS, jax.random.key(0))
  with pytest.raises(TypeError, match="key"):
    speculative_sample(DRAFT, LOGITS[:, :K], LOGITS, 0)


TOKENS = np.zeros((B, 4), np.int32)
PARENTS = np.array([[-1, 0, 0, 1]] * B, np.int32)
TREE_LOGITS = np.zeros((B, 5, V), np.float32)
TREE_RULES = {
    "greedy": lambda t, p, z, **kw: tree_greedy_verify(t, p, z, **kw),
    "asd": lambda t, p, z, **kw: tree_asd_verify(t, p, z, SPENT, PAPER, **kw),
    "sample": lambda t, p, z, **kw: tree_speculative_sample(
        t, p, np.zeros(t.shape + (z.shape[-1],), np.float32), z, jax.random.key(0), **kw),
}


@pytest.mark.parametrize("rule", TREE_RULES)
@pytest.mark.parametrize("tokens, parents, logits, kwargs, match", [
    (TOKENS[:, :0], PARENTS[:, :0], TREE_LOGITS[:, :1], {}, "N=0"),
    (TOKENS, PARENTS[:, :3], TREE_LOGITS, {}, "parents must have shape"),
    (TOKENS, PARENTS, TREE_LOGITS[:, :4], {}, "target_logits"),
    (TOKENS, np.array([[-1, 0, 2, 1]] * B), TREE_LOGITS, {}, "topological"),
    (TOKENS, np.array([[-1, -2, 0, 1]] * B), TREE_LOGITS, {}, "parents\\[0, 1\\]"),
    (TOKENS, PARENTS, TREE_LOGITS, dict(max_depth=2), "levels deep"),
    (TOKENS, PARENTS, TREE_LOGITS, dict(max_depth=0), "max_depth"),
    (TOKENS + V, PARENTS, TREE_LOGITS, {}, "outside the vocabulary"),
    (TOKENS.astype(np.float32), PARENTS, TREE_LOGITS, {}, "integer"),
])
def test_tree_rules_reject_bad_trees(rule, tokens, parents, logits, kwargs, match):
  with pytest.raises((ValueError, TypeError), match=match):
    TREE_RULES[rule](tokens, parents, logits, **kwargs)


def test_value_checks_are_skipped_inside_jit_and_on_request():
  bad = np.full((B, K), V, np.int32)
  # Under jit the ids are tracers: no host read, no error; such ids are never accepted.
  out = jax.jit(lambda d: asd_verify(d, LOGITS, SPENT, PAPER))(bad)
  np.testing.assert_array_equal(np.asarray(out.num_accepted), 0)
  out = asd_verify(bad, LOGITS, SPENT, PAPER, check_values=False)
  np.testing.assert_array_equal(np.asarray(out.num_accepted), 0)
  # Shape errors are static, so they are raised under jit too.
  with pytest.raises(ValueError, match="K=0"):
    jax.jit(lambda d: greedy_verify(d, jnp.zeros((B, 1, V))))(jnp.zeros((B, 0), jnp.int32))


@pytest.mark.parametrize("rule", TREE_RULES)
def test_tree_rules_take_numpy_integer_max_depth(rule):
  # noise_slots took np.int64 while max_depth refused it
  out = TREE_RULES[rule](TOKENS, PARENTS, TREE_LOGITS, max_depth=np.int64(3))
  assert np.asarray(out.path).shape == (B, 3)


def test_eos_ids_as_a_jax_array_read_like_numpy():
  from asd_jax.request_checks import check_eos_ids
  assert check_eos_ids(jnp.array([5, 2]), 8) == check_eos_ids(np.array([5, 2]), 8) == (5, 2)
