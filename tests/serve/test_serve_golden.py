"""Golden files for the emitted launch commands (vLLM, vLLM + Ray, SGLang).

Each golden is the planner's own recommendation for a fixed layout, rendered as one
`# nodes (role)` line and one shell line (`LaunchStep.shell()`) per step, one step per
role however many nodes run it, compared exactly.
Each golden is for one engine release, named by its folder (tests/golden/ENGINE-VERSION/, the
default releases of planner/engines.py). Rewrite them after a deliberate change with
`UPDATE_GOLDEN=1 python -m pytest tests/serve` and review the diff. Every command is also checked
against the release's own flags and startup pairings (tests/engine_flags/, the `engine_check`
fixture).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from planner.catalog import resolve_model
from planner.engines import EngineVersions
from planner.requests import Speculation
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
        return self.path_for(EngineVersions())

    def path_for(self, versions: EngineVersions) -> Path:
        folder = f"sglang-{versions.sglang}" if self.engine == "sglang" else f"vllm-{versions.vllm}"
        return GOLDEN_DIR / folder / f"{self.name}.txt"


EP_CASES = [  # (name, model, cluster, layout, request, model argument), for vLLM and SGLang
    # expert parallelism: data-parallel attention, EP inside the TP group, across nodes, several groups
    ("ep_dp_attention_deepseek-v3_1x8xH200_tp1_dp8_ep8", "deepseek-v3", "1x8xH200", {"tp": 1, "dp": 8, "ep": 8}, {"batch": 64, "max_model_len": 16384}, "deepseek-ai/DeepSeek-V3"),
    ("ep_in_tp_deepseek-v3_1x8xH200_tp8_ep8", "deepseek-v3", "1x8xH200", {"tp": 8, "ep": 8}, {"batch": 64, "max_model_len": 16384}, "deepseek-ai/DeepSeek-V3"),
    ("ep_across_nodes_deepseek-v3_2x8xH100_tp1_dp16_ep16", "deepseek-v3", "2x8xH100", {"tp": 1, "dp": 16, "ep": 16}, {"batch": 64, "max_model_len": 16384}, "deepseek-ai/DeepSeek-V3"),
    ("ep_two_groups_qwen3-30b-a3b_2x8xH100_tp1_dp16_ep8", "qwen3-30b-a3b", "2x8xH100", {"tp": 1, "dp": 16, "ep": 8}, {"batch": 64, "max_model_len": 16384}, "Qwen/Qwen3-30B-A3B"),
    ("ep_groups_share_a_node_qwen3-30b-a3b_1x8xH100_tp1_dp8_ep4", "qwen3-30b-a3b", "1x8xH100", {"tp": 1, "dp": 8, "ep": 4}, {"batch": 64, "max_model_len": 16384}, "Qwen/Qwen3-30B-A3B"),
]

EAGLE3_HEAD = resolve_model("llama-3.1-8b").model_copy(update={"name": "EAGLE3-LLaMA3.1-Instruct-8B",
                                                               "num_hidden_layers": 1, "vocab_size": 32000})
"""An EAGLE-3 head for Llama-3.1-8B (one Llama block, a 32,000-token draft vocabulary)."""
SPECULATIVE_CASES = [  # speculative decoding: the model's MTP layers; an EAGLE-3 head
    ("speculative_mtp_deepseek-v3_1x8xH200_tp8", "deepseek-v3", "1x8xH200", {"tp": 8, "ep": 1},
     {"batch": 64, "max_model_len": 16384, "speculation": Speculation("mtp", 2, (0.8, 0.5))}, "deepseek-ai/DeepSeek-V3"),
    ("speculative_eagle3_8b_1x8xH100_tp1_dp8", "llama-3.1-8b", "1x8xH100", {"tp": 1, "dp": 8},
     {"batch": 32, "max_model_len": 8192,
      "speculation": Speculation("eagle3", 3, (0.75, 0.55, 0.4), EAGLE3_HEAD, "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")},
     "meta-llama/Llama-3.1-8B-Instruct"),
]


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
        "batched_tokens_70b_1x8xH100_tp4_dp2",
        "vllm",
        "llama-3.1-70b",
        "1x8xH100",
        {"tp": 4, "dp": 2},
        {"batch": 64, "max_model_len": 8192, "max_num_batched_tokens": 4096},
        model_arg="meta-llama/Llama-3.1-70B-Instruct",
    ),
    Case(
        "dp_across_nodes_70b_2x8xA100_tp4_dp4",
        "sglang",
        "llama-3.1-70b",
        "2x8xA100",
        {"tp": 4, "pp": 1, "dp": 4},
        {"batch": 64, "max_model_len": 8192},
        model_arg="meta-llama/Llama-3.1-70B-Instruct",
    ),
    Case(
        "dp_of_multi_node_replicas_405b_4x8xH100_tp8_pp2_dp2",
        "sglang",
        "llama-3.1-405b",
        "4x8xH100",
        {"tp": 8, "pp": 2, "dp": 2},
        {"batch": 32, "max_model_len": 16384},
        model_arg="meta-llama/Llama-3.1-405B-Instruct",
    ),
    Case(
        "dp_of_multi_node_replicas_ray_405b_4x8xH100_tp8_pp2_dp2",
        "vllm-ray",
        "llama-3.1-405b",
        "4x8xH100",
        {"tp": 8, "pp": 2, "dp": 2},
        {"batch": 32, "max_model_len": 16384},
        model_arg="meta-llama/Llama-3.1-405B-Instruct",
    ),
    Case(
        "batched_tokens_70b_1x8xH100_tp4_dp2",
        "sglang",
        "llama-3.1-70b",
        "1x8xH100",
        {"tp": 4, "dp": 2},
        {"batch": 64, "max_model_len": 8192, "max_num_batched_tokens": 4096},
        model_arg="meta-llama/Llama-3.1-70B-Instruct",
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
    *[Case(name, engine, model, cluster, degrees, request, model_arg=model_arg)
      for engine in ("vllm", "sglang")
      for name, model, cluster, degrees, request, model_arg in EP_CASES],
    *[Case(name, engine, model, cluster, degrees, request, model_arg=model_arg)
      for engine in ("vllm", "sglang")
      for name, model, cluster, degrees, request, model_arg in SPECULATIVE_CASES],
]


def steps_for(case: Case, serve_plan, versions: EngineVersions | None = None) -> list:
    request = case.request if versions is None else {**case.request, "engine_versions": versions}
    plan = serve_plan(case.model, case.cluster, quantization=case.quantization, layout=case.layout, **request)
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


OLD_SGLANG = EngineVersions(sglang="0.5.10.post1")


@pytest.mark.parametrize("case", [c for c in CASES if c.engine == "sglang"], ids=lambda c: c.name)
def test_golden_command_of_the_previous_sglang_release(case, serve_plan, engine_check):
    """0.5.10.post1 stays selectable (--engine-version sglang=0.5.10.post1): its commands are
    its goldens (`--dp-size d --enable-dp-attention` where 0.5.23 has `--attn-dp-size d`) and
    pass its flag file."""
    steps = steps_for(case, serve_plan, OLD_SGLANG)
    text = render(steps)
    if UPDATE:
        case.path_for(OLD_SGLANG).write_text(text, encoding="utf-8")
    assert text == case.path_for(OLD_SGLANG).read_text(encoding="utf-8")
    for step in steps:
        assert engine_check(step.argv, OLD_SGLANG) == [], step.shell()


V0_VLLM = EngineVersions(vllm="0.6.6.post1")
V0_CASES = [c for c in CASES if c.engine != "sglang" and c.layout.get("ep", 1) == 1
            and "speculation" not in c.request and not c.name.startswith("disagg")]
"""The vLLM goldens the V0 engine can plan (no expert parallelism, no speculative decoding)."""


@pytest.mark.parametrize("case", V0_CASES, ids=lambda c: c.name)
def test_golden_command_of_the_v0_release(case, serve_plan, engine_check):
    """0.6.6.post1 (--engine-version vllm=0.6.6.post1, the V0 engine): every replica its own
    server (CUDA_VISIBLE_DEVICES and --port on a shared node), Ray for a replica wider than a
    node, --enable-chunked-prefill where the plan chunks what V0 would not; its goldens pass its
    flag file (tests/engine_flags/vllm-0.6.6.post1.json)."""
    steps = steps_for(case, serve_plan, V0_VLLM)
    text = render(steps)
    if UPDATE:
        case.path_for(V0_VLLM).parent.mkdir(parents=True, exist_ok=True)
        case.path_for(V0_VLLM).write_text(text, encoding="utf-8")
    assert text == case.path_for(V0_VLLM).read_text(encoding="utf-8")
    assert "--data-parallel-size" not in text and "--nnodes" not in text and "--headless" not in text
    for step in steps:
        assert engine_check(step.argv, V0_VLLM) == [], step.shell()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.engine}-{c.name}")
def test_commands_use_only_what_the_release_accepts(case, serve_plan, engine_check):
    """Flags, values and startup pairings of the release the golden is for (tests/engine_flags/)."""
    for step in steps_for(case, serve_plan):
        assert engine_check(step.argv, EngineVersions()) == [], step.shell()


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


def test_replicas_spanning_nodes_are_one_deployment_behind_one_address(serve_plan):
    """dp=2 replicas of tp=8 pp=2 on 4x8xH100. vLLM: one deployment over the 4 nodes, the head's
    API server balancing both DP ranks (each node's DP rank follows from --node-rank). SGLang,
    which refuses --dp-size with --nnodes: one server per replica (its first node the master,
    $REPLICA_HEAD_IP) and the router on node 0 in front of both."""
    vllm = steps_for(next(c for c in CASES if c.name.startswith("dp_of_multi_node") and c.engine == "vllm"),
                     serve_plan)
    assert [(s.role, list(s.nodes)) for s in vllm] == [("head", [0]), ("worker", [1, 2, 3])]
    for step in vllm:
        argv = list(step.argv)
        assert argv[argv.index("--nnodes") + 1] == "4" and argv[argv.index("--data-parallel-size") + 1] == "2"
        assert argv[argv.index("--master-addr") + 1] == argv[argv.index("--data-parallel-address") + 1] == "HEAD_IP"
    sglang = steps_for(next(c for c in CASES if c.name.startswith("dp_of_multi_node") and c.engine == "sglang"),
                       serve_plan)
    head, worker, router = sglang
    assert (head.where, worker.where, router.where) == (
        "nodes 0, 2 (replica head)", "nodes 1, 3 (replica worker)", "node 0 (router)")
    for step in (head, worker):
        assert "--dp-size" not in step.argv and step.variables() == ["REPLICA_HEAD_IP"]
    assert router.argv[:3] == ("python", "-m", "sglang_router.launch_router")
    assert router.variables() == ["SERVER_URLS"]


def test_sglang_memory_fraction_covers_the_planned_weights_and_kv(serve_plan):
    """--mem-fraction-static is weights + KV pool over the memory free before the weights load
    (SGLang's meaning: profile_max_num_token's total_gpu_memory, the snapshot after the CUDA
    context and the communicators), not vLLM's 0.9: the plan's weights + KV, capped where
    SGLang's own default reserve begins. tp=8 on an 80 GiB H100 (79.1 GiB CUDA-visible, less
    500 MiB of context and 688 MB of NCCL buffers: serving_memory.pre_load_free_bytes;
    ServerArgs._handle_gpu_memory_settings): chunked prefill 8,192 tokens, CUDA graphs up to batch
    512, 59 piecewise graphs -> 512 + 1.5 * 8192 + 2 * 512 + 1024 * 8/8 + 8 * 59 = 15,320 MiB kept
    free (more than the 10 GiB floor)."""
    case = next(c for c in CASES if c.name.startswith("single_node_8b") and c.engine == "sglang")
    plan = serve_plan(case.model, case.cluster, layout=case.layout, **case.request)
    best = plan.recommended
    (step,) = launch_steps(plan, best, "sglang", case.model_arg)
    fraction = float(step.argv[list(step.argv).index("--mem-fraction-static") + 1])
    memory = plan.cluster.gpu.cuda_visible_memory_bytes - 500 * 2**20 - 688 * 10**6
    planned = max(s.weights_bytes + s.kv_cache_bytes for s in best.stages) / memory
    ceiling = (memory - 15_320 * 2**20) / memory
    assert fraction == pytest.approx(min(planned, ceiling), abs=0.001)
    assert fraction <= 1 - 10 * 2**30 / memory and fraction < 0.9


def test_a_non_default_token_budget_is_emitted(serve_plan):
    """--max-num-batched-tokens changes the plan (the profile run's activations), so the command
    carries it; SGLang gets it as --chunked-prefill-size. The default budget is left out."""
    for engine, flag in (("vllm", "--max-num-batched-tokens"), ("sglang", "--chunked-prefill-size")):
        case = next(c for c in CASES if c.name.startswith("batched_tokens") and c.engine == engine)
        (step,) = steps_for(case, serve_plan)
        assert step.argv[list(step.argv).index(flag) + 1] == "4096"
    default = next(c for c in CASES if c.name.startswith("single_node_8b") and c.engine == "vllm")
    (step,) = steps_for(default, serve_plan)
    assert "--max-num-batched-tokens" not in step.argv


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
    assert "sglang serve --model-path MODEL --tp-size 8 --pp-size 2" in sglang.stdout
    assert "vllm serve" not in sglang.stdout


def test_sglang_fraction_is_of_the_memory_free_before_load():
    """SGLang's pool is free-after-load - T * (1 - f), T the free memory after the CUDA context and
    the communicators (serving_memory.pre_load_free_bytes). H100 (79.11 GiB CUDA-visible) at
    tp=8 pp=2: T = 79.11 GiB - 500 MiB - 688 MB - 544 MB = 77.47 GiB; the pool
    is f * T - weights, so the table's weights + pool is f * T (Llama-3.1-405B, a CLI read)."""
    from planner.catalog import resolve_cluster
    from planner.cost.serving_memory import pre_load_free_bytes
    from planner.layout import Layout

    gpu = resolve_cluster("2x8xH100").gpu
    expected = gpu.cuda_visible_memory_bytes - 500 * 2**20 - 688 * 10**6 - 544 * 10**6
    assert pre_load_free_bytes(gpu.cuda_visible_memory_bytes, Layout(8, 2, 1)) == expected
    assert expected / 2**30 == pytest.approx(77.47, abs=0.01)
    assert pre_load_free_bytes(gpu.cuda_visible_memory_bytes, Layout(1, 1, 8)) == (
        gpu.cuda_visible_memory_bytes - 500 * 2**20)  # no communicator of its own


def test_sglang_runs_the_mixed_steps_the_plan_prices(serve_plan):
    """The plan prices decode steps that carry prompt chunks (vLLM's schedule); SGLang mixes only
    with --enable-mixed-chunk (ServerArgs.enable_mixed_chunk defaults to False), so every
    aggregated SGLang command carries it, except under speculative decoding, where SGLang turns
    it off and the plan says so; a disaggregated role's server never gets it."""
    from planner.emit.sglang import mixed_chunk_flag

    case = next(c for c in CASES if c.name.startswith("single_node_8b") and c.engine == "sglang")
    plan = serve_plan(case.model, case.cluster, layout=case.layout, **case.request)
    (step,) = launch_steps(plan, plan.recommended, "sglang", case.model_arg)
    assert "--enable-mixed-chunk" in step.argv
    spec = next(c for c in CASES if c.name.startswith("speculative_eagle3") and c.engine == "sglang")
    for step in steps_for(spec, serve_plan):
        assert "--enable-mixed-chunk" not in step.argv
    from tests.test_launch_steps import ARGS

    assert mixed_chunk_flag(ARGS) == ["--enable-mixed-chunk"] and mixed_chunk_flag(ARGS, mixed=False) == []
