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

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace

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
    prompts share every round), as the prompt's own chunks see it (behind a least-loaded
    router, beside the decodes of the replica it joins)."""
    step_seconds: float
    """Mean round: what the engine's steps take on average (every prompt chunk counted)."""
    ttft_seconds: float
    e2e_seconds: float
    throughput_tokens_per_second: float
    """Output tokens per second of the replica (Little's law: C * O / E2E)."""
    waiting_clients: float = 0.0
    """Clients beyond the C the engine runs (KV-limited), each waiting for a running request
    to finish before its own is admitted."""
    slot_wait_seconds: float = 0.0
    """The wait for a slot those clients add to every request's TTFT and E2E."""
    lockstep_ranks: int = 1
    """DP ranks stepping together (an EP group's d): each step lasts as long as the busiest."""
    busiest_rank_chunks_per_round: float = 0.0
    """Prompt chunks the busiest of those ranks carries per round on average (the mean
    rank's: prefill_tokens_per_step over the chunk size)."""
    decoding_round_seconds: float = 0.0
    """The mean round a decoding request sees: step_seconds less its own prompt's share
    (its chunks run before its first token, in TTFT), (step - decode round) / C."""
    tokens_per_round: float = 1.0
    """Tokens a decoding sequence emits per round: 1, or under speculative decoding the
    expected accepted drafts plus one (speculative.expected_tokens_per_step)."""
    prompt_chunks: float = 1.0
    """N: chunks one prompt is cut into, I / N tokens each (= S_p without PP)."""
    prompt_carriers: int = 1
    """Micro-batches a prompt round fills with its chunks (PP: up to k; 1 without)."""
    path_chunk: StepLoad | None = None
    """PP: the chunk on a carrier's path where it is not the mean chunk of I / N tokens
    (round_time's `longest`): a full chunk of a prompt cut greedily (greedy_cut), at most what
    the micro-batch's room leaves beside the spread prompt tokens; None: the mean chunk."""
    last_chunk_extra_seconds: float = 0.0
    """PP: how much longer the round of a prompt's last chunk is than the mean chunk's (it
    attends to the whole prompt: prompt_service_seconds); 0 without PP or with one chunk."""
    ahead_seconds: float = 0.0
    """Async scheduling: the part of TTFT spent waiting out the round scheduled ahead (the one
    after the round in progress on arrival); 0 without it."""
    first_token_seconds: float = 0.0
    """t_first: the part of TTFT outside the engine's steps (the fixed first-token cost and the
    prompt's tokenization)."""

    @property
    def tpot_seconds(self) -> float:
        """TPOT under load (what vllm bench serve reports): the mean round a decoding request
        sees, over the tokens it emits per round (= the mean ITL without speculative decoding;
        with it vllm bench serve's ITL is the round, each chunk holding several tokens)."""
        return self.decoding_round_seconds / self.tokens_per_round

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


ERLANG_SPAN_SIGMAS = 12.0
"""erlang_c sums the Poisson terms within this many standard deviations of the offered load
(the rest weighs under 1e-30); more servers than that above the load: no arrival waits."""


def erlang_c(servers: int, offered: float) -> float:
    """The chance an arrival waits for a server in an M/M/c queue of c = `servers` and offered
    load a = `offered` (arrival rate x mean service time; a < c): Erlang's C formula, from
    Erlang's B = P(N = c) / P(N <= c) for N ~ Poisson(a), C = B / (1 - (a / c) (1 - B))
    (Kleinrock, Queueing Systems vol. 1, 1975, eq. 3.41-3.42). c = 1: C = a. c = 2, a = 1:
    B = (1/2) / (1 + 1 + 1/2) = 0.2, C = 0.2 / (1 - 0.5 * 0.8) = 1/3. 1 at a >= c."""
    c, a = max(1, servers), max(0.0, offered)
    if a >= c:
        return 1.0
    if a <= 0 or c > a + ERLANG_SPAN_SIGMAS * (math.sqrt(a) + 1):
        return 0.0
    first = max(0, math.floor(a - ERLANG_SPAN_SIGMAS * (math.sqrt(a) + 1)))
    log_a = math.log(a)
    terms = [math.exp(k * log_a - a - math.lgamma(k + 1)) for k in range(first, c + 1)]
    blocked = terms[-1] / math.fsum(terms)
    return blocked / (1 - a / c * (1 - blocked))


def slot_wait_seconds(servers: int, offered: float, service_seconds: float, service_cv2: float) -> float:
    """The mean wait for one of c = `servers` slots (the engine's --max-num-seqs, or the
    sequences its KV cache holds) when requests arrive Poisson and each holds a slot for
    `service_seconds` S on average, a = `offered` = rate x S of them busy: the Allen-Cunneen
    approximation of the M/G/c queue, W = C(c, a) S / (c - a) (1 + cv^2) / 2 with cv^2 =
    `service_cv2`, the squared coefficient of variation of S (Allen, Probability, Statistics
    and Queueing Theory, 2nd ed. 1990, sec. 6.2; exact for M/M/c at cv^2 = 1 and for M/D/1 at
    cv^2 = 0, the Pollaczek-Khinchine mean). S / (c - a) is 1 / (c / S - rate), the rate at
    which full slots drain less the arrivals' (a continuous batch that slows as it fills:
    flow_equivalent_wait_seconds). One slot, a = 0.86, S = 2.87 s, equal lengths: 0.86 x 2.87 / 0.14 / 2 = 8.8 s. Infinite at
    a >= c (the queue grows without end)."""
    if offered >= servers:
        return math.inf
    waits = erlang_c(servers, offered)
    if waits == 0:
        return 0.0
    drain = (servers - offered) / service_seconds
    return waits / drain * (1 + service_cv2) / 2


CHAIN_SPAN = 40.0
"""birth_death_sums stops, where asked to, once a state's weight is e^-40 of the largest seen:
the rest weighs under 1e-17 of the whole."""


@dataclass(frozen=True)
class ChainSums:
    """Sums over a birth-death chain's states 0..last of w(n) = P(n) / P(max), and of n w(n)."""

    mass: float
    mean: float
    """sum n w(n) (divide by mass for E[N])."""
    last_weight: float
    last: int
    """The last state summed: the chain's top, or where its weights fell CHAIN_SPAN below the largest."""


CHAIN_BLOCK_BEND = 0.01
"""birth_death_sums halves a block while its two halves' per-state log ratios differ by more
than this over the block (its log weights bend away from a geometric run by about an eighth
of it): E[N] within 0.8% of the state-by-state sum over 300 random chains of up to 20,000
states in 128 blocks, about 700 log_step calls each (test_birth_death_sums_in_blocks)."""


def birth_death_sums(log_step: Callable[[int, int], float], top: int, blocks: int,
                     cut_after: int | None = None) -> ChainSums:
    """The weights w(n) = P(n) / P(0) of a birth-death chain on 0..top, `log_step(a, b)` = log
    P(b) / P(a), summed over `blocks` equal blocks (states one by one when top <= blocks),
    each halved while it bends (CHAIN_BLOCK_BEND: near the mode, where the ratio crosses 1)
    and then taken as a geometric run (the same ratio from state to state, its ends exact),
    summed in closed form; every weight relative to the largest. Past `cut_after` it stops
    once a weight falls CHAIN_SPAN below the largest. (Averaging a block's end weights gave a
    light load's first block the empty state's weight: a prefill worker of 512 one-token
    prompts a step priced seconds at 0.1 req/s.)"""
    step = max(1, math.ceil(top / blocks))
    runs: list[tuple[int, int, float, float]] = []  # (start, stop, log w(start), log w(stop))
    best, n, log_w = 0.0, 0, 0.0

    def refine(start: int, stop: int, first: float) -> None:
        size = stop - start
        if size == 1:
            runs.append((start, stop, first, first + log_step(start, stop)))
            return
        middle = (start + stop) // 2
        left, right = log_step(start, middle), log_step(middle, stop)
        if abs(left / (middle - start) - right / (stop - middle)) * size <= CHAIN_BLOCK_BEND:
            runs.append((start, stop, first, first + left + right))
            return
        refine(start, middle, first)
        refine(middle, stop, runs[-1][3])  # from the left half's refined end

    while n < top:
        m, added = min(top, n + step), len(runs)
        if step == 1:  # state by state: nothing to refine
            runs.append((n, m, log_w, log_w + log_step(n, m)))
        else:
            refine(n, m, log_w)
        n, log_w = m, runs[-1][3]
        best = max(best, max(run[3] for run in runs[added:]))
        if cut_after is not None and n > cut_after and log_w < best - CHAIN_SPAN:
            break
    mass, mean = math.exp(-best), 0.0
    for start, stop, first, last in runs:
        size = stop - start
        if size == 1:
            w = math.exp(last - best)
            mass, mean = mass + w, mean + stop * w
            continue
        run, moment = _geometric_run(first - best, (last - first) / size, size)
        mass, mean = mass + run, mean + start * run + moment
    return ChainSums(mass, mean, math.exp(runs[-1][3] - best) if runs else 1.0, n)


FLAT_RUN_LOG = 2.0**-30
"""_geometric_run takes a run whose weights change by less than this (in log) end to end as
flat: the closed forms divide by expm1(d)^2, which loses every digit as d -> 0."""


def _geometric_run(first_log: float, ratio_log: float, length: int) -> tuple[float, float]:
    """(sum_j w_j, sum_j j w_j) over j = 1..L of w_j = exp(first_log + j d), d = `ratio_log`:
    from the run's low end when d <= 0, from its high end otherwise (no overflow either way).
    L = 3, first_log = 0, d = log 2: 2 + 4 + 8 = 14 and 2 + 8 + 24 = 34."""
    d, size = ratio_log, length
    if abs(d) * size < FLAT_RUN_LOG:  # flat
        w = math.exp(first_log)
        return w * size, w * size * (size + 1) / 2
    if d < 0:
        q, base = math.exp(d), math.exp(first_log)
        total = base * q * -math.expm1(size * d) / -math.expm1(d)
        moment = base * q * (1 - (size + 1) * q**size + size * q ** (size + 1)) / math.expm1(d) ** 2
        return total, moment
    # from the top: w_{L - i} = exp(last_log - i d), i = 0..L-1
    q, top = math.exp(-d), math.exp(first_log + size * d)
    total = top * -math.expm1(-size * d) / -math.expm1(-d)
    below = top * q * (1 - size * q ** (size - 1) + (size - 1) * q**size) / math.expm1(-d) ** 2
    return total, size * total - below


FLOW_EQUIVALENT_STATES = 4096
"""flow_equivalent_wait_seconds walks the chain's states one by one up to this many slots; past
it, in about this many equal blocks (birth_death_sums)."""


def flow_equivalent_wait_seconds(rate_per_s: float, servers: int, e2e_at: Callable[[float], float],
                                 service_cv2: float) -> float | None:
    """The mean wait for one of c = `servers` slots when requests arrive Poisson at `rate_per_s`
    R and an engine holding n of them completes n / E2E(n) a second (`e2e_at(n)`: a closed loop
    of n requests' E2E, fractional n allowed): the number in the system is a birth-death chain,
    births at R, deaths at mu(n) = min(n, c) / E2E(min(n, c)), the engine replaced by its
    flow-equivalent server (Chandy, Herzog and Woo, Parametric analysis of queueing networks,
    IBM J. Res. Dev. 19(1), 1975; Lazowska et al., Quantitative System Performance, 1984, ch. 8):
    P(n) ~ prod_{j<=n} R / mu(j). The queue beyond c is geometric with ratio r = R E2E(c) / c,
    so the mean number waiting is P(c) r / (1 - r)^2 and the wait, by Little's law, that over
    R, scaled by (1 + cv^2) / 2 for the spread of the service times (`service_cv2`), as
    Allen-Cunneen scales M/M/c (slot_wait_seconds). With E2E(n) = S at every n this is
    slot_wait_seconds' M/G/c exactly; where a fuller engine runs each request slower (long
    contexts: every decoder reads the others' KV too) the count spreads far wider than the
    Poisson one of a fixed service, and the slots fill much more often: Llama-3.1-8B on one
    H100, 16,000/1,000 tokens, 26 slots (the KV cache) at 0.58 req/s: 1.9 s of waiting (TTFT
    2.4 s) where the M/G/c at the mean load said 0.2 s (a 1,500-prompt simulated burst: TTFT
    3.7 s). None where even c running complete fewer than R a second (r >= 1)."""
    c = max(1, servers)
    r = rate_per_s * e2e_at(float(c)) / c
    if r >= 1:
        return None
    if rate_per_s <= 0:
        return 0.0
    log_rate = math.log(rate_per_s)

    def log_step(start: int, stop: int) -> float:  # the block's load at its middle, the factorials exact
        return ((stop - start) * (log_rate + math.log(e2e_at((start + 1 + stop) / 2)))
                - (math.lgamma(stop + 1) - math.lgamma(start + 1)))

    sums = birth_death_sums(log_step, c, FLOW_EQUIVALENT_STATES)
    total = sums.mass + sums.last_weight * r / (1 - r)
    waiting = sums.last_weight * r / (1 - r) ** 2 / total
    return waiting / rate_per_s * (1 + service_cv2) / 2


SLOT_WAIT_NOTE_FRACTION = 0.01
"""A slot wait at a rate is noted where it is at least this share of the TTFT (an Erlang C tail
of 1e-13 requests waiting is in the numbers, not worth a note)."""


