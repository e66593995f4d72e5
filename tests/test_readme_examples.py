"""The README's Python examples run as printed, on the real default model (an API rename or a
changed signature would otherwise leave the README wrong with every test green), and the tree
example's rule 'strict' gives what the README promises: the target's greedy output."""

import os
import re

import numpy as np

from asd_jax import plain_decode

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python_blocks() -> list[str]:
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def test_the_readme_python_examples_run_and_strict_equals_plain_greedy():
  blocks = _python_blocks()
  assert len(blocks) == 2, "the README's Python examples changed: update this test"
  names: dict = {}
  exec(compile(blocks[0], "README.md (chain example)", "exec"), names)
  chain = names["out"]
  n = int(chain.num_generated_B[0])
  assert 0 < n <= 64 and chain.stats.summary()["tau"] >= 1.0
  exec(compile(blocks[1], "README.md (tree example)", "exec"), names)
  tree = names["out"]
  want = plain_decode(names["target_fns"], names["target_params"], names["prompt"],
                      np.array([4]), max_new_tokens=64, eos_ids=(2,))
  m = int(want.num_generated_B[0])
  assert m > 8 and int(tree.num_generated_B[0]) == m  # an answer, not an EOS at once
  np.testing.assert_array_equal(np.asarray(tree.tokens_BxN)[0, :m],
                                np.asarray(want.tokens_BxN)[0, :m])
