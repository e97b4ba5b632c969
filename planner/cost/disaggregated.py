"""Disaggregated serving: prefill-only and decode-only workers and their rate matching (pure, SI).

A prefill worker runs steps of prompts only, packed up to the token budget; its requests
arrive at a rate and queue for a step. A decode worker runs rounds of decodes only (no prompt
chunks) at concurrency C_d. The system serves the smaller of what the prefill workers can take
within the TTFT budget and what the decode workers finish within the TPOT limit.

Legend: I/O prompt/output tokens, B token budget per step, k micro-batches in flight (p),
b prompts per step, n_max = max(1, floor(B / I)), S_p = ceil(I / B) steps per prompt,
T(b) a prefill round of k steps of b prompts, rho utilization, r arrival rate per worker
(requests/s), T_d a decode round at C_d. Derivation: docs/cost-model.md (Serving: disaggregated).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from planner.cost.continuous_batching import (
    birth_death_sums,
    false_position_bracket,
    prompt_service_seconds,
)

MAX_PREFILL_UTILIZATION = 0.9
"""Without a TTFT limit a prefill worker is loaded to 90% of its capacity: the queueing wait
grows without bound as rho -> 1, and no deployment runs its prefill fleet saturated."""
RATE_SEARCH_STEPS = 40
"""max_prefill_rate prices at most this many rates between its ends."""
RATE_RELATIVE_TOLERANCE = 2.0**-24
"""max_prefill_rate stops once its bracket is this share of the rate wide, or an end's prefill
time this share of the limit below it."""
LOWEST_RATE_FRACTION = 2.0**-30
"""The search's lower end, as a share of the capacity: a lone prompt (no queueing)."""
RATE_GRID_POINTS = 32
"""max_prefill_rate first brackets the rate between two of this many equal steps up to the cap,
each priced once per worker however many limits are searched (`grid`)."""


GATED_MIN_PROMPTS = 3
"""gated_batch_prefill prices workers whose step holds at least 3 whole prompts. Its mean field
leaves out the queue the n_max cap keeps, which forms early where a step holds few: against the
step simulation of real workers (1x8 H100, vLLM's 8,192-token budget, 10,000-20,000 Poisson
arrivals, two seeds), at n_max = 2 (4,096-token prompts; Llama-3.1-8B tp 1-2, 70B tp 4-8,
Qwen3-30B-A3B tp 2) it ran -2% to +5% up to 70% of capacity but -13% to -45% at 80-90%, where
the M/D/1 at full steps stays within -10% to +13% at every load (and is exact at n_max = 1: one
prompt a step, a deterministic service of T(1)); at n_max = 3 (2,700-token prompts) gated batches
are within 8% up to 80% and -9% to -21% at 90%, the M/D/1 -5% to -15% throughout."""


@dataclass(frozen=True)
class PrefillWorker:
    prompts_per_step_max: float
    """n_max = max(1, floor(B / I)) whole prompts per step (1 when a prompt is chunked)."""
    steps_per_prompt: int
    """S_p = ceil(I / B)."""
    in_flight: int
    """k steps per round (pipeline micro-batches)."""
    full_round_seconds: float
    """T(n_max): a round of k full steps."""
    round_table: tuple[float, ...] = ()
    """T(1), T(2), ..., T(n_max): a round at each whole number of prompts per step (T between
    them is linear); empty: T(1) = T(n_max), the only size."""
    pipeline_stages: int = 1
    """p: a pipelined worker starts a step every T / p (its p micro-batches in flight follow
    each other through the stages); a prompt still takes the whole round T through them, and
    a prompt of S_p chunks fills S_p consecutive micro-batches (prompt_service_seconds)."""
    micro_batch_table: tuple[tuple[float, float], ...] = ()
    """A pipelined worker of whole prompts (S_p = 1, no lockstep lanes): (path, busiest stage)
    of one micro-batch of 1, 2, ..., n_max prompts, for pipelined_prefill_seconds; empty: the
    round model (prefill_at_rate)."""
    schedules_ahead: bool = False
    """vLLM's async scheduling on a worker without PP (its default at 0.33.0): the next step is
    scheduled as one starts (gated_batch_prefill)."""

    @property
    def gated_batches(self) -> bool:
        """One engine stepping whole prompts, GATED_MIN_PROMPTS or more a step (p = 1, no lockstep
        lanes, S_p = 1): priced by gated_batch_prefill; the others by prefill_at_rate's M/D/1 or
        chain."""
        return (self.pipeline_stages == 1 and self.in_flight == 1 and self.steps_per_prompt == 1
                and self.prompts_per_step_max >= GATED_MIN_PROMPTS)

    @cached_property
    def log_throughputs(self) -> tuple[float, ...]:
        """log pipelined_throughput(n) for n = 1..p n_max (index n - 1): pipelined_prefill_seconds
        walks its chain through them at every rate a TTFT bisection tries."""
        return tuple(math.log(pipelined_throughput(self, n))
                     for n in range(1, self.pipeline_stages * len(self.micro_batch_table) + 1))

    @property
    def capacity_requests_per_second(self) -> float:
        """k * n_max / (S_p * T(n_max))."""
        return self.in_flight * self.prompts_per_step_max / (self.steps_per_prompt * self.full_round_seconds)


