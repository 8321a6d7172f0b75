"""Text in the simulated engine: a tokenizer, a chat template and deterministic output.

Tokenizer. A token is a chat marker such as `<|user|>`, a run of letters, digits and
underscores, or any other single non-space character; whitespace only separates tokens.
So `"Hello, world!"` is 4 tokens. A token's id is the CRC-32 of its UTF-8 bytes: equal
text gives equal ids on every run and every server, so requests that share a system
prompt share a token prefix and the prefix cache serves it.

Chat template. Each message becomes `<|role|>` newline content newline, and the
generation prompt `<|assistant|>` newline follows (unless `add_generation_prompt` is
false). A message's content is a string, or a list of text parts joined by newlines.

Output. Filler words ("lorem ipsum ..."), a period every twelfth token, picked from a
seed that the prompt and the server's `--seed` determine: the same prompt gets the same
answer. Token i's text is the same however a stream is split into chunks, and the
output, tokenized again, has exactly as many tokens as the usage reports.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Sequence

TOKEN = re.compile(r"<\|\w+\|>|\w+|[^\w\s]")

WORDS = (
    "lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed",
    "do", "eiusmod", "tempor", "incididunt", "ut", "labore", "et", "dolore", "magna",
    "aliqua", "enim", "ad", "minim", "veniam", "quis", "nostrud", "exercitation", "ullamco",
    "laboris", "nisi", "aliquip", "ex", "ea", "commodo", "consequat", "duis", "aute",
    "irure", "in", "reprehenderit", "voluptate", "velit", "esse", "cillum", "fugiat",
    "nulla", "pariatur", "excepteur", "sint", "occaecat", "cupidatat", "non", "proident",
    "sunt", "culpa", "qui", "officia", "deserunt", "mollit", "anim", "id", "est",
)  # fmt: skip
SENTENCE = 12  # every twelfth output token is a period


def tokenize(text: str) -> list[int]:
    return [zlib.crc32(token.encode()) for token in TOKEN.findall(text)]


def render_chat(messages: Iterable[tuple[str, str]], add_generation_prompt: bool = True) -> str:
    """The prompt for (role, content) messages."""
    parts = [f"<|{role}|>\n{content}\n" for role, content in messages]
    if add_generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)


def output_seed(prompt: Sequence[int], server_seed: int) -> int:
    """What picks a request's output words (and its EOS point): a function of the prompt's
    length, its last tokens and the server's seed."""
    return (server_seed * 1_000_003 + len(prompt) * 7_919 + sum(prompt[-8:])) % (1 << 31)


def filler(seed: int, start: int, stop: int) -> str:
    """The text of output tokens start..stop-1 of the output `seed` picks."""
    pieces = []
    for index in range(start, stop):
        if index % SENTENCE == SENTENCE - 1:
            pieces.append(".")
            continue
        word = WORDS[(seed + index * 7) % len(WORDS)]
        pieces.append(word if index == 0 else " " + word)
    return "".join(pieces)
