"""Communication volumes and the composed model, by hand and by property."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog import resolve_cluster, resolve_model
from planner.cost import comm
from planner.cost.comm import collective_link
from planner.cost.training_time import _dp_ring_collectives, dp_collectives, pp_seconds
from planner.layout import GroupTopology, Link, Rejected, TrainConfig
from planner.requests import TrainRequest
from planner.train import estimate, memory_per_gpu

LINK = Link("test", "intra_node", 100e9, 0.0)
GPT175 = resolve_model("gpt3-175b")


def test_tp_allreduce_volume_per_layer():
    """Ring all-reduce of S = b*s*h*2 bytes over t=8 moves 2*(7/8)*S per GPU: b=1, s=2048,
    h=12288: S = 50,331,648 B -> 88,080,384 B at 100 GB/s = 0.8808 ms; x4 per layer
    (2 forward + 2 backward) = 8*b*s*h*(t-1)/t elements (Narayanan et al. 2021 sec. 4.1)."""
    S = 1 * 2048 * 12288 * 2
    assert comm.ring_allreduce_seconds(S, 8, LINK) == pytest.approx(2 * 7 / 8 * S / 100e9)
    assert 4 * 2 * 7 / 8 * S / 2 == 8 * 2048 * 12288 * 7 / 8


def test_pp_send_volume():
    """Per boundary send b*s*h*2/t bytes: b=2, s=2048, h=12288, t=8 -> 12,582,912 B at
    100 GB/s = 125.8 us; 2*(v*m + p - 1) = 2*(2*4 + 3) = 22 sends, plus the tied-embedding
    gradient all-reduce of 4*V*h/t = 314,572,800 B over 2 ranks (1 step of 1/2 S each way)."""
    config = TrainConfig(8, 4, 1, 2, "interleaved", 2, "none", False, 0)
    got = pp_seconds(GPT175, resolve_cluster("4x8xA100"), config, 2048, 4, LINK)
    send = 2 * 2048 * 12288 * 2 / 8 / 100e9
    embedding = comm.ring_allreduce_seconds(4 * 51200 * 12288 / 8, 2, collective_link(LINK))
    assert got == pytest.approx(22 * send + embedding)


def test_dp_volumes():
    """P = 1e9 params per GPU over d = 4 GPUs of one node at 100 GB/s, 77 GB/s effective:
    ZeRO-0 all-reduce of 4 GB = 2*(3/4)*4e9/77e9 = 77.9 ms; ZeRO-1 reduce-scatter of 4 GB
    (3/4*4e9/77e9 = 39.0 ms) and all-gather of 2 GB (19.5 ms)."""
    bw = 100e9 * 0.77
    group = GroupTopology(4, 4, 1, LINK, None)
    zero0 = _dp_ring_collectives(1e9, 0, group)
    zero1 = _dp_ring_collectives(1e9, 1, group)
    assert zero0.gradient_seconds == pytest.approx(1.5 * 4e9 / bw)
    assert (zero1.gradient_seconds, zero1.gather_seconds) == pytest.approx((0.75 * 4e9 / bw, 0.75 * 2e9 / bw))


def test_fsdp_collectives_pay_their_latency_per_layer():
    """ZeRO-2/3 gathers and reduce-scatters one FSDP unit (a layer) at a time: L calls of S/L.
    P = 1e9 params over d = 4 ranks of one node at 100 GB/s (77 GB/s effective), alpha = 10 us,
    L = 40: each gather of 2e9/40 = 5e7 B is 3 * 10 us + 3/4 * 5e7 / 77e9 = 30 us + 0.487 ms,
    so 40 of them 1.2 ms + 19.48 ms, where one call pays the 30 us once; the reduce-scatter
    of 4e9 B likewise 1.2 ms + 38.96 ms. ZeRO-1's distributed optimizer keeps one call."""
    bw = 100e9 * 0.77
    link = Link("test", "intra_node", 100e9, 10e-6)
    group = GroupTopology(4, 4, 1, link, None)
    alpha = collective_link(link).latency_seconds
    zero3 = _dp_ring_collectives(1e9, 3, group, num_calls=40)
    assert zero3.gather_seconds == pytest.approx(40 * (3 * alpha + 0.75 * 5e7 / bw))
    assert zero3.gradient_seconds == pytest.approx(40 * (3 * alpha + 0.75 * 1e8 / bw))
    one = _dp_ring_collectives(1e9, 3, group)
    assert zero3.gather_seconds - one.gather_seconds == pytest.approx(39 * 3 * alpha)
    assert dp_collectives(1e9, TrainConfig(1, 1, 4, 1, "1f1b", 1, "none", False, 1), resolve_cluster("1x8xH100"),
                          num_units=40) == dp_collectives(1e9, TrainConfig(1, 1, 4, 1, "1f1b", 1, "none", False, 1),
                                                          resolve_cluster("1x8xH100"))


