"""Reading a tenant's request body at a bounded cost, and writing the engine's.

A body is hostile until proven otherwise, so its cost is bounded before it is paid:

- a pre-scan counts, before anything is parsed, the arrays and strings the body can hold
  (`maxJsonArrays`, `maxJsonStrings`): the parser builds a list for every `[]` and a string
  for every `""`, so a 4 MB body of empty lists would cost some 200 MB and seconds of CPU.
  Counting brackets and quotes is an upper bound found at memory speed; only a body above
  a bound is counted exactly (its strings blanked out first, at most `maxJsonStrings + 1`
  of them, so that brackets inside text do not count);
- parsing stops as soon as the body holds more than `maxJsonObjects` objects or
  `maxJsonNumbers` numbers (the C parser calls back for each), so a 4 MB body of tiny
  messages is refused after twenty thousand, not after allocating 133,000 dicts; a body
  nested deeper than the parser's recursion limit, or a number of thousands of digits, is a
  400 too, never a 500;
- a body over `INLINE_PARSE_BYTES` is scanned and parsed in a worker thread
  (`parse_body`), so the event loop goes on serving, and polling the workers, meanwhile;
- its shape is checked on the parsed document before the request model validates it
  (the model's work grows with every message): message or input-item count, `n` and
  `best_of`, the log-probability fields, each read as the engine will read it (vLLM's
  models coerce `"100"` and `9.0` to integers, so the caps do too, and the engine is
  sent the integer that was checked);
- the engine's body is written as UTF-8, which a lone surrogate (`"\\ud800"`, valid JSON
  but not valid text) cannot be: such a body is a 400 naming the field, instead of an
  engine error that would look like a failing worker.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Iterator
from typing import Any

from pydantic import TypeAdapter, ValidationError

from fairpool.api.gateway_config import ClientLimits
from fairpool.api.scheduler_config import BAND_XARG, TENANT_XARG, XARG_PREFIX
from fairpool_gateway.protocol import (
    Endpoint,
    GatewayError,
    ParsedRequest,
    TenantRequest,
    bad_request,
)

#: Fields a request may ask several answers with; each is capped at `maxChoices`.
CHOICES_FIELDS = ("n", "best_of")
#: Fields that ask for log-probabilities; each is capped at `maxLogprobs` (and none may be
#: negative: vLLM reads -1 as "every token of the vocabulary").
LOGPROB_FIELDS = ("logprobs", "top_logprobs", "prompt_logprobs")
#: Fields that hold a request's messages or input items.
LIST_FIELDS = ("messages", "input")


#: Bodies up to this size are parsed on the event loop; larger ones in a worker thread.
INLINE_PARSE_BYTES = 64 << 10
#: A JSON string, escapes included (the blanking of the exact pre-scan).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
#: Bytes of a request body that are not input, by allowance: the model, the sampling
#: parameters, the tenant's tag and salt, the JSON around them (`other_input_chars`).
ENVELOPE_BYTES = 1024
#: How an integer field is read by the engine's request models (pydantic's lax mode).
_LAX_INT: TypeAdapter[int] = TypeAdapter(int)


class _TooLarge(Exception):
    pass


async def parse_body(body: bytes | bytearray, limits: ClientLimits) -> dict[str, Any]:
    """`load_json`, in a worker thread for a large body."""
    if len(body) <= INLINE_PARSE_BYTES:
        return load_json(body, limits)
    return await asyncio.to_thread(load_json, body, limits)


def load_json(body: bytes | bytearray, limits: ClientLimits) -> dict[str, Any]:
    """The JSON object in `body`, parsed at a bounded cost; a 400 otherwise."""
    objects, numbers = limits.max_json_objects, limits.max_json_numbers

    def an_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal objects
        objects -= 1
        if objects < 0:
            raise _TooLarge(f"more than {limits.max_json_objects} JSON objects")
        return dict(pairs)

    def a_number(parse: Any) -> Any:
        def counted(text: str) -> Any:
            nonlocal numbers
            numbers -= 1
            if numbers < 0:
                raise _TooLarge(f"more than {limits.max_json_numbers} numbers")
            return parse(text)

        return counted

    try:
        prescan(body, limits)
        document = json.loads(
            body,
            object_pairs_hook=an_object,
            parse_int=a_number(int),
            parse_float=a_number(float),
        )
    except _TooLarge as error:
        raise bad_request(f"The body has {error}.") from None
    except RecursionError:
        raise bad_request("The body is nested too deeply.") from None
    except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError, huge integers
        raise bad_request(f"The body is not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise bad_request("The body must be a JSON object.")
    depth = _depth(document)
    if depth > limits.max_json_depth:
        raise bad_request(
            f"The body is nested {depth} levels deep; at most {limits.max_json_depth}."
        )
    return document


def prescan(body: bytes | bytearray, limits: ClientLimits) -> None:
    """Raise _TooLarge if `body` holds more arrays or strings than the limits allow, before
    it is parsed (the module's docstring says how)."""
    arrays, strings = limits.max_json_arrays, limits.max_json_strings
    quotes = body.count(b'"')
    if body.count(b"[") <= arrays and quotes <= 2 * strings:
        return  # the upper bounds hold: most bodies stop here
    if quotes - body.count(b'\\"') > 2 * strings:  # even if every \" were escaped
        raise _TooLarge(f"more than {strings} strings")
    blanked, found = _STRING.subn(b'""', bytes(body), count=strings + 1)
    if found > strings:
        raise _TooLarge(f"more than {strings} strings")
    if blanked.count(b"[") > arrays:
        raise _TooLarge(f"more than {arrays} JSON arrays")


def check_shape(document: dict[str, Any], limits: ClientLimits) -> None:
    """What a request asks of the engine, bounded before the request model reads it. The
    capped fields are read as the engine reads them, and written back as the integers
    that were checked."""
    for name in LIST_FIELDS:
        items = document.get(name)
        if isinstance(items, list) and len(items) > limits.max_messages:
            raise bad_request(
                f"{name}: at most {limits.max_messages} items, got {len(items)}", name
            )
    for name, cap in (
        *((field, limits.max_choices) for field in CHOICES_FIELDS),
        *((field, limits.max_logprobs) for field in LOGPROB_FIELDS),
    ):
        value = as_engine_int(document.get(name))
        if value is None:
            continue  # absent, or not an integer: the engine refuses it itself
        if value > cap:
            raise bad_request(f"{name}: at most {cap}, got {value}", name)
        if value < 0 and name in LOGPROB_FIELDS:
            raise bad_request(f"{name}: must not be negative, got {value}", name)
        if not isinstance(document[name], int):  # "9", 9.0: what the engine would read
            document[name] = value


def as_engine_int(value: object) -> int | None:
    """`value` as vLLM's request models read an integer field (pydantic's lax mode:
    `"100"`, `9.0` and `true` are integers), or None if they would not; booleans are
    kept as they are (chat's `logprobs` is one)."""
    if value is None or isinstance(value, (dict, list)):
        return None
    if isinstance(value, bool):
        return int(value)
    try:
        return _LAX_INT.validate_python(value)
    except ValidationError:
        return None


def prepare(
    document: dict[str, Any],
    request: TenantRequest,
    endpoint: Endpoint,
    tenant: str,
    share_cache: bool,
    band: str | None = None,
) -> ParsedRequest:
    """What the gateway keeps of a validated request: the engine's body, and what
    admission and routing need. Unless the pool shares its prefix cache across tenants,
    the tenant's prompts get a cache salt of their own, and its routing key starts with
    the tenant, so neither a cache hit nor a routing choice depends on another tenant."""
    stream = endpoint.stream is not None and request.streams()
    ask_for_usage = stream and endpoint.stream is not None and endpoint.stream.asks_for_usage
    salt = None if share_cache else cache_salt(tenant, document.get("cache_salt"))
    prompt = request.prompt_text()
    upstream = upstream_body(document, tenant, ask_for_usage, salt, band)
    return ParsedRequest(
        endpoint=endpoint,
        upstream=upstream,
        key=prompt if share_cache else f"{tenant}\0{prompt}",
        prompt_chars=len(prompt),
        other_input_chars=other_input_chars(upstream, prompt),
        stream=stream,
        wants_usage_chunk=request.wants_usage_chunk(),
        output_limit=request.output_limit(),
        choices=choices(document),
    )


def other_input_chars(upstream: bytes, prompt: str) -> int:
    """What the engine reads besides the prompt's text, in characters: tool definitions,
    schemas, images and other non-text parts, message structure. The prompt's text is
    the one part the gateway reads as text; everything else in the body is counted at the
    same rate, beyond an allowance (`ENVELOPE_BYTES`) for the sampling parameters and the
    JSON around them. So a request cannot send 400 KB in `tools` and be admitted, queued
    and charged as four tokens; and no field the gateway does not know escapes the count."""
    return max(0, len(upstream) - len(prompt.encode(errors="surrogatepass")) - ENVELOPE_BYTES)


def cache_salt(tenant: str, client_salt: object) -> str:
    """The `cache_salt` a tenant's requests carry: a digest of the tenant (and of the
    client's own salt, which so keeps its meaning within the tenant). vLLM keys its prefix
    cache's blocks by the salt, so no two tenants share a cached block. At most 128
    characters, none of vLLM's forbidden ones."""
    if client_salt is not None and (not isinstance(client_salt, str) or not client_salt):
        raise bad_request("cache_salt: must be a non-empty string", "cache_salt")
    seed = tenant if client_salt is None else f"{tenant}\0{client_salt}"
    return "fairpool-" + hashlib.sha256(seed.encode(errors="surrogatepass")).hexdigest()[:48]


def choices(document: dict[str, Any]) -> int:
    """How many answers the request asks for (`n`, `best_of`): each may produce its output
    limit, so each is reserved against the tenant's tokens per minute."""
    asked = [document.get(name) for name in CHOICES_FIELDS]
    return max([1, *(value for value in asked if isinstance(value, int) and value > 0)])


def upstream_body(
    document: dict[str, Any],
    tenant: str,
    ask_for_usage: bool,
    cache_salt: str | None,
    band: str | None = None,
) -> bytes:
    """The body for the engine: the client's, with the tenant tag (replacing any
    `fairpool_*` the client sent, so nobody can speak for another tenant) and the band it
    runs in when below its tenant's, the tenant's cache salt where caches are kept apart,
    and, where the stream needs asking, the usage chunk requested. `vllm_xargs` and
    `stream_options` are objects (the request models checked). A 400 naming the field if
    some text is not valid Unicode."""
    xargs = {
        key: value
        for key, value in (document.get("vllm_xargs") or {}).items()
        if not str(key).startswith(XARG_PREFIX)
    }
    xargs[TENANT_XARG] = tenant
    if band is not None:
        xargs[BAND_XARG] = band
    body = {**document, "vllm_xargs": xargs}
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    if ask_for_usage:
        body["stream_options"] = {**(document.get("stream_options") or {}), "include_usage": True}
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise _invalid_text(document) from None


def _invalid_text(document: dict[str, Any]) -> GatewayError:
    for path, value in _strings(document, ()):
        try:
            value.encode()
        except UnicodeEncodeError:
            field = ".".join(path) or None
            return bad_request(
                f"{field}: not valid Unicode text (a lone surrogate)"
                if field
                else "The body is not valid Unicode text (a lone surrogate).",
                field,
            )
    return bad_request("The body is not valid Unicode text (a lone surrogate).")


def _strings(value: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], str]]:
    """Every string in a document (keys too), with where it is."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield path, key
            yield from _strings(item, (*path, str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, (*path, str(index)))


def _depth(document: Any) -> int:
    """How deeply a parsed document nests (an object or array counts one level)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest
