"""Megatron's flex token dispatcher on DeepEP in the training plan (--moe-dispatcher): where it
can run, what one of its transfers costs, its buffers, and the choice auto makes. Hand-worked
numbers; sources in planner/cost/moe.py and planner/train.py."""

from __future__ import annotations

import json
from math import prod

import pytest
from typer.testing import CliRunner

from planner.catalog import resolve_cluster, resolve_model
from planner.cli import app
from planner.cost.moe import (
    deepep_training_buffer_bytes,
    deepep_training_message_bytes,
    deepep_training_refusal,
)
from planner.cost.training_time import ep_seconds_per_layer
from planner.layout import Rejected, TrainConfig
from planner.requests import LayoutFilter, TrainRequest
from planner.specs import SpecError
from planner.train import deepep_refusal, estimate, moe_dispatcher_for, train_rates
from planner.train_search import search

QWEN3_30B = resolve_model("qwen3-30b-a3b")
DEEPSEEK_V3 = resolve_model("deepseek-v3")


def config(ep: int, dp: int, dispatcher: str = "alltoall", tp: int = 1) -> TrainConfig:
    return TrainConfig(tp=tp, pp=1, dp=dp, micro_batch_size=1, schedule="1f1b", virtual_stages=1, recompute="none",
                       sequence_parallel=tp > 1, zero_stage=1, ep=ep, moe_dispatcher=dispatcher)


def test_message_bytes_are_megatrons_16_bit_hidden_states():
    """Dispatch: 2h + 8 B of source metadata + 4 B index and 4 B weight per top-k expert, up to
    16 B; combine: 2h. DeepSeek-V3 (h 7,168, k 8): 14,336 + 8 + 64 = 14,408 -> 14,416 B and
    14,336 B; Qwen3-30B-A3B (h 2,048, k 8): 4,096 + 8 + 64 = 4,168 -> 4,176 B and 4,096 B. The
    spec's fp8 serving weights do not make the training dispatch fp8."""
    assert DEEPSEEK_V3.quantization == "fp8"
    assert deepep_training_message_bytes(DEEPSEEK_V3, "dispatch") == 14_416
    assert deepep_training_message_bytes(DEEPSEEK_V3, "combine") == 14_336
    assert deepep_training_message_bytes(QWEN3_30B, "dispatch") == 4_176
    assert deepep_training_message_bytes(QWEN3_30B, "combine") == 4_096


def test_buffers_as_megatrons_get_buffer_sizes_them():
    """10 channels (20 SMs); per buffered token 2h + 8 + 128 * (8 + 4 + 4) B.
    DeepSeek-V3, EP 8 (one node): NVLink 10*8*(2*1 + 3)*4 + 10*8*256*16,392 = 335,709,760 ->
    335,709,824 B (128-aligned), no RDMA buffer.
    EP 32 (four nodes): NVLink 10*8*(2*4 + 3)*4 + 10*8*288*16,392 = 377,675,200 -> 377,675,264;
    RDMA 10*4*(8*2 + 2)*2*4 + 10*4*128*2*(16,392 + 16) = 5,760 + 168,017,920 = 168,023,680;
    together 545,698,944 B. EP 1 or a size DeepEP has no configuration for: none."""
    assert deepep_training_buffer_bytes(DEEPSEEK_V3, 8) == 335_709_824
    assert deepep_training_buffer_bytes(DEEPSEEK_V3, 32) == 377_675_264 + 168_023_680 == 545_698_944
    assert deepep_training_buffer_bytes(DEEPSEEK_V3, 1) == 0
    assert deepep_training_buffer_bytes(DEEPSEEK_V3, 12) == 0


@pytest.mark.parametrize("ep, ranks_per_node, num_nodes, refused", [
    (8, 8, 1, False), (2, 2, 1, False), (16, 8, 2, False), (160, 8, 20, False),
    (6, 6, 1, True),     # DeepEP has no configuration for 6 ranks
    (16, 4, 4, True),    # more than 8 ranks: whole 8-GPU nodes only
    (8, 4, 2, True),     # 8 or fewer ranks: its intranode kernels, one node only
    (256, 8, 32, True),  # beyond its largest configuration (160)
])
def test_deepep_group_sizes(ep, ranks_per_node, num_nodes, refused):
    assert (deepep_training_refusal(ep, ranks_per_node, num_nodes) is not None) == refused


