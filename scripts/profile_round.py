"""Where a speculative round's time goes on this machine: `python scripts/profile_round.py`.

Times (median of --reps, jitted, compile excluded) one target forward over T new tokens at a
realistic cache position, for T = 1 (a plain decoding step), K + 1 (a chain verification) and
N + 1 (a tree verification), plus the drafters' steps; then the speedup bound each drafting
setup allows at a given tau:  bound = tau * t(plain step) / (t(verify) + t(drafting)).
Prints a table and writes JSON (--json). Numbers are ratios from one run; load matters less.

It also times the real decode loops on one --loop-tokens request: ms per plain decoding step,
per chain round (K = 3) with a drafter that costs nothing (the n-gram drafter, and one that
always proposes token 0), and per round that the chain engine skips (a plain step inside its
lax.cond), i.e. what the loop adds to the forwards it runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # scripts.* when run as a file

WIDEST_FORWARD = 17  # a 4,4,16 tree's verify forward: its 16 nodes and the root


def _median_ms(fn, args, reps):
  import jax
  jax.block_until_ready(fn(*args))  # compile
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append((time.perf_counter() - t) * 1e3)
  return statistics.median(times)


def loop_ms(fns, params, n: int, reps: int) -> dict[str, tuple[float, float]]:
  """{loop: (median ms per step or round, tau)} for plain decoding and free chain drafters."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from asd_jax.ngram_drafter import ngram_drafter
  from scripts.decode_loop_timing import token0_drafter
  from asd_jax.plain_decode import plain_decode
  from asd_jax.spec_decode import asd_decode, required_capacity

  k = 3
  rng = np.random.RandomState(0)
  prompt = np.zeros((1, 64), np.int32)
  prompt[0, :60] = rng.randint(100, 5000, 60)
  lengths = np.array([60], np.int32)

  def zeros_drafter(verify: bool):
    """Always proposes token 0; with verify=False it reports no draft, so every round is a
    skipped (plain) step inside the chain engine's lax.cond."""
    return token0_drafter(k, fns.vocab_size, name=f"zeros{verify}", draft_length=None if verify
                          else (lambda state: jnp.zeros((prompt.shape[0],), jnp.int32)))

  # One cache size for every loop (attention and the cache's buffers cost by capacity), and
  # per-step times over the forwards after the prefill in both: the prefill made the first
  # token, and its cost is in every loop's total alike.
  capacity = required_capacity(prompt.shape[1], n, k)

  def plain():
    out = plain_decode(fns, params, prompt, lengths, max_new_tokens=n, capacity=capacity)
    return out.tokens_BxN, n - 1, n - 1   # (output, steps, tokens those steps produced)

  def chain(drafter):
    def run():
      out = asd_decode(fns, params, drafter, None, prompt, lengths, max_new_tokens=n,
                       capacity=capacity)
      return out.tokens_BxN, out.stats.rounds_B[0], n - 1
    return run

  setups = {"plain step": plain, f"chain K={k} round, n-gram drafter": chain(
      ngram_drafter(k, fns.vocab_size)), f"chain K={k} round, token-0 drafter": chain(
          zeros_drafter(True)), "chain round skipped (no draft)": chain(zeros_drafter(False))}
  times = {name: [] for name in setups}
  tau = {}
  for name, run in setups.items():
    jax.block_until_ready(run())  # compile
  for _ in range(reps):  # interleaved, so a load change hits every loop alike
    for name, run in setups.items():
      t = time.perf_counter()
      _, steps, made = jax.block_until_ready(run())
      times[name].append((time.perf_counter() - t) * 1e3 / int(steps))
      tau[name] = made / int(steps)
  return {name: (statistics.median(v), tau[name]) for name, v in times.items()}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--target", default="smollm2-135m")
  p.add_argument("--capacity", type=int, default=512, help="KV cache slots (bench: ~prompt+256)")
  p.add_argument("--position", type=int, default=200, help="tokens already in the cache")
  p.add_argument("--reps", type=int, default=30)
  p.add_argument("--tau", default="1.33,1.29,1.59", help="tau of standalone K=2, EAGLE-3 chain "
                 "K=3, EAGLE-3 tree 4,4,16 (README / docs/vsd measurements)")
  p.add_argument("--loop-tokens", type=int, default=128, help="tokens per timed decode loop")
  p.add_argument("--json", default="")
  args = p.parse_args(argv)
  from asd_jax.cli_common import check_positive_flags
  try:
    check_positive_flags(args, "capacity", "reps", "loop_tokens")
  except ValueError as e:
    p.error(str(e))
  if not 0 <= args.position <= args.capacity - WIDEST_FORWARD:
    # Slots past the cache would be dropped by the scatter and time a different forward.
    p.error(f"--position must be in [0, --capacity - {WIDEST_FORWARD}] = [0, "
            f"{args.capacity - WIDEST_FORWARD}] (the widest timed forward has "
            f"{WIDEST_FORWARD} tokens), got {args.position}")

  import jax
  import jax.numpy as jnp
  from models.drafter_folder import load_standalone_drafter
  from models.load import load_decoder
  from models.lm_fns import decoder_fns
  from models.drafter_checkpoint import load_drafter
  from models.drafter_folder import resolve_drafter

  loaded = load_decoder(args.target)
  fns, params = decoder_fns(loaded.model)
  cache = fns.init_cache(1, args.capacity)
  pos0 = args.position

  def target_ms(t):
    tokens = jnp.ones((1, t), jnp.int32)
    positions = pos0 + jnp.arange(t, dtype=jnp.int32)[None]
    slots = positions
    visible = jnp.arange(args.capacity)[None, None] <= positions[..., None]
    f = jax.jit(lambda p, c: fns.tree_forward(p, tokens, positions, slots, visible, c)[0])
    return _median_ms(f, (params, cache), args.reps)

  rows = {f"target_T{t}": target_ms(t) for t in (1, 2, 3, 4, 5, WIDEST_FORWARD)}

  sa = load_standalone_drafter("smollm2-135m-standalone", target=loaded)
  sfns, sparams = decoder_fns(sa)
  scache = sfns.init_cache(1, args.capacity)
  tok1 = jnp.ones((1, 1), jnp.int32)
  pos1 = jnp.full((1, 1), pos0, jnp.int32)
  rows["standalone_step_T1"] = _median_ms(
      jax.jit(lambda p, c: sfns.forward(p, tok1, pos1, c)[0]), (sparams, scache), args.reps)

  e3 = load_drafter(resolve_drafter("smollm2-135m-eagle3"), loaded)
  from models.eagle3 import eagle3_fns
  efns, eparams = eagle3_fns(e3)
  ecache = efns.init_cache(1, args.capacity)
  d = e3.cfg.hidden_size
  for t in (1, 4):
    toks = jnp.ones((1, t), jnp.int32)
    poss = pos0 + jnp.arange(t, dtype=jnp.int32)[None]
    hid = jnp.zeros((1, t, d), jnp.float32)
    rows[f"eagle3_step_T{t}"] = _median_ms(
        jax.jit(lambda p, c: efns.step(p, toks, hid, poss, c)[0]), (eparams, ecache), args.reps)

  plain = rows["target_T1"]
  tau_sa, tau_e3c, tau_e3t = (float(x) for x in args.tau.split(","))
  setups = {
      "standalone chain K=2": (tau_sa, rows["target_T3"], 2 * rows["standalone_step_T1"]),
      "eagle3 chain K=3": (tau_e3c, rows["target_T4"], 3 * rows["eagle3_step_T1"]),
      "eagle3 tree 4,4,16": (tau_e3t, rows[f"target_T{WIDEST_FORWARD}"],
                             4 * rows["eagle3_step_T4"]),
  }
  print(f"{'forward':<22} {'ms':>8} {'x plain step':>12}")
  for k, v in rows.items():
    print(f"{k:<22} {v:8.2f} {v / plain:12.2f}")
  print(f"\n{'setup':<22} {'tau':>5} {'verify ms':>10} {'draft ms':>9} {'bound':>6} {'tau for 2x':>10}")
  bounds = {}
  for name, (tau, verify, draft) in setups.items():
    bound = tau * plain / (verify + draft)
    need = 2.0 * (verify + draft) / plain
    bounds[name] = {"tau": tau, "verify_ms": verify, "draft_ms": draft, "speedup_bound": bound,
                    "tau_needed_for_2x": need}
    print(f"{name:<22} {tau:5.2f} {verify:10.2f} {draft:9.2f} {bound:6.2f} {need:10.2f}")
  loops = loop_ms(fns, params, args.loop_tokens, args.reps // 10 or 1)
  print(f"\n{'decode loop':<30} {'ms':>8} {'x plain step':>12} {'tau':>6}")
  for name, (ms, tau) in loops.items():
    print(f"{name:<30} {ms:8.2f} {ms / loops['plain step'][0]:12.2f} {tau:6.2f}")
  if args.json:
    Path(args.json).write_text(json.dumps({
        "forward_ms": rows, "setups": bounds,
        "loop_ms": {k: {"ms": v[0], "tau": v[1]} for k, v in loops.items()},
        "args": vars(args)}, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
