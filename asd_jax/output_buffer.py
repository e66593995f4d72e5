"""Output buffers sized to a shared bucket, so `max_new_tokens` does not pick the program.

A decode loop's output buffers have a static width. Sized exactly to `max_new_tokens`, every
distinct request length compiles its own loop (seconds on a CPU, for the smallest model), and a
server taking `max_tokens` from its clients compiles without end. The loops therefore allocate
`buffer_width(max_new_tokens)` positions and stop each row at its own limit (the traced
`max_new_B`, which defaults to `max_new_tokens`); `trim` cuts the returned arrays back to
`max_new_tokens`, so callers see the width they asked for. The KV cache is sized from the
request's own `max_new_tokens`, not from the bucket: a row never writes past its own limit, and
attention cost grows with allocated cache length.
"""

from __future__ import annotations

from asd_jax.request_checks import round_up

OUTPUT_BUCKET = 64
# Every array in DecodeResult / SpecDecodeResult with an output-position axis (axis 1).
PER_POSITION_FIELDS = ("tokens_BxN", "logprobs_BxN", "top_token_ids_BxNxL",
                       "top_logprobs_BxNxL")


def buffer_width(max_new_tokens: int) -> int:
  """The compiled loop's output width for a request of `max_new_tokens` (>= it)."""
  return round_up(max_new_tokens, OUTPUT_BUCKET)


def trim(result, max_new_tokens: int):
  """`result` (DecodeResult or SpecDecodeResult) with its per-position arrays cut to the
  request's `max_new_tokens` (entries past it are empty: no row generates that far)."""
  cut = {name: getattr(result, name)[:, :max_new_tokens] for name in PER_POSITION_FIELDS
         if getattr(result, name) is not None}
  return result.replace(**cut)