@pytest.mark.parametrize("cluster_name, reason", [
    ("2x8xH100", None),
    ("2x8xA100", None),
    ("1x8xB200", None),
    ("1x8xMI300X", "NVIDIA Ampere, Hopper, B200 and B300"),
    ("1x8xL40S", "NVIDIA Ampere, Hopper, B200 and B300"),   # compute capability 8.9, PCIe: no NVLink
    ("1x4xGB200", "NVIDIA Ampere, Hopper, B200 and B300"),  # GB200 racks run HybridEP
])
def test_where_deepep_runs(cluster_name, reason):
    cluster = resolve_cluster(cluster_name)
    ep = min(8, cluster.gpus_per_node)
    refusal = deepep_refusal(QWEN3_30B, cluster, config(ep, ep))
    assert (refusal is None) if reason is None else (reason in refusal or "NVLink" in refusal), refusal


def test_deepep_on_ampere_stays_inside_a_node():
    """DeepEP's Ampere build leaves out NVSHMEM and with it the internode kernels (setup.py at
    v1.2.1; the current line builds for SM90 only): on 2x8 A100 an EP group of 8 in one node
    runs, one of 16 over both nodes is refused (it was planned and emitted); H100 runs both."""
    a100, h100 = resolve_cluster("2x8xA100"), resolve_cluster("2x8xH100")
    assert deepep_refusal(QWEN3_30B, a100, config(8, 16)) is None
    assert "runs inside one node only" in deepep_refusal(QWEN3_30B, a100, config(16, 16))
    assert deepep_refusal(QWEN3_30B, h100, config(16, 16)) is None


def test_deepep_refused_across_nodes_without_rdma():
    cluster = resolve_cluster("2x8xH100")
    ethernet = cluster.model_copy(update={"inter_node": cluster.inter_node.model_copy(update={"kind": "ethernet"})})
    assert "RDMA" in deepep_refusal(QWEN3_30B, ethernet, config(16, 16))
    assert deepep_refusal(QWEN3_30B, ethernet, config(8, 16)) is None  # one node: no RDMA needed


def test_one_deepep_transfer_hand_worked():
    """Qwen3-30B-A3B (E 128, k 8) at EP 16 on two H100 nodes, b = 1, s = 4,096, t = 1: each GPU
    sends its N = 4,096 tokens. Ranks hit per token: 16 * (1 - prod_{i<8} (120 - i)/(128 - i))
    = 6.5965; nodes hit: 2 * (1 - prod_{i<8} (64 - i)/(128 - i)) = 1.9938, of which the own
    node half. Dispatch (4,176 B): NVLink 4,096 * 6.5965 * 4,176 * 7/16 = 49.36 MB, RDMA
    4,096 * 0.9969 * 4,176 = 17.05 MB; time 41.2 + 31.8 * log2(2) = 73 us fixed + the slower of
    49.36 MB / (450 GB/s * 0.64) = 171 us and 17.05 MB / (50 GB/s * 0.93) = 367 us: 440 us.
    Combine (4,096 B): 73 + 16.73 MB / 46.5 GB/s = 433 us. The priced transfer is their mean,
    436 us, against 1.80 ms for one NCCL all-to-all of 4,096 * 8 * 2,048 * 2 = 134 MB."""
    cluster = resolve_cluster("2x8xH100")
    rates = train_rates(QWEN3_30B, cluster)
    ranks = 16 * (1 - prod((120 - i) / (128 - i) for i in range(8)))
    nodes = 2 * (1 - prod((64 - i) / (128 - i) for i in range(8)))
    expected = []
    for message in (4_176, 4_096):
        nvlink = 4_096 * ranks * message * 7 / 16
        rdma = 4_096 * (nodes - nodes / 2) * message
        expected.append(73e-6 + max(nvlink / (450e9 * 0.64), rdma / (50e9 * 0.93)))
    deepep = ep_seconds_per_layer(QWEN3_30B, cluster, config(16, 16, "deepep"), 4_096, rates)
    assert deepep.dispatcher == "deepep" and deepep.num_alltoalls == 4 and deepep.link == "infiniband"
    assert deepep.alltoall_seconds == pytest.approx(sum(expected) / 2)
    assert deepep.alltoall_seconds == pytest.approx(436e-6, rel=0.01)
    nccl = ep_seconds_per_layer(QWEN3_30B, cluster, config(16, 16), 4_096, rates)
    assert nccl.message_bytes == 4_096 * 8 * 2_048 * 2
    assert nccl.alltoall_seconds > 4 * deepep.alltoall_seconds


