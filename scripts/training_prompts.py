"""The training-prompt generator's command line, kept at its old path; the generator lives in
vsd_jax/training_prompts.py, so the installed packages never import scripts/.

  python -m scripts.training_prompts --num 1000 --seed 0 --out out/prompts.jsonl
"""

from vsd_jax.training_prompts import build_training_prompts, main  # noqa: F401

if __name__ == "__main__":
  main()
