"""Disaggregated launch commands across nodes: every server's NIXL side channel on its node's
own address, and workers wider than a node launched as deployments of their own on whole nodes
(planner/emit/disagg.py). Each node's line is expanded by a real shell with NODE_RANK and
NODE_IP set as the plan's notes say, and checked as the engine would read it."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import replace

import pytest

from planner.emit.command import LaunchStep, ServeArgs
from planner.emit.disagg import (
    DisaggDeployment,
    WideRole,
    not_emitted_reason,
    placements,
    sglang_disagg_steps,
    vllm_disagg_steps,
)
from planner.engines import EngineVersions

BASE = ServeArgs(model="M", tp=8, pp=1, dp=1, gpus_per_node=8, gpu_memory_utilization=0.9,
                 max_model_len=8192, max_num_seqs=64, quantization=None, kv_cache_dtype="auto",
                 dtype="bfloat16", engine_versions=EngineVersions(), max_num_batched_tokens=None,
                 gpu_memory_bytes=80 * 2**30, weights_and_kv_bytes_per_gpu=60 * 2**30)


def node_ip(n: int) -> str:
    return f"10.0.0.{n + 1}"


def expand(step: LaunchStep, span: int) -> dict[int, list[str]]:
    """The argv each of the step's nodes runs, with NODE_RANK, NODE_IP and REPLICA_HEAD_IP (the
    first node of its deployment of `span` nodes) set on each as the plan's notes say, and the
    NODE<n>_IP placeholders replaced as a user would."""
    script = "".join(f"NODE_RANK={n}; NODE_IP={node_ip(n)}; REPLICA_HEAD_IP={node_ip(n - n % span)}; "
                     f"printf '%s\\0' {step.shell()} END\n" for n in step.nodes)
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    argvs = [chunk.strip("\0").split("\0") for chunk in out.split("\0END\0") if chunk]
    return {n: [re.sub(r"NODE(\d+)_IP", lambda m: node_ip(int(m.group(1))), a) for a in argv]
            for n, argv in zip(step.nodes, argvs, strict=True)}


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def env(argv: list[str], name: str) -> str | None:
    return next((a.split("=", 1)[1] for a in argv if a.startswith(f"{name}=")), None)


def servers_by_node(steps: tuple[LaunchStep, ...], span: int = 1) -> dict[int, list[str]]:
    """Node -> the vllm serve argv it runs (one per node here)."""
    out: dict[int, list[str]] = {}
    for step in steps:
        if step.role == "proxy":
            continue
        for n, argv in expand(step, span).items():
            assert n not in out, f"node {n} runs two servers"
            out[n] = argv
    return out


def test_cross_node_servers_listen_and_advertise_on_their_own_address():
    """Prefill on node 0 (tp 8), decode on node 1: without VLLM_NIXL_SIDE_CHANNEL_HOST both
    would bind and advertise localhost, and the decode server would pull from its own node."""
    d = DisaggDeployment(BASE, replace(BASE, tp=2, dp=2), 1, 1, same_node_groups=0)
    steps = vllm_disagg_steps(d)
    servers = servers_by_node(steps)
    assert sorted(servers) == [0, 1]
    for n, argv in servers.items():
        assert env(argv, "VLLM_NIXL_SIDE_CHANNEL_HOST") == node_ip(n)
    proxy = steps[-1].argv
    assert flag(list(proxy), "--prefiller-hosts") == "NODE0_IP" and flag(list(proxy), "--decoder-hosts") == "NODE1_IP"


def test_one_node_keeps_localhost():
    d = DisaggDeployment(replace(BASE, tp=4), replace(BASE, tp=4), 1, 1, same_node_groups=1)
    steps = vllm_disagg_steps(d)
    assert not any(a.startswith("VLLM_NIXL_SIDE_CHANNEL_HOST=") for s in steps for a in s.argv)
    assert flag(list(steps[-1].argv), "--prefiller-hosts") == "localhost"


def test_ep_decode_over_two_nodes_is_one_deployment():
    """DeepSeek-style decode worker: 16 DP ranks sharing the experts (tp 1, ep 16) over nodes
    0-1, the widest role first; two prefill workers of pp 8 on nodes 2 and 3."""
    decode = replace(BASE, tp=1, dp=16, ep=16)
    prefill = replace(BASE, tp=1, pp=8)
    d = DisaggDeployment(prefill, decode, 2, 1, same_node_groups=0)
    where = placements(d)
    assert where["decode"] == WideRole(0, 1, 2)
    steps = vllm_disagg_steps(d)
    servers = servers_by_node(steps)
    assert sorted(servers) == [0, 1, 2, 3]
    for n in (0, 1):
        argv = servers[n]
        assert json.loads(flag(argv, "--kv-transfer-config"))["kv_role"] == "kv_consumer"
        assert flag(argv, "--data-parallel-size") == "16" and flag(argv, "--data-parallel-size-local") == "8"
        assert flag(argv, "--data-parallel-address") == node_ip(0)
        assert "--enable-expert-parallel" in argv and flag(argv, "--port") == "8200"
        assert env(argv, "VLLM_NIXL_SIDE_CHANNEL_HOST") == node_ip(n)
    assert "--headless" not in servers[0] and flag(servers[1], "--data-parallel-start-rank") == "8"
    for n in (2, 3):
        assert json.loads(flag(servers[n], "--kv-transfer-config"))["kv_role"] == "kv_producer"
        assert flag(servers[n], "--pipeline-parallel-size") == "8" and flag(servers[n], "--port") == "8100"
    proxy = list(steps[-1].argv)
    decoders = proxy[proxy.index("--decoder-hosts") + 1:proxy.index("--decoder-ports")]
    prefillers = proxy[proxy.index("--prefiller-hosts") + 1:proxy.index("--prefiller-ports")]
    assert decoders == ["NODE0_IP"] and prefillers == ["NODE2_IP", "NODE3_IP"]


def test_prefill_replicas_wider_than_a_node_each_get_their_own_head():
    """Two prefill workers of tp 16 (2 nodes each: nodes 0-1 and 2-3), one decode worker of tp 8
    on node 4: each prefill node's --node-rank is its rank inside its own deployment, and its
    --master-addr that deployment's first node."""
    d = DisaggDeployment(replace(BASE, tp=16), BASE, 2, 1, same_node_groups=0)
    steps = vllm_disagg_steps(d)
    servers = servers_by_node(steps, span=2)
    assert sorted(servers) == [0, 1, 2, 3, 4]
    for n in range(4):
        argv = servers[n]
        assert flag(argv, "--nnodes") == "2" and flag(argv, "--node-rank") == str(n % 2)
        assert flag(argv, "--master-addr") == node_ip(n - n % 2)
        assert ("--headless" in argv) == (n % 2 == 1)
        assert json.loads(flag(argv, "--kv-transfer-config"))["kv_role"] == "kv_producer"
    assert json.loads(flag(servers[4], "--kv-transfer-config"))["kv_role"] == "kv_consumer"
    proxy = list(steps[-1].argv)
    assert proxy[proxy.index("--prefiller-hosts") + 1:proxy.index("--prefiller-ports")] == ["NODE0_IP", "NODE2_IP"]
    assert flag(proxy, "--decoder-hosts") == "NODE4_IP"


