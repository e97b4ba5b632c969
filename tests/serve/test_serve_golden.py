"""Golden files for the emitted launch commands (vLLM, vLLM + Ray, SGLang).

Each golden is the planner's own recommendation for a fixed layout, rendered as one
`# nodes (role)` line and one shell line (`LaunchStep.shell()`) per step, one step per
role however many nodes run it, compared exactly.
Rewrite them after a deliberate change with `UPDATE_GOLDEN=1 python -m pytest tests/serve`
and review the diff. Flag names are checked against the engines' argument definitions
(vLLM vllm/engine/arg_utils.py, 2025-2026 releases; SGLang python/sglang/srt/server_args.py, 0.4-0.5).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from planner.serve_cli import launch_steps

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


@dataclass(frozen=True)
class Case:
    name: str
    engine: str
    model: str
    cluster: str
    layout: dict[str, int]
    request: dict[str, object] = field(default_factory=dict)
    quantization: str | None = None
    model_arg: str = "meta-llama/Llama-3.1-8B-Instruct"

    @property
    def path(self) -> Path:
        folder = "sglang" if self.engine == "sglang" else "vllm"
        return GOLDEN_DIR / folder / f"{self.name}.txt"


CASES = [
    Case(
        "single_node_8b_1x8xH100_tp8",
        "vllm",
        "llama-3.1-8b",
        "1x8xH100",
        {"tp": 8},
        {"batch": 64, "max_model_len": 8192},
    ),
    Case(
        "multi_node_mp_405b_2x8xH100_tp8_pp2",
        "vllm",
        "llama-3.1-405b",
        "2x8xH100",
        {"tp": 8, "pp": 2},
        {"batch": 32, "max_model_len": 16384},
        model_arg="meta-llama/Llama-3.1-405B-Instruct",
    ),
    Case(
        "multi_node_ray_405b_2x8xH100_tp8_pp2",
        "vllm-ray",
        "llama-3.1-405b",
        "2x8xH100",
        {"tp": 8, "pp": 2},
        {"batch": 32, "max_model_len": 16384},
        model_arg="meta-llama/Llama-3.1-405B-Instruct",
    ),
    Case(
        "dp_one_node_8b_1x8xH100_tp2_dp4",
        "vllm",
        "llama-3.1-8b",
        "1x8xH100",
        {"tp": 2, "dp": 4},
        {"batch": 128, "max_model_len": 8192},
    ),
    Case(
        "dp_across_nodes_70b_2x8xA100_tp4_dp4",
        "vllm",
        "llama-3.1-70b",
        "2x8xA100",
        {"tp": 4, "pp": 1, "dp": 4},
        {"batch": 64, "max_model_len": 8192},
        model_arg="meta-llama/Llama-3.1-70B-Instruct",
    ),
    Case(
        "dp_of_multi_node_replicas_405b_4x8xH100_tp8_pp2_dp2",
        "vllm",
        "llama-3.1-405b",
        "4x8xH100",
        {"tp": 8, "pp": 2, "dp": 2},
        {"batch": 32, "max_model_len": 16384},
        model_arg="meta-llama/Llama-3.1-405B-Instruct",
    ),
    Case(
        "fp8_weights_fp8_kv_70b_1x8xH100_tp4_dp2",
        "vllm",
        "llama-3.1-70b",
        "1x8xH100",
        {"tp": 4, "dp": 2},
        {"batch": 64, "max_model_len": 32768, "kv_cache_dtype": "fp8"},
        quantization="fp8",
        model_arg="meta-llama/Llama-3.1-70B-Instruct",
    ),
    Case(
        "quoted_model_path_8b_1x1xH100",
        "vllm",
        "llama-3.1-8b",
        "1x1xH100",
        {},
        {"batch": 16, "max_model_len": 8192},
        model_arg="/models/Llama 3.1 8B; rm -rf ~",
    ),
    Case(
        "replicas_at_scale_405b_2048x8xH100_tp8_pp4",
        "vllm",
        "llama-3.1-405b",
        "2048x8xH100",
        {"tp": 8, "pp": 4},
        {"batch": 32, "max_model_len": 8192},
        model_arg="meta-llama/Llama-3.1-405B-Instruct",
    ),
    Case(
        "replicas_at_scale_ray_405b_2048x8xH100_tp8_pp4",
        "vllm-ray",
        "llama-3.1-405b",
        "2048x8xH100",
        {"tp": 8, "pp": 4},
        {"batch": 32, "max_model_len": 8192},
        model_arg="meta-llama/Llama-3.1-405B-Instruct",
    ),
    Case(
        "one_replica_at_scale_405b_4x8xH100_tp8_pp4",
        "vllm",
        "llama-3.1-405b",
        "4x8xH100",
        {"tp": 8, "pp": 4},
        {"batch": 32, "max_model_len": 8192},
        model_arg="meta-llama/Llama-3.1-405B-Instruct",
    ),
    Case(
        "dp_at_scale_70b_2048x8xA100_tp4",
        "vllm",
        "llama-3.1-70b",
        "2048x8xA100",
        {"tp": 4, "pp": 1},
        {"batch": 64, "max_model_len": 8192},
        model_arg="meta-llama/Llama-3.1-70B-Instruct",
    ),
    Case(
        "single_node_8b_1x8xH100_tp8",
        "sglang",
        "llama-3.1-8b",
        "1x8xH100",
        {"tp": 8},
        {"batch": 64, "max_model_len": 8192},
    ),
    Case(
        "multi_node_405b_2x8xH100_tp8_pp2",
        "sglang",
        "llama-3.1-405b",
        "2x8xH100",
        {"tp": 8, "pp": 2},
        {"batch": 32, "max_model_len": 16384},
        model_arg="meta-llama/Llama-3.1-405B-Instruct",
    ),
    Case(
        "at_scale_405b_2048x8xH100_tp8_pp4",
        "sglang",
        "llama-3.1-405b",
        "2048x8xH100",
        {"tp": 8, "pp": 4},
        {"batch": 32, "max_model_len": 8192},
        model_arg="meta-llama/Llama-3.1-405B-Instruct",
    ),
    Case(
        "dp_8b_1x8xH100_tp2_dp4",
        "sglang",
        "llama-3.1-8b",
        "1x8xH100",
        {"tp": 2, "dp": 4},
        {"batch": 128, "max_model_len": 8192},
    ),
    Case(
        "fp8_weights_fp8_kv_70b_1x8xH100_tp4_dp2",
        "sglang",
        "llama-3.1-70b",
        "1x8xH100",
        {"tp": 4, "dp": 2},
        {"batch": 64, "max_model_len": 32768, "kv_cache_dtype": "fp8"},
        quantization="fp8",
        model_arg="meta-llama/Llama-3.1-70B-Instruct",
    ),
]

VLLM_FLAGS = {
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--data-parallel-size",
    "--data-parallel-size-local",
    "--data-parallel-start-rank",
    "--data-parallel-address",
    "--data-parallel-rpc-port",
    "--data-parallel-backend",
    "--enable-expert-parallel",
    "--headless",
    "--nnodes",
    "--node-rank",
    "--master-addr",
    "--master-port",
    "--distributed-executor-backend",
    "--gpu-memory-utilization",
    "--kv-cache-memory",
    "--max-model-len",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--block-size",
    "--enable-chunked-prefill",
    "--enforce-eager",
    "--dtype",
    "--quantization",
    "--kv-cache-dtype",
}
"""vLLM EngineArgs flags (2025-2026 releases)."""
SGLANG_FLAGS = {
    "--model-path",
    "--tp-size",
    "--pp-size",
    "--dp-size",
    "--ep-size",
    "--mem-fraction-static",
    "--context-length",
    "--quantization",
    "--kv-cache-dtype",
    "--nnodes",
    "--node-rank",
    "--dist-init-addr",
    "--max-running-requests",  # SGLang server_args.py
}
"""SGLang ServerArgs flags."""


def steps_for(case: Case, serve_plan) -> list:
    plan = serve_plan(
        case.model, case.cluster, quantization=case.quantization, layout=case.layout, **case.request
    )
    best = plan.recommended
    assert best is not None, plan.rejected
    if case.layout:
        assert all(getattr(best.layout, key) == value for key, value in case.layout.items())
    return launch_steps(plan, best, case.engine, case.model_arg)


def render(steps) -> str:
    return "".join(f"# {step.where}\n{step.shell()}\n" for step in steps)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.engine}-{c.name}")
def test_golden_command(case, serve_plan):
    text = render(steps_for(case, serve_plan))
    if UPDATE:
        case.path.parent.mkdir(parents=True, exist_ok=True)
        case.path.write_text(text, encoding="utf-8")
    assert case.path.is_file(), f"{case.path} missing: run with UPDATE_GOLDEN=1"
    assert text == case.path.read_text(encoding="utf-8")


def flags(argv) -> set[str]:
    return {arg.split("=")[0] for arg in argv if arg.startswith("--")}


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.engine}-{c.name}")
def test_flags_are_the_documented_ones(case, serve_plan):
    for step in steps_for(case, serve_plan):
        argv = step.argv
        if argv[:2] == ("ray", "start"):
            assert flags(argv) <= {"--head", "--port", "--address"}
        elif case.engine == "sglang":
            assert argv[:3] == ("python", "-m", "sglang.launch_server")
            assert flags(argv) <= SGLANG_FLAGS, flags(argv) - SGLANG_FLAGS
        else:
            assert argv[:3] == ("vllm", "serve", case.model_arg)
            assert flags(argv) <= VLLM_FLAGS, flags(argv) - VLLM_FLAGS


def test_model_argument_is_one_argv_element(serve_plan):
    """The model path travels as one argv element and is shell-quoted when shown."""
    case = next(c for c in CASES if c.name.startswith("quoted_model_path"))
    (step,) = steps_for(case, serve_plan)
    assert step.argv[2] == case.model_arg
    assert shlex.split(step.shell()) == list(step.argv)


def test_multi_node_replica_commands(serve_plan):
    """tp=8 pp=2 on 2x8xH100 (mp): the head runs node-rank 0, the worker node-rank 1 with
    --headless; both name the same master; the Ray variant starts Ray on both nodes and
    serves once, from the head."""
    case = next(c for c in CASES if c.name.startswith("multi_node_mp"))
    head, worker = steps_for(case, serve_plan)
    for rank, step in enumerate((head, worker)):
        argv = list(step.argv)
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--master-addr") + 1] == "HEAD_IP"
    assert "--headless" not in head.argv and "--headless" in worker.argv
    ray = steps_for(next(c for c in CASES if c.name.startswith("multi_node_ray")), serve_plan)
    assert [s.argv[:2] for s in ray] == [("ray", "start"), ("ray", "start"), ("vllm", "serve")]
    assert ray[-1].argv[-2:] == ("--distributed-executor-backend", "ray")


def test_replicas_spanning_nodes_each_get_their_own_head(serve_plan):
    """dp=2 replicas of tp=8 pp=2 on 4x8xH100: replica 0 on nodes 0-1, replica 1 on nodes
    2-3, each with its own master address (two independent deployments, not one shared
    head): one step for the replica heads, one for the replica workers, the master being
    the per-node $REPLICA_HEAD_IP."""
    case = next(c for c in CASES if c.name.startswith("dp_of_multi_node"))
    steps = steps_for(case, serve_plan)
    head, worker = steps
    assert (list(head.nodes), list(worker.nodes)) == ([0, 2], [1, 3])
    assert (head.where, worker.where) == ("nodes 0, 2 (replica head)", "nodes 1, 3 (replica worker)")
    for step in steps:
        assert step.argv[list(step.argv).index("--master-addr") + 1] == "$REPLICA_HEAD_IP"
        assert step.variables() == ["REPLICA_HEAD_IP"]


def test_dp_across_nodes_flags(serve_plan):
    """tp=4 dp=4 on 2x8xA100: 2 DP ranks per node; the worker is --headless and starts at
    DP rank 2; --max-num-seqs is per DP rank (the plan's batch per replica)."""
    case = next(c for c in CASES if c.name.startswith("dp_across_nodes"))
    head, worker = steps_for(case, serve_plan)

    def value(step, flag):
        argv = list(step.argv)
        return argv[argv.index(flag) + 1]

    for step in (head, worker):
        assert value(step, "--data-parallel-size") == "4"
        assert value(step, "--data-parallel-size-local") == "2"
        assert value(step, "--max-num-seqs") == "64"
    assert "--headless" not in head.argv and "--data-parallel-start-rank" not in head.argv
    assert "--headless" in worker.argv and value(worker, "--data-parallel-start-rank") == "2"


def test_cli_shows_the_ray_alternative_and_emits_other_engines(run_plan):
    """A replica wider than a node: the default output shows the mp commands and the Ray
    alternative; --emit vllm-ray prints only Ray; --emit sglang the SGLang launch."""
    args = (
        "--model",
        "llama-3.1-405b",
        "--cluster",
        "2x8xH100",
        "--layout",
        "tp=8,pp=2",
        "--max-model-len",
        "16384",
        "--batch",
        "32",
    )
    default = run_plan(*args)
    assert default.returncode == 0
    assert "--headless" in default.stdout and "Or with Ray" in default.stdout
    ray = run_plan(*args, "--emit", "vllm-ray")
    assert ray.returncode == 0
    assert "ray start --head --port 6379" in ray.stdout
    assert "--distributed-executor-backend ray" in ray.stdout
    sglang = run_plan(*args, "--emit", "sglang")
    assert sglang.returncode == 0
    assert (
        "python -m sglang.launch_server --model-path MODEL --tp-size 8 --pp-size 2" in sglang.stdout
    )
    assert "vllm serve" not in sglang.stdout
