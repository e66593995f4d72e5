"""Where a speculative round's time goes on this machine: `python scripts/profile_round.py`.

Times (median of --reps, jitted, compile excluded) one target forward over T new tokens at a
realistic cache position, for T = 1 (a plain decoding step), K + 1 (a chain verification) and
N + 1 (a tree verification), plus the drafters' steps; then the speedup bound each drafting
setup allows at a given tau:  bound = tau * t(plain step) / (t(verify) + t(drafting)).
Prints a table and writes JSON (--json). Numbers are ratios from one run; load matters less.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def _median_ms(fn, args, reps):
  import jax
  jax.block_until_ready(fn(*args))  # compile
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append((time.perf_counter() - t) * 1e3)
  return statistics.median(times)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--target", default="smollm2-135m")
  p.add_argument("--capacity", type=int, default=512, help="KV cache slots (bench: ~prompt+256)")
  p.add_argument("--position", type=int, default=200, help="tokens already in the cache")
  p.add_argument("--reps", type=int, default=30)
  p.add_argument("--tau", default="1.33,1.29,1.59", help="tau of standalone K=2, EAGLE-3 chain "
                 "K=3, EAGLE-3 tree 4,4,16 (README / docs/vsd measurements)")
  p.add_argument("--json", default="")
  args = p.parse_args(argv)

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

  rows = {f"target_T{t}": target_ms(t) for t in (1, 2, 3, 4, 5, 17)}

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
      "eagle3 tree 4,4,16": (tau_e3t, rows["target_T17"], 4 * rows["eagle3_step_T4"]),
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
  if args.json:
    Path(args.json).write_text(json.dumps({"forward_ms": rows, "setups": bounds,
                                           "args": vars(args)}, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
