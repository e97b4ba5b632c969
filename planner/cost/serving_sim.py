"""Step-level simulation of vLLM V1's scheduler draining a finite burst of requests.

Source: vllm/v1/core/sched/scheduler.py, `Scheduler.schedule`, vLLM 0.33.0 (FCFS policy,
chunked prefill on, no prefix caching, no speculative decoding, no KV watermark).

Each engine step, in order:
1. the running requests, oldest admission first: a decoding request takes 1 token, one
   still in prefill continues its prompt, chunked to the token budget left
   (max_num_batched_tokens). A request that needs a KV block when none is free preempts the
   most recently admitted running request (`self.running.pop()`): its blocks are freed, it
   goes to the front of the waiting queue and is recomputed later (its prompt plus the
   tokens generated so far is prefilled again). A request that preempts itself ends the
   running pass.
2. only if nothing was preempted this step: the waiting requests, first come first served,
   while the token budget, max_num_seqs and the free KV blocks allow; the last one admitted
   may be chunked.
KV blocks are allocated as tokens are scheduled: ceil(computed_tokens / block_size_tokens).
A request whose computed tokens reach its token count (prompt + generated) emits a token at
the end of that step; it finishes after output_len tokens and frees its blocks.

Timing: a step lasts step_seconds(StepLoad); a request arriving during a step waits for the
next one; when nothing is running the clock jumps to the next arrival.

Async scheduling (EngineLimits.schedules_ahead; the default of vLLM 0.22.0 and 0.33.0, the
opt-in --async-scheduling of 0.10.2, whose batch queue works the same way; SGLang's overlap
scheduler, Scheduler.event_loop_overlap, likewise): the engine keeps two steps in its batch
queue (max_concurrent_batches 2 for p = 1).
It submits step k + 1 as soon as step k is on the GPU, its decoders taking step k's tokens on
the GPU (placeholders), then blocks on step k, processes its outputs, reads its input queue and
schedules step k + 2 (EngineCore.step_with_batch_queue and run_busy_loop, vllm/v1/engine/core.py
0.33.0). So step k + 1 takes in only what had arrived when step k started: a request that
arrives during step k waits out the rest of it and all of step k + 1. When the step scheduled
ahead would carry nothing (every request ended in step k), the engine blocks on step k and
schedules what came meanwhile as soon as it ends, as without async scheduling.
first_token_extra_seconds is a constant latency on every token's path to the client (for
example the API server): it is added to TTFT and E2E alike, so TPOT and ITL do not see it.

Legend (units): *_seconds in s, *_tokens in tokens, counts are `num_` or plain ints.

Speed: decoding requests advance together. Their computed tokens are stored as
`base + tick` where `tick` counts steps in which every decoder advanced, and the steps at
which one needs a new KV block or finishes are kept in buckets, so a step in which every
decoder advances costs O(events) rather than O(running). Any other step (budget shorter
than the decoders, a KV shortage, a preemption) runs the request-by-request pass.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from planner.cost.dp_router import VllmDpRouter
from planner.cost.ingress import PromptTokenizer, TokenizerQueue
from planner.cost.serving_time import IDLE_POLL_SECONDS, StepLoad


@dataclass(frozen=True)
class EngineLimits:
    """The scheduler's limits (vLLM engine arguments)."""

    kv_cache_tokens: int
    """KV cache capacity in tokens; whole blocks of it are usable."""
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size_tokens: int = 16
    draft_acceptance: tuple[float, ...] = ()
    """Speculative decoding: a_i per drafted position (k = len); () = off. See _Sim._verify."""
    pipeline_stages: int = 1
    """p > 1: a PP replica (module docstring, Pipeline parallelism): each step is one
    micro-batch with its own max_num_batched_tokens, a decoder is scheduled every p steps,
    and the step is priced as a PipelineStep."""
    schedules_ahead: bool = False
    """vLLM's async scheduling (p = 1; module docstring, Async scheduling): step k + 1 is
    scheduled as step k starts, so a request that reaches a busy engine during step k joins
    step k + 2."""


@dataclass(frozen=True)
class PipelineStep:
    """One micro-batch step of a PP replica: the engine's own work, each stage's and one hop."""

    engine_seconds: float
    stage_seconds: tuple[float, ...]
    hop_seconds: float


@dataclass(frozen=True)
class SimRequest:
    arrival_seconds: float
    input_len: int
    output_len: int


@dataclass(frozen=True)
class SimResult:
    """Per-request latencies (in the order of the requests given) and the step log."""

    ttft_seconds: tuple[float, ...]
    e2e_seconds: tuple[float, ...]
    tpot_seconds: tuple[float | None, ...]
    """(e2e - ttft) / (output_len - 1); None for output_len 1, which vllm bench serve skips."""
    output_lens: tuple[int, ...]
    step_seconds: tuple[float, ...]
    step_loads: tuple[StepLoad, ...]
    step_num_regular_itl: tuple[int, ...]
    """Tokens emitted in each step by requests that also emitted in their step before (the one
    before it; PP: p steps before): each of those inter-token latencies is step_itl_seconds."""
    step_itl_seconds: tuple[float, ...]
    """Each step's regular inter-token latency: its duration; PP: its end less the end of the
    step p before it."""
    irregular_itl_seconds: tuple[float, ...]
    """Inter-token latencies that span several steps (after a stall or a preemption)."""
    num_preemptions: int
    first_arrival_seconds: float
    last_completion_seconds: float

    @property
    def makespan_seconds(self) -> float:
        """From the first arrival to the last completion (vllm bench serve's duration where its
        first request goes out at once: at an infinite rate; bench_metrics takes the clock's start)."""
        return self.last_completion_seconds - self.first_arrival_seconds


class _Req:
    __slots__ = ("i", "arrival", "sent", "p", "o", "g", "c", "base", "stall_from", "first", "done_at", "blocks",
                 "credit", "pool")

    def __init__(self, i: int, r: SimRequest):
        self.i, self.arrival, self.p, self.o = i, r.arrival_seconds, r.input_len, r.output_len
        self.sent = r.arrival_seconds  # when the client sent it (run() sets it)
        self.g = 0  # tokens generated; -1 once finished
        self.c = 0  # tokens whose KV is computed (explicit unless a fast-path decoder)
        self.base = 0  # c = base + tick while a fast-path decoder
        self.stall_from = -1  # step of the last emission while it misses steps, else -1
        self.first = -1  # step whose end emitted the first token
        self.done_at = -1  # step whose end emitted the last token
        self.blocks = 0  # KV blocks held (speculative decoding only: they outrun c)
        # speculative decoding: expected accepted drafts not yet emitted, from one half, so that
        # a request's count after n steps is round(n e), not floor(n e) (from 0 a first step
        # expecting 0.99 accepted drafts accepted none: twice the steps at a few output tokens)
        self.credit = 0.5
        self.pool = 0  # the phase of the steps it decodes in (PP: step index mod p)


class _Pool:
    """Decoders that advance together (module docstring, Speed): every decoder without PP; with
    PP those of one phase, scheduled at the steps whose index is that phase mod p."""

    __slots__ = ("tick", "num_dec", "ctx_sum", "block_at", "finish_at", "stalled")

    def __init__(self) -> None:
        self.tick = 0  # steps of this phase in which every decoder advanced
        self.num_dec, self.ctx_sum = 0, 0  # fast-path decoders and the sum of their c
        self.block_at: dict[int, list[_Req]] = {}
        self.finish_at: dict[int, list[_Req]] = {}
        self.stalled: list[_Req] = []  # decoders that missed a step


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _chunk_pairs(offset: int, num_tokens: int) -> float:
    """Causal (query, key) pairs of a chunk of c tokens at offset o: c*o + c*(c+1)/2."""
    return num_tokens * offset + num_tokens * (num_tokens + 1) / 2


def _check_fits(requests: Sequence[SimRequest], limits: EngineLimits) -> int:
    """Blocks in the cache; ValueError for a request that could never hold its KV alone."""
    num_blocks = limits.kv_cache_tokens // limits.block_size_tokens
    for i, r in enumerate(requests):
        if r.input_len < 1 or r.output_len < 1:
            raise ValueError(f"request {i}: input_len and output_len must be >= 1")
        # The last token is emitted, never computed: the KV peaks at input + output - 1.
        if _ceil_div(r.input_len + r.output_len - 1, limits.block_size_tokens) > num_blocks:
            raise ValueError(
                f"request {i}: input {r.input_len} + output {r.output_len} tokens do not fit "
                f"in a KV cache of {limits.kv_cache_tokens} tokens"
            )
    return num_blocks


