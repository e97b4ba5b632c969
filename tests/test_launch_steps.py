"""Launch steps per role: what each node runs, expanded by a real shell, equals the
per-node command it ran before roles; the node sets cover every node once; the JSON of a
plan does not grow with the node count; torchrun's flags and the emitter registry have
one home each."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.cli import Emit, app
from planner.emit import SERVE_EMITTERS, TRAIN_EMITTERS
from planner.emit.command import LaunchStep, NodeSet, PerNode, ServeArgs, shell_join
from planner.emit.torchrun import torchrun_flags
from planner.engines import EngineVersions

MODEL_ARG = "/models/Llama 3.1; rm -rf ~"
"""A model path the shell must keep as one argument, beside the per-node expansions."""
ARGS = ServeArgs(model=MODEL_ARG, tp=8, pp=1, dp=1, gpus_per_node=8, gpu_memory_utilization=0.9,
                 max_model_len=8192, max_num_seqs=64, quantization=None, kv_cache_dtype="auto",
                 dtype="bfloat16", engine_versions=EngineVersions(), max_num_batched_tokens=None,
                 gpu_memory_bytes=80 * 2**30, weights_and_kv_bytes_per_gpu=60 * 2**30)


def replica_address(replica: int) -> str:
    return f"10.0.{replica}.1"


def expand_in_shell(step: LaunchStep, nodes: list[int], nodes_per_replica: int) -> dict[int, list[str]]:
    """The argv each node's shell runs: NODE_RANK and REPLICA_HEAD_IP set as the docs say."""
    script = "".join(
        f"NODE_RANK={n}; REPLICA_HEAD_IP={replica_address(n // nodes_per_replica)}; "
        f"printf '%s\\0' {step.shell()} END\n" for n in nodes)
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    argvs = [chunk.strip("\0").split("\0") for chunk in out.split("\0END\0") if chunk]
    return dict(zip(nodes, argvs, strict=True))


