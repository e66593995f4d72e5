"""`make demo`: speculative decoding on the real default model (SmolLM2-135M-Instruct, CPU).

Loads the target and the shipped drafter(s), streams the first answer as speculative decoding
commits it, then answers a few chat prompts with plain greedy decoding, strict speculative
decoding (identical text) and ASD (paper preset) with the shipped drafter, and strict decoding
with the model-free n-gram drafter, printing tokens/s, tau and the speedup over plain decoding
measured in this run.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from asd_jax.asd_config import PAPER
from asd_jax.cli_common import enable_compilation_cache, right_pad, text_stream
from asd_jax.ngram_drafter import parse_ngram_name
from asd_jax.plain_decode import plain_decode

PROMPTS = (
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give three tips for writing clear technical documentation.",
)
MAX_NEW = 96
DRAFTERS = ("smollm2-135m-standalone", "smollm2-135m-eagle3")  # best measured tau first
NGRAM = ("ngram+store", 3)  # the model-free drafter (with the target's n-gram store) and its K
STREAMED = 1  # the prompt whose answer is streamed (a long one)


def _timed(fn):
  # Compile and warm up on the same shapes, and wait: dispatch is asynchronous, and a warm-up
  # still running would be timed with the call after it.
  jax.block_until_ready(fn())
  t0 = time.perf_counter()
  out = jax.block_until_ready(fn())
  return out, time.perf_counter() - t0


def main() -> None:
  enable_compilation_cache()
  from models.drafter_folder import KNOWN_DRAFTERS
  from models.drafter_setup import setup_drafter
  from models.load import DEFAULT_TARGET, load_decoder
  from models.tokenizer import encode_chat, eos_token_ids, load_tokenizer

  t0 = time.perf_counter()
  target = load_decoder(DEFAULT_TARGET)
  tokenizer = load_tokenizer(DEFAULT_TARGET)
  print(f"loaded {DEFAULT_TARGET} ({target.cfg.num_layers} layers, vocab "
        f"{target.cfg.vocab_size}) in {time.perf_counter() - t0:.1f} s on {jax.default_backend()}")
  eos = eos_token_ids(tokenizer, target.hf_config)
  draft = next((d for d in DRAFTERS if d in KNOWN_DRAFTERS), None)
  # K=2: the cost model of the standalone drafter (scripts/distill_standalone_drafter.py) favours it.
  setup = setup_drafter(draft, target, k=2) if draft else None
  if setup is None:
    print("no shipped drafter found; the n-gram drafter only")
  ngram = setup_drafter(NGRAM[0], target, k=NGRAM[1], target_name=DEFAULT_TARGET)
  from models.lm_fns import decoder_fns
  plain_fns, plain_params = decoder_fns(target.model)  # no hidden states: the honest baseline

  streamer = setup or ngram
  print(f"\n>>> {PROMPTS[STREAMED]}  (streamed as strict speculative decoding with "
        f"{draft or NGRAM[0]} commits it; includes compilation)")
  prompt, lengths = right_pad([encode_chat(tokenizer, PROMPTS[STREAMED])], bucket=64)
  streamer.decode(streamer.target_fns, streamer.target_params, streamer.drafter,
                  streamer.params, prompt, lengths, max_new_tokens=MAX_NEW, rule="strict",
                  eos_ids=eos, stream=text_stream(tokenizer))
  print("\n\n(now each configuration is compiled once first; timings exclude compilation)")

  for prompt_text in PROMPTS:
    prompt, lengths = right_pad([encode_chat(tokenizer, prompt_text)], bucket=64)
    fns, params = plain_fns, plain_params
    plain, plain_s = _timed(lambda: plain_decode(fns, params, prompt, lengths,
                                                 max_new_tokens=MAX_NEW, eos_ids=eos))
    n = int(plain.num_generated_B[0])
    text = tokenizer.decode(np.asarray(plain.tokens_BxN[0, :n]).tolist(), skip_special_tokens=True)
    print(f"\n>>> {prompt_text}\n{text}")
    print(f"  plain          {n / plain_s:6.1f} tok/s")
    runs = [("strict", setup, "strict"), ("asd", setup, "asd")] if setup else []
    runs.append(("n-gram strict", ngram, "strict"))
    for label, s, rule in runs:
      out, dt = _timed(lambda: s.decode(s.target_fns, s.target_params, s.drafter, s.params,
                                        prompt, lengths, max_new_tokens=MAX_NEW, rule=rule,
                                        asd_config=PAPER, eos_ids=eos))
      m = int(out.num_generated_B[0])
      same = np.array_equal(np.asarray(out.tokens_BxN[0, :m]), np.asarray(plain.tokens_BxN[0, :n]))
      summary = out.stats.summary()
      print(f"  {label:13s}  {m / dt:6.1f} tok/s  tau {summary['tau']:.2f}  "
            f"speedup {(m / dt) / (n / plain_s):.2f}x  same text as plain: {same}"
            + (f"  exceptions {summary['asd_exceptions'][0]}" if rule == "asd" else ""))
  if setup:
    print(f"\ndrafter: {draft} ({setup.kind}, {setup.engine}, K=2); ASD preset: budget "
          f"{PAPER.budget}, gate {PAPER.gate}, max exceptions {PAPER.max_exceptions}")
  low, high = parse_ngram_name(NGRAM[0])
  print(f"n-gram drafter: {NGRAM[0]} (n = {high} down to {low} in the request, then the "
        f"target's n-gram store; K={NGRAM[1]}), no model")


if __name__ == "__main__":
  main()
