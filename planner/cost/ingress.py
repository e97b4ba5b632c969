"""A request's way from the client's send to the engine: the API server tokenizes its prompt
(pure, SI).

`vllm bench serve` and OpenAI-style clients send text; the API server turns it into token ids
before the engine sees the request, one thread doing it for every request of that server:
- **serial** (vLLM 0.33.0: `BaseRenderer`'s thread pool of `renderer_num_workers` = 1 worker,
  vllm/renderers/base.py and vllm/config/model.py; vLLM 0.6.6.post1: `OpenAIServing`'s
  ThreadPoolExecutor(max_workers=1), vllm/entrypoints/openai/serving_engine.py; SGLang 0.5.23:
  `TokenizerManager._tokenize_texts` in the manager's event loop, without
  --enable-dynamic-batch-tokenizer): prompts are tokenized one after another in the order they
  came, so a burst of long prompts queues for the tokenizer before it queues for the engine;
- **microbatch** (vLLM 0.10.2 to 0.22.0: `AsyncMicrobatchTokenizer`, vllm/utils/__init__.py in
  0.10.2, vllm/utils/async_utils.py in 0.22.0): the batcher takes the first waiting prompt, waits
  up to `batch_wait_timeout_s` = 2 ms for more (at most `max_batch_size` = 32), and encodes
  them in one batched call on its one thread (Hugging Face tokenizers' encode_batch, which runs
  the prompts in parallel across the CPU's cores); the next batch starts once it returns. Every
  prompt waits the 2 ms, a lone one too.

Each prompt costs TOKENIZE_SECONDS_PER_PROMPT_TOKEN per prompt token on the thread
(efficiency.py). Prompts leave a tokenizer in the order they came (one thread). vLLM 0.33.0
starts one API server per DP rank behind one port (`api_server_count` defaults to
data_parallel_size with its internal load balancer, vllm/entrypoints/cli/serve.py), each with
its own tokenizer, and the requests spread over them; an SGLang server's one TokenizerManager
serves every DP rank of that server (serve.sglang_servers counts the servers). docs/cost-model.md
(Serving: the API server's tokenizer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from planner.cost import efficiency as eff

MICROBATCH_WAIT_SECONDS = 0.002
"""AsyncMicrobatchTokenizer's batch_wait_timeout_s (vLLM 0.10.2-0.22.0)."""
MICROBATCH_MAX_PROMPTS = 32
"""AsyncMicrobatchTokenizer's max_batch_size (vLLM 0.10.2-0.22.0)."""
TOKENIZER_NOTE_UTILIZATION = 0.5
"""A serial tokenizer thread busier than this at the offered rate is named in a plan's notes (its
M/D/1 wait is then half a prompt's tokenization or more)."""
SATURATED_UTILIZATION = 0.95
"""The steady state's cap on the tokenizer's utilization in its M/D/1 wait: at or past 1 no queue
is steady (a rate past the threads' capacity marks the layout overloaded:
PromptTokenizer.capacity_per_s)."""


