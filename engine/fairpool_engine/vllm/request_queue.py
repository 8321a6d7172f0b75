"""vLLM's waiting queue, ordered by a fairpool policy.

vLLM's scheduler admits from `self.waiting` with `peek_request()` then, once the
request's KV blocks are allocated, `pop_request()`; it stops at the first request that
does not fit (head of line). `PolicyRequestQueue` answers `peek_request()` with the
request the fairpool policy picks next and treats `pop_request()` as the admission:
the policy charges the prefill of the uncached tokens, with the prefix hit vLLM has just
looked up for that request (or the view's, where vLLM skips the lookup). Requests vLLM
gives back — skipped for the step, or preempted to be recomputed — return to the front
of their tenant's queue, already paid for, so nobody is charged twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from fairpool.sched.policy import LocalPolicy
from fairpool.sched.requests import Request as PolicyRequest
from fairpool_engine.vllm.compat import Request, RequestQueue, extra_args

if TYPE_CHECKING:
    from fairpool_engine.live import LiveScheduler
    from fairpool_engine.vllm.scheduler import FairSchedulingMixin


def policy_request(request: Request, live: LiveScheduler) -> PolicyRequest:
    """The scheduler's view of a vLLM request: its flow (tenant and band), prompt length,
    output limit."""
    return PolicyRequest(
        request.request_id,
        live.flow_of(extra_args(request)),
        request.num_prompt_tokens,
        max(int(request.max_tokens), 1),
        arrival=0.0,
    )


class PolicyRequestQueue(RequestQueue):
    def __init__(self, scheduler: FairSchedulingMixin) -> None:
        self._scheduler = scheduler
        self._live = scheduler.live
        self._requests: dict[str, Request] = {}  # waiting, by id
        self._head: Request | None = None
        self._vllm_hit: tuple[str, int] | None = None
        #: Prefix hit charged at each admission of this step, to check against vLLM's.
        self.charged_hits: dict[str, int] = {}

    @property
    def policy(self) -> LocalPolicy:
        return self._live.policy

    def new_step(self) -> None:
        """Forget the previous step's choice: service and the cache have changed."""
        self._head = None
        self._vllm_hit = None
        self.charged_hits.clear()

    # ------------------------------------------------------------ RequestQueue

    def add_request(self, request: Request) -> None:
        self.policy.add(self._scheduler.register(request))
        self._requests[request.request_id] = request
        self._head = None

    def peek_request(self) -> Request:
        head = self._select()
        if head is None:
            raise IndexError("peek from an empty queue")
        return head

    def note_vllm_hit(self, request_id: str, hit: int) -> None:
        """vLLM looked up `request_id`'s local prefix hit (before admitting it)."""
        self._vllm_hit = (request_id, hit)

    def pop_request(self) -> Request:
        request = self._head if self._head is not None else self.peek_request()
        request_id = request.request_id
        view = self._scheduler.view
        noted, self._vllm_hit = self._vllm_hit, None
        hit = noted[1] if noted is not None and noted[0] == request_id else None
        if hit is None:  # vLLM did not look it up (it has computed tokens already)
            hit = view.admission_hit(request)
        self._live.policy.admit(request_id, hit)
        self.charged_hits[request_id] = hit
        del self._requests[request_id]
        view.forget(request_id)
        self._head = None
        return request

    def prepend_request(self, request: Request) -> None:
        """Back to the front: a preempted request, or one vLLM skipped this step."""
        request_id = request.request_id
        if self.policy.is_running(request_id):
            self.policy.preempt(request_id)
            self._scheduler.preempted(request_id)
        else:
            self.policy.add(self._scheduler.register(request))
        self._requests[request_id] = request
        self._head = None

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        # Same order as vLLM's deque.extendleft: the last one given ends up first.
        for request in requests:
            self.prepend_request(request)

    def remove_request(self, request: Request) -> None:
        self.remove_requests((request,))

    def remove_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            if self._requests.pop(request.request_id, None) is not None:
                self.policy.remove(request.request_id)
                self._scheduler.view.forget(request.request_id)
        self._head = None

    def __bool__(self) -> bool:
        # A policy that may hold back (memory-safe admission, memory shared by weight)
        # may admit nothing now although requests wait; False then stops vLLM's admission
        # loop for this step. Other policies always pick one, so the choice waits until
        # vLLM peeks (it often stops first, at its running-request limit).
        if self.policy.may_hold_back:
            return self._select() is not None
        return bool(self._requests)

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self._requests.values()))

    # ------------------------------------------------------------ internals

    def _select(self) -> Request | None:
        if self._head is None and self._requests:
            view = self._scheduler.view
            view.follow_cache()
            chosen = self._live.policy.next_request(view)
            if chosen is not None:
                self._head = self._requests[chosen.request_id]
        return self._head
