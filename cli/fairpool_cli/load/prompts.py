"""The prompts a load run sends, shape by shape, and the request bodies that carry them.

Text is plain words from a fixed vocabulary drawn from seeded streams, so the same
`--seed` gives the same text on every run. The simulated engine counts each word as one
token (real tokenizers count about 1.3). Shared text is identical text, so an engine's
prefix cache serves it:

- `shared-prefix`: each tenant has one long system prompt; each request adds a short
  unique question.
- `documents`: each tenant has a few long documents; each request asks about one.
- `multi-turn`: conversations open with a long message and grow by a short question and
  the answer received at each turn; each turn sends the whole history.
- `random`: nothing shared.
- a trace: each segment name always gives the same words (a shorter use is a prefix of a
  longer one); unnamed segments are unique.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fairpool.api.scheduler_config import TENANT_XARG
from fairpool.sim.trace import Segment, TraceRequest
from fairpool_cli.load.spec import LoadSpec, PromptShape, TenantSpec

VOCABULARY = (
    "time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child",
    "world", "school", "state", "family", "student", "group", "country", "problem", "hand",
    "part", "place", "case", "week", "company", "system", "program", "question", "work",
    "government", "number", "night", "point", "home", "water", "room", "mother", "area",
    "money", "story", "fact", "month", "lot", "right", "study", "book", "eye", "job",
    "word", "business", "issue", "side", "kind", "head", "house", "service", "friend",
    "father", "power", "hour", "game", "line", "end", "member", "law", "car", "city",
    "community", "name", "president", "team", "minute", "idea", "kid", "body", "information",
    "back", "parent", "face", "others", "level", "office", "door", "health", "person", "art",
    "war", "history", "party", "result", "change", "morning", "reason", "research", "girl",
    "guy", "moment", "air", "teacher", "force", "education", "river", "garden", "market",
    "engine", "window", "paper", "music", "table", "signal", "field", "light", "voice",
    "energy", "model", "picture", "season", "road", "bridge", "island", "forest", "letter",
    "plant", "stone", "cloud", "ship", "train", "color", "summer", "winter",
)  # fmt: skip

Message = tuple[str, str]  # (role, content)


def words(stream: random.Random, count: int) -> str:
    """`count` words drawn from `stream`."""
    return " ".join(stream.choices(VOCABULARY, k=count))


@dataclass
class Conversation:
    """A multi-turn chat: its history so far and the turns sent."""

    messages: list[Message]
    turns: int = 1


@dataclass
class Prompt:
    messages: list[Message]
    max_tokens: int
    conversation: Conversation | None = field(default=None, repr=False)


class PromptSource:
    """A tenant's prompts, one per `next()`; `finished` hears how each one went."""

    def __init__(self, tenant: str, shape: PromptShape, seed: int) -> None:
        self.shape = shape
        self._stream_name = f"{seed}:{tenant}"
        self.questions = self.stream("questions")

    def stream(self, purpose: str) -> random.Random:
        """A random stream of this tenant and seed (str seeds hash the same on every run)."""
        return random.Random(f"{self._stream_name}:{purpose}")

    def next(self) -> Prompt:
        raise NotImplementedError

    def question(self) -> str:
        return words(self.questions, self.shape.question_tokens)

    def finished(self, prompt: Prompt, answer: str | None) -> None:
        """The answer's text, or None when the request failed or was cancelled."""


class RandomPrompts(PromptSource):
    def next(self) -> Prompt:
        text = words(self.questions, self.shape.prompt_tokens)
        return Prompt([("user", text)], self.shape.output_tokens)


class SharedPrefixPrompts(PromptSource):
    def __init__(self, tenant: str, shape: PromptShape, seed: int) -> None:
        super().__init__(tenant, shape, seed)
        self.system = words(self.stream("system"), shape.prompt_tokens)

    def next(self) -> Prompt:
        return Prompt(
            [("system", self.system), ("user", self.question())], self.shape.output_tokens
        )


class DocumentPrompts(PromptSource):
    def __init__(self, tenant: str, shape: PromptShape, seed: int) -> None:
        super().__init__(tenant, shape, seed)
        self.documents = [
            words(self.stream(f"document-{index}"), shape.prompt_tokens)
            for index in range(shape.documents)
        ]
        self.picks = self.stream("picks")

    def next(self) -> Prompt:
        index = self.picks.randrange(len(self.documents))
        text = f"Document {index}:\n{self.documents[index]}\n\nQuestion: {self.question()}"
        return Prompt([("user", text)], self.shape.output_tokens)


