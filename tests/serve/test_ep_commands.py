"""Expert-parallel launch commands cover the layout: on every node the GPUs its command takes
(vLLM tp * pp * the DP ranks it holds; SGLang tp_size * pp_size / nnodes, times --dp-size
only without DP attention) add up, over every step and node, to the layout's GPUs, and each
deployment's expert-parallel degree (vLLM tp * --data-parallel-size with
--enable-expert-parallel; SGLang --ep-size) is the layout's ep."""

from __future__ import annotations

import pytest

from planner.serve_cli import launch_steps, launchable

EP_CASES = [
    ("deepseek-v3", "1x8xH200", {}),
    ("deepseek-v3", "2x8xH100", {}),
    ("deepseek-v3", "4x8xH100", {}),
    ("qwen3-30b-a3b", "1x8xH100", {}),
    ("qwen3-30b-a3b", "2x8xH100", {}),
    ("qwen3-30b-a3b", "1x8xH100", {"tp": 1, "ep": 4}),
    ("qwen3-30b-a3b", "2x8xH100", {"tp": 2, "ep": 2}),
    ("mixtral-8x7b", "4x8xH100", {}),
]
"""The search's own EP layouts (no filter) and groups that share a node (--layout)."""


def _value(argv: tuple[str, ...], flag: str, default: int = 1) -> int:
    return int(argv[argv.index(flag) + 1]) if flag in argv else default


def vllm_gpus_per_node(argv: tuple[str, ...]) -> int:
    tp, pp = _value(argv, "--tensor-parallel-size"), _value(argv, "--pipeline-parallel-size")
    dp = _value(argv, "--data-parallel-size")
    if "--nnodes" in argv:
        return tp * pp * dp // _value(argv, "--nnodes")
    return tp * pp * _value(argv, "--data-parallel-size-local", dp)


def vllm_ep(argv: tuple[str, ...]) -> int:
    assert "--enable-expert-parallel" in argv
    return _value(argv, "--tensor-parallel-size") * _value(argv, "--data-parallel-size")


def sglang_gpus_per_node(argv: tuple[str, ...]) -> int:
    gpus = _value(argv, "--tp-size") * _value(argv, "--pp-size") // _value(argv, "--nnodes")
    dp_attention = "--enable-dp-attention" in argv or "--attn-dp-size" in argv
    return gpus if dp_attention else gpus * _value(argv, "--dp-size")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("model_name, cluster_name, layout", EP_CASES)
def test_ep_commands_multiply_to_the_layouts_gpus(engine, model_name, cluster_name, layout, serve_plan):
    plan = launchable(serve_plan(model_name, cluster_name, layout=layout))
    ep_layouts = [r for r in plan.layouts if r.layout.ep > 1]
    assert ep_layouts, f"no EP layout for {model_name} on {cluster_name}"
    server = "vllm" if engine == "vllm" else "sglang"
    gpus_per_node, ep_of = ((vllm_gpus_per_node, vllm_ep) if engine == "vllm"
                            else (sglang_gpus_per_node, lambda argv: _value(argv, "--ep-size")))
    for result in ep_layouts:
        steps = [s for s in launch_steps(plan, result, engine, "MODEL") if server in s.argv[:3]]
        gpus = sum(step.nodes.count * gpus_per_node(step.argv) for step in steps)
        assert gpus == result.layout.num_gpus, (result.layout, [s.shell() for s in steps])
        assert {ep_of(step.argv) for step in steps} == {result.layout.ep}, result.layout


def test_each_ep_group_is_its_own_deployment(serve_plan):
    """qwen3-30b-a3b tp=1 dp=16 ep=8 on 2x8xH100: two EP groups, one per node, neither naming
    the other (no DP address, no --nnodes); SGLang puts the router in front of both."""
    plan = launchable(serve_plan("qwen3-30b-a3b", "2x8xH100", layout={"tp": 1, "dp": 16, "ep": 8}))
    (vllm,) = launch_steps(plan, plan.recommended, "vllm", "MODEL")
    assert list(vllm.nodes) == [0, 1] and "--nnodes" not in vllm.argv
    assert "--data-parallel-address" not in vllm.argv and _value(vllm.argv, "--data-parallel-size") == 8
    server, router = launch_steps(plan, plan.recommended, "sglang", "MODEL")
    assert list(server.nodes) == [0, 1] and router.role == "router"


@pytest.mark.parametrize("tp, dp, ep, reasons", [
    (1, 24, 12, ["EP groups of 12 GPUs would share nodes of 8"]),
    (1, 24, 6, ["EP groups of 6 GPUs would share nodes of 8"]),
    (1, 32, 16, []),
    (1, 24, 24, []),
    (1, 24, 8, []),
    (2, 12, 2, []),
    (1, 24, 4, []),
])
def test_ep_groups_straddling_nodes_are_refused(tp, dp, ep, reasons):
    """Nodes of 8 GPUs: an EP group is one deployment, so several of them fill whole nodes
    each or pack whole into one; a single group may span them all."""
    from planner.emit.command import placement_reasons

    assert placement_reasons(tp, 1, dp, 8, ep) == reasons


