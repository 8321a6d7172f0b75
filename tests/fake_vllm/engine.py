"""EngineCore's loop around fairpool's plugin, over the fake scheduler: requests in,
steps (schedule → model runner → update_from_output), aborts, and what came out."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from fairpool_engine.tenant_metrics import TenantMetrics
from fake_vllm import Plugin
from fake_vllm.kv_cache import UnitaryKVCacheCoordinator, get_request_block_hasher, sha256
from fake_vllm.request import PoolingParams, Request, RequestStatus, SamplingParams
from fake_vllm.scheduler import (
    CacheConfig,
    ModelConfig,
    ModelRunnerOutput,
    SchedulerConfig,
    SchedulerOutput,
    VllmConfig,
)

FIRST_OUTPUT_TOKEN = 900_000  # made-up sampled tokens: 900000, 900001, … per request


class FakeEngine:
    def __init__(
        self,
        plugin: Plugin,
        *,
        block_size: int = 16,
        num_gpu_blocks: int = 64,
        max_num_seqs: int = 4,
        max_num_batched_tokens: int = 256,
        max_model_len: int = 1024,
        async_scheduling: bool = False,
        runner_type: str = "generate",
        kv_cache_coordinator: type = UnitaryKVCacheCoordinator,
        tokens_per_step: int = 1,
    ) -> None:
        config = VllmConfig(
            SchedulerConfig(max_num_seqs, max_num_batched_tokens, "fcfs", async_scheduling),
            CacheConfig(block_size, num_gpu_blocks),
            ModelConfig(max_model_len, runner_type),
            kv_cache_coordinator,
        )
        # Each vLLM engine is a process of its own, with its own metrics.
        self.registry = CollectorRegistry()
        plugin.scheduler.TenantMetrics = functools.partial(TenantMetrics, self.registry)
        # As EngineCore constructs the class `--scheduler-cls` names.
        self.scheduler: Any = plugin.scheduler.FairScheduler(
            vllm_config=config,
            kv_cache_config=None,
            structured_output_manager=None,
            include_finished_set=False,
            log_stats=False,
            block_size=block_size,
            hash_block_size=block_size,
        )
        self.block_hasher = get_request_block_hasher(block_size, sha256)
        #: Tokens the model runner samples for a request in one step (more than one: as
        #: speculative decoding's accepted drafts arrive).
        self.tokens_per_step = tokens_per_step
        self.tenants: dict[str, str | None] = {}
        self.prompts: dict[str, int] = {}
        #: Request ids as vLLM admitted them for the first time (`scheduled_new_reqs`),
        #: with the prefix hit vLLM found.
        self.admissions: list[tuple[str, int]] = []
        #: Requests as vLLM moved them from waiting to running, in order: admitted, and
        #: again each time it resumed one it had preempted.
        self.started: list[str] = []
        self.outputs: dict[str, list[int]] = {}
        self.finish_reasons: dict[str, str] = {}
        self.steps = 0
        self._ids = itertools.count()

    # ------------------------------------------------------------ requests

    def add(
        self,
        tenant: str | None,
        prompt: Sequence[int],
        max_tokens: int = 4,
        *,
        pooling: bool = False,
        cache_salt: str | None = None,
        status: RequestStatus | None = None,
        request_id: str | None = None,
        band: str | None = None,
    ) -> str:
        """Queue a request of `tenant` (its `vllm_xargs.fairpool_tenant`; None: none),
        asking `band` (`vllm_xargs.fairpool_band`) if given."""
        request_id = request_id or f"r{next(self._ids)}"
        xargs = None if tenant is None else {"fairpool_tenant": tenant}
        if band is not None:
            xargs = {**(xargs or {}), "fairpool_band": band}
        request = Request(
            request_id,
            list(prompt),
            None if pooling else SamplingParams(max_tokens=max_tokens, extra_args=xargs),
            PoolingParams(task="embed") if pooling else None,
            cache_salt=cache_salt,
            block_hasher=self.block_hasher,
        )
        if status is not None:
            request.status = status
        self.tenants[request_id] = tenant
        self.prompts[request_id] = len(prompt)
        self.outputs[request_id] = []
        self.scheduler.add_request(request)
        return request_id

    def abort(self, *request_ids: str) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def request(self, request_id: str) -> Request:
        found: Request = self.scheduler.requests[request_id]
        return found

    # ------------------------------------------------------------ running

    def step(self) -> SchedulerOutput:
        """One engine step: schedule, run the model, hand its output back."""
        self.steps += 1
        running = {id(request) for request in self.scheduler.running}
        output: SchedulerOutput = self.scheduler.schedule()
        self.started += [r.request_id for r in self.scheduler.running if id(r) not in running]
        self.admissions += [
            (new.req_id, new.num_computed_tokens) for new in output.scheduled_new_reqs
        ]
        self.record(self.scheduler.update_from_output(output, self._run_model(output)))
        return output

    def run(self, max_steps: int = 10_000) -> int:
        """Step until every request has finished; the number of steps taken."""
        for taken in range(max_steps):
            if not self.scheduler.has_unfinished_requests():
                return taken
            self.step()
        raise AssertionError(f"requests still unfinished after {max_steps} steps")

    def _run_model(self, output: SchedulerOutput) -> ModelRunnerOutput:
        """`tokens_per_step` tokens for each request whose scheduled tokens reach its end
        (a partial prefill chunk samples nothing), or a pooler output for a pooling one."""
        ids = list(output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        pooled: list[Any | None] = []
        for request_id in ids:
            request = self.scheduler.requests.get(request_id)
            complete = request is not None and request.num_computed_tokens >= request.num_tokens
            pooling = request is not None and request.pooling_params is not None
            first = FIRST_OUTPUT_TOKEN + (request.num_output_tokens if request else 0)
            tokens = list(range(first, first + self.tokens_per_step))
            sampled.append(tokens if complete and not pooling else [])
            pooled.append([0.0] if complete and pooling else None)
        index = {request_id: position for position, request_id in enumerate(ids)}
        return ModelRunnerOutput(ids, index, sampled, pooled)

    def record(self, engine_outputs: dict[int, Any]) -> None:
        for outputs in engine_outputs.values():
            for output in outputs.outputs:
                self.outputs[output.request_id] += output.new_token_ids
                if output.finish_reason is not None:
                    self.finish_reasons[output.request_id] = output.finish_reason

    # ------------------------------------------------------------ the plugin's state

    @property
    def policy(self) -> Any:
        return self.scheduler.live.policy

    def served(self, tenant: str) -> float:
        return float(self.policy.served.get(tenant, 0.0))
