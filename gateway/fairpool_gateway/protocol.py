"""The tenant API's requests and errors, in OpenAI's shapes.

The gateway reads only what it needs from a request — the model (which selects the pool),
the prompt (the routing key and the input estimate), `stream` and the output limit — and
forwards the body otherwise untouched: the engine validates the rest, and its 4xx errors
reach the client as they are. Errors the gateway raises itself have OpenAI's body,
`{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fairpool.front import tokens_for_chars


class GatewayError(Exception):
    """A request the gateway refuses, with OpenAI's error body."""

    def __init__(
        self,
        status: HTTPStatus,
        message: str,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.error_type = status, message, error_type
        self.param, self.code, self.headers = param, code, headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(HTTPStatus.BAD_REQUEST, message, param=param)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = Field(default=None, description="Send a last usage chunk.")


class TenantRequest(BaseModel):
    """What the gateway reads of any request it forwards; every other field is passed on."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1, description="Served model name of the pool.")
    user: str | None = Field(default=None, description="End-user id, passed on.")
    vllm_xargs: dict[str, Any] | None = Field(
        default=None,
        description="Extra arguments for the engine (vLLM's); `fairpool_*` keys are the "
        "gateway's and replaced.",
    )

    def prompt_text(self) -> str:
        """The prompt as text: the routing key, and what the input estimate counts."""
        raise NotImplementedError

    def output_limit(self) -> int | None:
        """The most output tokens the request may produce; None when it does not say."""
        return None

    def streams(self) -> bool:
        return False

    def wants_usage_chunk(self) -> bool:
        """The client asked for a stream's usage chunk (`stream_options.include_usage`)."""
        return False


class GenerationRequest(TenantRequest):
    """Completions and chat completions."""

    stream: bool | None = Field(default=False, description="Answer as server-sent events.")
    stream_options: StreamOptions | None = Field(default=None, description="Streaming options.")
    max_tokens: int | None = Field(default=None, ge=0, description="Output limit in tokens.")
    temperature: float | None = Field(default=None, ge=0, le=2, description="Sampling.")
    top_p: float | None = Field(default=None, gt=0, le=1, description="Nucleus sampling.")

    def output_limit(self) -> int | None:
        return self.max_tokens

    def streams(self) -> bool:
        return bool(self.stream)

    def wants_usage_chunk(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str = Field(description="`text`, `input_text`, ... (others are passed on untouched).")
    text: str | None = Field(default=None, description="The text of a text part.")


def content_text(content: str | list[ContentPart] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "\n".join(part.text or "" for part in content)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"] = Field(
        description="Who speaks."
    )
    content: str | list[ContentPart] | None = Field(default=None, description="What is said.")

    def text(self) -> str:
        return content_text(self.content)


def conversation_text(turns: list[tuple[str, str]]) -> str:
    """A conversation as one string, in the engines' chat-template order: requests that
    share a system prompt or earlier turns — through any API — share a prefix of it."""
    return "".join(f"<|{role}|>\n{text}\n" for role, text in turns)


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1, description="The conversation so far.")
    max_completion_tokens: int | None = Field(
        default=None, ge=0, description="Output limit in tokens (wins over max_tokens)."
    )

    def prompt_text(self) -> str:
        return conversation_text([(message.role, message.text()) for message in self.messages])

    def output_limit(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


Prompt = str | list[str] | list[int] | list[list[int]]


def prompt_text(prompt: Prompt) -> str:
    if isinstance(prompt, str):
        return prompt
    if prompt and isinstance(prompt[0], str):
        return "\n".join(str(part) for part in prompt)
    return " ".join(str(part) for part in prompt)  # token ids: a key of their own


class CompletionRequest(GenerationRequest):
    prompt: Prompt = Field(description="Text, or token ids, to complete.")

    def prompt_text(self) -> str:
        return prompt_text(self.prompt)


class ResponseInputItem(BaseModel):
    """An item of a Responses API `input`: a message (role and content), or another item
    (a tool call's output, ...), whose text is its `content` or `output`."""

    model_config = ConfigDict(extra="allow")
    type: str | None = Field(default=None, description="`message` (the default), or another.")
    role: str | None = Field(default=None, description="Who speaks, for a message.")
    content: str | list[ContentPart] | None = Field(default=None, description="What is said.")
    output: str | None = Field(default=None, description="A tool call's output.")

    def turn(self) -> tuple[str, str]:
        return self.role or self.type or "user", content_text(self.content) or self.output or ""


class ResponsesRequest(TenantRequest):
    """The Responses API (`/v1/responses`), the OpenAI SDK's primary API."""

    input: str | list[ResponseInputItem] = Field(description="Text, or the conversation.")
    instructions: str | None = Field(default=None, description="A system message.")
    max_output_tokens: int | None = Field(default=None, ge=0, description="Output limit in tokens.")
    stream: bool | None = Field(default=False, description="Answer as server-sent events.")
    temperature: float | None = Field(default=None, ge=0, le=2, description="Sampling.")
    top_p: float | None = Field(default=None, gt=0, le=1, description="Nucleus sampling.")

    def prompt_text(self) -> str:
        turns = [("system", self.instructions)] if self.instructions is not None else []
        if isinstance(self.input, str):
            turns.append(("user", self.input))
        else:
            turns.extend(item.turn() for item in self.input)
        return conversation_text(turns)

    def output_limit(self) -> int | None:
        return self.max_output_tokens

    def streams(self) -> bool:
        return bool(self.stream)


class EmbeddingsRequest(TenantRequest):
    """Embeddings (`/v1/embeddings`): the prompt only, no output."""

    input: Prompt = Field(description="Text, texts, or token ids to embed.")
    encoding_format: Literal["float", "base64"] | None = Field(
        default=None, description="How the vectors are written."
    )
    dimensions: int | None = Field(default=None, ge=1, description="Vector length.")

    def prompt_text(self) -> str:
        return prompt_text(self.input)

    def output_limit(self) -> int:
        return 0


@dataclass(frozen=True)
class StreamFormat:
    """How an API's streamed answer shows its output and its usage.

    `output_event`: the bytes that mark one output token's event (None: every `data:` event
    but `[DONE]` and the usage chunk carries one). `asks_for_usage`: the engine sends usage
    in a stream only when asked (`stream_options.include_usage`), so the gateway asks, and
    removes the usage chunk again unless its client asked too.
    """

    output_event: bytes | None
    asks_for_usage: bool


CHUNKS = StreamFormat(output_event=None, asks_for_usage=True)
RESPONSE_EVENTS = StreamFormat(
    output_event=b'"type":"response.output_text.delta"', asks_for_usage=False
)


@dataclass(frozen=True)
class Endpoint:
    """One endpoint of the tenant API: its requests and, if it streams, how."""

    path: str
    summary: str
    request: type[TenantRequest]
    stream: StreamFormat | None  # None: never streamed


ENDPOINTS = (
    Endpoint("/v1/chat/completions", "Chat completion", ChatCompletionRequest, CHUNKS),
    Endpoint("/v1/completions", "Text completion", CompletionRequest, CHUNKS),
    Endpoint("/v1/responses", "Response (the Responses API)", ResponsesRequest, RESPONSE_EVENTS),
    Endpoint("/v1/embeddings", "Embeddings", EmbeddingsRequest, None),
)


def validate(document: dict[str, Any], endpoint: Endpoint) -> TenantRequest:
    """The request model of `endpoint` over a parsed body; a 400 naming the field."""
    try:
        return endpoint.request.model_validate(document)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        field = ".".join(str(part) for part in first["loc"]) or None
        raise bad_request(f"{field}: {first['msg']}" if field else first["msg"], field) from None


@dataclass(frozen=True)
class ParsedRequest:
    """What the gateway keeps of a request while it waits: the engine's body, written
    already, and the few facts admission and routing need. The client's document and the
    validated model are not kept (a queued request holds no more than it must)."""

    endpoint: Endpoint
    upstream: bytes  # the body to send to the engine
    key: str  # the routing key: the prompt, after the tenant where caches are kept apart
    prompt_chars: int  # the prompt's text, in characters
    other_input_chars: int  # the rest of the input: tools, schemas, non-text parts
    stream: bool
    wants_usage_chunk: bool
    output_limit: int | None
    choices: int  # answers asked for (n, best_of): each may produce output_limit tokens

    @property
    def estimated_input_tokens(self) -> int:
        """The input the request is admitted, queued and reserved with, until the engine
        reports what it read: every prompt-bearing field, not the text alone."""
        return max(1, tokens_for_chars(self.prompt_chars + self.other_input_chars))


def error_body(status: HTTPStatus, message: str, error_type: str) -> bytes:
    return json.dumps(GatewayError(status, message, error_type).body()).encode()