def test_auto_takes_the_faster_dispatcher_and_asked_for_is_kept():
    cluster = resolve_cluster("2x8xH100")
    rates = train_rates(QWEN3_30B, cluster)
    across = config(16, 16)
    assert moe_dispatcher_for(QWEN3_30B, cluster, TrainRequest(global_batch=256, seq_len=4096), across,
                              rates) == "deepep"
    assert moe_dispatcher_for(QWEN3_30B, cluster, TrainRequest(global_batch=256, seq_len=4096,
                                                               moe_dispatcher="alltoall"), across, rates) == "alltoall"
    assert moe_dispatcher_for(QWEN3_30B, cluster, TrainRequest(global_batch=256, seq_len=4096), config(1, 16),
                              rates) == "alltoall"  # no EP
    # EP 16 on 4-GPU nodes (4 ranks a node; DeepEP spans nodes only with 8): auto falls back
    four = resolve_cluster("4x4xH100")
    assert "8 EP ranks on each node" in deepep_refusal(QWEN3_30B, four, config(16, 16))
    assert moe_dispatcher_for(QWEN3_30B, four, TrainRequest(global_batch=256, seq_len=4096), config(16, 16),
                              train_rates(QWEN3_30B, four)) == "alltoall"


def test_asking_for_deepep_rejects_what_it_cannot_run():
    """--moe-dispatcher deepep where DeepEP cannot run (EP 16 over 4-GPU nodes) comes back
    rejected with the reason; the same layout runs NCCL all-to-alls under auto."""
    cluster = resolve_cluster("4x4xH100")
    asked = estimate(QWEN3_30B, cluster, config(16, 16), TrainRequest(global_batch=256, seq_len=4096,
                                                                      moe_dispatcher="deepep"))
    assert isinstance(asked, Rejected)
    assert any(reason.startswith("--moe-dispatcher deepep: DeepEP spans nodes only") for reason in asked.reasons)
    auto = estimate(QWEN3_30B, cluster, config(16, 16), TrainRequest(global_batch=256, seq_len=4096))
    assert not isinstance(auto, Rejected) and auto.config.moe_dispatcher == "alltoall"


def test_deepep_buffers_count_in_memory():
    """The same configuration on DeepEP holds its buffers more (EP 16 on two nodes: Qwen3-30B-A3B
    NVLink 10*8*(2*2 + 3)*4 + 10*8*288*(4,096 + 8 + 2,048) B and the RDMA buffer)."""
    cluster = resolve_cluster("2x8xH100")
    nccl = estimate(QWEN3_30B, cluster, config(16, 16), TrainRequest(global_batch=256, seq_len=4096,
                                                                     moe_dispatcher="alltoall"))
    deepep = estimate(QWEN3_30B, cluster, config(16, 16), TrainRequest(global_batch=256, seq_len=4096,
                                                                       moe_dispatcher="deepep"))
    assert deepep.config.moe_dispatcher == "deepep" and nccl.config.moe_dispatcher == "alltoall"
    assert deepep.memory.overhead_bytes - nccl.memory.overhead_bytes == pytest.approx(
        deepep_training_buffer_bytes(QWEN3_30B, 16))
    assert deepep.step_time_seconds < nccl.step_time_seconds