def simulate(
    requests: Sequence[SimRequest],
    limits: EngineLimits,
    step_seconds: Callable[[StepLoad], float],
    first_token_extra_seconds: float = 0.0,
    max_concurrency: int | None = None,
) -> SimResult:
    """Run the scheduler until every request has finished (see the module docstring).

    `max_concurrency`: the client's limit on requests in flight (vllm bench serve
    --max-concurrency, a semaphore around each request): a request is sent at its arrival
    time or when an earlier one completes, whichever is later, and reaches the engine
    `first_token_extra_seconds` after the completion that freed its slot (the response's way
    back and the new request's way in); its TTFT and E2E count from the send."""
    assert limits.max_num_seqs >= 1 and limits.max_num_batched_tokens >= 1
    assert max_concurrency is None or max_concurrency >= 1
    (one_rank,) = simulate_lockstep([requests], limits, lambda loads: step_seconds(loads[0]),
                                    first_token_extra_seconds, [max_concurrency])
    return one_rank


class _Sim:
    """Mutable state of one simulation, private to `simulate_lockstep` (which, like `simulate`, stays pure).

    Times are step indices while scheduling; they become seconds in `_result`.
    """

    def __init__(self, requests: Sequence[SimRequest], limits: EngineLimits, num_blocks: int):
        self.reqs = [_Req(i, r) for i, r in enumerate(requests)]
        self.acceptance = limits.draft_acceptance
        self.spec = len(limits.draft_acceptance)  # k drafts per decode step; 0 = off
        self.B, self.num_blocks = limits.block_size_tokens, num_blocks
        self.max_seqs, self.max_tokens = limits.max_num_seqs, limits.max_num_batched_tokens
        self.used = 0
        self.running: list[_Req] = []  # admission order; finished ones dropped lazily
        self.num_running = 0
        self.waiting: deque[_Req] = deque()
        self.partial: _Req | None = None  # the running request mid-prefill (always last)
        self.stages = limits.pipeline_stages
        self.pools = [_Pool() for _ in range(self.stages)]
        self.regular: list[int] = []
        self.irregular: list[tuple[int, int]] = []
        self.num_preemptions = 0
        self.k = 0  # index of the step being scheduled
        self.num_done = 0
        self.finished_blocks, self.num_finished = 0, 0  # released at the end of the step
        self.last_finished = 0  # requests the last step completed
        self.finished_log: list[int] | None = None  # set to [] to keep which (their engine indices)
        self.last_finished_ids: list[int] = []  # with finished_log: which the last step completed
        self.completing = 0  # prompts whose last chunk is in the step being scheduled

    # ------------------------------------------------------------------ decoder bookkeeping
    @property
    def phase(self) -> int:
        """The phase of the step being scheduled: its index mod p (0 without PP)."""
        return self.k % self.stages

    def _add_decoder(self, r: _Req, phase: int | None = None) -> None:
        """r has c = p + g - 1 computed tokens and decodes from the next step of `phase` on
        (None: this step's: its token came from this step)."""
        r.pool = self.phase if phase is None else phase
        pool = self.pools[r.pool]
        t = pool.tick
        r.base = r.c - t
        pool.num_dec += 1
        pool.ctx_sum += r.c
        pool.block_at.setdefault(t + (-r.c) % self.B, []).append(r)
        pool.finish_at.setdefault(r.p + r.o - 2 - r.base, []).append(r)

    def _last_step(self, r: _Req) -> int:
        """The last step before this one in r's phase (the one before it without PP)."""
        return self.k - 1 - (self.k - 1 - r.pool) % self.stages

    def _emit(self, r: _Req, num_tokens: int = 1) -> None:
        """r's computed tokens reached its token count: `num_tokens` at the end of this step (one
        streamed chunk: more than one only under speculative decoding)."""
        if r.g == 0:
            self.completing += 1  # its prompt's last chunk is in this step: sampled once
        r.g += min(num_tokens, r.o - r.g)
        if r.g == 1:
            r.first = self.k
        elif r.stall_from >= 0:
            self.irregular.append((r.stall_from, self.k))
        else:
            self.regular[-1] += 1
        r.stall_from = -1
        if r.g == r.o:
            self._finish(r)

    def _finish(self, r: _Req) -> None:
        # vLLM frees a finished request's slot and blocks after the step (update_from_output),
        # so they still count against this step's admissions.
        r.done_at = self.k
        self.finished_blocks += self._held(r)
        self.num_finished += 1
        if self.finished_log is not None:
            self.finished_log.append(r.i)
        r.g = -1

    def _held(self, r: _Req) -> int:
        """KV blocks r holds: those of its computed tokens, or under speculative decoding the
        ones allocated for its last step's drafts too (rejected drafts leave their slots)."""
        return max(r.blocks, _ceil_div(r.c, self.B)) if self.spec else _ceil_div(r.c, self.B)

    def _blocks_for(self, r: _Req, new: int) -> int:
        """Blocks r must add to schedule `new` more tokens."""
        return max(0, _ceil_div(r.c + new, self.B) - self._held(r))

    def _verify(self, r: _Req, drafts: int) -> int:
        """Speculative decoding: tokens r emits after verifying `drafts` drafted tokens: its own
        plus the accepted ones, the expectation 1 + sum_{i<=j} prod a (cost/speculative.py)
        carried as a running credit (from 1/2: the counts round the running expectation) so
        that the integer counts average to it."""
        expected, reach = 0.0, 1.0
        for rate in self.acceptance[:drafts]:
            reach *= rate
            expected += reach
        r.credit += expected
        accepted = int(r.credit)
        r.credit -= accepted
        return 1 + accepted

    # ------------------------------------------------------------------ the running pass
    def _fast_running(self, budget: int) -> tuple[int, int, int, float] | None:
        """Every decoder (of this step's phase) advances one token; None when vLLM would do
        something else."""
        pool = self.pools[self.phase]
        p, nd, t = self.partial, pool.num_dec, pool.tick
        if nd > budget:
            return None
        # Finished decoders leave stale entries behind: keep those finishing at t or later.
        due = [r for r in pool.block_at.get(t, ()) if r.p + r.o - 2 - r.base >= t]
        need_blocks = len(due)
        chunk = 0
        if p is not None:
            chunk = min(p.p + p.g - p.c, budget - nd)
            need_blocks += _ceil_div(p.c + chunk, self.B) - _ceil_div(p.c, self.B)
        if need_blocks > self.num_blocks - self.used:
            return None
        self.used += need_blocks
        pool.block_at.pop(t, None)
        pool.block_at.setdefault(t + self.B, []).extend(due)
        ctx = pool.ctx_sum + nd
        pool.ctx_sum = ctx
        self.regular[-1] += nd - len(pool.stalled)
        for r in pool.stalled:
            self.irregular.append((r.stall_from, self.k))
            r.stall_from = -1
        pool.stalled = []
        for r in pool.finish_at.pop(t, ()):
            r.c = r.base + t + 1
            pool.num_dec -= 1
            pool.ctx_sum -= r.c
            self._finish(r)
        pool.tick = t + 1
        pairs = 0.0
        if chunk:
            pairs = _chunk_pairs(p.c, chunk)
            p.c += chunk
            if p.c == p.p + p.g:
                self.partial = None
                self._emit(p)
                if p.g > 0:
                    self._add_decoder(p)
        return nd, ctx, chunk, pairs

    def _materialize(self) -> None:
        """Leave the fast representation: explicit c and g for every running decoder."""
        self.running = [r for r in self.running if r.g >= 0]
        for r in self.running:
            if r is not self.partial:
                r.c = r.base + self.pools[r.pool].tick
                r.g = r.c - r.p + 1
        for pool in self.pools:
            pool.block_at.clear()
            pool.finish_at.clear()
            pool.num_dec, pool.ctx_sum = 0, 0
            pool.stalled = []

    def _slow_running(self, budget: int) -> tuple[int, int, int, float, int, bool, int]:
        """vLLM's request-by-request pass over the running queue. With PP a decoder is
        eligible in the steps of its phase only; one the budget leaves out is eligible at the
        next step (its phase moves on)."""
        self._materialize()
        B, running, phase = self.B, self.running, self.phase
        nd, ctx, chunks, pairs, drafted = 0, 0, 0, 0.0, 0
        scheduled: list[tuple[_Req, int]] = []
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            decoding = r.g >= 1 and r.c == r.p + r.g - 1
            if decoding and r.pool != phase:  # PP: not its step
                i += 1
                continue
            # a decoder's own token and its drafts (as many as the budget leaves: vLLM trims them)
            want = 1 + min(self.spec, r.o - r.g - 1) if decoding else r.p + r.g - r.c
            new = min(want, budget)
            blocks = self._blocks_for(r, new)
            self_preempted = False
            while blocks > self.num_blocks - self.used:
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is r:
                    self_preempted = True
                    break
            if self_preempted:
                break
            self.used += blocks
            if self.spec:
                r.blocks = max(r.blocks, _ceil_div(r.c + new, B))
            budget -= new
            drafts = 0
            if decoding:
                nd += 1
                ctx += r.c + 1
                drafts = new - 1
                drafted += drafts
                r.c += 1
            else:
                chunks += new
                pairs += _chunk_pairs(r.c, new)
                r.c += new
            r.pool = phase  # a decoder's next step, or a prompt's first decode, is p steps on
            scheduled.append((r, drafts))
            i += 1
        for r in running[i:]:
            if r.g >= 1 and r.c == r.p + r.g - 1 and r.pool == phase:  # left out: eligible next step
                if r.stall_from < 0:
                    r.stall_from = self._last_step(r)
                r.pool = (phase + 1) % self.stages
        for r, drafts in scheduled:
            if r.c == r.p + r.g:
                emitted = self._verify(r, drafts) if drafts else 1
                r.c += emitted - 1  # the accepted drafts' KV is kept, the rejected ones' dropped
                self._emit(r, emitted)
        self.pools[phase].tick += 1
        self.partial = None
        self.running = [r for r in running if r.g >= 0]
        for r in self.running:
            if r.c != r.p + r.g - 1:
                assert self.partial is None, "two requests mid-prefill"
                self.partial = r
                continue
            if r.stall_from >= 0:
                self.pools[r.pool].stalled.append(r)
            self._add_decoder(r, r.pool)
        return nd, ctx, chunks, pairs, budget, preempted, drafted

    def _preempt(self, r: _Req) -> None:
        """Free r's blocks and put it at the front of the waiting queue, to recompute."""
        self.used -= self._held(r)
        r.c = 0
        r.blocks = 0
        self.num_running -= 1
        self.num_preemptions += 1
        if r.g >= 1 and r.stall_from < 0:
            r.stall_from = self._last_step(r)
        self.waiting.appendleft(r)

    # ------------------------------------------------------------------ the waiting pass
    def _admit(self, budget: int) -> tuple[int, float]:
        chunks, pairs = 0, 0.0
        while budget > 0 and self.waiting and self.num_running < self.max_seqs:
            r = self.waiting[0]
            new = min(r.p + r.g, budget)
            blocks = _ceil_div(new, self.B)
            # vLLM admits a request only when its whole sequence so far fits in the free blocks
            # (scheduler_reserve_full_isl, default True: KVCacheManager.allocate_slots
            # full_sequence_must_fit, v1/core/kv_cache_manager.py at 0.33.0), though it
            # allocates only the chunk: a long prompt waits for room instead of being
            # admitted on its first chunk and preempted on its second
            if _ceil_div(r.p + r.g, self.B) > self.num_blocks - self.used:
                break
            self.waiting.popleft()
            self.running.append(r)
            self.num_running += 1
            self.used += blocks
            budget -= new
            chunks += new
            pairs += _chunk_pairs(0, new)
            r.c = new
            r.blocks = blocks
            if new == r.p + r.g:
                self._emit(r)
                if r.g > 0:
                    self._add_decoder(r)
            else:
                self.partial = r
        return chunks, pairs

    # ------------------------------------------------------------------ the loop
    def begin(self, extra_seconds: float, max_concurrency: int | None) -> None:
        """Arrivals in order, each sent `extra_seconds` before it reaches the engine; the
        client's free slots, as the engine-side time a request sent on each arrives."""
        self.arrivals = sorted(self.reqs, key=lambda r: (r.arrival, r.i))
        self.next_arrival = 0
        self.first_arrival = self.arrivals[0].arrival if self.arrivals else 0.0
        self.extra = extra_seconds
        self.ends: list[float] = []
        self.durations: list[float] = []
        self.loads: list[StepLoad] = []
        for r in self.arrivals:
            r.sent = r.arrival - extra_seconds
        # no client limit: no slots to wait for (None)
        self.slots: deque[float] | None = None if max_concurrency is None else deque([-math.inf] * max_concurrency)

    def enqueue(self, r: _Req) -> None:
        """A request handed to this engine while it runs (simulate_replicas' dispatcher): it
        reaches the engine at r.arrival, no earlier than any already handed to it. Only for an
        engine begun without a client limit (the dispatcher holds the client's slots)."""
        assert self.slots is None
        r.i = len(self.reqs)
        if not self.reqs:
            self.first_arrival = r.arrival
        self.reqs.append(r)
        self.arrivals.append(r)

    @property
    def finished(self) -> bool:
        return self.num_done >= len(self.reqs)

    @property
    def idle(self) -> bool:
        """Nothing running and nothing waiting: the engine waits for the next arrival."""
        return self.num_running == 0 and not self.waiting

    def intake(self, now: float) -> None:
        """Requests that have arrived by `now` and found a free client slot join the queue."""
        arrivals, slots = self.arrivals, self.slots
        while (self.next_arrival < len(arrivals) and (slots is None or slots)
               and max(arrivals[self.next_arrival].arrival, slots[0] if slots else -math.inf) <= now):
            r, freed = arrivals[self.next_arrival], slots.popleft() if slots else -math.inf
            if r.arrival < freed:  # it waited for a slot: sent when that request completed
                r.sent = freed - self.extra
                r.arrival = freed
            self.waiting.append(r)
            self.next_arrival += 1

    def next_event(self) -> float:
        """When the next request can reach the engine (inf: none left to send)."""
        a, slots = self.next_arrival, self.slots
        if a < len(self.arrivals) and (slots is None or slots):
            return max(self.arrivals[a].arrival, slots[0] if slots else -math.inf)
        return math.inf

    def record(self, end: float, seconds: float, load: StepLoad) -> None:
        """The step just scheduled ran `seconds` and ended at `end`; the requests it completed
        free their client slots."""
        self.ends.append(end)
        self.durations.append(seconds)
        self.loads.append(load)
        self.k += 1
        if self.slots is not None:
            self.slots.extend([end + self.extra] * self.last_finished)

    def result(self) -> SimResult:
        return self._result(self.first_arrival, self.ends, self.durations, self.loads, self.extra)

    def schedule(self) -> StepLoad:
        budget = self.max_tokens
        self.regular.append(0)
        self.completing = 0
        # speculative decoding: decoders advance by different counts, request by request
        fast = None if self.spec else self._fast_running(budget)
        if fast is not None:
            nd, ctx, chunks, pairs = fast
            budget -= nd + chunks
            preempted, drafted = False, 0
        else:
            nd, ctx, chunks, pairs, budget, preempted, drafted = self._slow_running(budget)
        if not preempted:
            c2, p2 = self._admit(budget)
            chunks += c2
            pairs += p2
        self.used -= self.finished_blocks
        self.num_running -= self.num_finished
        self.num_done += self.num_finished
        self.last_finished = self.num_finished
        if self.finished_log is not None:
            self.last_finished_ids, self.finished_log = self.finished_log, []
        self.finished_blocks = self.num_finished = 0
        return StepLoad(nd, float(ctx), chunks, pairs, self.completing, spec_tokens=drafted)

    def _result(self, first_arrival, ends, durations, loads, extra) -> SimResult:
        reqs = self.reqs
        ttft = tuple(ends[r.first] - r.sent for r in reqs)
        e2e = tuple(ends[r.done_at] - r.sent for r in reqs)
        tpot = tuple(
            (e - t) / (r.o - 1) if r.o > 1 else None
            for r, t, e in zip(reqs, ttft, e2e, strict=True)
        )
        p = self.stages
        itl = durations if p == 1 else [ends[k] - ends[k - p] if k >= p else durations[k] for k in range(len(ends))]
        return SimResult(
            ttft_seconds=ttft,
            e2e_seconds=e2e,
            tpot_seconds=tpot,
            output_lens=tuple(r.o for r in reqs),
            step_seconds=tuple(durations),
            step_loads=tuple(loads),
            step_num_regular_itl=tuple(self.regular),
            step_itl_seconds=tuple(itl),
            irregular_itl_seconds=tuple(ends[j] - ends[i] for i, j in self.irregular),
            num_preemptions=self.num_preemptions,
            # the client's first send (vllm bench serve's clock starts there), `extra` before the
            # engine sees it, and its tokenization before that where the API server tokenizes
            first_arrival_seconds=min((r.sent for r in reqs), default=first_arrival - extra),
            last_completion_seconds=max(ends) if ends else first_arrival - extra,
        )


