"""Fake `vllm.v1.request`, `vllm.sampling_params` and `vllm.pooling_params`: a request
and its parameters, with the attributes vLLM 0.32's scheduler and fairpool's plugin read."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class SamplingParams:
    max_tokens: int | None = 16
    extra_args: dict[str, Any] | None = None
    min_tokens: int = 0
    skip_reading_prefix_cache: bool | None = None


@dataclass
class PoolingParams:
    task: str | None = None
    dimensions: int | None = None
    skip_reading_prefix_cache: bool | None = None
    extra_kwargs: dict[str, Any] | None = None


class RequestStatus(enum.IntEnum):
    """vLLM's statuses, in vLLM's order: everything after PREEMPTED is finished."""

    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    WAITING_FOR_STREAMING_REQ = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()
    FINISHED_REPETITION = enum.auto()

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def get_finished_reason(status: RequestStatus) -> str | None:
        return _FINISH_REASONS.get(status)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.WAITING_FOR_STREAMING_REQ: "stop",
    RequestStatus.FINISHED_IGNORED: "length",
    RequestStatus.FINISHED_ERROR: "error",
    RequestStatus.FINISHED_REPETITION: "repetition",
}


class Request:
    """The engine's request: prompt and output tokens, computed tokens, status, and the
    chained hash of every full block (computed as tokens arrive, as vLLM does)."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int] | None,
        sampling_params: SamplingParams | None,
        pooling_params: PoolingParams | None,
        client_index: int = 0,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
        block_hasher: Callable[[Request], list[bytes]] | None = None,
    ) -> None:
        self.request_id = request_id
        self.client_index = client_index
        self.priority = priority
        self.sampling_params = sampling_params
        self.pooling_params = pooling_params
        self.arrival_time = arrival_time if arrival_time is not None else time.time()
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        if pooling_params is not None:
            self.max_tokens = 1
        elif sampling_params is not None:
            assert sampling_params.max_tokens is not None
            self.max_tokens = sampling_params.max_tokens
        else:
            raise ValueError("sampling_params and pooling_params can't both be unset")
        self.prompt_token_ids = prompt_token_ids
        self.num_prompt_tokens = len(prompt_token_ids or ())
        self._output_token_ids: list[int] = []
        self._all_token_ids = list(prompt_token_ids or ())
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.cache_salt = cache_salt
        self.block_hashes: list[bytes] = []
        self._block_hasher = block_hasher
        self.update_block_hashes()
        params = sampling_params if sampling_params is not None else pooling_params
        self.skip_reading_prefix_cache = bool(params and params.skip_reading_prefix_cache)

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        new = [token_ids] if isinstance(token_ids, int) else token_ids
        self._output_token_ids.extend(new)
        self._all_token_ids.extend(new)
        self.update_block_hashes()

    def update_block_hashes(self) -> None:
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    @property
    def output_token_ids(self) -> tuple[int, ...]:
        return tuple(self._output_token_ids)

    @property
    def all_token_ids(self) -> tuple[int, ...]:
        return tuple(self._all_token_ids)

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> str | None:
        return RequestStatus.get_finished_reason(self.status)

    def __lt__(self, other: Request) -> bool:
        return (self.priority, self.arrival_time, self.request_id) < (
            other.priority,
            other.arrival_time,
            other.request_id,
        )
