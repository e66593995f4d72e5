"""Training recipes for `python -m vsd_jax.train`: frozen dataclasses and a name -> preset table.

A preset fixes everything that shapes the compiled train step (model pair, drafter, sequence
length, batch) and the schedule; the CLI only picks one and may override fields with
`--set field=value`. `tiny` builds a random target in-process (tests, laptops).
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """How `python -m vsd_jax.build_dataset` makes the dataset a preset trains on."""

  num_prompts: int = 700  # training prompts (vsd_jax/training_prompts.py, disjoint from eval)
  heldout_prompts: int = 48  # held-out split: same generator, later prompts
  prompt_seed: int = 0
  max_new_tokens: int = 128  # the target's answer length cap
  gen_batch: int = 32
  # 0: the target's greedy answers (then the data is VSD's oracle). > 0: answers sampled at this
  # temperature, one seed per prompt (answer_seed + its index), so the text is the target's own
  # distribution but not its greedy choice: VSD then needs vsd_oracle=target.
  answer_temperature: float = 0.0
  answer_seed: int = 0

  def __post_init__(self):
    if not 0.0 <= self.answer_temperature < float("inf"):  # also refuses NaN
      raise ValueError(f"answer_temperature must be finite and >= 0, got {self.answer_temperature}")
    # Counts feed list slices and range(): a negative one would silently slice from the end,
    # a zero batch crashes mid-build. Seeds go to numpy RNGs, which refuse negative ones.
    for f in ("num_prompts", "heldout_prompts", "max_new_tokens", "gen_batch"):
      if getattr(self, f) <= 0:
        raise ValueError(f"data.{f} must be positive, got {getattr(self, f)}")
    for f in ("prompt_seed", "answer_seed"):
      if getattr(self, f) < 0:
        raise ValueError(f"data.{f} must be >= 0, got {getattr(self, f)}")

  @property
  def greedy(self) -> bool:
    return self.answer_temperature == 0.0

  @property
  def answers(self) -> str:
    """How the answers are made, as recorded in the dataset's metadata (and checked on use)."""
    if self.greedy:
      return "greedy"
    return (f"train sampled at temperature {self.answer_temperature:g} (seed "
            f"{self.answer_seed} + prompt index), held-out greedy")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  name: str
  target: str = "smollm2-135m"  # a models/registry name or path; "tiny": random, in-process
  drafter: str = "eagle3"  # eagle3 | medusa | standalone
  data: DataConfig = DataConfig()
  data_dir: str = ""  # default: out/data/<preset name> (see `dataset_dir`)
  # drafter shapes
  draft_vocab_size: int = 8192  # EAGLE-3 reduced vocabulary (frequency-ranked on train data)
  fused_layers: tuple[int, ...] = ()  # EAGLE-3 target layers; (): EAGLE-3's default
  ttt_steps: int = 4  # EAGLE-3 training-time-test unroll
  ttt_step_decay: float = 0.8  # weight of unroll step j is decay**j (EAGLE-3)
  medusa_heads: int = 4
  standalone_layers: tuple[int, ...] = (0,)  # target layers copied into the standalone drafter
  # VSD objective (specs/vsd.md; `--objective=vsd`, EAGLE-3 drafters). Ablations: vsd_lambda_wl=0
  # (baseline), vsd_arw/vsd_car off (+WL), vsd_car off (+WL+ARW), all on (+WL+ARW+CAR).
  vsd_paths: int = 16  # S proposals per sampled context position
  vsd_depth: int = 7  # d
  vsd_top_k: int = 8  # tree expansion per frontier node
  vsd_proposal: str = "tree"  # tree | iid (temperature-1 samples)
  vsd_oracle: str = "data"  # data: the target-regenerated greedy text | target: a tree forward
  vsd_positions: int = 4  # context positions sampled per sequence per step
  vsd_eta: float = 1.0  # path weights softmax(eta * utility)
  vsd_utility: str = "accepted"  # accepted length | expected (T=1 acceptance; target oracle)
  vsd_arw: bool = True  # adaptive rejection weighting (control variate on the weights)
  vsd_car: bool = True  # confidence-aware regularisation (unlikelihood on hard negatives)
  vsd_gamma: float = 0.5  # CAR's confidence threshold
  vsd_continue: bool = False  # corrected paths go on with the target's path to depth d
  vsd_lambda_div: float = 1.0  # the baseline (TTT) loss, the divergence term
  vsd_lambda_wl: float = 0.5
  vsd_lambda_car: float = 0.1
  diag_positions: int = 8  # held-out positions per sequence for the tree diagnostics (0: off)
  # batch
  seq_len: int = 256
  batch_size: int = 8  # global; must divide by the mesh's data axis
  features: str = "online"  # online: target forward in the step | offline: cached features
  # optimiser
  steps: int = 1000
  lr: float = 3e-4
  warmup_steps: int = 50
  end_lr_ratio: float = 0.1
  weight_decay: float = 0.0
  clip_norm: float = 0.5
  b1: float = 0.9
  b2: float = 0.95
  dtype: str = "float32"  # float32 | bfloat16 (drafter compute and frozen target)
  seed: int = 0  # parameter init and the step RNG
  data_seed: int = 0  # example order
  # bookkeeping
  log_every: int = 10
  eval_every: int = 100
  eval_examples: int = 48  # held-out examples per evaluation (0: all)
  eval_k: int = 4  # simulated chain length
  eval_tree: tuple[int, int] = (4, 4)  # simulated tree (depth, top-k per depth); (0, 0): off
  ckpt_every: int = 100
  keep_checkpoints: int = 3
  # tiny random target (target == "tiny")
  tiny_vocab: int = 64
  tiny_width: int = 32
  tiny_layers: int = 2

  def __post_init__(self):
    if self.drafter not in DRAFTERS:
      raise ValueError(f"drafter must be one of {DRAFTERS}, got {self.drafter!r}")
    if self.dtype not in ("float32", "bfloat16"):
      raise ValueError(f"dtype must be float32 or bfloat16, got {self.dtype!r}")
    if self.features not in ("online", "offline"):
      raise ValueError(f"features must be online or offline, got {self.features!r}")
    for f in ("seq_len", "batch_size", "steps", "ttt_steps", "medusa_heads", "eval_k",
              "vsd_paths", "vsd_depth", "vsd_top_k", "vsd_positions"):
      if getattr(self, f) <= 0:
        raise ValueError(f"{f} must be positive, got {getattr(self, f)}")
    if self.vsd_proposal not in ("tree", "iid"):
      raise ValueError(f"vsd_proposal must be tree or iid, got {self.vsd_proposal!r}")
    if self.vsd_oracle not in ("data", "target"):
      raise ValueError(f"vsd_oracle must be data or target, got {self.vsd_oracle!r}")
    if self.vsd_oracle == "data" and not self.data.greedy:
      raise ValueError("vsd_oracle=data needs the target's greedy answers as training text; "
                       "this preset samples them (answer_temperature="
                       f"{self.data.answer_temperature}), so use vsd_oracle=target")
    if self.vsd_utility not in ("accepted", "expected"):
      raise ValueError(f"vsd_utility must be accepted or expected, got {self.vsd_utility!r}")
    if self.vsd_utility == "expected" and self.vsd_oracle != "target":
      raise ValueError("vsd_utility=expected needs the target's probability of every path "
                       "token, which only the target forward gives (vsd_oracle=target)")
    if self.vsd_continue and self.vsd_oracle != "data":
      raise ValueError("vsd_continue needs the target's greedy continuation to depth d, which "
                       "only the data has (vsd_oracle=data); vsd_oracle=target gives the "
                       "target's token after each draft prefix, not its path")
    # Loss weights and the softmax temperature: inf or NaN turns the loss into NaN.
    for f in ("ttt_step_decay", "vsd_lambda_div", "vsd_lambda_wl", "vsd_lambda_car", "vsd_eta"):
      if not (math.isfinite(getattr(self, f)) and getattr(self, f) >= 0):
        raise ValueError(f"{f} must be a finite number >= 0, got {getattr(self, f)}")
    if self.diag_positions < 0:
      raise ValueError(f"diag_positions must be >= 0, got {self.diag_positions}")
    if not 0.0 <= self.vsd_gamma < 1.0:
      raise ValueError(f"vsd_gamma must be in [0, 1), got {self.vsd_gamma}")
    # The optimiser and the bookkeeping periods: a NaN or non-positive rate turns the drafter
    # into NaNs (or nothing) after one step, and a zero period divides by zero mid-run, after
    # the data and the target have loaded; refuse them here instead.
    if not (math.isfinite(self.lr) and self.lr > 0):
      raise ValueError(f"lr must be a finite number > 0, got {self.lr}")
    for f in ("end_lr_ratio", "weight_decay"):
      if not (math.isfinite(getattr(self, f)) and getattr(self, f) >= 0):
        raise ValueError(f"{f} must be a finite number >= 0, got {getattr(self, f)}")
    if not self.clip_norm > 0:  # inf: no clipping; also refuses NaN
      raise ValueError(f"clip_norm must be > 0, got {self.clip_norm}")
    for f in ("b1", "b2"):
      if not 0.0 <= getattr(self, f) < 1.0:
        raise ValueError(f"{f} must be in [0, 1), got {getattr(self, f)}")
    for f in ("log_every", "ckpt_every", "keep_checkpoints", "draft_vocab_size", "tiny_vocab",
              "tiny_width", "tiny_layers"):
      if getattr(self, f) <= 0:
        raise ValueError(f"{f} must be positive, got {getattr(self, f)}")
    for f in ("warmup_steps", "eval_every", "eval_examples",  # eval_every 0: no evaluation
              "data_seed"):  # numpy's RNGs refuse negative seeds
      if getattr(self, f) < 0:
        raise ValueError(f"{f} must be >= 0, got {getattr(self, f)}")
    if len(self.eval_tree) != 2 or (tuple(self.eval_tree) != (0, 0) and min(self.eval_tree) <= 0):
      raise ValueError(f"eval_tree must be (depth, top-k), both positive, or (0, 0) for off; "
                       f"got {self.eval_tree}")
    # The drafter's deepest term (and the simulated-tau evaluation) labels position p with the
    # token `depth + 1` places on; a sequence no longer than that leaves the deepest terms no
    # label at all, and they would train (or score) nothing without a word.
    depths = {"eagle3": ("ttt_steps", self.ttt_steps), "medusa": ("medusa_heads",
                                                                   self.medusa_heads)}
    looks = [depths[self.drafter]] if self.drafter in depths else []
    looks += [("eval_k", self.eval_k), ("eval_tree depth", self.eval_tree[0])]
    name, deepest = max(looks, key=lambda item: item[1])
    if self.seq_len <= deepest + 1:
      raise ValueError(f"seq_len={self.seq_len} leaves {name}={deepest} no label: each row "
                       f"needs more than {deepest + 1} tokens; raise seq_len or lower {name}")

  def dataset_dir(self) -> str:
    return self.data_dir or f"out/data/{self.name}"