# ---------------------------------------------------------------------- the clock



class _Clock:
    """When an engine's (or a lockstep group's) steps start and end. Without PP a step starts
    when the last one ends and lasts its priced seconds. A PP replica (a PipelineStep each) runs
    vLLM 0.33.0's batch queue (module docstring, Pipeline parallelism): the engine prepares
    step k once it is free and fewer than p + 1 steps are in flight, and once step k - p's
    tokens are back when step k decodes (its decoders are step k - p's); the micro-batch then
    passes the stages in order, each busy with one micro-batch at a time, a hop after each
    (the last one back to the engine), and its tokens come back at its end.

    A PP engine with requests in flight but nothing to schedule (no decoder of the step's
    phase, no prompt to admit) still schedules: vLLM's scheduler returns an empty batch, which
    takes a place in the batch queue like any other (it resolves once the last stage has
    finished the steps before it, in order), moves the step counter on, and the engine core
    polls again IDLE_POLL_SECONDS later; with the queue full it waits for the oldest step
    first. So the engine fills its queue with empty steps and waits out the oldest real one:
    a request that arrives meanwhile waits for it (step_with_batch_queue and
    EngineCore._process_engine_step, vllm/v1/engine/core.py 0.33.0). `holding` tells the
    engine loops that requests are still in flight."""

    def __init__(self, stages: int):
        self.p = stages
        self.ends: list[float] = []  # every step's end (an empty one: the end of the step before it)
        self.stage_free = [-math.inf] * stages
        self.engine_free = -math.inf
        self.real_end = -math.inf  # the last step that carried tokens: its end
        self.in_flight: deque[float] = deque(maxlen=stages + 1)  # the batch queue: the last p + 1 steps' ends
        self.last_start = self.last_end = -math.inf  # p = 1: the last step's start and end

    def intake_seconds(self, now: float, schedules_ahead: bool) -> float:
        """The arrivals a step scheduled at `now` takes in are those up to this moment: under async
        scheduling without PP, the start of the step that ends at `now` (the next step was
        scheduled then); else (PP, or an engine that was idle) `now`."""
        if schedules_ahead and self.p == 1 and self.last_end == now:
            return self.last_start
        return now

    def holding(self, now: float) -> bool:
        """A PP engine whose last step with tokens is still in flight at `now`: its requests
        are still in vLLM's scheduler (their tokens are not back), so it keeps scheduling."""
        return self.p > 1 and self.real_end > now

    def run(self, now: float, loads: list[StepLoad], priced: Callable[[list[StepLoad]], float | PipelineStep]
            ) -> tuple[float, float, float]:
        """(the step's end, its seconds, when the next can start) for a step of `loads`
        scheduled at `now`. A PP step's seconds are its end less the last step's (less `now`
        for the first): they add up to the ends. An empty PP step (no decoder of its phase,
        nothing admitted) is not priced: vLLM's step counter moves on, it ends with the step
        before it (no tokens come back) and holds its place in the batch queue until then, and
        the engine polls again IDLE_POLL_SECONDS later (after the oldest step's end when the
        queue is full)."""
        last = self.ends[-1] if self.ends else now
        if self.p > 1 and not any(load.num_tokens for load in loads):
            end = max(now, last)
            self.ends.append(end)
            self.in_flight.append(end)
            full = len(self.in_flight) > self.p
            return end, end - last, (max(now, self.in_flight[0]) if full else now) + IDLE_POLL_SECONDS
        timing = priced(loads)
        if not isinstance(timing, PipelineStep):
            end = now + timing
            self.ends.append(end)
            self.last_start, self.last_end = now, end
            return end, timing, end
        k = len(self.ends)
        decodes = any(load.decode_seqs for load in loads)
        after = self.ends[k - self.p] if decodes and k >= self.p else -math.inf
        t = self.engine_free = max(now, self.engine_free, after) + timing.engine_seconds
        for i, seconds in enumerate(timing.stage_seconds):
            t = self.stage_free[i] = max(t, self.stage_free[i]) + seconds
            t += timing.hop_seconds
        self.ends.append(t)
        self.in_flight.append(t)
        self.real_end = t
        start = max(self.engine_free, self.in_flight[0]) if len(self.in_flight) > self.p else self.engine_free
        return t, t - last, start


