"""Response bodies and stream chunks, key for key as vLLM 0.32's OpenAI server writes them.

vLLM builds them from pydantic models and serializes them three ways, which decides
which null fields appear: whole responses with every field (`model_dump()`), stream
chunks with the fields it set (`exclude_unset`), and the final usage chunk without
nulls (`exclude_none`). The builders below write out the result of each.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from fairpool.front import Usage


def random_id() -> str:
    """vLLM's `random_uuid()`: 16 hex digits."""
    return f"{uuid.uuid4().int & (1 << 64) - 1:016x}"


def dumps(document: dict[str, Any]) -> str:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"))


def sse(document: dict[str, Any]) -> bytes:
    return f"data: {dumps(document)}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"


def usage_full(usage: Usage) -> dict[str, Any]:
    """As in a whole response, with vLLM's --enable-prompt-tokens-details."""
    return {
        **usage_counts(usage),
        "prompt_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "created_cache_tokens": None,
            "multimodal_tokens": None,
        },
        "completion_tokens_details": None,
    }


def usage_final_chunk(usage: Usage) -> dict[str, Any]:
    """As in the usage chunk that ends a stream (`include_usage`)."""
    return {**usage_counts(usage), "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}


def usage_counts(usage: Usage) -> dict[str, Any]:
    """As in every chunk with `continuous_usage_stats` (completions)."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "completion_tokens": usage.completion_tokens,
    }


@dataclass(frozen=True)
class ResponseHeader:
    """What every body and chunk of one response starts with."""

    id: str
    model: str
    created: int

    @classmethod
    def new(cls, prefix: str, model: str, request_id: str | None) -> ResponseHeader:
        return cls(f"{prefix}-{request_id or random_id()}", model, int(time.time()))


# ---------------------------------------------------------------------- completions


def completion_response(
    header: ResponseHeader, text: str, finish_reason: str, usage: Usage
) -> dict[str, Any]:
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "token_ids": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "routed_experts": None,
    }
    return {
        **_start(header, "text_completion"),
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage_full(usage),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


class CompletionChunks:
    """The chunks of a streamed completion."""

    object = "text_completion"

    def __init__(self, header: ResponseHeader) -> None:
        self.header = header

    def opening(self, usage: Usage | None) -> list[dict[str, Any]]:
        return []

    def delta(self, text: str, finish_reason: str | None, usage: Usage | None) -> dict[str, Any]:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "prompt_token_ids": None,
            "token_ids": None,
        }
        return self._with_usage({**_start(self.header, self.object), "choices": [choice]}, usage)

    def usage(self, usage: Usage) -> dict[str, Any]:
        return {
            **_start(self.header, self.object),
            "choices": [],
            "usage": usage_final_chunk(usage),
        }

    def _with_usage(self, chunk: dict[str, Any], usage: Usage | None) -> dict[str, Any]:
        if usage is not None:
            chunk["usage"] = usage_counts(usage)
        return chunk


# ---------------------------------------------------------------------- chat completions


def chat_response(
    header: ResponseHeader, role: str, text: str, finish_reason: str, usage: Usage
) -> dict[str, Any]:
    message = {
        "role": role,
        "content": text,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": None,
    }
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "token_ids": None,
        "routed_experts": None,
    }
    return {
        **_start(header, "chat.completion"),
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage_full(usage),
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


class ChatChunks(CompletionChunks):
    """The chunks of a streamed chat completion: vLLM opens with the role, once the first
    token is out."""

    object = "chat.completion.chunk"

    def __init__(self, header: ResponseHeader, role: str) -> None:
        super().__init__(header)
        self.role = role

    def opening(self, usage: Usage | None) -> list[dict[str, Any]]:
        choice = {
            "index": 0,
            "delta": {"role": self.role, "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        chunk = {**_start(self.header, self.object), "choices": [choice]}
        chunk = self._with_usage(chunk, usage)
        return [{**chunk, "prompt_token_ids": None, "prompt_text": None}]

    def delta(self, text: str, finish_reason: str | None, usage: Usage | None) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "delta": {"content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        if finish_reason is not None:
            choice["stop_reason"] = None
        choice["token_ids"] = None
        return self._with_usage({**_start(self.header, self.object), "choices": [choice]}, usage)

    def _with_usage(self, chunk: dict[str, Any], usage: Usage | None) -> dict[str, Any]:
        if usage is not None:  # chat's continuous usage also sets completion_tokens_details
            chunk["usage"] = {**usage_counts(usage), "completion_tokens_details": None}
        return chunk


def _start(header: ResponseHeader, object_name: str) -> dict[str, Any]:
    return {
        "id": header.id,
        "object": object_name,
        "created": header.created,
        "model": header.model,
    }


# ---------------------------------------------------------------------- models


def model_list(model: str, max_model_len: int, created: int) -> dict[str, Any]:
    permission = {
        "id": f"modelperm-{random_id()}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [permission],
    }
    return {"object": "list", "data": [card]}