DRAFTERS = ("eagle3", "medusa", "standalone")

_TINY_DATA = DataConfig(num_prompts=96, heldout_prompts=16, max_new_tokens=24, gen_batch=16)

_SMOLLM2_EAGLE3 = TrainConfig(
    name="smollm2_eagle3", drafter="eagle3", data_dir="out/data/smollm2",
    draft_vocab_size=8192, ttt_steps=4, seq_len=192, batch_size=4, steps=240, lr=1.5e-3,
    warmup_steps=10, log_every=10, eval_every=80, eval_examples=32, ckpt_every=40)

PRESETS: dict[str, TrainConfig] = {
    "tiny": TrainConfig(
        name="tiny", target="tiny", drafter="eagle3", data=_TINY_DATA, draft_vocab_size=48,
        fused_layers=(-1, 0, 1), ttt_steps=3, seq_len=32, batch_size=8, steps=40, lr=3e-3, warmup_steps=5,
        log_every=5, eval_every=20, eval_examples=16, ckpt_every=10, eval_tree=(3, 2)),
    "tiny_medusa": TrainConfig(
        name="tiny_medusa", target="tiny", drafter="medusa", data=_TINY_DATA,
        data_dir="out/data/tiny", seq_len=32, batch_size=8, steps=40, lr=3e-3, warmup_steps=5,
        medusa_heads=3, log_every=5, eval_every=20, eval_examples=16, ckpt_every=10,
        eval_k=3, eval_tree=(3, 2)),
    "tiny_standalone": TrainConfig(
        name="tiny_standalone", target="tiny", drafter="standalone", data=_TINY_DATA,
        data_dir="out/data/tiny", seq_len=32, batch_size=8, steps=40, lr=3e-3, warmup_steps=5,
        log_every=5, eval_every=20, eval_examples=16, ckpt_every=10, eval_tree=(3, 2)),
    # SmolLM2-135M-Instruct target; one shared dataset (out/data/smollm2). Sized for a 2-core CPU
    # run of ~15 minutes; on accelerators raise steps / batch_size.
    "smollm2_eagle3": _SMOLLM2_EAGLE3,
    # The same recipe on answers the target *sampled* (T=1): text from the target's distribution
    # that is not its greedy choice, like human or sampled data in the VSD paper. VSD's oracle is
    # then a target forward (vsd_oracle=target), the baseline learns the sampled tokens.
    "smollm2_eagle3_sampled": dataclasses.replace(
        _SMOLLM2_EAGLE3, name="smollm2_eagle3_sampled", data_dir="out/data/smollm2_sampled",
        data=DataConfig(answer_temperature=1.0), vsd_oracle="target"),
    "smollm2_medusa": TrainConfig(
        name="smollm2_medusa", drafter="medusa", data_dir="out/data/smollm2", medusa_heads=4,
        seq_len=256, batch_size=4, steps=200, lr=1e-3, warmup_steps=20, eval_every=50,
        ckpt_every=50),
    "smollm2_standalone": TrainConfig(
        name="smollm2_standalone", drafter="standalone", data_dir="out/data/smollm2",
        standalone_layers=(0,), seq_len=256, batch_size=4, steps=200, lr=1e-3,
        warmup_steps=20, eval_every=50, ckpt_every=50),
}