# ---------------------------------------------------------------------- data parallel


def _take_in(sims: Sequence[_Sim], clock: _Clock, now: float, schedules_ahead: bool) -> list[bool]:
    """The engines of one clock (each with requests) take in their arrivals for the step scheduled
    at `now`, those up to clock.intake_seconds; whether each has work for it. PP: while a step
    with tokens is in flight its requests are still in vLLM's scheduler, so the engine keeps
    scheduling (empty steps) until it is back (_Clock.holding). Under async scheduling, where
    the step scheduled ahead would carry nothing, what came meanwhile goes in at `now` (module
    docstring, Async scheduling)."""
    holding = clock.holding(now)
    seen = clock.intake_seconds(now, schedules_ahead)
    for sim in sims:
        sim.intake(seen)
    working = [holding or not (sim.finished or sim.idle) for sim in sims]
    if not any(working) and seen < now:
        for sim in sims:
            sim.intake(now)
        working = [not (sim.finished or sim.idle) for sim in sims]
    return working


def simulate_replicas(
    requests: Sequence[SimRequest],
    num_replicas: int,
    limits: EngineLimits,
    step_seconds: Callable[[StepLoad], float],
    first_token_extra_seconds: float = 0.0,
    max_concurrency: int | None = None,
    lockstep_ranks: int = 1,
    group_step_seconds: Callable[[list[StepLoad]], float] | None = None,
    replay_solos: bool = True,
    tokenizer: PromptTokenizer | None = None,
    dp_router: Literal["exact", "vllm"] = "exact",
) -> SimResult:
    """dp engines behind one client: each request, when the client sends it (its arrival,
    or under a client limit --max-concurrency the completion that frees a slot: one
    semaphore over all requests), goes to the least loaded engine. Engines come in groups of
    `lockstep_ranks` d (an EP group's DP ranks, which step together: simulate_lockstep, every
    step priced by `group_step_seconds` from the busy ranks' loads); the request goes to the
    group with the fewest requests in flight, then to its rank with the fewest, ties to the
    lowest index: a load balancer (least connections) in front of the EP groups' servers, and
    vLLM's DP load balancer inside one (vllm/v1/engine/core_client.py DPLBAsyncMPClient
    get_core_engine_for_request, 0.33.0: the fewest of this client's requests in flight, unless
    a stale snapshot or a KV cache over half full raises an engine's score; docs/cost-model.md,
    "The DP router"). So 2 client slots
    over 2 EP groups keep one request in each group, and 12 over 8 replicas keep 12 busy.

    `dp_router` "vllm": vLLM's own DP load balancer instead of the exact count inside a
    deployment (cost/dp_router.py: d API servers, each counting only its own requests in
    flight beside a snapshot up to 100 ms old): each EP group is one deployment of its d ranks
    (groups still chosen by the fewest in flight: a load balancer in front of their servers);
    without lockstep groups all the replicas are one deployment (`--data-parallel-size dp`).
    Requests sent together keep the fixed dispatch below: vLLM's servers spread a burst
    round robin too (each rotates its scan's start).

    Results are merged: per-request latencies in the caller's order, steps concatenated
    engine by engine. Without a client limit and with every request arriving at once the
    dispatch is fixed in advance (request k in arrival order to group k mod g, its rank
    (k // g) mod d) and engines handed the same requests share one simulation (a burst of
    identical requests over 2,048 EP groups: 2 instead of 2,048; found by a CLI sweep, 47 s).
    Otherwise a request that runs alone on its group is replayed, not stepped
    (_simulate_dispatched; `replay_solos` False steps it, the reference in the tests).

    `tokenizer`: the API server's (cost/ingress.py), one for all the engines: a request reaches
    the engines once its prompt is tokenized, in the order the requests were sent (its
    arrival_seconds, or the slot it waited for, less first_token_extra_seconds), and its TTFT and
    E2E count from the send. None: no tokenization (prompts sent as token ids).
    """
    assert num_replicas >= 1 and lockstep_ranks >= 1
    assert lockstep_ranks == 1 or group_step_seconds is not None
    if max_concurrency is not None and max_concurrency >= len(requests):
        max_concurrency = None  # slots for every request: the limit never binds
    order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_seconds, i))
    groups = [list(range(first, min(first + lockstep_ranks, num_replicas)))
              for first in range(0, num_replicas, lockstep_ranks)]
    # a group's step: its busy ranks' loads priced together (one rank: its own step)
    priced = group_step_seconds if lockstep_ranks > 1 else lambda loads: step_seconds(loads[0])
    at_once = len({r.arrival_seconds for r in requests}) <= 1
    if tokenizer is not None and max_concurrency is None:
        if at_once and (tokenizer.queues % num_replicas == 0 or num_replicas % tokenizer.queues == 0):
            # sent together, request k is tokenized on queue k mod queues and reaches replica
            # k mod d in the fixed dispatch below, so every replica gets its queues' schedule
            # (a burst of identical requests: the same one on each) and the dispatch stands.
            # Fewer queues than replicas (SGLang: one TokenizerManager per server of several
            # DP ranks): replica r takes every (d / queues)-th prompt of queue r mod queues, in
            # the order they leave it, as the server's DataParallelController deals them out
            # round robin (its default load_balance_method, sglang 0.5.23
            # srt/arg_groups/serving_hook.py), whatever their timing
            return _tokenized_ahead(requests, tokenizer, first_token_extra_seconds,
                                    lambda shifted: _fixed_dispatch(shifted, order, groups, num_replicas, limits,
                                                                    priced, first_token_extra_seconds))
        return _tokenized_ahead(requests, tokenizer, first_token_extra_seconds,
                                lambda shifted: simulate_replicas(
                                    shifted, num_replicas, limits, step_seconds, first_token_extra_seconds, None,
                                    lockstep_ranks, group_step_seconds, replay_solos, dp_router=dp_router))
    if max_concurrency is not None or not at_once:
        return _simulate_dispatched(requests, order, groups, limits, priced, first_token_extra_seconds,
                                    max_concurrency, replay_solos,
                                    None if tokenizer is None else TokenizerQueue(tokenizer),
                                    _deployments(groups) if dp_router == "vllm" else None)
    return _fixed_dispatch(requests, order, groups, num_replicas, limits, priced, first_token_extra_seconds)


