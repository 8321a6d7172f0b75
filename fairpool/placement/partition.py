"""`VLLM_PP_LAYER_PARTITION` as the pinned vLLM reads it.

vLLM 0.32.0, `vllm.distributed.utils.get_pp_indices`: the variable is split on "," and each
piece parsed with `int()` (so " 27" and "2_7" pass, "" does not); the number of pieces must
equal the pipeline-parallel size and their sum `num_hidden_layers`; stage r owns layers
[Σ_{i<r} p_i, Σ_{i≤r} p_i), 0-based. vLLM accepts entries ≤ 0; we do not, since a stage
without layers is a node doing nothing.
"""

from __future__ import annotations

from itertools import accumulate

from fairpool.sched.errors import ConfigError, require_count

FIELD = "layerPartition"


def check_partition(partition: str, pipeline_size: int, layers: int) -> list[tuple[int, int]]:
    """The [start, end) layer range of every stage, or ConfigError where vLLM would fail."""
    require_count("pipelineSize", pipeline_size, minimum=1)
    require_count("layers", layers, minimum=1)
    try:
        counts = [int(piece) for piece in partition.split(",")]
    except ValueError as error:
        raise ConfigError(FIELD, f"invalid partition string: {partition!r}") from error
    if len(counts) != pipeline_size:
        raise ConfigError(
            FIELD, f"{len(counts)} entries do not match pipeline-parallel size {pipeline_size}"
        )
    if sum(counts) != layers:
        raise ConfigError(FIELD, f"entries sum to {sum(counts)}, not the model's {layers} layers")
    if min(counts) < 1:
        raise ConfigError(FIELD, f"every stage needs at least one layer: {partition!r}")
    ends = list(accumulate(counts))
    return [(end - count, end) for count, end in zip(counts, ends, strict=True)]