def test_ep_decode_workers_sharing_a_node_run_side_by_side():
    """Two EP decode workers of 4 GPUs (4 DP ranks each) on node 1: each its own server on its
    own GPUs, port and NIXL side-channel range; the proxy names both."""
    d = DisaggDeployment(BASE, replace(BASE, tp=1, dp=4, ep=4), 1, 2, same_node_groups=0)
    steps = vllm_disagg_steps(d)
    decode = [s for s in steps if s.role == "decode"]
    assert len(decode) == 2 and all(list(s.nodes) == [1] for s in decode)
    argvs = [expand(s, 1)[1] for s in decode]
    assert [env(a, "CUDA_VISIBLE_DEVICES") for a in argvs] == ["0,1,2,3", "4,5,6,7"]
    assert [flag(a, "--port") for a in argvs] == ["8200", "8201"]
    # ranks 0-3 of each listen on base + DP index: 5800-5803 and 5804-5807
    assert [env(a, "VLLM_NIXL_SIDE_CHANNEL_PORT") for a in argvs] == ["5800", "5804"]
    assert all(flag(a, "--data-parallel-size") == "4" and "--enable-expert-parallel" in a for a in argvs)
    proxy = list(steps[-1].argv)
    assert proxy[proxy.index("--decoder-hosts") + 1:proxy.index("--decoder-ports")] == ["NODE1_IP", "NODE1_IP"]
    assert proxy[proxy.index("--decoder-ports") + 1:] == ["8200", "8201"]
    sglang = sglang_disagg_steps(d)
    ports = [flag(list(s.argv), "--port") for s in sglang if s.role == "decode"]
    assert ports == ["30010", "30030"]  # 20 apart: each server's ZMQ block at --port + 233..239 (emit/sglang.PORT_STRIDE)
    router = list(sglang[-1].argv)
    assert [router[i + 1] for i, a in enumerate(router) if a == "--decode"] == [
        "http://NODE1_IP:30010", "http://NODE1_IP:30030"]