def pooled_slot_wait_seconds(busy: float, servers: int, replicas: int, service_seconds: float,
                             e2e_at: Callable[[float], float] | None, service_cv2: float) -> float:
    """The mean wait for a slot where `replicas` d engines of `servers` c slots each hold `busy`
    C requests on average, each for `service_seconds` S (so R = d C / S arrive a second), behind
    a least-loaded router: one queue of d c slots (the router fills the emptiest, so a request
    waits only when every replica is full), n of them spread evenly. `e2e_at(n)`: one engine's
    E2E with n requests always in it, asked for only near the slots: flow_equivalent_wait_seconds,
    infinite where even the full engines complete fewer than R a second (once the slots fill the
    queue never drains); without `e2e_at`, slot_wait_seconds' M/G/c at S. 0 where no arrival
    waits (the full engines' load leaves no Erlang tail at d c)."""
    slots, offered = servers * replicas, busy * replicas
    rate = offered / service_seconds
    full = None if e2e_at is None else rate * e2e_at(float(servers))
    if erlang_c(slots, offered) == 0 and (full is None or erlang_c(slots, full) == 0):
        return 0.0
    if e2e_at is None:
        return slot_wait_seconds(slots, offered, service_seconds, service_cv2)
    wait = flow_equivalent_wait_seconds(rate, slots, lambda n: e2e_at(max(1.0, n / replicas)), service_cv2)
    return math.inf if wait is None else wait


def with_slot_queue(steady: SteadyState, servers: int, service_cv2: float, replicas: int = 1,
                    e2e_at: Callable[[float], float] | None = None) -> SteadyState:
    """The open-loop steady state (arrivals at a rate, steady.concurrency = C the mean running)
    when the engine runs at most `servers` sequences at once: the arrivals beyond them wait for
    a slot (pooled_slot_wait_seconds over `replicas` behind a least-loaded router; infinite
    where the full engines would not keep up, which the caller takes as overloaded; `e2e_at(n)`:
    a replica's E2E with n requests always in it, a closed loop of n), in TTFT and E2E; the
    running ones are unchanged (the engine runs the same C on average). vLLM queues a request
    in the engine it was sent to, which the pooled queue leaves out. Waiting requests: the rate
    times the wait (Little's law), in waiting_clients. No wait: the same state."""
    wait = pooled_slot_wait_seconds(steady.concurrency, servers, replicas, steady.e2e_seconds, e2e_at, service_cv2)
    if wait == 0:
        return steady
    waiting = steady.concurrency / steady.e2e_seconds * wait
    return replace(steady, waiting_clients=waiting, slot_wait_seconds=wait,
                   ttft_seconds=steady.ttft_seconds + wait, e2e_seconds=steady.e2e_seconds + wait)


GEOMETRIC_GRID_RATIO = math.sqrt(2)
"""on_geometric_grid prices whole counts 1-4, then every sqrt(2) times more, and the top."""


def on_geometric_grid(at: Callable[[int], float], top: int) -> Callable[[float], float]:
    """f(n) for 1 <= n <= top (clamped), linear between the whole counts of a geometric grid
    (GEOMETRIC_GRID_RATIO), each asked of `at` once when first needed: an E2E or a round that
    is smooth in the requests running costs 22 evaluations up to 1,024, not 1,024."""
    grid, x = {1, 2, 3, 4, top}, 4.0
    while x < top:
        x *= GEOMETRIC_GRID_RATIO
        grid.add(min(top, round(x)))
    points = sorted(n for n in grid if 1 <= n <= top)
    known: dict[int, float] = {}

    def value(n: int) -> float:
        if n not in known:
            known[n] = at(n)
        return known[n]

    def f(n: float) -> float:
        n = min(max(n, 1.0), float(top))
        upper = min(bisect.bisect_left(points, n), len(points) - 1)
        high = points[upper]
        if high == n or upper == 0:
            return value(high)
        low = points[upper - 1]
        return value(low) + (n - low) / (high - low) * (value(high) - value(low))

    return f


OPEN_LOOP_RELATIVE_TOLERANCE = 2.0**-10
"""solve_open_loop stops when the mean concurrency is bracketed to this fraction of itself (about
a thousandth), or the rate it completes is that close to the offered one (the
bracket's two states are then mixed to complete the rate exactly, so this bounds only how far
apart the mixed states are)."""
OPEN_LOOP_BISECTIONS = 60
"""At most this many halvings (the tolerance ends it after about ten from the first bracket)."""
OPEN_LOOP_LIGHT_CONCURRENCY = 2.0**-10
"""The near-empty replica whose E2E starts solve_open_loop's bracket: C >= R E2E(near empty)."""
OPEN_LOOP_CAP_PROBES = (15 / 16, 7 / 8, 3 / 4, 5 / 8, 1 / 2)
"""Where the cap itself completes less than the rate, the shares of it solve_open_loop tries
for a count that completes the rate: near the cap arrivals find every slot taken now and then
and the rate completed falls again (Llama-3.1-70B tp=8 pp=2 on 2x8 A100: 7.53 req/s at 160 in
flight, 5.15 at 240, 4.61 at the cap of 256)."""


def solve_open_loop(rate_per_s: float, steady_at: Callable[[float], SteadyState],
                    upper: float, peaks: Sequence[float] = ()) -> SteadyState | None:
    """The replica's steady state when requests arrive at `rate_per_s` (open loop): the mean
    concurrency C with C / E2E(C) = R (Little's law), E2E from `steady_at(C)` (steady_state with
    open_loop), by bisection on C in (0, upper]. The rate a concurrency completes can jump (a
    prompt's chunk count, the micro-batches in flight under PP, change at whole numbers), so the
    final bracket's two states are mixed to complete exactly R (mixed_at_rate). None when even
    `upper` completes fewer than R a second: the replica is overloaded and its queue grows
    without bound. Hand-worked (E2E = 2 s + 0.1 s per request in flight, 3 requests/s):
    C = 3 (2 + 0.1 C) -> C = 6 / 0.7 = 8.571.
    `peaks`: concurrencies past which the completed rate can fall before it rises again (DP
    ranks in lockstep: lockstep_peaks); the answer is the least C that completes R, the one a
    replica filling up from empty settles at: each peak in turn that completes less than R
    moves the bracket's bottom up to it, and the first that completes R tops it (between two
    peaks the rate falls, then rises: one crossing). Without them a bracket spanning a dip
    found the crossing above it (Qwen3-30B-A3B tp=1 dp=8 ep=8 at 100.9 req/s: 347 in flight
    and TPOT 107 ms, where the simulated burst settles at the 256 and 78 ms below). Where
    `upper` completes less than R, a few shares of it are tried (OPEN_LOOP_CAP_PROBES) before
    the replica is called overloaded, and an answer holding more than `upper` is none."""
    cap = upper
    if steady_at(upper).requests_per_second < rate_per_s:
        # the rate completed falls near the cap (OPEN_LOOP_CAP_PROBES): a count below it may
        # complete R, and the least that does is where a replica filling from empty settles (it
        # had been called overloaded, 262 in flight at TPOT 196 ms where 47 run at 36 ms, as a
        # simulated burst's 33-52 at 42 ms: a review)
        for share in OPEN_LOOP_CAP_PROBES:
            if steady_at(upper * share).requests_per_second >= rate_per_s:
                upper *= share
                break
        else:
            return None
    # E2E grows with C, so C = R E2E(C) >= R E2E(near empty): the bracket starts there, and its
    # top doubles until it completes R (at 50 /s over 4,096 replicas C is about 0.01 of a cap
    # of hundreds: bisecting from the cap took 30 halvings a layout)
    low = min(upper, rate_per_s * steady_at(min(upper, OPEN_LOOP_LIGHT_CONCURRENCY)).e2e_seconds)
    high = None
    for _ in range(OPEN_LOOP_BISECTIONS):
        if steady_at(low).requests_per_second < rate_per_s:
            break
        # E2E fell between the near-empty replica and `low` (with PP a second request in flight
        # lets a long prompt's chunks ride two micro-batches), so `low` already completes R: the
        # crossing is below it (as C -> 0 the rate completed goes to 0). Unbracketed, the mix
        # of the two states extrapolated: Llama-3.1-70B tp=4 pp=2, 32,000/1 tokens at 0.5
        # req/s, -0.5 requests in flight and a TTFT of -1,057 ms
        high, low = low, low / 2
    for peak in sorted(p for p in peaks if low < p < upper):
        if steady_at(peak).requests_per_second >= rate_per_s:
            high = peak
            break
        low = peak
    if high is None:
        high = min(upper, 1.5 * low)
        while steady_at(high).requests_per_second < rate_per_s:
            low, high = high, min(upper, 2 * high)
    low, high = false_position_bracket(low, high, lambda c: steady_at(c).requests_per_second - rate_per_s,
                                       OPEN_LOOP_RELATIVE_TOLERANCE, OPEN_LOOP_BISECTIONS,
                                       OPEN_LOOP_RELATIVE_TOLERANCE * rate_per_s)
    found = steady_at(high) if low in (0, high) else mixed_at_rate(steady_at(low), steady_at(high), rate_per_s)
    # more in flight than the cap holds is no state of it: a probe can land on a degenerate
    # steady state (some 15 req/s at 0.16 sequences decoding, between neighbours at 1.4; a review
    # found 382 and 530 in flight on a cap of 256), whose mix then holds the rate on paper only
    return None if found.concurrency > cap * (1 + OPEN_LOOP_RELATIVE_TOLERANCE) else found


def lockstep_peaks(chunks_per_round: Callable[[float], float], upper: float) -> tuple[float, ...]:
    """The concurrencies in (0, upper] at which a replica's prompt chunks a round,
    `chunks_per_round(C)` (q = lambda S_p of `arrivals`; it grows with C), reach each whole
    number: there the busiest of lockstep ranks starts carrying one more chunk
    (busiest_rank_chunks' slope jumps from 0 to d), so the rate a concurrency completes can
    peak there (solve_open_loop's `peaks`). Each to OPEN_LOOP_RELATIVE_TOLERANCE, by
    bisection: q(C) = C / 4 up to C = 10 gives 4 and 8."""
    peaks = []
    for whole in range(1, math.ceil(chunks_per_round(upper))):
        _, high = bisect_bracket(0.0, upper, lambda c, n=whole: chunks_per_round(c) < n,
                                 OPEN_LOOP_RELATIVE_TOLERANCE, OPEN_LOOP_BISECTIONS)
        peaks.append(high)
    return tuple(peaks)


def false_position_bracket(low: float, high: float, excess: Callable[[float], float], relative_tolerance: float,
                           max_rounds: int, value_tolerance: float = 0.0) -> tuple[float, float]:
    """(low, high) with excess(low) < 0 <= excess(high), narrowed by the Illinois false-position
    rule (the secant through the bracket's ends, the stale end's value halved when one end
    stays twice) until high - low <= relative_tolerance * high or an end's |excess| is within
    value_tolerance (its own excess: the halved values steer the secant only, and stopping on
    them left an end far from the root); a secant that lands within half that width of an end
    steps that half width in from it (converged from one side, the root is there: the step
    brackets it within the tolerance), and where the step before did so already, the midpoint
    is taken instead (the root is at a jump or a kink). A smooth excess converges in a handful of
    evaluations where bisection takes about ten; a jump stays bracketed. x^2 - 2 on [1, 2] to
    |excess| <= 1e-6: 1.41421 in under 10 evaluations. (Bisecting at every such landing, a
    Little's-law solve, decode_concurrency_at_rate, took 17 evaluations on average, a secant
    within 2^-20 of the root followed by halvings of the whole bracket from the far end.)"""
    f_low, f_high = excess(low), excess(high)
    true_low, true_high = f_low, f_high
    side, stepped = 0, False
    for _ in range(max_rounds):
        if high - low <= relative_tolerance * high or min(-true_low, true_high) <= value_tolerance:
            break
        middle = high - f_high * (high - low) / (f_high - f_low) if f_high != f_low else (low + high) / 2
        margin = relative_tolerance * high / 2
        landed_inside = low + margin < middle < high - margin
        if not landed_inside:
            middle = (low + high) / 2 if stepped else min(max(middle, low + margin), high - margin)
        stepped = not landed_inside and not stepped
        f_middle = excess(middle)
        if f_middle < 0:
            low, f_low, true_low = middle, f_middle, f_middle
            if side == -1:
                f_high /= 2
            side = -1
        else:
            high, f_high, true_high = middle, f_middle, f_middle
            if side == 1:
                f_low /= 2
            side = 1
    return low, high


IN_FLIGHT_WEIGHT_FLOOR = 1e-6
"""in_flight_weights drops a number of busy micro-batches whose Poisson chance is below this
(its weight goes to the rest): a term that moves a round by less than a millionth of itself."""


def in_flight_weights(mean_others: float, most: int) -> tuple[tuple[int, float, float], ...]:
    """(k, chance, others) for each number k of vLLM's virtual engines (micro-batches) busy
    beside a decoding request under Poisson arrivals: it finds N ~ Poisson(mean_others) others
    (the time average, M/G/infinity), each in its own engine up to `most` (the pipeline's
    stages, the engine's or the clients' cap), so k = min(most, N + 1); `others` is E[N | k]
    (k - 1 below `most`). The chances sum to 1 and the others to mean_others. Rounding the mean
    up instead made TPOT jump 6% where it crossed a whole number (Qwen3-30B-A3B at pp=4, 1.6 to
    1.65 req/s). Mean 1, most 4: P(k=1) = P(k=2) = e^-1 = 0.3679, P(k=3) = 0.1839, P(k=4) =
    1 - 0.9197 = 0.0803 with E[N | N >= 3] = (1 - 0.3679 - 2 x 0.1839) / 0.0803 = 3.291."""
    if most <= 1 or mean_others <= 0:
        return ((1, 1.0, max(mean_others, 0.0)),)
    rows, term, below, counted = [], math.exp(-mean_others), 0.0, 0.0
    for n in range(most - 1):  # k = n + 1 < most: exactly n others
        rows.append((n + 1, term, float(n)))
        below += term
        counted += n * term
        term *= mean_others / (n + 1)
    tail = max(0.0, 1.0 - below)  # n >= most - 1 others: every engine busy
    if tail > 0:
        rows.append((most, tail, max(most - 1.0, (mean_others - counted) / tail)))
    kept = [row for row in rows if row[1] >= IN_FLIGHT_WEIGHT_FLOOR]
    total = sum(w for _, w, _ in kept)
    return tuple((k, w / total, others) for k, w, others in kept)


