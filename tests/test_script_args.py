"""The research scripts refuse bad flags with an `error:` line and exit code 2 before they load
the target or decode anything: scripts/build_ngram_store.py, distill_standalone_drafter.py,
drafter_tau.py, simulate_ngram_widths.py, strict_vs_plain_dtypes.py and penalty_tau.py (one
line), and the argparse-style profile_round.py, time_decode_loop.py, bench_few_rows_matmul.py,
ngram_store_scaling.py, vsd_report.py, prompt_logprobs_cost.py and row_sampling_batch.py (usage,
then the error). Their results come after minutes of decoding or training, so a typo must not
cost them."""

import json

import pytest

from scripts import (bench_few_rows_matmul, build_ngram_store, distill_standalone_drafter,
                     drafter_tau, ngram_store_scaling, penalty_tau, profile_round,
                     prompt_logprobs_cost, row_sampling_batch, simulate_ngram_widths,
                     strict_vs_plain_dtypes, time_decode_loop, vsd_report)

COST = json.dumps({w: 1.0 + 0.1 * w for w in range(8)})


@pytest.fixture(autouse=True)
def no_target(no_model_load):
  """Every test here: the flags fail before the target or its tokenizer loads."""


@pytest.fixture
def paths(tmp_path):
  """{placeholder: path} for the tables' arguments."""
  answers = [{"suite": s, "prompt": [1, 2, 3], "output": [4, 5]} for s in ("humaneval", "mt_bench")]
  files = {"answers": json.dumps(answers), "humaneval_only": json.dumps(answers[:1]),
           "not_json": "{bad", "not_answers": '{"x": 1}', "a_file": ""}
  for name, text in files.items():
    (tmp_path / name).write_text(text)
  (tmp_path / "a_folder").mkdir()
  drafter = tmp_path / "a_drafter"  # an exported drafter: its manifest is training provenance
  drafter.mkdir()
  for name, text in {"config.json": "{}", "model.safetensors": "",
                     "manifest.json": '{"steps": 10}'}.items():
    (drafter / name).write_text(text)
  return {name: str(tmp_path / name) for name in [*files, "a_folder", "a_drafter"]}


def run(main, argv, paths, capsys):
  """(exit code, stderr) of main(argv), each '{name}' in argv replaced by paths[name]."""
  for name, path in paths.items():
    argv = [a.replace("{" + name + "}", path) for a in argv]
  try:
    code = main(argv)
  except SystemExit as e:
    code = e.code
  return code, capsys.readouterr().err.strip()


def assert_one_line_error(code, err, message):
  assert code == 2, err
  assert err.startswith("error: ") and message in err and "\n" not in err, err


BUILD = [
    (["--max-n", "1000000"], "--min-n / --max-n: max_n 1000000 is above 9"),
    (["--min-n", "3", "--max-n", "2"], "need 1 <= min_n <= max_n"),
    (["--out", "{a_file}"], "is a file, not a folder"),
    (["--out", "{a_file}/store"], "is a file, not a folder"),
    (["--out", ""], "--out is empty"),
    (["--out", "{a_drafter}"], "holds config.json, model.safetensors, so it is not an n-gram"),
]


@pytest.mark.parametrize("argv, message", BUILD, ids=[" ".join(a) for a, _ in BUILD])
def test_build_ngram_store(argv, message, paths, capsys):
  base = ["--dataset", "{a_folder}/no_dataset", "--target", "smollm2-135m", "--out",
          "{a_folder}/store"]
  assert_one_line_error(*run(build_ngram_store.main, base + argv, paths, capsys), message)


