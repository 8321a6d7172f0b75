"""The simulated engine's pieces without a server: tokenizer, chat template, output text,
vLLM's output-length checks, options and the engine clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairpool.sched import make_policy
from fairpool.sched.errors import ConfigError
from fairpool.sim.engine import SimEngine
from fairpool_engine.live import LiveScheduler
from fairpool_engine.sim.metrics import EngineMetrics
from fairpool_engine.sim.options import SimOptions
from fairpool_engine.sim.protocol import RequestError, output_budget
from fairpool_engine.sim.runner import EngineRunner
from fairpool_engine.sim.text import filler, output_seed, render_chat, tokenize

pytestmark = pytest.mark.unit


def test_tokens_are_words_punctuation_and_chat_markers():
    assert len(tokenize("Hello, world!")) == 4
    assert len(tokenize("<|user|>\nHi")) == 2
    assert tokenize("same words") == tokenize("same   words")  # whitespace only separates
    assert tokenize("a b") != tokenize("b a")
    assert tokenize("") == []


def test_a_shared_system_prompt_gives_a_shared_token_prefix():
    system = ("system", "You answer questions about the attached report. " * 10)
    first = tokenize(render_chat([system, ("user", "Who wrote it?")]))
    second = tokenize(render_chat([system, ("user", "When?")]))
    shared = len(tokenize(render_chat([system], add_generation_prompt=False)))
    assert first[:shared] == second[:shared] and first[shared] == second[shared]
    assert first[shared + 2] != second[shared + 2]


def test_the_chat_template():
    text = render_chat([("system", "Be brief."), ("user", "Hi")])
    assert text == "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"
    assert not render_chat([("user", "Hi")], add_generation_prompt=False).endswith("assistant|>\n")


@given(st.integers(0, 2**31), st.integers(0, 60), st.integers(0, 60))
def test_output_text_is_deterministic_and_tokenizes_back_to_its_length(seed, split, more):
    whole = filler(seed, 0, split + more)
    assert filler(seed, 0, split) + filler(seed, split, split + more) == whole
    assert len(tokenize(whole)) == split + more


def test_the_output_depends_on_the_prompt_and_the_seed():
    prompt = tokenize("Tell me a story")
    assert output_seed(prompt, 0) == output_seed(list(prompt), 0)
    assert output_seed(prompt, 0) != output_seed(prompt, 1)
    assert output_seed(prompt, 0) != output_seed(tokenize("Tell me a joke"), 0)


def test_output_budget_follows_vllm():
    assert output_budget(100, 10, None, "max_tokens", 0) == 90  # default: the rest
    assert output_budget(100, 10, 95, "max_tokens", 0) == 90  # capped by the context
    assert output_budget(100, 10, 5, "max_tokens", 0) == 5
    with pytest.raises(RequestError) as error:
        output_budget(100, 100, 5, "max_tokens", 0)
    assert (
        str(error.value) == "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"
    )
    with pytest.raises(RequestError) as error:
        output_budget(100, 101, 200, "max_completion_tokens", 0)
    assert error.value.parameter == "max_completion_tokens"  # checked before the prompt
    with pytest.raises(RequestError, match="min_tokens must be less than or equal"):
        output_budget(100, 10, 5, "max_tokens", 6)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"port": 70000}, "--port"),
        ({"max_model_len": 0}, "--max-model-len"),
        ({"memory_tokens": 1000}, "--max-model-len"),  # 8192 do not fit
        ({"eos_after": (5, 2)}, "--eos-after"),
        ({"crash_rate": -0.1}, "--crash-rate"),
        ({"model": ""}, "--model"),
    ],
)
def test_bad_options_name_the_option(options, named):
    with pytest.raises(ConfigError) as error:
        SimOptions(**options)
    assert error.value.parameter == named


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_engine_clock_follows_wall_time_times_speedup_within_its_lag():
    clock = FakeClock()
    engine = SimEngine(make_policy("fcfs"))
    metrics = EngineMetrics("sim")
    runner = EngineRunner(engine, LiveScheduler(), metrics, speedup=10, clock=clock, max_lag=0.1)
    clock.now += 2
    assert runner.now() == pytest.approx(20 - 10 * 0.1)  # at most 0.1 wall s behind
    engine.now = 19.5  # behind wall time, within the lag: keeps its own cadence
    assert runner.now() == 19.5
    engine.now = 25.0  # a step ran ahead of the wall clock
    assert runner.now() == 25.0