def clients_at_rate(rate_per_s: float, steady_at: Callable[[int], SteadyState], clients: int) -> SteadyState | None:
    """The replica at a rate its fixed clients keep up with where the open loop cannot be solved
    below them (solve_open_loop's Poisson queue would hold more than the clients let in): at most
    `clients` requests are in the engine, the rest wait on the client (vllm bench serve's
    semaphore, whose wait is not in the request's times). Between whole numbers of requests in
    flight the closed loops bracket it: the least c <= clients whose closed loop (`steady_at`)
    completes R, mixed with c - 1's (mixed_at_rate); below what one request at a time completes,
    that one's times at R. None when even `clients` complete fewer than R. One client per
    replica completing 0.72 req/s, asked 0.625: E2E one request's alone, 0.625 O tokens/s."""
    if steady_at(clients).requests_per_second < rate_per_s:
        return None
    one = steady_at(1)
    if one.requests_per_second >= rate_per_s:
        return mixed_at_rate(one, one, rate_per_s)
    low, high = 1, clients  # completes fewer than R at low, at least R at high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if steady_at(middle).requests_per_second < rate_per_s else (low, middle)
    return mixed_at_rate(steady_at(low), steady_at(high), rate_per_s)


def mixed_at_rate(below: SteadyState, above: SteadyState, rate_per_s: float) -> SteadyState:
    """The replica at a rate between what two nearby states complete (below < R <= above): it
    spends the share w = (R - r_below) / (r_above - r_below) of its time like `above`, the rest
    like `below`, so each time and load is that mix, the output tokens/s R O, and the requests in
    flight R E2E (Little's law on the mix). Whole-valued fields (chunk carriers, lockstep ranks)
    and the budget flag are `above`'s. r_below = 1, r_above = 3 at R = 1.5: w = 0.25."""
    r_below, r_above = below.requests_per_second, above.requests_per_second
    w = 1.0 if r_above <= r_below else (rate_per_s - r_below) / (r_above - r_below)
    mixed = {f.name: (1 - w) * getattr(below, f.name) + w * getattr(above, f.name)
             for f in fields(SteadyState) if type(getattr(above, f.name)) is float}
    tokens_per_request = above.throughput_tokens_per_second / r_above
    mixed.update(concurrency=rate_per_s * mixed["e2e_seconds"], throughput_tokens_per_second=rate_per_s * tokens_per_request)
    return replace(above, **mixed)


def bisect_bracket(low: float, high: float, below: Callable[[float], bool], relative_tolerance: float,
                   max_rounds: int) -> tuple[float, float]:
    """(low, high) narrowed by halving until high - low <= relative_tolerance * high (or after
    max_rounds): `below(x)` says the answer lies above x (false at and above it, true below),
    so it stays within the bracket. Threshold 0.3 in [0, 1] to 1e-3: about ten halvings."""
    for _ in range(max_rounds):
        if high - low <= relative_tolerance * high:
            break
        middle = (low + high) / 2
        low, high = (middle, high) if below(middle) else (low, middle)
    return low, high


def busiest_rank_chunks(mean: float, ranks: int) -> float:
    """E[chunks on the busiest of `ranks` ranks] in a round, each rank carrying `mean` on
    average. vLLM's DP front end routes every new request to the least loaded engine
    (vllm/v1/engine/core_client.py DPLBAsyncMPClient.get_core_engine_for_request at 0.33.0:
    the fewest requests in flight, docs/cost-model.md "The DP router"), so in a closed loop a request arrives where one has just
    finished: each rank's prompts come at its own steady pace, floor(q) or floor(q) + 1 chunks
    a round, the ranks' phases independent. The busiest carries floor(q) + 1 unless every rank
    is at its floor that round: floor(q) + 1 - (1 - frac(q))^d; for q <= 1, 1 - (1 - q)^d, the
    chance some rank carries one. Continuous in q; the mean itself for one rank."""
    if ranks <= 1 or mean <= 0:
        return max(mean, 0.0)
    whole = math.floor(mean)
    return whole + 1 - (1 - (mean - whole)) ** ranks


def lockstep_decoding_round(q: float, c: float, ranks: int, decode_round: float,
                            chunk_round: Callable[[float], float], open_loop: bool = False) -> float:
    """The mean round a decoding request sees when d = `ranks` DP ranks step in lockstep and
    q <= 1 prompt chunks arrive per rank and round: its own rank carries the other clients'
    q (C - 1) / C (its own prompt ran before its first token), each other rank q, so some rank
    carries a chunk with probability p = 1 - (1 - q (C - 1) / C) (1 - q)^(d - 1), the experts then
    seeing q (d - 1/C) / (d p) chunks per rank (`chunk_round(k)`: the round with one chunk on the
    busiest rank and k per rank at the experts). One rank (d = 1): p = q (C - 1) / C, one chunk,
    the round steady_state prices. At C = 1 a lone client per rank still waits out the other
    ranks' prompts: d = 32, q = 0.016 gives p = 0.39, where leaving its own share out of the
    mean as for one rank (mean - (mean - decode) / C) priced the pure decode round (found by a
    CLI sweep: TPOT 21 ms against 248 ms steps). `open_loop` (arrivals at a rate, own_prompt_share):
    its own rank carries the whole q, as every other rank."""
    own = own_prompt_share(c, open_loop)
    others = q * (1 - own)
    carrying = 1 - (1 - others) * (1 - q) ** (ranks - 1)
    if carrying <= 0:
        return decode_round
    per_rank = q * (ranks - own) / ranks
    return (1 - carrying) * decode_round + carrying * chunk_round(per_rank / carrying)


def own_prompt_share(concurrency: float, open_loop: bool) -> float:
    """The share of the prompt chunks arriving at a replica that are a decoding request's own
    (they ran before its first token, so its decode rounds do not carry them): 1 / C in a closed
    loop of C clients (its own arrival is one of the C / E2E a second); none under arrivals at
    a rate (Poisson: the others keep arriving at the full rate whatever it does)."""
    return 0.0 if open_loop else 1 / concurrency


def busy_on_arrival(concurrency: float, open_loop: bool) -> float:
    """The chance a new request finds other requests running, so that it waits for the engine's
    current round (ROUND_ALIGNMENT_ROUNDS): (C - 1) / C in a closed loop of C clients (the
    others' share); under Poisson arrivals at a rate, 1 - e^-L with L = C the mean requests in
    the replica (an arrival sees the time average, PASTA; continuous batching serves them all at
    once, so the count is Poisson as in an M/G/infinity queue). L = 2: 0.86 (a closed loop of
    2: 0.5)."""
    return -math.expm1(-concurrency) if open_loop else 1 - 1 / concurrency


@dataclass(frozen=True)
class LeastLoaded:
    """What requests see where a router sends each arrival to the replica holding the fewest
    (least_loaded); one replica: the replica's own Poisson view (busy_on_arrival, n_d + 1)."""

    prompt_share: float
    """The arrivals that join a decoding request's replica, as a share of a replica's mean rate."""
    seen: float
    """Requests in a request's replica, itself included (the mean over requests)."""
    busy: float
    """The chance an arrival finds every replica busy (so its own one too)."""
    joined: float
    """Requests an arrival finds in the replica it joins."""


LEAST_LOADED_SPAN_SIGMAS = 12.0
"""least_loaded's sums stop this many standard deviations above the Poisson mean (the rest
weighs under 1e-30)."""
LEAST_LOADED_EXACT_MEAN = 400.0
"""Up to this Poisson mean least_loaded sums the exact distribution; above it, the normal one
with a continuity correction (its tails are then within 1e-3 of Poisson's at every count that
weighs, and the sums need one term per replica's worth of requests, not per request)."""


def poisson_tails(mean: float, last: int) -> Callable[[int], float]:
    """m -> P(N >= m) for N ~ Poisson(mean), m <= last: exact (cumulated) up to
    LEAST_LOADED_EXACT_MEAN, else the normal approximation 0.5 erfc((m - 0.5 - mean) /
    sqrt(2 mean)). Mean 1: P(N >= 2) = 1 - 2/e = 0.2642."""
    if mean > LEAST_LOADED_EXACT_MEAN:
        scale = math.sqrt(2 * mean)
        return lambda m: 1.0 if m <= 0 else 0.5 * math.erfc((m - 0.5 - mean) / scale)
    tails, below, p = [], 0.0, math.exp(-mean)
    for n in range(last + 1):
        tails.append(max(0.0, 1.0 - below))
        below += p
        p *= mean / (n + 1)
    return lambda m: 1.0 if m <= 0 else tails[m] if m <= last else 0.0


