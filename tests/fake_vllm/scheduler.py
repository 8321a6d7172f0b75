"""Fake `vllm.v1.core.sched.{request_queue, output, scheduler, async_scheduler}`,
`vllm.v1.outputs` and `vllm.v1.engine`: vLLM 0.32's scheduling step, reduced to what
decides the order of admissions, the prefix hits, preemption and finishing.

`Scheduler.schedule` follows vLLM's: running requests first (one decode token each, or
the next prefill chunk) within the token budget, preempting the most recently admitted
running request (`self.running[-1]`, back to `self.waiting.prepend_request`) when KV
blocks run out; then, only if nothing was preempted, waiting requests — the
`kv_holding_waiting` queue before `waiting` — each with `peek_request`, a blocked one
popped and set aside (given back with `prepend_requests` at the end of the step), a
prefix-cache lookup through `_get_local_prefix_cache_hit`, `allocate_slots`, and
`pop_request` once it fits; the first that does not fit ends the scan.
"""

from __future__ import annotations

import enum
import time
from abc import ABC, abstractmethod
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fake_vllm.kv_cache import KVCacheManager, UnitaryKVCacheCoordinator
from fake_vllm.request import Request, RequestStatus

# ---------------------------------------------------------------------- configuration


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 256
    policy: str = "fcfs"
    async_scheduling: bool = False


@dataclass
class CacheConfig:
    block_size: int = 16
    num_gpu_blocks: int = 64
    enable_prefix_caching: bool = True


@dataclass
class ModelConfig:
    max_model_len: int = 1024
    runner_type: str = "generate"


@dataclass
class VllmConfig:
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    model_config: ModelConfig = field(default_factory=ModelConfig)
    #: Not vLLM's: the fake's stand-in for vLLM's choice of KV-cache coordinator.
    kv_cache_coordinator: type = UnitaryKVCacheCoordinator


# ---------------------------------------------------------------------- queues


class SchedulingPolicy(enum.Enum):
    FCFS = "fcfs"
    PRIORITY = "priority"


class RequestQueue(ABC):
    @abstractmethod
    def add_request(self, request: Request) -> None: ...

    @abstractmethod
    def pop_request(self) -> Request: ...

    @abstractmethod
    def peek_request(self) -> Request: ...

    @abstractmethod
    def prepend_request(self, request: Request) -> None: ...

    @abstractmethod
    def prepend_requests(self, requests: Iterable[Request]) -> None: ...

    @abstractmethod
    def remove_request(self, request: Request) -> None: ...

    @abstractmethod
    def remove_requests(self, requests: Iterable[Request]) -> None: ...

    @abstractmethod
    def __bool__(self) -> bool: ...

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __iter__(self) -> Iterator[Request]: ...


class FCFSRequestQueue(deque[Request], RequestQueue):  # type: ignore[misc]
    def add_request(self, request: Request) -> None:
        self.append(request)

    def pop_request(self) -> Request:
        return self.popleft()

    def peek_request(self) -> Request:
        if not self:
            raise IndexError("peek from an empty queue")
        return self[0]

    def prepend_request(self, request: Request) -> None:
        self.appendleft(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        self.extendleft(requests)

    def remove_request(self, request: Request) -> None:
        self.remove(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        gone = set(requests)
        kept = [request for request in self if request not in gone]
        self.clear()
        self.extend(kept)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __len__(self) -> int:
        return super().__len__()

    def __iter__(self) -> Iterator[Request]:
        return super().__iter__()


def create_request_queue(policy: SchedulingPolicy) -> RequestQueue:
    if policy != SchedulingPolicy.FCFS:
        raise NotImplementedError("the fake models the FCFS queue only")
    return FCFSRequestQueue()


# ---------------------------------------------------------------------- step records


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int] | None
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    """Running requests scheduled again, and preempted ones resumed (reduced to ids)."""

    req_ids: list[str]
    resumed_req_ids: set[str]


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    finished_req_ids: set[str]
    preempted_req_ids: set[str] | None = None


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]] = field(default_factory=list)
    pooler_output: list[Any | None] | None = None


@dataclass
class EngineCoreOutput:
    request_id: str
    new_token_ids: list[int]
    pooling_output: Any | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class EngineCoreOutputs:
    outputs: list[EngineCoreOutput] = field(default_factory=list)


# ---------------------------------------------------------------------- the scheduler

