"""What a request is charged before, or without, the engine's word: one rule for every
front end (the gateway and the simulator alike).

- **The output reservation**: what a request may produce, reserved against its tenant's
  tokens per minute (and counted by the fair queue) until the engine reports what it
  produced. Its output limit for each answer it asks for, never more than the model's
  context leaves after the prompt when the pool says its context (`maxModelLen`: the
  engine stops there, whatever `max_tokens` says); when the request sets no limit, what
  the context leaves, or `DEFAULT_OUTPUT_RESERVATION` when the pool does not say.
- **A client that hangs up** (`Flight.left_by_client`): a request sent to an engine whose
  answer is not streamed is charged its whole output reservation — the front end cannot
  see what the engine produced before it aborted, and charging less would let a tenant
  slip past its limits by hanging up; a stream is charged what was observed of it (none,
  if it had not started); a request never sent, nothing.
"""

from __future__ import annotations

#: Output reserved for a request that sets no output limit, in a pool that does not say its
#: model's context.
DEFAULT_OUTPUT_RESERVATION = 4096


def output_reservation(
    output_limit: int | None, choices: int, input_tokens: int, max_model_len: int | None
) -> int:
    """The output a request reserves (module docstring): `output_limit` per answer (of
    `choices`), capped by what `max_model_len` leaves after `input_tokens`."""
    room = None if max_model_len is None else max(max_model_len - input_tokens, 1)
    if output_limit is None:
        limit = DEFAULT_OUTPUT_RESERVATION if room is None else room
    else:
        limit = output_limit if room is None else min(output_limit, room)
    return limit * max(choices, 1)