def least_loaded(mean_per_replica: float, replicas: int) -> LeastLoaded:
    """Arrivals at a rate over d replicas behind a least-loaded router (vLLM's DP front end:
    vllm/v1/engine/core_client.py DPLBAsyncMPClient.get_core_engine_for_request at 0.33.0, the
    fewest requests in flight: docs/cost-model.md, "The DP router"): the N requests in the system are Poisson with mean L = d C
    (M/G/infinity; an arrival sees the time average, PASTA), held as evenly as the router keeps
    them: N = q d + r puts q + 1 in r replicas and q in the other d - r, and each arrival joins
    one of those d - r. So an arrival finds q = floor(N / d) there, E[q] = sum_k P(N >= k d)
    (busy when N >= d). A request sits, with the others, in a replica of q + 1 or q: the mean
    over requests is E[r (q + 1)^2 + (d - r) q^2] / L (a request's N is size-biased, P(N = n)
    n / L) = (L + 2 L sum_k P(N >= k d - 1) - 2 d sum_k k P(N >= k d)) / L (E[N 1(N >= m)] =
    L P(N >= m - 1) for a Poisson N). Its replica receives arrivals only while among the least
    loaded, q / N of them: E[q] / L of the rate, the share E[q] / C of a replica's R / d. One
    replica: share 1, C + 1 seen, busy 1 - e^-C. d = 2, C = 0.5 (L = 1, P(N = n) = e^-1 / n!):
    E[q] = P(N >= 2) + P(N >= 4) + ... = 0.2642 + 0.0190 + 0.0006 = 0.2838, share 0.568; seen
    = 1 + 2 (P(N >= 1) + P(N >= 3) + ...) - 4 (0.2642 + 2 x 0.0190 + 3 x 0.0006) = 1.216
    (random splitting: 1 and 1.5)."""
    d, mean = max(1, replicas), max(0.0, mean_per_replica) * max(1, replicas)
    if d == 1:
        return LeastLoaded(1.0, mean + 1, -math.expm1(-mean), mean)
    if mean <= 0:
        return LeastLoaded(0.0, 1.0, 0.0, 0.0)
    last = math.ceil(mean + LEAST_LOADED_SPAN_SIGMAS * math.sqrt(mean)) + d
    tail = poisson_tails(mean, last)
    # blocks wholly below the mean's span have tails of 1 (to 1e-30): counted at once, so a mean
    # of millions (a queue near its capacity) costs its span's terms, not one per replica's worth
    first = max(1, math.floor((mean - LEAST_LOADED_SPAN_SIGMAS * math.sqrt(mean) - 1) / d))
    joined = below_blocks = float(first - 1)
    weighted = (first - 1) * first / 2
    for k in range(first, last // d + 2):
        joined += tail(k * d)
        below_blocks += tail(k * d - 1)
        weighted += k * tail(k * d)
    seen = (mean + 2 * mean * below_blocks - 2 * d * weighted) / mean
    return LeastLoaded(joined / mean_per_replica, seen, tail(d), joined)


MAX_BUSY_SHARE = 1 - 2.0**-20
"""A queue's busy share is held below this (at 1 its wait is infinite): the prompts' share of the
rounds (poisson_bunching, prompt_queue) and of the pipeline's entry and time (pipeline_windows,
pipeline_entry_wait)."""


@dataclass(frozen=True)
class Bunching:
    """The spread of round lengths that Poisson prompt arrivals cause (poisson_bunching)."""

    length_biased_round_seconds: float
    """E[T^2] / E[T]: the mean round an arrival lands in (longer rounds catch more arrivals)."""
    prompt_share: float
    """rho: the share of a round's time its prompt chunks take, (T - T_d) / T; also how much of
    a round's excess the next round keeps."""
    chunk_seconds: float
    """b: what one prompt chunk adds to a round, (T - T_d) / q."""


def poisson_bunching(mean_round: float, decode_round: float, chunks_per_round: float, replicas: int = 1) -> Bunching:
    """Round lengths under Poisson arrivals: a round lasts T_{k+1} = T_d + b n_{k+1}, its n_{k+1}
    chunks those that arrived during round k, Poisson with mean r T_k (r chunks a second, so q
    = r T a round). With rho = b r: the mean T = T_d / (1 - rho), rho = (T - T_d) / T, and
    Var T = b^2 (r T + r^2 Var T) = b rho T / (1 - rho^2), so an arrival's round (length-biased)
    is T + Var T / T (a renewal argument: Kleinrock, Queueing Systems vol. 1, sec. 5.2), and
    E[T_{k+1} | T_k] - T = rho (T_k - T): a long round's excess decays by rho a round. The mean
    field prices T alone; at rho = 0.74 (Llama-3.1-70B tp 8, 512/1 at 38 req/s: T_d = 10.8 ms, T =
    41.8 ms, b = 19.5 ms) the length-biased round is 74 ms (the simulated burst's rounds:
    83 ms). T = 20 ms, T_d = 10 ms, q = 0.5: rho = 0.5, b = 20 ms, Var = 20 x 0.5 x 20 / 0.75 =
    266.7 ms^2, 33.3 ms. `replicas` d: a least-loaded router spreads each bunch evenly over d
    replicas (a Poisson(d r T) count split d ways), Var T / d; an approximation, not fitted:
    against simulated bursts (bench/open_loop_vs_sim.py, 12 cases) TTFT's median error went
    10.9% -> 4.7% (Llama-3.1-70B tp 4 dp 4 at 15.4 req/s: -13% -> -5%)."""
    rho = min(max((mean_round - decode_round) / mean_round, 0.0), MAX_BUSY_SHARE) if mean_round > 0 else 0.0
    chunk = (mean_round - decode_round) / chunks_per_round if chunks_per_round > 0 else 0.0
    variance = chunk * rho * mean_round / (1 - rho * rho) / replicas
    return Bunching(mean_round + variance / mean_round if mean_round > 0 else 0.0, rho, max(chunk, 0.0))


@dataclass(frozen=True)
class PromptQueue:
    """A replica's prompts as a queue of whole prompts (prompt_queue)."""

    wait_seconds: float
    """W: a new prompt's mean wait for the prompts ahead of it."""
    chunk_round_share: float
    """The mean share of a request's first D decode rounds that carry other prompts' chunks."""


def prompt_queue(mean_round: float, decode_round: float, prompt_round: float, prompt_rounds: float,
                 decode_rounds: float, replicas: int = 1) -> PromptQueue:
    """Arrivals at a rate on a replica whose prompts take S_p rounds each: the prompt work is a
    queue of whole prompts, served one after another in rounds of T_p (`prompt_round`; while
    one waits every round carries a chunk) and otherwise idle (decode rounds of T_d). Its time
    share rho = (T - T_d) / T of the mean round T; a prompt's service S = S_p T_p.
    - The wait: M/D/c over the `replicas` c a least-loaded router spreads the prompts over,
      half the M/M/c wait (deterministic service; Cosmetatos' approximation's leading term):
      W = C(c, c rho) S / (2 c (1 - rho)) (erlang_c); M/D/1, W = rho S / (2 (1 - rho)) (Kleinrock,
      Queueing Systems vol. 1, eq. 5.76). The steady state's other TTFT terms wait for the round
      in progress only.
    - A request's decode starts as its prompt leaves that queue, and a departing prompt leaves
      behind what an arrival finds (M/G/1 departures see the time average, Kleinrock sec. 5.6):
      L = rho + L_q / c prompts on its replica (L_q = the pool's lambda W by Little's law;
      behind a least-loaded router what an arrival finds in the replica it joins, least_loaded's
      joined at that mean: arrivals and departures of a replica see the same), each a busy period of S_p / (1 - rho) chunk rounds on average, so K = L S_p / (1 - rho)
      chunk rounds lie ahead of its first decode round (0 with chance 1 - rho). Behind the
      router a busy replica takes another prompt only while every replica is busy (least_loaded's
      busy, B), so its busy period grows at rho B, not rho: K = L S_p / (1 - rho B) (charging
      rho had a short output's TPOT 113-148% over the step simulation's, Qwen3-30B-A3B tp=1 dp=8,
      32,000/8 tokens at 5-6 req/s; now 20-26%). Taking the
      rest as exponential (mean K / rho), its first D rounds hold E[min(D, K)] = K (1 -
      e^(-D rho / K)) of them: a share K (1 - e^(-D rho / K)) / D, against the mean share of
      all rounds that the steady state's mean prices (the long run, D -> infinity).
    Llama-3.1-70B nvfp4 tp=8 on 8 H200, 16,000/8 tokens at 1 req/s: T_p = 338.8 ms, T_d = 6.27
    ms, S_p = 2, T = 18.72 ms, rho = 0.665, S = 0.678 s: W = 0.673 s; L = 1.326, K = 7.92, D = 7:
    share 0.503, TPOT 6.27 + 0.503 x 332.5 = 174 ms (a 1,000-prompt step simulation: 173 ms; the
    mean round with Poisson bunching, 118 ms), TTFT 1.36 s (simulated 1.36 s; 1.10 s before).
    T = 20 ms, T_d = 5 ms, T_p = 305 ms, S_p = 2, D = 7: rho = 0.75, S = 0.61 s, W = 0.75 x 0.61 /
    0.5 = 0.915 s, L = 0.75 + 1.2295 x 0.915 = 1.875, K = 15, share 15 (1 - e^-0.35) / 7 = 0.633."""
    if mean_round <= 0 or prompt_rounds <= 0:
        return PromptQueue(0.0, 0.0)
    rho = min(max((mean_round - decode_round) / mean_round, 0.0), MAX_BUSY_SHARE)
    service_seconds = prompt_rounds * prompt_round
    c = max(1, replicas)
    wait_seconds = erlang_c(c, c * rho) * service_seconds / (2 * c * (1 - rho)) if rho > 0 else 0.0
    # per replica: rho in service, L_q / c = (lambda_pool / c) W = (rho / S) W waiting
    ahead = rho + rho * wait_seconds / service_seconds if service_seconds > 0 else rho
    busy_share = rho  # the share of a busy period's time in which another prompt joins the replica
    if c > 1:  # a least-loaded router sends arrivals to the emptier replicas: what one finds there
        routed = least_loaded(ahead, c)
        ahead, busy_share = routed.joined, rho * routed.busy
    chunk_rounds = ahead * prompt_rounds / (1 - busy_share)
    share = 0.0
    if decode_rounds > 0 and chunk_rounds > 0:
        share = chunk_rounds * -math.expm1(-decode_rounds * rho / chunk_rounds) / decode_rounds
    return PromptQueue(wait_seconds, min(share, 1.0))


@dataclass(frozen=True)
class PipelineWindows:
    """What a PP replica's prompts do to its decoders and to each other (pipeline_windows)."""

    stage_share: float
    """rho_b: the share of time the pipeline's entry is busy with prompt chunks."""
    window_share: float
    """u: the share of time some prompt's chunks are in the pipeline (a decoder's step then
    trails them)."""
    felt_round_seconds: float
    """A decoder's mean round: 1 / ((1 - u) / T_d + u / T_p)."""


def pipeline_windows(prompts_per_second: float, decode_round: float, prompt_round: float,
                     traversal_seconds: float, entry_seconds: float) -> PipelineWindows:
    """A PP replica's prompts as windows, for decoders. A prompt's chunks enter the first stage
    one after another, holding it for S_b (`entry_seconds`, the prompt's share of a round's
    micro-batches: its N chunks of the round's k), and leave the last stage L later
    (`traversal_seconds`: continuous_batching.prompt_service_seconds). A decoder's micro-batch
    scheduled while chunks are in the pipeline waits behind them at every stage (each stage
    works one micro-batch at a time, in order): its token comes as the last of them leaves, so
    it makes a token a prompt round T_p at best, against T_d in free time. The windows are the
    busy periods of the entry (M/D/1 at rho_b = lambda S_b, Kleinrock vol. 1 sec. 5.8) each
    drawn out by the tail tau = L - S_b; the idle periods between busy periods are exponential
    in 1 / lambda, so a share e^(-lambda tau) of each is left uncovered:
    u = 1 - (1 - rho_b) e^(-lambda tau). Counting each prompt's round T_p as its whole cost
    left out the tail, with N chunks over p stages (N + p - 1) chunk-stage times where T_p is p
    of them: Llama-3.1-70B tp=2 pp=8, 32,000/16 tokens at 0.34 req/s, TPOT 92 ms against a
    simulated 141 ms. Worked: lambda = 0.5/s, S_b = 0.5 s, L = 1.5 s, T_d = 0.03 s, T_p = 1 s:
    rho_b = 0.25, tau = 1 s, u = 1 - 0.75 e^-0.5 = 0.5451, felt = 1 / (0.4549 / 0.03 + 0.5451)
    = 63.65 ms."""
    rate = max(prompts_per_second, 0.0)
    stage = min(rate * entry_seconds, MAX_BUSY_SHARE)
    tail = max(traversal_seconds - entry_seconds, 0.0)
    share = min(1 - (1 - stage) * math.exp(-rate * tail), MAX_BUSY_SHARE)
    felt = 1 / ((1 - share) / decode_round + share / max(prompt_round, decode_round))
    return PipelineWindows(stage, share, felt)


def pipeline_entry_wait(prompts_per_second: float, entry_seconds: float, lock_seconds: float) -> float:
    """A new prompt's mean wait for a PP replica's entry. Prompts that queue stream into it, each
    holding it for its share of a round's micro-batches, S_b (their chunks take the batch queue's
    places as the ones ahead return); but one that finds nothing queued is followed by empty
    steps, which hold the batch queue's other places until the step after them may start, so
    the next arrival cannot enter before `lock_seconds` X0 has passed (steady_state: a round T_p,
    one chunk past it where the prompt has two or more). An M/G/1 queue whose busy periods open
    with an exceptional service X0, the rest S = S_b (Welch, Operations Research 12 (1964)
    736-752): W = lambda S^2 / (2 (1 - rho)) + lambda (X0^2 - S^2) / (2 (1 - rho + lambda X0)),
    rho = lambda S. Behind a least-loaded router the caller scales it by the chance the arrival's
    replica holds requests (least_loaded's busy, over 1 - e^-C alone): scaling it as M/D/c is
    from M/D/1 (a pooled queue at the entry's own load) had DeepSeek-V3 tp=8 pp=4 dp=4,
    16,000/2 tokens at 10 req/s wait 24 ms where the step simulation waits 208 ms (its router
    counts requests in flight, and the entries lock). A whole round each (the whole-round
    queue, prompt_queue's) had the capacity at 1 / T_p where queued prompts fill the lanes a
    lone one leaves: the same layout at 16 req/s, TTFT 3.0 s against a simulated 0.69 s.
    lambda = 1/s, S = 0.25 s, X0 = 1 s: rho = 0.25, W = 0.0625 / 1.5 + 0.9375 / (2 x 1.75) =
    0.0417 + 0.2679 = 0.3095 s."""
    rate = max(prompts_per_second, 0.0)
    rho = min(rate * entry_seconds, MAX_BUSY_SHARE)
    if rate <= 0:
        return 0.0
    lock = max(lock_seconds, entry_seconds)
    return rate * entry_seconds**2 / (2 * (1 - rho)) + rate * (lock**2 - entry_seconds**2) / (
        2 * (1 - rho + rate * lock))


def prompt_chunking(input_len: int, room_tokens: float, in_flight: int) -> tuple[float, float, int]:
    """(N chunks of the prompt, S_p rounds, n carriers per prompt round): N = ceil(I / room),
    each micro-batch's room; one round takes up to k of them (PP: vLLM's scheduler gives each
    new step the prompt's next chunk while the last is in flight, vllm/v1/core/sched/
    scheduler.py 0.33.0), so S_p = ceil(N / k) rounds of n = ceil(N / S_p) carriers. 10,000
    tokens, room 4,086, k = 4: N = 3, S_p = 1, n = 3; k = 1: S_p = 3, n = 1."""
    chunks = float(math.ceil(input_len / room_tokens))
    rounds = float(math.ceil(chunks / in_flight))
    return chunks, rounds, max(1, math.ceil(chunks / rounds)) if rounds else 1


def prompt_service_seconds(prompt_chunks: float, round_seconds: float, in_flight: int,
                           last_extra_seconds: float = 0.0) -> float:
    """A prompt's own prefill over its N chunks in consecutive micro-batches, one every T / k of
    a round T, the last a whole round: T (1 + (N - 1) / k); N T without PP (k = 1, one chunk a
    round). N = 3, T = 0.2 s, k = 4: 0.3 s. `last_extra_seconds` E: how much longer the last
    chunk's round is than the mean chunk's (it attends to the whole prompt before it); its path
    is the traversal's last leg, so with PP the service is T N / k + (T + E)(1 - 1 / k) (the
    chunks' entries at the mean, the last one's path whole); without PP the rounds sum to N T
    (pairs are linear in the rounds). N = 3, T = 0.2 s, k = 4, E = 0.04 s: 0.33 s."""
    k = max(in_flight, 1)
    return round_seconds * (1 + (max(prompt_chunks, 1.0) - 1) / k) + last_extra_seconds * (1 - 1 / k)


def greedy_cut(input_len: float, prompt_pairs: float, prompt_chunks: float, room_tokens: float
               ) -> tuple[StepLoad, StepLoad] | None:
    """(a full chunk, the rest) of a prompt of N > 1 chunks cut greedily, as vLLM cuts it (each
    step takes as many of its tokens as the step's room c allows, vllm/v1/core/sched/
    scheduler.py 0.33.0: num_new_tokens capped at the budget left): N - 1 chunks of c and the
    rest r = I - (N - 1) c. The rest attends to the whole prompt before it, r (I - r) + r^2 / 2
    pairs; a full chunk the remainder's mean. None where N = 1 or the room does not cut the
    prompt into N (the rounds' clamp in _steady_pass). 10,000 tokens, room 8,000, N = 2: 8,000
    tokens (32e6 pairs) and 2,000 (18e6 of causal_pairs' 50e6)."""
    n = prompt_chunks
    full = min(room_tokens, input_len)
    rest = input_len - (n - 1) * full
    if n <= 1 or n != math.ceil(input_len / room_tokens) or not 0 < rest <= full:
        return None
    rest_pairs = rest * (input_len - rest) + rest * rest / 2
    return (StepLoad(0, 0, full, (prompt_pairs - rest_pairs) / (n - 1), 0.0),
            StepLoad(0, 0, rest, rest_pairs, 1.0))


def greedy_chunks_extra_seconds(input_len: float, prompt_pairs: float, prompt_chunks: float, room_tokens: float,
                                lanes: int, path_seconds: Callable[[StepLoad], float], mean_chunk: StepLoad,
                                mean_seconds: float | None = None) -> float:
    """prompt_service_seconds' E for a prompt of N > 1 chunks through k > 1 pipelined lanes:
    what its service takes over the N equal chunks of I / N tokens it is priced as, per
    (1 - 1 / k). vLLM cuts a prompt greedily, each step taking as many of its tokens as the
    step's room allows (vllm/v1/core/sched/scheduler.py 0.33.0: num_new_tokens capped at the
    budget left), so N - 1 chunks of the room c and the rest r = I - (N - 1) c (greedy_cut). Chunks in
    consecutive micro-batches through p identical stages finish, the last, after the sum of
    their stage times plus p - 1 of the longest (a flow shop's makespan): with a carrier's path
    R(x) about p stage times, ((N - 1) R(c) + R(r)) / k + (1 - 1 / k) R(c), where the equal
    chunks' service is R(I / N) (1 + (N - 1) / k). Just past one budget the difference is most
    of a path: Llama-3.1-70B tp=1 pp=8 on H200, a lone 9,000-token prompt priced 1.12 s as two
    4,500-token chunks, below 8,000 tokens' 1.66 s in one (found by a property sweep); greedily,
    8,192 and 808. Each chunk's attention pairs: the rest's r (I - r) + r^2 / 2 (it attends to
    the whole prompt before it), the full chunks' the remainder's mean in the sum, and the p - 1
    stage times those of the longest chunk, the rest or the last full one (c^2 (N - 3/2) pairs).
    Where the room does not cut the prompt into N greedy chunks (the rounds' clamp in
    _steady_pass), the equal chunks' last one's extra pairs alone ((2 N - 1) / N^2 of the
    prompt's pairs: Llama-3.1-70B tp=2 pp=8, 32,000 tokens in 4 chunks, stage times
    119/137/155/157 ms). `mean_seconds`: the mean chunk's round as the service prices it, where
    its path is already a full chunk's (round_time's `longest`), so E may be below 0 (the rest
    is shorter than a full chunk); None: path_seconds(mean_chunk), E at least 0."""
    n, k = prompt_chunks, lanes
    cut = greedy_cut(input_len, prompt_pairs, n, room_tokens)
    floor = 0.0 if mean_seconds is None else -math.inf
    mean_seconds = path_seconds(mean_chunk) if mean_seconds is None else mean_seconds
    if cut is None:
        last = replace(mean_chunk, prefill_attention_pairs=prompt_pairs * (2 * n - 1) / n**2)
        return max(0.0, path_seconds(last) - mean_seconds)
    full, rest = cut
    full_seconds, rest_seconds = path_seconds(full), path_seconds(rest)
    # the longest chunk: the rest, or the last full one (it attends to the n - 2 before it)
    last_full_seconds = path_seconds(replace(full, prefill_attention_pairs=full.prefill_tokens**2 * (n - 1.5)))
    longest = max(rest_seconds, last_full_seconds)
    greedy = ((n - 1) * full_seconds + rest_seconds) / k + (1 - 1 / k) * longest
    return max(floor, (greedy - mean_seconds * (1 + (n - 1) / k)) / (1 - 1 / k))


def prompts_take_turns(input_len: float, step_budget_tokens: float) -> bool:
    """Two prompts exceed a step's token budget, so whole prompts never share a step: each is
    cut into chunks that fill steps of their own (and with PP, micro-batches of their own)."""
    return 2 * input_len > step_budget_tokens


def convoy_capacity_per_s(round_seconds: Callable[[StepLoad, StepLoad | None], float], input_len: int,
                          output_len: int, step_budget_tokens: int, tokens_per_round: float = 1.0,
                          spec_tokens: int = 0, context_tokens: float | None = None,
                          prompt_pairs: float | None = None) -> float:
    """The most requests a second a PP replica's whole prompts (several to a step) keep up with
    under arrivals at a rate, once its micro-batches fall into a convoy.
    vLLM puts every prompt waiting when it schedules a step into that step (to the budget), and
    a micro-batch that carries prompts holds the ones behind it at every stage, so they come
    back together and the first step scheduled after them takes everything that arrived
    meanwhile: all of a round's prompts ride one micro-batch through all p stages in turn.
    That round T carries the lambda T prompts that arrived during the last one beside its
    share of the lambda D T decoding requests', so T = R(lambda D T, lambda T), and with R
    affine in its load (R0 + a n_d + b n_p) it settles at T = R0 / (1 - lambda (a D + b))
    only below lambda = 1 / (a D + b): past that the round outgrows the arrivals it carries
    and the requests queue. a D + b is read as a secant, from the empty round (R0) to one that
    carries a budget's worth of whole prompts, q = B / I, beside the D q decodes such a rate
    keeps: lambda = q / (R(D q, q) - R0). The spread of the steady state (one prompt a carrier,
    the rest shared by every micro-batch) pays each prompt's stage once a round; the convoy
    pays it p times, so PP lends whole prompts no prompt throughput.
    `round_seconds(load, convoy)`: the round of p micro-batches with `load` spread over them
    and `convoy` (whole prompts) in one. Against the step simulation (serving_sim, the batch
    queue of vLLM 0.33.0: between the last rate it keeps up with and the first at which its
    queue grows or its TTFT runs to seconds), Llama-3.1-70B on 8 H100, 1,024/256 tokens: tp=2
    pp=4 8.4 req/s (simulated 9-10; the steady state's spread 15.6), tp=4 pp=2 13.0 (14.5-16;
    spread 17.4), tp=1 pp=8 5.0 (4.5-5.5; spread 11.9); tp=2 pp=4 at 256/256 28.3 (27-31;
    spread 39.8), 2,048/256 4.3 (4.8-5.5; spread 6.7), 3,000/256 2.9 (3.5-3.75; spread 3.85);
    tp=4 pp=2 at 512/16 31.2 (30-34; spread 55.7); Llama-3.1-405B tp=8 pp=2 on 16 H100 4.8
    (4.75-4.9; spread 5.6); Qwen3-30B-A3B tp=2 pp=4 82 (90-100; spread 107). Within 0-20% below
    the simulation where the spread was 7-135% above it (its phases are not locked for good: a
    Poisson gap now and then lets a light micro-batch catch a prompt). Hand-worked: R0 = 0.1 s, R = R0 + 1 ms a
    decode + 20 ms a prompt, D = 99, I = 1,000, B = 4,000: q = 4, R(396, 4) - R0 = 0.396 +
    0.08 = 0.476 s, lambda = 4 / 0.476 = 8.40 req/s. docs/cost-model.md (Serving: pipeline).
    inf where prompts take turns (prompts_take_turns: each fills micro-batches of its own, the
    lanes of steady_state, so no convoy forms)."""
    if prompts_take_turns(input_len, step_budget_tokens):
        return math.inf
    d = max(output_len - 1, 0) / tokens_per_round
    context = input_len + output_len / 2 if context_tokens is None else context_tokens
    pairs = causal_pairs(input_len) if prompt_pairs is None else prompt_pairs
    prompts = step_budget_tokens / input_len
    decodes = d * prompts
    full = round_seconds(StepLoad(decodes, decodes * context, spec_tokens=decodes * spec_tokens),
                         StepLoad(0, 0, prompts * input_len, prompts * pairs, prompts))
    carried = full - round_seconds(StepLoad(0, 0), None)
    return prompts / carried if carried > 0 else math.inf


def arrivals(concurrency: float, input_len: int, output_len: int, step_budget_tokens: int, in_flight: int,
             tokens_per_round: float = 1.0, spec_tokens: int = 0,
             outside_rounds: float = 0.0, chunk_lanes: int | None = None,
             budget_cap: bool = True) -> tuple[float, float, float, bool]:
    """steady_state's arrival solution, no step priced: (lambda requests per round, S_p
    prompt rounds, W queued rounds, budget-bound). lambda * S_p is the prompt rounds a
    rank carries per round (its chunks, with one micro-batch). `outside_rounds` X: the mean
    rounds a request spends in the system outside the rounds that carry it (its first-token
    cost and the wait for the round in progress), so lambda = C / (D + S_p + X).
    `chunk_lanes`: the micro-batches a prompt's chunks may fill in a round (PP: up to p, however
    few decode; None: `in_flight`). `budget_cap` False: lambda is not capped at the budget (never
    bound; steady_state's open loop of prompts that take turns, whose queue holds it below)."""
    c, i, d = concurrency, input_len, max(output_len - 1, 0) / tokens_per_round
    lanes = in_flight if chunk_lanes is None else max(in_flight, chunk_lanes)
    width = 1 + spec_tokens
    round_budget = in_flight * step_budget_tokens
    outside = max(outside_rounds, -OUTSIDE_ROUNDS_FLOOR * (d + 1))
    rate = c / (d + 1 + outside)
    prefill_rounds, bound = 1.0, False
    for _ in range(SOLVER_ITERATIONS):
        room = max(step_budget_tokens - rate * d * width / in_flight, 1.0)
        prefill_rounds = prompt_chunking(i, room, lanes)[1]
        rate = c / (d + prefill_rounds + outside)
        bound = budget_cap and rate * (i + d * width) > round_budget
        if bound:
            rate = round_budget / (i + d * width)
    queue_rounds = max(0.0, c / rate - d - prefill_rounds - outside) if bound else 0.0
    return rate, prefill_rounds, queue_rounds, bound


RESIDENCE_PASSES = 12
"""At most this many steady-state passes settle the rounds a request spends outside the rounds
that carry it (each pass prices the rounds at the last pass's arrivals). The map contracts by
at most X / (D + S_p + X) per pass (a longer round shortens X's first-token part), so it
settles to RESIDENCE_TOLERANCE_ROUNDS in 2-3 passes at long outputs and within 8 at one."""
RESIDENCE_TOLERANCE_ROUNDS = 2.0**-12
"""The passes stop when X moves less than this share of the request's rounds D + S_p + X."""
OUTSIDE_ROUNDS_FLOOR = 0.5
"""X may be below 0, down to this share of D + S_p: Little's law counts a request's E2E in mean
rounds, and a decoder's rounds may be shorter than the mean (they leave out the prompts' heavy
rounds ahead of it); clamped at 0, X counted too few arrivals a round (Llama-3.1-8B tp=1 pp=8
dp=2 on 2x8 H100, 32,000/32 tokens at 9.4 req/s: 3.19 prompts/s a replica against 4.70). A bound
on the passes, not fitted: that case settles at X = +1.04 for any floor from 0.5 to 0.9 (its
passes cross -0.70 (D + S_p) on the way); at 0.3 they stop short, at X = -9.6."""


def two_point_length_biased_seconds(long_share: float, short_seconds: float, long_seconds: float) -> float:
    """The round a random moment falls in, E[T^2] / E[T], where a share p of the rounds last T_long
    and the rest T_short (renewal length bias, Kleinrock vol. 1 sec. 5.2)."""
    return ((1 - long_share) * short_seconds**2 + long_share * long_seconds**2) / (
        (1 - long_share) * short_seconds + long_share * long_seconds)


def length_biased_round_seconds(mean_round: float, decode_round: float, prompt_round: float) -> float:
    """two_point_length_biased_seconds where rounds last T_d or T_p and a share p = (T - T_d) /
    (T_p - T_d) of them carry a chunk (so that their mean is T). T = 8.02 ms, T_d = 7.64, T_p =
    17.44: p = 0.0388, (0.9612 x 7.64^2 + 0.0388 x 17.44^2) / 8.02 = 8.47 ms."""
    if not decode_round < mean_round < prompt_round:
        return mean_round  # one kind of round (every round carries chunks, or none: their mean)
    share = (mean_round - decode_round) / (prompt_round - decode_round)
    return two_point_length_biased_seconds(share, decode_round, prompt_round)


def alignment_rounds(concurrency: float, open_loop: bool, routed: LeastLoaded | None) -> float:
    """Rounds a new request waits for the round in progress: ROUND_ALIGNMENT_ROUNDS when it finds
    the engine busy (busy_on_arrival; behind a least-loaded router, every replica busy)."""
    return ROUND_ALIGNMENT_ROUNDS * (busy_on_arrival(concurrency, open_loop) if routed is None else routed.busy)


def steady_state(concurrency: float, input_len: int, output_len: int, step_budget_tokens: int,
                 in_flight: int, round_seconds: Callable[..., float],
                 first_token_seconds: float, lockstep_ranks: int = 1, tokens_per_round: float = 1.0,
                 spec_tokens: int = 0, context_tokens: float | None = None,
                 prompt_pairs: float | None = None, open_loop: bool = False,
                 max_running: float = math.inf, router_replicas: int = 1,
                 pipeline_stages: int = 1, schedules_ahead: bool = False) -> SteadyState:
    """Per round: n_d = lambda * D decode tokens and lambda * I prompt tokens, lambda =
    C / (D + S_p + X + W), X the rounds a request spends outside the rounds that carry it:
    its first-token cost and its wait for the round in progress (everything in its E2E but
    its queue W and its own S_p + D rounds, in mean rounds T; Little's law on the requests
    in the system: lambda = C T / E2E). X depends on the rounds it prices, so it is settled
    by passes (RESIDENCE_PASSES), the first at X = the alignment wait alone. Counting only
    D + S_p rounds priced a short output's prompts twice: at O = 1 a request's round and
    its wait for one are both in its E2E, lambda was C per round for C / 2. A prompt's chunk in a step is what the budget leaves after that step's
    decodes, B - n_d / k, so a prompt is N = ceil(I / (B - n_d / k)) chunks; a round takes up
    to k of them (with PP, consecutive micro-batches: prompt_chunking), S_p = ceil(N / k)
    rounds, each prompt round n = ceil(N / S_p) carriers (`round_seconds(load, chunk, n)`; a
    round function of two arguments serves n = 1). When lambda * (I + D) would
    exceed the k * B tokens a round can carry, lambda = k * B / (I + D) and the excess
    clients wait W rounds. With q = lambda * S_p prompt chunks per round on average: q <= 1
    means a fraction q of rounds carry one chunk of I / S_p tokens in one micro-batch (the rest
    decode only); q > 1 means every round carries the mean lambda * I prompt tokens: one chunk
    in one micro-batch, the other q - 1 spread (continuous at q = 1).
    `lockstep_ranks` d > 1 (the DP ranks of an EP group, which step together: vLLM syncs them
    every step, vllm/v1/worker/dp_utils.py coordinate_batch_across_dp, and every MoE layer's
    all-gather waits for all of them): each rank's prompts arrive apart, so a round lasts as
    long as its busiest rank's attention and dense layers while the experts see the ranks'
    mean (StepLoad.expert_tokens). q <= 1: a round carries a chunk on some rank with
    probability 1 - (1 - q)^d, and then the experts see q / (1 - (1 - q)^d) chunks per rank;
    a prompt's own rounds (in TTFT) carry its chunk and the others' expected q each, (1 + (d -
    1) q) / d per rank for the experts; q > 1: the busiest rank carries
    m = busiest_rank_chunks(q, d) = floor(q) + 1 - (1 - frac(q))^d chunks (vLLM routes each
    request to the least loaded rank) and the experts the mean q.
    TTFT = first-token cost + (alignment + W) rounds + the prompt's service, S_p prompt rounds
    without PP (prompt_service_seconds: its N chunks one micro-batch apart), where at the budget
    W is what a client's cycle of C / lambda rounds leaves after the request's own latencies
    (so throughput is the engine's capacity, lambda O per round, however many clients wait);
    TPOT = the mean round a decoding request sees: of the q chunks per round, its own prompt's
    share q / C runs before its first token, so its rounds carry the others' q (C - 1) / C,
    TPOT = mean - (mean - decode round) / C (at C = 1 the pure decode round, as a lone
    client measures it); a closed loop at the budget queues prompts whenever a request decodes,
    so its rounds carry a full budget, TPOT = mean; in lockstep the other ranks' prompts stay (lockstep_decoding_round;
    for q > 1 its own share is 1 / (C d) of the chunks); E2E = TTFT + D * TPOT; throughput = C * O / E2E.
    Speculative decoding (`spec_tokens` k drafted per sequence, `tokens_per_round` e emitted
    per round on average): a request decodes for D / e rounds, each of its decode steps takes
    1 + k tokens of the budget (and of the step's rows), TPOT = round / e.
    A length mix (--dataset): I and O are the means, `context_tokens` a decoding sequence's
    decode-time-weighted context and `prompt_pairs` a prompt's mean causal pairs
    (ServeRequest.decode_context_tokens, prompt_pairs); None: I + O/2 and causal_pairs(I).
    `open_loop`: requests arrive at a rate (vllm bench serve --request-rate R, Poisson) and C is
    the mean number in the replica, R E2E by Little's law (fractional; below 1 at light load):
    a decoding request's rounds carry every arriving prompt's chunks (own_prompt_share 0) and its
    own decode beside the others' n_d (its rounds price n_d + 1 decodes: the others it finds are
    the time average, but never more than `max_running`, the sequences the engine or the clients
    let run at once), and a new request waits out the current round with probability 1 - e^-C
    (busy_on_arrival). Without PP or lockstep ranks, and short of the budget, the arrivals
    bunch (poisson_bunching): the round a request lands in is the length-biased L, of which it
    waits half; its first round carries its own chunk and the rho L of chunks that arrived
    meanwhile (in place of the mean's others); its decode rounds keep that round's excess over
    the mean, decaying by rho a round: (first - T) rho (1 - rho^D) / (1 - rho) over D rounds.
    Behind a router over d replicas the router spreads a bunch evenly, so Var T / d.
    `router_replicas` d > 1 (open loop, no lockstep ranks): the arrivals are spread over d such
    replicas by a least-loaded router (least_loaded), so a decoding request's rounds carry only
    the share of the prompts that join its replica and the others it sits with (the seen
    requests, at n_d / C decoding each) in place of n_d + 1, a new request waits out a round
    only when every replica is busy, and its prompt runs beside the decodes of the replica it
    joins (the others decoding there, in place of n_d).
    `pipeline_stages`: the replica's p: a prompt's chunks fill up to p micro-batches a round
    however few decode (`chunk_lanes` of arrivals), and prompt_queue prices a PP replica's
    prompts only where they ride one round. With PP a round's chunks (N > 1) take micro-batches
    of their own up to the p lanes before any spread beside them (q > 1), a prompt's service
    counts its last chunk's longer path (prompt_service_seconds' E), its entry waits per
    pipeline_entry_wait, and whole prompts (N = 1) bunch as on one replica (held at q = 1's
    past it).
    Open loop, prompts that take turns (2 I > B): X is first settled without the budget's cap
    (_settle_below_budget), since their queue's wait holds the arrivals below it.
    solve_open_loop finds the C of a rate."""
    routed = least_loaded(concurrency, router_replicas) if open_loop and router_replicas > 1 and lockstep_ranks == 1 \
        else None
    args = (concurrency, input_len, output_len, step_budget_tokens, in_flight, round_seconds, first_token_seconds,
            lockstep_ranks, tokens_per_round, spec_tokens, context_tokens, prompt_pairs, open_loop, max_running,
            router_replicas, routed, pipeline_stages, schedules_ahead)
    start = alignment_rounds(concurrency, open_loop, routed)
    decode_rounds = max(output_len - 1, 0) / tokens_per_round
    if open_loop and lockstep_ranks == 1 and prompts_take_turns(input_len, step_budget_tokens):
        # prompts that take turns at a rate (two exceed the budget, so they exceed any pass's
        # room, which is the budget less the decodes): their queue's wait (in X) holds the arrivals below
        # the budget, so the budget's cap is not what binds. With it the passes could also settle
        # at a budget-bound state of the same C, whose TTFT is a closed loop's (its clients'
        # cycle), and the open loop mixed the two: Llama-3.1-70B nvfp4 tp=8, 16,000/8 tokens at
        # 1.2/1.3/1.4 req/s, TTFT 1.93/1.61/1.29 s falling as the rate rose (simulated 1.85/2.56/
        # 4.77 s). Where no such state settles within the budget, the capped one stands
        width = 1 + spec_tokens
        max_rate = in_flight * step_budget_tokens / (input_len + decode_rounds * width)
        queued = _settle_below_budget(args, concurrency, input_len, start, decode_rounds, max_rate,
                                      math.ceil(input_len / step_budget_tokens))
        if queued is not None:
            return queued
    return _settle(args, start, decode_rounds)


def _settled_rounds(steady: SteadyState, decode_rounds: float) -> float:
    """X as a pass's state prices it: its E2E in mean rounds less its queue and its own rounds."""
    return max(steady.e2e_seconds / steady.step_seconds - steady.queue_rounds - decode_rounds - steady.prefill_rounds,
               -OUTSIDE_ROUNDS_FLOOR * (decode_rounds + steady.prefill_rounds))


def _settle(args: tuple, outside: float, decode_rounds: float, budget_cap: bool = True) -> SteadyState:
    """steady_state's passes from X = `outside` (`budget_cap`: arrivals' budget-bound cap), until
    X settles (RESIDENCE_TOLERANCE_ROUNDS) or RESIDENCE_PASSES: the last pass."""
    steady = _steady_pass(*args, budget_cap, outside)
    for _ in range(RESIDENCE_PASSES - 1):
        settled = _settled_rounds(steady, decode_rounds)
        if abs(settled - outside) <= RESIDENCE_TOLERANCE_ROUNDS * (decode_rounds + steady.prefill_rounds
                                                                   + max(settled, 0.0)):
            break
        outside = settled
        steady = _steady_pass(*args, budget_cap, outside)
    return steady


def _settle_below_budget(args: tuple, concurrency: float, input_len: int, start: float, decode_rounds: float,
                         max_rate: float, fewest_prompt_rounds: int) -> SteadyState | None:
    """steady_state's X without the budget cap, where it settles with arrivals within the budget
    (`max_rate` a round), else None. X - settled(X) grows with X (more rounds outside, fewer
    arrivals a round, a shorter queue), so its root is bracketed from the X at which lambda =
    C / (D + S_p + X) reaches the budget and found by false position, not by passes, which
    swing across the budget near it (a pass past it prices a queue whose share of the rounds
    nears 1, whose wait and the requests it leaves behind grow without bound, and least_loaded's
    sums with them: 37 million terms for one plan). The excess is taken as a share,
    (X - settled) / (X + settled): the same root and sign, but bounded where a pass near the
    budget settles at X's thousands (a queue whose share nears 1), which left false position's
    secant pinned to the far end (of 314 solves in a DeepSeek-V3 rate plan, 171 spent all 12
    rounds); it stops once that share is within half RESIDENCE_TOLERANCE_ROUNDS, the passes'
    own criterion, at whichever end meets it."""
    low = max(start, concurrency / max_rate - decode_rounds - fewest_prompt_rounds)
    passes: dict[float, SteadyState] = {}

    def excess(outside: float) -> float:
        if outside not in passes:
            passes[outside] = _steady_pass(*args, False, outside)
        settled = _settled_rounds(passes[outside], decode_rounds)
        return (outside - settled) / (outside + settled) if outside + settled > 0 else 0.0

    if excess(low) >= 0:
        return None  # it would settle with more arrivals than the budget carries
    high = 2 * low + decode_rounds + 1
    for _ in range(RESIDENCE_PASSES):
        if excess(high) >= 0:
            break
        low, high = high, 2 * high
    else:
        return None
    low, high = false_position_bracket(low, high, excess, RESIDENCE_TOLERANCE_ROUNDS, RESIDENCE_PASSES,
                                       RESIDENCE_TOLERANCE_ROUNDS / 2)
    short_low = -excess(low)  # the low end's share under settled (passes memoised: no new pass)
    settled_low = short_low <= RESIDENCE_TOLERANCE_ROUNDS / 2 and short_low < excess(high)
    steady = passes[low if settled_low else high]
    rate = steady.prefill_tokens_per_step / max(input_len, 1)
    return steady if rate <= max_rate * (1 + RESIDENCE_TOLERANCE_ROUNDS) else None


def _steady_pass(concurrency: float, input_len: int, output_len: int, step_budget_tokens: int,
                 in_flight: int, round_seconds: Callable[..., float],
                 first_token_seconds: float, lockstep_ranks: int, tokens_per_round: float,
                 spec_tokens: int, context_tokens: float | None, prompt_pairs: float | None, open_loop: bool,
                 max_running: float, router_replicas: int, routed: LeastLoaded | None, pipeline_stages: int,
                 schedules_ahead: bool, budget_cap: bool, outside_rounds: float) -> SteadyState:
    """One pass of steady_state at `outside_rounds` X (`routed`: least_loaded over the
    router's replicas, None without one)."""
    c, i, d = concurrency, input_len, max(output_len - 1, 0) / tokens_per_round
    width = 1 + spec_tokens
    context = i + output_len / 2 if context_tokens is None else context_tokens
    pairs = causal_pairs(i) if prompt_pairs is None else prompt_pairs
    # a prompt's chunks go to consecutive micro-batches, up to p of them however few decode (the
    # scheduler gives each new step the prompt's next chunk while the last is in flight)
    lanes = max(in_flight, pipeline_stages)
    rate, prefill_rounds, queue_rounds, bound = arrivals(c, input_len, output_len, step_budget_tokens, in_flight,
                                                         tokens_per_round, spec_tokens, outside_rounds, lanes,
                                                         budget_cap)
    decode_seqs = rate * d
    decode = StepLoad(decode_seqs, decode_seqs * context, spec_tokens=decode_seqs * spec_tokens)
    decode_round = round_seconds(decode, None)
    chunks_per_round = rate * prefill_rounds
    room = max(step_budget_tokens - decode_seqs * width / in_flight, 1.0)
    prompt_chunks = prompt_chunking(i, room, lanes)[0]
    # the chunks S_p rounds of k micro-batches hold (arrivals' S_p, solved at the rate before its
    # last update, may sit one rounding off this room's): N = S_p when k = 1
    prompt_chunks = min(max(prompt_chunks, (prefill_rounds - 1) * lanes + 1), prefill_rounds * lanes)
    carriers = max(1, math.ceil(prompt_chunks / prefill_rounds)) if prefill_rounds else 1
    one_chunk = StepLoad(0, 0, i / prompt_chunks, pairs / prompt_chunks, 1 / prompt_chunks)
    chunk_tokens = one_chunk.prefill_tokens
    # PP: a prompt's chunks are cut greedily (greedy_cut), so a carrier's path holds a full
    # chunk's tokens where the round's work is that of the mean chunks (round_time's `longest`);
    # its attention the mean chunk's (a round's carriers hold chunks at every offset of their
    # prompts: the full chunks' own pairs, fewer than the mean's, would shorten the path). Not
    # for DP ranks in lockstep: a path of its own a round is another stage step of every MoE
    # layer, which took the serving search over 16,384 GPUs from 0.20 to 0.25 s (DeepSeek-V3)
    cut = greedy_cut(i, pairs, prompt_chunks, room) if lanes > 1 and lockstep_ranks == 1 else None
    longest = None if cut is None else replace(one_chunk, prefill_tokens=cut[0].prefill_tokens)
    mean_entry = cut is not None  # at a rate the PP entry prices the mean chunks' path (below)
    given = round_seconds

    def carried(load: StepLoad, chunk: StepLoad | None, n: int = 1, on_path: StepLoad | None = None,
                greedy: bool = True) -> float:
        """The round of `load` with n carriers of `chunk` ((load, chunk, n carriers) with PP), the
        chunk on their path `on_path`, else (`greedy`) the full chunk where a prompt is cut
        greedily, else the mean chunk."""
        if chunk is None:
            return given(load, None)
        if on_path is None and greedy:
            on_path = longest
        if on_path is not None:
            return given(load, chunk, n, longest=on_path)
        return given(load, chunk, n) if n != 1 else given(load, chunk)

    # a prompt's S_p rounds: S_p - 1 of n carriers, the last of the N - (S_p - 1) n chunks left
    # (N = 3 chunks in 2 lanes: 2 + 1, not 2 + 2: pricing every round at n carriers counted 4
    # chunks' work for 3, and with the path of a full chunk in each: Llama-3.1-8B tp=1 pp=2 on
    # A100 at 24 clients, 4,200/128 tokens, 1,545 tok/s against 3,900 tokens' 2,405, where the
    # step simulation has 1,888 and 1,969; found by a sweep against it)
    last_carriers = min(max(round(prompt_chunks - (prefill_rounds - 1) * carriers), 1), carriers)

    def prompt_rounds_seconds(load: StepLoad, chunk: StepLoad, whole: float | None = None) -> float:
        """The mean of a prompt's S_p rounds of `chunk` beside `load` (`whole`: its round of n
        carriers, when priced already); a last round holding only the greedy cut's rest has the
        rest on its path."""
        whole = carried(load, chunk, carriers) if whole is None else whole
        if prefill_rounds <= 1 or last_carriers == carriers:
            return whole
        rest = None if cut is None or last_carriers > 1 else replace(
            chunk, prefill_tokens=cut[1].prefill_tokens, prefill_attention_pairs=cut[1].prefill_attention_pairs)
        return ((prefill_rounds - 1) * whole + carried(load, chunk, last_carriers, rest)) / prefill_rounds

    def round_seconds(load: StepLoad, chunk: StepLoad | None) -> float:
        """A prompt round (the mean of a prompt's S_p), or a round without one."""
        return carried(load, None) if chunk is None else prompt_rounds_seconds(load, chunk)
    decoding_round = None
    if chunks_per_round <= 1:
        carrying = busiest_rank_chunks(chunks_per_round, lockstep_ranks)  # 1 - (1 - q)^d
        busiest = carrying
        # a prompt's own round (its chunks in n carriers: its service prices its traversal), and
        # the mean of its S_p rounds (the work they add to the mean round)
        own_prompt_round = carried(decode, one_chunk, carriers)
        prompt_round = prompt_rounds_seconds(decode, one_chunk, own_prompt_round)

        def mean_chunk_round() -> float:
            """Its own round with mean chunks on the path (the PP entry's at a rate, below)."""
            return carried(decode, one_chunk, carriers, greedy=False)
        mean_round = (1 - chunks_per_round) * decode_round + chunks_per_round * prompt_round
        if lockstep_ranks > 1 and carrying > 0:
            some = replace(one_chunk, expert_tokens=chunk_tokens * chunks_per_round / carrying)
            mean_round = (1 - carrying) * decode_round + carrying * round_seconds(decode, some)
            mine = replace(one_chunk, expert_tokens=chunk_tokens * (1 + (lockstep_ranks - 1) * chunks_per_round)
                           / lockstep_ranks)
            prompt_round = own_prompt_round = carried(decode, mine, carriers)
            decoding_round = lockstep_decoding_round(chunks_per_round, c, lockstep_ranks, decode_round,
                                                     lambda chunks: round_seconds(decode, replace(
                                                         one_chunk, expert_tokens=chunk_tokens * chunks)),
                                                     open_loop)
    else:
        busiest = busiest_rank_chunks(chunks_per_round, lockstep_ranks)
        # with PP, prompts cut into chunks (N > 1) fill their micro-batches' room, one chunk
        # each: the round's chunks take micro-batches of their own, up to the p lanes, and only
        # the rest ride beside them. Spreading them over the carriers too ran the carriers' path
        # at 1.45 chunks each, over their room: Llama-3.1-70B tp=2 pp=8, 32,000/16 tokens at 32
        # clients, capacity 1.14 req/s where the step simulation falls behind only past 1.5. Whole prompts
        # (N = 1) share micro-batches: one carries a whole prompt, the others' spread
        # a prompt round holds N / S_p chunks on average (S_p - 1 of n and the rest in the last)
        chunks_per_prompt_round = prompt_chunks / prefill_rounds if prefill_rounds else 1.0
        filled = min(busiest * chunks_per_prompt_round, lanes) if pipeline_stages > 1 and prompt_chunks > 1 \
            else carriers
        others = busiest * chunks_per_prompt_round - filled  # the chunks beyond the carriers', spread
        spread = StepLoad(decode_seqs, decode_seqs * context, others * chunk_tokens,
                          others * one_chunk.prefill_attention_pairs, others * one_chunk.prompts_completing,
                          decode_seqs * width + (chunks_per_round - 1) * chunk_tokens if lockstep_ranks > 1 else None,
                          decode_seqs * spec_tokens)
        if pipeline_stages > 1 and lockstep_ranks == 1:
            # no micro-batch holds more prompt tokens than its room: a carrier's chunk (a whole
            # prompt, or a full chunk) and its share of the spread fill it at most, the rest is
            # another's (a 2,040-token prompt in a 2,042-token room beside 826 spread tokens made
            # a 2,866-token path: Llama-3.1-70B fp8 tp=1 pp=4 on L40S at 28 clients, 2,040/10
            # tokens, 20 tok/s where 2,048-token prompts ran 24 and the step simulation 29-34)
            on_top = one_chunk if longest is None else longest
            cap_tokens = max(room - others * chunk_tokens / in_flight, 0.0)
            if on_top.prefill_tokens > cap_tokens:
                longest = on_top.scaled(cap_tokens / on_top.prefill_tokens)
                mean_entry = False  # the path at the room: the entry's too (below)

        def filled_round(greedy: bool) -> float:
            """The round of `filled` carriers beside the spread: a fractional number of carrier
            micro-batches is the mean of its two whole neighbours."""
            if filled == carriers:
                return carried(spread, one_chunk, carriers, greedy=greedy)
            fewer = math.floor(filled)
            part = filled - fewer
            return (1 - part) * carried(spread, one_chunk, fewer, greedy=greedy) + (
                part * carried(spread, one_chunk, fewer + 1, greedy=greedy) if part else 0.0)

        prompt_round = mean_round = own_prompt_round = filled_round(True)

        def mean_chunk_round() -> float:
            return filled_round(False)
    takes_turns = prompts_take_turns(i, room)  # against the room the decodes leave: never share a round
    last_extra_seconds = 0.0  # the last chunk's round over the mean chunk's (prompt_service_seconds)
    if lanes > 1 and prompt_chunks > 1 and lockstep_ranks == 1:
        base = decode if chunks_per_round <= 1 else spread
        last_extra_seconds = greedy_chunks_extra_seconds(
            i, pairs, prompt_chunks, room, lanes, lambda chunk: given(base, chunk, 1), one_chunk,
            None if longest is None else carried(base, one_chunk))
        if not open_loop and 0 < chunks_per_round <= 1 and lockstep_ranks == 1:
            # a closed loop's prompt rounds one at a time: its N chunks hold the pipeline for
            # their traversal (a flow shop, N + p - 1 chunk-stage times where its S_p rounds
            # price S_p p: prompt_service_seconds), and the decoders' steps queued behind them at
            # every stage wait for its tail, unless the next round's prompt fills the stages it
            # drains (a share q of rounds carry one; at q = 1 none is left, as past it; at a
            # rate pipeline_windows prices the tails). Llama-3.1-8B tp=1 pp=2 on H100 at 24
            # clients, 16,350/128 tokens (8,190 + 8,160): 1,629 tok/s where the step simulation
            # has 1,252; found by a sweep against it
            traversal_round = prompt_service_seconds(prompt_chunks, own_prompt_round, lanes, last_extra_seconds) \
                / prefill_rounds
            if traversal_round > prompt_round:
                mean_round += chunks_per_round * (1 - chunks_per_round) * (traversal_round - prompt_round)
    held = c  # requests the engine holds: at a rate, less the first-token cost's share of E2E
    residence_rounds = d + prefill_rounds + queue_rounds + outside_rounds
    if open_loop and residence_rounds > 0:
        # C = lambda E2E counts the first-token cost (the API server, the stream), which no engine
        # holds; an arrival finds the engine busy (and vLLM's DP front end counts its waiting and
        # running) by lambda (E2E - t_first) (Llama-3.1-8B tp=1 dp=8, 1,024/4 tokens at 60 req/s:
        # E2E 161 -> 155 ms against a simulated 134)
        held = c * max(0.0, 1 - first_token_seconds / (mean_round * residence_rounds))
        if routed is not None:
            routed = least_loaded(held, router_replicas)
    alignment = alignment_rounds(held, open_loop, routed)
    busy = alignment / ROUND_ALIGNMENT_ROUNDS  # the chance a new request finds the engine busy
    if decoding_round is None:  # one rank; or every round carries prompts (q > 1): own share 1/(C d)
        if bound and not open_loop:
            # a closed loop at its budget: prompts queue whenever a request decodes, so every
            # round it decodes in carries a full budget of the others' prompt tokens (its own ran
            # before its first token, but the queue fills their place; in lockstep too, where a
            # lone rank priced above its group broke the property that lockstep never beats a
            # lone rank, test_lockstep_never_beats_a_lone_rank). Leaving out its own share
            # 1 / C had TPOT -22% and -30% against the step simulation at 4 and 3 clients
            # (Llama-3.1-70B fp8 tp=8 on 8 A100, 19,723/12 tokens), now +2%
            share = 1.0
        else:
            # written from the decode round up: exactly it at C d = 1 (no rounding below it)
            own = own_prompt_share(c, open_loop)
            share = 1 - own / lockstep_ranks if routed is None else routed.prompt_share
        if not open_loop and lockstep_ranks == 1 and in_flight == 1 and not bound and 0 < chunks_per_round <= 1 \
                and takes_turns and d + outside_rounds > 0:
            # prompts that take turns never share a round with a request's own: the others' (C - 1)
            # S_p prompt rounds of its cycle fall in its D + X other rounds, not spread over all
            # D + S_p + X (the prompt rounds they would have shared with its own are where it
            # prefills). C = 2, S_p = 4, D = 7, X = 0: 4 of its 7 decode rounds carry the other's
            # chunks, not 0.5 x 8 / 11 of all 11 (Qwen3-30B-A3B tp=1 on an H100, 32,000/8 tokens
            # at 2 clients: E2E 1.92 s and 1.04 req/s, faster than its prompt rounds allow; the
            # step simulation has 2.21 s and 0.90 req/s)
            share = min(share * (d + prefill_rounds + outside_rounds) / (d + outside_rounds), 1 / chunks_per_round)
        decoding_round = decode_round + (mean_round - decode_round) * share
    own_round, wait_round = own_prompt_round, mean_round
    if open_loop:
        # a decoding request's rounds hold its own token beside the others' decodes, which under
        # Poisson arrivals are as many as the time average (M/G/infinity: the others a request
        # finds are Poisson with the mean of the whole), so it sees n_d + 1 (at light load one
        # sequence, never less: the decode round of n_d < 1 priced a fraction of one); behind a
        # least-loaded router, the requests it sits with, n_d / C of them decoding; in lockstep
        # the same router balances the group's ranks, so a decoder's rank holds their balanced count
        seen = max(decode_seqs, min(decode_seqs + 1, max_running))
        balanced = routed if routed is not None else least_loaded(c, lockstep_ranks) if lockstep_ranks > 1 else None
        if balanced is not None:
            seen = min(1 + (balanced.seen - 1) * decode_seqs / c, max_running)
        if routed is not None:
            # the new request's replica: the decodes of the others it finds there
            joined = decode_round - round_seconds(decode.scaled(routed.joined / c), None)
            own_round, wait_round = own_prompt_round - joined, mean_round - joined
        decoding_round += round_seconds(StepLoad(seen, seen * context, spec_tokens=seen * spec_tokens),
                                        None) - decode_round
    waited_seconds = alignment * wait_round
    if open_loop and lockstep_ranks > 1:
        # a Poisson arrival lands at a random moment of the group's round in progress and waits
        # out what is left of it: half the length-biased round, E[T^2] / (2 E[T]) over the rounds
        # that carry some rank's chunk (T_p) and those that do not (T_d), not a whole round (a
        # closed loop's client sends just after a step ends and joins the step after: Qwen3-30B-A3B
        # tp=1 dp=8 ep=8, 1,024/1,024 tokens at 5 and 20.2 req/s, TTFT +11% and +16% over the
        # step simulation, which waits about half a round)
        waited_seconds = alignment * length_biased_round_seconds(wait_round, decode_round, own_round) / 2
    service_seconds = prompt_service_seconds(prompt_chunks, own_round, lanes, last_extra_seconds)
    # async scheduling's round ahead (below): waited out when the engine is busy, a decoder's round
    ahead_busy, ahead_round = busy, None
    bunched_seconds = 0.0  # what Poisson bunching adds to a decoding request's rounds
    # with PP, whole prompts (N = 1) bunch the same way: vLLM puts every prompt waiting when a
    # step is scheduled into that step, so a new prompt waits out the gap it lands in, which
    # the long ones (a carrier's path) weigh most, and rides with those that arrived in it (a
    # prompt alone in its carrier had TTFT -19/-22/-19% at 40% of capacity, Llama-3.1-70B
    # tp=4 pp=2 and tp=2 pp=4 and 405B tp=8 pp=2, 1,024/256 tokens, and -35% at 70%: `--pp`
    # median 19% -> 8%). Past a chunk a round (q > 1) the bunching is held at one a round's,
    # the rounds' own growth on top (the convoys there are not priced: docs/cost-model.md);
    # without that hold TTFT fell as the rate rose (tp=2 pp=4 at 7 and 8 req/s: 486 and 301 ms)
    whole_pipelined = pipeline_stages > 1 and prompt_chunks <= 1
    if open_loop and lockstep_ranks == 1 and (in_flight == 1 or whole_pipelined) and not bound \
            and chunks_per_round > 0:
        # Poisson arrivals bunch: a long round gathers more prompts for the next (poisson_bunching)
        bunched = poisson_bunching(wait_round, wait_round - (mean_round - decode_round),
                                   min(chunks_per_round, 1.0) if whole_pipelined else chunks_per_round,
                                   router_replicas if routed is not None else 1)
        lands_seconds, rho = bunched.length_biased_round_seconds, bunched.prompt_share
        if prompt_chunks > 1 and chunks_per_round <= 1:
            # prompts cut into chunks, each filling its step: a round carries one chunk at most
            # (and a sliver of the next prompt's), so the round an arrival lands in is
            # length-biased over two lengths, T_d and T_p, a share q of the rounds carrying a
            # chunk: E[T^2] / E[T]. Poisson bunching's rounds grow with the chunks that arrive
            # together, which these never share: Llama-3.1-70B nvfp4 tp=8, 16,000/8 tokens at
            # 1.25 req/s, a 0.93 s round where chunk rounds last 0.34 s, and TPOT held at that cap
            # (339 ms) against a simulated 258 ms (now 267)
            lands_seconds = two_point_length_biased_seconds(chunks_per_round, decode_round, own_round)
        # it arrives in a round of the length-biased mean and waits out half of it; its first
        # round carries its chunk and the chunks that arrived during that one (in place of the
        # mean's others, spread over every round when q > 1)
        spread_seconds = 0.0 if whole_pipelined else max(chunks_per_round - 1, 0.0) * bunched.chunk_seconds
        first_round_seconds = own_round - spread_seconds + busy * rho * lands_seconds
        if whole_pipelined and takes_turns:
            # whole prompts that take turns ride micro-batches of their own, one each: a bunch
            # fills at most the lanes, so no round outlasts the one with a prompt in every lane
            # (the bunching's rounds grew by a whole path a prompt: Qwen3-30B-A3B tp=1 pp=4 on
            # L40S, 2,040/2 tokens at 11.5 req/s, TPOT 650 ms where the step simulation has 93
            # and no round can exceed four 2,040-token micro-batches; found by a sweep against it)
            fullest_round = carried(decode, one_chunk, lanes)
            lands_seconds = min(lands_seconds, fullest_round)
            first_round_seconds = min(first_round_seconds, fullest_round)
        waited_seconds = busy * lands_seconds / 2
        service_seconds += first_round_seconds - own_round  # its first round, bunched, in place of its own
        if d > 0 and routed is None:
            # the rounds after it decay back to the mean by the prompt share each round (AR(1));
            # behind a least-loaded router the replica that took a bunch is the busiest, so the
            # next arrivals go elsewhere and its rounds do not keep the excess (charging it
            # doubled TPOT at 4 output tokens, Llama-3.1-8B tp=1 dp=8 at 60 req/s: 31.4 ms
            # against a simulated 15.6)
            excess_seconds = (first_round_seconds - mean_round) * rho ** (prompt_chunks - 1)
            # under async scheduling a round takes in the arrivals of the round before the one
            # in progress, so the excess comes back every second round: rho^m at round 2m
            # (Llama-3.1-70B tp=8, 512/2 tokens at 23.7 req/s: TPOT 30.2 ms against a simulated
            # 17.3 with the lag-1 decay)
            echoes = math.floor(d / 2) if schedules_ahead else d
            bunched_seconds = excess_seconds * rho * (1 - rho ** echoes) / (1 - rho) / d
            decoding_round += bunched_seconds
    if open_loop and lockstep_ranks == 1 and not bound and chunks_per_round > 0 and takes_turns \
            and (pipeline_stages == 1 or prefill_rounds <= 1):
        # prompts that do not fit two to a step take turns: whole prompts queue for the rounds
        # that carry them, a new one waits for the prompts ahead, and a request's first decode
        # rounds follow the prompts left behind it, which the mean round spreads over every
        # round (prompt_queue); prompts that share steps bunch instead (poisson_bunching). With
        # PP only where a prompt's chunks ride one round (at most p of them, `lanes`): a prompt
        # of more chunks than stages takes rounds one after another, whose queue this does not
        # price (before the lanes, every multi-chunk prompt below one request in flight was
        # serialised so and the queue compounded it: Llama-3.1-70B tp=2 pp=8, 32,000/16 at 0.1
        # req/s, TPOT 267 ms against a simulated 53)
        replicas = router_replicas if routed is not None else 1
        felt_round = mean_round  # the mean round a decoder feels
        if pipeline_stages == 1:
            queue = prompt_queue(mean_round, decode_round, own_round, prefill_rounds, d, replicas)
        else:
            # with PP a decoder's step that follows a prompt's chunks waits behind them at every
            # stage: the prompt holds decoders up for its traversal_seconds L, not its round T_p, and the
            # windows of prompts in the pipeline overlap (pipeline_windows); a request's first
            # decode rounds follow the windows left behind it, L / T_p prompt rounds each. A new
            # prompt waits at the entry: queued prompts stream into it, a lone one locks it for a
            # round (its chunks and the empty steps after them hold the batch queue's places
            # until its chunks return): pipeline_entry_wait
            # (the windows keep the mean chunk's traversal_seconds: with the last chunk's, TPOT went over
            # the step simulation's by 12/34/26% at 10/30/60% of capacity, Llama-3.1-70B tp=2 pp=8,
            # 32,000/16 tokens, against -3/+6/+8%: the windows left behind price a queue of whole
            # traversals, which grows as L^2, where PP's entry streams the prompts; TTFT takes it)
            # the windows and the entry from the mean chunk's round (work the stages share), not
            # the full chunk's path: with it a prompt of 3 chunks in 4 lanes held the entry for 3/4 of
            # a full-chunk path, past its stage's work (Llama-3.1-8B tp=1 pp=4 on A100, 4,200/2 tokens
            # at 19.5 req/s: E2E 3.0 s against a simulated 0.44; found by a sweep against it)
            entry_round = own_round - own_prompt_round + mean_chunk_round() if mean_entry else own_round
            traversal_seconds = prompt_service_seconds(prompt_chunks, entry_round, lanes)
            prompts_per_second = chunks_per_round / prefill_rounds / mean_round
            entry_seconds = entry_round * carriers / lanes  # its share of a round's micro-batches
            windows = pipeline_windows(prompts_per_second, decode_round, entry_round, traversal_seconds, entry_seconds)
            left = prompt_queue(decode_round / (1 - windows.window_share), decode_round, entry_round,
                                traversal_seconds / entry_round, d, replicas)
            # the lock lasts until the step after the queue's last place may start: it holds the
            # decoders of the phase after the prompt's first chunk (the prompt's own, with two
            # chunks), which wait for that phase's last step, the prompt's second chunk: one
            # chunk past the round (DeepSeek-V3 tp=8 pp=4, two chunks: a second prompt 10 ms
            # behind a lone one waits 375 ms in the step simulation, the lone one's traversal_seconds)
            lock_seconds = prompt_service_seconds(min(prompt_chunks, 2.0), entry_round, lanes)
            entry_wait_seconds = pipeline_entry_wait(prompts_per_second, entry_seconds, lock_seconds)
            if routed is not None:
                # behind a least-loaded router an arrival finds its replica holding requests only
                # when every replica does (routed.busy), against 1 - e^-C on a replica of its own
                entry_wait_seconds *= routed.busy / -math.expm1(-c)
            # its first decode step runs behind any prompt that joined while it waited and its
            # chunks entered (the step is scheduled as they leave the batch queue, a round after
            # the first entered): with chance 1 - e^-m it costs that round, a floor on the share
            # the windows left behind give its D rounds, which few rounds reach (DeepSeek-V3
            # tp=8 pp=4 dp=4, 16,000/2 tokens at 6/8/10/12/14/16 req/s, TPOT against 4,000-prompt
            # step simulations, whose one ITL is 9 or 302 ms: -9/-27/-28/-25/-17/-10% ->
            # +55/+21/+7/-0/-0/+0%; at the light end the router's share of arrivals that join a
            # busy replica is too high for the first round, by about 1.5x)
            joining = prompts_per_second * (1.0 if routed is None else routed.prompt_share)
            behind = -math.expm1(-joining * (entry_wait_seconds + entry_round))
            queue = PromptQueue(entry_wait_seconds, max(left.chunk_round_share, behind / d) if d > 0 else 0.0)
            felt_round = windows.felt_round_seconds
            decoding_round += (felt_round - mean_round) * share
        if queue.wait_seconds > waited_seconds:
            # it waits for whole prompts, so its own are served alone (its first round carries no
            # others that came meanwhile: they queue behind it)
            waited_seconds = queue.wait_seconds
            service_seconds = prompt_service_seconds(prompt_chunks, own_round, lanes, last_extra_seconds)
            # async scheduling: a prompt queued behind another starts in the round after the
            # other's last chunk (the scheduler knows that chunk is its last), so only an arrival
            # that finds decodes alone, no prompt in service (1 - rho of the time), waits out the
            # decode round scheduled ahead (Llama-3.1-70B nvfp4 tp=8, 16,000/8 tokens at 1 req/s:
            # TTFT 1.52 s with the whole mean-round lag, 1.36 s in the step simulation)
            ahead_busy = max(ahead_busy - (mean_round - decode_round) / mean_round, 0.0)
            ahead_round = decode_round
        if d > 0:
            priced_seconds = (felt_round - decode_round) * share + bunched_seconds  # prompts in it now
            decoding_round += max(0.0, queue.chunk_round_share * (own_round - decode_round) - priced_seconds)
    if open_loop and takes_turns and chunks_per_round <= 1:
        # prompts that take turns: a round carries one chunk at most, so no decode round is longer
        # than one that carries a chunk (Poisson bunching's length-biased round, which assumes
        # the prompts that arrive together share the next step, grows without bound as the
        # prompts' share nears 1: Llama-3.1-70B nvfp4 tp=8, 16,000/8 tokens at 1.4 req/s, TPOT
        # 1.86 s against rounds of 0.34 s, simulated 0.32 s)
        decoding_round = min(decoding_round, max(own_round, decode_round))
    # async scheduling: the round after the one in progress was scheduled as it began, so a
    # request that finds the engine busy waits out that round too (serving_sim, Async scheduling)
    # (without decodes, O = 1, and with one-chunk prompts every request ends in the step that
    # carries its prompt, so the step scheduled as it began is empty and the engine takes the
    # next prompts as it ends)
    ahead_seconds = ahead_busy * (decoding_round if ahead_round is None else ahead_round) \
        if schedules_ahead and (d > 0 or prompt_chunks > 1) else 0.0
    unqueued = first_token_seconds + waited_seconds + ahead_seconds + service_seconds
    if bound:
        # the engine runs at its budget: a client's whole cycle is C / lambda rounds of it, and
        # the wait for budget is what the cycle leaves after the request's own latencies (its
        # first-token cost and alignment pass while the engine serves the others)
        queue_seconds = max(0.0, c / rate * mean_round - unqueued - d * decoding_round)
        queue_rounds = queue_seconds / mean_round
    else:
        queue_seconds = queue_rounds * mean_round
    ttft = unqueued + queue_seconds
    e2e = ttft + d * decoding_round
    return SteadyState(
        concurrency=c,
        decode_seqs=decode_seqs,
        prefill_tokens_per_step=rate * i,
        prefill_rounds=prefill_rounds,
        queue_rounds=queue_rounds,
        budget_bound=bound,
        decode_round_seconds=decode_round,
        prompt_round_seconds=own_round,
        step_seconds=mean_round,
        ttft_seconds=ttft,
        e2e_seconds=e2e,
        throughput_tokens_per_second=c * output_len / e2e,
        lockstep_ranks=lockstep_ranks,
        busiest_rank_chunks_per_round=busiest,
        decoding_round_seconds=decoding_round,
        tokens_per_round=tokens_per_round,
        prompt_chunks=prompt_chunks,
        prompt_carriers=carriers,
        path_chunk=longest,
        last_chunk_extra_seconds=last_extra_seconds,
        ahead_seconds=ahead_seconds,
        first_token_seconds=first_token_seconds,
    )
