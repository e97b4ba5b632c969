"""Steady state of one replica under continuous batching with chunked prefill (pure; SI units).

vLLM's V1 scheduler (vllm/v1/core/sched/scheduler.py, Scheduler.schedule) fills every step
with the running sequences' next tokens first and then prompt tokens, up to the token budget
max_num_batched_tokens per step, chunking a prompt that does not fit. A closed loop of C
clients (what `vllm bench serve --max-concurrency C` runs) keeps C requests in the system:
a request spends its prompt's rounds, then O - 1 decode rounds, and is replaced at once.

Legend: C concurrency, I/O mean prompt/output tokens, D = O - 1 decode rounds, B the token
budget of one scheduled step, k micro-batches per round (k steps), n_d decoding sequences
per round, S_p rounds a prompt's chunks take, W rounds a prompt waits for budget, lambda
requests finishing per round. Derivation: docs/cost-model.md (Serving: continuous batching).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from planner.cost.serving_time import StepLoad, causal_pairs

ROUND_ALIGNMENT_ROUNDS = 1.0
"""Rounds a new request waits before its first step while other requests keep the engine
busy: in a closed loop it is sent when another request finishes, just after a step ended,
while the engine has already scheduled and started the next step (vLLM V1 schedules step
n+1 as soon as step n's outputs are processed), so it joins the step after: about one
round, scaled by (C - 1) / C, the share of the others (alone, it finds the engine idle)."""

SOLVER_ITERATIONS = 4
"""Fixed-point passes between the decode count and the prompt's chunking (the chunk a step
has room for depends on how many sequences decode); converged after 2-3 in practice."""


@dataclass(frozen=True)
class SteadyState:
    concurrency: float
    decode_seqs: float
    """Sequences decoding per round (all micro-batches)."""
    prefill_tokens_per_step: float
    """Prompt tokens per round on average."""
    prefill_rounds: float
    """S_p: rounds one prompt's chunks take."""
    queue_rounds: float
    """W: rounds a prompt waits for budget (0 unless the budget is saturated)."""
    budget_bound: bool
    """Prompts and decodes together need the whole token budget: requests queue."""
    decode_round_seconds: float
    """A round with no prompt chunk."""
    prompt_round_seconds: float
    """A round that carries one prompt's chunk (or the mean prompt load when several
    prompts share every round)."""
    step_seconds: float
    """Mean round = mean inter-token latency = TPOT under load."""
    ttft_seconds: float
    e2e_seconds: float
    throughput_tokens_per_second: float
    """Output tokens per second of the replica (Little's law: C * O / E2E)."""
    waiting_clients: float = 0.0
    """Clients beyond the C the engine runs (KV-limited), each waiting for a running request
    to finish before its own is admitted."""
    slot_wait_seconds: float = 0.0
    """The wait for a slot those clients add to every request's TTFT and E2E."""

    @property
    def tpot_seconds(self) -> float:
        """TPOT under load (what vllm bench serve reports): the mean round."""
        return self.step_seconds

    @property
    def requests_per_second(self) -> float:
        return (self.concurrency + self.waiting_clients) / self.e2e_seconds


def with_waiting_clients(steady: SteadyState, clients: float) -> SteadyState:
    """The steady state of `clients` closed-loop clients when the engine runs only
    steady.concurrency = C of them: the others queue FIFO for a slot. The engine finishes
    lambda = C / E2E requests per second (Little's law on the running ones), so by Little's
    law on the whole loop each request waits (clients - C) / lambda before admission, in its
    TTFT and E2E; throughput is unchanged. None waiting: the same state."""
    waiting = clients - steady.concurrency
    if waiting <= 0:
        return steady
    wait = waiting * steady.e2e_seconds / steady.concurrency
    return replace(steady, waiting_clients=waiting, slot_wait_seconds=wait,
                   ttft_seconds=steady.ttft_seconds + wait, e2e_seconds=steady.e2e_seconds + wait)


def steady_state(concurrency: float, input_len: int, output_len: int, step_budget_tokens: int,
                 in_flight: int, round_seconds: Callable[[StepLoad, StepLoad | None], float],
                 first_token_seconds: float) -> SteadyState:
    """Per round: n_d = lambda * D decode tokens and lambda * I prompt tokens, lambda =
    C / (D + S_p + W). A prompt's chunk in a step is what the budget leaves after that step's
    decodes, B - n_d / k, so S_p = ceil(I / (B - n_d / k)). When lambda * (I + D) would
    exceed the k * B tokens a round can carry, lambda = k * B / (I + D) and the excess
    clients wait W rounds. With q = lambda * S_p prompt chunks per round on average: q <= 1
    means a fraction q of rounds carry one chunk of I / S_p tokens in one micro-batch (the rest
    decode only); q > 1 means every round carries the mean lambda * I prompt tokens: one chunk
    in one micro-batch, the other q - 1 spread (continuous at q = 1).
    TTFT = first-token cost + (alignment + W) rounds + S_p prompt rounds;
    TPOT = the mean round; E2E = TTFT + D * TPOT; throughput = C * O / E2E."""
    c, i, d = concurrency, input_len, max(output_len - 1, 0)
    context = i + output_len / 2
    round_budget = in_flight * step_budget_tokens
    rate = c / (d + 1)
    prefill_rounds, queue_rounds, bound = 1.0, 0.0, False
    for _ in range(SOLVER_ITERATIONS):
        room = max(step_budget_tokens - rate * d / in_flight, 1.0)
        prefill_rounds = float(math.ceil(i / room))
        rate = c / (d + prefill_rounds)
        bound = rate * (i + d) > round_budget
        if bound:
            rate = round_budget / (i + d)
    queue_rounds = max(0.0, c / rate - d - prefill_rounds) if bound else 0.0
    decode_seqs = rate * d
    decode = StepLoad(decode_seqs, decode_seqs * context)
    decode_round = round_seconds(decode, None)
    chunks_per_round = rate * prefill_rounds
    one_chunk = StepLoad(0, 0, i / prefill_rounds, causal_pairs(i) / prefill_rounds, 1 / prefill_rounds)
    if chunks_per_round <= 1:
        prompt_round = round_seconds(decode, one_chunk)
        mean_round = (1 - chunks_per_round) * decode_round + chunks_per_round * prompt_round
    else:
        others = chunks_per_round - 1
        spread = StepLoad(decode_seqs, decode_seqs * context, others * one_chunk.prefill_tokens,
                          others * one_chunk.prefill_attention_pairs, others * one_chunk.prompts_completing)
        prompt_round = mean_round = round_seconds(spread, one_chunk)
    alignment = ROUND_ALIGNMENT_ROUNDS * (1 - 1 / c)
    ttft = first_token_seconds + (alignment + queue_rounds) * mean_round + prefill_rounds * prompt_round
    e2e = ttft + d * mean_round
    return SteadyState(
        concurrency=c,
        decode_seqs=decode_seqs,
        prefill_tokens_per_step=rate * i,
        prefill_rounds=prefill_rounds,
        queue_rounds=queue_rounds,
        budget_bound=bound,
        decode_round_seconds=decode_round,
        prompt_round_seconds=prompt_round,
        step_seconds=mean_round,
        ttft_seconds=ttft,
        e2e_seconds=e2e,
        throughput_tokens_per_second=c * output_len / e2e,
    )
