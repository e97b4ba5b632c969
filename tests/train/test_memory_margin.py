"""Room in memory before a near tie (train_search.prefer_headroom): a configuration that leaves
under TIGHT_MEMORY_FRACTION of the GPU free is recommended only where it prices more than
MEMORY_TIE_FRACTION more tokens/s than the fastest one with room."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from planner.catalog import resolve_cluster
from planner.search import Plan
from planner.train_search import MEMORY_TIE_FRACTION, TIGHT_MEMORY_FRACTION, prefer_headroom

GIB = 2**30
CAPACITY = 79.1 * GIB


def estimate(tokens_per_second: float, used_gib: float, tp: int = 8):
    return SimpleNamespace(tokens_per_second=tokens_per_second, memory_per_gpu_bytes=used_gib * GIB,
                           capacity_per_gpu_bytes=CAPACITY, config=SimpleNamespace(tp=tp))


def plan_of(*layouts) -> Plan:
    return Plan(model=None, cluster=None, request=None, num_gpus=1024, layouts=tuple(layouts), rejected=())


CLUSTER = resolve_cluster("128x8xH100")


def test_the_405b_near_tie():
    """Llama-3.1-405B on 128x8 H100: 235,062 tokens/s at 78.6 GiB (0.5 free, under 3% of 79.1 =
    2.37 GiB) against 234,968 at 73.5 GiB (5.6 free): 235,062 / 234,968 - 1 = 0.04% < 1%, so the
    second is recommended and the first named as passed over."""
    tight, roomy = estimate(235_062, 78.6), estimate(234_968, 73.5)
    plan = prefer_headroom(plan_of(tight, roomy), CLUSTER)
    assert plan.layouts == (roomy, tight) and plan.tight_passed_over is tight


def test_more_than_the_tie_keeps_the_fastest():
    """2% faster (above the 1% tie) at the edge of memory: kept first."""
    tight, roomy = estimate(102_000, 78.6), estimate(100_000, 60.0)
    plan = prefer_headroom(plan_of(tight, roomy), CLUSTER)
    assert plan.layouts == (tight, roomy) and plan.tight_passed_over is None


def test_tp_across_nodes_is_not_traded_for_room():
    """The roomy one's TP (16) leaves the node where the first's (8) does not: not moved."""
    tight, across = estimate(100_000, 78.6), estimate(99_900, 50.0, tp=16)
    assert prefer_headroom(plan_of(tight, across), CLUSTER).layouts == (tight, across)


@given(st.lists(st.tuples(st.floats(1e3, 1e6), st.floats(1.0, 79.0)), min_size=1, max_size=8))
def test_the_choice_is_the_fastest_with_room_or_within_the_tie(rows):
    layouts = sorted((estimate(t, m) for t, m in rows), key=lambda e: -e.tokens_per_second)
    plan = prefer_headroom(plan_of(*layouts), CLUSTER)
    first, fastest = plan.layouts[0], layouts[0]
    assert sorted(map(id, plan.layouts)) == sorted(map(id, layouts))
    room = TIGHT_MEMORY_FRACTION * CAPACITY
    if first is not fastest:
        assert CAPACITY - first.memory_per_gpu_bytes >= room > CAPACITY - fastest.memory_per_gpu_bytes
        assert first.tokens_per_second >= (1 - MEMORY_TIE_FRACTION) * fastest.tokens_per_second
        assert plan.tight_passed_over is fastest
        # no faster configuration with room was skipped
        assert all(CAPACITY - e.memory_per_gpu_bytes < room for e in layouts
                   if e.tokens_per_second > first.tokens_per_second)


def test_a_recommendation_at_the_edge_of_memory_says_so():
    """Qwen3-30B-A3B on one H100 node, 256 x 4,096: the recommendation leaves 0.6 of 79.1 GiB
    (under 3%) and nothing near its speed has more, so a line says so and what buys room (a CLI
    read: it was recommended without a word)."""
    from typer.testing import CliRunner

    from planner.cli import app

    result = CliRunner().invoke(app, ["--workload", "train", "--model", "qwen3-30b-a3b", "--cluster", "1x8xH100",
                                      "--global-batch", "256", "--seq-len", "4096"])
    text = " ".join(result.output.split())
    assert result.exit_code == 0
    assert "Memory margin: this configuration leaves 0.6 GiB of 79.1 GiB free" in text
    assert "buys room at some speed" in text


def test_an_unused_deepep_dispatcher_is_named():
    """--moe-dispatcher deepep where the recommendation has no expert parallelism (Mixtral-8x7B on
    2x8 A100: ep=1): a line says it is not used (it had been silent; a CLI read)."""
    import json

    from typer.testing import CliRunner

    from planner.cli import app

    result = CliRunner().invoke(app, ["--workload", "train", "--model", "mixtral-8x7b", "--cluster", "2x8xA100",
                                      "--moe-dispatcher", "deepep", "--global-batch", "256", "--seq-len", "4096",
                                      "--json"])
    assert result.exit_code == 0
    assert json.loads(result.output)["recommended"]["ep"] == 1
    text = " ".join(CliRunner().invoke(app, ["--workload", "train", "--model", "mixtral-8x7b", "--cluster",
                                             "2x8xA100", "--moe-dispatcher", "deepep", "--global-batch", "256",
                                             "--seq-len", "4096"]).output.split())
    assert "--moe-dispatcher deepep: not used: the recommended configuration has no expert parallelism" in text
