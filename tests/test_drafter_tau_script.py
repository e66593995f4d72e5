"""scripts/drafter_tau.py end to end on a tiny target: its tau is the tokens the rounds output
per round (DecodeStats), its accepted_drafts gives the definition recorded before 2026-12-07,
and drafters compare on the same prompts."""

import json

from scripts import drafter_tau
from tests.test_bench_cli import tiny_target  # noqa: F401  (module fixture)


def test_tau_counts_output_tokens_and_compares_drafters(tiny_target, tmp_path):  # noqa: F811
  out = tmp_path / "tau.json"
  assert drafter_tau.main(["--target", str(tiny_target), "--draft", "self,ngram", "--tree", "",
                           "--k", "3", "--suite", "mt_bench", "--num-prompts", "2",
                           "--max-new-tokens", "10", "--json", str(out)]) == 0
  drafters = json.loads(out.read_text())["drafters"]
  for name, row in drafters.items():
    suite = row["mt_bench"]
    # Every token after each answer's first (the prefill's) comes from a round.
    assert suite["tau"] == (suite["tokens"] - 2) / suite["rounds"], name
    assert row["all"]["tau"] == suite["tau"]
    assert suite["accepted_drafts"] <= 3 * suite["rounds"]
    assert suite["outputs_differing_from_first_drafter"] == 0  # strict: both give plain greedy
  # The target drafting for itself accepts all K in every round but the last: 20 tokens in 2
  # answers, 18 from rounds of 4.
  self_row = drafters["self"]["mt_bench"]
  assert self_row["tokens"] == 20 and self_row["rounds"] == 6 and self_row["tau"] == 3.0