class MultiTurnPrompts(PromptSource):
    """Conversations of up to `shape.turns` turns. A request continues an idle conversation
    (one whose last answer is in) or opens a new one; a failed turn ends its conversation."""

    def __init__(self, tenant: str, shape: PromptShape, seed: int) -> None:
        super().__init__(tenant, shape, seed)
        self.openings = self.stream("openings")
        self.idle: deque[Conversation] = deque()

    def next(self) -> Prompt:
        conversation = self.idle.popleft() if self.idle else self._open()
        return Prompt(list(conversation.messages), self.shape.output_tokens, conversation)

    def _open(self) -> Conversation:
        return Conversation([("user", words(self.openings, self.shape.prompt_tokens))])

    def finished(self, prompt: Prompt, answer: str | None) -> None:
        conversation = prompt.conversation
        if conversation is None or answer is None or conversation.turns >= self.shape.turns:
            return
        conversation.messages += [("assistant", answer), ("user", self.question())]
        conversation.turns += 1
        self.idle.append(conversation)


SOURCES: dict[str, type[PromptSource]] = {
    "shared-prefix": SharedPrefixPrompts,
    "documents": DocumentPrompts,
    "multi-turn": MultiTurnPrompts,
    "random": RandomPrompts,
}


def prompt_source(spec: LoadSpec, tenant: TenantSpec) -> PromptSource:
    """The tenant's prompts: the run's shape, with the tenant's own sizes where given."""
    shape = PromptShape(
        spec.shape.name,
        tenant.prompt_tokens or spec.shape.prompt_tokens,
        spec.shape.question_tokens,
        tenant.output_tokens or spec.shape.output_tokens,
        spec.shape.documents,
        spec.shape.turns,
    )
    return SOURCES[shape.name](tenant.name, shape, spec.seed)


class TraceText:
    """Words for a trace's segments: a name always gives the same words."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.named: dict[str, tuple[random.Random, list[str]]] = {}
        self.unique = random.Random(f"{seed}:unnamed")

    def prompt(self, request: TraceRequest) -> Prompt:
        return Prompt([("user", self.text(request.segments))], request.output_tokens)

    def text(self, segments: Iterable[Segment]) -> str:
        return " ".join(self.segment(name, length) for name, length in segments)

    def segment(self, name: str | None, length: int) -> str:
        if name is None:
            return words(self.unique, length)
        stream, made = self.named.setdefault(name, (random.Random(f"{self.seed}:{name}"), []))
        if len(made) < length:
            made.extend(stream.choices(VOCABULARY, k=length - len(made)))
        return " ".join(made[:length])


def completion_text(messages: list[Message]) -> str:
    """A chat as one completions prompt: a lone user message as it is, else
    `Role: content` paragraphs ending with `Assistant:`."""
    if len(messages) == 1 and messages[0][0] == "user":
        return messages[0][1]
    turns = [f"{role.capitalize()}: {content}" for role, content in messages]
    return "\n\n".join([*turns, "Assistant:"])


def request_body(spec: LoadSpec, model: str, tenant: str, prompt: Prompt) -> dict[str, Any]:
    """An OpenAI request of the run's API: chat and completions stream and ask for the
    usage chunk, a response streams (its usage comes in `response.completed`), embeddings
    come whole. vLLM's `ignore_eos` and the engines' tenant tag only when the run asks
    for them."""
    body: dict[str, Any] = {"model": model}
    messages = [{"role": role, "content": text} for role, text in prompt.messages]
    if spec.api == "chat":
        body["messages"] = messages
    elif spec.api == "responses":
        body["input"] = messages
    else:
        body["input" if spec.api == "embeddings" else "prompt"] = completion_text(prompt.messages)
    if spec.api in ("chat", "completions"):
        body |= {
            "max_tokens": prompt.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    elif spec.api == "responses":
        body |= {"max_output_tokens": prompt.max_tokens, "stream": True}
    if spec.ignore_eos and spec.api != "embeddings":
        body["ignore_eos"] = True
    if spec.tag_tenants:
        body["vllm_xargs"] = {TENANT_XARG: tenant}
    return body
