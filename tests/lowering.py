"""How many while loops a decode engine's program holds when lowered for a platform (no such
device needed): on a GPU every step of a loop inside a round costs kernel launches and a read
of its condition, so the engines keep one loop, the rounds'."""

import numpy as np

from asd_jax.asd_config import PAPER
from asd_jax.host_calls import NO_HOST_CALL
from asd_jax.sampling import SamplingConfig
from asd_jax.spec_decode import _asd_decode, prepare_request
from asd_jax.tree_decode import _tree_decode


def chain_engine_loops(fns, params, drafter, draft_params, platform: str) -> int:
  """stablehlo.while ops in the chain engine's program (strict with every logit edit on, one
  3-token prompt)."""
  return _engine_loops(_asd_decode, fns, params, drafter, draft_params, platform,
                       lookahead=drafter.num_draft)


def tree_engine_loops(fns, params, drafter, draft_params, platform: str) -> int:
  """stablehlo.while ops in the tree engine's program (strict with every logit edit on, one
  3-token prompt)."""
  return _engine_loops(_tree_decode, fns, params, drafter, draft_params, platform,
                       lookahead=drafter.shape.num_nodes + 1)


def _engine_loops(loop, fns, params, drafter, draft_params, platform, *, lookahead) -> int:
  # The logit edits' code included (asd_jax/logit_edits.py)
  sampling = SamplingConfig(repetition_penalty=1.1, min_tokens=4, logit_bias={1: -2.0})
  req = prepare_request(fns, drafter.vocab_size, np.array([[0, 1, 2]], np.int32),
                        np.array([3], np.int32), rule="strict", asd_config=PAPER,
                        sampling=sampling, eos_ids=(0,), max_new_tokens=12, max_new_B=None,
                        capacity=None, lookahead=lookahead, what="lowering")
  lowered = loop.trace(
      fns, params, drafter, draft_params, *req.arrays, rule=req.rule,
      sampling=sampling.filters(),
      edits=sampling.logit_edits(fns.vocab_size, req.eos_ids, req.max_new_tokens),
      normalize_q=False, max_new_tokens=req.max_new_tokens,
      capacity=req.capacity, eos_ids=req.eos_ids, host=NO_HOST_CALL, logprobs=False,
      top_logprobs=0).lower(lowering_platforms=(platform,))
  return lowered.as_text().count("stablehlo.while")