@pytest.mark.parametrize("prefill, decode, why", [
    (replace(BASE, tp=12), BASE, "a prefill worker of 12 GPUs does not fill whole nodes of 8 GPUs"),
    (replace(BASE, tp=16), replace(BASE, tp=24), "widths in nodes do not align"),
])
def test_what_cannot_be_laid_on_whole_nodes_is_not_emitted(prefill, decode, why):
    """12 GPUs would split a node; a 3-node decode worker first leaves the 2-node prefill
    worker starting at node 3, where $((NODE_RANK % 2)) is not its rank."""
    d = DisaggDeployment(prefill, decode, 1, 1, same_node_groups=0)
    assert vllm_disagg_steps(d) is None and sglang_disagg_steps(d) is None
    assert why in not_emitted_reason(d, "vllm")


def test_sglang_ep_decode_over_two_nodes_is_one_server():
    """The same DeepSeek-style deployment under SGLang: the decode worker is one DP-attention
    server of --tp-size 16 over nodes 0-1 (--nnodes 2, its head at NODE0_IP), the router names
    its head once and each prefill server with its bootstrap port."""
    d = DisaggDeployment(replace(BASE, tp=1, pp=8), replace(BASE, tp=1, dp=16, ep=16), 2, 1, same_node_groups=0)
    steps = sglang_disagg_steps(d)
    by_node: dict[int, list[str]] = {}
    for step in steps[:-1]:
        for n, argv in expand(step, 2).items():
            assert n not in by_node
            by_node[n] = argv
    assert sorted(by_node) == [0, 1, 2, 3]
    for n in (0, 1):
        argv = by_node[n]
        assert flag(argv, "--tp-size") == "16" and flag(argv, "--ep-size") == "16"
        assert flag(argv, "--nnodes") == "2" and flag(argv, "--node-rank") == str(n)
        assert flag(argv, "--dist-init-addr") == f"{node_ip(0)}:5000"
        assert flag(argv, "--disaggregation-mode") == "decode"
    assert all(flag(by_node[n], "--disaggregation-mode") == "prefill" for n in (2, 3))
    router = list(steps[-1].argv)
    assert [router[i + 1] for i, a in enumerate(router) if a == "--decode"] == ["http://NODE0_IP:30010"]
    assert [router[i + 1:i + 3] for i, a in enumerate(router) if a == "--prefill"] == [
        ["http://NODE2_IP:30000", "8998"], ["http://NODE3_IP:30000", "8998"]]