def _deployments(groups: list[list[int]]) -> list[list[int]] | None:
    """The engines behind each vLLM DP load balancer (simulate_replicas' dp_router "vllm"): each
    group of several ranks, else every engine together; None where one engine is alone."""
    if len(groups[0]) > 1:
        return groups
    return [[n for group in groups for n in group]] if len(groups) > 1 else None


def _fixed_dispatch(requests: Sequence[SimRequest], order: list[int], groups: list[list[int]], num_replicas: int,
                    limits: EngineLimits, priced: Callable[[list[StepLoad]], float],
                    extra_seconds: float) -> SimResult:
    """simulate_replicas for requests sent together: request k (in `order`) to group k mod g, its
    rank (k // g) mod d, each engine simulated on its own arrivals (its group in lockstep)."""
    parts: list[list[int]] = [[] for _ in range(num_replicas)]
    for k, i in enumerate(order):
        group = groups[k % len(groups)]
        parts[group[(k // len(groups)) % len(group)]].append(i)
    # engines handed the same requests (a burst of identical ones: all but the remainder's)
    # run the same simulation: each distinct one runs once
    done: dict[tuple, list[SimResult]] = {}
    kept, results = [], []
    for group in groups:
        group = [j for j in group if parts[j]]
        if not group:
            continue
        kept += [parts[j] for j in group]
        ranks = tuple(tuple(requests[i] for i in parts[j]) for j in group)
        if ranks not in done:
            done[ranks] = simulate_lockstep([list(r) for r in ranks], limits, priced, extra_seconds)
        results += done[ranks]
    return _merge(len(requests), kept, results)


def _tokenized_ahead(requests: Sequence[SimRequest], tokenizer: PromptTokenizer, extra_seconds: float,
                     run: Callable[[Sequence[SimRequest]], SimResult]) -> SimResult:
    """Without a client limit every send is known in advance: each request reaches the engines
    when the tokenizer is done with it (sent at arrival_seconds - extra_seconds, in that order),
    `run` simulates the engines on those arrivals, and each request's tokenization time (its
    wait for the tokenizer included) is added back to its TTFT and E2E, which count from the
    send."""
    queue = TokenizerQueue(tokenizer)
    order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_seconds, i))
    delays = [0.0] * len(requests)
    for i in order:
        sent = requests[i].arrival_seconds - extra_seconds
        delays[i] = queue.done(sent, requests[i].input_len) - sent
    result = run(tuple(replace(r, arrival_seconds=r.arrival_seconds + delay)
                       for r, delay in zip(requests, delays, strict=True)))
    return replace(result,
                   ttft_seconds=tuple(t + d for t, d in zip(result.ttft_seconds, delays, strict=True)),
                   e2e_seconds=tuple(t + d for t, d in zip(result.e2e_seconds, delays, strict=True)),
                   first_arrival_seconds=min(r.arrival_seconds for r in requests) - extra_seconds)


def _simulate_dispatched(
    requests: Sequence[SimRequest],
    order: list[int],
    groups: list[list[int]],
    limits: EngineLimits,
    priced: Callable[[list[StepLoad]], float],
    extra_seconds: float,
    max_concurrency: int | None,
    replay_solos: bool = True,
    tokenizer: TokenizerQueue | None = None,
    deployments: list[list[int]] | None = None,
) -> SimResult:
    """simulate_replicas with the dispatch decided as the burst runs: one clock, events in
    time order (a send before a step that ends at the same moment, so the step's intake sees
    it); a group idle when a request reaches it starts a step at once. `priced`: a group's
    step from its busy ranks' loads.

    A request that reaches an idle group runs alone until another reaches the group (a
    "solo"): its steps are those of the same request alone on a fresh engine, simulated once
    per (input, output) length and replayed, not stepped again (1,000 requests spread over
    2,048 replicas: 256,000 steps stepped before, 9 s; one simulation now). Only a second
    request reaching the group while the solo runs makes its steps real: they are stepped from
    the solo's start up to the step in progress, and the group goes on as any other.
    `replay_solos` False steps every request (the reference the replay is tested against).
    `tokenizer`: the API server's, under a client limit (simulate_replicas): a request sent when
    a slot frees reaches the engines once its prompt is tokenized. `deployments`: the engines
    behind each of vLLM's DP load balancers (_deployments; one per group, or one of every
    engine), which then pick the rank (cost/dp_router.py); None: the fewest in flight."""
    num_blocks = _check_fits(requests, limits)
    num_engines = sum(len(g) for g in groups)
    sims = [_Sim([], limits, num_blocks) for _ in range(num_engines)]
    for sim in sims:
        sim.begin(extra_seconds, None)
    pending = deque(order)
    # the client's free slots, a heap of the times they free (a PP step's requests complete at
    # its end, which can come after a later-scheduled step's of another group)
    slots = None if max_concurrency is None else [-math.inf] * max_concurrency
    clocks = [_Clock(limits.pipeline_stages) for _ in groups]
    in_flight = [0] * num_engines
    group_load = [0] * len(groups)
    least_loaded = [(0, g) for g in range(len(groups))]  # (load, group); stale entries skipped
    parts: list[list[int]] = [[] for _ in range(num_engines)]
    stepping: list[tuple[list[int], list[StepLoad], float, float] | None] = [None] * len(groups)
    solo: list[_Solo | None] = [None] * len(groups)
    solos: list[tuple[int, SimResult]] = []  # (request, its result) of the solos that ran out
    alone: dict[tuple[int, int], SimResult] = {}  # (input, output) -> one request alone from t = 0
    woken = [False] * len(groups)  # a step start or end is on the heap
    event_tick = [-1] * len(groups)  # the tie-break of each group's live event; others are stale
    events: list[tuple[float, int, int]] = []  # (time, tie-break, group)
    tick = 0
    routers = None if deployments is None else [VllmDpRouter(len(engines)) for engines in deployments]
    group_of = [0] * num_engines
    sent_by: dict[int, tuple[int, int, int]] = {}  # request -> (deployment, engine index, server)
    for g, group in enumerate(groups):
        for n in group:
            group_of[n] = g
    for engines in deployments or ():
        for n in engines:
            sims[n].finished_log = []

    def leaves(i: int, n: int, now: float) -> None:
        """Request i leaves engine n at `now`: its server's in-flight count (the snapshot first)."""
        dep, local, server = sent_by.pop(i)
        routers[dep].refresh(now, lambda: [in_flight[m] for m in deployments[dep]])
        routers[dep].finished(local, server)

    def client_send() -> float:
        """When the client sends the next request (it reaches the engines extra_seconds later
        when its prompt needs no tokenizing)."""
        return max(requests[pending[0]].arrival_seconds, slots[0] if slots else -math.inf) - extra_seconds

    def next_send() -> float:
        """When the next request reaches the engines (inf: none left to send)."""
        if pending and (slots is None or slots):
            sent = client_send()
            if tokenizer is None:
                return sent + extra_seconds
            return tokenizer.done(sent, requests[pending[0]].input_len, commit=False) + extra_seconds
        return math.inf

    def push(time: float, g: int) -> None:
        nonlocal tick
        heapq.heappush(events, (time, tick, g))
        event_tick[g] = tick
        tick += 1

    def loaded(g: int, change: int) -> None:
        group_load[g] += change
        heapq.heappush(least_loaded, (group_load[g], g))

    def finished_step(g: int, now: float) -> None:
        """Group g's step in progress is over at `now` (PP: the next can start; its tokens
        come back at its end): its engines record it, and the requests it completed leave
        the counts and free their client slots."""
        busy, loads, seconds, end = stepping[g]
        for n, load in zip(busy, loads, strict=True):
            sims[n].record(end, seconds, load)
            done = sims[n].last_finished
            if done:
                if routers is not None:
                    for local in sims[n].last_finished_ids:
                        leaves(parts[n][local], n, now)
                in_flight[n] -= done
                loaded(g, -done)
                if slots is not None:
                    for _ in range(done):
                        heapq.heappush(slots, end + extra_seconds)
        stepping[g] = None

    def next_step(g: int, now: float) -> float | None:
        """Group g starts a step at `now` if it has work; when the next can start (without
        PP its end), or None when it goes idle."""
        engines = [n for n in groups[g] if parts[n]]
        working = _take_in([sims[n] for n in engines], clocks[g], now, limits.schedules_ahead)
        busy = [n for n, works in zip(engines, working, strict=True) if works]
        if not busy:
            return None
        loads = [sims[n].schedule() for n in busy]
        end, seconds, start = clocks[g].run(now, loads, priced)
        stepping[g] = (busy, loads, seconds, end)
        return start

    def stepped_solo(g: int, now: float) -> None:
        """A second request reaches group g at `now` while its solo runs: the solo's request
        goes to its engine as sent, and the group's steps are run from the solo's start to the
        step in progress at `now` (one that ends at `now` is still in progress: a send comes
        before a step end at the same moment)."""
        run = solo[g]
        solo[g] = None
        r = _Req(0, requests[run.request])
        r.arrival, r.sent = run.start, run.sent
        sims[run.engine].enqueue(r)
        parts[run.engine].append(run.request)
        if now <= run.start:  # the same moment it was sent: both are taken in by the first step
            push(run.start, g)
            return
        end = next_step(g, run.start)
        while end is not None and end < now:
            finished_step(g, end)
            end = next_step(g, end)
        # None: PP, the solo's last step was scheduled before `now` (its end is later); the
        # group takes the new request in at `now`
        push(now if end is None else end, g)

    while True:
        send = next_send()
        if send == math.inf and not events:
            break
        if send <= (events[0][0] if events else math.inf):
            sent = client_send()
            i = pending.popleft()
            tokenized = 0.0
            if tokenizer is not None:
                tokenized = tokenizer.done(sent, requests[i].input_len) - sent
            if slots is not None:
                heapq.heappop(slots)
            while group_load[least_loaded[0][1]] != least_loaded[0][0]:
                heapq.heappop(least_loaded)
            g = least_loaded[0][1]
            if routers is None:
                rank = min(groups[g], key=lambda n: (in_flight[n], n))
            else:  # vLLM's balancer inside the deployment (the group's, or the one of them all)
                dep = 0 if len(routers) == 1 else g
                engines = deployments[dep]
                routers[dep].refresh(send, lambda engines=engines: [in_flight[m] for m in engines])
                local, server = routers[dep].route()
                rank = engines[local]
                g = group_of[rank]
                sent_by[i] = (dep, local, server)
            in_flight[rank] += 1
            loaded(g, 1)
            if not woken[g] and replay_solos:  # an idle group: the request runs alone until another comes
                key = (requests[i].input_len, requests[i].output_len)
                if key not in alone:
                    (alone[key],) = simulate_lockstep([[SimRequest(0.0, *key)]], limits, priced, extra_seconds)
                end = send
                for seconds in alone[key].step_seconds:
                    end += seconds  # as the steps' ends add up
                solo[g] = _Solo(i, rank, send, end, alone[key], sent, tokenized)
                woken[g] = True
                push(end, g)
                continue
            if solo[g] is not None:
                stepped_solo(g, send)
            r = _Req(0, requests[i])
            r.arrival, r.sent = send, sent
            sims[rank].enqueue(r)
            parts[rank].append(i)
            if not woken[g]:
                woken[g] = True
                push(send, g)
            continue
        now, this, g = heapq.heappop(events)
        if this != event_tick[g]:
            continue  # a solo's end, stepped since
        woken[g] = False
        if solo[g] is not None:  # ran out alone
            run = solo[g]
            solo[g] = None
            if routers is not None:
                leaves(run.request, run.engine, now)
            in_flight[run.engine] -= 1
            loaded(g, -1)
            if slots is not None:
                heapq.heappush(slots, now + extra_seconds)
            solos.append((run.request, run.shifted()))
            continue
        while True:  # group g's steps, inline while nothing else happens before the next one ends
            if stepping[g] is not None:
                finished_step(g, now)
            end = next_step(g, now)
            if end is None:
                woken[g] = False
                break
            woken[g] = True
            if end < next_send() and (not events or end < events[0][0]):
                now = end
                continue
            push(end, g)
            break
    kept = [n for n in range(num_engines) if parts[n]]
    return _merge(len(requests), [parts[n] for n in kept] + [[i] for i, _ in solos],
                  [sims[n].result() for n in kept] + [result for _, result in solos])


@dataclass(frozen=True)
class _Solo:
    """A request running alone on an idle group from `start` to `end` (_simulate_dispatched)."""

    request: int
    engine: int
    start: float
    end: float
    alone: SimResult
    """The same request alone on a fresh engine, sent at 0."""
    sent: float
    """When the client sent it: start - extra_seconds, less tokenize_seconds."""
    tokenize_seconds: float = 0.0
    """Its prompt's tokenization, the wait for the tokenizer included (0: none)."""

    def shifted(self) -> SimResult:
        """The alone run as this one ran: sent at `sent`, its TTFT and E2E longer by its
        tokenization."""
        if not self.tokenize_seconds:
            return replace(self.alone, first_arrival_seconds=self.sent, last_completion_seconds=self.end)
        return replace(self.alone, first_arrival_seconds=self.sent, last_completion_seconds=self.end,
                       ttft_seconds=tuple(t + self.tokenize_seconds for t in self.alone.ttft_seconds),
                       e2e_seconds=tuple(t + self.tokenize_seconds for t in self.alone.e2e_seconds))


def simulate_lockstep(
    requests_per_rank: Sequence[Sequence[SimRequest]],
    limits: EngineLimits,
    group_step_seconds: Callable[[list[StepLoad]], float],
    first_token_extra_seconds: float = 0.0,
    max_concurrency_per_rank: Sequence[int | None] | None = None,
) -> list[SimResult]:
    """Engines that step together (the DP ranks of an EP group: vLLM syncs them every step and
    each MoE layer gathers all their tokens): each has its own requests, client slots and
    scheduler, but one clock; every step, each rank with work schedules its own load and the
    step lasts `group_step_seconds(loads)` for all of them (idle ranks wait for their next
    arrival on the shared clock). One SimResult per rank, in order."""
    caps = max_concurrency_per_rank or [None] * len(requests_per_rank)
    sims = [_Sim(reqs, limits, _check_fits(reqs, limits)) for reqs in requests_per_rank]
    for sim, cap in zip(sims, caps, strict=True):
        sim.begin(first_token_extra_seconds, cap)
    clock = _Clock(limits.pipeline_stages)
    now = min((sim.first_arrival for sim in sims if sim.reqs), default=0.0)
    while not all(sim.finished for sim in sims):
        loaded = [sim for sim in sims if sim.reqs]
        busy = [sim for sim, works in zip(loaded, _take_in(loaded, clock, now, limits.schedules_ahead), strict=True)
                if works]
        if not busy:
            now = min(sim.next_event() for sim in sims if not sim.finished)
            continue
        loads = [sim.schedule() for sim in busy]
        end, seconds, now = clock.run(now, loads, group_step_seconds)
        for sim, load in zip(busy, loads, strict=True):
            sim.record(end, seconds, load)
    return [sim.result() for sim in sims]


def _merge(num_requests: int, parts: list[list[int]], results: list[SimResult]) -> SimResult:
    ttft: list[float] = [0.0] * num_requests
    e2e: list[float] = [0.0] * num_requests
    tpot: list[float | None] = [None] * num_requests
    lens: list[int] = [0] * num_requests
    for part, res in zip(parts, results, strict=True):
        for j, i in enumerate(part):
            ttft[i], e2e[i], tpot[i] = res.ttft_seconds[j], res.e2e_seconds[j], res.tpot_seconds[j]
            lens[i] = res.output_lens[j]
    return SimResult(
        ttft_seconds=tuple(ttft),
        e2e_seconds=tuple(e2e),
        tpot_seconds=tuple(tpot),
        output_lens=tuple(lens),
        step_seconds=tuple(s for r in results for s in r.step_seconds),
        step_loads=tuple(s for r in results for s in r.step_loads),
        step_num_regular_itl=tuple(s for r in results for s in r.step_num_regular_itl),
        step_itl_seconds=tuple(s for r in results for s in r.step_itl_seconds),
        irregular_itl_seconds=tuple(s for r in results for s in r.irregular_itl_seconds),
        num_preemptions=sum(r.num_preemptions for r in results),
        first_arrival_seconds=min((r.first_arrival_seconds for r in results), default=0.0),
        last_completion_seconds=max((r.last_completion_seconds for r in results), default=0.0),
    )


# ---------------------------------------------------------------------- vllm bench serve metrics


@dataclass(frozen=True)
class Distribution:
    mean: float
    median: float
    p99: float


@dataclass(frozen=True)
class ServeMetrics:
    """What `vllm bench serve` prints (vllm/benchmarks/serve.py, calculate_metrics, 0.33.0)."""

    ttft_seconds: Distribution
    tpot_seconds: Distribution
    itl_seconds: Distribution
    e2e_seconds: Distribution
    duration_seconds: float
    """First request sent to last completion."""
    request_throughput_per_second: float
    output_token_throughput_per_second: float
    backlog: Backlog | None = None
    """Arrivals at a finite rate: how the queue for first tokens moved over the burst's second
    half (backlog_growth); None otherwise or for a burst too short to tell."""
    shortened_from: int | None = None
    """The default --num-prompts the burst was cut from to stay within the simulation's step
    budget (serve.burst_metrics); None when it ran them all."""
    num_prompts: int | None = None
    """The requests simulated (None: not a simulated burst)."""
    first_wave: FirstWave | None = None
    """A closed loop's burst (--max-concurrency C below --num-prompts, --request-rate inf): the
    TTFT of the first C requests, sent at once, apart from the rest's (first_wave); None
    otherwise."""
    decoded: bool = True
    """Whether any request had a token after its first (a burst whose requests drawn from a
    --dataset all have one output token has no TPOT or ITL to report, as vllm bench serve has none)."""


@dataclass(frozen=True)
class FirstWave:
    """vllm bench serve sends a closed loop's first C requests at once, so their C prompts queue
    for the step budget together; every later one is sent as another completes. The burst's
    mean TTFT counts both: (C first + (N - C) later) / N."""

    num_first: int
    first_ttft_mean_seconds: float
    num_later: int
    later_ttft_mean_seconds: float


def first_wave(result: SimResult, clients: int) -> FirstWave | None:
    """The TTFT means of the first `clients` requests (sent at once: requests are sent in the
    order given) and of the rest; None where no request comes after them."""
    ttfts = result.ttft_seconds
    if clients < 1 or len(ttfts) <= clients:
        return None
    first, later = ttfts[:clients], ttfts[clients:]
    return FirstWave(len(first), sum(first) / len(first), len(later), sum(later) / len(later))


@dataclass(frozen=True)
class WindowMeans:
    """A count's time averages over the arrivals' two halves (from when it has filled to their
    middle, and from there to the last arrival), each with its standard error."""

    first: float
    second: float
    first_error: float
    second_error: float

    @property
    def rise_error(self) -> float:
        return math.hypot(self.first_error, self.second_error)


@dataclass(frozen=True)
class Backlog:
    """The requests in the system (arrived, not completed) and those of them waiting for a first
    token, at two moments of a burst's arrivals."""

    from_seconds: float
    to_seconds: float
    """From the middle of the arrivals to the last one (seconds from the first)."""
    in_system_from: int | None
    in_system_to: int | None
    """None where the arrivals' first half is shorter than the median E2E of its requests (the
    system may still be filling up)."""
    waiting_from: int
    waiting_to: int
    completed_per_second: float
    """Completions a second between the two."""
    planned_in_system: float | None = None
    planned_waiting: float | None = None
    """What the plan's steady state holds on average (over every replica): rate x E2E, rate x
    TTFT (Little's law); None: no reference."""
    in_system_means: WindowMeans | None = None
    waiting_means: WindowMeans | None = None
    """The counts' time averages over the two halves (window_means); None: not taken (a rise
    between the two moments is then judged alone)."""

    @property
    def growing(self) -> bool:
        """Either count grew beyond chance, by more than BACKLOG_SIGMAS standard deviations of
        the two counts' difference (in an engine that keeps up each is about Poisson, an
        M/G/infinity count: variance its mean), and ended above the plan's mean by as many of
        its own: the engine falls behind the rate (its queue grows for as long as requests keep
        coming: in front of the engine, or, admitted, in ever slower steps). A count still rising
        toward the plan's is a system filling up (a burst of 1,000 prompts at 13.2 req/s on
        Llama-3.1-70B tp 8 rose from 117 to 168 in the system, 2.5 sigma above the plan's 139:
        called growing without the reference). Where the halves' time averages are taken
        (window_means), a rise between the two moments counts only if the averages rise beyond
        their own errors too, and the second half's ends above the plan by as many: two moments
        are two samples of a count that swings wider than a Poisson one where a step slows as it
        fills (Kimi-K2.5 tp=8 pp=2 at 4 req/s, 200 prompts: 13 in the system at the middle, 43 at
        the last arrival, against the plan's 22.5, while the halves averaged 18.5 and 24.6 and 400 or
        800 prompts showed no rise: called falling behind)."""
        pairs = [(self.waiting_from, self.waiting_to, self.planned_waiting, self.waiting_means)]
        if self.in_system_from is not None and self.in_system_to is not None:
            pairs.append((self.in_system_from, self.in_system_to, self.planned_in_system, self.in_system_means))

        def above(count: int, planned: float | None) -> bool:
            return planned is None or count > planned + BACKLOG_SIGMAS * math.sqrt(max(1.0, planned))

        def averages_rise(means: WindowMeans | None, planned: float | None) -> bool:
            return means is None or (means.second - means.first > BACKLOG_SIGMAS * means.rise_error
                                     and (planned is None or means.second > planned + BACKLOG_SIGMAS
                                          * means.second_error))

        # a rise beyond chance that ends above the plan; or, a queue already far above the plan
        # at the middle that has not come down (Llama-3.1-70B tp=1 pp=8 at 10 req/s: 175 then
        # 217 waiting against the plan's 6.1, completing 9.59 req/s: it had filled before the
        # middle, so its rise alone was not beyond chance)
        return any((to - start > BACKLOG_SIGMAS * math.sqrt(max(1, start + to)) and above(to, planned)
                    and averages_rise(means, planned))
                   or (planned is not None and to >= start and above(start, planned) and above(to, planned)
                       and start > BACKLOG_LEVEL_FACTOR * planned)
                   for start, to, planned, means in pairs)


BACKLOG_LEVEL_FACTOR = 2.0
"""Backlog.growing's level rule: a count already more than this many times the plan's mean (and
3 sigma above it) at the arrivals' middle, not come down by their end, is a queue the engine
is behind on."""
BACKLOG_SIGMAS = 3.0
"""Backlog.growing's test: a rise by 3 standard deviations happens by chance 0.13% of the time."""


def backlog_growth(requests: Sequence[SimRequest], result: SimResult, planned_in_system: float | None = None,
                   planned_waiting: float | None = None) -> Backlog | None:
    """The requests in the system (from arrival to arrival + E2E) and those waiting for their
    first token (to arrival + TTFT) at the middle of the arrivals and at the last one (`result`
    in the requests' order, sent at arrival: no client limit), and the completions a second
    between. None when the arrivals' first half is shorter than the median TTFT of the requests
    in it (the queue may still be forming) or every request arrives at once; the counts in the
    system None when it is shorter than their median E2E. `planned_in_system`, `planned_waiting`:
    the plan's steady-state means, Backlog.growing's reference."""
    if not requests:
        return None
    arrivals = [r.arrival_seconds for r in requests]
    first, last = min(arrivals), max(arrivals)
    middle = (first + last) / 2

    def early_median(times: tuple[float, ...]) -> float:
        early = sorted(t for a, t in zip(arrivals, times, strict=True) if a <= middle)
        return early[len(early) // 2]

    if last <= middle or middle - first < early_median(result.ttft_seconds):
        return None
    filled = middle - first >= early_median(result.e2e_seconds)
    answered = [a + t for a, t in zip(arrivals, result.ttft_seconds, strict=True)]
    completions = [a + t for a, t in zip(arrivals, result.e2e_seconds, strict=True)]

    def since(t: float, ends: list[float]) -> int:
        return sum(1 for a in arrivals if a <= t) - sum(1 for e in ends if e <= t)

    done = sum(1 for c in completions if middle < c <= last)
    in_system = window_means(arrivals, completions, early_median(result.e2e_seconds), middle) if filled else None
    return Backlog(middle - first, last - first, since(middle, completions) if filled else None,
                   since(last, completions) if filled else None, since(middle, answered), since(last, answered),
                   done / (last - middle), planned_in_system, planned_waiting, in_system,
                   window_means(arrivals, answered, early_median(result.ttft_seconds), middle))


BACKLOG_SAMPLES = 256
"""window_means samples a count this many times in each half of the arrivals."""


def window_means(arrivals: list[float], ends: list[float], fill_seconds: float, middle: float) -> WindowMeans:
    """The time averages of N(t) = requests arrived by t and not ended by t (a request ends at
    its entry of `ends`) over [first arrival + fill_seconds, middle] and [middle, last arrival],
    BACKLOG_SAMPLES samples each, and their standard errors: a count whose values stay correlated
    for about tau (the requests' mean time in it, their ends less their arrivals) holds L / tau
    independent values in a window of length L, so the error is sqrt(v min(1, tau / L)), v the
    variance of the samples about their least-squares line (a steady rise is the trend, not the
    noise), at least the mean (a Poisson count's, M/G/infinity)."""
    starts, stops = sorted(arrivals), sorted(ends)
    tau_seconds = sum(e - a for a, e in zip(arrivals, ends, strict=True)) / len(arrivals)

    def count(t: float) -> int:
        return bisect.bisect_right(starts, t) - bisect.bisect_right(stops, t)

    def window(low: float, high: float) -> tuple[float, float]:
        n = BACKLOG_SAMPLES
        xs = [low + (high - low) * (k + 0.5) / n for k in range(n)]
        ys = [float(count(x)) for x in xs]
        mean_x, mean_y = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mean_x) ** 2 for x in xs)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx if sxx > 0 else 0.0
        residual = sum((y - mean_y - slope * (x - mean_x)) ** 2 for x, y in zip(xs, ys, strict=True)) / n
        variance = max(residual, mean_y, 1.0)
        length_seconds = max(high - low, 0.0)
        share = 1.0 if length_seconds <= tau_seconds else tau_seconds / length_seconds
        return mean_y, math.sqrt(variance * share)

    first, first_error = window(min(starts[0] + fill_seconds, middle), middle)
    second, second_error = window(middle, starts[-1])
    return WindowMeans(first, second, first_error, second_error)


