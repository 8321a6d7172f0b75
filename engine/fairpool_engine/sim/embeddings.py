"""Embeddings (`POST /v1/embeddings`) as vLLM 0.32 serves them for a pooling model.

A vector is a function of the prompt's token ids and the server's `--seed`: Gaussian
components from a generator seeded by them, normalized to length 1 (vLLM's embedding
models normalize by default), of the fixed dimension `--embedding-dim`, rounded to
float32 as vLLM's tensors are. So equal texts get equal vectors on every server, and
`base64` (packed float32, or float16/bfloat16 with `embed_dtype`) decodes to exactly the
`float` list.

The body is vLLM's `EmbeddingResponse`: id `embd-…`, `object` "list", one
`{"index", "object": "embedding", "embedding"}` per input in order, and usage with the
prompt tokens only (`completion_tokens` 0; vLLM reports no cached tokens for pooling
requests, so `prompt_tokens_details` is null).
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import struct
import sys
from collections.abc import Sequence
from typing import Any

_ORDER = {"native": "<" if sys.byteorder == "little" else ">", "little": "<", "big": ">"}


def vector(tokens: Sequence[int], dimension: int, seed: int = 0) -> list[float]:
    digest = hashlib.blake2b(repr((seed, list(tokens))).encode(), digest_size=8).digest()
    generator = random.Random(int.from_bytes(digest, "big"))
    values = [generator.gauss(0.0, 1.0) for _ in range(dimension)]
    norm = math.sqrt(sum(value * value for value in values)) or 1.0
    return [_float32(value / norm) for value in values]


def _float32(value: float) -> float:
    return float(struct.unpack("f", struct.pack("f", value))[0])


def encode(values: list[float], encoding_format: str, embed_dtype: str, endianness: str) -> Any:
    """The `embedding` field: the floats, or their bytes in base64."""
    if encoding_format == "float":
        return values
    order = _ORDER[endianness]
    if embed_dtype == "float32":
        packed = struct.pack(f"{order}{len(values)}f", *values)
    elif embed_dtype == "float16":
        packed = struct.pack(f"{order}{len(values)}e", *values)
    else:  # bfloat16: the high half of each float32 (vLLM's tensors round to nearest)
        halves = [_bfloat16_bits(value) for value in values]
        packed = struct.pack(f"{order}{len(values)}H", *halves)
    return base64.b64encode(packed).decode()


def _bfloat16_bits(value: float) -> int:
    bits: int = struct.unpack("<I", struct.pack("<f", value))[0]
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def embedding_response(
    response_id: str, created: int, model: str, embeddings: list[Any], prompt_tokens: int
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "list",
        "created": created,
        "model": model,
        "data": [
            {"index": index, "object": "embedding", "embedding": embedding}
            for index, embedding in enumerate(embeddings)
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        },
    }


def salted(tokens: Sequence[int], salt: str | None) -> list[int]:
    """The token ids the prefix cache keys an embedding by: with a salt, ids no other salt
    (and no unsalted prompt) shares, as vLLM's `cache_salt` makes the block hashes."""
    if salt is None:
        return list(tokens)
    prefix = salt.encode() + b"\0"
    return [
        int.from_bytes(hashlib.blake2b(prefix + token.to_bytes(8, "big"), digest_size=4).digest())
        for token in tokens
    ]
