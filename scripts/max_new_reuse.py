"""What a request costs when it differs from the previous one only in max_new_tokens.

  python scripts/max_new_reuse.py --json out/max_new_reuse.json

On the default target (SmolLM2), in one process and without the persistent compilation cache,
one prompt is decoded with each of `--lengths` in turn, by plain decoding and by a strict n-gram
chain (K=3). The first call of an engine compiles its loop; the later ones reuse it when their
lengths round up to the same output bucket (asd_jax/output_buffer.py), and compile again when
they do not. The table gives each call's seconds; every call returns exactly the tokens the
longest one starts with (checked).

With `--rebuild` every call also builds the model functions and the drafter again
(`decoder_fns`, `ngram_drafter`), as a server handler that builds them per request does; they
come back as the same objects (models.lm_fns.ARCHITECTURES_KEPT), so the loop is still reused.
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

from asd_jax.cli_common import check_output_path, right_pad  # noqa: E402
from asd_jax.ngram_drafter import ngram_drafter  # noqa: E402
from asd_jax.plain_decode import plain_decode  # noqa: E402
from asd_jax.spec_decode import asd_decode  # noqa: E402

PROMPT = "Name three prime numbers and explain why each is prime."


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--lengths", default="24,40,56", help="max_new_tokens of the calls, in order")
  p.add_argument("--json", default=None, help="write the rows here")
  p.add_argument("--rebuild", action="store_true",
                 help="build the model functions and the drafter again for every call")
  args = p.parse_args(argv)
  try:
    args.lengths = [int(n) for n in args.lengths.split(",")]
  except ValueError:
    p.error(f"--lengths must be comma-separated integers, got {args.lengths!r}")
  if not args.lengths or min(args.lengths) <= 0:
    p.error(f"--lengths must be positive, got {args.lengths}")
  if args.json:
    try:
      check_output_path(args.json, "--json")
    except ValueError as e:
      p.error(str(e))
  return args


def main(argv=None) -> None:
  args = parse_args(argv)
  # Every compile is measured: no persistent cache, even where JAX_COMPILATION_CACHE_DIR is set.
  jax.config.update("jax_enable_compilation_cache", False)
  from models.lm_fns import decoder_fns
  from models.load import DEFAULT_TARGET, load_decoder
  from models.tokenizer import encode_chat, load_tokenizer

  target = load_decoder(DEFAULT_TARGET)
  built = decoder_fns(target.model)
  prompt, lengths = right_pad([encode_chat(load_tokenizer(DEFAULT_TARGET), PROMPT)], bucket=64)

  def model_fns():
    return decoder_fns(target.model) if args.rebuild else built

  def plain(n):
    fns, params = model_fns()
    return plain_decode(fns, params, prompt, lengths, max_new_tokens=n)

  def ngram_chain(n):
    fns, params = model_fns()
    return asd_decode(fns, params, ngram_drafter(3, fns.vocab_size), None, prompt, lengths,
                      max_new_tokens=n)

  engines = {"plain": plain, "ngram chain K=3": ngram_chain}
  rows = []
  print(f"{'engine':16s}" + "".join(f"{f'max_new {n}':>14s}" for n in args.lengths))
  for name, run in engines.items():
    seconds, outputs = [], []
    for n in args.lengths:
      start = time.perf_counter()
      outputs.append(np.asarray(jax.block_until_ready(run(n).tokens_BxN))[0])
      seconds.append(time.perf_counter() - start)
    longest = max(outputs, key=len)
    for out in outputs:
      if not np.array_equal(out, longest[:len(out)]):
        raise SystemExit(f"{name}: a call of {len(out)} tokens is not the longest call's start")
    rows.append({"engine": name, "max_new_tokens": args.lengths, "rebuild": args.rebuild,
                 "seconds": seconds})
    print(f"{name:16s}" + "".join(f"{s:12.2f} s" for s in seconds), flush=True)
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump({"target": DEFAULT_TARGET, "backend": jax.default_backend(), "rows": rows}, f,
                indent=1)


if __name__ == "__main__":
  main()