@dataclass(frozen=True)
class PrefillLoad:
    """A prefill worker at arrival rate r."""

    rate_per_second: float
    prompts_per_step: float
    round_seconds: float
    utilization: float
    wait_seconds: float
    """M/D/1 mean queueing wait: rho * D / (2 * (1 - rho)), D = S_p * T(b) / p."""
    prefill_seconds: float
    """wait + the prompt's service (prompt_service_seconds): arrival to its KV computed."""
    chained: bool = False
    """Priced by pipelined_prefill_seconds (a pipelined worker of whole prompts): the wait is
    the chain's time in the worker less one micro-batch's path, not an M/D/1 wait."""
    busy_fraction: float | None = None
    """Priced by gated_batch_prefill: the share of time a step runs (U); None otherwise."""
    lag_fraction: float = 0.0
    """gated_batch_prefill under async scheduling: the share of steps a prompt arriving during one
    waits a whole step more for (the step scheduled ahead holds prompts left over)."""


def prefill_worker(input_len: int, budget_tokens: int, in_flight: int,
                   round_seconds: Callable[[float], float], pipeline_stages: int = 1,
                   micro_batch_seconds: Callable[[float], tuple[float, float]] | None = None,
                   schedules_ahead: bool = False) -> PrefillWorker:
    """`round_seconds(b)`: a round of k steps, each carrying b prompts of I / S_p tokens;
    `pipeline_stages` p of the k (the rest are lockstep expert-parallel lanes);
    `micro_batch_seconds(b)`: (path, busiest stage) of one micro-batch of b whole prompts, for a
    pipelined worker without lanes (PrefillWorker.micro_batch_table); `schedules_ahead`: vLLM's
    async scheduling (PrefillWorker.schedules_ahead, p = 1 only)."""
    steps = math.ceil(input_len / budget_tokens)
    most = max(1, budget_tokens // input_len) if steps == 1 else 1
    table = tuple(round_seconds(float(b)) for b in range(1, most + 1))
    pipelined = micro_batch_seconds is not None and pipeline_stages > 1 and steps == 1 and in_flight == pipeline_stages
    micro = tuple(micro_batch_seconds(float(b)) for b in range(1, most + 1)) if pipelined else ()
    return PrefillWorker(float(most), steps, in_flight, table[-1], table, pipeline_stages, micro,
                         schedules_ahead and pipeline_stages == 1)


PREFILL_CHAIN_STATES = 256
"""pipelined_prefill_seconds walks up to this many states one by one; past it, in about this
many equal blocks (continuous_batching.birth_death_sums: a worker of 512 one-token prompts a
step over 64 stages has 32,768 states, and a TTFT bisection prices the chain 40 times)."""


def pipelined_throughput(worker: PrefillWorker, prompts: int) -> float:
    """Prompts a second a pipelined prefill worker (micro_batch_table) completes with n =
    `prompts` in it. vLLM puts every waiting prompt, up to n_max, into the next micro-batch, and
    with nothing left to schedule its batch queue fills with empty steps and it waits out the
    oldest (serving_sim._Clock): n <= n_max prompts ride one micro-batch, n / path(n); more
    fill m = min(p, ceil(n / n_max)) micro-batches of n_max (the last the rest), which follow
    each other through the stages: min(n, p n_max) / max(path(n_max), the busiest stage's
    time over the m). 1 prompt, path 12 ms: 83.3 /s."""
    table, p, most = worker.micro_batch_table, worker.pipeline_stages, len(worker.micro_batch_table)
    if prompts <= most:
        return prompts / table[prompts - 1][0]
    batches = min(p, math.ceil(prompts / most))
    carried = min(prompts, p * most)
    rest = carried - (batches - 1) * most
    busy = (batches - 1) * table[most - 1][1] + table[rest - 1][1]
    return carried / max(table[most - 1][0], busy)


def pipelined_prefill_seconds(worker: PrefillWorker, rate: float) -> float:
    """A prompt's mean time in a pipelined prefill worker (arrival to its KV computed) at
    `rate` r a second: the prompts in the worker as a birth-death chain, arrivals at r and
    completions at pipelined_throughput(n) (the worker's flow-equivalent server, as
    continuous_batching.flow_equivalent_wait_seconds), P(n) ~ prod_{j<=n} r / X(j), geometric
    past p n_max; E[N] / r by Little's law. A pipeline only overlaps micro-batches once more
    than a budget's prompts wait, so at a light load it runs one micro-batch at a time, each
    taking a whole path, not one every T / p: a 2-stage worker at 40% of its capacity (a
    step simulation of the same worker: 105 ms) was priced 33 ms by the round model, 121 ms
    by this chain. Infinite where even p full micro-batches complete fewer than r. Lone: the
    path of one prompt."""
    most, top = len(worker.micro_batch_table), worker.pipeline_stages * len(worker.micro_batch_table)
    if rate <= 0:
        return worker.micro_batch_table[0][0]
    ratio = rate / math.exp(worker.log_throughputs[-1])
    if ratio >= 1:
        return math.inf
    log_rate = math.log(rate)

    def log_step(start: int, stop: int) -> float:
        """log P(stop) / P(start): up to n_max X(n) = n / path(n), the n exact (lgamma) and the
        path at the block's middle; past it X at the middle."""
        if stop == start + 1:
            return log_rate - worker.log_throughputs[start]
        if start < most < stop:
            return log_step(start, most) + log_step(most, stop)
        middle = (start + 1 + stop) // 2
        if stop <= most:
            path = worker.micro_batch_table[middle - 1][0]
            return (stop - start) * (log_rate + math.log(path)) - (math.lgamma(stop + 1) - math.lgamma(start + 1))
        return (stop - start) * (log_rate - math.log(pipelined_throughput(worker, middle)))

    sums = birth_death_sums(log_step, top, PREFILL_CHAIN_STATES, cut_after=most)
    mass, mean = sums.mass, sums.mean
    if sums.last == top:  # the geometric tail past p n_max
        last = sums.last_weight
        mass += last * ratio / (1 - ratio)
        mean += last * (top * ratio / (1 - ratio) + ratio / (1 - ratio) ** 2)
    return mean / mass / rate


def operating_prompts_per_step(worker: PrefillWorker, rate: float) -> float:
    """The least b in [1, n_max] with b >= r T(b) / k: a step carries what arrived while the
    step before it ran. T is linear between whole prompt counts, so on the first segment
    [j, j + 1] whose end satisfies it, b = a (T_j - j dT) / (1 - a dT) with a = r / k."""
    a = rate / worker.in_flight
    table = worker.round_table or (worker.full_round_seconds,)
    if a * table[0] <= 1:
        return 1.0
    for j in range(1, len(table)):
        start, end = table[j - 1], table[j]
        if a * end <= j + 1:
            slope = end - start
            return min(float(j + 1), max(float(j), a * (start - j * slope) / (1 - a * slope)))
    return worker.prompts_per_step_max


def prefill_at_rate(worker: PrefillWorker, rate: float, round_seconds: Callable[[float], float]) -> PrefillLoad:
    """b = the prompts a step carries: what arrives while the step before it runs,
    b = clamp(r * T(b) / k, 1, n_max), the least fixed point (operating_prompts_per_step);
    a prompt's own service S (prompt_service_seconds); rho = r / capacity (the worker's share of time busy
    at full steps); wait = rho * D / (2 (1 - rho)) (M/D/1 mean wait, Kleinrock, Queueing
    Systems vol. 1, eq. 5.76 with deterministic service), D = S_p T / p the interval at which
    the worker takes the next prompts: a pipelined worker of p stages starts a micro-batch every
    T / p, so a prompt waits for the next start, not for a whole round (vLLM's pipeline keeps
    p batches in flight); lockstep expert-parallel lanes start together, every T. A prompt of
    S_p > 1 chunks is served in T (1 + (S_p - 1) / p) (prompt_service_seconds). (b once
    took the full round, r * T(n_max) / k: a step as long as a full one for every prompt, 2-4
    times the waits a simulation of the same worker gives when T grows with b.) A pipelined
    worker of whole prompts (micro_batch_table) overlaps micro-batches only once prompts wait:
    its time is pipelined_prefill_seconds', the wait that less one micro-batch's path. One
    engine stepping whole prompts (PrefillWorker.gated_batches) is gated_batch_prefill's."""
    if worker.gated_batches and rate > 0:
        return gated_batch_prefill(worker, rate, round_seconds)
    steps = worker.steps_per_prompt
    b = operating_prompts_per_step(worker, rate)
    seconds = round_seconds(b)
    service = prompt_service_seconds(steps, seconds, worker.pipeline_stages)
    rho = rate / worker.capacity_requests_per_second
    if worker.micro_batch_table:  # a pipelined worker of whole prompts: its chain, less one
        # micro-batch's path at the operating b for the wait
        inside = pipelined_prefill_seconds(worker, rate)
        table = worker.micro_batch_table
        path = table[min(len(table), max(1, round(b))) - 1][0]
        return PrefillLoad(rate, b, seconds, rho, max(0.0, inside - path), inside, chained=True)
    interval = steps * seconds / worker.pipeline_stages
    wait = math.inf if rho >= 1 else rho * interval / (2 * (1 - rho))
    return PrefillLoad(rate, b, seconds, rho, wait, wait + service)


MEAN_BATCH_ROUNDS = 40
"""gated_batch_prefill's false-position rounds for the mean prompts a step."""
MEAN_BATCH_TOLERANCE = 2.0**-30
"""gated_batch_prefill stops once the mean prompts a step are bracketed to this share of them,
or r T(b) + p0 - b is within it of 0 (a billionth of a prompt moves no printed figure)."""


def gated_batch_prefill(worker: PrefillWorker, rate: float, round_seconds: Callable[[float], float]) -> PrefillLoad:
    """One engine stepping whole prompts at r a second (PrefillWorker.gated_batches). vLLM's
    scheduler puts every waiting prompt, up to n_max, into its next step, so a step carries what
    arrived while the one before it ran, b' = A ~ Poisson(r T(b)), or, after the worker idled,
    the one prompt that woke it (b' = 1 where A = 0):
    mean prompts a step   mu = r T(mu) + p0, p0 = exp(-r T(mu)) (a root in [1, n_max], the
                          least where T is smooth)
    second moment         s (1 - r^2 c^2) = r T(mu) + r^2 (a^2 + 2 a c mu) + p0, T(b) taken as
                          a + c b about mu (c the slope over [mu / 2, 2 mu])
    step moments          E[T] = T(mu), E[T^2] = a^2 + 2 a c mu + c^2 s
    busy share            U = E[T] / (E[T] + p0 / r) (an idle spell of 1 / r after each step
                          that nothing arrived during)
    A prompt arriving while a step runs (PASTA: with probability U) waits out its rest,
    E[T^2] / (2 E[T]) (the step it lands in is length-biased), and rides the next step with
    the others that came during that one, 1 + r E[T^2] / E[T] prompts (at most n_max); one
    arriving at an idle worker runs alone: prefill = U (E[T^2] / (2 E[T]) + T(1 + r E[T^2] /
    E[T])) + (1 - U) T(1). Under async scheduling (schedules_ahead) the step scheduled ahead,
    as one starts, is empty while every step takes all that waits (the engine then schedules
    at the step's end, as without it: serving_sim's module docstring); once a step leaves
    prompts over (A > n_max, probability q) the steps run one behind, each prompt waiting a step
    more, until one finds nothing (A = 0): lag_share(q, p0) of the steps, the wait U E[T] more.
    Approximations: p0 and E[T] at the mean step (Jensen's inequality puts both higher where T
    bends), and no queue from the n_max cap (GATED_MIN_PROMPTS keeps steps of one or two prompts
    on the M/D/1). Against the step simulation (docs/cost-model.md, Serving: disaggregated, "Gated
    batches": real workers' tables, 30-80% of capacity within 10%, -21% to +35% at 90%; the M/D/1
    at full steps had -33% to +91% and +258%).
    Worked (tests/disagg/test_disagg_cost.py): T(b) = 0.01 + 0.09 b s, n_max = 8, r = 7 /s:
    mu = 1.3001 (T 0.12701 s, p0 0.4110), s = 2.3540, E[T^2] = 0.021507 s^2, U = 0.6838, the
    rest of a step 0.08467 s, its own step of 2.1854 prompts 0.20668 s, alone 0.1 s: prefill
    0.2309 s (the simulation: 0.2312 s; the M/D/1 at full steps gave 0.1884 s)."""
    most = worker.prompts_per_step_max

    def excess(b: float) -> float:  # r T(b) + exp(-r T(b)) - b: >= 0 at b = 1, falls through the root
        load = rate * round_seconds(b)
        return load + math.exp(-load) - b

    if excess(most) >= 0:
        mu = most
    else:
        low, high = false_position_bracket(1.0, most, lambda b: -excess(b), MEAN_BATCH_TOLERANCE, MEAN_BATCH_ROUNDS,
                                           MEAN_BATCH_TOLERANCE)
        mu = min((low, high), key=lambda b: abs(excess(b)))
    t_mu = round_seconds(mu)
    p0 = math.exp(-rate * t_mu)
    # the slope over [mu / 2, 2 mu] (within [1, n_max]): continuous in mu, where the table's own
    # segment's jumped as mu crossed a whole count, and 1 / (1 - r^2 c^2) turned the jump into a
    # 13% fall of the price as the rate rose (a review)
    lo, hi = max(1.0, mu / 2), min(most, 2 * mu)
    c = (round_seconds(hi) - round_seconds(lo)) / (hi - lo) if hi > lo else 0.0
    a = t_mu - c * mu
    rc = rate * c
    if abs(rc) < 1:
        s = (rate * t_mu + rate**2 * (a * a + 2 * a * c * mu) + p0) / (1 - rc * rc)
    else:  # past capacity at this slope: the Poisson spread about the mean alone
        s = mu * mu + mu
    mean_t, mean_t2 = t_mu, max(a * a + 2 * a * c * mu + c * c * s, t_mu * t_mu)
    busy = mean_t / (mean_t + p0 / rate)
    biased = mean_t2 / mean_t  # the length-biased step
    lag = 0.0
    if worker.schedules_ahead:
        lag = lag_share(poisson_tail_above(rate * t_mu, int(most)), p0)
    wait = busy * (biased / 2 + lag * mean_t)
    alone = round_seconds(1.0)
    own = round_seconds(min(most, 1 + rate * biased))
    service = busy * own + (1 - busy) * alone
    return PrefillLoad(rate, mu, t_mu, rate / worker.capacity_requests_per_second, wait, wait + service,
                       busy_fraction=busy, lag_fraction=lag)


LAG_HORIZON_STEPS = 100_000
"""The steps over which lag_share averages (about 80 minutes of 50 ms steps: a serving run's
length). A worker enters the one-behind state once in 1 / q steps; where that is longer than any
run (q = 1e-22: a thousand prompts a step, a mean of 160), the state's long-run share (near 1
where p0 is as small) is never seen, and pricing it had added a step to every prompt (+66%
against the step simulation, a review)."""


def lag_share(enter: float, leave: float, steps: int = LAG_HORIZON_STEPS) -> float:
    """The expected share of `steps` steps a two-state chain spends in its second state, starting
    in the first, entering with probability `enter` and leaving with `leave` a step: pi (1 - (1 -
    (1 - e)^n) / (e n)), pi = enter / e, e = enter + leave; pi where e n is large, about enter n /
    2 where it is small. enter = 0.01, leave = 0.04: pi = 0.2 (e n = 5,000)."""
    either = enter + leave  # e: the chance a step changes the state, either way
    if either <= 0:
        return 0.0
    if either >= 1:
        return enter / either
    relaxed = -math.expm1(steps * math.log1p(-either))  # 1 - (1 - e)^n
    return enter / either * (1 - relaxed / (either * steps))


def poisson_tail_above(mean: float, n: int) -> float:
    """P(X > n) for X ~ Poisson(mean), summed from k = n + 1 up in logs (1 - the cdf left
    rounding noise of 1e-16 where the tail is 1e-22, and exp(-mean) underflows past a mean of 745:
    a review); 0 when n >= mean past the terms' reach."""
    if mean <= 0:
        return 0.0
    if n < mean - 12 * math.sqrt(mean) - 12:  # the tail is all but the whole mass
        below = 0.0
        log_term = -mean  # P(0)
        for k in range(0, n + 1):
            below += math.exp(log_term)
            log_term += math.log(mean) - math.log(k + 1)
        return max(0.0, 1.0 - below)
    total, k = 0.0, n + 1
    log_term = k * math.log(mean) - mean - math.lgamma(k + 1)
    while True:
        term = math.exp(log_term)
        total += term
        if k > mean and term <= total * 2.0**-53:
            return min(1.0, total)
        k += 1
        log_term += math.log(mean) - math.log(k)


def max_prefill_rate(worker: PrefillWorker, limit_seconds: float | None,
                     round_seconds: Callable[[float], float], grid: dict[int, float] | None = None) -> float:
    """The largest arrival rate per worker whose prefill_seconds meets `limit_seconds` (the
    TTFT budget left for the prefill), at most MAX_PREFILL_UTILIZATION of the capacity (the
    rate without a limit, so no limit, the loosest, never plans less than a limit does); 0
    when even a lone prompt misses. prefill_seconds grows with r, so the rate is bracketed
    between two of RATE_GRID_POINTS equal steps up to that cap (by bisection over them) and
    found inside by false position (continuous_batching.false_position_bracket) to
    RATE_RELATIVE_TOLERANCE of the rate or of the limit. `grid`: the caller's memo of this
    worker's prefill_seconds at the steps (k -> seconds), shared by the searches for every limit
    (a disaggregated search asks one worker for some 80 limits, one per decode shape and link).
    Bisecting the whole range 40 times priced a pipelined worker's chain 40 times per limit:
    gpt-oss-120b on 4x8 B200, 64/256 tokens at --max-ttft-ms 100, 14.8 s of CLI (5.4 s now)."""
    capacity = worker.capacity_requests_per_second
    top_rate = MAX_PREFILL_UTILIZATION * capacity
    if limit_seconds is None:
        return top_rate

    def seconds(rate: float) -> float:
        return prefill_at_rate(worker, rate, round_seconds).prefill_seconds

    lowest_rate = capacity * LOWEST_RATE_FRACTION
    if seconds(lowest_rate) > limit_seconds:
        return 0.0
    grid = {} if grid is None else grid

    def at_step(k: int) -> float:
        if k not in grid:
            grid[k] = seconds(top_rate * k / RATE_GRID_POINTS)
        return grid[k]

    if at_step(RATE_GRID_POINTS) <= limit_seconds:
        return top_rate
    low, high = 0, RATE_GRID_POINTS  # step 0: the lowest rate, which meets the limit
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if at_step(middle) <= limit_seconds else (low, middle)
    # to within RATE_RELATIVE_TOLERANCE of the rate or of the limit, aiming that far below the
    # limit so that an end that stops the search by its value meets the limit too
    slack_seconds = limit_seconds * RATE_RELATIVE_TOLERANCE
    good, bad = false_position_bracket(lowest_rate if low == 0 else top_rate * low / RATE_GRID_POINTS,
                                       top_rate * high / RATE_GRID_POINTS,
                                       lambda rate: seconds(rate) - limit_seconds + slack_seconds,
                                       RATE_RELATIVE_TOLERANCE, RATE_SEARCH_STEPS, slack_seconds)
    if bad - good > RATE_RELATIVE_TOLERANCE * bad and seconds(bad) <= limit_seconds:
        return bad  # the search stopped on the upper end's value
    return good


def decode_requests_per_second(concurrency: float, output_len: int, round_seconds: float) -> float:
    """C_d / (O * T_d): every request holds a slot for O rounds (its first token is sampled on
    the decode worker, which loads the prompt's KV instead of computing it)."""
    return concurrency / (output_len * round_seconds)


CLOSED_LOOP_BISECTIONS = 60
"""Most rounds of closed_loop_rate's false position."""
CLOSED_LOOP_RELATIVE_TOLERANCE = 1e-5
"""closed_loop_rate stops once its bracket is narrower than this share of its upper end (the
rate to five digits; each round prices the deployment's decode concurrency by its own bisection,
and 40 rounds for each of ten candidates took 2 s of a 70B plan on 2x8 H100)."""


def closed_loop_rate(clients: float, capacity_requests_per_second: float,
                     e2e_seconds: Callable[[float], float], upper_per_s: float | None = None) -> float:
    """The requests/s `clients` closed-loop clients (each sends its next request when its last
    one ends, as vllm bench serve's --max-concurrency does) keep a deployment at: by Little's
    law clients = R * E2E(R); E2E grows with R, so R * E2E(R) grows too and false position
    (continuous_batching.false_position_bracket: some 5 pricings where bisection took 17) finds the
    one R; the capacity where the clients would keep more in flight than it serves at it (they
    then wait client-side). Worked: E2E(R) = 2 s + 0.1 s * R / (1 /s), capacity 10 /s: 8
    clients give 0.1 R^2 + 2 R - 8 = 0, R = (-2 + sqrt(7.2)) / 0.2 = 3.4164 /s; 30 clients
    (10 * 3 s = 30 in flight at capacity) or more, 10 /s. `upper_per_s`: a rate known to be at
    least R (disagg_search.clients_rate_bound's), which narrows the bracket; from
    below, clients / E2E(upper) bounds it (E2E grows with R; where it dips instead, R is sought
    below that bound: E2E 2 s below 6 /s and 1.5 s from it, 8 clients: the bound 8 / 1.5 s =
    5.33 /s holds 10.7 in flight, R = 4 /s)."""
    seen: dict[float, float] = {}

    def excess(rate: float) -> float:  # in flight at `rate` beyond the clients
        if rate not in seen:
            seen[rate] = rate * e2e_seconds(rate) - clients if rate > 0 else -clients
        return seen[rate]

    if excess(capacity_requests_per_second) <= 0:
        return capacity_requests_per_second
    high = capacity_requests_per_second if upper_per_s is None else min(upper_per_s, capacity_requests_per_second)
    if excess(high) < 0:  # not above R after all (an E2E that dips as R grows): the whole bracket
        high = capacity_requests_per_second
    # R <= high, so E2E(R) <= E2E(high) and R = clients / E2E(R) >= clients / E2E(high)
    low = min(high, clients / (excess(high) + clients) * high)
    if excess(low) >= 0:
        if excess(low) <= CLOSED_LOOP_RELATIVE_TOLERANCE * clients:  # E2E flat over the bracket: low is R
            return low
        # E2E higher at `low` than at `high` (a decode round that shortens as the load grows, past
        # vLLM's fused all-reduce size): R is below low (a review: Llama-3.1-70B on 2x8 H200 at 32
        # clients was given 4.62 req/s at 7.06 s, 32.6 in flight, above its 4.56 without a limit)
        low, high = 0.0, low
    # to the rate's five digits, then the end nearer Little's law (a secant that lands on R
    # exactly stops the search with R the upper end, where the lower may be far; clients = 8 at
    # E2E 2 s gave 0 for 4 /s)
    return min(false_position_bracket(low, high, excess, CLOSED_LOOP_RELATIVE_TOLERANCE, CLOSED_LOOP_BISECTIONS),
               key=lambda rate: abs(excess(rate)))


DECODE_CONCURRENCY_ROUNDS = 40
"""Most false-position rounds of decode_concurrency_at_rate."""
DECODE_CONCURRENCY_TOLERANCE_SEQUENCES = 2.0**-20
"""decode_concurrency_at_rate stops once its bracket is narrower than this many sequences (about
a millionth of one), which moves no printed figure."""


def decode_concurrency_at_rate(requests_per_second: float, output_len: int,
                               round_seconds: Callable[[float], float], cap: float) -> float:
    """The sequences a decode rank runs when it is handed `requests_per_second`: by Little's law
    C = R * O * T_d(C) (each request holds a slot for O rounds of T_d), at most `cap` (the
    concurrency its TPOT limit and KV cache allow, where T_d(cap) priced its rate); a rank whose
    mean occupancy is below one sequence runs at T_d(1), C = R * O * T_d(1). T_d grows with C,
    so C lies between 1 and R * O * T_d(cap); false position on C - R * O * T_d(C)
    (continuous_batching.false_position_bracket) keeps the upper end, where the rank keeps up
    with its rate (a fixed-point iteration oscillates on the small steps a round's time takes
    with C; bisection took 24 rounds to the tolerance where T_d is smooth between them, and the
    closed loop of --max-concurrency runs it some 2,000 times a search). Worked
    (test_decode_concurrency_at_rate_by_hand): T_d(C) = 10 ms + 0.1 ms * C,
    R = 20 /s, O = 256: C = 5,120 * (0.01 + 0.0001 C) -> C = 51.2 / 0.488 = 104.9 sequences at
    T_d 20.5 ms, where pricing T_d at the cap of 200 (30 ms) gave 153.6."""
    rate = requests_per_second * output_len
    high = min(cap, rate * round_seconds(cap))
    if high <= 1.0:
        return min(high, rate * round_seconds(1.0))
    if high - rate * round_seconds(high) <= 0.0:  # the rate fills the cap (or T_d steps up just below it)
        return high
    low, at_one = 1.0, rate * round_seconds(1.0)
    if at_one <= low:  # idle part of the time: a lone sequence's rounds
        return at_one
    return false_position_bracket(low, high, lambda c: c - rate * round_seconds(c),
                                  DECODE_CONCURRENCY_TOLERANCE_SEQUENCES / high, DECODE_CONCURRENCY_ROUNDS)[1]


@dataclass(frozen=True)
class RateMatch:
    requests_per_second: float
    """R = min(N_p * r_p, N_d * r_d)."""
    prefill_requests_per_second: float
    decode_requests_per_second: float
    binding: str
    """prefill | decode: the side that limits R."""


def rate_match(prefill_rate_per_worker: float, num_prefill: int, decode_rate_per_worker: float,
               num_decode: int) -> RateMatch:
    """R = min(N_p * r_p, N_d * r_d): requests leave the prefill workers as fast as they enter
    them, and the decode workers take no more than they finish."""
    prefill = num_prefill * prefill_rate_per_worker
    decode = num_decode * decode_rate_per_worker
    return RateMatch(min(prefill, decode), prefill, decode, "prefill" if prefill < decode else "decode")
