"""vLLM's V0 engine (`--engine-version vllm=0.6.6.post1`): its KV-cache accounting, batch defaults,
refusals and launch commands, each read from that release's wheel (planner/engines.py names the
files). What changes against V1 (docs/cost-model.md, Serving: memory):
- the CUDA-graph pool is not set aside before the KV cache is sized (graphs are captured after);
- max_num_seqs 256 on every GPU; chunked prefill by default only above a 32K max model length
  (budget 2,048), else no chunking and a budget of max(max_model_len, 2,048), which the profile
  run's activation peak is sized with;
- no data or expert parallelism, no disaggregated serving, no --speculative-config, no MLA.
"""

from __future__ import annotations

import pytest

from planner.catalog import resolve_cluster, resolve_model
from planner.cost.efficiency import CUDA_CONTEXT_BYTES, CUDA_GRAPH_BYTES, KV_BLOCK_SIZE_TOKENS
from planner.engines import EngineVersions, v0_chunked_prefill_by_default, v0_max_num_batched_tokens
from planner.errors import SpecError
from planner.layout import Layout, Rejected
from planner.requests import LayoutFilter, ServeRequest, Speculation
from planner.serve import estimate
from planner.serve_cli import launch_steps
from planner.serve_search import plan_serving
from planner.units import BYTES_PER_GIB

V0 = EngineVersions(vllm="0.6.6.post1")
V1 = EngineVersions()
PROMPT = ["vllm", "serve", "MODEL"]


def test_v0_budget_rule_by_hand():
    """SchedulerConfig.__post_init__ / EngineArgs.create_engine_config at 0.6.6.post1."""
    assert v0_chunked_prefill_by_default(131072, sliding_window=False, speculative=False)
    assert not v0_chunked_prefill_by_default(32768, sliding_window=False, speculative=False)  # > 32K only
    assert not v0_chunked_prefill_by_default(131072, sliding_window=True, speculative=False)
    assert not v0_chunked_prefill_by_default(131072, sliding_window=False, speculative=True)
    assert v0_max_num_batched_tokens(131072, chunked_prefill=True) == 2048
    assert v0_max_num_batched_tokens(8192, chunked_prefill=False) == 8192
    assert v0_max_num_batched_tokens(1024, chunked_prefill=False) == 2048  # max(max_model_len, 2048)


def stage(model_name: str, versions: EngineVersions, **request):
    model, cluster = resolve_model(model_name), resolve_cluster("1x1xH100")
    result = estimate(model, cluster, Layout(1, 1, 1), ServeRequest(engine_versions=versions, **request))
    assert not isinstance(result, Rejected), result
    return result.stages[0]


def test_kv_cache_of_llama_8b_on_one_h100_by_hand():
    """Llama-3.1-8B, 1 x H100 (79.11 GiB CUDA-visible), gpu_memory_utilization 0.9, max model
    length 131,072 (its own), KV 131,072 B per token (32 layers x 2 x 8 heads x 128 x 2 B).

    budget  = 79.11 GiB x 0.9                                   = 76,449,344,126.98 B
    weights = 16,060,522,496 B (8.03B params in bf16)
    V0: chunked prefill (131,072 > 32K), budget T = 2,048, max_num_seqs 256
      forward  = T x 131,072 B (one layer's buffers per token)  =    268,435,456 B
      sampler  = T x 4,096 x 2 + 256 x 128,256 x (2 + 3 x 4)     =    476,446,720 B  <- the peak
      overhead = CUDA context 500 MiB (no graph pool: captured after the KV cache)
      KV = 76,449,344,126.98 - 16,060,522,496 - 476,446,720 - 524,288,000 = 59,388,086,910.98 B
         -> floor(/ (131,072 x 16)) = 28,318 blocks = 453,088 tokens
    V1 (0.33.0): T = 8,192: forward 1,073,741,824 B is the peak; overhead + the 1 GiB graph pool
      KV = 76,449,344,126.98 - 16,060,522,496 - 1,073,741,824 - 1,598,029,824 = 57,717,049,982.98 B
         -> 27,521 blocks = 440,336 tokens (V0 holds 12,752 more, 2.9%)."""
    v0, v1 = stage("llama-3.1-8b", V0), stage("llama-3.1-8b", V1)
    assert v0.weights_bytes == v1.weights_bytes == 16_060_522_496
    assert v0.activation_bytes == 2048 * 4096 * 2 + 256 * 128256 * (2 + 3 * 4) == 476_446_720
    assert v0.overhead_bytes == CUDA_CONTEXT_BYTES == 524_288_000
    assert v1.activation_bytes == 8192 * 131072 and v1.overhead_bytes == CUDA_CONTEXT_BYTES + CUDA_GRAPH_BYTES
    budget = 79.11 * BYTES_PER_GIB * 0.9
    assert v0.kv_cache_bytes == pytest.approx(budget - 16_060_522_496 - 476_446_720 - 524_288_000)
    assert (v0.kv_cache_tokens, v1.kv_cache_tokens) == (28_318 * KV_BLOCK_SIZE_TOKENS, 27_521 * KV_BLOCK_SIZE_TOKENS)
    assert v0.kv_cache_tokens - v1.kv_cache_tokens == 12_752


