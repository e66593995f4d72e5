"""Structured output and speculative decoding: how fast JSON answers under a schema decode,
plain and with each drafter, and what the grammar costs plain decoding.

  python scripts/guided_speed.py --json docs/bench/guided_speed_cpu.json

`--prompts` requests ("Describe <country> as JSON: ..."), each answered under one JSON schema
(name, capital, population, official languages) with greedy decoding, up to `--max-new-tokens`:
plain decoding with the guide, then strict speculative decoding with the guide for each
`--drafters` entry (NAME or NAME@TREE, e.g. smollm2-135m-eagle3@4,4,16), and each of them
without the guide (those answers differ, free text, so they set the guide's rows beside what
the same engine does on unconstrained answers to the same prompts, not a like-for-like cost:
scripts/option_overhead.py --option guide measures that). Engines
alternate prompt by prompt, `--passes` times over the prompts; the table gives tokens per
second over all passes, the ratio to guided plain decoding, tau (tokens per target forward) and
how many answers parse as JSON with the schema's keys. The script fails if a speculative answer
differs from guided plain decoding's (strict must give plain decoding's output).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jax  # noqa: E402
import numpy as np  # noqa: E402

from asd_jax.cli_common import right_pad  # noqa: E402
from asd_jax.draft_tree import TreeShape  # noqa: E402
from asd_jax.plain_decode import plain_decode  # noqa: E402
from asd_jax.sampling import SamplingConfig  # noqa: E402
from asd_jax.token_guide import TokenGuide  # noqa: E402
from models.drafter_setup import default_k, setup_drafter  # noqa: E402
from models.lm_fns import decoder_fns  # noqa: E402
from models.load import load_decoder  # noqa: E402
from models.tokenizer import (check_tokenizer_fits, encode_chat, eos_token_ids,  # noqa: E402
                              load_tokenizer)

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string"}, "capital": {"type": "string"},
                         "population": {"type": "integer"},
                         "official_languages": {"type": "array", "items": {"type": "string"},
                                                "minItems": 1, "maxItems": 3}},
          "required": ["name", "capital", "population", "official_languages"]}
COUNTRIES = ("France", "Japan", "Brazil", "Kenya", "Canada", "India", "Norway", "Egypt",
             "Mexico", "Australia", "Germany", "Peru")
DRAFTERS = ("ngram+store", "smollm2-135m-standalone", "smollm2-135m-eagle3@4,4,16")


def valid(text: str) -> bool:
  try:
    answer = json.loads(text)
  except ValueError:
    return False
  return isinstance(answer, dict) and set(answer) == set(SCHEMA["properties"])


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--target", default="smollm2-135m")
  p.add_argument("--drafters", nargs="*", default=list(DRAFTERS),
                 help="NAME or NAME@TREE each (default: %(default)s)")
  p.add_argument("--prompts", type=int, default=6)
  p.add_argument("--passes", type=int, default=2)
  p.add_argument("--max-new-tokens", type=int, default=96)
  p.add_argument("--json", default="")
  args = p.parse_args(argv)
  for name in ("prompts", "passes", "max_new_tokens"):
    if getattr(args, name) < 1:
      p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
  if args.prompts > len(COUNTRIES):
    p.error(f"--prompts: at most {len(COUNTRIES)}")

  tokenizer = load_tokenizer(args.target)
  loaded = load_decoder(args.target)
  check_tokenizer_fits(tokenizer, loaded.cfg.vocab_size, args.target)
  fns, params = decoder_fns(loaded.model, name=args.target)
  eos = eos_token_ids(tokenizer, loaded.hf_config)
  t0 = time.perf_counter()
  guide = TokenGuide.from_json_schema(SCHEMA, tokenizer, fns.vocab_size)
  build_s = time.perf_counter() - t0
  guided = SamplingConfig(guide=guide)
  rows = [right_pad([encode_chat(tokenizer, f"Describe {country} as JSON: its name, capital, "
                                            "population and official languages.")])
          for country in COUNTRIES[:args.prompts]]

  def plain(sampling):
    def call(prompt, lengths):
      out = jax.device_get(plain_decode(fns, params, prompt, lengths, eos_ids=eos,
                                        max_new_tokens=args.max_new_tokens, sampling=sampling))
      n = int(out.num_generated_B[0])
      return np.asarray(out.tokens_BxN[0, :n]).tolist(), n
    return call

  def speculative(entry, sampling):
    name, _, tree = entry.partition("@")
    setup = setup_drafter(name, loaded, k=default_k(name, jax.default_backend()),
                          tree=TreeShape.parse(tree) if tree else None, target_name=args.target)

    def call(prompt, lengths):
      out = jax.device_get(setup.decode(setup.target_fns, setup.target_params, setup.drafter,
                                        setup.params, prompt, lengths, rule="strict",
                                        eos_ids=eos, max_new_tokens=args.max_new_tokens,
                                        sampling=sampling))
      n = int(out.num_generated_B[0])
      return np.asarray(out.tokens_BxN[0, :n]).tolist(), int(out.stats.rounds_B[0]) + 1
    return call

  engines = {"plain, guided": plain(guided)}
  for entry in args.drafters:
    engines[f"{entry} strict, guided"] = speculative(entry, guided)
  engines["plain, no guide"] = plain(SamplingConfig())
  for entry in args.drafters:
    engines[f"{entry} strict, no guide"] = speculative(entry, SamplingConfig())
  for call in engines.values():  # compile each engine's programs, untimed
    for prompt, lengths in rows:
      call(prompt, lengths)
  walls = dict.fromkeys(engines, 0.0)
  tokens, forwards = dict.fromkeys(engines, 0), dict.fromkeys(engines, 0)
  answers = {name: [] for name in engines}
  for _ in range(args.passes):
    for prompt, lengths in rows:
      want = None
      for name, call in engines.items():
        t0 = time.perf_counter()
        answer, n_forwards = call(prompt, lengths)
        walls[name] += time.perf_counter() - t0
        tokens[name] += len(answer)
        forwards[name] += n_forwards
        answers[name].append(answer)
        if name == "plain, guided":
          want = answer
        elif name.endswith("guided") and answer != want:
          raise SystemExit(f"{name}: strict gave another answer than guided plain decoding")

  base = tokens["plain, guided"] / walls["plain, guided"]
  print(f"JSON schema -> {guide.num_states}-state token automaton in {build_s:.2f} s")
  print(f"{'engine':<48}{'tok/s':>8}{'ratio':>8}{'tau':>7}{'valid JSON':>12}")
  results = []
  for name in engines:
    rate = tokens[name] / walls[name]
    texts = [tokenizer.decode([t for t in a if t not in eos]) for a in answers[name]]
    n_valid = sum(map(valid, texts))
    tau = tokens[name] / forwards[name]
    results.append({"engine": name, "tokens_per_s": round(rate, 2),
                    "ratio_to_guided_plain": round(rate / base, 4), "tau": round(tau, 3),
                    "valid_json": n_valid, "answers": len(texts), "new_tokens": tokens[name],
                    "wall_s": round(walls[name], 3), "first_answer": texts[0]})
    print(f"{name:<48}{rate:>8.1f}{rate / base:>8.2f}{tau:>7.2f}{n_valid:>6}/{len(texts)}")
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump({"target": args.target, "backend": jax.default_backend(),
                 "cpu_count": os.cpu_count(), "prompts": args.prompts, "passes": args.passes,
                 "max_new_tokens": args.max_new_tokens, "schema": SCHEMA,
                 "guide_states": guide.num_states, "guide_build_s": round(build_s, 3),
                 "results": results}, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
