"""`python -m asd_jax.bench_verify` and `python -m asd_jax.bench_plots` refuse bad input with one
`error:` line and exit code 2, before any timing or plotting (they were tracebacks: a zero batch
divided by zero, and an unwritable --json failed after the whole timing run)."""

import pytest

from asd_jax import bench_plots, bench_verify


@pytest.fixture
def files(tmp_path):
  (tmp_path / "a_file").write_text("")
  (tmp_path / "not_json").write_text("{bad")
  (tmp_path / "not_a_report.json").write_text('{"x": 1}')
  (tmp_path / "report.json").write_text('{"rows": []}')
  return tmp_path


VERIFY = [
    (["--batches", "0"], "--batches must be positive"),
    (["--batches", "1,,2"], "--batches must be comma-separated ints"),
    (["--seconds", "0"], "--seconds > 0"),
    (["--k", "0"], "--k and --vocab must be >= 1"),
    (["--json", "{tmp}/a_file/out.json"], "a_file is a file, not a folder"),
]
PLOTS = [
    (["{tmp}/missing.json"], "missing.json: cannot read it as JSON ([Errno 2]"),
    (["{tmp}"], "cannot read it as JSON ("),
    (["{tmp}/not_json"], "not_json: cannot read it as JSON (Expecting"),
    (["{tmp}/not_a_report.json"], "not a report of python -m asd_jax.bench --json"),
    (["{tmp}/report.json", "--out", "{tmp}/a_file"], "--out {tmp}/a_file is a file, not a folder"),
]


@pytest.mark.parametrize("main,argv,message",
                         [(bench_verify.main, a, m) for a, m in VERIFY]
                         + [(bench_plots.main, a, m) for a, m in PLOTS],
                         ids=[" ".join(a) for a, _ in VERIFY + PLOTS])
def test_bad_input_is_one_line_and_exit_2(main, argv, message, files, capsys):
  with pytest.raises(SystemExit) as e:
    main([a.format(tmp=files) for a in argv])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert "error: " in err[-1] and message.format(tmp=files) in err[-1], err