@dataclass(frozen=True)
class PromptTokenizer:
    """How a serving front end tokenizes text prompts (module docstring)."""

    kind: Literal["serial", "microbatch"]
    seconds_per_token: float = eff.TOKENIZE_SECONDS_PER_PROMPT_TOKEN
    api_servers: int = 1
    """API servers, each with its own tokenizer, the requests spread evenly over them."""
    threads: int = 1
    """Serial: tokenizer threads per API server (vLLM's --renderer-num-workers, SGLang's
    --tokenizer-worker-num), priced as that many queues taking the server's requests in turn
    (a shared pool would wait a little less). Microbatch: not read (one batch at a time)."""

    @property
    def queues(self) -> int:
        """The tokenizer queues requests are spread over: API servers x threads (serial)."""
        return self.api_servers * (self.threads if self.kind == "serial" else 1)

    def service_seconds(self, input_len: float) -> float:
        """One prompt's tokenization on the thread: I x s."""
        return input_len * self.seconds_per_token

    def capacity_per_s(self, input_len: float) -> float:
        """The prompts a second the serial threads take in all, queues / (I s); inf for
        micro-batches (tokenized side by side) or a free tokenizer."""
        service = self.service_seconds(input_len)
        return self.queues / service if self.kind == "serial" and service > 0 else math.inf

    def utilization(self, input_len: float, rate_per_s: float) -> float:
        """rho = lambda / capacity_per_s = (lambda / queues) I s: a serial tokenizer thread's busy
        share when `rate_per_s` prompts a second reach the API servers (0 for microbatching)."""
        if not math.isfinite(rate_per_s):
            return 0.0
        return rate_per_s / self.capacity_per_s(input_len)

    def steady_seconds(self, input_len: float, rate_per_s: float | None = None) -> float:
        """A prompt's mean time from the API server's receipt to the engine, at a steady
        `rate_per_s` of prompts of `input_len` tokens arriving at random over all the API
        servers (None: one at a time). Serial: M/D/1 per thread, I s (1 + rho / (2 (1 - rho))),
        rho capped at SATURATED_UTILIZATION. Microbatch: the 2 ms wait + I s (the prompts of a
        batch are tokenized side by side)."""
        service = self.service_seconds(input_len)
        if self.kind == "microbatch":
            return MICROBATCH_WAIT_SECONDS + service
        rho = min(self.utilization(input_len, rate_per_s or 0.0), SATURATED_UTILIZATION)
        return service * (1 + rho / (2 * (1 - rho)))


SERIAL = PromptTokenizer("serial")
MICROBATCH = PromptTokenizer("microbatch")


class TokenizerQueue:
    """The API servers' tokenizers as requests come through them (mutable: one per simulation),
    request k (in the order sent) to queue k mod queues (PromptTokenizer.queues). `done(sent, input_len)` is when
    a prompt sent at `sent` has its tokens; requests must come in the order they were sent, and
    reach the engines in that order (a short prompt on another server waits for a long one sent
    before it: a simplification for the simulation's one event clock; a serial tokenizer's
    prompts leave in order anyway). `commit=False` asks without taking the tokenizer's time or
    the turn."""

    def __init__(self, tokenizer: PromptTokenizer):
        self.servers = [_Tokenizer(tokenizer) for _ in range(tokenizer.queues)]
        self.count = 0
        self.last = -math.inf

    def done(self, sent: float, input_len: int, commit: bool = True) -> float:
        server = self.servers[self.count % len(self.servers)]
        end = max(server.done(sent, input_len, commit), self.last)
        if commit:
            self.count += 1
            self.last = end
        return end


class _Tokenizer:
    """One API server's tokenizer thread (TokenizerQueue)."""

    def __init__(self, tokenizer: PromptTokenizer):
        self.tokenizer = tokenizer
        self.free = -math.inf  # serial: when the thread is free; microbatch: when the batch in flight returns
        self.last = -math.inf  # the last prompt's exit: prompts leave in order
        self.batch_close = -math.inf  # microbatch: the open batch's deadline
        self.batch_size = 0

    def done(self, sent: float, input_len: int, commit: bool) -> float:
        t = self.tokenizer
        service = t.service_seconds(input_len)
        if t.kind == "serial":
            end = max(sent, self.free) + service
            if commit:
                self.free = self.last = end
            return end
        if sent <= self.batch_close and self.batch_size < MICROBATCH_MAX_PROMPTS:
            # it joins the open batch, which is encoded once its wait is over
            end = max(self.batch_close + service, self.last)
            if commit:
                self.batch_size += 1
                self.free = max(self.free, end)
                self.last = end
            return end
        close = max(sent, self.free) + MICROBATCH_WAIT_SECONDS
        end = max(close + service, self.last)
        if commit:
            self.batch_close, self.batch_size = close, 1
            self.free = self.last = end
        return end
