"""OpenAI requests as vLLM 0.32 validates them, and vLLM's error bodies.

The request models keep vLLM's types for the fields the simulated engine reads (so a
wrong type fails the same way) and allow every other field, as vLLM does. Errors come
in vLLM's two shapes, both `{"error": {"message", "type", "param", "code"}}`:

- a body that fails validation (malformed JSON, wrong types): type `Bad Request`, the
  message `N validation error(s):` and one line per error, `param` the first error's
  location (`body.max_tokens`);
- a request vLLM refuses with its own checks (too long, unknown model, options that do
  not go together): type `BadRequestError` or `NotFoundError`, vLLM's message.
"""

from __future__ import annotations

import json
import re
from http import HTTPStatus
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fairpool.api.scheduler_config import check_xargs
from fairpool.sched.errors import ConfigError

_MAX_REPORTED_ERRORS = 10  # vLLM bounds the size of validation messages the same way
_MAX_INPUT_CHARS = 200


class APIError(Exception):
    """A request refused with vLLM's error body."""

    def __init__(
        self,
        message: str,
        error_type: str = "BadRequestError",
        status: HTTPStatus = HTTPStatus.BAD_REQUEST,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.error_type, self.status, self.param = message, error_type, status, param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.status.value,
            }
        }


class RequestError(Exception):
    """vLLM's `VLLMValidationError`: its text ends with the parameter and value. Not a
    ValueError, so that pydantic lets it through a model validator, as vLLM's does."""

    def __init__(self, message: str, parameter: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.parameter, self.value = parameter, value

    def __str__(self) -> str:
        named = (("parameter", self.parameter), ("value", self.value))
        extras = [f"{name}={value}" for name, value in named if value is not None]
        base = super().__str__()
        return f"{base} ({', '.join(extras)})" if extras else base

    def api_error(self) -> APIError:
        return APIError(str(self), param=self.parameter)


def model_not_found(model: str, served: str) -> APIError:
    return APIError(
        f"The model `{model}` does not exist. Valid aliases: {served}.",
        "NotFoundError",
        HTTPStatus.NOT_FOUND,
        "model",
    )


def http_error(status: int, detail: str) -> APIError:
    """What vLLM answers for framework errors (unknown path, wrong method)."""
    phrase = HTTPStatus(status).phrase
    return APIError(detail, phrase, HTTPStatus(status))


# ---------------------------------------------------------------------- validation errors


def validation_error(errors: list[Any]) -> APIError:
    """vLLM's answer to a body that fails validation (its `validation_exception_handler`)."""
    param = None
    if errors and isinstance(errors[0], dict) and errors[0].get("loc"):
        param = _dotted(errors[0]["loc"])
    label = "error" if len(errors) == 1 else "errors"
    lines = [f"{len(errors)} validation {label}:"]
    lines += [f"  {_format_error(error)}" for error in errors[:_MAX_REPORTED_ERRORS]]
    if len(errors) > _MAX_REPORTED_ERRORS:
        lines.append(f"  ...and {len(errors) - _MAX_REPORTED_ERRORS} more {label}")
    return APIError("\n".join(lines), HTTPStatus.BAD_REQUEST.phrase, param=param)


# Parts of a pydantic error location that name its own schema, not a field (union
# branches such as `list[constrained-int]`, `str`): vLLM drops them from `param`.
_SCHEMA_PART = re.compile(r"[\[\](){}]|^(str|int|float|bool|list|dict|union|tagged-union)$")


def _dotted(loc: tuple[Any, ...]) -> str:
    parts = [str(part) for part in loc]
    return ".".join([part for part in parts if not _SCHEMA_PART.search(part)] or parts)


def _format_error(error: Any) -> str:
    if not isinstance(error, dict):
        return str(error)
    error = dict(error)
    if "input" in error:
        error["input"] = _summarize(error["input"])
    if "loc" in error:
        error["loc"] = _dotted(error["loc"])
    return str(error)


def _summarize(value: Any) -> Any:
    if isinstance(value, list | dict):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = value if isinstance(value, str) else str(value)
    return text[:_MAX_INPUT_CHARS] + "...[truncated]" if len(text) > _MAX_INPUT_CHARS else value


def output_budget(
    max_model_len: int, prompt_tokens: int, requested: int | None, param: str, min_tokens: int
) -> int:
    """The request's max_tokens, checked in vLLM's order with vLLM's messages: the
    request's limit against the context, the prompt against it, then the rest of the
    context caps the output (its default when the request sets none)."""
    if requested is not None and requested > max_model_len:
        raise RequestError(
            f"{param}={requested} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            parameter=param,
            value=requested,
        )
    if prompt_tokens > max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {prompt_tokens} input tokens, which exceeds this limit even "
            "without any output tokens. Please reduce the length of the input prompt.",
            parameter="input_tokens",
            value=prompt_tokens,
        )
    room = max_model_len - prompt_tokens
    max_tokens = room if requested is None else min(room, requested)
    if max_tokens < 1:
        raise RequestError(
            f"max_tokens must be at least 1, got {max_tokens}.",
            parameter="max_tokens",
            value=max_tokens,
        )
    if min_tokens < 0:
        raise RequestError(f"min_tokens must be greater than or equal to 0, got {min_tokens}.")
    if min_tokens > max_tokens:
        raise RequestError(
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}."
        )
    return max_tokens


