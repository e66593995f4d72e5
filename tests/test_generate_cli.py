"""`python -m asd_jax.generate`: bad input is one clear line on stderr and exit code 2."""

import pytest

from asd_jax.generate import main


@pytest.mark.parametrize("argv,message", [
    (["--target", "no-such-model", "--prompt", "hi"], "unknown model 'no-such-model'"),
    (["--prompt", "   "], "empty prompt"),
    (["--prompt-ids", ""], "empty prompt"),
    (["--prompt-ids", "1,x"], "comma-separated integers"),
    (["--prompt-ids", "1,,2"], "empty entry"),
    (["--prompt-ids", "1,2,"], "empty entry"),
    (["--prompt-ids", "1 2,3"], "comma-separated integers"),
    (["--prompt", "hi", "--max-new-tokens", "0"], "--max-new-tokens must be positive"),
    (["--prompt", "hi", "--temperature", "-1"], "temperature"),
    (["--prompt", "hi", "--top-p", "0"], "top_p"),
    (["--prompt", "hi", "--stream", "--json"], "cannot be combined with --json"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
  with pytest.raises(SystemExit) as e:
    main(argv)
  assert e.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and message in err and "\n" not in err
