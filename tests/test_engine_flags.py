"""Every launch command the planner emits is one each engine release accepts: only flags and
values its parser knows (tests/engine_flags/, written by tools/engine_flags.py from the engine's
own source), and the startup pairings that once failed (SGLang --dp-size with --nnodes, nnodes
dividing tp*pp; Megatron-LM's CUDA_DEVICE_MAX_CONNECTIONS and Megatron-FSDP's checkpoint format;
TP against the query groups per release; vLLM's deprecated online fp8 name).

The sweep: every shipped model on every shipped cluster, every serving --emit, every feasible
layout (the JSON carries a command for each); training with every --zero, --recompute and
--schedule. No network: the engines' flags are the committed JSON files."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from planner.catalog import resolve_cluster, resolve_model, shipped_clusters, shipped_models
from planner.engines import RELEASES, EngineVersions
from planner.requests import ServeRequest, TrainRequest
from planner.serve_cli import launch_steps, launchable
from planner.serve_search import plan_serving
from planner.train_cli import launchable as train_launchable
from planner.train_search import search

FLAGS_DIR = Path(__file__).resolve().parent / "engine_flags"
SERVE_ENGINES = ("vllm", "vllm-ray", "sglang")


def flag_file(engine: str, version: str) -> dict:
    return json.loads((FLAGS_DIR / f"{engine}-{version}.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("engine, version", [(e, v) for e, rs in RELEASES.items() for v in rs])
def test_every_release_has_its_flag_file_and_agrees_with_it(engine, version):
    """planner/engines.py and the extracted file say the same of a release."""
    data = flag_file(engine, version)
    assert (data["engine"], data["version"]) == (engine, version)
    release, pairings = RELEASES[engine][version], data["pairings"]
    if engine == "vllm":
        assert release.online_fp8_quantization == (pairings["online_fp8_quantization_deprecated"] or "fp8")
        # V1 launches across nodes itself (--nnodes, whose checks the tool found); V0 has no such flag
        multi_node = "--nnodes" in data["flags"]
        assert release.v1_engine == multi_node
        assert pairings["nnodes_must_divide_world_size"] == (True if multi_node else None)
        assert ("--data-parallel-size" in data["flags"]) == release.v1_engine
    elif engine == "sglang":
        assert release.reserved_min_gib_large_gpu == pairings["mem_fraction_static_reserve_min_gib_large_gpu"]
        assert release.launcher == ("sglang", "serve") and pairings["serve_subcommand"]
    else:
        assert release.tp_may_exceed_query_groups == pairings["tp_may_exceed_query_groups"]


def test_the_defaults_are_the_newest_releases():
    newest = {engine: max(releases, key=lambda v: [int(p) if p.isdigit() else p
                                                  for p in v.replace("core_v", "").replace("post", "").split(".")])
              for engine, releases in RELEASES.items()}
    assert vars(EngineVersions()) == newest


def serve_problems(model_name: str, cluster_name: str, versions: EngineVersions, engine_check) -> list[str]:
    plan = plan_serving(resolve_model(model_name), resolve_cluster(cluster_name),
                        ServeRequest(engine_versions=versions))
    problems = []
    for engine in SERVE_ENGINES:
        ranked = launchable(plan)
        for result in ranked.layouts:
            for step in launch_steps(ranked, result, engine, "MODEL"):
                problems += [f"{model_name} {cluster_name} {engine} {result.layout}: {p}"
                             for p in engine_check(step.argv, versions)]
    return problems


@pytest.mark.parametrize("model_name", shipped_models())
def test_serving_commands_start_on_every_shipped_cluster(model_name, engine_check):
    problems = []
    for cluster_name in shipped_clusters():
        problems += serve_problems(model_name, cluster_name, EngineVersions(), engine_check)
    assert problems == []


@pytest.mark.parametrize("vllm", list(RELEASES["vllm"]))
def test_serving_commands_start_on_each_vllm_release(vllm, engine_check):
    versions = EngineVersions(vllm=vllm)
    problems = []
    for model_name, cluster_name in [("llama-3.1-70b", "2x8xA100"), ("llama-3.1-405b", "4x8xH100"),
                                     ("llama-3.1-70b-fp8", "1x8xH100"), ("mixtral-8x7b", "1x8xMI300X")]:
        problems += serve_problems(model_name, cluster_name, versions, engine_check)
    assert problems == []


TRAIN_CASES = [("llama-3.1-8b", "1x8xH100"), ("llama-3.1-70b", "4x8xH100"), ("mixtral-8x7b", "4x8xH100"),
               ("qwen2.5-72b", "4x8xH100"), ("gpt3-175b", "16x8xA100"), ("llama-3.1-405b", "32x8xH100")]
"""Models whose KV heads and layer counts differ (8 KV groups, MHA, MoE, qkv bias, learned positions)."""


ZEROS, RECOMPUTES, SCHEDULES = (0, 1, 2, 3), ("none", "selective", "full"), ("gpipe", "1f1b", "interleaved")
OPTION_PAIRS = [(zero, recompute, SCHEDULES[(z + r) % 3])
                for z, zero in enumerate(ZEROS) for r, recompute in enumerate(RECOMPUTES)]
"""12 of the 36 (--zero, --recompute, --schedule) triples holding every pair of two options'
values: every (zero, recompute) once, and for each zero (recompute) the schedule runs over all
three as the recompute (zero) does (schedule index = zero index + recompute index, mod 3). The
flags each option emits interact in pairs (ZeRO with the schedule's overlap flags, recompute
with the schedule's virtual stages); the 36 searches took 30 s of the suite."""


def test_option_pairs_cover_every_pair() -> None:
    for first, second in itertools.combinations(range(3), 2):
        assert {(t[first], t[second]) for t in OPTION_PAIRS} == set(itertools.product(
            *((ZEROS, RECOMPUTES, SCHEDULES)[i] for i in (first, second))))
    assert len(OPTION_PAIRS) == 12


@pytest.mark.parametrize("megatron", list(RELEASES["megatron"]))
@pytest.mark.parametrize("model_name, cluster_name", TRAIN_CASES)
def test_training_commands_start_with_every_option(model_name, cluster_name, megatron, engine_check):
    """--zero 0-3, --recompute and --schedule, every pair of their values (OPTION_PAIRS), every
    feasible configuration's command."""
    from planner.emit.megatron import megatron_steps

    model, cluster = resolve_model(model_name), resolve_cluster(cluster_name)
    versions = EngineVersions(megatron=megatron)
    problems, commands = [], 0
    for zero, recompute, schedule in OPTION_PAIRS:
        request = TrainRequest(global_batch=512, seq_len=4096, zero_stage=zero, recompute=recompute,
                               schedule=schedule, engine_versions=versions)
        plan = train_launchable(model, search(model, cluster, request))
        for estimate in plan.layouts:
            for step in megatron_steps(model, cluster, estimate.config, 512, 4096, versions.megatron_release):
                commands += 1
                problems += [f"{model_name} {estimate.config}: {p}" for p in engine_check(step.argv, versions)]
    assert commands and problems == []


@pytest.mark.parametrize("megatron", list(RELEASES["megatron"]))
def test_deepep_commands_start(megatron, engine_check):
    """--moe-dispatcher deepep: every feasible configuration's command (EP 2-16 of Qwen3-30B-A3B
    on two H100 nodes, the flex dispatcher on DeepEP) starts at each release, and
    --moe-dispatcher alltoall keeps the alltoall dispatcher and no DeepEP flag. DeepEP is
    --moe-flex-dispatcher-backend deepep at core_v0.19.0 (whose TransformerConfig calls
    --moe-enable-deepep deprecated), --moe-enable-deepep at core_v0.14.0 (no backend flag)."""
    from planner.emit.megatron import megatron_steps

    model, cluster = resolve_model("qwen3-30b-a3b"), resolve_cluster("2x8xH100")
    versions = EngineVersions(megatron=megatron)
    for dispatcher in ("deepep", "alltoall"):
        request = TrainRequest(global_batch=256, seq_len=4096, engine_versions=versions, moe_dispatcher=dispatcher)
        plan = train_launchable(model, search(model, cluster, request))
        problems, degrees = [], set()
        for estimate in plan.layouts:
            (step,) = megatron_steps(model, cluster, estimate.config, 256, 4096, versions.megatron_release)
            problems += [f"{estimate.config}: {p}" for p in engine_check(step.argv, versions)]
            if estimate.config.ep > 1:
                degrees.add(estimate.config.ep)
                expected = "flex" if dispatcher == "deepep" else "alltoall"
                assert step.argv[step.argv.index("--moe-token-dispatcher-type") + 1] == expected
                new_flag = megatron == "core_v0.19.0"
                assert ("--moe-enable-deepep" in step.argv) == (dispatcher == "deepep" and not new_flag)
                backend = "--moe-flex-dispatcher-backend"
                assert (backend in step.argv) == (dispatcher == "deepep" and new_flag)
                assert backend not in step.argv or step.argv[step.argv.index(backend) + 1] == "deepep"
        assert problems == [] and {2, 4, 8, 16} <= degrees


@pytest.mark.parametrize("megatron", list(RELEASES["megatron"]))
def test_outputs_recompute_commands_start(megatron, engine_check):
    """--recompute outputs: --recompute-granularity selective --recompute-modules with the
    modules the model frees (DeepSeek-V3: moe_act layernorm mla_up_proj; TransformerConfig
    allows them with --moe-grouped-gemm and MLA), every feasible configuration, each release."""
    from planner.emit.megatron import megatron_steps

    model, cluster = resolve_model("deepseek-v3"), resolve_cluster("32x8xH100")
    versions = EngineVersions(megatron=megatron)
    request = TrainRequest(global_batch=1024, seq_len=4096, recompute="outputs", engine_versions=versions)
    plan = train_launchable(model, search(model, cluster, request))
    problems = []
    for estimate in plan.layouts:
        (step,) = megatron_steps(model, cluster, estimate.config, 1024, 4096, versions.megatron_release)
        problems += [f"{estimate.config}: {p}" for p in engine_check(step.argv, versions)]
        i = step.argv.index("--recompute-modules")
        assert step.argv[i + 1:i + 4] == ("moe_act", "layernorm", "mla_up_proj") and "--moe-grouped-gemm" in step.argv
    assert plan.layouts and problems == []


@pytest.mark.parametrize("megatron", list(RELEASES["megatron"]))
def test_context_parallel_commands_start(megatron, engine_check):
    """Long sequences: every feasible configuration's command, cp 1 to 4 (--context-parallel-size,
    --cp-comm-type p2p; arguments.py at each release), and CUDA_DEVICE_MAX_CONNECTIONS=1 with
    cp > 1 even at tp = 1 (validate_args asserts it for TP or CP before Blackwell) unless
    Megatron-FSDP shards (ZeRO-2/3), which asserts it is not 1."""
    from planner.emit.megatron import megatron_steps

    model, cluster = resolve_model("llama-3.1-8b"), resolve_cluster("2x8xH100")
    versions = EngineVersions(megatron=megatron)
    request = TrainRequest(global_batch=16, seq_len=16384, engine_versions=versions)
    plan = train_launchable(model, search(model, cluster, request))
    problems, degrees = [], set()
    for estimate in plan.layouts:
        degrees.add(estimate.config.cp)
        (step,) = megatron_steps(model, cluster, estimate.config, 16, 16384, versions.megatron_release)
        problems += [f"{estimate.config}: {p}" for p in engine_check(step.argv, versions)]
        if estimate.config.cp > 1:
            assert "--context-parallel-size" in step.argv
            # Megatron-FSDP asserts the opposite (arguments.py: "FSDP requires
            # CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset"; TP/CP with it only warn)
            fsdp = estimate.config.zero_stage >= 2
            assert ("CUDA_DEVICE_MAX_CONNECTIONS=1" in step.argv) == (not fsdp)
    assert degrees == {1, 2, 4} and problems == []


def test_old_megatron_refuses_tp_above_the_query_groups(run_plan):
    """core_v0.14.0: 8 KV groups and tp=16 is rejected with the reason; the default release takes it."""
    args = ("--workload", "train", "--model", "llama-3.1-70b", "--cluster", "4x8xH100", "--global-batch", "512",
            "--seq-len", "4096", "--layout", "tp=16", "--show-rejected")
    old = run_plan(*args, "--engine-version", "megatron=core_v0.14.0")
    assert old.returncode == 1 and "divisible by tp=16" in old.stdout
    assert run_plan(*args).returncode == 0


def test_unknown_engine_version_is_one_line_and_exit_2(run_plan):
    result = run_plan("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--engine-version", "vllm=0.1.0")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "known: 0.33.0" in result.stderr


def test_an_engine_named_twice_is_refused(run_plan):
    """Two versions of one engine are a contradiction, not a silent last-one-wins."""
    result = run_plan("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--engine-version", "vllm=0.22.0,vllm=0.33.0")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "--engine-version: vllm given twice (0.22.0 and 0.33.0)" in result.stderr


OLD_COMMANDS = {
    "sglang: --dp-size > 1 with --nnodes > 1":
        "python -m sglang.launch_server --model-path M --tp-size 8 --pp-size 4 --dp-size 512 --nnodes 2048 "
        "--node-rank 0 --dist-init-addr HEAD_IP:5000",
    "megatron: TP > 1 without CUDA_DEVICE_MAX_CONNECTIONS=1":
        "torchrun --standalone --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 8 "
        "--num-attention-heads 32 --group-query-attention --num-query-groups 8",
    "megatron: --overlap-moe-expert-parallel-comm with CUDA_DEVICE_MAX_CONNECTIONS=1":
        "env CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --standalone --nproc-per-node 8 pretrain_gpt.py "
        "--tensor-model-parallel-size 2 --expert-model-parallel-size 4 --overlap-moe-expert-parallel-comm "
        "--num-attention-heads 32",
    "megatron: Megatron-FSDP needs --ckpt-format fsdp_dtensor and CUDA_DEVICE_MAX_CONNECTIONS != 1":
        "torchrun --standalone --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 1 "
        "--use-megatron-fsdp --num-attention-heads 32",
    "megatron core_v0.14.0: num_query_groups 8 vs tp=16":
        "env CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py "
        "--tensor-model-parallel-size 16 --num-attention-heads 64 --num-query-groups 8",
    "vllm 0.33.0: --quantization fp8 is deprecated, use fp8_per_tensor":
        "vllm serve M --tensor-parallel-size 4 --quantization fp8",
    "vllm 0.33.0: unknown flag --tensor-parallel":
        "vllm serve M --tensor-parallel 4",
    "vllm 0.33.0: --kv-cache-dtype bf16 not in":
        "vllm serve M --kv-cache-dtype bf16",
}


@pytest.mark.parametrize("problem", OLD_COMMANDS)
def test_the_check_catches_what_failed_before(problem, engine_check):
    """The commands the engines refused, as the planner used to emit them (or a flag typo)."""
    import shlex

    found = engine_check(shlex.split(OLD_COMMANDS[problem]), EngineVersions(megatron="core_v0.14.0"))
    assert any(p.startswith(problem) for p in found), found