def test_the_plan_says_which_dispatcher_and_why_not_deepep():
    runner = CliRunner()
    args = ["--workload", "train", "--model", "qwen3-30b-a3b", "--cluster", "2x8xH100", "--global-batch", "256",
            "--seq-len", "4096", "--layout", "tp=1,pp=1,dp=16,ep=16"]
    best = json.loads(runner.invoke(app, [*args, "--json"]).output)["recommended"]
    assert best["moe_dispatcher"] == "deepep"
    text = runner.invoke(app, args).output
    assert "DeepEP dispatch and combine" in text and "deep_ep" in text
    amd = runner.invoke(app, ["--workload", "train", "--model", "qwen3-30b-a3b", "--cluster", "1x8xMI300X",
                              "--global-batch", "256", "--seq-len", "4096", "--layout", "tp=1,pp=1,dp=8,ep=8"])
    assert amd.exit_code == 0, amd.output
    assert "not DeepEP: DeepEP runs on NVIDIA" in " ".join(amd.output.split())


def test_moe_dispatcher_errors():
    runner = CliRunner()
    dense = runner.invoke(app, ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100",
                                "--global-batch", "64", "--seq-len", "4096", "--moe-dispatcher", "deepep"])
    assert dense.exit_code == 2 and "--moe-dispatcher: llama-3.1-8b has no experts" in dense.output
    serve = runner.invoke(app, ["--model", "qwen3-30b-a3b", "--cluster", "1x8xH100", "--moe-dispatcher", "deepep"])
    assert serve.exit_code == 2 and "--moe-dispatcher" in serve.output
    with pytest.raises(SpecError, match="only with --engine megatron"):
        TrainRequest(global_batch=64, seq_len=4096, moe_dispatcher="deepep", engine="torchtitan")
    with pytest.raises(SpecError, match="must be one of auto, alltoall, deepep"):
        TrainRequest(global_batch=64, seq_len=4096, moe_dispatcher="nccl")


@pytest.mark.parametrize("overlap", [True, False])
def test_auto_takes_deepep_across_nodes_where_its_transfers_are_faster(overlap):
    """DeepSeek-V3 on 32 H100 nodes at EP 64: auto runs DeepEP, whose transfers are several times
    faster across nodes (train.moe_dispatcher_for compares transfers). In the plain schedule its
    recommendation is the best either way (> 1.2x NCCL's). Under the combined 1F1B both exchanges
    hide under the block's compute, where the plan prices DeepEP's 20 of the H100's 132 SMs but
    not NCCL's channels, so the forced NCCL plan may price up to that share's worth faster: within
    0.5% (0.06% today)."""
    cluster = resolve_cluster("32x8xH100")

    def best(dispatcher):
        return search(DEEPSEEK_V3, cluster, TrainRequest(global_batch=1024, seq_len=4096, layout=LayoutFilter(ep=64),
                                                         moe_dispatcher=dispatcher, moe_comm_overlap=overlap)).layouts[0]

    auto, nccl = best("auto"), best("alltoall")
    assert auto.config.moe_dispatcher == "deepep"
    if overlap:
        assert auto.tokens_per_second >= 0.995 * nccl.tokens_per_second
    else:
        assert auto.tokens_per_second > 1.2 * nccl.tokens_per_second