def test_ep_groups_of_several_nodes_expand_per_node():
    """tp=1 dp=32 ep=16 on 4x8 (vLLM): two EP groups of 2 nodes; expanded by a real shell
    (NODE_RANK, REPLICA_HEAD_IP set per node), node n serves DP ranks from (n % 2) * 8 of the
    group headed by node n - n % 2, and only group heads are not headless."""
    import subprocess
    from dataclasses import replace

    from planner.emit.command import ServeArgs
    from planner.emit.vllm import vllm_steps
    from planner.engines import EngineVersions

    args = ServeArgs(model="M", tp=1, pp=1, dp=32, ep=16, gpus_per_node=8, gpu_memory_utilization=0.9,
                     max_model_len=8192, max_num_seqs=64, quantization=None, kv_cache_dtype="auto",
                     dtype="bfloat16", engine_versions=EngineVersions(), max_num_batched_tokens=None,
                     gpu_memory_bytes=80 * 2**30, weights_and_kv_bytes_per_gpu=60 * 2**30)
    seen = {}
    for step in vllm_steps(args):
        for node in step.nodes:
            script = f"NODE_RANK={node}; REPLICA_HEAD_IP=10.0.{node // 2}.1; printf '%s\\n' {step.shell()}"
            seen[node] = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                                        check=True).stdout.split()
    assert sorted(seen) == [0, 1, 2, 3]
    for node, argv in seen.items():
        assert argv[argv.index("--data-parallel-address") + 1] == f"10.0.{node // 2}.1"
        assert argv[argv.index("--data-parallel-size") + 1] == "16"
        assert ("--headless" in argv) == bool(node % 2)
        assert _value(tuple(argv), "--data-parallel-start-rank", 0) == node % 2 * 8
    assert vllm_steps(replace(args, ep=32))[0].argv.count("$REPLICA_HEAD_IP") == 0


def test_moe_replicas_without_ep_are_deployments_apart(serve_plan):
    """Mixtral tp=2 dp=4 (no EP) on one H100 node: one vLLM deployment with
    --data-parallel-size 4 would split the experts over all 8 GPUs (FusedMoEParallelConfig at
    0.33.0) and step the ranks together, not the four 2-GPU replicas priced; so four servers,
    GPUs 0-1, 2-3, 4-5, 6-7 on ports 8000-8003, none with DP flags. A dense model keeps one
    deployment of four DP ranks behind one address."""
    plan = launchable(serve_plan("mixtral-8x7b", "1x8xH100", layout={"tp": 2, "dp": 4, "ep": 1}))
    steps = launch_steps(plan, plan.recommended, "vllm", "MODEL")
    assert len(steps) == 4
    for slot, step in enumerate(steps):
        assert f"CUDA_VISIBLE_DEVICES={2 * slot},{2 * slot + 1}" in step.shell()
        assert "--data-parallel-size" not in step.argv and _value(step.argv, "--port") == 8000 + slot
    dense = launchable(serve_plan("llama-3.1-8b", "1x8xH100", layout={"tp": 2, "dp": 4}))
    (one,) = launch_steps(dense, dense.recommended, "vllm", "MODEL")
    assert _value(one.argv, "--data-parallel-size") == 4


def test_sglang_servers_side_by_side_keep_their_zmq_ports_apart(serve_plan):
    """Qwen3-30B-A3B tp=1 dp=8 ep=2 on one H100 node: four attention-DP servers. Each binds
    --port + 233 .. + 239 besides --port (SGLang 0.5.23 PortArgs.init_new), so their --port
    values are 10 apart (30000, 30010, 30020, 30030): no server's block or HTTP port meets
    another's. Each runs the priced budget on each of its 2 DP ranks: --chunked-prefill-size
    2 x 8,192 (SGLang divides it by the DP ranks)."""
    plan = launchable(serve_plan("qwen3-30b-a3b", "1x8xH100", layout={"tp": 1, "dp": 8, "ep": 2}), "sglang")
    steps = [s for s in launch_steps(plan, plan.recommended, "sglang", "MODEL") if s.role == "server"]
    ports = [_value(s.argv, "--port") for s in steps]
    assert ports == [30000, 30010, 30020, 30030]
    used = [set(range(p + 233, p + 240)) | {p} for p in ports]
    assert all(not (used[i] & used[j]) for i in range(4) for j in range(i + 1, 4))
    assert all(_value(s.argv, "--chunked-prefill-size") == 2 * 8192 for s in steps)
