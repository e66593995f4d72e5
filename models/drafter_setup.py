"""From a drafter name or folder to what the engines need: one function for CLIs and benches.

Kinds: "standalone" (a small LM with the target's tokenizer; chain or dynamic tree), "eagle3"
(EAGLE-3 head; dynamic trees, a chain being the depth-K top-1 tree), "medusa" (Medusa heads;
static trees), "ngram" (no model: n-gram lookup in the request's own tokens; chains only;
named 'ngram', 'ngram:MAX' or 'ngram:MIN-MAX', each optionally '+store': the target's shipped
n-gram store as a fallback). "self" makes the target its own standalone
drafter (a correctness check).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from asd_jax.draft_tree import TreeDrafter, TreeShape, lm_tree_drafter
from asd_jax.drafter_api import ChainDrafter, lm_chain_drafter
from asd_jax.lm_api import LanguageModelFns
from asd_jax.ngram_drafter import ngram_drafter, parse_ngram_name, uses_store
from asd_jax.request_checks import check_positive_int
from models.errors import CheckpointError, UnknownModelError
from models.load import LoadedModel
from models.lm_fns import decoder_fns

KINDS = ("standalone", "eagle3", "medusa", "ngram")
CHAIN_ONLY_KINDS = frozenset({"ngram"})  # kinds with no tree drafter: setup_drafter refuses a tree

# The chain length K each shipped drafter's README benchmarks ran it at, by JAX backend: "cpu"
# (two CPU cores) or "accelerator" (one NVIDIA H200; a TPU gets the same, untested). Only the
# store's K was chosen among several (README, "So which K where"): on the GPU a round verifying
# 9-13 positions costs about one plain step, so a longer chain pays there, while on the CPU
# every verified position costs arithmetic. The standalone drafter was distilled for K=2
# (scripts/distill_standalone_drafter.py); EAGLE-3 ran at K=3 only.
BENCHMARKED_K: dict[str, dict[str, int]] = {
    "smollm2-135m-standalone": {"cpu": 2},
    "smollm2-135m-eagle3": {"cpu": 3, "accelerator": 3},
    # GPU: strict 1.59x at K=3, 1.65x at 5, 1.71x at 8, 1.74x at 12; ASD's answers grow with K
    # (+22% at K=12 on HumanEval, on the CPU), so 8. CPU: K=5 1.25x strict, K=12 0.98x.
    "ngram+store": {"cpu": 5, "accelerator": 8},
}
FALLBACK_K = 4  # any other drafter


def default_k(draft: str, backend: str) -> int:
  """K for a drafter named `draft` when the user gives none: the K it was benchmarked at on
  `backend` (jax.default_backend()), the CPU's when only that was run, else FALLBACK_K."""
  by_backend = BENCHMARKED_K.get(str(draft).lower(), {})
  where = "cpu" if backend == "cpu" else "accelerator"
  return by_backend.get(where, by_backend.get("cpu", FALLBACK_K))


@dataclasses.dataclass
class DrafterSetup:
  kind: str
  drafter: ChainDrafter | TreeDrafter
  params: Any
  target_fns: LanguageModelFns  # with the hidden layers this drafter reads
  target_params: Any

  @property
  def engine(self) -> str:
    return "tree" if isinstance(self.drafter, TreeDrafter) else "chain"

  @property
  def decode(self):
    """The engine's entry point for this drafter: asd_tree_decode or asd_decode."""
    from asd_jax.spec_decode import asd_decode
    from asd_jax.tree_decode import asd_tree_decode
    return asd_tree_decode if self.engine == "tree" else asd_decode


def infer_kind(name_or_path: str | os.PathLike) -> str:
  """The drafter kind from a folder's config.json (or a known standalone name)."""
  if str(name_or_path) == "self":
    return "standalone"
  if parse_ngram_name(str(name_or_path)) is not None:
    return "ngram"
  folder = _drafter_folder(name_or_path)
  try:
    hf = json.loads((Path(folder) / "config.json").read_text())
  except (OSError, ValueError) as e:
    raise CheckpointError(f"{folder}/config.json: unreadable ({e})") from None
  return kind_of_config(hf)


def _drafter_folder(name_or_path: str | os.PathLike) -> Path:
  """resolve_drafter, whose error for an unknown name also names the drafters that need no
  folder (a user who typed 'ngarm' learns the n-gram names, not only the folder names)."""
  from models.drafter_folder import resolve_drafter
  try:
    return resolve_drafter(name_or_path)
  except UnknownModelError as e:
    raise UnknownModelError(f"{e}; the drafters without a folder are 'self' (the target drafts "
                            "for itself), 'ngram', 'ngram:MAX' and 'ngram:MIN-MAX', each n-gram "
                            "name optionally with '+store'") from None


