"""`make demo`: the main job on the real default model (SmolLM2-135M-Instruct, CPU).

Loads the target, answers a few chat prompts with greedy decoding and reports timings.
"""

from __future__ import annotations

import time

import jax

from asd_jax.cli_common import enable_compilation_cache, right_pad
from asd_jax.plain_decode import plain_decode

PROMPTS = (
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give three tips for writing clear technical documentation.",
)


def main() -> None:
  enable_compilation_cache()
  from models.load import DEFAULT_TARGET, load_decoder
  from models.lm_fns import decoder_fns
  from models.tokenizer import encode_chat, eos_token_ids, load_tokenizer

  t0 = time.perf_counter()
  loaded = load_decoder(DEFAULT_TARGET)
  tokenizer = load_tokenizer(DEFAULT_TARGET)
  print(f"loaded {DEFAULT_TARGET} ({loaded.cfg.num_layers} layers, vocab "
        f"{loaded.cfg.vocab_size}) in {time.perf_counter() - t0:.1f} s on {jax.default_backend()}")
  fns, params = decoder_fns(loaded.model)
  eos = eos_token_ids(tokenizer, loaded.hf_config)
  for i, prompt in enumerate(PROMPTS):
    ids, lengths = right_pad([encode_chat(tokenizer, prompt)], bucket=64)
    t0 = time.perf_counter()
    out = jax.block_until_ready(
        plain_decode(fns, params, ids, lengths, max_new_tokens=128, eos_ids=eos))
    dt = time.perf_counter() - t0
    n = int(out.num_generated_B[0])
    text = tokenizer.decode(out.tokens_BxN[0, :n].tolist(), skip_special_tokens=True)
    note = " (includes compilation)" if i == 0 else ""
    print(f"\n>>> {prompt}\n{text}\n[{n} tokens, {dt:.2f} s, {n / dt:.1f} tok/s{note}]")


if __name__ == "__main__":
  main()
