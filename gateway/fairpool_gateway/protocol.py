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


class GenerationRequest(BaseModel):
    """What the gateway reads of either request; every other field is passed on."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1, description="Served model name of the pool.")
    stream: bool | None = Field(default=False, description="Answer as server-sent events.")
    stream_options: StreamOptions | None = Field(default=None, description="Streaming options.")
    max_tokens: int | None = Field(default=None, ge=0, description="Output limit in tokens.")
    temperature: float | None = Field(default=None, ge=0, le=2, description="Sampling.")
    top_p: float | None = Field(default=None, gt=0, le=1, description="Nucleus sampling.")
    user: str | None = Field(default=None, description="End-user id, passed on.")
    vllm_xargs: dict[str, Any] | None = Field(
        default=None,
        description="Extra arguments for the engine (vLLM's); `fairpool_*` keys are the "
        "gateway's and replaced.",
    )

    def prompt_text(self) -> str:
        raise NotImplementedError

    def output_limit(self) -> int | None:
        return self.max_tokens


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str = Field(description="`text` (other part types are passed on untouched).")
    text: str | None = Field(default=None, description="The text of a text part.")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"] = Field(
        description="Who speaks."
    )
    content: str | list[ContentPart] | None = Field(default=None, description="What is said.")

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "\n".join(part.text or "" for part in self.content)


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1, description="The conversation so far.")
    max_completion_tokens: int | None = Field(
        default=None, ge=0, description="Output limit in tokens (wins over max_tokens)."
    )

    def prompt_text(self) -> str:
        """The conversation as one string, in the engines' chat-template order: requests
        that share a system prompt or earlier turns share a prefix of it."""
        return "".join(f"<|{message.role}|>\n{message.text()}\n" for message in self.messages)

    def output_limit(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


Prompt = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(GenerationRequest):
    prompt: Prompt = Field(description="Text, or token ids, to complete.")

    def prompt_text(self) -> str:
        prompt = self.prompt
        if isinstance(prompt, str):
            return prompt
        if prompt and isinstance(prompt[0], str):
            return "\n".join(str(part) for part in prompt)
        return " ".join(str(part) for part in prompt)  # token ids: a key of their own


@dataclass(frozen=True)
class ParsedRequest:
    document: dict[str, Any]  # the body as sent, to forward
    request: GenerationRequest
    prompt: str

    @property
    def stream(self) -> bool:
        return bool(self.request.stream)

    @property
    def estimated_input_tokens(self) -> int:
        return max(1, tokens_for_chars(len(self.prompt)))


def parse_request(body: bytes, kind: type[GenerationRequest]) -> ParsedRequest:
    """The request in `body`; a 400 naming the field otherwise."""
    try:
        document = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise bad_request(f"The body is not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise bad_request("The body must be a JSON object.")
    try:
        request = kind.model_validate(document)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        field = ".".join(str(part) for part in first["loc"]) or None
        raise bad_request(f"{field}: {first['msg']}" if field else first["msg"], field) from None
    return ParsedRequest(document, request, request.prompt_text())


def error_body(status: HTTPStatus, message: str, error_type: str) -> bytes:
    return json.dumps(GatewayError(status, message, error_type).body()).encode()
