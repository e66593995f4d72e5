"""`make demo`: speculative decoding on the real default model (SmolLM2-135M-Instruct, CPU).

Loads the target and the shipped drafters, streams the first answer as strict speculative
decoding commits it, then answers the first MT-Bench prompts (the benchmark's own order, one per
category) with plain greedy decoding, strict speculative decoding (identical text) and ASD
(paper preset), with the shipped drafter and with the model-free n-gram drafter and its store.
Every configuration is compiled first, then timed in interleaved passes (a change in the
machine's load hits every configuration alike) and the median pass counts; it prints tokens/s,
tau and the speedup over plain decoding measured in this run.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from asd_jax.asd_config import PAPER
from asd_jax.cli_common import (enable_compilation_cache, right_pad, text_stream,
                                time_interleaved)
from asd_jax.ngram_drafter import parse_ngram_name
from asd_jax.plain_decode import plain_decode

SUITE, NUM_PROMPTS = "mt_bench", 5  # writing, roleplay, reasoning, math, coding
MAX_NEW = 96
TIMED_PASSES = 3
DRAFTERS = ("smollm2-135m-standalone", "smollm2-135m-eagle3")  # best measured tau first
NGRAM = "ngram+store"  # the model-free drafter with the target's n-gram store
# Each drafter drafts at the K the README benchmarks ran it at on this backend
# (models/drafter_setup.BENCHMARKED_K).


def _tokens(out) -> list[int]:
  n = int(out.num_generated_B[0])
  return np.asarray(out.tokens_BxN[0, :n]).tolist()


def main() -> None:
  enable_compilation_cache()
  from asd_jax.bench_prompts import load_prompts
  from models.drafter_folder import KNOWN_DRAFTERS
  from models.drafter_setup import default_k, setup_drafter
  from models.lm_fns import decoder_fns
  from models.load import DEFAULT_TARGET, load_decoder
  from models.tokenizer import check_tokenizer_fits, encode_chat, eos_token_ids, load_tokenizer

  t0 = time.perf_counter()
  target = load_decoder(DEFAULT_TARGET)
  tokenizer = load_tokenizer(DEFAULT_TARGET)
  check_tokenizer_fits(tokenizer, target.cfg.vocab_size, DEFAULT_TARGET)
  print(f"loaded {DEFAULT_TARGET} ({target.cfg.num_layers} layers, vocab "
        f"{target.cfg.vocab_size}) in {time.perf_counter() - t0:.1f} s on {jax.default_backend()}")
  eos = eos_token_ids(tokenizer, target.hf_config)
  prompts = load_prompts((SUITE,), NUM_PROMPTS)
  draft = next((d for d in DRAFTERS if d in KNOWN_DRAFTERS), None)
  draft_k, ngram_k = (default_k(d, jax.default_backend()) for d in (draft, NGRAM))
  setups = {}  # short label (the drafter's name without the target's prefix) -> setup
  if draft:
    setups[f"{draft.removeprefix(DEFAULT_TARGET + '-')} K={draft_k}"] = setup_drafter(
        draft, target, k=draft_k)
  else:
    print("no shipped drafter found; the n-gram drafter only")
  setups[f"{NGRAM} K={ngram_k}"] = setup_drafter(NGRAM, target, k=ngram_k,
                                                 target_name=DEFAULT_TARGET)
  plain_fns, plain_params = decoder_fns(target.model)  # no hidden states: the honest baseline

  streamer_name, streamer = next(iter(setups.items()))
  print(f"\n>>> {prompts[0].text}\n(MT-Bench question {prompts[0].prompt_id}, streamed as "
        f"strict speculative decoding with {streamer_name} commits it; includes compilation)")
  prompt, lengths = right_pad([encode_chat(tokenizer, prompts[0].text)], bucket=64)
  streamer.decode(streamer.target_fns, streamer.target_params, streamer.drafter,
                  streamer.params, prompt, lengths, max_new_tokens=MAX_NEW, rule="strict",
                  eos_ids=eos, stream=text_stream(tokenizer))

  print(f"\n\nThe first {NUM_PROMPTS} MT-Bench questions, up to {MAX_NEW} new tokens each. "
        f"Each configuration is compiled first, then timed {TIMED_PASSES} times in turns; "
        "the median counts.")
  totals: dict[str, dict] = {}  # per configuration, summed over the prompts
  for p in prompts:
    prompt, lengths = right_pad([encode_chat(tokenizer, p.text)], bucket=64)
    runs = {"plain": lambda: plain_decode(plain_fns, plain_params, prompt, lengths,
                                          max_new_tokens=MAX_NEW, eos_ids=eos)}
    for label, s in setups.items():
      for rule, name in (("strict", "strict"), ("asd", "ASD paper")):
        runs[f"{label} {name}"] = (
            lambda s=s, rule=rule: s.decode(s.target_fns, s.target_params, s.drafter, s.params,
                                            prompt, lengths, max_new_tokens=MAX_NEW, rule=rule,
                                            asd_config=PAPER, eos_ids=eos))
    outputs, medians = time_interleaved(runs, TIMED_PASSES)
    plain_tokens = _tokens(outputs["plain"])
    line = []
    for name, out in outputs.items():
      seconds = medians[name]
      tokens = _tokens(out)
      t = totals.setdefault(name, {"tokens": 0, "seconds": 0.0, "rounds": 0, "round_tokens": 0,
                                   "same": 0, "exceptions": 0})
      t["tokens"] += len(tokens)
      t["seconds"] += seconds
      t["same"] += tokens == plain_tokens
      if name != "plain":
        t["rounds"] += int(np.asarray(out.stats.rounds_B).sum())
        t["round_tokens"] += int(np.asarray(out.stats.round_tokens_B).sum())
        t["exceptions"] += int(np.asarray(out.stats.asd_exceptions_B).sum())
      line.append(f"{len(tokens) / seconds:.0f}")
    print(f"  question {p.prompt_id} ({len(plain_tokens)} tokens): tok/s " + " | ".join(
        f"{name} {rate}" for name, rate in zip(outputs, line)))

  plain_rate = totals["plain"]["tokens"] / totals["plain"]["seconds"]
  print(f"\n{'configuration':<28} {'tok/s':>7} {'tau':>5} {'vs plain':>9}  same text as plain")
  for name, t in totals.items():
    rate = t["tokens"] / t["seconds"]
    tau = t["round_tokens"] / t["rounds"] if t["rounds"] else 1.0
    same = "-" if name == "plain" else f"{t['same']}/{len(prompts)}"
    if name.endswith("ASD paper"):
      same += f" ({t['exceptions']} exceptions accepted)"
    print(f"{name:<28} {rate:7.1f} {tau:5.2f} {rate / plain_rate:8.2f}x  {same}")
  if draft:
    shipped = next(iter(setups.values()))
    print(f"\ndrafter: {draft} ({shipped.kind}, {shipped.engine}, K={draft_k}); "
          f"ASD paper preset: budget {PAPER.budget}, gate {PAPER.gate}, max exceptions "
          f"{PAPER.max_exceptions}")
  low, high = parse_ngram_name(NGRAM)
  print(f"n-gram drafter: {NGRAM} (n = {high} down to {low} in the request, then the "
        f"target's n-gram store; K={ngram_k}), no model. On a 2-core CPU a verified token "
        "costs arithmetic, so only a free drafter pays; see the README's profile.")


if __name__ == "__main__":
  main()