def get_preset(name: str) -> TrainConfig:
  """The preset called `name` (also accepts `configs/train_presets.py:NAME`)."""
  key = name.rsplit(":", 1)[-1] if ":" in name else name
  if key not in PRESETS:
    raise ValueError(f"unknown training preset {name!r}; known presets: "
                     f"{', '.join(sorted(PRESETS))}")
  return PRESETS[key]


_BOOLS = {"1": True, "true": True, "yes": True, "on": True,
          "0": False, "false": False, "no": False, "off": False}


def _parse_value(item: str, current, raw: str):
  if isinstance(current, tuple):
    try:
      return tuple(int(x) for x in raw.split(",") if x)
    except ValueError:
      raise ValueError(f"bad override {item!r}: expected comma-separated integers, e.g. "
                       f"{','.join(map(str, current)) or '1,2'}") from None
  if isinstance(current, bool):
    if raw.lower() not in _BOOLS:
      raise ValueError(f"bad override {item!r}: expected one of {', '.join(_BOOLS)}")
    return _BOOLS[raw.lower()]
  try:
    return type(current)(raw)
  except ValueError as e:
    raise ValueError(f"bad override {item!r}: {e}") from None


def with_overrides(cfg: TrainConfig, assignments: list[str]) -> TrainConfig:
  """Applies `field=value` strings (values parsed by the field's type); `data.field=value`
  sets a DataConfig field (how build_dataset makes the data, e.g. data.answer_temperature)."""
  fields = [f.name for f in dataclasses.fields(TrainConfig) if f.name != "data"]
  data_fields = [f"data.{f.name}" for f in dataclasses.fields(DataConfig)]
  changes, data_changes = {}, {}
  for item in assignments:
    key, sep, raw = item.partition("=")
    if not sep or key not in fields + data_fields:
      raise ValueError(f"bad override {item!r}: expected field=value with field one of "
                       f"{', '.join(fields + data_fields)}")
    if key.startswith("data."):
      name = key[len("data."):]
      data_changes[name] = _parse_value(item, getattr(cfg.data, name), raw)
    else:
      changes[key] = _parse_value(item, getattr(cfg, key), raw)
  if data_changes:
    changes["data"] = dataclasses.replace(cfg.data, **data_changes)
  return dataclasses.replace(cfg, **changes)
