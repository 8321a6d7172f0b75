"""The OpenAI Responses API (`POST /v1/responses`) as vLLM 0.32 serves it: response
objects and the server-sent events of a streamed one, key for key.

vLLM serializes the response object whole (`model_dump`), nulls included. A stream is
`event: TYPE` / `data: JSON` pairs, numbered by `sequence_number` from 0, without a
`[DONE]`: `response.created` and `response.in_progress` at once; with the first text,
`response.output_item.added` (an assistant message, in progress) and
`response.content_part.added`; one `response.output_text.delta` per batch of tokens;
then `response.output_text.done`, `response.content_part.done`,
`response.output_item.done`, and `response.completed` with the whole response and its
usage. A response that ran to its token limit has status `incomplete`
(`incomplete_details.reason` `max_output_tokens`), else `completed`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fairpool.front import Usage
from fairpool_engine.sim.bodies import random_id
from fairpool_engine.sim.protocol import ResponsesRequest


def usage_body(usage: Usage) -> dict[str, Any]:
    """vLLM's `ResponseUsage` (one turn: the per-turn lists stay empty)."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def text_part(text: str, logprobs: list[Any] | None) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    """An assistant message; vLLM leaves out the text part when there is no text."""
    content = [text_part(text, None)] if text else []
    if status == "in_progress":
        content = []
    return {
        "id": item_id,
        "content": content,
        "role": "assistant",
        "status": status,
        "type": "message",
        "phase": None,
    }


@dataclass(frozen=True)
class ResponseHead:
    """What a response object takes from its request (vLLM's `from_request`)."""

    request: ResponsesRequest
    model: str
    created_at: int
    max_output_tokens: int

    def body(
        self, status: str, output: list[dict[str, Any]], usage: Usage | None
    ) -> dict[str, Any]:
        request = self.request
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": request.request_id,
            "created_at": self.created_at,
            "incomplete_details": incomplete,
            "instructions": request.instructions,
            "metadata": request.metadata,
            "model": self.model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": (
                True if request.parallel_tool_calls is None else request.parallel_tool_calls
            ),
            "temperature": 1.0 if request.temperature is None else request.temperature,
            "tool_choice": request.tool_choice,
            "tools": request.tools,
            "top_p": 1.0 if request.top_p is None else request.top_p,
            "background": bool(request.background),
            "max_output_tokens": self.max_output_tokens,
            "max_tool_calls": request.max_tool_calls,
            "previous_response_id": request.previous_response_id,
            "prompt": None,
            "reasoning": request.reasoning,
            "service_tier": request.service_tier,
            "status": status,
            "text": request.text,
            "top_logprobs": None,
            "truncation": request.truncation,
            "usage": None if usage is None else usage_body(usage),
            "user": request.user,
            "presence_penalty": request.presence_penalty or 0.0,
            "frequency_penalty": request.frequency_penalty or 0.0,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "input_messages": None,
            "output_messages": None,
        }


def status_of(finish_reason: str) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def response_body(
    head: ResponseHead, text: str, finish_reason: str, usage: Usage
) -> dict[str, Any]:
    """A whole (not streamed) response."""
    item = message_item(f"msg_{random_id()}", text, "completed")
    return head.body(status_of(finish_reason), [item], usage)


def event(document: dict[str, Any]) -> bytes:
    data = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
    return f"event: {document['type']}\ndata: {data}\n\n".encode()


class ResponseEvents:
    """The events of one streamed response, numbered as they are made."""

    def __init__(self, head: ResponseHead) -> None:
        self.head = head
        self.item_id = f"msg_{random_id()}"
        self.text = ""
        self.opened = False
        self._sequence = 0

    def _event(self, kind: str, **fields: Any) -> bytes:
        fields.update(sequence_number=self._sequence, type=kind)
        document = {key: fields[key] for key in sorted(fields)}  # vLLM's (the SDK's) order
        self._sequence += 1
        return event(document)

    def start(self) -> list[bytes]:
        response = self.head.body("in_progress", [], None)
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def delta(self, text: str) -> list[bytes]:
        """New text; nothing for none (vLLM skips empty deltas)."""
        if not text:
            return []
        events = []
        if not self.opened:
            self.opened = True
            events += [
                self._event(
                    "response.output_item.added",
                    item=message_item(self.item_id, "", "in_progress"),
                    output_index=0,
                ),
                self._event(
                    "response.content_part.added",
                    content_index=0,
                    item_id=self.item_id,
                    output_index=0,
                    part=text_part("", []),
                ),
            ]
        self.text += text
        events.append(
            self._event(
                "response.output_text.delta",
                content_index=0,
                delta=text,
                item_id=self.item_id,
                logprobs=[],
                output_index=0,
            )
        )
        return events

    def finish(self, finish_reason: str, usage: Usage) -> list[bytes]:
        events = []
        output = []
        if self.opened:
            item = message_item(self.item_id, self.text, "completed")
            output.append(item)
            events += [
                self._event(
                    "response.output_text.done",
                    content_index=0,
                    item_id=self.item_id,
                    logprobs=[],
                    output_index=0,
                    text=self.text,
                ),
                self._event(
                    "response.content_part.done",
                    content_index=0,
                    item_id=self.item_id,
                    output_index=0,
                    part=text_part(self.text, None),
                ),
                self._event("response.output_item.done", item=item, output_index=0),
            ]
        response = self.head.body(status_of(finish_reason), output, usage)
        events.append(self._event("response.completed", response=response))
        return events