_BLOCKED = (
    RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR,
    RequestStatus.WAITING_FOR_REMOTE_KVS,
    RequestStatus.WAITING_FOR_STREAMING_REQ,
)


class Scheduler:
    def __init__(
        self,
        vllm_config: VllmConfig,
        kv_cache_config: Any,
        structured_output_manager: Any,
        block_size: int,
        hash_block_size: int | None = None,
        mm_registry: Any = None,
        include_finished_set: bool = False,
        log_stats: bool = False,
    ) -> None:
        self.vllm_config = vllm_config
        self.scheduler_config = vllm_config.scheduler_config
        self.cache_config = vllm_config.cache_config
        self.max_num_running_reqs = self.scheduler_config.max_num_seqs
        self.max_num_scheduled_tokens = self.scheduler_config.max_num_batched_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        pooling = vllm_config.model_config.runner_type == "pooling"
        self.num_sampled_tokens_per_step = 0 if pooling else 1
        self.block_size = block_size
        self.requests: dict[str, Request] = {}
        self.policy = SchedulingPolicy(self.scheduler_config.policy)
        self.waiting = create_request_queue(self.policy)
        self.kv_holding_waiting = create_request_queue(self.policy)
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()
        self.reset_preempted_req_ids: set[str] = set()
        self.connector = None
        self.kv_cache_manager = KVCacheManager(
            self.cache_config.num_gpu_blocks,
            block_size,
            self.max_model_len,
            enable_caching=self.cache_config.enable_prefix_caching,
            coordinator_cls=vllm_config.kv_cache_coordinator,
        )
        #: Not vLLM's attributes: counts for tests.
        self.num_preemptions = 0

    # ------------------------------------------------------------ requests in and out

    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        if request.num_computed_tokens > 0:
            self.kv_holding_waiting.add_request(request)
        else:
            self.waiting.add_request(request)

    def finish_requests(
        self, request_ids: str | Iterable[str] | None, finished_status: RequestStatus
    ) -> list[Request]:
        assert RequestStatus.is_finished(finished_status)
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        elif request_ids is None:
            request_ids = list(self.requests)
        found = [
            request
            for request_id in request_ids
            if (request := self.requests.get(request_id)) is not None and not request.is_finished()
        ]
        running = {request for request in found if request.status == RequestStatus.RUNNING}
        waiting = [request for request in found if request not in running]
        self.running = [request for request in self.running if request not in running]
        if waiting:
            self.waiting.remove_requests(waiting)
            self.kv_holding_waiting.remove_requests(waiting)
        for request in found:
            request.status = finished_status
            self._free_request(request)
        return found

    def _free_request(
        self, request: Request, delay_free_blocks: bool = False
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        assert request.is_finished()
        self.finished_req_ids.add(request.request_id)
        if not delay_free_blocks:
            self.kv_cache_manager.free(request)
            del self.requests[request.request_id]
        return None, None

    def get_request_counts(self) -> tuple[int, int]:
        return len(self.running), len(self.waiting) + len(self.kv_holding_waiting)

    def has_unfinished_requests(self) -> bool:
        return sum(self.get_request_counts()) > 0

    def reset_prefix_cache(
        self, reset_running_requests: bool = False, reset_connector: bool = False
    ) -> bool:
        if reset_running_requests:
            while self.running:
                self._preempt_request(self.running.pop(), time.monotonic())
        return self.kv_cache_manager.reset_prefix_cache()

    # ------------------------------------------------------------ one step

    def _get_local_prefix_cache_hit(self, request: Request) -> tuple[Any, int, int, bool]:
        blocks, hit, boundary = self.kv_cache_manager.get_computed_blocks(request)
        return blocks, hit, boundary, False

    def _preempt_request(
        self, request: Request, timestamp: float, drop_stale_output: bool = False
    ) -> None:
        assert request.status == RequestStatus.RUNNING
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend_request(request)
        self.reset_preempted_req_ids.add(request.request_id)

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        budget = self.max_num_scheduled_tokens
        num_scheduled: dict[str, int] = {}
        new_requests: list[Request] = []
        cached_requests: list[str] = []
        resumed: set[str] = set()
        preempted: list[Request] = []
        now = time.monotonic()
        self.kv_cache_manager.new_step_starts()

        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            tokens = min(
                request.num_tokens - request.num_computed_tokens,
                budget,
                self.max_model_len - request.num_computed_tokens - self.num_sampled_tokens_per_step,
            )
            if tokens <= 0:
                index += 1
                continue
            while True:
                if self.kv_cache_manager.allocate_slots(request, tokens) is not None:
                    break
                victim = self.running.pop()
                self._preempt_request(victim, now)
                preempted.append(victim)
                if victim is request:
                    break
            if request.status != RequestStatus.RUNNING:
                break
            num_scheduled[request.request_id] = tokens
            cached_requests.append(request.request_id)
            budget -= tokens
            index += 1

        if not preempted:
            skipped: deque[Request] = deque()
            skipped_holding: deque[Request] = deque()
            while budget > 0:
                queue = self.kv_holding_waiting or self.waiting
                if not queue or len(self.running) >= self.max_num_running_reqs:
                    break
                request = queue.peek_request()
                if request.status in _BLOCKED:
                    holds_blocks = request.num_computed_tokens > 0
                    (skipped_holding if holds_blocks else skipped).appendleft(queue.pop_request())
                    continue
                computed = self.kv_cache_manager.empty_kv_cache_blocks
                hit = 0
                if request.num_computed_tokens == 0:
                    computed, hit, _, _ = self._get_local_prefix_cache_hit(request)
                    start = hit
                else:
                    start = request.num_computed_tokens
                tokens = min(request.num_tokens - start, budget)
                blocks = self.kv_cache_manager.allocate_slots(
                    request, tokens, num_new_computed_tokens=hit, new_computed_blocks=computed
                )
                if blocks is None:
                    break
                self.kv_cache_manager.record_prefix_cache_stats(request, hit)
                request = queue.pop_request()
                self.running.append(request)
                if request.status == RequestStatus.WAITING:
                    new_requests.append(request)
                else:
                    cached_requests.append(request.request_id)
                    resumed.add(request.request_id)
                request.status = RequestStatus.RUNNING
                request.num_computed_tokens = start
                num_scheduled[request.request_id] = tokens
                budget -= tokens
            if skipped_holding:
                self.kv_holding_waiting.prepend_requests(skipped_holding)
            if skipped:
                self.waiting.prepend_requests(skipped)

        output = SchedulerOutput(
            scheduled_new_reqs=[
                NewRequestData(
                    request.request_id,
                    request.prompt_token_ids,
                    self.kv_cache_manager.get_blocks(request.request_id).get_block_ids(),
                    request.num_computed_tokens,
                )
                for request in new_requests
            ],
            scheduled_cached_reqs=CachedRequestData(cached_requests, resumed),
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            finished_req_ids=self.finished_req_ids,
            preempted_req_ids=self.reset_preempted_req_ids,
        )
        for request_id, tokens in num_scheduled.items():
            self.requests[request_id].num_computed_tokens += tokens
        self.finished_req_ids = set()
        self.reset_preempted_req_ids = set()
        return output

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]:
        outputs: dict[int, list[EngineCoreOutput]] = defaultdict(list)
        stopped: set[Request] = set()
        for request_id in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(request_id)
            if request is None or request.is_finished():
                continue  # aborted while the step ran
            index = model_runner_output.req_id_to_index[request_id]
            sampled = model_runner_output.sampled_token_ids
            new_tokens = list(sampled[index]) if sampled else []
            pooled = model_runner_output.pooler_output
            pooler_output = pooled[index] if pooled else None
            done = False
            if new_tokens:
                for count, token in enumerate(new_tokens, 1):
                    request.append_output_token_ids(token)
                    if request.num_output_tokens >= request.max_tokens or (
                        request.num_tokens >= self.max_model_len
                    ):
                        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
                        del new_tokens[count:]
                        done = True
                        break
            elif request.pooling_params is not None and pooler_output is not None:
                request.status = RequestStatus.FINISHED_STOPPED
                done = True
            finish_reason = request.get_finished_reason() if done else None
            if done:
                self._free_request(request)
                stopped.add(request)
            if new_tokens or pooler_output is not None or done:
                outputs[request.client_index].append(
                    EngineCoreOutput(
                        request_id=request_id,
                        new_token_ids=new_tokens,
                        pooling_output=pooler_output,
                        finish_reason=finish_reason,
                    )
                )
        if stopped:
            self.running = [request for request in self.running if request not in stopped]
        return {client: EngineCoreOutputs(outs) for client, outs in outputs.items()}


class AsyncScheduler(Scheduler):
    """vLLM's async scheduler overlaps a step's scheduling with the previous step's
    execution (output placeholders); the fake only keeps the class, for the plugin's
    choice of base."""
