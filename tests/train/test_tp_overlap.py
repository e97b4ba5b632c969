"""TP communication/GEMM overlap (--tp-comm-overlap, Transformer Engine userbuffers): the
pipelined pair by hand, where Megatron can run it, what it hides, and the flag."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog import resolve_cluster, resolve_model
from planner.cost.training_time import overlapped_exposed_seconds
from planner.emit.megatron import megatron_steps
from planner.layout import Rejected, TrainConfig
from planner.requests import TrainRequest
from planner.train import estimate, tp_comm_overlap_possible

LLAMA_70B, LLAMA_8B, MIXTRAL = resolve_model("llama-3.1-70b"), resolve_model("llama-3.1-8b"), resolve_model("mixtral-8x7b")
H100_4X8 = resolve_cluster("4x8xH100")


def test_one_pipelined_pair_by_hand() -> None:
    """t = 8 chunks: c = 2 ms under g = 3 ms leaves the first chunk, 2/8 = 0.25 ms; c = 3 ms
    over g = 2 ms leaves 1 ms plus the first chunk of the GEMM's share, 2/8 = 0.25 ms."""
    assert overlapped_exposed_seconds(2e-3, 3e-3, 8) == pytest.approx(0.25e-3)
    assert overlapped_exposed_seconds(3e-3, 2e-3, 8) == pytest.approx(1.25e-3)
    assert overlapped_exposed_seconds(0.0, 3e-3, 8) == 0.0


@settings(max_examples=200, deadline=None)
@given(c=st.floats(0.0, 1.0), g=st.floats(0.0, 1.0), t=st.integers(2, 64))
def test_a_pipelined_pair_never_exposes_more_than_the_collective(c: float, g: float, t: int) -> None:
    exposed = overlapped_exposed_seconds(c, g, t)
    assert max(0.0, c - g) <= exposed <= c + 1e-15


def test_where_megatron_runs_it() -> None:
    """SP on, TP inside the node, flash (TE) attention, dense blocks; not across nodes, not
    without SP, not for MoE experts."""
    base = TrainConfig(8, 4, 1, 1, "1f1b", 1, "none", True, 1)
    assert tp_comm_overlap_possible(LLAMA_70B, H100_4X8, base)
    assert not tp_comm_overlap_possible(LLAMA_70B, H100_4X8, TrainConfig(16, 2, 1, 1, "1f1b", 1, "none", True, 1))
    assert not tp_comm_overlap_possible(LLAMA_70B, H100_4X8, TrainConfig(8, 4, 1, 1, "1f1b", 1, "none", False, 1))
    assert not tp_comm_overlap_possible(MIXTRAL, H100_4X8, base)
    materialized = TrainConfig(8, 4, 1, 1, "1f1b", 1, "none", True, 1, attention="materialized")
    assert not tp_comm_overlap_possible(LLAMA_70B, H100_4X8, materialized)


def test_overlap_hides_tp_time_and_is_emitted() -> None:
    """Llama-3.1-70B, tp=8 pp=4 on 32 H100s, SP: with overlap the exposed TP time per step
    falls (each forward collective under its GEMM) and the command carries --tp-comm-overlap
    beside --sequence-parallel; --no-tp-comm-overlap gives the old estimate and no flag."""
    config = TrainConfig(8, 4, 1, 1, "1f1b", 1, "selective", True, 1)
    on = estimate(LLAMA_70B, H100_4X8, config, TrainRequest(global_batch=64, seq_len=4096))
    off = estimate(LLAMA_70B, H100_4X8, config, TrainRequest(global_batch=64, seq_len=4096, tp_comm_overlap=False))
    assert not isinstance(on, Rejected) and not isinstance(off, Rejected)
    assert on.config.tp_comm_overlap and not off.config.tp_comm_overlap
    assert on.time_breakdown_seconds.tp_comm < 0.5 * off.time_breakdown_seconds.tp_comm
    assert on.step_time_seconds < off.step_time_seconds
    (step_on,) = megatron_steps(LLAMA_70B, H100_4X8, on.config, 64, 4096)
    (step_off,) = megatron_steps(LLAMA_70B, H100_4X8, off.config, 64, 4096)
    assert "--tp-comm-overlap" in step_on.argv and "--sequence-parallel" in step_on.argv
    assert "--tp-comm-overlap" not in step_off.argv


def test_no_overlap_flag_on_the_command_line(run_plan) -> None:
    result = run_plan("--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100",
                      "--global-batch", "64", "--seq-len", "4096", "--layout", "tp=8",
                      "--sequence-parallel", "--no-tp-comm-overlap")
    assert result.returncode == 0, result.stderr
    assert "--tp-comm-overlap" not in result.stdout
    serving = run_plan("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--no-tp-comm-overlap")
    assert serving.returncode == 2 and len(serving.stderr.strip().splitlines()) == 1


def test_the_summary_says_why_tp_comm_overlap_is_off():
    """Where TP > 1 and the overlap cannot run, the plan says why (here: an MoE model's experts,
    which the userbuffers do not pair with); a dense plan that runs it says nothing."""
    from planner.catalog import resolve_cluster, resolve_model
    from planner.layout import TrainConfig
    from planner.train import tp_comm_overlap_off_reason

    moe, dense, cluster = resolve_model("mixtral-8x7b"), resolve_model("llama-3.1-70b"), resolve_cluster("2x8xH100")
    sp = TrainConfig(4, 1, 4, 1, "1f1b", 1, "none", True, 1)
    assert "MoE experts" in tp_comm_overlap_off_reason(moe, cluster, sp)
    assert tp_comm_overlap_off_reason(dense, cluster, sp) is None
    no_sp = TrainConfig(4, 1, 4, 1, "1f1b", 1, "none", False, 1)
    assert tp_comm_overlap_off_reason(dense, cluster, no_sp) == "it needs sequence parallelism"
    across = TrainConfig(16, 1, 1, 1, "1f1b", 1, "none", True, 1)
    assert "leaves the node" in tp_comm_overlap_off_reason(dense, cluster, across)
    assert tp_comm_overlap_off_reason(dense, cluster, TrainConfig(1, 1, 16, 1, "1f1b", 1, "none", False, 1)) is None