def test_breakdown_adds_up_and_links():
    e = estimate(GPT175, resolve_cluster("16x8xA100"), TrainConfig(8, 8, 2, 1, "1f1b", 1, "selective", True, 1),
                 TrainRequest(global_batch=1536, seq_len=2048))
    assert not isinstance(e, Rejected)
    t = e.time_breakdown_seconds
    assert t.compute + t.bubble + t.tp_comm + t.pp_comm + t.dp_comm_exposed == pytest.approx(e.step_time_seconds)
    assert (e.tp_link, e.pp_link, e.dp_link) == ("nvlink", "infiniband", "infiniband")
    assert e.tokens_per_second == pytest.approx(1536 * 2048 / e.step_time_seconds)


def test_out_of_memory_is_a_value_with_the_stage():
    got = estimate(GPT175, resolve_cluster("1x8xA100"), TrainConfig(8, 1, 1, 1, "1f1b", 1, "full", True, 0),
                   TrainRequest(global_batch=8, seq_len=2048))
    assert isinstance(got, Rejected) and got.over_bytes > 0
    assert got.reasons[0].startswith("out of memory on stage 0 by ")


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4, 8]), st.sampled_from(["none", "selective", "full"]),
       st.booleans(), st.sampled_from(["gpipe", "1f1b"]))
def test_memory_grows_with_micro_batch(tp, pp, recompute, sp, schedule):
    """The search's pruning rule: activation memory never shrinks as b grows."""
    sp = sp and tp > 1
    small = memory_per_gpu(GPT175, TrainConfig(tp, pp, 1, 1, schedule, 1, recompute, sp, 0), 2048, 64)
    large = memory_per_gpu(GPT175, TrainConfig(tp, pp, 1, 2, schedule, 1, recompute, sp, 0), 2048, 32)
    assert large.activation_bytes >= small.activation_bytes


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]))
def test_state_memory_never_grows_with_tp_or_pp(tp, pp):
    base = memory_per_gpu(GPT175, TrainConfig(tp, pp, 1, 1, "1f1b", 1, "full", False, 0), 2048, 8)
    more = memory_per_gpu(GPT175, TrainConfig(tp * 2, pp * 2, 1, 1, "1f1b", 1, "full", False, 0), 2048, 8)
    assert more.weights_bytes <= base.weights_bytes


def test_a_shortfall_under_a_tenth_of_a_gib_is_given_in_mib():
    """80 GiB needed on an 80 GiB - 3 MiB GPU: "by 3 MiB", never "by 0.0 GiB (80.0 of 80.0 GiB)";
    2.5 GiB over stays in GiB."""
    from planner.train import TrainMemory, oom_reason
    from planner.units import BYTES_PER_GIB, BYTES_PER_MIB

    memory = TrainMemory(80 * BYTES_PER_GIB, 0, 0, 0, 0, stage=1)
    assert oom_reason(memory, 80 * BYTES_PER_GIB - 3 * BYTES_PER_MIB).startswith("out of memory on stage 1 by 3 MiB")
    assert oom_reason(memory, int(77.5 * BYTES_PER_GIB)).startswith("out of memory on stage 1 by 2.5 GiB")