def test_without_chunked_prefill_the_profile_runs_the_whole_max_model_len():
    """--max-model-len 32768 (not above 32K): no chunking, T = 32,768 tokens in one forward,
    32,768 x 131,072 B = 4 GiB of activation peak (V1 keeps its 8,192-token budget: 1 GiB)."""
    v0 = stage("llama-3.1-8b", V0, max_model_len=32768)
    assert v0.activation_bytes == 32768 * 131072 == 4 * BYTES_PER_GIB
    assert stage("llama-3.1-8b", V1, max_model_len=32768).activation_bytes == BYTES_PER_GIB


def commands(model: str, cluster: str, versions: EngineVersions = V0, layout: dict | None = None, **request):
    plan = plan_serving(resolve_model(model), resolve_cluster(cluster),
                        ServeRequest(engine_versions=versions, layout=LayoutFilter(**(layout or {})), **request))
    assert plan.recommended is not None, plan.rejected
    return plan, launch_steps(plan, plan.recommended, "vllm", "MODEL")


def test_replicas_are_independent_servers_side_by_side(engine_check):
    """tp 2 x 4 replicas on one node: four `vllm serve` on GPUs 0-1, 2-3, 4-5, 6-7, ports
    8000-8003 (V0 has no --data-parallel-size), each with V0's defaults made explicit where the
    plan differs: 256 sequences, chunked prefill at the 131,072 max model length."""
    plan, steps = commands("llama-3.1-8b", "1x8xH100", layout={"tp": 2, "dp": 4}, batch=128)
    assert len(steps) == 4
    for slot, step in enumerate(steps):
        argv = list(step.argv)
        assert argv[:2] == ["env", f"CUDA_VISIBLE_DEVICES={2 * slot},{2 * slot + 1}"]
        assert argv[argv.index("--port") + 1] == str(8000 + slot)
        assert "--data-parallel-size" not in argv and "--enable-chunked-prefill" in argv
        assert engine_check(argv, V0) == [], step.shell()


def test_a_replica_wider_than_a_node_runs_on_ray(engine_check):
    """Llama-3.1-405B tp 8 x pp 2 over two nodes: V0 has no --nnodes/--headless, so the one
    launch is Ray's, with or without --emit vllm-ray."""
    _, steps = commands("llama-3.1-405b", "2x8xH100", layout={"tp": 8, "pp": 2}, batch=32, max_model_len=16384)
    assert [step.argv[:2] for step in steps] == [("ray", "start")] * 2 + [("vllm", "serve")]
    serve = list(steps[-1].argv)
    assert serve[serve.index("--distributed-executor-backend") + 1] == "ray"
    assert "--nnodes" not in serve and "--enable-chunked-prefill" not in serve  # 16,384: V0 does not chunk
    for step in steps:
        assert engine_check(step.argv, V0) == [], step.shell()


def test_a_budget_below_the_max_model_len_brings_chunked_prefill(engine_check):
    """--max-num-batched-tokens 4096 at --max-model-len 8192: V0 refuses to start unless chunked
    prefill is on (SchedulerConfig._verify_args), so the command turns it on; at 8,192 it stays off."""
    _, steps = commands("llama-3.1-8b", "1x8xH100", layout={"tp": 8}, batch=64, max_model_len=8192,
                        max_num_batched_tokens=4096)
    (step,) = steps
    assert "--enable-chunked-prefill" in step.argv and "4096" in step.argv
    assert engine_check(step.argv, V0) == []
    _, (plain,) = commands("llama-3.1-8b", "1x8xH100", layout={"tp": 8}, batch=64, max_model_len=8192)
    assert "--enable-chunked-prefill" not in plain.argv and "--max-num-batched-tokens" not in plain.argv


