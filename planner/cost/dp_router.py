"""vLLM's internal data-parallel load balancer, as the step simulation routes with it.

Source: vLLM 0.33.0. `vllm serve --data-parallel-size d` starts d API servers by default
(vllm/entrypoints/cli/serve.py: api_server_count defaults to data_parallel_size under internal
load balancing), each a `DPLBAsyncMPClient` (vllm/v1/engine/core_client.py) that picks the DP rank
(engine) of each request it receives in `get_core_engine_for_request`:

- score(e) = max(d x this server's own requests in flight on e, waiting + running of e in the
  coordinator's last snapshot), plus 6 waiting (KV usage - 0.5) where e's KV cache is over half
  full (left out here: docs/cost-model.md, "The DP router");
- the lowest score wins, the scan starting at a rotating index (d x client_index // d at first,
  one further at each request), so ties go round robin;
- the chosen engine's snapshot waiting count goes up by d at once (`current_counts[eng_index][0]
  += self.client_count`), until the next snapshot replaces the counts;
- the DP coordinator (vllm/v1/engine/coordinator.py) publishes every engine's waiting + running
  to all servers at most every `min_stats_update_interval_ms` = 100 ms while they change.

So d servers each balance only the requests they receive (their own in-flight counts) and see
the others' only through a snapshot up to 100 ms old. Which server receives a request: the
servers accept connections on one listening socket, bound once and handed to each of them
(`run_multi_api_server` in vllm/entrypoints/cli/serve.py, `create_server_socket` in
vllm/entrypoints/launchers/launcher.py), so each connection goes to whichever server the
kernel wakes first; modelled as a uniform draw per request (server_draw: a fixed mixing of the
request's index, so the same burst routes the same way every run). The snapshot holds the engines' requests in flight at the last multiple of
SNAPSHOT_SECONDS (the simulation's in-flight count is vLLM's waiting + running: a request is in
flight from its send to its last token).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable

SNAPSHOT_SECONDS = 100 / 1000
"""The coordinator's stats interval (DPCoordinator min_stats_update_interval_ms, 100 ms at 0.33.0)."""
MASK_64 = 2**64 - 1


def server_draw(k: int, servers: int) -> int:
    """The server of a deployment's k-th request, uniform over `servers`: SplitMix64's output
    function on k (Steele, Lea and Flood, "Fast Splittable Pseudorandom Number Generators",
    OOPSLA 2014), a fixed bijection of 64-bit integers whose outputs pass statistical tests of
    randomness, taken mod `servers`."""
    z = ((k + 1) * 0x9E3779B97F4A7C15) & MASK_64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK_64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK_64
    return (z ^ (z >> 31)) % servers


class VllmDpRouter:
    """One deployment's d API servers routing over its d engines (indices 0..d-1 here).

    `refresh(now, counts)` must come before any change of the engines' in-flight counts at `now`
    (times never decreasing), so that the snapshot holds the counts at the last multiple of
    SNAPSHOT_SECONDS; `route` picks the engine of the next request and the server that sent it
    (after a refresh at its send); `finished` tells that server one of its requests on that
    engine is done."""

    def __init__(self, num_engines: int, snapshot_seconds: float = SNAPSHOT_SECONDS,
                 next_server: Callable[[], int] | None = None):
        """`next_server`: the server of each request in turn (default: server_draw of its index)."""
        self.d = num_engines
        self.sent = 0
        self.next_server = next_server or self._drawn
        self.period = snapshot_seconds
        self.snapshot = [0] * num_engines
        self.snapshot_index = -1  # the multiple of the period the snapshot was taken at
        self.own: list[dict[int, int]] = [{} for _ in range(num_engines)]  # server -> engine -> in flight
        self.added: list[dict[int, int]] = [{} for _ in range(num_engines)]  # its increments since
        self.seen = [-1] * num_engines  # the snapshot each server's increments count from
        self.start = list(range(num_engines))  # each server's scan start (eng_start_index)
        self._least: list[int] | None = None  # the engines at the snapshot's least count, in order

    def _drawn(self) -> int:
        self.sent += 1
        return server_draw(self.sent - 1, self.d)

    def refresh(self, now_seconds: float, counts: Callable[[], list[int]]) -> None:
        """The counts are about to change at `now_seconds`: where a multiple of the period has
        passed since the snapshot, the counts held until now are the snapshot's (`counts()`
        reads them, only then)."""
        index = math.floor(now_seconds / self.period)
        if index > self.snapshot_index:
            self.snapshot, self.snapshot_index, self._least = counts(), index, None

    def route(self) -> tuple[int, int]:
        """(engine, server) for the next request."""
        d, server = self.d, self.next_server()
        own, added = self.own[server], self.added[server]
        if self.seen[server] != self.snapshot_index:  # a new snapshot replaces its increments
            added.clear()
            self.seen[server] = self.snapshot_index
        start, snapshot = self.start[server], self.snapshot
        touched = own.keys() | added.keys()

        def order(e: int) -> int:
            return (e - start) % d

        best = (math.inf, d, -1)  # (score, place in the scan, engine)
        for e in touched:
            score = max(d * own.get(e, 0), snapshot[e] + d * added.get(e, 0))
            best = min(best, (score, order(e), e))
        if self._least is None:
            low = min(snapshot)
            self._least = [e for e in range(d) if snapshot[e] == low]
        least = self._least
        first = bisect.bisect_left(least, start)
        untouched = next((least[(first + j) % len(least)] for j in range(len(least))
                          if least[(first + j) % len(least)] not in touched), None)
        if untouched is None:  # every least-loaded engine holds this server's requests: scan all
            untouched_best = min(((snapshot[e], order(e), e) for e in range(d) if e not in touched),
                                 default=(math.inf, d, -1))
        else:
            untouched_best = (snapshot[untouched], order(untouched), untouched)
        _, _, engine = min(best, untouched_best)
        own[engine] = own.get(engine, 0) + 1
        added[engine] = added.get(engine, 0) + 1
        self.start[server] = (start + 1) % d
        return engine, server

    def finished(self, engine: int, server: int) -> None:
        own = self.own[server]
        own[engine] -= 1
        if not own[engine]:
            del own[engine]