def kind_of_config(hf: dict) -> str:
  """The drafter kind a drafter folder's config.json describes."""
  kind = hf.get("asd_jax_drafter")
  if kind in KINDS:
    return kind
  if "LlamaForCausalLMEagle3" in (hf.get("architectures") or []):
    return "eagle3"
  return "standalone"


def ngram_store_for(target_name: str, vocab_size: int):
  """The n-gram store shipped for a target name: drafters/<target>-ngram-store."""
  from asd_jax.ngram_store import StoreError, load_store
  from models.drafter_folder import DRAFTERS_DIR
  folder = DRAFTERS_DIR / f"{target_name}-ngram-store"
  if not folder.is_dir():
    raise StoreError(f"no n-gram store for target {target_name!r} (looked for {folder}); build "
                     "one from a training dataset with scripts/build_ngram_store.py")
  return load_store(folder, vocab_size)


def check_drafter_request(name_or_path: str | os.PathLike, kind: str | None,
                          tree: TreeShape | None) -> str:
  """The checks of setup_drafter that need no model, so a CLI can run them before its load:
  a malformed n-gram name, an unknown kind, an unknown drafter name or a folder without a
  readable config.json, a kind other than the one that config.json holds, and a tree for the
  chain-only n-gram drafter. Returns the drafter's kind."""
  sizes = parse_ngram_name(str(name_or_path))  # raises on a malformed 'ngram:...' name
  if kind is not None and kind not in KINDS:
    raise ValueError(f"unknown drafter kind {kind!r}; choose one of {KINDS}")
  if kind == "ngram" and sizes is None:
    raise ValueError(f"drafter kind 'ngram' needs an n-gram drafter name ('ngram', "
                     f"'ngram:MAX' or 'ngram:MIN-MAX', optionally with '+store'), got "
                     f"{name_or_path!r}")
  held = infer_kind(name_or_path)
  # Loading an EAGLE-3 folder as Medusa (or back) fails deep in the engine otherwise.
  if kind is not None and held != kind:
    raise ValueError(f"drafter {str(name_or_path)!r} is of kind {held!r}, but kind "
                     f"{kind!r} was requested (--drafter {kind}); pass --drafter {held} "
                     "or leave it out")
  if held == "ngram" and tree is not None:
    raise ValueError("the n-gram drafter drafts chains only; drop --tree")
  return held


def setup_drafter(name_or_path: str, target: LoadedModel, *, k: int,
                  tree: TreeShape | None = None, kind: str | None = None,
                  dtype: str = "float32", target_name: str = "target") -> DrafterSetup:
  """Loads a drafter and builds the engine-side functions for it and for the target.

  Chains (tree=None) use K = k; EAGLE-3 and Medusa always run in the tree engine (a chain is
  the depth-k top-1 tree).
  """
  k = check_positive_int("K", k)
  kind = check_drafter_request(name_or_path, kind, tree)  # reads a folder's config.json once
  plain_fns, plain_params = decoder_fns(target.model, name=target_name)
  if kind == "ngram":
    sizes = parse_ngram_name(str(name_or_path))
    store = ngram_store_for(target_name, plain_fns.vocab_size) if uses_store(
        str(name_or_path)) else None
    drafter = ngram_drafter(k, plain_fns.vocab_size, min_ngram=sizes[0], max_ngram=sizes[1],
                            store=store)
    return DrafterSetup(kind, drafter, None if store is None else store.tables, plain_fns,
                        plain_params)
  if kind == "standalone":
    if str(name_or_path) == "self":
      fns, params = plain_fns, plain_params
    else:
      from models.drafter_folder import load_standalone_drafter
      fns, params = decoder_fns(load_standalone_drafter(name_or_path, target=target,
                                                        dtype=dtype), name=str(name_or_path))
    drafter = lm_chain_drafter(fns, k) if tree is None else lm_tree_drafter(fns, tree)
    return DrafterSetup(kind, drafter, params, plain_fns, plain_params)

  from models.drafter_checkpoint import load_drafter
  model = load_drafter(_drafter_folder(name_or_path), target, dtype=dtype)
  shape = tree or TreeShape(depth=k, top_k=1, num_nodes=k)
  if kind == "eagle3":
    from models.eagle3 import eagle3_fns
    from models.feature_drafters import eagle3_tree_drafter
    fns, params = eagle3_fns(model)
    drafter = eagle3_tree_drafter(fns, shape)
  else:
    from models.feature_drafters import medusa_drafter_params, medusa_tree_drafter
    drafter = medusa_tree_drafter(model, target.model, shape)
    params = medusa_drafter_params(model, target.model)
  target_fns, target_params = decoder_fns(target.model, hidden_layers=drafter.feature_layers,
                                          name=target_name)
  return DrafterSetup(kind, drafter, params, target_fns, target_params)
