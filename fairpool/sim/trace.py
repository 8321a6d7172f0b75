"""The trace format: one request per JSON line. This format is a contract.

    {"t": 0.25, "tenant": "a", "segments": [["sys-a", 800], ["doc-17", 1200], [null, 64]],
     "output_tokens": 200, "max_tokens": 512, "slo": {"tbt": 0.1, "ttft": 1.0}}

- `t`: arrival, seconds from the start (non-decreasing is not required; we sort).
- `tenant`: who sends it: a tenant id, as a TenantQuota's `spec.tenant` (lowercase
  letters, digits and '-', at most 63 characters), so that a trace names tenants a
  gateway could have.
- `segments`: the prompt, as consecutive `[name, length]` pieces. Equal names mean
  identical tokens — a segment named `sys-a` is the same text wherever it appears, and a
  shorter use of a name is a prefix of a longer one, so growing chat histories can reuse
  one name. `null` names tokens no other request has.
- `output_tokens`: what the model will generate.
- `max_tokens` (optional): what the client asked for; length predictors may use it.
  Defaults to `output_tokens`; must not be smaller.
- `slo` (optional): `{"ttft": seconds, "tbt": seconds}`.
- `output_segment` (optional): the name the request's output takes as a segment.
- `band` (optional): the priority band the request asks to run in (`interactive`,
  `standard`, `batch`), only ever below its tenant's; absent: its tenant's band.
- `cancel_after` (optional): seconds after its arrival at which its client hangs up
  (absent: never); `stream` (optional, default true): whether its answer is streamed,
  which decides what a hang-up is charged (`fairpool.front.charges`).
- `after` (optional): the `output_segment` of another request of the trace, which this
  one waits for: it is sent at `t` or when that request finishes, whichever is later
  (a tree of thoughts' child needs its parent's thought), and never if that request
  does not finish.

Bad lines raise `TraceError` naming the line and the field; nothing is half-loaded.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from fairpool.api.tenant_quota import tenant_id
from fairpool.sched.errors import ConfigError
from fairpool.sched.requests import SLO
from fairpool.sched.tree import BAND_NAMES, Shares, flow

Segment = tuple[str | None, int]


class TraceError(ConfigError):
    """A trace line is malformed; the message names the line and field."""


@dataclass(frozen=True)
class TraceRequest:
    t: float
    tenant: str
    segments: tuple[Segment, ...]
    output_tokens: int
    max_tokens: int
    slo: SLO | None = None
    #: The named segment the request's output becomes: a later prompt that continues
    #: with this segment hits the generated tokens in the prefix cache (a tree of
    #: thoughts' child, a chat's next turn).
    output_segment: str | None = None
    #: The band it asks to run in, below its tenant's (None: its tenant's).
    band: str | None = None
    #: Seconds after `t` at which its client hangs up (None: it waits for the answer).
    cancel_after: float | None = None
    #: Whether its answer is streamed: a hang-up is charged what the stream delivered;
    #: one of an answer not streamed, its whole output reservation.
    stream: bool = True
    #: The `output_segment` of the request it waits for (None: it is sent at `t`).
    after: str | None = None

    @property
    def prompt_tokens(self) -> int:
        return sum(length for _, length in self.segments)

    def flow(self, shares: Shares) -> str:
        """The flow it runs in under `shares` (`fairpool.sched.tree.flow`): ConfigError
        if it asks a band above its tenant's."""
        return flow(self.tenant, self.band, shares.tenant_band(self.tenant))

    def to_json(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "t": round(self.t, 6),
            "tenant": self.tenant,
            "segments": [[name, length] for name, length in self.segments],
            "output_tokens": self.output_tokens,
            "max_tokens": self.max_tokens,
        }
        if self.slo is not None:
            record["slo"] = {
                key: value
                for key, value in (("ttft", self.slo.ttft), ("tbt", self.slo.tbt))
                if value is not None
            }
        if self.output_segment is not None:
            record["output_segment"] = self.output_segment
        if self.band is not None:
            record["band"] = self.band
        if self.cancel_after is not None:
            record["cancel_after"] = round(self.cancel_after, 6)
        if not self.stream:
            record["stream"] = False
        if self.after is not None:
            record["after"] = self.after
        return record


