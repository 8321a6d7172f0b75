"""The chains fairpool renders for a placement pool, read by the pinned vLLM itself.

Every stage pod's command line, as `fairpool engine` hands it to `vllm serve`, parses with
vLLM 0.32's own `serve` parser into the pipeline fairpool meant (pipeline size, node rank,
node count, master address, multiprocessing backend, headless after stage 0, max-num-seqs
at least the chain's capacity); and the pod's `VLLM_PP_LAYER_PARTITION`, read by
`vllm.distributed.utils.get_pp_indices`, gives each node rank exactly the layers the plan
gave that stage. LeaderWorkerSet pods are read with the kubelet's `$(VAR)` expansion done
by hand (LWS sets LWS_LEADER_ADDRESS and LWS_WORKER_INDEX).
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from fairpool.placement.planner import check_partition
from fairpool_cli.main import _parser
from fairpool_engine.vllm.launch import vllm_command
from fairpool_engine.vllm.main import _patch_cpu_build_version
from fairpool_operator.config import OperatorConfig
from fairpool_operator.plan import plan_namespace

pytestmark = pytest.mark.vllm

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipeline.yaml"
LAYERS = 80


@pytest.fixture(scope="module")
def vllm_serve() -> argparse.ArgumentParser:
    _patch_cpu_build_version()
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    ServeSubcommand().subparser_init(parser.add_subparsers())
    return parser


def example(rate: float) -> dict[str, Any]:
    body = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    body["spec"]["placement"]["workload"]["arrivalRate"] = rate
    return body


def stage_pods(objects: list[dict[str, Any]]) -> list[tuple[str, int, int, dict[str, Any]]]:
    """(chain, rank, stages, container) of every stage pod, LWS workers expanded."""
    pods = []
    for obj in objects:
        chain = obj["metadata"]["labels"].get("fairpool.io/chain")
        if obj["kind"] == "StatefulSet":
            template = obj["spec"]["template"]
            (container,) = template["spec"]["containers"]
            rank = int(template["metadata"]["labels"]["fairpool.io/stage"])
            stages = int(container["args"][container["args"].index("--nnodes") + 1])
            pods.append((chain, rank, stages, container))
        elif obj["kind"] == "LeaderWorkerSet":
            group = obj["spec"]["leaderWorkerTemplate"]
            size = group["size"]
            (leader,) = group["leaderTemplate"]["spec"]["containers"]
            pods.append((chain, 0, size, expand(leader, 0)))
            (worker,) = group["workerTemplate"]["spec"]["containers"]
            pods += [(chain, index, size, expand(worker, index)) for index in range(1, size)]
    return pods


def expand(container: dict[str, Any], index: int) -> dict[str, Any]:
    """What the kubelet runs: $(VAR) replaced from the environment LWS gives the pod."""
    values = {"$(LWS_WORKER_INDEX)": str(index), "$(LWS_LEADER_ADDRESS)": "chain-0.ns"}
    return {**container, "args": [values.get(arg, arg) for arg in container["args"]]}


@pytest.mark.parametrize(
    ("rate", "leader_worker_set"), [(5.0, False), (1.0, False), (1.0, True), (5.0, True)]
)
def test_every_stage_is_the_pipeline_stage_vllm_will_run(
    vllm_serve: argparse.ArgumentParser,
    monkeypatch: pytest.MonkeyPatch,
    rate: float,
    leader_worker_set: bool,
) -> None:
    from vllm.distributed.utils import get_pp_indices

    config = OperatorConfig(namespace="ns", leader_worker_set=leader_worker_set)
    (pool,) = plan_namespace([example(rate)], [], {}, config).pools
    assert pool.chains is not None and pool.problem is None
    chains = {chain.name: chain for chain in pool.chains.chains}
    pods = stage_pods(pool.objects)
    assert len(pods) == sum(len(chain.nodes) for chain in chains.values())
    for name, rank, stages, container in pods:
        chain = chains[name]
        assert stages == len(chain.nodes)
        fairpool_args, vllm_args = _parser().parse_known_args(container["args"])
        assert fairpool_args.command == "engine"
        command = vllm_command(fairpool_args.model, vllm_args)
        args = vllm_serve.parse_args(command[command.index("serve") :])
        assert args.pipeline_parallel_size == stages
        assert args.nnodes == stages and args.node_rank == rank
        assert args.distributed_executor_backend == "mp"
        assert args.headless is (rank > 0)
        assert args.master_port == 29501 and args.master_addr
        assert args.max_num_seqs >= chain.capacity
        assert args.tensor_parallel_size == pool.chains.tensor_parallel_size

        partition = {item["name"]: item["value"] for item in container["env"]}[
            "VLLM_PP_LAYER_PARTITION"
        ]
        monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", partition)
        expected = check_partition(chain.partition_string, stages, LAYERS)[rank]
        assert get_pp_indices(LAYERS, rank, stages) == expected
