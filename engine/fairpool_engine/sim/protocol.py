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
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fairpool.api.scheduler_config import check_xargs
from fairpool.sched.errors import ConfigError
from fairpool_engine.sim.bodies import random_id

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


def pooling_model_not_found(model: str) -> APIError:
    """vLLM's pooling endpoints word it differently, and name no parameter."""
    return APIError(f"The model `{model}` does not exist.", "NotFoundError", HTTPStatus.NOT_FOUND)


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
    return _capped_output(max_model_len, prompt_tokens, requested, min_tokens)


def _capped_output(
    max_model_len: int, prompt_tokens: int, requested: int | None, min_tokens: int = 0
) -> int:
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


def check_input_length(max_model_len: int, prompt_tokens: int) -> None:
    """vLLM's check of a rendered prompt (responses, embeddings). Its tokenizer stops at
    max_model_len + 1 tokens, so a prompt too long is reported as "at least" that."""
    if prompt_tokens > max_model_len:
        counted = max_model_len + 1
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains at least {counted} input tokens, which exceeds this limit even "
            "without any output tokens. Please reduce the length of the input prompt.",
            parameter="input_tokens",
            value=counted,
        )


def responses_output_budget(max_model_len: int, prompt_tokens: int, requested: int | None) -> int:
    """max_output_tokens as vLLM's Responses API checks it, in vLLM's order: the limit
    against the context, the prompt against it (at rendering), a prompt that leaves no
    room (before generation), then the output cap."""
    if requested is not None and requested > max_model_len:
        raise RequestError(
            f"max_output_tokens={requested} cannot be greater than max_model_len="
            f"{max_model_len}. Please request fewer output tokens.",
            parameter="max_output_tokens",
            value=requested,
        )
    check_input_length(max_model_len, prompt_tokens)
    if prompt_tokens >= max_model_len:
        raise APIError(
            f"The engine prompt length {prompt_tokens} exceeds the max_model_len "
            f"{max_model_len}. Please reduce prompt.",
            "invalid_request_error",
            param="input",
        )
    return _capped_output(max_model_len, prompt_tokens, requested)


# ---------------------------------------------------------------------- requests


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


XargValue = str | int | float | list[str | int | float]


#: vLLM's limits on `cache_salt` (`validate_cache_salt`).
_MAX_SALT = 128
_SALT_FORBIDDEN = set("@/\\\0")