def weighted_percentile(pairs: Sequence[tuple[float, int]], q_percent: float) -> float:
    """numpy.percentile's default (linear) of the list holding each value `weight` times.

    Position q/100 * (n - 1) in the sorted list, interpolated between its two neighbours.
    0.0 for an empty list (vllm bench serve's `np.percentile(x or 0, q)`).
    """
    return _percentile_of_sorted(sorted((v, w) for v, w in pairs if w > 0), q_percent)


def _percentile_of_sorted(items: list[tuple[float, int]], q_percent: float) -> float:
    """weighted_percentile of (value, weight > 0) pairs sorted by value."""
    n = sum(w for _, w in items)
    if n == 0:
        return 0.0
    pos = q_percent / 100 * (n - 1)
    lo = int(pos)
    frac = pos - lo
    v_lo = v_hi = items[-1][0]
    seen = 0
    for idx, (v, w) in enumerate(items):
        if lo < seen + w:
            v_lo = v
            v_hi = v if lo + 1 < seen + w else items[min(idx + 1, len(items) - 1)][0]
            break
        seen += w
    return v_lo + frac * (v_hi - v_lo)


def _distribution(pairs: list[tuple[float, int]]) -> Distribution:
    items = sorted((v, w) for v, w in pairs if w > 0)  # once for both percentiles
    n = sum(w for _, w in items)
    mean = sum(v * w for v, w in pairs) / n if n else 0.0
    return Distribution(mean, _percentile_of_sorted(items, 50), _percentile_of_sorted(items, 99))


