"""Run in a fresh process (8 fake CPU devices): sharded decoding == single-device decoding.

Invoked by tests/test_sharded_inference.py; prints one line per check and exits non-zero on
any difference.
"""

import os

flags = os.environ.get("XLA_FLAGS", "")  # the test run's own are kept (tests/conftest.py)
os.environ["XLA_FLAGS"] = flags + " --xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from asd_jax.asd_config import ASDConfig  # noqa: E402
from asd_jax.drafter_api import lm_chain_drafter  # noqa: E402
from asd_jax.plain_decode import plain_decode  # noqa: E402
from asd_jax.spec_decode import asd_decode  # noqa: E402
from models.lm_fns import decoder_fns  # noqa: E402
from models.sharding import shard_params  # noqa: E402
from tests.tiny_models import perturbed_copy, random_decoder, random_prompts  # noqa: E402


def main() -> int:
  assert len(jax.devices()) == 8, jax.devices()
  target = random_decoder(seed=0, vocab=64, num_layers=2, hidden=64)
  fns, params = decoder_fns(target)
  _, dparams = decoder_fns(perturbed_copy(target, 0.2, seed=2))
  drafter = lm_chain_drafter(fns, 3)
  prompt, lengths = random_prompts(np.random.RandomState(0), 4, 10, 64)

  def run_all(tp, dp):
    return {
        "plain": plain_decode(fns, tp, prompt, lengths, max_new_tokens=16).tokens_BxN,
        "strict": asd_decode(fns, tp, drafter, dp, prompt, lengths, max_new_tokens=16).tokens_BxN,
        "asd": asd_decode(fns, tp, drafter, dp, prompt, lengths, max_new_tokens=16, rule="asd",
                          asd_config=ASDConfig(4.0, 0.5, 2)).tokens_BxN,
    }

  reference = {k: np.asarray(v) for k, v in run_all(params, dparams).items()}
  failures = 0
  for model_axis in (2, 4):
    mesh = Mesh(np.array(jax.devices()[:model_axis]).reshape(1, model_axis), ("data", "model"))
    tp, dp = shard_params(params, mesh), shard_params(dparams, mesh)
    sharded_leaves = [x for x in jax.tree_util.tree_leaves(tp)
                      if len(x.sharding.device_set) == model_axis and not x.sharding.is_fully_replicated]
    assert sharded_leaves, "nothing was sharded"
    for name, tokens in run_all(tp, dp).items():
      same = np.array_equal(np.asarray(tokens), reference[name])
      failures += not same
      print(f"model={model_axis} {name}: {'same' if same else 'DIFFERENT'} "
            f"({len(sharded_leaves)} sharded params)")
  return failures


if __name__ == "__main__":
  raise SystemExit(main())