class ServedRequest(BaseModel):
    """Fields of every request engine-sim serves: the model, the tenant's xargs, and the
    prefix cache's salt (vLLM keys cached blocks by it: requests with different salts
    never share a cached prefix)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    vllm_xargs: dict[str, XargValue] | None = None
    cache_salt: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _salt(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("cache_salt") is None:
            return data
        salt = data["cache_salt"]
        if not isinstance(salt, str) or not salt:
            raise RequestError(
                "Parameter 'cache_salt' must be a non-empty string if provided.",
                parameter="cache_salt",
            )
        if len(salt) > _MAX_SALT or _SALT_FORBIDDEN & set(salt):
            raise RequestError(
                "Parameter 'cache_salt' must be at most 128 characters and must not contain "
                "'@', '/', '\\\\', or NUL.",
                parameter="cache_salt",
            )
        return data

    def check_supported(self) -> None:
        """Refuse bad fairpool xargs (and, in subclasses, what engine-sim cannot serve)."""
        try:
            check_xargs(self.vllm_xargs)
        except ConfigError as error:
            raise APIError(str(error), param=error.parameter) from None


class GenerationRequest(ServedRequest):
    """Fields common to completions and chat completions."""

    n: int | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    use_beam_search: bool = False
    request_id: str | None = None

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
        super().check_supported()

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and bool(
            self.stream_options and self.stream_options.continuous_usage_stats
        )


TokenId = Annotated[int, Field(ge=0, lt=2**63)]  # an int64, as a tensor of ids holds them


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


# ---------------------------------------------------------------------- responses


class ResponseContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ResponseInputItem(BaseModel):
    """An input item; engine-sim serves messages (a role and text content)."""

    model_config = ConfigDict(extra="allow")
    type: str | None = None
    role: str | None = None
    content: str | list[ResponseContentPart] | None = None
    status: str | None = None

    def message(self) -> tuple[str, str]:
        kind = self.type or "message"
        if kind != "message" or self.role not in MESSAGE_ROLES:
            raise _unsupported("input", f"input items of type {kind!r} (role {self.role!r})")
        if self.content is None or isinstance(self.content, str):
            return str(self.role), self.content or ""
        for part in self.content:
            if part.type not in ("input_text", "output_text") or part.text is None:
                raise _unsupported("input", f"content parts of type {part.type!r}")
        return str(self.role), "\n".join(part.text or "" for part in self.content)


MESSAGE_ROLES = ("user", "system", "developer", "assistant")


class ResponsesRequest(ServedRequest):
    """vLLM 0.32's `ResponsesRequest`, with the fields engine-sim reads or echoes."""

    input: str | list[ResponseInputItem]
    instructions: str | None = None
    max_output_tokens: int | None = None
    stream: bool | None = False
    previous_response_id: str | None = None
    store: bool | None = True
    background: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    metadata: dict[str, str] | None = None
    user: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool | None = True
    max_tool_calls: int | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] = "auto"
    truncation: Literal["auto", "disabled"] | None = "disabled"
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    ignore_eos: bool = False
    request_id: str = Field(default_factory=lambda: f"resp_{random_id()}")

    @model_validator(mode="before")
    @classmethod
    def _vllms_checks(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("background") and not data.get("store", True):
            raise RequestError(
                "background can only be used when `store` is true", parameter="background"
            )
        if data.get("prompt") is not None:
            raise RequestError("prompt template is not supported", parameter="prompt")
        if not data.get("tools"):
            choice = data.get("tool_choice", "auto")
            if choice in ("auto", "none"):
                data = {**data, "tool_choice": "none"}
            elif choice == "required":
                raise RequestError(
                    "Tool choice 'required' must be specified with 'tools' parameter.",
                    parameter="tool_choice",
                )
            elif isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
                raise RequestError(
                    "Tool choice 'function' not found in 'tools' parameter.",
                    parameter="tool_choice",
                )
        return data

    def check_supported(self) -> None:
        """vLLM's checks after the model's (no response store here, as in vLLM by
        default), then what engine-sim does not simulate."""
        super().check_supported()
        if self.store and self.background:
            raise APIError(
                "This vLLM engine does not support `store=True` and therefore does not "
                "support the background mode. To enable these features, set the "
                "environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching "
                "the vLLM server.",
                "invalid_request_error",
                param="background",
            )
        if self.previous_response_id is not None:
            raise APIError(
                f"Response with id '{self.previous_response_id}' not found.",
                "invalid_request_error",
                HTTPStatus.NOT_FOUND,
                "response_id",
            )
        if self.tools:
            raise _unsupported("tools", "tools")
        if self.text is not None and (self.text.get("format") or {}).get("type", "text") != "text":
            raise _unsupported("text", "structured output formats")
        if self.include and "message.output_text.logprobs" in self.include:
            raise _unsupported("include", "logprobs")
        if self.truncation == "auto":
            raise _unsupported("truncation", "truncation")

    def messages(self) -> tuple[list[tuple[str, str]], bool]:
        """The conversation as (role, text) messages, as vLLM builds it (instructions as
        a system message first), and whether to add the generation prompt (not when the
        last item is an assistant message still in progress, which the model continues)."""
        conversation = [("system", self.instructions)] if self.instructions else []
        if isinstance(self.input, str):
            return [*conversation, ("user", self.input)], True
        conversation += [item.message() for item in self.input]
        if not conversation:
            raise APIError(
                "Cannot apply chat template to an empty conversation. Provide at least one message."
            )
        last = self.input[-1] if self.input else None
        partial = last is not None and last.role == "assistant"
        partial = partial and last is not None and last.status in ("in_progress", "incomplete")
        return conversation, not partial


# ---------------------------------------------------------------------- embeddings


class EmbeddingRequest(ServedRequest):
    """vLLM 0.32's `EmbeddingCompletionRequest`, with the fields engine-sim reads."""

    input: list[TokenId] | list[list[TokenId]] | str | list[str]
    encoding_format: Literal["float", "base64", "bytes", "bytes_only"] = "float"
    embed_dtype: Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"] = "float32"
    endianness: Literal["native", "big", "little"] = "native"
    dimensions: int | None = None
    user: str | None = None
    request_id: str | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)

    def check_supported(self) -> None:
        super().check_supported()
        if self.model_extra and "messages" in self.model_extra:
            raise _unsupported("messages", "chat messages as embeddings input")
        if self.encoding_format in ("bytes", "bytes_only"):
            raise _unsupported("encoding_format", f"encoding_format {self.encoding_format!r}")
        if self.embed_dtype not in ("float32", "float16", "bfloat16"):
            raise _unsupported("embed_dtype", f"embed_dtype {self.embed_dtype!r}")
        if self.truncate_prompt_tokens is not None:
            raise _unsupported("truncate_prompt_tokens", "truncate_prompt_tokens")

    def inputs(self) -> list[str | list[int]]:
        """One prompt per embedding: a text or token ids."""
        given = self.input
        if isinstance(given, str):
            return [given]
        if not given:
            raise APIError("You must pass at least one prompt")
        if isinstance(given[0], int):
            return [given]
        return list(given)


def empty_decoder_prompt() -> APIError:
    return APIError("The decoder prompt cannot be empty")


def empty_prompt() -> RequestError:
    return RequestError(
        "Either prompt or prompt_embeds must be provided and non-empty.", parameter="prompt"
    )


def _unsupported(param: str, what: str) -> APIError:
    return APIError(f"The simulated engine does not support {what}.", param=param)


Parsed = TypeVar("Parsed", bound=ServedRequest)


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