TAU = [
    (["--tree", "2,,3"], "--tree must be DEPTH,TOPK,NODES"),
    (["--tree", "", "--k", "0"], "--k must be positive, got 0"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be positive, got 0"),
    (["--num-prompts", "0"], "--num-prompts must be positive, got 0"),
    (["--suite", "foo"], "unknown suite 'foo'"),
    (["--draft", "self,,ngram"], "--draft 'self,,ngram' has an empty entry"),
    (["--draft", "ngram"], "the n-gram drafter drafts chains only"),
    (["--draft", "self,no-such-drafter"], "unknown drafter 'no-such-drafter'"),
    (["--json", "{a_folder}"], "is a folder, not a file"),
    (["--json", "{a_file}/out.json"], "is a file, not a folder"),
]


@pytest.mark.parametrize("argv, message", TAU, ids=[" ".join(a) for a, _ in TAU])
def test_drafter_tau(argv, message, paths, capsys):
  assert_one_line_error(*run(drafter_tau.main, ["--draft", "self"] + argv, paths, capsys),
                        message)


SIMULATE = [
    (["--ks", "0"], "--ks: a draft length K must be a positive integer, got 0"),
    (["--ks", "-3"], "--ks: a draft length K must be a positive integer, got -3"),
    (["--ks", "-3,5"], "--ks: a draft length K must be a positive integer, got -3"),
    (["--ks", "3,,5"], "--ks '3,,5' has an empty entry"),
    (["--ks", "3,x"], "--ks must be comma-separated integers"),
    (["--measure", "1", "--measure-ks", "0"], "--measure-ks: a draft length K"),
    (["--cost", "{bad"], "--cost is not valid JSON"),
    (["--cost", "[1]"], "--cost must be a JSON object"),
    (["--cost", '{"1": 1.1}', "--ks", "3"], "--cost has no cost for width 2"),
    (["--cost", '{"1": -1, "2": 1, "3": 1}', "--ks", "3"], "costs finite and > 0"),
    (["--cost", '{"1": "x"}', "--ks", "1"], "not an integer width and a number"),
    # the measured K are replayed too
    (["--ks", "3", "--measure", "1", "--measure-ks", "9"], "--cost has no cost for width 8"),
    (["--answers", "{a_folder}"], "is a folder, not a file"),
    (["--answers", "{not_json}"], "cannot read it"),
    (["--answers", "{not_answers}"], "not an answers file of this script"),
    (["--answers", "{humaneval_only}"], "has no answers for suite 'mt_bench'"),
    (["--measure-temperature", "nan"], "--measure-temperature: temperature must be a finite"),
    (["--measure-temperature", "-1"], "--measure-temperature: temperature must be a finite"),
    (["--measure", "-1"], "--measure must be >= 0"),
    (["--num-prompts", "0"], "--num-prompts must be positive, got 0"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be positive, got 0"),
    (["--suites", "foo"], "unknown suite 'foo'"),
    (["--json", "{a_folder}"], "is a folder, not a file"),
]


@pytest.mark.parametrize("argv, message", SIMULATE, ids=[" ".join(a) for a, _ in SIMULATE])
def test_simulate_ngram_widths(argv, message, paths, capsys):
  base = ["--answers", "{answers}", "--cost", COST]
  assert_one_line_error(*run(simulate_ngram_widths.main, base + argv, paths, capsys), message)


DTYPES = [
    (["--k", "0"], "--k must be positive, got 0"),
    (["--num-prompts", "-1"], "--num-prompts must be positive, got -1"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be positive, got 0"),
    (["--dtypes", "float16"], "--dtypes: unknown ['float16']"),
    (["--dtypes", "float32,,bfloat16"], "has an empty entry"),
    (["--suite", "foo"], "unknown suite 'foo'"),
    (["--json", "{a_folder}"], "is a folder, not a file"),
]


@pytest.mark.parametrize("argv, message", DTYPES, ids=[" ".join(a) for a, _ in DTYPES])
def test_strict_vs_plain_dtypes(argv, message, paths, capsys):
  assert_one_line_error(*run(strict_vs_plain_dtypes.main, argv, paths, capsys), message)


PENALTY_TAU = [
    (["--k", "0"], "--k must be positive, got 0"),
    (["--num-prompts", "0"], "--num-prompts must be positive, got 0"),
    (["--timing-repeats", "0"], "--timing-repeats must be positive, got 0"),
    (["--repetition-penalties", "1.0,0"], "--repetition-penalties: '0': repetition_penalty must"),
    (["--repetition-penalties", "1.2,x"], "--repetition-penalties: 'x': "),
    (["--repetition-penalties", "1.0,,1.2"], "has an empty entry"),
    (["--suite", "foo"], "unknown suite 'foo'"),
    (["--json", "{a_folder}"], "is a folder, not a file"),
]


@pytest.mark.parametrize("argv, message", PENALTY_TAU, ids=[" ".join(a) for a, _ in PENALTY_TAU])
def test_penalty_tau(argv, message, paths, capsys):
  assert_one_line_error(*run(penalty_tau.main, argv, paths, capsys), message)


DISTILL = [
    (["--steps", "0"], "--steps must be positive, got 0"),
    (["--lr", "0"], "--lr must be positive, got 0.0"),
    (["--warmup", "-1"], "--warmup must be >= 0, got -1"),
    (["--init-layers", "0,x"], "--init-layers must be comma-separated layer numbers"),
    (["--init-layers", "0,,1"], "--init-layers must be comma-separated layer numbers"),
    (["--init-layers", "-1"], "--init-layers must be layer numbers >= 0"),
    (["--out", "{a_file}"], "--out {a_file} is a file, not a folder"),
    (["--out", "{a_folder_with_data}"], "--out: "),
]


@pytest.mark.parametrize("argv, message", DISTILL, ids=[" ".join(a) for a, _ in DISTILL])
def test_distill_standalone_drafter(argv, message, paths, tmp_path, capsys):
  """Its run generates data and trains for about an hour before it writes --out."""
  data = tmp_path / "a_folder_with_data"
  data.mkdir()
  (data / "notes.txt").write_text("mine")
  code, err = run(distill_standalone_drafter.main, argv,
                  {**paths, "a_folder_with_data": str(data)}, capsys)
  assert_one_line_error(code, err, message.format(**paths))
  assert (data / "notes.txt").read_text() == "mine"


# Scripts with argparse's own error form (usage, then "prog: error: ..."). In the timing scripts
# a count of 0 ended in a traceback after the model load ("no median for empty data"), and a
# --position past the cache timed a forward whose writes were dropped; vsd_report's --json
# failed after the table.
ARGPARSE_SCRIPTS = [
    (profile_round, ["--reps", "0"], "--reps must be positive, got 0"),
    (profile_round, ["--loop-tokens", "-5"], "--loop-tokens must be positive, got -5"),
    (profile_round, ["--position", "600"], "--position must be in [0, --capacity - 17] = [0, 495]"),
    (profile_round, ["--capacity", "16", "--position", "0"], "= [0, -1]"),
    (time_decode_loop, ["--passes", "0"], "--passes must be positive, got 0"),
    (time_decode_loop, ["--k", "0"], "--k must be positive, got 0"),
    (bench_few_rows_matmul, ["--repeats", "0"], "--repeats must be positive, got 0"),
    (ngram_store_scaling, ["--answers", "{answers}", "--k", "0"], "--k must be positive, got 0"),
    (vsd_report, ["{a_folder}", "--json", "{a_file}/x.json"], "a_file is a file, not a folder"),
    (prompt_logprobs_cost, ["--passes", "0"], "--passes must be positive, got 0"),
    (row_sampling_batch, ["--prompts", "0"], "--prompts must be positive, got 0"),
    (prompt_logprobs_cost, ["--chunks", "64,x"], "--chunks takes comma-separated integers"),
    (prompt_logprobs_cost, ["--chunks", "64,512"], "include the default 128"),
    (prompt_logprobs_cost, ["--chunks", "0,128"], "--chunks must be positive"),
]


@pytest.mark.parametrize("script, argv, message", ARGPARSE_SCRIPTS,
                         ids=[f"{s.__name__.split('.')[-1]} {' '.join(a)}"
                              for s, a, _ in ARGPARSE_SCRIPTS])
def test_argparse_scripts(script, argv, message, paths, capsys):
  code, err = run(script.main, argv, paths, capsys)
  assert code == 2 and "error: " in err.splitlines()[-1] and message in err.splitlines()[-1], err


def test_simulate_checks_cost_before_decoding_answers(paths, capsys):
  # Without --answers the answers are decoded first; --cost used to be read only after that.
  code, err = run(simulate_ngram_widths.main, ["--cost", "{bad"], paths, capsys)
  assert_one_line_error(code, err, "--cost is not valid JSON")


def test_good_flags_pass_the_checks(paths, tmp_path):
  from asd_jax.draft_tree import TreeShape
  args = drafter_tau.build_parser().parse_args(
      ["--draft", "self,smollm2-135m-eagle3", "--json", str(tmp_path / "new" / "tau.json")])
  assert drafter_tau.check_args(args) == (("mt_bench", "humaneval"), TreeShape(4, 4, 16),
                                          ["self", "smollm2-135m-eagle3"])
  parse = simulate_ngram_widths.build_parser().parse_args
  args = parse(["--answers", paths["answers"], "--cost", COST, "--ks", "5", "--measure",
                "8", "--measure-ks", "5,7"])
  suites, ks, mks, widest, cost, answers = simulate_ngram_widths.check_args(args)
  assert (suites, ks, mks, widest) == (("humaneval", "mt_bench"), [5], [5, 7], 7)
  assert cost == {w: 1.0 + 0.1 * w for w in range(8)} and len(answers) == 2
  # A missing --answers file is where the decoded answers go; no --cost: measured later.
  args = parse(["--answers", str(tmp_path / "new" / "answers.json")])
  assert simulate_ngram_widths.check_args(args)[-2:] == (None, None)
