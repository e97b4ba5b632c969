"""Sharded data parallel: the DP group's placement, its two-level rings across nodes, what
the overlap windows hide, the FSDP unit buffers, and Megatron-FSDP with TP and CP.
Sources: docs/cost-model.md (Training: step time, data parallel); Megatron-LM core_v0.19.0
parallel_state.py (rank order tp-cp-ep-dp-pp), docs/user-guide/features/megatron_fsdp.md."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog import resolve_cluster, resolve_model
from planner.cost import comm
from planner.cost.training_memory import fsdp_unit_buffer_bytes, fsdp_unit_buffers
from planner.cost.training_time import DpCollectives, DpWindows, dp_exposed_seconds
from planner.emit.megatron import megatron_steps
from planner.layout import GroupTopology, Layout, Link, Rejected, TrainConfig, dp_group_topology
from planner.requests import TrainRequest
from planner.train import estimate

NVLINK = Link("nvlink", "intra_node", 100e9, 0.0)
NIC = Link("infiniband", "inter_node", 25e9, 0.0)
H100_8X8 = resolve_cluster("8x8xH100")


@pytest.mark.parametrize(("layout", "expected"), [
    (Layout(1, 1, 64), (64, 8, 8)),   # pure DP: 8 ranks in each of 8 nodes
    (Layout(8, 1, 8), (8, 1, 8)),     # TP fills the node: one DP rank per node
    (Layout(2, 1, 16, cp=2), (32, 4, 8)),  # dp*cp = 32 ranks at stride tp = 2: 4 per node
    (Layout(4, 2, 8), (8, 2, 4)),     # a stage's 32 ranks: stride 4, 2 per node over 4 nodes
])
def test_dp_group_placement(layout: Layout, expected: tuple[int, int, int]) -> None:
    group = dp_group_topology(H100_8X8, layout)
    assert (group.num_ranks, group.ranks_per_node, group.num_nodes) == expected
    assert (group.intra is None) == (expected[1] == 1)


def test_one_node_dp_group_has_no_nic() -> None:
    group = dp_group_topology(resolve_cluster("1x8xH100"), Layout(2, 1, 4))
    assert (group.num_ranks, group.ranks_per_node, group.num_nodes, group.inter) == (4, 4, 1, None)


def test_two_level_allgather_by_hand() -> None:
    """S = 2e9 B over 8 ranks per node x 8 nodes, NVLink 100 GB/s, NIC share 25 GB/s:
    inside the node 7/8 * 2e9 / 100e9 = 17.5 ms; across, each GPU's 2e9/8 over 8 nodes,
    7/8 * 2.5e8 / 25e9 = 8.75 ms; 26.25 ms in all. A flat ring of 64 ranks at the NIC share
    would take 63/64 * 2e9 / 25e9 = 78.75 ms."""
    group = GroupTopology(64, 8, 8, NVLINK, NIC)
    assert comm.group_allgather_seconds(2e9, group) == pytest.approx(0.0175 + 0.00875)
    assert comm.ring_allgather_seconds(2e9, 64, NIC) == pytest.approx(0.07875)


def test_two_level_allgather_one_rank_per_node_is_the_nic_ring() -> None:
    """g = 1: only the ring of N = 8 nodes, 7/8 * 2e9 / 25e9 = 70 ms."""
    assert comm.group_allgather_seconds(2e9, GroupTopology(8, 1, 8, None, NIC)) == pytest.approx(0.07)


@settings(max_examples=200, deadline=None)
@given(g=st.integers(1, 16), n=st.integers(2, 64), size=st.floats(1.0, 1e10),
       nic=st.floats(1e9, 1e11), ratio=st.floats(1.0, 20.0),
       alpha_nic=st.floats(0.0, 1e-4), alpha_ratio=st.floats(0.0, 1.0))
def test_two_levels_never_slower_than_the_flat_ring(g: int, n: int, size: float, nic: float, ratio: float,
                                                    alpha_nic: float, alpha_ratio: float) -> None:
    """With NVLink at least as fast as the NIC share (bandwidth and latency), the two-level
    all-gather is never slower than one flat ring of all g*N ranks on the NIC share:
    (g-1)/g * S/B_i + (N-1)/N * S/(g*B_e) <= (gN-1)/(gN) * S/B_e, and (g-1) + (N-1) <= gN - 1
    latency steps."""
    inter = Link("infiniband", "inter_node", nic, alpha_nic)
    intra = Link("nvlink", "intra_node", nic * ratio, alpha_nic * alpha_ratio) if g > 1 else None
    two_level = comm.group_allgather_seconds(size, GroupTopology(g * n, g, n, intra, inter))
    assert two_level <= comm.ring_allgather_seconds(size, g * n, inter) * (1 + 1e-9)


COLLECTIVES = DpCollectives(gradient_bytes=0.0, gradient_seconds=0.04, weight_bytes=0.0, gather_seconds=0.02)
WINDOWS = DpWindows(backward_seconds=0.03, forward_seconds=0.01, micro_batch_seconds=0.05, num_units=10)


@pytest.mark.parametrize(("zero", "m", "expected"), [
    (0, 4, 0.04 - 0.03),                          # the all-reduce beyond the backward window
    (1, 4, 0.01 + (0.02 - 0.01)),                 # + the gather beyond the first forward
    (2, 4, 4 * 0.01 + 0.01),                      # a reduce-scatter per micro-batch
    (3, 4, 4 * (0.04 + 2 * 0.02 - 0.05)),         # scatter + 2 gathers under each micro-batch
])
def test_exposed_data_parallel_time_by_hand(zero: int, m: int, expected: float) -> None:
    config = TrainConfig(1, 1, 8, 1, "1f1b", 1, "none", False, zero)
    assert dp_exposed_seconds(config, COLLECTIVES, WINDOWS, m) == pytest.approx(expected)


def test_the_first_layers_gather_never_hides() -> None:
    """A micro-batch long enough to hide everything still waits for the first layer's
    weights: z = 3, 10 layers, gather 0.02 s: 0.002 s per micro-batch, x4; z = 1 under a long
    forward: the same 0.002 s once."""
    long = DpWindows(backward_seconds=1.0, forward_seconds=1.0, micro_batch_seconds=1.0, num_units=10)
    zero3 = TrainConfig(1, 1, 8, 1, "1f1b", 1, "none", False, 3)
    zero1 = TrainConfig(1, 1, 8, 1, "1f1b", 1, "none", False, 1)
    assert dp_exposed_seconds(zero3, COLLECTIVES, long, 4) == pytest.approx(4 * 0.002)
    assert dp_exposed_seconds(zero1, COLLECTIVES, long, 4) == pytest.approx(0.002)


def test_full_recompute_gathers_the_weights_a_third_time() -> None:
    config = TrainConfig(1, 1, 8, 1, "1f1b", 1, "full", False, 3)
    assert dp_exposed_seconds(config, COLLECTIVES, WINDOWS, 1) == pytest.approx(0.04 + 3 * 0.02 - 0.05)


def test_fsdp_unit_buffers_by_hand() -> None:
    """P = 1e9 on 10 layers: z = 3 keeps 2 layers' 16-bit weights and fp32 gradients whole,
    2 * 1e8 * (2 + 4) = 1.2e9 B; z = 2 the gradients only, 8e8 B; z = 1 nothing."""
    assert fsdp_unit_buffer_bytes(1e9, 10, 3) == pytest.approx(1.2e9)
    assert fsdp_unit_buffer_bytes(1e9, 10, 2) == pytest.approx(8e8)
    assert fsdp_unit_buffer_bytes(1e9, 10, 1) == 0.0
    # split: the gathered weights 2 * 1e8 * 2 = 4e8 B, the unreduced gradients 2 * 1e8 * 4 = 8e8 B
    units = fsdp_unit_buffers(1e9, 10, 3)
    assert (units.weights_bytes, units.gradient_bytes, units.optimizer_bytes) == pytest.approx((4e8, 8e8, 0.0))


def test_memory_bars_count_the_gathered_weights_as_weights() -> None:
    """Llama-3.1-8B, ZeRO-3 over d = 8, one stage of 32 layers: weights 2P/8 + 2 * (P/32) * 2,
    gradients 4P/8 + 2 * (P/32) * 4 (a CLI read found the gathered weights in the gradients bar)."""
    from planner.cost.params import param_counts
    from planner.train import memory_per_gpu

    model = resolve_model("llama-3.1-8b")
    P = param_counts(model).total
    mem = memory_per_gpu(model, TrainConfig(1, 1, 8, 1, "1f1b", 1, "none", False, 3), 8192, 16)
    assert mem.weights_bytes == pytest.approx(2 * P / 8 + 2 * P / 32 * 2)
    assert mem.gradient_bytes == pytest.approx(4 * P / 8 + 2 * P / 32 * 4)


def test_fsdp_with_tp_is_planned_and_emitted() -> None:
    """Megatron-FSDP with TP 2 (strided FSDP x TP sharding): feasible, the command carries
    --use-megatron-fsdp beside --tensor-model-parallel-size 2 and no
    CUDA_DEVICE_MAX_CONNECTIONS (Megatron-FSDP asserts it is not 1)."""
    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("8x8xH100")
    config = TrainConfig(2, 1, 32, 1, "1f1b", 1, "none", True, 3)
    e = estimate(model, cluster, config, TrainRequest(global_batch=256, seq_len=4096))
    assert not isinstance(e, Rejected), e
    (step,) = megatron_steps(model, cluster, config, 256, 4096)
    shell = step.shell()
    assert "--use-megatron-fsdp" in shell and "--tensor-model-parallel-size 2" in shell
    assert "--overlap-param-gather" in shell and "CUDA_DEVICE_MAX_CONNECTIONS" not in shell


def test_fsdp_with_pp_is_rejected_with_the_reason() -> None:
    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("8x8xH100")
    e = estimate(model, cluster, TrainConfig(2, 2, 16, 1, "1f1b", 1, "none", True, 3),
                 TrainRequest(global_batch=256, seq_len=4096))
    assert isinstance(e, Rejected)
    assert any("without pipeline parallelism" in reason for reason in e.reasons)


def test_pure_fsdp_on_64_gpus_is_mostly_compute() -> None:
    """Llama-3.1-8B with ZeRO-3 over 64 H100s, b = 1 at 4,096 tokens, 8 micro-batches: the
    weight gathers and gradient reduce-scatters cross each node's NICs once per GPU share (8
    ranks per node, 1/8 of the bytes each) and hide under each micro-batch, so exposed
    data-parallel time stays a small share of the step; the flat ring of 64 ranks at the
    NIC share it replaces moves 8x the bytes over the NICs."""
    model, cluster = resolve_model("llama-3.1-8b"), resolve_cluster("8x8xH100")
    config = TrainConfig(1, 1, 64, 1, "1f1b", 1, "none", False, 3)
    e = estimate(model, cluster, config, TrainRequest(global_batch=512, seq_len=4096))
    assert not isinstance(e, Rejected), e
    assert e.time_breakdown_seconds.dp_comm_exposed < 0.1 * e.step_time_seconds
