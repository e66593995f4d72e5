"""vsd_jax: drafter training (data pipeline, objectives, sharded trainer, checkpoints).

  python -m vsd_jax.build_dataset --config=smollm2_eagle3      # target answers -> TFDS
  python -m vsd_jax.train --config=smollm2_eagle3 --mesh=4x2 --workdir=DIR

One concept per module:
  training_prompts templated offline prompts, disjoint from the eval suites
  dataset_builder  TFDS builder (array_record, no TensorFlow): tokens + loss masks
  data             seeded, resumable batch reader (tfds.data_source)
  objective_api    the `Objective` plug point (loss_fn / ranks_fn) shared by all objectives
  eagle3_ttt       EAGLE-3 training-time test, soft CE to the target on the draft vocabulary
  medusa_loss      Medusa head loss;  distill_loss: standalone LM, KL to the target
  simulated_tau    DecodeStats-tau replayed on held-out greedy target text (chain, tree)
  train_state      AdamW + warmup/cosine + clipping; the TrainState pytree
  sharding_rules   (data, model) mesh, logical axes -> mesh axes (models/sharding.RULES)
  checkpointing    orbax CheckpointManager: state, data position, run description
  feature_cache    optional offline target features
  trainer, train   the loop and its CLI
"""

from vsd_jax.objective_api import Objective

__all__ = ["Objective"]