# ---------------------------------------------------------------------- requests


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


XargValue = str | int | float | list[str | int | float]


class GenerationRequest(BaseModel):
    """Fields common to completions and chat completions."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    n: int | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    use_beam_search: bool = False
    request_id: str | None = None
    vllm_xargs: dict[str, XargValue] | None = None

    @model_validator(mode="before")
    @classmethod
    def _stream_options_need_stream(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("stream_options") and not data.get("stream"):
            raise RequestError(
                "Stream options can only be defined when `stream=True`.",
                parameter="stream_options",
            )
        return data

    def check_supported(self) -> None:
        """Refuse what vLLM serves but the simulated engine does not, and bad xargs."""
        if (self.n or 1) != 1:
            raise _unsupported("n", "`n` other than 1")
        if self.use_beam_search:
            raise _unsupported("use_beam_search", "beam search")
        try:
            check_xargs(self.vllm_xargs)
        except ConfigError as error:
            raise APIError(str(error), param=error.parameter) from None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and bool(
            self.stream_options and self.stream_options.continuous_usage_stats
        )


TokenId = Annotated[int, Field(ge=0)]


class CompletionRequest(GenerationRequest):
    prompt: list[TokenId] | list[list[TokenId]] | str | list[str] | None = None
    max_tokens: int | None = 16
    echo: bool | None = False
    logprobs: int | None = None
    suffix: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _checks_before(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("max_tokens") is None:  # vLLM: null means the default
            data = {**data, "max_tokens": cls.model_fields["max_tokens"].default}
        if data.get("prompt") in (None, ""):
            raise empty_prompt()
        return data

    def check_supported(self) -> None:
        super().check_supported()
        for name in ("echo", "suffix", "logprobs"):
            if getattr(self, name) not in (None, False):
                raise _unsupported(name, f"`{name}`")
        prompt = self.prompt
        if isinstance(prompt, list) and len(prompt) > 1 and not isinstance(prompt[0], int):
            raise _unsupported("prompt", "a list of several prompts")

    def prompt_text_or_ids(self) -> str | list[int]:
        """The one prompt (`check_supported` refuses several): text or token ids."""
        prompt = self.prompt
        assert prompt is not None  # the validator refuses a missing prompt
        if isinstance(prompt, str):
            return prompt
        if not prompt:
            return []
        first = prompt[0]
        return prompt if isinstance(first, int) else first  # type: ignore[return-value]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise _unsupported("messages", f"content parts of type {part.type!r}")
        return "\n".join(part.text or "" for part in self.content)


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    echo: bool = False
    add_generation_prompt: bool = True

    def check_supported(self) -> None:
        super().check_supported()
        for name in ("echo", "logprobs"):
            if getattr(self, name):
                raise _unsupported(name, f"`{name}`")
        if not self.messages:
            raise APIError("`messages` must contain at least one message.", param="messages")

    @property
    def output_limit(self) -> tuple[int | None, str]:
        """The requested output length and the parameter that set it (as vLLM names it)."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    @property
    def response_role(self) -> str:
        return "assistant" if self.add_generation_prompt else self.messages[-1].role


def empty_prompt() -> RequestError:
    return RequestError(
        "Either prompt or prompt_embeds must be provided and non-empty.", parameter="prompt"
    )


def _unsupported(param: str, what: str) -> APIError:
    return APIError(f"The simulated engine does not support {what}.", param=param)


Parsed = TypeVar("Parsed", bound=GenerationRequest)


def parse_body(body: bytes, content_type: str, model: type[Parsed]) -> Parsed:
    """The request in `body`, or vLLM's validation error."""
    media_type = content_type.split(";", maxsplit=1)[0].strip().lower()
    if media_type != "application/json":
        raise validation_error(["Unsupported Media Type: Only 'application/json' is allowed"])
    if not body:
        raise validation_error(
            [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
        )
    try:
        document = json.loads(body)
    except json.JSONDecodeError as error:
        raise validation_error(
            [
                {
                    "type": "json_invalid",
                    "loc": ("body", error.pos),
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": error.msg},
                }
            ]
        ) from None
    except UnicodeDecodeError:
        raise validation_error(["Request body is not valid UTF-8"]) from None
    try:
        return model.model_validate(document)
    except ValidationError as error:
        errors = [
            {**detail, "loc": ("body", *detail["loc"])}
            for detail in error.errors(include_url=False)
        ]
        raise validation_error(errors) from None
