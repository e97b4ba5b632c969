"""Pipeline bubble quantities. Two different things, two names.

Legend: p stages, m micro-batches per step, v virtual stages (chunks) per device.
Sources: Huang et al. 2019 (GPipe, sec. 2.3); Narayanan et al. 2021 sec. 2.2.1-2.2.2
(PipeDream-Flush 1F1B and the interleaved schedule); worked example in
docs/cost-model.md#pipeline-bubble (4 stages: 1 micro-batch -> 75% idle; 4 micro-batches
-> 7 units, each busy 4).
"""

from __future__ import annotations


def bubble_fraction(num_stages: int, num_micro_batches: int, num_virtual_stages: int = 1) -> float:
    """Idle share of the step: (p-1)/(v*m + p-1); v = 1 for GPipe and 1F1B."""
    p, m, v = num_stages, num_micro_batches, num_virtual_stages
    return (p - 1) / (v * m + p - 1)


def bubble_over_compute_ratio(
    num_stages: int, num_micro_batches: int, num_virtual_stages: int = 1
) -> float:
    """Megatron's bubble time over ideal compute time: (p-1)/(v*m)."""
    p, m, v = num_stages, num_micro_batches, num_virtual_stages
    return (p - 1) / (v * m)


def pipeline_time_units(num_stages: int, num_micro_batches: int) -> int:
    """Forward-only GPipe with unit stage time: m + p - 1 units (e.g. 4 stages, 4 micro-batches: 4 + 4 - 1 = 7)."""
    return num_micro_batches + num_stages - 1


def serving_stage_utilization(num_batches_in_flight: int, num_stages: int) -> float:
    """vLLM runs p virtual engines; with k < p batches in flight each stage idles (p-k)/p."""
    return min(1.0, num_batches_in_flight / num_stages)


def microbatch_group_size(num_stages: int, num_micro_batches: int) -> int | None:
    """N, the micro-batches Megatron's interleaved schedule runs on one chunk before the next
    (--microbatch-group-size-per-virtual-pipeline-stage; default p): the least N in [p, m]
    with m % N zero or at least p, which forward_backward_pipelining_with_interleaving accepts
    (it raises outside [p, m], and for a last group of 1 to p-1 micro-batches, "dependency
    bubbles"; schedules.py core_v0.14.0 and core_v0.19.0). N = p where p divides m; N = m always
    qualifies, so None only for m < p. p = 16: m = 20 -> 20 (16..19 leave 4, 3, 2, 1);
    m = 40 -> 20; m = 48 -> 16."""
    p, m = num_stages, num_micro_batches
    if m < p:
        return None
    return next(n for n in range(p, m + 1) if m % n == 0 or m % n >= p)


def combined_1f1b_paired_share(num_stages: int, num_micro_batches: int, num_virtual_stages: int = 1) -> float:
    """The share of the critical path's chunk passes that Megatron's combined 1F1B
    (--overlap-moe-expert-parallel-comm) runs as a pair: micro-batch i+1's forward of a chunk
    beside micro-batch i's backward, each one's all-to-alls under the other's compute. The rest
    run alone, their exchanges exposed. Counting in chunk passes (one forward and one backward
    of one chunk): the step's critical path is the p - 1 passes that fill and drain the
    pipeline plus the last stage's T = v*m, i.e. T + p - 1 (the bubble's (p-1)/v micro-batches
    plus m). The last stage pairs T - W of its own, W its warm-up forwards: without a pipeline
    W = 1 (combined_1f1b_schedule_for_no_pipelining pairs forward i+1 with backward i, so m - 1
    pairs); interleaved, W = (v-1)*N + 1 at the last rank, N the micro-batch group
    (microbatch_group_size), the +1 Megatron's one extra forward for the overlap
    (get_pp_rank_microbatches, schedules.py core_v0.19.0), capped at T. The fill and drain
    passes are other stages' warm-up forwards and cool-down backwards: unpaired.
    p = 1, m = 1: 0 (nothing to pair); p = 1, m = 4: 3/4; p = 4, v = 8, m = 16: N = 4,
    W = 7*4 + 1 = 29, (128 - 29)/(128 + 3) = 99/131 = 0.756."""
    p, m, v = num_stages, num_micro_batches, num_virtual_stages
    total = v * m
    if p == 1:
        warm_up = 1
    else:
        group = microbatch_group_size(p, m) or p
        warm_up = (v - 1) * group + 1
    paired = total - min(total, warm_up)
    return paired / (total + p - 1)