@pytest.mark.parametrize("cluster_name, extra, message", [
    ("1x8xMI300X", [], "DeepEP runs on NVIDIA Ampere, Hopper, B200 and B300 GPUs, not MI300X"),
    ("2x4xGB200", [], "not GB200"),
    ("2x8xH100", ["--layout", "tp=2,pp=1,dp=8,ep=1"], "--layout ep=1 has no expert parallelism"),
])
def test_asking_for_deepep_where_it_never_runs_is_a_usage_error(cluster_name, extra, message):
    """Not a plan that quietly runs without it: exit 2, one line naming --moe-dispatcher."""
    result = CliRunner().invoke(app, ["--workload", "train", "--model", "qwen3-30b-a3b", "--cluster", cluster_name,
                                      "--global-batch", "256", "--seq-len", "4096", "--moe-dispatcher", "deepep",
                                      *extra])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("--moe-dispatcher deepep: ") and message in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_small_group_across_nodes_runs_nccl():
    """EP 8 over two 4-GPU nodes: DeepEP's intranode kernels cannot reach the other node, so auto
    runs NCCL all-to-alls and says why."""
    cluster = resolve_cluster("2x4xH100")
    assert "inside one node (this one spans 2)" in deepep_refusal(QWEN3_30B, cluster, config(8, 8))
    plan = search(QWEN3_30B, cluster, TrainRequest(global_batch=256, seq_len=4096, layout=LayoutFilter(ep=8)))
    assert plan.layouts and all(e.config.moe_dispatcher == "alltoall" for e in plan.layouts)


def test_the_runner_up_line_names_ep_settings_only_between_ep_layouts():
    from planner.render.train import _differences

    cluster = resolve_cluster("2x8xH100")
    request = TrainRequest(global_batch=256, seq_len=4096)
    with_ep = estimate(QWEN3_30B, cluster, config(16, 16), request)
    without = estimate(QWEN3_30B, cluster, config(1, 16).with_(zero_stage=3), request)
    assert with_ep.config.moe_dispatcher == "deepep"
    text = _differences(without, with_ep)
    assert "dispatcher" not in text and "overlap" not in text.replace("TP comm overlap", "")
    nccl = estimate(QWEN3_30B, cluster, config(16, 16), TrainRequest(global_batch=256, seq_len=4096,
                                                                      moe_dispatcher="alltoall"))
    assert "NCCL all-to-all dispatcher" in _differences(nccl, with_ep)


def test_deepep_under_the_combined_1f1b_holds_its_sms():
    """DeepEP's kernels keep 20 SMs while they run (Megatron's default), so the compute beside
    them runs on 112 of an H100's 132: an exchange A = 4 ms under C = 6 ms of compute costs
    20/132 * 4 = 0.606 ms; A = 10 ms costs A - C = 4 ms; NCCL's all-to-alls are priced as
    holding none. Qwen3-30B-A3B at EP 16 over two H100 nodes with the overlap: the exposed
    exchange per MoE layer is 20/132 of its four transfers (they hide under the layer)."""
    from planner.cost.training_time import (
        exchange_sm_share,
        layer_terms,
        moe_overlap_exposed_seconds,
    )
    from planner.layout import place

    assert moe_overlap_exposed_seconds(4e-3, 6e-3, 20 / 132) == pytest.approx(20 / 132 * 4e-3)
    assert moe_overlap_exposed_seconds(4e-3, 6e-3, 20 / 132) == pytest.approx(0.606e-3, rel=1e-3)
    assert moe_overlap_exposed_seconds(10e-3, 6e-3, 20 / 132) == pytest.approx(4e-3)
    assert moe_overlap_exposed_seconds(4e-3, 6e-3) == 0.0
    cluster = resolve_cluster("2x8xH100")
    assert exchange_sm_share(cluster, "deepep") == pytest.approx(20 / 132)
    assert exchange_sm_share(cluster, "alltoall") == 0.0
    assert exchange_sm_share(resolve_cluster("1x8xL40S"), "deepep") == 0.0  # no SM count in the catalog
    overlapped = config(16, 16, "deepep").with_(moe_comm_overlap=True)
    rates = train_rates(QWEN3_30B, cluster)
    terms = layer_terms(QWEN3_30B, cluster, overlapped, 4096, place(cluster, overlapped.layout, True), rates, 1.0)
    ep = terms.ep
    assert ep.alltoall_seconds_per_moe_layer < terms.layer.total  # hidden ...
    assert ep.exposed_seconds_per_moe_layer == pytest.approx(20 / 132 * ep.alltoall_seconds_per_moe_layer)  # ... not free
