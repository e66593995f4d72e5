"""`python -m asd_jax.generate`: bad input is one clear line on stderr and exit code 2."""

import json

import pytest

from asd_jax.generate import main
from tests.test_bench_cli import tiny_target  # noqa: F401  (module fixture)


@pytest.mark.parametrize("argv,message", [
    (["--target", "no-such-model", "--prompt", "hi"], "unknown model 'no-such-model'"),
    # The drafter's name is checked before the target is looked up (nothing is loaded), and the
    # message names the drafters that need no folder.
    (["--target", "no-such-model", "--prompt", "hi", "--draft", "ngarm"],
     "and no such folder; the drafters without a folder are 'self' (the target drafts for "
     "itself), 'ngram'"),
    (["--prompt", "   "], "empty prompt"),
    (["--prompt-ids", ""], "empty prompt"),
    (["--prompt-ids", "1,x"], "comma-separated integers"),
    (["--prompt-ids", "1,,2"], "empty entry"),
    (["--prompt-ids", "1,2,"], "empty entry"),
    (["--prompt-ids", "1 2,3"], "comma-separated integers"),
    (["--prompt-ids", "5,99999999999"], "token id 99999999999 is outside any vocabulary"),
    # A value starting with '-' reaches the ids check, not argparse's "expected one argument".
    (["--prompt-ids", "-1,5"], "token id -1 is outside any vocabulary"),
    (["--prompt-ids", "5,-2"], "token id -2 is outside any vocabulary"),
    (["--prompt-ids", "-3"], "token id -3 is outside any vocabulary"),
    (["--prompt", "hi", "--max-new-tokens", "0"], "--max-new-tokens must be positive"),
    (["--prompt", "hi", "--temperature", "-1"], "temperature"),
    (["--prompt", "hi", "--top-p", "0"], "top_p"),
    (["--prompt", "hi", "--stream", "--json"], "cannot be combined with --json"),
    (["--pair", "gpt2", "--prompt", "hi"], "unknown model pair 'gpt2'; known pairs: smollm2-135m"),
    (["--pair", "smollm2-135m", "--draft", "ngram", "--prompt", "hi"],
     "--pair smollm2-135m sets --draft smollm2-135m-standalone, but --draft ngram was also given"),
    (["--pair", "smollm2-135m", "--target", "x.gguf", "--prompt", "hi"],
     "--pair smollm2-135m sets --target smollm2-135m, but --target x.gguf was also given"),
    # An ASD setting under another rule would be ignored without a word.
    (["--prompt", "hi", "--budget", "4"],
     "--budget sets the ASD rule, which this run does not use (plain decoding (no --draft))"),
    (["--prompt", "hi", "--draft", "ngram", "--gate", "1"],
     "--gate sets the ASD rule, which this run does not use (the default --rule strict)"),
    (["--prompt", "hi", "--draft", "ngram", "--rule", "sample", "--temperature", "1",
      "--asd-preset", "exploratory"], "--asd-preset sets the ASD rule, which this run does not "
     "use (--rule sample)"),
    (["--prompt", "hi", "--draft", "ngram", "--rule", "strict", "--normalize-q"],
     "--normalize-q sets the ASD rule"),
    (["--prompt", "hi", "--draft", "self", "--tree", "2,2,3", "--k", "3"],
     "--k sets a chain's length; with --tree 2,2,3 the tree's DEPTH is the draft length"),
    (["--prompts-file", "/no/such/file.txt"], "--prompts-file /no/such/file.txt: no such file"),
    (["--prompts-file", "/"], "--prompts-file / is a folder, not a file"),
    (["--prompt", "hi", "--batch-size", "4"], "--batch-size sets the rows decoded together"),
    (["--prompt", "hi", "--draft", "ngram", "--rule", "asd", "--asd-preset", "fast"],
     "unknown ASD preset 'fast'; choose one of paper, exploratory, strict"),
    (["--prompt", "hi", "--stop", "x", "--stop", ""], "--stop '' would end every answer"),
    (["--prompt", "hi", "--bad-words", ""], "--bad-words '' would ban nothing"),
    (["--prompt", "hi", "--guided-choice", "x", "--guided-choice", ""],
     "--guided-choice '' is an empty answer"),
    (["--prompt", "hi", "--guided-json", "{\"type\": "], "--guided-json: not a JSON schema"),
    (["--prompt", "hi", "--guided-json", "[1, 2]"], "--guided-json: a JSON schema is a JSON "
     "object"),
    (["--prompt", "hi", "--logprobs"], "--logprobs adds each token's log-probability to the "
     "--json output; pass --json"),
    (["--prompt", "hi", "--json", "--top-logprobs", "3"], "--top-logprobs lists the likeliest "
     "tokens beside each token's own log-probability; pass --logprobs (and --json)"),
    (["--prompt", "hi", "--json", "--logprobs", "--top-logprobs", "-1"],
     "--top-logprobs must be >= 0, got -1"),
    (["--prompt", "hi", "--prompt-logprobs", "0"], "--prompt-logprobs adds each prompt "
     "token's log-probability to the --json output; pass --json"),
    (["--prompt", "hi", "--json", "--prompt-logprobs", "-1"],
     "--prompt-logprobs must be >= 0, got -1"),
    (["--prompt", "hi", "--min-tokens", "-1"], "min_tokens must be an integer >= 0"),
    (["--prompt", "hi", "--min-tokens", "9", "--max-new-tokens", "8"],
     "min_tokens (9) is more than max_new_tokens (8)"),
    (["--prompt", "hi", "--logit-bias", "5"], "--logit-bias takes ID=BIAS, e.g. 2=-100, got '5'"),
    (["--prompt", "hi", "--logit-bias", "x=1"], "--logit-bias takes ID=BIAS"),
    (["--prompt", "hi", "--logit-bias", "5=1", "--logit-bias", "5=2"],
     "--logit-bias names token 5 twice"),
    (["--prompt", "hi", "--logit-bias", "5=-200"],
     "logit_bias: the bias of token 5 must be a number in [-100, 100], got -200.0"),
    (["--prompt", "hi", "--draft", "ngram", "--temperature", "1"],
     "--rule strict is greedy verification; temperature 1.0 needs --rule sample"),
    (["--prompt", "hi", "--stop-token-ids", "2,x"],
     "--stop-token-ids must be comma-separated integers, got '2,x'"),
    (["--prompt", "hi", "--stop-token-ids", " "], "--stop-token-ids has no ids"),
    (["--prompt", "hi", "--stop-token-ids", "-3"],
     "--stop-token-ids: token id -3 is outside any vocabulary"),
    (["--prompt", "hi", "--n", "0"], "--n must be in [1, 4096], got 0"),
    (["--prompt", "hi", "--allowed-token-ids", "1,a"],
     "--allowed-token-ids must be comma-separated integers, got '1,a'"),
    (["--prompt", "hi", "--n", "2"], "n=2 asks for 2 samples, but temperature 0 is greedy "
     "decoding: every one would be the same answer; set a temperature > 0"),
    (["--prompt", "hi", "--n", "2", "--temperature", "1", "--stream"],
     "--stream prints one answer as it arrives; use it with --prompt, not --prompts-file or --n"),
    (["--prompt", "hi", "--n", "2", "--temperature", "1", "--seed", str(2**32 - 1)],
     "--seed 4294967295: answer i samples with seed + i, so with 2 answers --seed must be in "
     "[0, 4294967294]"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
  with pytest.raises(SystemExit) as e:
    main(argv)
  assert e.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and message in err and "\n" not in err


def test_a_pair_sets_the_target_and_its_drafter():
  from asd_jax.generate import build_parser
  from configs.model_pairs import PAIRS, apply_pair
  from models.drafter_folder import KNOWN_DRAFTERS
  from models.registry import resolve_checkpoint
  parser = build_parser()
  for argv in (["--pair", "smollm2-135m"],  # the same values given again are no conflict
               ["--pair", "smollm2-135m", "--draft", "smollm2-135m-standalone"]):
    args = parser.parse_args([*argv, "--prompt", "hi"])
    apply_pair(args, parser)
    assert (args.target, args.draft) == ("smollm2-135m", "smollm2-135m-standalone")
  args = parser.parse_args(["--prompt", "hi"])
  apply_pair(args, parser)
  assert (args.target, args.draft) == ("smollm2-135m", None)  # no pair: plain decoding
  for pair in PAIRS.values():  # every pair names a known target and a drafter shipped for it
    resolve_checkpoint(pair.target)
    assert KNOWN_DRAFTERS[pair.draft] == pair.target


def test_nonfinite_logits_print_the_output_then_fail(tiny_target, tmp_path, capsys):  # noqa: F811
  import json
  import shutil

  from safetensors.numpy import load_file, save_file

  folder = tmp_path / "nan_target"
  shutil.copytree(tiny_target, folder)
  weights = load_file(folder / "model.safetensors")
  weights["model.norm.weight"][0] = float("nan")  # every logit NaN from the first step
  save_file(weights, folder / "model.safetensors")
  with pytest.raises(SystemExit) as e:
    main(["--target", str(folder), "--prompt-ids", "3,4", "--max-new-tokens", "4", "--json"])
  assert e.value.code == 2
  captured = capsys.readouterr()
  out = json.loads(captured.out)
  assert out["tokens"] == [] and out["stats"]["nonfinite_logits"] is True
  assert "non-finite logits after 0 tokens" in captured.err
  (tmp_path / "q.txt").write_text("the\na list\n")  # a file: every answer printed, then named
  with pytest.raises(SystemExit) as e:
    main(["--target", str(folder), "--prompts-file", str(tmp_path / "q.txt"),
          "--max-new-tokens", "4", "--json"])
  assert e.value.code == 2
  captured = capsys.readouterr()
  out = json.loads(captured.out)
  assert [(a["tokens"], a["nonfinite_logits"]) for a in out["answers"]] == [([], True)] * 2
  assert "non-finite logits in answer(s) 1, 2 of 2" in captured.err


def test_dash_values_attach_only_to_the_named_flag():
  from asd_jax.cli_common import attach_dash_values

  flags = ("--prompt-ids",)
  assert attach_dash_values(["--prompt-ids", "-1,5", "--json"], flags) == \
      ["--prompt-ids=-1,5", "--json"]
  # Not a number after the flag: an option, left for argparse to report.
  assert attach_dash_values(["--prompt-ids", "--json"], flags) == ["--prompt-ids", "--json"]
  assert attach_dash_values(["--seed", "-1"], flags) == ["--seed", "-1"]
  assert attach_dash_values(["--prompt-ids"], flags) == ["--prompt-ids"]


def test_a_tokenizer_past_the_vocabulary_is_refused(tiny_target, tmp_path, capsys):  # noqa: F811
  import shutil

  from transformers import AutoTokenizer

  folder = tmp_path / "other_tokenizer"
  shutil.copytree(tiny_target, folder)
  tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
  # 106 ids for a 96-row embedding: another model's tokenizer beside these weights
  tokenizer.add_tokens([f"extra{i}" for i in range(106 - len(tokenizer))])
  tokenizer.save_pretrained(folder)
  for prompt in (["--prompt-ids", "1,2,3"], ["--prompt", "the"]):
    with pytest.raises(SystemExit) as e:
      main(["--target", str(folder), *prompt, "--max-new-tokens", "2"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert str(folder) in err and "106 tokens" in err and "vocab_size is 96" in err, err
  # training's target loader (build_dataset, train) refuses it too
  import dataclasses

  from configs.train_presets import get_preset
  from models.errors import CheckpointError
  from vsd_jax.targets import load_target
  with pytest.raises(CheckpointError, match="106 tokens but the model's vocab_size is 96"):
    load_target(dataclasses.replace(get_preset("tiny"), target=str(folder)))
  # and so do the research scripts that encode prompts with it
  from scripts import distill_standalone_drafter, drafter_tau, simulate_ngram_widths, timing_noise
  for script_main, argv in ((drafter_tau.main, ["--draft", "ngram", "--tree", "",
                                                "--num-prompts", "1"]),
                            (distill_standalone_drafter.main,
                             ["--out", str(tmp_path / "drafter")])):
    with pytest.raises(SystemExit) as e:
      script_main(["--target", str(folder), *argv])
    assert e.value.code == 2 and "106 tokens" in capsys.readouterr().err
  for run in (lambda: simulate_ngram_widths.load_target(str(folder)),
              lambda: timing_noise.main(["--target", str(folder), "--calls", "2"])):
    with pytest.raises(CheckpointError, match="106 tokens but the model's vocab_size is 96"):
      run()
  assert not (tmp_path / "drafter").exists()


def test_asd_settings_from_the_preset_and_k_from_the_drafter(tiny_target, capsys):  # noqa: F811
  import json

  from asd_jax.asd_config import EXPLORATORY, PAPER
  from models.drafter_setup import FALLBACK_K

  def run(*flags):
    main(["--target", str(tiny_target), "--prompt-ids", "3,4,3,4,3", "--max-new-tokens", "6",
          "--json", "--draft", "ngram", *flags])
    return json.loads(capsys.readouterr().out)["stats"]

  stats = run("--rule", "asd")
  assert stats["asd_config"] == {"preset": "paper", "budget": PAPER.budget, "gate": PAPER.gate,
                                 "max_exceptions": PAPER.max_exceptions, "normalize_q": False}
  assert stats["k"] == FALLBACK_K  # the n-gram drafter without a store has no benchmarked K
  stats = run("--rule", "asd", "--asd-preset", "exploratory", "--max-exceptions", "1",
              "--normalize-q", "--k", "3")
  assert stats["asd_config"] == {"preset": "exploratory", "budget": EXPLORATORY.budget,
                                 "gate": EXPLORATORY.gate, "max_exceptions": 1,
                                 "normalize_q": True}
  assert stats["k"] == 3 and stats["rounds"] >= 2
  assert "asd_config" not in run()  # strict: no ASD settings to report


@pytest.mark.parametrize("name,content,message", [
    ("blank.txt", "the list\n\nwrite python\n", "line 2 is blank"),
    ("spaces.txt", "the list\n   \nwrite python\n", "line 2 is blank"),
    ("empty.txt", "\n\n", "holds no prompts"),
    ("bad.jsonl", '{"prompt": "the list"}\n{"text": "x"}\n',
     'line 2 must be an object with a string "prompt"'),
    ("broken.jsonl", '{"prompt": "the list"\n', "line 1 is not JSON"),
    ("stop.jsonl", '{"prompt": "a"}\n{"prompt": "b", "stop": 3}\n',
     'line 2: "stop" must be a string or a list of strings'),
    ("stops.jsonl", '{"prompt": "a", "stop": ["x", ""]}\n', 'line 1: an empty "stop" string'),
    ("bad_words.jsonl", '{"prompt": "a"}\n{"prompt": "b", "bad_words": 3}\n',
     'line 2: "bad_words" must be a string or a list of strings'),
    ("bad_word.jsonl", '{"prompt": "a", "bad_words": ["x", ""]}\n',
     'line 1: an empty "bad_words" string would ban nothing'),
    ("guided_json.jsonl", '{"prompt": "a", "guided_json": 3}\n',
     'line 1: "guided_json" must be a JSON schema (an object or its text)'),
    ("guided_text.jsonl", '{"prompt": "a", "guided_json": "{nope"}\n',
     'line 1: "guided_json" must be a JSON schema'),
    ("guided_choice.jsonl", '{"prompt": "a", "guided_choice": ["x", ""]}\n',
     'line 1: "guided_choice" must be a non-empty list of non-empty strings'),
    ("guided_regex.jsonl", '{"prompt": "a", "guided_regex": ""}\n',
     'line 1: "guided_regex" must be a non-empty string'),
    ("guided_two.jsonl", '{"prompt": "a", "guided_regex": "x", "guided_choice": ["y"]}\n',
     'line 1: give one of "guided_regex", "guided_choice"'),
    ("typo.jsonl", '{"prompt": "a"}\n{"prompt": "b", "stops": ["x"]}\n',
     "line 2 has key(s) 'stops', which a request does not take (did you mean 'stop'?); the keys "
     "are 'allowed_token_ids', 'bad_words', 'frequency_penalty', 'guided_choice', "
     "'guided_json', 'guided_regex', 'ignore_eos', 'include_stop_str_in_output', "
     "'logit_bias', 'max_new_tokens', 'messages', 'min_p', 'min_tokens', 'n', "
     "'presence_penalty', 'prompt', 'repetition_penalty', 'seed', 'stop', 'stop_token_ids', "
     "'temperature', 'top_k', 'top_p'"),
    ("far.jsonl", '{"prompt": "a", "xyz": 1}\n',
     "line 1 has key(s) 'xyz', which a request does not take; the keys are"),
    ("include.jsonl", '{"prompt": "a", "include_stop_str_in_output": "yes"}\n',
     'line 1: "include_stop_str_in_output" must be true or false, got \'yes\''),
    ("n.jsonl", '{"prompt": "a", "n": 0}\n', 'line 1: "n" must be an integer in [1, 4096], got 0'),
    ("greedyn.jsonl", '{"prompt": "a"}\n{"prompt": "b", "n": 3}\n',
     "line 2: n=3 asks for 3 samples, but temperature 0 is greedy decoding"),
    ("seedn.jsonl", '{"prompt": "a", "n": 2, "temperature": 1, "seed": 4294967295}\n',
     "line 1: its 2 samples draw with seeds 4294967295..4294967296, past 2**32 - 1"),
    ("stopids.jsonl", '{"prompt": "a", "stop_token_ids": 5}\n',
     'line 1: "stop_token_ids" must be a list of token ids, got 5'),
    ("negids.jsonl", '{"prompt": "a", "stop_token_ids": [-1]}\n',
     'line 1: "stop_token_ids" must be a list of token ids, got [-1]'),
    ("ignore.jsonl", '{"prompt": "a", "ignore_eos": 1}\n',
     'line 1: "ignore_eos" must be true or false, got 1'),
    ("bias.jsonl", '{"prompt": "a", "logit_bias": {"x": 1}}\n',
     'line 1: "logit_bias" must be an object from token ids to biases'),
    ("biasrange.jsonl", '{"prompt": "a"}\n{"prompt": "b", "logit_bias": {"5": -101}}\n',
     "line 2: logit_bias: the bias of token 5 must be a number in [-100, 100], got -101"),
    ("temperature.jsonl", '{"prompt": "a", "temperature": -1}\n', "line 1: temperature"),
    ("greedytop.jsonl", '{"prompt": "a", "top_p": 0.5}\n',
     "line 1: top_p=0.5 filters sampling, but temperature 0 is greedy"),
    ("mintokens.jsonl", '{"prompt": "a", "min_tokens": 129}\n',
     "line 1: min_tokens (129) is more than max_new_tokens (128)"),
    ("ownmax.jsonl", '{"prompt": "a", "min_tokens": 5, "max_new_tokens": 4}\n',
     "line 1: min_tokens (5) is more than max_new_tokens (4)"),
    ("penalty.jsonl", '{"prompt": "a", "repetition_penalty": 0}\n',
     "line 1: repetition_penalty must be a finite number > 0"),
    ("both.jsonl", '{"prompt": "a", "messages": [{"role": "user", "content": "a"}]}\n',
     'line 1 must be an object with a string "prompt" or a list of "messages"'),
    ("listprompt.jsonl", '{"prompt": [{"role": "user", "content": "a"}]}\n',
     'line 1: "prompt" must be a string; a conversation goes in "messages"'),
    ("strmessages.jsonl", '{"messages": "a"}\n',
     'line 1: "messages" must be a non-empty list of {"role", "content"} objects'),
    ("nomessages.jsonl", '{"prompt": "a"}\n{"messages": []}\n',
     'line 2: "messages" must be a non-empty list'),
    ("role.jsonl", '{"messages": [{"role": "bot", "content": "a"}]}\n',
     "line 1: message 0 has role 'bot'; the roles are 'system', 'user', 'assistant'"),
    ("lastturn.jsonl", '{"messages": [{"role": "user", "content": "a"}, '
     '{"role": "assistant", "content": "b"}]}\n', "line 1: the last message is the assistant's"),
    ("latesystem.jsonl", '{"messages": [{"role": "user", "content": "a"}, '
     '{"role": "system", "content": "b"}, {"role": "user", "content": "c"}]}\n',
     "line 1: message 1 is a system message; only the first may be"),
    ("blankturn.jsonl", '{"messages": [{"role": "user", "content": " "}]}\n',
     "empty prompt: --prompts-file"),
    ("extrakey.jsonl", '{"messages": [{"role": "user", "content": "a", "name": "x"}]}\n',
     'line 1: message 0 must be an object with exactly the keys "role" and "content"'),
    ("zero.jsonl", '{"prompt": "a", "max_new_tokens": 0}\n',
     'line 1: "max_new_tokens" must be an integer in [1, 2147483647], got 0'),
    ("float.jsonl", '{"prompt": "a"}\n{"prompt": "b", "max_new_tokens": 5.0}\n',
     'line 2: "max_new_tokens" must be an integer'),
    ("seed.jsonl", '{"prompt": "a", "seed": -1}\n', 'line 1: "seed" must be an integer in [0, '),
    ("boolseed.jsonl", '{"prompt": "a", "seed": true}\n', 'line 1: "seed" must be an integer'),
    ("latin1.txt", b"caf\xe9\n", "not UTF-8 text"),
])
def test_a_bad_prompts_file_is_refused_before_the_model_loads(name, content, message, tmp_path,
                                                              capsys):
  path = tmp_path / name
  (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
  with pytest.raises(SystemExit) as e:
    main(["--target", "no-such-model", "--prompts-file", str(path)])  # the file fails first
  assert e.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and message in err and "\n" not in err, err
  for flags, refusal in ((["--batch-size", "0"], "--batch-size must be a positive integer"),
                         (["--stream"], "--stream prints one answer as it arrives"),
                         (["--system", " "], "line 1: the system message is blank")):
    (tmp_path / "ok.txt").write_text("the list\n")
    with pytest.raises(SystemExit):
      main(["--target", "no-such-model", "--prompts-file", str(tmp_path / "ok.txt"), *flags])
    assert refusal in capsys.readouterr().err


@pytest.mark.parametrize("flags,message", [
    (["--prompt-ids", "1,2", "--system", "be brief"],
     "--system is a chat message; --prompt-ids are raw ids"),
    (["--prompt", "hi", "--system", ""], "--system: the system message is blank"),
    (["--prompts-file", "{jsonl}", "--system", "be brief"],
     "line 2: the conversation opens with its own system message and a system message was "
     "given besides"),
])
def test_a_system_message_that_cannot_apply_is_refused_before_the_model_loads(
    flags, message, tmp_path, capsys):
  path = tmp_path / "q.jsonl"
  path.write_text('{"prompt": "a"}\n{"messages": [{"role": "system", "content": "s"}, '
                  '{"role": "user", "content": "u"}]}\n')
  with pytest.raises(SystemExit) as e:
    main(["--target", "no-such-model", *[str(path) if f == "{jsonl}" else f for f in flags]])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and message in err and "\n" not in err, err


def test_a_conversation_or_system_message_reaches_the_template(tiny_target, tmp_path,  # noqa: F811
                                                               capsys):
  """A .jsonl "messages" line answers as --prompt with --system does for the same turns (and a
  multi-turn conversation as its rendered ids do); the system message changes the prompt."""
  import json
  from models.tokenizer import load_tokenizer
  common = ["--target", str(tiny_target), "--max-new-tokens", "6", "--ignore-eos", "--json"]

  def run(*flags):
    main([*common, *flags])
    return json.loads(capsys.readouterr().out)

  system, user = "return the list", "write a python function"
  alone = run("--prompt", user, "--system", system)
  without = run("--prompt", user)
  tokenizer = load_tokenizer(str(tiny_target))
  turn = len(tokenizer(f"<|im_start|> system {system} <|im_end|> ")["input_ids"])
  assert alone["stats"]["prompt_tokens"] == without["stats"]["prompt_tokens"] + turn
  turns = [{"role": "user", "content": "the list"}, {"role": "assistant", "content": "a"},
           {"role": "user", "content": user}]
  rendered = "".join(f"<|im_start|> {m['role']} {m['content']} <|im_end|> " for m in turns)
  ids = tokenizer(rendered + "<|im_start|> assistant ", add_special_tokens=False)["input_ids"]
  by_ids = run("--prompt-ids", ",".join(map(str, ids)))
  (tmp_path / "q.jsonl").write_text(
      json.dumps({"messages": [{"role": "system", "content": system},
                               {"role": "user", "content": user}]}) + "\n"
      + json.dumps({"messages": turns}) + "\n")
  answers = run("--prompts-file", str(tmp_path / "q.jsonl"), "--batch-size", "2")["answers"]
  assert answers[0]["tokens"] == alone["tokens"]
  assert answers[1]["tokens"] == by_ids["tokens"] and answers[1]["prompt"] == turns
  # --system applies to every line of a file, a conversation's included.
  (tmp_path / "q.jsonl").write_text(json.dumps({"prompt": user}) + "\n"
                                    + json.dumps({"messages": turns}) + "\n")
  with_system = run("--prompts-file", str(tmp_path / "q.jsonl"), "--system", system)["answers"]
  assert with_system[0]["tokens"] == alone["tokens"]


@pytest.mark.parametrize("flags,message", [
    (["--prompt-ids", "3,96"],
     "token id 96 at row 0, position 1 is outside the vocabulary [0, 96)"),
    (["--prompt-ids", "3", "--json", "--logprobs", "--top-logprobs", "97"],
     "top_logprobs 97 is more than the vocabulary's 96 tokens"),
    (["--prompt-ids", "3", "--json", "--prompt-logprobs", "97"],
     "top_logprobs 97 is more than the vocabulary's 96 tokens"),
    (["--prompt-ids", "3", "--logit-bias", "96=-100"],
     "logit_bias names token id(s) [96] outside the vocabulary [0, 96)"),
    (["--prompt-ids", "3", "--stop-token-ids", "5,96"],
     "--stop-token-ids: token id 96 is outside the vocabulary [0, 96)"),
    (["--prompt-ids", "3", "--allowed-token-ids", "5,96"],
     "allowed_token_ids names token id 96 outside the vocabulary [0, 96)"),
])
def test_a_request_past_the_vocabulary_is_refused_before_the_model_loads(flags, message,
                                                                          tmp_path, capsys):
  # A folder with config.json and no weights: a refusal naming the vocabulary can only come
  # from the config, before any load.
  (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 96}))
  with pytest.raises(SystemExit) as e:
    main(["--target", str(tmp_path), *flags])
  assert e.value.code == 2 and capsys.readouterr().err.strip() == f"error: {message}"
  # Within the vocabulary, the same folder gets as far as the load, which names what is missing;
  # so does a config the early check cannot read (the load reports it, not the check).
  for config, fault in (('{"vocab_size": 96}', "no weights in"), ("{", "is not valid JSON")):
    (tmp_path / "config.json").write_text(config)
    with pytest.raises(SystemExit):
      main(["--target", str(tmp_path), "--prompt-ids", "3,95"])
    assert fault in capsys.readouterr().err


def test_a_prompts_file_answers_each_line_as_alone(tiny_target, tmp_path, capsys):  # noqa: F811
  """Greedy rows batched from a file give each prompt's answer alone, plain and speculative;
  a .jsonl file carries the same prompts; the stats pool every batch."""
  import json
  lines = ["write a python function", "the list of numbers", "return the list", "a"]
  (tmp_path / "q.txt").write_text("\n".join(lines) + "\n\n")  # trailing blank lines: fine
  (tmp_path / "q.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in lines))
  common = ["--target", str(tiny_target), "--max-new-tokens", "6", "--ignore-eos", "--json"]

  def run(*flags):
    main([*common, *flags])
    return json.loads(capsys.readouterr().out)

  for draft in ([], ["--draft", "ngram", "--k", "3"]):
    alone = [run("--prompt", p, *draft) for p in lines]
    for source in ("q.txt", "q.jsonl"):
      out = run("--prompts-file", str(tmp_path / source), "--batch-size", "3", *draft)
      assert [a["prompt"] for a in out["answers"]] == lines
      assert [a["tokens"] for a in out["answers"]] == [a["tokens"] for a in alone]
      assert [a["text"] for a in out["answers"]] == [a["text"] for a in alone]
      stats = out["stats"]
      assert (stats["prompts"], stats["batch_size"], stats["new_tokens"]) == (4, 3, 24)
      assert stats["prompt_tokens"] == sum(a["stats"]["prompt_tokens"] for a in alone)
    out = run("--prompts-file", str(tmp_path / "q.txt"), *draft)  # the default batch size
    assert out["stats"]["batch_size"] == (1 if draft else 8)
    assert [a["tokens"] for a in out["answers"]] == [a["tokens"] for a in alone]
    if draft:
      assert [a["rounds"] for a in out["answers"]] == [a["stats"]["rounds"] for a in alone]
      assert [a["tau"] for a in out["answers"]] == [
          pytest.approx(a["stats"]["tau"], abs=1e-4) for a in alone]
      assert stats["rounds"] == sum(a["stats"]["rounds"] for a in alone)
    else:
      assert [a["target_forwards"] for a in out["answers"]] == [6] * 4


def test_sampled_answers_from_a_file_do_not_depend_on_the_batch(tiny_target, tmp_path,  # noqa: F811
                                                                capsys):
  """Prompt i of a file samples with seed + i: its answer is the one it gets alone with that
  seed, at any --batch-size; a prompt given twice gets two samples. (With one seed per batch, a
  row drew with its place in the batch: batch size 1 gave the repeated prompt the same answer
  twice and the third prompt the first one's draws.)"""
  import json
  lines = ["write a python function", "write a python function", "the list"]
  (tmp_path / "q.txt").write_text("\n".join(lines) + "\n")
  common = ["--target", str(tiny_target), "--max-new-tokens", "8", "--ignore-eos", "--json",
            "--temperature", "1", "--seed", "5"]

  def run(*flags):
    main([*common, *flags])
    return json.loads(capsys.readouterr().out)

  for draft in ([], ["--draft", "ngram", "--k", "3", "--rule", "sample"]):
    alone = [run("--prompt", p, "--seed", str(5 + i), *draft)["tokens"]
             for i, p in enumerate(lines)]
    assert alone[0] != alone[1]
    for batch in ("1", "2", "3"):
      answers = run("--prompts-file", str(tmp_path / "q.txt"), "--batch-size", batch,
                    *draft)["answers"]
      assert [a["tokens"] for a in answers] == alone, (draft, batch)
  with pytest.raises(SystemExit):
    main([*common, "--prompts-file", str(tmp_path / "q.txt"), "--seed", str(2**32 - 2)])
  assert "with 3 answers --seed must be in [0, 4294967293]" in capsys.readouterr().err


def test_a_line_can_set_its_own_max_new_tokens_and_seed(tiny_target, tmp_path,  # noqa: F811
                                                         capsys):
  """A .jsonl line's "max_new_tokens" and "seed" apply to that answer only: it is the answer the
  prompt gets alone with those values, in any batch, beside lines that take --max-new-tokens and
  --seed + their index."""
  import json
  lines = [{"prompt": "write a python function", "max_new_tokens": 3},
           {"prompt": "the list of numbers", "seed": 11},
           {"prompt": "return the list"}]
  (tmp_path / "q.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
  common = ["--target", str(tiny_target), "--ignore-eos", "--json", "--temperature", "1"]

  def run(*flags):
    main([*common, *flags])
    return json.loads(capsys.readouterr().out)

  for draft in ([], ["--draft", "ngram", "--k", "3", "--rule", "sample"]):
    alone = [run("--prompt", line["prompt"], "--max-new-tokens",
                 str(line.get("max_new_tokens", 8)), "--seed", str(line.get("seed", 5 + i)),
                 *draft)["tokens"] for i, line in enumerate(lines)]
    assert [len(a) for a in alone] == [3, 8, 8]
    for batch in ("1", "3"):
      answers = run("--prompts-file", str(tmp_path / "q.jsonl"), "--max-new-tokens", "8",
                    "--seed", "5", "--batch-size", batch, *draft)["answers"]
      assert [a["tokens"] for a in answers] == alone, (draft, batch)
  # A line's own max_new_tokens counts against the context window like --max-new-tokens does.
  (tmp_path / "long.jsonl").write_text(json.dumps({"prompt": "a"}) + "\n" + json.dumps(
      {"prompt": "a", "max_new_tokens": 5000}) + "\n")
  with pytest.raises(SystemExit):
    main([*common, "--prompts-file", str(tmp_path / "long.jsonl")])
  err = capsys.readouterr().err
  assert "prompt(s) on line(s) 2 (up to" in err and "+ max_new_tokens (up to 5000) exceed" in err


def test_a_line_can_set_its_own_sampling(tiny_target, tmp_path, capsys):  # noqa: F811
  """A .jsonl line's sampling fields replace the flags' for that answer: each answer is the one
  its prompt gets alone with those values as flags, at any batch size (rows of different
  settings decode together, each with its own SamplingConfig, and come back in file order)."""
  import json
  lines = [{"prompt": "write a python function", "temperature": 1, "top_k": 20, "seed": 3},
           {"prompt": "the list of numbers", "repetition_penalty": 1.5},
           {"prompt": "return the list", "logit_bias": {"7": 5, "9": -3}},
           {"prompt": "write a python function"},
           {"prompt": "a", "min_tokens": 7, "frequency_penalty": 0.5},
           {"prompt": "the list", "allowed_token_ids": [11, 12, 13, 40]}]
  flags = [["--temperature", "1", "--top-k", "20", "--seed", "3"],
           ["--repetition-penalty", "1.5"], ["--logit-bias", "7=5", "--logit-bias", "9=-3"],
           [], ["--min-tokens", "7", "--frequency-penalty", "0.5"],
           ["--allowed-token-ids", "11,12,13,40"]]
  (tmp_path / "q.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
  common = ["--target", str(tiny_target), "--max-new-tokens", "8", "--json"]

  def run(*more):
    main([*common, *more])
    return json.loads(capsys.readouterr().out)

  for draft in ([], ["--draft", "ngram", "--k", "3", "--rule", "sample"]):
    alone = [run("--prompt", line["prompt"], *own, *draft) for line, own in zip(lines, flags)]
    alone_tokens = [a["tokens"] for a in alone]
    # The settings matter: without them lines 1 and 4 (the same prompt) would agree, and
    # line 3's bias moves the greedy answer.
    assert alone_tokens[0] != alone_tokens[3]
    assert alone_tokens[2] != run("--prompt", lines[2]["prompt"], *draft)["tokens"]
    for batch in ("1", "2", "6"):
      out = run("--prompts-file", str(tmp_path / "q.jsonl"), "--batch-size", batch, *draft)
      assert [a["tokens"] for a in out["answers"]] == alone_tokens, (draft, batch)
      assert [a["prompt"] for a in out["answers"]] == [line["prompt"] for line in lines]
      if draft and batch == "1":
        # (In larger batches the greedy rows decode together, as "strict": a row that drafted
        # nothing may still accept tokens when another row widens the round, asd_jax/
        # spec_decode.py, so their rounds may differ from alone; their tokens cannot.)
        assert [a["rounds"] for a in out["answers"]] == [a["stats"]["rounds"] for a in alone]
  assert len(alone_tokens[4]) >= 7
  assert set(alone_tokens[5]) <= {11, 12, 13, 40}


def test_n_samples_are_the_prompt_given_n_times(tiny_target, tmp_path, capsys):  # noqa: F811
  """--n N answers each prompt N times, answer r drawing with --seed + r: the answers of the
  prompt written N times, and of each sample alone with its seed; a .jsonl line's own "n" and
  "seed" give samples seed, seed + 1, ...; any batch size, plain and speculative."""
  import json
  common = ["--target", str(tiny_target), "--max-new-tokens", "8", "--ignore-eos", "--json",
            "--temperature", "1"]

  def run(*more):
    main([*common, *more])
    return json.loads(capsys.readouterr().out)

  prompt = "write a python function"
  (tmp_path / "thrice.txt").write_text(f"{prompt}\n" * 3)
  (tmp_path / "own.jsonl").write_text(json.dumps({"prompt": "the list"}) + "\n" + json.dumps(
      {"prompt": prompt, "n": 2, "seed": 11}) + "\n")
  for draft in ([], ["--draft", "ngram", "--k", "3", "--rule", "sample"]):
    alone = [run("--prompt", prompt, "--seed", str(5 + r), *draft)["tokens"] for r in range(3)]
    assert len({tuple(a) for a in alone}) == 3
    written = run("--prompts-file", str(tmp_path / "thrice.txt"), "--seed", "5", *draft)
    for batch in ("1", "3"):
      out = run("--prompt", prompt, "--n", "3", "--seed", "5", "--batch-size", batch, *draft)
      assert [a["tokens"] for a in out["answers"]] == alone == [
          a["tokens"] for a in written["answers"]], (draft, batch)
      assert [a["sample"] for a in out["answers"]] == [0, 1, 2]
      assert [a["prompt"] for a in out["answers"]] == [prompt] * 3
      assert (out["stats"]["prompts"], out["stats"]["new_tokens"]) == (1, 24)
    own = run("--prompts-file", str(tmp_path / "own.jsonl"), "--seed", "5", *draft)["answers"]
    assert [a["tokens"] for a in own] == [
        run("--prompt", "the list", "--seed", "5", *draft)["tokens"],
        *[run("--prompt", prompt, "--seed", s, *draft)["tokens"] for s in ("11", "12")]]
    assert ["sample" in a for a in own] == [False, True, True]
  # The text listing names each sample.
  main([*[flag for flag in common if flag != "--json"], "--prompt", prompt, "--n", "2"])
  listing = capsys.readouterr().out
  assert f"### [1/2] {prompt} (sample 1/2)" in listing
  assert f"### [2/2] {prompt} (sample 2/2)" in listing


def test_stop_token_ids_end_answers_like_eos(tiny_target, tmp_path, capsys):  # noqa: F811
  """--stop-token-ids ends an answer at the first of them (kept, finish_reason "stop"), even
  with --ignore-eos, and --min-tokens holds them back; a .jsonl line's own "stop_token_ids" and
  "ignore_eos" give the answer the flags give alone."""
  import json
  common = ["--target", str(tiny_target), "--max-new-tokens", "16", "--json", "--prompt"]

  def run(*more):
    main([*common, *more])
    return json.loads(capsys.readouterr().out)

  prompt = "write a python function"
  free = run(prompt, "--ignore-eos")["tokens"]
  stop_id = free[2]
  first = free.index(stop_id)
  out = run(prompt, "--ignore-eos", "--stop-token-ids", str(stop_id))
  assert out["tokens"] == free[:first + 1] and out["finish_reason"] == "stop"
  held = run(prompt, "--ignore-eos", "--stop-token-ids", str(stop_id), "--min-tokens",
             str(first + 2))
  assert len(held["tokens"]) >= first + 2 and stop_id not in held["tokens"][:first + 1]
  lines = [{"prompt": prompt, "stop_token_ids": [stop_id], "ignore_eos": True},
           {"prompt": prompt, "ignore_eos": True}, {"prompt": "the list"}]
  (tmp_path / "q.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
  main([*common[:-1], "--prompts-file", str(tmp_path / "q.jsonl")])
  answers = json.loads(capsys.readouterr().out)["answers"]
  assert [a["tokens"] for a in answers] == [out["tokens"], free, run("the list")["tokens"]]
  assert answers[0]["finish_reason"] == "stop"


def test_bad_words_are_never_in_an_answer(tiny_target, tmp_path, capsys):  # noqa: F811
  """--bad-words bans a word (one token here: the tokenizer is word-level) everywhere and a
  pair of words where the first is the answer's last; strict speculative decoding gives the
  same answer; a .jsonl line's own "bad_words" are added to the flag's, so the line's answer is
  the one the flags give alone, and lines without their own keep the flag's."""
  import json
  from tests.test_bench_cli import WORDS
  names = ["<unk>", "<|im_start|>", "<|im_end|>"] + WORDS

  def word(token):
    return names[token] if token < len(names) else f"w{token}"

  common = ["--target", str(tiny_target), "--max-new-tokens", "16", "--json", "--ignore-eos"]

  def run(*more):
    main([*common, *more])
    return json.loads(capsys.readouterr().out)

  prompt = "write a python function"
  free = run("--prompt", prompt)["tokens"]
  single, pair = free[0], free[3:5]
  flags = ["--bad-words", word(single), "--bad-words", " ".join(map(word, pair))]
  out = run("--prompt", prompt, *flags)["tokens"]
  assert out != free and single not in out
  assert not any(out[i:i + 2] == pair for i in range(len(out) - 1))
  assert run("--prompt", prompt, *flags, "--draft", "ngram", "--k", "3")["tokens"] == out
  lines = [{"prompt": prompt, "bad_words": " ".join(map(word, pair))}, {"prompt": prompt}]
  (tmp_path / "q.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
  answers = run("--prompts-file", str(tmp_path / "q.jsonl"), *flags[:2])["answers"]
  assert [a["tokens"] for a in answers] == [out, run("--prompt", prompt, *flags[:2])["tokens"]]


def test_guided_answers_are_one_of_the_choices(tiny_target, tmp_path, capsys):  # noqa: F811
  """--guided-choice makes every answer one of the texts (here one word each), with and
  without a drafter; a .jsonl line's own "guided_choice" replaces the flag's, a line without
  one keeps it; a line that ignores EOS is refused (a guided answer ends at EOS), naming its
  line, before any row decodes."""
  import json
  common = ["--target", str(tiny_target), "--max-new-tokens", "8", "--json"]

  def run(*more):
    main([*common, *more])
    return json.loads(capsys.readouterr().out)

  prompt = "write a python function"
  assert run("--prompt", prompt)["text"] not in ("python", "function")  # the premise
  flags = ["--guided-choice", "python", "--guided-choice", "function"]
  out = run("--prompt", prompt, *flags)
  assert out["text"] in ("python", "function") and out["finish_reason"] == "eos"
  assert run("--prompt", prompt, *flags, "--draft", "ngram", "--k", "3")["tokens"] == (
      out["tokens"])
  lines = [{"prompt": prompt, "guided_choice": ["return", "list"]}, {"prompt": "the list"}]
  (tmp_path / "q.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
  answers = run("--prompts-file", str(tmp_path / "q.jsonl"), *flags)["answers"]
  assert answers[0]["text"] in ("return", "list")
  assert answers[1]["tokens"] == run("--prompt", "the list", *flags)["tokens"]
  lines.append({"prompt": "a", "ignore_eos": True})
  (tmp_path / "q.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
  with pytest.raises(SystemExit) as e:
    main([*common, "--prompts-file", str(tmp_path / "q.jsonl"), *flags])
  assert e.value.code == 2
  assert "line 3: structured output ends an answer at an EOS id" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    main([*common, "--prompt", prompt, *flags, "--min-tokens", "2"])
  assert "with min_tokens is not supported" in capsys.readouterr().err


def test_a_prompt_too_long_in_a_file_is_named_before_any_batch(tiny_target, tmp_path,  # noqa: F811
                                                               capsys):
  path = tmp_path / "q.txt"
  path.write_text("the list\n" + "the " * 2040 + "\nwrite python\n")
  with pytest.raises(SystemExit) as e:
    main(["--target", str(tiny_target), "--prompts-file", str(path), "--max-new-tokens", "16"])
  assert e.value.code == 2
  captured = capsys.readouterr()
  assert captured.out == ""  # nothing decoded, nothing half-printed
  assert "prompt(s) on line(s) 2 (up to" in captured.err
  assert "exceed the context window (2048 positions)" in captured.err


def test_stop_strings_end_answers_alone_and_batched(tiny_target, tmp_path, capsys):  # noqa: F811
  """An answer ends with the token that completes a --stop text and shows the text before it;
  batched rows stop on their own; the stream prints exactly the answer."""
  import json
  lines = ["write a python function", "the list of numbers", "return the list"]
  common = ["--target", str(tiny_target), "--max-new-tokens", "12", "--ignore-eos"]

  def run(*flags):
    main([*common, *flags])
    return capsys.readouterr().out

  full = [json.loads(run("--prompt", p, "--json")) for p in lines]
  assert all(a["finish_reason"] == "length" for a in full)
  # The word-level tokenizer joins words with spaces: stop at the 4th word of answer 0.
  words = full[0]["text"].split(" ")
  stop = " ".join(words[3:5])
  (tmp_path / "q.txt").write_text("\n".join(lines) + "\n")
  for draft in ([], ["--draft", "ngram", "--k", "3"]):
    alone = [json.loads(run("--prompt", p, "--json", "--stop", stop, *draft)) for p in lines]
    batched = json.loads(run("--prompts-file", str(tmp_path / "q.txt"), "--batch-size", "3",
                             "--json", "--stop", stop, *draft))["answers"]
    for i, (a, b, f) in enumerate(zip(alone, batched, full)):
      assert (a["tokens"], a["text"], a["finish_reason"]) == (
          b["tokens"], b["text"], b["finish_reason"]), i
      at = f["text"].find(stop)
      if at < 0:
        assert a["tokens"] == f["tokens"] and a["finish_reason"] == "length", i
        continue
      assert a["finish_reason"] == "stop" and a["text"] == f["text"][:at], i
      assert a["tokens"] == f["tokens"][:len(a["tokens"])] and len(a["tokens"]) < 12, i
    assert alone[0]["finish_reason"] == "stop"
    streamed = run("--prompt", lines[0], "--stop", stop, "--stream", *draft)
    assert streamed.split("\n[")[0] == alone[0]["text"] + "\n"
    # A .jsonl line's own "stop" applies to that answer only, in the same batch as others.
    (tmp_path / "q.jsonl").write_text(
        json.dumps({"prompt": lines[0], "stop": stop}) + "\n"
        + "".join(json.dumps({"prompt": p, "stop": []}) + "\n" for p in lines[1:]))
    own = json.loads(run("--prompts-file", str(tmp_path / "q.jsonl"), "--batch-size", "3",
                         "--json", *draft))["answers"]
    assert (own[0]["tokens"], own[0]["text"], own[0]["finish_reason"]) == (
        alone[0]["tokens"], alone[0]["text"], "stop")
    assert [(a["tokens"], a["finish_reason"]) for a in own[1:]] == [
        (f["tokens"], "length") for f in full[1:]]
    # --include-stop-str (a line's "include_stop_str_in_output") shows the text through the stop
    # string; the tokens, and the stream's text, are the same.
    kept = json.loads(run("--prompt", lines[0], "--json", "--stop", stop, "--include-stop-str",
                          *draft))
    assert kept["tokens"] == alone[0]["tokens"] and kept["text"] == alone[0]["text"] + stop
    streamed = run("--prompt", lines[0], "--stop", stop, "--stream", "--include-stop-str", *draft)
    assert streamed.split("\n[")[0] == kept["text"] + "\n"
    (tmp_path / "q.jsonl").write_text(json.dumps(
        {"prompt": lines[0], "stop": stop, "include_stop_str_in_output": True}) + "\n")
    own = json.loads(run("--prompts-file", str(tmp_path / "q.jsonl"), "--json", *draft))
    assert own["answers"][0]["text"] == kept["text"]


def test_logprobs_come_with_each_answer(tiny_target, tmp_path, capsys):  # noqa: F811
  """--logprobs: one log-probability per token, alone and batched; speculative strict decoding
  commits the same tokens as plain decoding and reads the same values from its verify
  forwards."""
  import json
  lines = ["write a python function", "the list of numbers"]
  (tmp_path / "q.txt").write_text("\n".join(lines) + "\n")
  common = ["--target", str(tiny_target), "--max-new-tokens", "10", "--ignore-eos", "--json",
            "--logprobs"]

  def run(*flags):
    main([*common, *flags])
    return json.loads(capsys.readouterr().out)

  plain = run("--prompt", lines[0])
  assert len(plain["logprobs"]) == len(plain["tokens"]) == 10
  assert all(lp <= 0 for lp in plain["logprobs"])
  spec = run("--prompt", lines[0], "--draft", "ngram", "--k", "3")
  assert spec["tokens"] == plain["tokens"]
  assert spec["logprobs"] == pytest.approx(plain["logprobs"], abs=1e-3)
  assert "top_logprobs" not in plain
  batched = run("--prompts-file", str(tmp_path / "q.txt"), "--batch-size", "2",
                "--top-logprobs", "3")["answers"]
  assert batched[0]["logprobs"] == pytest.approx(plain["logprobs"], abs=1e-3)
  assert len(batched[1]["logprobs"]) == len(batched[1]["tokens"])
  # --top-logprobs: greedy decoding's token is the first candidate, with its own log p.
  from models.tokenizer import load_tokenizer
  tokenizer = load_tokenizer(str(tiny_target))
  for answer in batched:
    assert len(answer["top_logprobs"]) == len(answer["tokens"])
    for token, lp, top in zip(answer["tokens"], answer["logprobs"], answer["top_logprobs"]):
      assert len(top) == 3
      assert top[0]["id"] == token and top[0]["logprob"] == pytest.approx(lp, abs=1e-4)
      assert [c["logprob"] for c in top] == sorted((c["logprob"] for c in top), reverse=True)
      assert all(c["token"] == tokenizer.decode([c["id"]]) for c in top)


def test_prompt_logprobs_come_with_each_answer(tiny_target, tmp_path, capsys):  # noqa: F811
  """--prompt-logprobs: each answer carries its prompt's ids (after the chat template) and their
  log-probabilities, null first, equal to prompt_logprobs' own; the same alone, batched, with
  --n and with a drafter; non-finite logits print null and fail after the output."""
  import shutil

  import numpy as np
  from safetensors.numpy import load_file, save_file

  from asd_jax.prompt_logprobs import prompt_logprobs
  from models.lm_fns import decoder_fns
  from models.load import load_decoder
  from models.tokenizer import load_tokenizer
  common = ["--target", str(tiny_target), "--max-new-tokens", "4", "--json"]

  def run(*flags):
    main([*common, *flags])
    return json.loads(capsys.readouterr().out)

  ids = [5, 9, 3, 17, 4, 60, 8]
  alone = run("--prompt-ids", ",".join(map(str, ids)), "--prompt-logprobs", "2")
  assert alone["prompt_token_ids"] == ids and alone["prompt_logprobs"][0] is None
  fns, params = decoder_fns(load_decoder(str(tiny_target)).model)
  want = prompt_logprobs(fns, params, np.array([ids]), np.array([len(ids)]), top_logprobs=2)
  assert alone["prompt_logprobs"][1:] == pytest.approx(
      np.asarray(want.logprobs_BxT[0, 1:]).tolist(), abs=1e-5)
  tokenizer = load_tokenizer(str(tiny_target))
  assert alone["prompt_top_logprobs"][0] is None
  for t, top in enumerate(alone["prompt_top_logprobs"][1:], 1):
    assert [c["id"] for c in top] == np.asarray(want.top_token_ids_BxTxL[0, t]).tolist()
    assert all(c["token"] == tokenizer.decode([c["id"]]) for c in top)
    assert [c["logprob"] for c in top] == pytest.approx(
        np.asarray(want.top_logprobs_BxTxL[0, t]).tolist(), abs=1e-5)
  assert run("--prompt-ids", ",".join(map(str, ids)), "--prompt-logprobs", "0", "--draft",
             "ngram", "--k", "2")["prompt_logprobs"] == alone["prompt_logprobs"]
  assert "prompt_top_logprobs" not in run("--prompt-ids", "5,9", "--prompt-logprobs", "0")
  assert "prompt_logprobs" not in run("--prompt-ids", "5,9")

  # A file of two prompts, batched, two samples each: every answer has its own prompt's.
  lines = ["write a python function", "the list of numbers"]
  (tmp_path / "q.txt").write_text("\n".join(lines) + "\n")
  answers = run("--prompts-file", str(tmp_path / "q.txt"), "--batch-size", "2", "--n", "2",
                "--temperature", "1", "--prompt-logprobs", "0")["answers"]
  assert [a["prompt"] for a in answers] == [lines[0], lines[0], lines[1], lines[1]]
  for line, answer in zip([0, 0, 1, 1], answers):
    own = run("--prompt", lines[line], "--prompt-logprobs", "0")
    assert answer["prompt_token_ids"] == own["prompt_token_ids"]
    assert answer["prompt_logprobs"] == pytest.approx(own["prompt_logprobs"], abs=1e-5)
    assert len(answer["prompt_logprobs"]) == len(answer["prompt_token_ids"])

  folder = tmp_path / "nan_target"
  shutil.copytree(tiny_target, folder)
  weights = load_file(folder / "model.safetensors")
  weights["model.norm.weight"][0] = float("nan")  # every logit NaN
  save_file(weights, folder / "model.safetensors")
  with pytest.raises(SystemExit) as e:
    main(["--target", str(folder), "--prompt-ids", "3,4,5", "--max-new-tokens", "2", "--json",
          "--prompt-logprobs", "1"])
  captured = capsys.readouterr()
  assert e.value.code == 2
  out = json.loads(captured.out)  # valid JSON: no NaN in it
  assert out["prompt_logprobs"] == [None] * 3 and out["prompt_nonfinite_logits"] is True
  assert out["prompt_top_logprobs"][1:] == [[{"id": c["id"], "token": c["token"],
                                             "logprob": None}] for [c] in
                                            out["prompt_top_logprobs"][1:]]
  assert "non-finite logits scoring prompt(s) 1 of 1" in captured.err