def per_node(args: ServeArgs, engine: str) -> tuple[int, list[list[str]], int]:
    """(nodes per replica, each node's server argv written out node by node, the number of
    nodes): the reference the per-role steps must reproduce."""
    base = ["vllm", "serve", args.model, *_vllm_flags(args)]
    k = -(-args.tp * args.pp // args.gpus_per_node)
    if engine == "sglang":
        assert k > 1 and args.dp > 1
        server = [*SERVE_EMITTERS["sglang"](args)[0].argv[:-6]]
        return k, [[*server, "--nnodes", str(k), "--node-rank", str(n % k),
                    "--dist-init-addr", f"{replica_address(n // k)}:5000"] for n in range(k * args.dp)], k * args.dp
    if k > 1:
        dp = [] if args.dp == 1 else ["--data-parallel-size", str(args.dp), "--data-parallel-address", "HEAD_IP",
                                      "--data-parallel-rpc-port", "13345"]
        nodes = [[*base, *dp, "--nnodes", str(k * args.dp), "--node-rank", str(n), "--master-addr", "HEAD_IP",
                  "--master-port", "29501"] + (["--headless"] if n else []) for n in range(k * args.dp)]
        return k, nodes, k * args.dp
    per = args.gpus_per_node // (args.tp * args.pp)
    num_nodes = -(-args.dp // per)
    nodes = []
    for n in range(num_nodes):
        local = min(per, args.dp - n * per)
        nodes.append([*base, "--data-parallel-size", str(args.dp), "--data-parallel-size-local", str(local),
                      "--data-parallel-address", "HEAD_IP", "--data-parallel-rpc-port", "13345"]
                     + (["--headless", "--data-parallel-start-rank", str(n * per)] if n else []))
    return 1, nodes, num_nodes


def _vllm_flags(args: ServeArgs) -> list[str]:
    flags = ["--tensor-parallel-size", str(args.tp)]
    flags += ["--pipeline-parallel-size", str(args.pp)] if args.pp > 1 else []
    return flags + ["--dtype", args.dtype, "--gpu-memory-utilization", "0.9", "--max-model-len", "8192",
                    "--max-num-seqs", "64"]


MULTI_NODE = [
    pytest.param("vllm", replace(ARGS, pp=3), id="vllm-one-replica-of-3-nodes"),
    pytest.param("vllm", replace(ARGS, pp=3, dp=2), id="vllm-2-replicas-of-3-nodes"),
    pytest.param("vllm", replace(ARGS, pp=2, dp=5), id="vllm-5-replicas-of-2-nodes"),
    pytest.param("vllm", replace(ARGS, tp=4, dp=10), id="vllm-dp-2-per-node-on-5-nodes"),
    pytest.param("vllm", replace(ARGS, tp=4, dp=11), id="vllm-dp-last-node-half-full"),
    pytest.param("vllm", replace(ARGS, tp=2, dp=6), id="vllm-dp-2-nodes-last-half-full"),
    pytest.param("sglang", replace(ARGS, pp=2, dp=3), id="sglang-6-nodes"),
]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("engine, args", MULTI_NODE)
def test_each_node_runs_what_it_ran_per_node(engine, args):
    """Each node is in exactly one step, and that step's shell line, with the node's
    variables set, expands to the argv the node ran when commands were per node."""
    k, expected, num_nodes = per_node(args, engine)
    steps = [s for s in SERVE_EMITTERS[engine](args) if s.role != "router"]
    assert sorted(n for step in steps for n in step.nodes) == list(range(num_nodes))
    assert len(steps) <= 3
    for step in steps:
        got = expand_in_shell(step, list(step.nodes), k)
        for node, argv in got.items():
            assert argv == expected[node], (step.where, node)


@pytest.mark.parametrize("dp", [1, 3])
def test_ray_starts_once_per_node_and_serves_from_the_head(dp):
    """One Ray cluster over every node; the head serves the whole deployment (with dp > 1,
    vLLM's Ray DP backend places each DP rank across nodes: VLLM_RAY_DP_PACK_STRATEGY=span)."""
    args = replace(ARGS, pp=2, dp=dp)
    head_start, join, serve = SERVE_EMITTERS["vllm-ray"](args)
    assert sorted([*head_start.nodes, *join.nodes]) == list(range(2 * dp))
    assert list(serve.nodes) == list(head_start.nodes) == [0]
    assert head_start.argv == ("ray", "start", "--head", "--port", "6379")
    assert join.argv == ("ray", "start", "--address=HEAD_IP:6379")
    assert "--distributed-executor-backend" in serve.argv
    if dp > 1:
        assert serve.argv[:2] == ("env", "VLLM_RAY_DP_PACK_STRATEGY=span")
        assert serve.argv[-4:] == ("--data-parallel-size", "3", "--data-parallel-backend", "ray")


def test_one_node_is_one_step_without_variables():
    for engine, emitter in SERVE_EMITTERS.items():
        (step,) = emitter(replace(ARGS, tp=2, dp=4))
        assert (step.where, step.variables()) == ("node 0", []), engine
        assert step.shell() == shell_join(step.argv) and MODEL_ARG in step.argv


def test_node_sets_are_compact_at_any_scale():
    workers = NodeSet(1, 3, 4, 512)
    assert (workers.count, str(workers)) == (1536, "nodes 1-3, 5-7, ..., 2045-2047")
    assert str(NodeSet(0, 1, 4, 512)) == "nodes 0, 4, ..., 2044"
    assert str(NodeSet(1, 2047)) == "nodes 1-2047" and str(NodeSet(5)) == "node 5"
    assert list(NodeSet(1, 1, 2, 3)) == [1, 3, 5] and str(NodeSet(1, 1, 2, 3)) == "nodes 1, 3, 5"
    steps = SERVE_EMITTERS["sglang"](replace(ARGS, pp=4, dp=512))
    assert [(s.role, s.nodes) for s in steps] == [("replica head", NodeSet(0, 1, 4, 512)),
                                                  ("replica worker", workers), ("router", NodeSet(0))]
    steps = SERVE_EMITTERS["vllm"](replace(ARGS, pp=4, dp=512))
    assert [(s.role, s.nodes) for s in steps] == [("head", NodeSet(0)), ("worker", NodeSet(1, 2047))]


def test_only_per_node_elements_are_left_unquoted():
    argv = ("run", PerNode("$((NODE_RANK * 4))"), "$NODE_RANK", "a b")
    assert shell_join(argv) == "run $((NODE_RANK * 4)) '$NODE_RANK' 'a b'"


def _layout_bytes(*args: str) -> tuple[int, int]:
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    return len(out["layouts"]), len(json.dumps(out["recommended"]))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_serving_json_does_not_grow_with_the_node_count(engine):
    """tp=8 pp=4 replicas on 64 nodes and on 2,048: the same bytes per layout, within the
    digits of the larger numbers (one argv per node made it 32 times larger)."""
    common = ("--model", "llama-3.1-405b", "--layout", "tp=8,pp=4", "--max-model-len", "8192",
              "--batch", "32", "--emit", engine)
    _, small = _layout_bytes(*common, "--cluster", "64x8xH100")
    _, large = _layout_bytes(*common, "--cluster", "2048x8xH100")
    assert abs(large - small) < 0.02 * small, (small, large)


def test_training_json_does_not_grow_with_the_node_count():
    common = ("--workload", "train", "--model", "gpt3-175b", "--layout", "tp=8,pp=16", "--micro-batch", "1",
              "--schedule", "1f1b", "--recompute", "selective", "--zero", "1", "--seq-len", "2048",
              "--global-batch", "4096")
    _, small = _layout_bytes(*common, "--cluster", "256x8xA100")
    _, large = _layout_bytes(*common, "--cluster", "2048x8xA100")
    assert abs(large - small) < 0.02 * small, (small, large)


def test_torchrun_flags_have_one_home():
    """Megatron's launch and the probe's both come from planner.emit.torchrun."""
    from planner.catalog import resolve_cluster
    from planner.emit.megatron import torchrun_argv
    from planner.probe.launcher import CPU_SWEEP, ProbeOptions
    from planner.probe.launcher import torchrun_argv as probe_argv

    assert torchrun_flags(4) == ["--standalone", "--nproc-per-node", "4"]
    c10d = torchrun_flags(8, 16, rdzv_endpoint="HEAD_IP:29500", rdzv_id="plan-train")
    assert c10d == ["--nnodes", "16", "--nproc-per-node", "8", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", "HEAD_IP:29500", "--rdzv-id", "plan-train"]
    assert torchrun_argv(128, resolve_cluster("16x8xA100")) == ["torchrun", *c10d]
    static = ProbeOptions(nnodes=2, master_addr="h", node_rank=1, rdzv_conf="join_timeout=9")
    argv = probe_argv(static, 2, CPU_SWEEP, "r.json")
    flags = torchrun_flags(2, 2, master_addr="h", master_port=29500, node_rank=1, rdzv_conf="join_timeout=9")
    assert argv[3:3 + len(flags)] == flags
    assert flags[4:] == ["--node-rank", "1", "--master-addr", "h", "--master-port", "29500",
                         "--rdzv-conf", "join_timeout=9"]


def test_every_emit_choice_has_an_emitter():
    assert set(SERVE_EMITTERS) | set(TRAIN_EMITTERS) | {"none"} == {e.value for e in Emit}


@pytest.mark.parametrize("tp, pp, dp, reason", [
    (8, 2, 2, None),       # replicas of two whole nodes
    (2, 2, 4, None),       # replicas pack into a node
    (2, 3, 1, None),       # one replica of 6 GPUs on one node
    (2, 3, 4, "straddle"),  # 6-GPU replicas over 8-GPU nodes: one would cross a node boundary
    (2, 6, 2, "share"),    # 12-GPU replicas: the second would start half-way through node 1
    (4, 5, 1, "evenly"),   # 20 GPUs on 3 nodes: --nnodes 3 does not divide tp*pp
    (4, 3, 1, "splits its TP groups"),  # 12 GPUs, --nnodes 2: 6 a node, a TP group of 4 crosses
    (2, 6, 1, None),       # 12 GPUs, 6 a node: TP groups of 2 stay inside
    (16, 1, 1, None),      # a TP group of 16 over two whole nodes (across them by design)
])
def test_placements_the_engines_cannot_launch_are_refused(tp, pp, dp, reason):
    """planner/emit/command.py placement_reasons on 8-GPU nodes (both serving engines require
    nnodes to divide tp*pp, and a server owns whole nodes or packs into one)."""
    from planner.emit.command import placement_reasons

    reasons = placement_reasons(tp, pp, dp, 8)
    assert (reasons == []) if reason is None else (reason in reasons[0])


def test_refused_layouts_are_listed_with_their_reason(run_plan):
    out = run_plan("--model", "llama-3.1-70b", "--cluster", "3x8xH100", "--layout", "pp=3", "--max-model-len",
                   "8192", "--show-rejected")
    assert out.returncode == 0 and "replicas of 6 GPUs straddle nodes of 8" in out.stdout
    assert "Recommended: tp=8 pp=3 dp=1" in out.stdout


@given(st.lists(st.text(alphabet="ab-_=./:,@%+ '$\"", max_size=6), max_size=8))
def test_shell_join_quotes_as_shlex_does(argv: list[str]) -> None:
    """The fast path (nothing to quote: the argv joined) gives shlex's line for any argv."""
    assert shell_join(argv) == " ".join(shlex.quote(arg) for arg in argv)


def test_sglang_runs_what_its_capped_pool_holds():
    """An 80 GiB GPU with 16 GiB of weights and 56 GiB of KV on it, each sequence 0.17 GiB of
    KV: the plan runs 300 sequences. SGLang keeps out of --mem-fraction-static, at tp 1 on a
    60-90 GiB GPU (8,192 prefill tokens, 256 graph batches, 58 piecewise graphs): 512 MiB +
    1.5 x 8,192 + 2 x 256 + 1,024 / 8 + 8 x 58 = 13,904 MiB = 13.58 GiB (over its 10 GiB
    minimum), so the fraction is floor((80 - 13.58) / 80, 3 decimals) = 0.830 and its pool
    holds 0.83 x 80 - 16 = 50.4 GiB of KV: floor(50.4 / 0.17) = 296 sequences, which the
    command runs (and says so), not 300."""
    from planner.emit.sglang import max_running_requests, mem_fraction_static, sglang_pool_notes
    from planner.units import BYTES_PER_GIB

    args = replace(ARGS, tp=1, max_num_seqs=300, gpu_memory_bytes=80 * BYTES_PER_GIB,
                   weights_and_kv_bytes_per_gpu=72 * BYTES_PER_GIB, kv_cache_bytes_per_gpu=56 * BYTES_PER_GIB,
                   kv_bytes_per_sequence=0.17 * BYTES_PER_GIB)
    assert mem_fraction_static(args) == 0.83
    assert max_running_requests(args) == 296
    assert "296 running requests per server, not the 300" in sglang_pool_notes(args)[0]
    # a pool that holds them all changes nothing (and says nothing)
    roomy = replace(args, kv_bytes_per_sequence=0.1 * BYTES_PER_GIB)
    assert max_running_requests(roomy) == 300 and sglang_pool_notes(roomy) == []


def test_sglang_refuses_a_layout_whose_pool_holds_no_request():
    """The same GPU and reserve (fraction 0.830, 66.4 GiB of the 80), 66 GiB of weights: the
    pool is 0.4 GiB, less than one 0.5 GiB request: SGLang cannot serve it (pool_refusal),
    where max_running_requests' floor of 1 would have printed --max-running-requests 1. With
    60 GiB of weights the pool holds 6.4 GiB: served (12 requests)."""
    from planner.emit.sglang import max_running_requests, pool_refusal
    from planner.units import BYTES_PER_GIB

    args = replace(ARGS, tp=1, max_num_seqs=300, gpu_memory_bytes=80 * BYTES_PER_GIB,
                   weights_and_kv_bytes_per_gpu=72 * BYTES_PER_GIB, kv_cache_bytes_per_gpu=6 * BYTES_PER_GIB,
                   kv_bytes_per_sequence=0.5 * BYTES_PER_GIB)
    assert "leaves 0.40 GiB per GPU for KV, less than one request's 0.50 GiB" in pool_refusal(args)
    served = replace(args, kv_cache_bytes_per_gpu=12 * BYTES_PER_GIB)
    assert pool_refusal(served) is None and max_running_requests(served) == 12


def test_sglang_plans_only_layouts_its_pool_can_serve():
    """Nemotron-3-Ultra-550B in bf16 on 4x8 H100 with --emit sglang: layouts whose weights leave
    SGLang's default reserve no KV are refused, with the reason, instead of launched with
    --max-running-requests 1; the recommended layout's command runs more than one request."""
    from pathlib import Path

    config = Path(__file__).parent / "fixtures" / "hf_configs" / "nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16"
    result = CliRunner().invoke(app, ["--model", str(config / "config.json"), "--cluster", "4x8xH100",
                                      "--emit", "sglang", "--mode", "aggregated", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    reasons = [reason for r in plan["rejected"] for reason in r["reasons"]]
    assert any("less than one request's" in reason for reason in reasons)
    command = " ".join(" ".join(step["argv"]) if isinstance(step, dict) and "argv" in step else str(step)
                       for step in plan["recommended"]["command"])
    assert "--max-running-requests 1 " not in command + " "


def test_vllm_ray_says_when_it_needs_no_ray():
    """--emit vllm-ray on tp=4 replicas over two 8-GPU nodes: every replica fits in a node, so
    the command is the plain one, and the plan says so instead of silently printing no Ray;
    405B at tp=8 pp=2 spans nodes: the Ray cluster is started and nothing is said."""
    fits = json.loads(CliRunner().invoke(app, ["--model", "llama-3.1-70b", "--cluster", "2x8xH100", "--layout",
                                               "tp=4,dp=4", "--emit", "vllm-ray", "--json"]).output)
    assert any(note.startswith("--emit vllm-ray: each replica") for note in fits["launch_notes"])
    assert "ray start" not in json.dumps(fits["recommended"]["command"])
    spans = json.loads(CliRunner().invoke(app, ["--model", "llama-3.1-405b", "--cluster", "4x8xH100", "--layout",
                                                "tp=8,pp=2,dp=2", "--emit", "vllm-ray", "--json"]).output)
    assert not any(note.startswith("--emit vllm-ray") for note in spans["launch_notes"])
    assert "ray start" in json.dumps(spans["recommended"]["command"])


def test_sglang_plans_price_what_sglangs_pool_runs():
    """Llama-3.1-70B on 8 H100s: vLLM's budget holds 399 sequences per tp=4 replica, SGLang's pool
    (its default reserve kept out of --mem-fraction-static) 364. With --emit sglang every layout
    is priced at what SGLang runs (never more than vLLM's count), the recommended layout's
    --max-running-requests is the batch priced, and nothing is left to a "lower than the plan"
    note."""
    args = ["--model", "llama-3.1-70b", "--cluster", "1x8xH100", "--mode", "aggregated", "--json"]
    vllm = json.loads(CliRunner().invoke(app, args).stdout)
    sglang = json.loads(CliRunner().invoke(app, [*args, "--emit", "sglang"]).stdout)
    batches = {(r["tp"], r["pp"], r["dp"]): r["batch"] for r in vllm["layouts"]}
    capped = [r for r in sglang["layouts"] if r["batch"] < batches[(r["tp"], r["pp"], r["dp"])]]
    assert capped and all(r["batch"] <= batches[(r["tp"], r["pp"], r["dp"])] for r in sglang["layouts"])
    best = sglang["recommended"]
    argv = best["command"][0]["argv"]
    # --dp-size 2 without DP attention: two SGLang workers, the count per worker (a replica)
    assert int(argv[argv.index("--max-running-requests") + 1]) == best["batch"]
    assert not any("its throughput is lower than the plan's" in note for note in sglang["launch_notes"])


def test_the_sglang_table_shows_sglangs_pool():
    """The same plan's table under --emit sglang: the memory column is the weights, SGLang's KV
    pool and --mem-fraction-static of the GPU, and the KV tokens are the pool's, fewer than
    vLLM's budget holds (the table had shown vLLM's; a CLI read). The pool within the fraction:
    weights + pool = fraction x memory, to the 0.1 GiB shown."""
    from planner.catalog import resolve_cluster, resolve_model
    from planner.render.serve import _memory, _pool_share
    from planner.requests import LayoutFilter, ServeRequest
    from planner.serve_search import plan_serving

    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("1x8xH100")
    plan = plan_serving(model, cluster, ServeRequest(pool_engine="sglang", kv_cache_dtype="fp8", max_model_len=32768,
                                                     layout=LayoutFilter(tp=4, pp=1, dp=2)))
    best = plan.recommended
    weights, pool, static = (float(x) for x in _memory(best, plan).replace("+", "/").split("/"))
    assert weights + pool == pytest.approx(static, abs=0.15)
    vllm_weights, vllm_kv, vllm_budget = (float(x) for x in _memory(best).replace("+", "/").split("/"))
    assert weights == vllm_weights and pool < vllm_kv and static < vllm_budget
    assert 0 < _pool_share(best, plan) < 1