def parse_request(
    record: object, where: str = "request", shares: Shares | None = None
) -> TraceRequest:
    """One trace record (a decoded JSON object) → TraceRequest, or TraceError. With
    `shares`, a band above the tenant's is refused here, naming `where`."""

    def fail(field: str, problem: str) -> TraceError:
        return TraceError(f"{where}: {field}", problem)

    if not isinstance(record, dict):
        raise fail("record", f"must be a JSON object, got {type(record).__name__}")
    fields = {
        "t",
        "tenant",
        "segments",
        "output_tokens",
        "max_tokens",
        "slo",
        "output_segment",
        "band",
        "cancel_after",
        "stream",
        "after",
    }
    unknown = set(record) - fields
    if unknown:
        raise fail(sorted(unknown)[0], "unknown field")
    t = record.get("t")
    if isinstance(t, bool) or not isinstance(t, int | float) or not t >= 0:
        raise fail("t", f"must be a number >= 0, got {t!r}")
    tenant = tenant_id(record.get("tenant"), f"{where}: tenant", TraceError)
    raw_segments = record.get("segments")
    if not isinstance(raw_segments, list) or not raw_segments:
        raise fail("segments", "must be a non-empty list of [name, length] pairs")
    segments: list[Segment] = []
    for index, segment in enumerate(raw_segments):
        if not (isinstance(segment, list) and len(segment) == 2):
            raise fail(f"segments[{index}]", f"must be [name, length], got {segment!r}")
        name, length = segment
        if name is not None and not isinstance(name, str):
            raise fail(f"segments[{index}]", f"name must be a string or null, got {name!r}")
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise fail(f"segments[{index}]", f"length must be an integer >= 1, got {length!r}")
        segments.append((name, length))
    output = record.get("output_tokens")
    if isinstance(output, bool) or not isinstance(output, int) or output < 1:
        raise fail("output_tokens", f"must be an integer >= 1, got {output!r}")
    max_tokens = record.get("max_tokens", output)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < output:
        raise fail(
            "max_tokens", f"must be an integer >= output_tokens ({output}), got {max_tokens!r}"
        )
    slo = None
    if "slo" in record:
        raw_slo = record["slo"]
        if not isinstance(raw_slo, dict) or set(raw_slo) - {"ttft", "tbt"}:
            raise fail("slo", f"must be an object with ttft and/or tbt, got {raw_slo!r}")
        try:
            slo = SLO(ttft=raw_slo.get("ttft"), tbt=raw_slo.get("tbt"))
        except ConfigError as error:
            raise fail(error.parameter, error.problem) from None
    output_segment = _segment_name(record, "output_segment", fail)
    after = _segment_name(record, "after", fail)
    band = record.get("band")
    if band is not None and band not in BAND_NAMES:
        raise fail("band", f"must be one of {', '.join(BAND_NAMES)}, got {band!r}")
    cancel_after = record.get("cancel_after")
    if cancel_after is not None and (
        isinstance(cancel_after, bool)
        or not isinstance(cancel_after, int | float)
        or not cancel_after >= 0
    ):
        raise fail("cancel_after", f"must be a number of seconds >= 0, got {cancel_after!r}")
    stream = record.get("stream", True)
    if not isinstance(stream, bool):
        raise fail("stream", f"must be true or false, got {stream!r}")
    request = TraceRequest(
        float(t),
        tenant,
        tuple(segments),
        output,
        max_tokens,
        slo,
        output_segment,
        band,
        None if cancel_after is None else float(cancel_after),
        stream,
        after,
    )
    if shares is not None:
        try:
            request.flow(shares)
        except ConfigError as error:
            raise fail("band", error.problem) from None
    return request


def _segment_name(
    record: dict[str, Any], field: str, fail: Callable[[str, str], TraceError]
) -> str | None:
    """An optional segment name field: a non-empty string, or absent/null."""
    name = record.get(field)
    if name is not None and (not isinstance(name, str) or not name):
        raise fail(field, f"must be a non-empty string or null, got {name!r}")
    return name


def read_trace(source: str | Path | TextIO, shares: Shares | None = None) -> list[TraceRequest]:
    """All requests of a JSON-lines trace, sorted by arrival. Blank lines are skipped.
    With `shares` (the tenants' bands), a request asking a band above its tenant's is
    refused naming its line."""
    if isinstance(source, str | Path):
        path = Path(source)
        if not path.exists():
            raise TraceError("--trace", f"no such file: {path}")
        with path.open() as handle:
            return read_trace(handle, shares)
    requests = []
    for number, line in enumerate(source, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise TraceError(f"line {number}", f"not valid JSON: {error.msg}") from None
        requests.append(parse_request(record, f"line {number}", shares))
    return sorted(requests, key=lambda request: request.t)


def write_trace(requests: Iterable[TraceRequest], destination: str | Path | TextIO) -> None:
    if isinstance(destination, str | Path):
        with Path(destination).open("w") as handle:
            write_trace(requests, handle)
        return
    for request in requests:
        destination.write(json.dumps(request.to_json(), separators=(",", ":")) + "\n")


class SegmentTokens:
    """Token ids for segments: the same name always gives the same tokens.

    A named segment's tokens come from a random stream seeded by the name, so a shorter
    use of a name is a prefix of a longer one. Unnamed segments draw from one shared
    stream and never repeat in practice. Ids are drawn from a large range so that
    unrelated segments do not share even a first token by chance.
    """

    ID_RANGE = 1 << 30

    def __init__(self, seed: int = 0) -> None:
        self._seed = seed
        self._named: dict[str, tuple[random.Random, list[int]]] = {}
        self._unique = random.Random(f"fairpool-unique-{seed}")

    def tokens(self, segments: Iterable[Segment]) -> list[int]:
        out: list[int] = []
        for name, length in segments:
            out.extend(self._segment(name, length))
        return out

    def _segment(self, name: str | None, length: int) -> list[int]:
        if name is None:
            draw = self._unique.randrange
            return [draw(self.ID_RANGE) for _ in range(length)]
        stream, made = self._named.get(name) or self._new_stream(name)
        if len(made) < length:
            draw = stream.randrange
            made.extend([draw(self.ID_RANGE) for _ in range(length - len(made))])
        return made[:length]

    def _new_stream(self, name: str) -> tuple[random.Random, list[int]]:
        digest = hashlib.blake2b(f"{self._seed}:{name}".encode(), digest_size=8).digest()
        entry: tuple[random.Random, list[int]] = (random.Random(int.from_bytes(digest, "big")), [])
        self._named[name] = entry
        return entry