def test_moe_replicas_plan_without_expert_parallelism():
    """Mixtral on 8 H100 under V0: every layout ep = 1 (no --enable-expert-parallel there)."""
    plan, steps = commands("mixtral-8x7b", "1x8xH100")
    assert {r.layout.ep for r in plan.layouts} == {1}
    assert all("--enable-expert-parallel" not in step.argv for step in steps)


@pytest.mark.parametrize("model, request_fields, words", [
    ("deepseek-v3", {}, "multi-head latent attention"),
    ("mixtral-8x7b", {"layout": LayoutFilter(ep=8)}, "--layout ep=8"),
    ("llama-3.1-8b", {"mode": "disaggregated"}, "--mode disaggregated"),
    ("llama-3.1-8b", {"speculation": Speculation("ngram", 3, (0.6, 0.4, 0.2))}, "--speculative-method"),
    ("gpt-oss-120b", {}, "mxfp4 weights"),
    # vllm/model_executor/models/registry.py at 0.6.6.post1 has neither family
    ("qwen3-30b-a3b", {}, "per-head query/key RMSNorm"),
    ("qwen3-32b", {}, "no Qwen3ForCausalLM"),
    ("llama-4-scout", {}, "chunked local attention"),
])
def test_what_v0_lacks_is_a_usage_error(model, request_fields, words):
    with pytest.raises(SpecError, match=words):
        plan_serving(resolve_model(model), resolve_cluster("1x8xH200"),
                     ServeRequest(engine_versions=V0, **request_fields))


def test_cli_names_the_release_and_what_is_priced_as_v1(run_plan):
    result = run_plan("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--engine-version", "vllm=0.6.6.post1")
    assert result.returncode == 0, result.stderr
    assert "Launch (vllm 0.6.6.post1)" in result.stdout
    assert "V0 engine" in result.stdout and "independent vLLM servers" in result.stdout
    refused = run_plan("--model", "deepseek-v3", "--cluster", "1x8xH200", "--engine-version", "vllm=0.6.6.post1")
    assert refused.returncode == 2 and "V0 engine has no multi-head latent attention" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr


@pytest.mark.parametrize("archs, capability, runs", [
    (((8, 0),), 8.6, True),  # sm_80 SASS runs on an 8.6 (same major, minor at or above)
    (((8, 6),), 8.0, False),  # not below its minor
    (((8, 9),), 9.0, False),  # nor on another major
    (((7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0)), 10.0, False),  # 0.6.6.post1 on a B200
    (((9, 0), (10, 0), (12, 0)), 12.0, True),
])
def test_which_gpus_a_wheels_kernels_run_on(archs, capability, runs):
    from planner.engines import runs_kernels_for

    assert runs_kernels_for(archs, capability) is runs


@pytest.mark.parametrize("cluster", ["1x8xB200", "1x2xRTX-5090", "1x1xRTX-PRO-6000", "1x4xGB200"])
def test_the_v0_wheel_has_no_blackwell_kernels(cluster):
    """vllm 0.6.6.post1's wheel carries SASS for sm_70 to sm_90 only (tools/wheel_kernel_archs.py);
    the releases from 0.22.0 on carry sm_100 and sm_120."""
    with pytest.raises(SpecError, match="its wheel's CUDA kernels are built for compute capability 7.0, 7.5, "
                                        "8.0, 8.6, 8.9, 9.0, and the .* is 1[02].0"):
        plan_serving(resolve_model("llama-3.1-8b"), resolve_cluster(cluster), ServeRequest(engine_versions=V0))
    for release in ("0.22.0", "0.33.0"):
        plan = plan_serving(resolve_model("llama-3.1-8b"), resolve_cluster(cluster),
                            ServeRequest(engine_versions=EngineVersions(vllm=release)))
        assert plan.recommended is not None
    # Ampere, Ada and Hopper run it
    for older in ("1x1xA100", "1x1xRTX-4090", "1x1xH100"):
        plan_serving(resolve_model("llama-3.1-8b"), resolve_cluster(older),
                     ServeRequest(engine_versions=V0, max_model_len=8192))
