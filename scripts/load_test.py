"""Load test of `asd_decode`: many requests in bucketed batches on a tiny random model (CPU).

Checks three promises of the serving path:
  1. no compilation after warm-up (one warm-up call per (rule, prompt-width) bucket),
  2. resident memory at the end within 10% of resident memory after warm-up,
  3. every output equal to the same request run alone (per-request seeds; rows are independent).
Requests under the "sample" rule each bring their own temperature and top-p, as a server's do,
and decode in one batch with one SamplingConfig per row.

    python scripts/load_test.py [--requests 512] [--batch 8] [--json out/load_test.json]

Prints a table and writes JSON; exits 1 if a promise is broken.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from asd_jax import spec_decode  # noqa: E402
from asd_jax.asd_config import ASDConfig  # noqa: E402
from asd_jax.cli_common import check_output_path  # noqa: E402
from asd_jax.drafter_api import lm_chain_drafter  # noqa: E402
from asd_jax.sampling import SamplingConfig  # noqa: E402
from models.lm_fns import decoder_fns  # noqa: E402
from tests.tiny_models import perturbed_copy, random_decoder  # noqa: E402

VOCAB, K, MAX_NEW, WIDTH_BUCKET, MAX_PROMPT = 97, 3, 16, 8, 24
RULES = {
    "strict": dict(rule="strict"),
    "asd": dict(rule="asd", asd_config=ASDConfig(4.0, 0.5, 2)),
    "sample": dict(rule="sample"),  # each request's own SamplingConfig (make_requests)
}
CAPACITY = 64


def rss_mib() -> float:
  for line in Path("/proc/self/status").read_text().splitlines():
    if line.startswith("VmRSS:"):
      return int(line.split()[1]) / 1024
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class CompileCounter:
  """Counts XLA backend compilations (jax.monitoring events), any function."""

  def __init__(self):
    self.count = 0
    jax.monitoring.register_event_duration_secs_listener(self._on_event)

  def _on_event(self, event: str, duration: float, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
      self.count += 1


def request_sampling(rng: np.random.RandomState) -> SamplingConfig:
  """A sampled request's own settings: temperature in [0.6, 1.4], top-p in [0.8, 0.99]. Always
  both on, so every batch of them runs one per-row program (which filters are on is static)."""
  return SamplingConfig(temperature=round(rng.uniform(0.6, 1.4), 3),
                        top_p=round(rng.uniform(0.8, 0.99), 3))


def make_requests(n: int, seed: int = 0) -> list[dict]:
  rng = np.random.RandomState(seed)
  rules = list(RULES)
  return [dict(id=i, rule=rules[i % len(rules)],
               prompt=rng.randint(0, VOCAB, size=rng.randint(1, MAX_PROMPT + 1)).tolist(),
               max_new=int(rng.randint(4, MAX_NEW + 1)), seed=int(rng.randint(0, 2 ** 31)),
               sampling=request_sampling(rng) if rules[i % len(rules)] == "sample" else None)
          for i in range(n)]


def width_of(n: int) -> int:
  return -(-n // WIDTH_BUCKET) * WIDTH_BUCKET


def pack(reqs: list[dict], batch: int, width: int):
  """Right-padded arrays and each row's SamplingConfig for one batch; missing rows are dummies
  with max_new 0 and settings of their own (all-equal settings would be one SamplingConfig,
  another program than the per-row one the batches run)."""
  prompt = np.zeros((batch, width), np.int32)
  lengths = np.ones(batch, np.int32)
  max_new = np.zeros(batch, np.int32)
  seeds = np.zeros(batch, np.int64)
  samplings = [SamplingConfig(temperature=1.0 + 0.01 * b, top_p=0.95) for b in range(batch)]
  for b, r in enumerate(reqs):
    prompt[b, :len(r["prompt"])] = r["prompt"]
    lengths[b], max_new[b], seeds[b] = len(r["prompt"]), r["max_new"], r["seed"]
    samplings[b] = r["sampling"] or samplings[b]
  return prompt, lengths, max_new, seeds, samplings


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--requests", type=int, default=512)
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--json", default="out/load_test.json")
  args = p.parse_args(argv)
  if args.requests <= 0 or args.batch <= 0:  # no request would check nothing and report OK
    p.error(f"--requests and --batch must be positive, got {args.requests} and {args.batch}")
  try:
    check_output_path(args.json, "--json")  # refused now, not after the run
  except ValueError as e:
    p.error(str(e))

  target = random_decoder(seed=0, vocab=VOCAB, num_layers=2, hidden=64)
  tfns, tparams = decoder_fns(target)
  dparams = decoder_fns(perturbed_copy(target, 0.3, seed=1))[1]
  drafter = lm_chain_drafter(tfns, K)

  def run(prompt, lengths, max_new, seeds, samplings, rule):
    per_row = {"sampling": samplings} if rule == "sample" else {}
    out = spec_decode.asd_decode(tfns, tparams, drafter, dparams, prompt, lengths,
                                 max_new_tokens=MAX_NEW, max_new_B=max_new, seed=seeds,
                                 capacity=CAPACITY, **RULES[rule], **per_row)
    return np.asarray(out.tokens_BxN), np.asarray(out.num_generated_B)

  reqs = make_requests(args.requests)
  buckets: dict[tuple[str, int], list[dict]] = {}
  for r in reqs:
    buckets.setdefault((r["rule"], width_of(len(r["prompt"]))), []).append(r)
  batches = [(key, group[i:i + args.batch]) for key, group in sorted(buckets.items())
             for i in range(0, len(group), args.batch)]

  counter = CompileCounter()
  t0 = time.perf_counter()
  for (rule, width), _ in buckets.items():  # warm-up: one call per bucket
    run(*pack([], args.batch, width), rule)
  warm_s = time.perf_counter() - t0
  compiles_warmup, rss_warm = counter.count, rss_mib()
  cache_warm = spec_decode._asd_decode._cache_size()

  outputs: dict[int, np.ndarray] = {}
  t0 = time.perf_counter()
  for (rule, width), group in batches:
    tokens, _ = run(*pack(group, args.batch, width), rule)
    for b, r in enumerate(group):
      outputs[r["id"]] = tokens[b]
  serve_s = time.perf_counter() - t0
  compiles_serving, rss_end = counter.count - compiles_warmup, rss_mib()
  cache_end = spec_decode._asd_decode._cache_size()

  t0 = time.perf_counter()
  mismatched = []
  for r in reqs:  # each request alone (batch 1; compiles its own programs, after the check)
    prompt, lengths, max_new, _, samplings = pack([r], 1, width_of(len(r["prompt"])))
    alone, _ = run(prompt, lengths, max_new, r["seed"], samplings, r["rule"])
    if not np.array_equal(alone[0], outputs[r["id"]]):
      mismatched.append(r["id"])
  alone_s = time.perf_counter() - t0

  growth = (rss_end - rss_warm) / rss_warm
  report = {
      "requests": len(reqs), "batch_size": args.batch, "buckets": len(buckets),
      "batches": len(batches), "rules": list(RULES), "max_new_tokens": MAX_NEW, "K": K,
      "warmup_s": round(warm_s, 2), "serving_s": round(serve_s, 2),
      "alone_s": round(alone_s, 2),
      "compilations_warmup": compiles_warmup, "compilations_after_warmup": compiles_serving,
      "asd_decode_programs_after_warmup": cache_warm, "asd_decode_programs_at_end": cache_end,
      "rss_mib_after_warmup": round(rss_warm, 1), "rss_mib_at_end": round(rss_end, 1),
      "rss_growth": round(growth, 4),
      "outputs_equal_alone": len(reqs) - len(mismatched), "mismatched_ids": mismatched,
      "tokens_generated": int(sum(int((o >= 0).sum()) for o in outputs.values())),
  }
  ok = compiles_serving == 0 and cache_end == cache_warm and abs(growth) <= 0.10 and not mismatched
  report["ok"] = ok
  rows = [("requests / batches / buckets", f"{len(reqs)} / {len(batches)} / {len(buckets)}"),
          ("warm-up (s)", f"{warm_s:.1f}"), (f"serving {len(reqs)} requests (s)", f"{serve_s:.1f}"),
          ("compilations during warm-up", str(compiles_warmup)),
          ("compilations after warm-up", str(compiles_serving)),
          ("asd_decode programs (warm-up / end)", f"{cache_warm} / {cache_end}"),
          ("RSS after warm-up (MiB)", f"{rss_warm:.1f}"), ("RSS at end (MiB)", f"{rss_end:.1f}"),
          ("RSS growth", f"{100 * growth:+.2f}%"),
          ("outputs equal to the request alone", f"{len(reqs) - len(mismatched)} / {len(reqs)}"),
          ("verdict", "OK" if ok else "FAILED")]
  width = max(len(a) for a, _ in rows)
  for a, b in rows:
    print(f"{a:<{width}}  {b}")
  Path(args.json).parent.mkdir(parents=True, exist_ok=True)
  Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
  print(f"wrote {args.json}")
  return 0 if ok else 1


if __name__ == "__main__":
  raise SystemExit(main())