def bench_metrics(result: SimResult, clock_start_seconds: float | None = None) -> ServeMetrics:
    """Mean, median and p99 of TTFT, TPOT, ITL and E2E, and the throughputs over the run's
    duration: from `clock_start_seconds` (None: the first send) to the last completion. vllm
    bench serve starts its clock before it sends anything (benchmark_start_time, then
    get_request's sleeps: at a finite rate the first request waits one interval too), so at a
    rate of N prompts the duration is at least N / rate: from the first send it had read 0.608
    req/s at --request-rate 0.5 (10 prompts; a review)."""
    ones = lambda xs: [(x, 1) for x in xs if x is not None]  # noqa: E731
    itl = list(zip(result.step_itl_seconds, result.step_num_regular_itl, strict=True)) + ones(
        result.irregular_itl_seconds
    )
    start = result.first_arrival_seconds if clock_start_seconds is None else \
        min(clock_start_seconds, result.first_arrival_seconds)
    duration = result.last_completion_seconds - start
    num_done = len(result.e2e_seconds)
    return ServeMetrics(
        ttft_seconds=_distribution(ones(result.ttft_seconds)),
        tpot_seconds=_distribution(ones(result.tpot_seconds)),
        itl_seconds=_distribution(itl),
        e2e_seconds=_distribution(ones(result.e2e_seconds)),
        duration_seconds=duration,
        request_throughput_per_second=num_done / duration if duration > 0 else 0.0,
        output_token_throughput_per_second=sum(result.output_lens) / duration
        if duration > 0
        else 0.0,
        decoded=any(t is not None for t in result.tpot_seconds),
    )
