"""SGLang launch commands for the release in ServeArgs.engine_versions (planner/engines.py), flag
names as python/sglang/srt/server_args.py ServerArgs.add_cli_args defines them in that release
(tests/engine_flags/sglang-VERSION.json holds the accepted flags).

SGLang's own data parallelism (`--dp-size`) runs inside one server on one node: check_server_args
refuses `--dp-size > 1` with `--nnodes > 1` ("multi-node data parallel is not supported unless
dp attention") and requires `--nnodes` to divide tp*pp. So:
- one node: one server, `--dp-size` for its replicas;
- replicas within a node, over several nodes: one server per node (`--dp-size` = the replicas
  on it);
- a replica wider than a node: one server per replica on `--nnodes k` nodes (`--tp-size` counts
  GPUs across them; `--dist-init-addr` is the replica's first node);
- more than one server: the router (sglang_router) on node 0 in front of them all, so one
  address serves the deployment; each server listens on every interface.
`--max-running-requests` is per DP worker (SGLang divides it by dp only with
--enable-dp-attention), like vLLM's --max-num-seqs.

Expert parallelism (ep > 1, see ep_server): EP inside a replica's TP group adds `--ep-size tp`
to the servers above; an EP group of several DP ranks is one server with DP attention
(`--dp-size` is then the group's DP degree, which check_server_args allows over `--nnodes`
nodes), one server per group as for replicas (the router in front), or several to a node
(`--base-gpu-id`, `--port`) when a group is smaller than a node.

`--mem-fraction-static` is SGLang's share of GPU memory for weights + KV pool (not vLLM's total
budget): the plan's weights + KV cache over the GPU's memory, capped so that SGLang keeps what its
own default keeps free for activations and CUDA graphs (ServerArgs._handle_gpu_memory_settings).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from planner.emit.command import (
    ALL_NODES,
    HEAD_ADDRESS_PLACEHOLDER,
    MODEL_PLACEHOLDER,
    REPLICA_HEAD_ADDRESS,
    SERVER_URLS,
    LaunchStep,
    NodeSet,
    PerNode,
    ServeArgs,
    env_prefix,
    node_rank_value,
    serve_launch_args,
)
from planner.engines import BATCHED_DP_MOE_MAX_NUM_BATCHED_TOKENS
from planner.errors import SpecError
from planner.requests import ServeRequest, Speculation
from planner.units import BYTES_PER_GIB, BYTES_PER_MIB

if TYPE_CHECKING:
    from collections.abc import Sequence

    from planner.cost.serving_memory import StageMemory
    from planner.layout import Layout
    from planner.serve import ServeEstimate
    from planner.specs import ClusterSpec, ModelSpec

DIST_INIT_PORT = 5000
SERVER_PORT = 30000
PORT_STRIDE = 10
"""--port apart of SGLang servers side by side on one node. With attention DP a server also
binds its ZMQ ports at --port + 233 (dist init) through + 239 (the six derived from it:
srt/server_args.py PortArgs.init_new, ZMQ_TCP_PORT_DELTA 233, NUM_DERIVED_PORTS 6, at
0.5.23), so servers one port apart collide; 10 apart never meet (nor their HTTP ports)."""
DP_ATTENTION = "--enable-dp-attention"
ATTN_DP_SIZE = "--attn-dp-size"
"""DP attention before 0.5.2x (`--dp-size d --enable-dp-attention`) and from then on."""
ROUTER_PORT = 8000
KV_CACHE_DTYPE = {"auto": None, "fp8": "fp8_e4m3"}
QUANTIZATION = {"fp8": "fp8", "int8": None, "int4": None}

GRAPH_TIERS_GIB = ((20, 2048, 8, 8), (35, 2048, 24, 80), (60, 4096, 32, 160), (90, 8192, 256, 512),
                   (160, 8192, 256, 512), (math.inf, 16384, 512, 512))
"""_handle_gpu_memory_settings: (GPU memory below this GiB, chunked_prefill_size,
cuda_graph_max_bs with tp < 4, with tp >= 4)."""
RESERVED_BASE_MIB = 512
RESERVED_MIB_PER_PREFILL_TOKEN = 1.5
RESERVED_MIB_PER_GRAPH_BATCH = 2
RESERVED_MIB_PER_PIECEWISE_GRAPH = 8
RESERVED_MIB_PER_8_GPUS = 1024


def piecewise_graph_sizes(max_tokens: int) -> int:
    """How many piecewise CUDA graphs SGLang captures (_generate_piecewise_cuda_graph_tokens)."""
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
             *range(1280, 4097, 256), *range(4608, max_tokens + 1, 512)]
    return sum(1 for s in sizes if s <= max_tokens)


def memory_tier(a: ServeArgs) -> tuple[float, int, int, int]:
    """The GPU's row of GRAPH_TIERS_GIB: (memory bound GiB, chunked_prefill_size, cuda_graph_max_bs
    at tp < 4, at tp >= 4)."""
    memory_gib = a.gpu_memory_bytes / BYTES_PER_GIB
    return next(t for t in GRAPH_TIERS_GIB if memory_gib < t[0])


def reserved_bytes(a: ServeArgs) -> float:
    """What SGLang keeps out of --mem-fraction-static by default on this GPU: 512 MiB + 1.5 MiB
    per chunked-prefill token + 2 MiB per CUDA-graph batch + 1 GiB per 8 GPUs of tp*pp
    (+ 8 MiB per piecewise CUDA graph without PP), at least 10 GiB on GPUs over 60 GiB."""
    release = a.engine_versions.sglang_release
    memory_gib = a.gpu_memory_bytes / BYTES_PER_GIB
    _, prefill, graphs_small, graphs_large = memory_tier(a)
    graph_batch = graphs_small if a.tp < 4 else graphs_large
    mib = (RESERVED_BASE_MIB + RESERVED_MIB_PER_PREFILL_TOKEN * max(prefill, 2048)
           + RESERVED_MIB_PER_GRAPH_BATCH * graph_batch + RESERVED_MIB_PER_8_GPUS * a.tp * a.pp / 8)
    if a.pp == 1:
        mib += RESERVED_MIB_PER_PIECEWISE_GRAPH * piecewise_graph_sizes(prefill)
    reserved = mib * BYTES_PER_MIB
    if memory_gib > release.large_gpu_gib:
        reserved = max(reserved, release.reserved_min_gib_large_gpu * BYTES_PER_GIB)
    return reserved


def fraction_base_bytes(a: ServeArgs) -> float:
    """What --mem-fraction-static is a fraction of: the memory free before the weights load
    (ServeArgs.load_free_bytes; SGLang's profile_max_num_token sizes the pool as free after
    load - that * (1 - f)), or the GPU's total where not known."""
    return a.load_free_bytes or a.gpu_memory_bytes


def mem_fraction_static(a: ServeArgs) -> float:
    """The plan's weights + KV over the memory free before load, at most what SGLang's reserve
    leaves of it; rounded down to 3 decimals, as SGLang rounds its own."""
    base = fraction_base_bytes(a)
    planned = a.weights_and_kv_bytes_per_gpu / base
    ceiling = (base - reserved_bytes(a)) / base
    return math.floor(min(planned, ceiling) * 1000) / 1000


def kv_pool_bytes(a: ServeArgs) -> float:
    """SGLang's KV pool per GPU: --mem-fraction-static of the memory free before load less the
    plan's weights (and the plan's other non-KV memory); negative where its reserve leaves less
    than the weights. Llama-3.1-405B tp=8 pp=2 on H100: f = 0.799 of 79.1 GiB less 500 MiB and
    two communicators' NCCL buffers (688 MB, 544 MB), 77.47 GiB, less 47.25 GiB of weights:
    14.65 GiB, where f of the 79.65 GiB total had read 16.9 (a CLI read)."""
    return mem_fraction_static(a) * fraction_base_bytes(a) - (a.weights_and_kv_bytes_per_gpu
                                                              - a.kv_cache_bytes_per_gpu)


def pool_figures(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, estimate: ServeEstimate
                 ) -> tuple[float, float, float]:
    """(non-KV bytes, KV pool bytes, --mem-fraction-static x the memory free before load) of an
    estimate's fullest GPU as SGLang sizes it (kv_pool_bytes; the pool at most the plan's KV):
    the table's and `plan explain`'s memory under --emit sglang."""
    a = serve_launch_args(model, cluster, request, estimate.layout, estimate.stages, estimate.max_model_len,
                          estimate.max_num_seqs, MODEL_PLACEHOLDER)
    pool = min(max(0.0, kv_pool_bytes(a)), a.kv_cache_bytes_per_gpu)
    return a.weights_and_kv_bytes_per_gpu - a.kv_cache_bytes_per_gpu, pool, mem_fraction_static(a) * fraction_base_bytes(a)


DEFAULT_SWA_FULL_TOKENS_RATIO = 0.8
"""--swa-full-tokens-ratio unless set: the window layers' pool holds 0.8 of the full layers'
tokens (ServerArgs.swa_full_tokens_ratio at 0.5.10.post1; fields/schedule.py fallback at 0.5.23)."""
SWA_RATIO_STEP = 0.01
"""The grain --swa-full-tokens-ratio is rounded up to (swa_full_tokens_ratio)."""
SWA_TRAILING_PAGES = 2
"""SWARequestCapPoolConfigurator's pages a request holds beyond the window and the eviction
interval: one trailing page and one for its next decode (compute_swa_request_cap, page 1 token)."""
DECODE_EXTRA_SLOTS_MAX_RUNNING = 32
DECODE_EXTRA_SLOTS_PER_REQUEST = 2
"""A disaggregated decode server of at most 32 running requests a worker reserves 2 more
request slots each, a window apiece, for requests in transfer (pd_disaggregation_hook.py at 0.5.23)."""
SWA_CHUNKS_IN_FLIGHT = 2
"""Prompt chunks whose window-layer KV a server holds beyond its running requests' windows: the
overlap scheduler's two batches in flight (compute_swa_request_cap's chunks_in_flight,
srt/model_executor/pool_configurator.py at 0.5.23); one with --disable-overlap-schedule."""


def chunked_prefill_size(a: ServeArgs) -> int:
    """The prompt tokens one rank runs a step: the plan's budget where it emits one, else SGLang's
    default for the GPU's memory (GRAPH_TIERS_GIB); a DP-attention server's over its ranks, as
    SGLang divides it (parallel_hook.py at 0.5.23, server_args.py at 0.5.10.post1)."""
    server_tokens = a.max_num_batched_tokens if a.max_num_batched_tokens is not None else memory_tier(a)[1]
    return server_tokens // a.ranks_per_server


def hybrid_swa(a: ServeArgs) -> bool:
    """SGLang keeps the window layers' KV in a pool of their own (the release's
    hybrid_swa_architectures, with window layers planned); every other model's layers each keep
    a request's whole context in one pool, window layers too."""
    return a.kv_window_bytes_per_token > 0 and a.architecture in a.engine_versions.sglang_release.hybrid_swa_architectures


def request_capped_pool(a: ServeArgs) -> bool:
    """SGLang sizes the window pool from --max-running-requests, not the ratio: a hybrid pool
    without the radix cache (a disaggregated decode server) at a release with
    SWARequestCapPoolConfigurator (0.5.23, srt/model_executor/pool_configurator.py)."""
    return hybrid_swa(a) and not a.radix_cache and a.engine_versions.sglang_release.swa_request_cap_pool


def locked_prompt_tokens(prompt: int, window: int, chunk: int, trimmed: bool = True) -> int:
    """A running request's prompt tokens whose window-layer KV its prefix-cache lock keeps. Each
    prompt chunk becomes a node of the radix tree (cache_unfinished_req) and the lock taken at the
    prompt's end walks back from the last node until it spans the window. At 0.5.10.post1 the
    nodes are whole chunks (swa_radix_cache.py), so whole chunks back to the window: a 1,024-token
    prompt in one chunk keeps all 1,024 of a 128 window. At 0.5.23 (`trimmed`) the insert first
    frees what fell out of the window and cuts the new leaf to one window (checkpoint_into_tree,
    SWAComponent._maybe_split_leaf_for_swa_lock), so the window, or the last chunk and the window
    before it where that chunk is shorter: 128 of that prompt."""
    if prompt <= 0:
        return 0
    last = prompt - chunk * ((prompt - 1) // chunk)  # the last chunk, 1..chunk tokens
    if trimmed:
        return min(prompt, window if last >= window else last + window)
    covered = last
    while covered < min(window, prompt):
        covered += chunk
    return min(covered, prompt)


def eviction_interval(a: ServeArgs) -> int:
    return a.engine_versions.sglang_release.swa_eviction_interval or a.kv_window_tokens


def swa_held_tokens(a: ServeArgs) -> float:
    """A running request's mean window-layer tokens in SGLang's window pool: its locked prompt
    chunks (locked_prompt_tokens; none without the radix cache, where a request frees its own
    prompt's too) and its own decoded tokens, freed as they fall out of the window
    (ScheduleBatch.maybe_evict_swa) at most an eviction interval e late: min(O/2, W + e/2) on
    average over its decode (e = W at 0.5.10.post1, 128 at 0.5.23); at most its whole context."""
    window, interval = a.kv_window_tokens, eviction_interval(a)
    if not a.radix_cache:
        return min(a.context_tokens, window + interval / 2)
    release = a.engine_versions.sglang_release
    prompt = locked_prompt_tokens(round(a.prompt_tokens), window, chunked_prefill_size(a),
                                  release.swa_lock_trims_to_window)
    return min(a.context_tokens, prompt + min(a.output_tokens / 2, window + interval / 2))


def swa_reserve_tokens(a: ServeArgs) -> int:
    """Window-pool tokens the prompt chunks in flight hold (SWA_CHUNKS_IN_FLIGHT); none on a
    decode server, which runs no prompts."""
    if not a.radix_cache:
        return 0
    return (1 if a.async_scheduling is False else SWA_CHUNKS_IN_FLIGHT) * chunked_prefill_size(a)


def request_window_tokens(a: ServeArgs) -> int:
    """SWARequestCapPoolConfigurator's window tokens a request: the window, the eviction interval
    and a page of trailing tokens, and a page for its next decode (compute_swa_request_cap, page 1)."""
    return a.kv_window_tokens + eviction_interval(a) + SWA_TRAILING_PAGES


def swa_full_tokens_ratio(a: ServeArgs) -> float | None:
    """The --swa-full-tokens-ratio that splits SGLang's pool P as the plan's sequences fill it
    (None: not a hybrid pool, or one sized from the requests, request_capped_pool). The full
    layers' pool holds T = P / (B_f + r B_s) tokens and the window layers' r T, so
    N = min(T / F, (r T - X) / S) sequences of F tokens of context that each hold S window tokens
    (swa_held_tokens), X for prompt chunks in flight; both bind at
        r = (S / F + X B_f / P) / (1 - X B_s / P),
    rounded up to 0.01 (the window pool never the shorter) and at most 1 (SGLang's bound)."""
    if not hybrid_swa(a) or request_capped_pool(a):
        return None
    pool_bytes = max(kv_pool_bytes(a), 0.0)
    reserve_tokens = swa_reserve_tokens(a)
    spare = 1 - reserve_tokens * a.kv_window_bytes_per_token / pool_bytes if pool_bytes > 0 else 0.0
    if spare <= 0:
        return 1.0
    ratio = (swa_held_tokens(a) / a.context_tokens + reserve_tokens * a.kv_full_bytes_per_token / pool_bytes) / spare
    return min(1.0, math.ceil(ratio / SWA_RATIO_STEP - 1e-9) * SWA_RATIO_STEP)


def capped_pool_sequences(a: ServeArgs) -> float:
    """Sequences per rank of a request-capped pool (request_capped_pool): N requests take
    N x request_window_tokens of the window pool, and 2N more windows (W + 1 each) where N is at
    most 32 a worker (its extra transfer slots, pd_disaggregation_hook.py), the full pool the
    rest, N x F of it: N = P / (B_s w + B_f F) (+ 2 (W + 1) B_s in w at small N)."""
    pool_bytes = max(kv_pool_bytes(a), 0.0)
    bytes_per_request = (request_window_tokens(a) * a.kv_window_bytes_per_token
                         + a.context_tokens * a.kv_full_bytes_per_token)
    sequences = pool_bytes / bytes_per_request
    if sequences <= DECODE_EXTRA_SLOTS_MAX_RUNNING:
        extra_bytes = DECODE_EXTRA_SLOTS_PER_REQUEST * (a.kv_window_tokens + 1) * a.kv_window_bytes_per_token
        sequences = pool_bytes / (bytes_per_request + extra_bytes)
    return sequences


def full_pool_tokens(a: ServeArgs, ratio: float | None = None) -> float:
    """Tokens of a request SGLang's pool holds in each full-attention layer, the longest request it
    admits (tp_worker max_req_len at 0.5.23): P / (B_f + r B_s) in a hybrid pool, P / (B_f + B_s)
    where window layers keep every token, what the window pool leaves in a request-capped one;
    inf without window layers (the plan's own check holds). `ratio`: swa_full_tokens_ratio(a)
    where the caller has it."""
    if a.kv_window_bytes_per_token <= 0:
        return math.inf
    pool_bytes = max(kv_pool_bytes(a), 0.0)
    if request_capped_pool(a):
        running = min(capped_pool_sequences(a), a.max_num_seqs / a.ranks_per_server)
        window_bytes = running * request_window_tokens(a) * a.kv_window_bytes_per_token
        return (pool_bytes - window_bytes) / a.kv_full_bytes_per_token
    ratio = swa_full_tokens_ratio(a) if ratio is None else ratio
    bytes_per_token = a.kv_full_bytes_per_token + (1.0 if ratio is None else ratio) * a.kv_window_bytes_per_token
    return pool_bytes / bytes_per_token


def pool_sequences(a: ServeArgs) -> float:
    """Running sequences of the plan's mean footprint one rank's pool holds: the pool over
    kv_bytes_per_sequence, or with window layers as SGLang pools them (full_pool_tokens): in a
    hybrid pool the lesser of the full pool over F and the window pool, less the chunks in
    flight, over S (swa_full_tokens_ratio); a request-capped one, capped_pool_sequences; else
    the whole context in every layer."""
    if a.kv_window_bytes_per_token <= 0:
        return kv_pool_bytes(a) / a.kv_bytes_per_sequence
    if request_capped_pool(a):
        return capped_pool_sequences(a)
    ratio = swa_full_tokens_ratio(a)
    tokens = full_pool_tokens(a, ratio)
    if ratio is None:
        return tokens / a.context_tokens
    return min(tokens / a.context_tokens, (ratio * tokens - swa_reserve_tokens(a)) / swa_held_tokens(a))


def pool_running_sequences(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest,
                           estimate: ServeEstimate) -> tuple[float, float]:
    """(pool_sequences, full_pool_tokens) of an estimate's fullest GPU as SGLang pools it
    (`plan explain`'s KV bar)."""
    a = serve_launch_args(model, cluster, request, estimate.layout, estimate.stages, estimate.max_model_len,
                          estimate.max_num_seqs, MODEL_PLACEHOLDER)
    return pool_sequences(a), full_pool_tokens(a)


def max_running_requests(a: ServeArgs) -> int:
    """The plan's sequences per worker, or fewer where SGLang's pool holds fewer (its reserve out
    of --mem-fraction-static; its own pools of window layers, pool_sequences): what that pool runs
    at the plan's mean footprint (more would only be retracted and requeued), over the server's
    DP-attention ranks; at least 1 (pool_refusal refuses a layout whose pool holds less than one)."""
    if a.kv_bytes_per_sequence <= 0:
        return a.max_num_seqs
    return max(1, min(a.max_num_seqs, math.floor(pool_sequences(a) * a.ranks_per_server)))


def running_per_replica(a: ServeArgs) -> int:
    """The sequences SGLang runs per replica of the plan (a DP rank) under its pool:
    max_running_requests of its server (ep_server), whose count covers the d DP-attention ranks
    of an EP group together (d = 1 otherwise)."""
    server, _ = ep_server(a)
    ranks = a.layout.dp_per_ep_group if a.ep > 1 else 1
    return max(1, max_running_requests(server) // ranks)


def planned_running(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, layout: Layout,
                    stages: Sequence[StageMemory], max_model_len: int, max_num_seqs: int,
                    decode_worker: bool = False) -> int:
    """running_per_replica of a layout as the search sizes it (its stages, max_num_seqs a replica):
    what SGLang runs of those sequences (serve.sglang_pool_cap, disagg_search.decode_concurrency).
    `decode_worker`: a disaggregated decode server (its radix cache off), 0 where SGLang would
    refuse it (pool_refusal: its pool holds no request, or fewer tokens than --context-length;
    the aggregated search refuses such a layout itself)."""
    args = serve_launch_args(model, cluster, request, layout, stages, max_model_len, max_num_seqs, MODEL_PLACEHOLDER)
    if decode_worker:
        args = replace(args, radix_cache=False)
        if pool_refusal(args) is not None:
            return 0
    return running_per_replica(args)


def pool_refusal(a: ServeArgs) -> str | None:
    """Why SGLang cannot serve the layout at all: its default reserve (reserved_bytes) leaves a
    KV pool per GPU smaller than one running request's mean KV (the plan's footprint), so the
    server would start with no room for a request, or not start; None where one fits."""
    server, _ = ep_server(a)
    if server.kv_bytes_per_sequence <= 0:
        return None
    longest = full_pool_tokens(server)
    if longest < server.max_model_len:
        kind = ("its full-attention layers' pool" if hybrid_swa(server) else
                "every layer (SGLang keeps each request's whole context in its window layers too, "
                "not listing this architecture's)")
        return (f"SGLang's KV pool holds {int(longest):,} tokens of a request in {kind}, below --context-length "
                f"{server.max_model_len:,}: it would cap requests there; give --max-model-len {int(longest) - 1:,} "
                f"or less")
    pool = kv_pool_bytes(server)
    if pool_sequences(server) >= 1:
        return None
    return (f"SGLang keeps {reserved_bytes(server) / BYTES_PER_GIB:.1f} GiB per GPU out of its pool by default "
            f"(activations, CUDA graphs): --mem-fraction-static {mem_fraction_static(server):g} leaves "
            f"{max(pool, 0.0) / BYTES_PER_GIB:.2f} GiB per GPU for KV, less than one request's "
            f"{server.kv_bytes_per_sequence / BYTES_PER_GIB:.2f} GiB")


def sglang_pool_notes(a: ServeArgs, worker: str = "DP worker") -> list[str]:
    """Say so when the SGLang command runs fewer sequences than the plan prices. `worker`: what
    one of `a`'s dp replicas is called where the deployment names it (a decode worker)."""
    server, ep_flags = ep_server(a)
    running = max_running_requests(server)
    if running >= server.max_num_seqs:
        return []
    # --max-running-requests counts a DP-attention server's ranks together, else each DP worker's
    where = ("per server (its DP-attention ranks together)" if DP_ATTENTION in ep_flags or ATTN_DP_SIZE in ep_flags
             else f"per {worker}" if server.dp > 1 or worker != "DP worker" else "per server")
    return [f"SGLang keeps {reserved_bytes(server) / BYTES_PER_GIB:.1f} GiB per GPU out of its pool by default "
            f"(activations, CUDA graphs){window_pool_words(server)}: --mem-fraction-static "
            f"{mem_fraction_static(server):g} leaves KV for {running} running requests {where}, not the "
            f"{server.max_num_seqs} the plan prices (vLLM's --gpu-memory-utilization budget); its throughput is "
            f"lower than the plan's"]


def window_pool_words(a: ServeArgs) -> str:
    """How SGLang keeps a model's window layers, for the notes on its smaller pool ("" without)."""
    if a.kv_window_bytes_per_token <= 0:
        return ""
    ratio = swa_full_tokens_ratio(a)
    if ratio is None:
        return (", and its window layers keep each request's whole context (SGLang pools them apart only for the "
                "architectures it lists)")
    return (f", and its window layers' pool holds {ratio:g} of the full layers' tokens (--swa-full-tokens-ratio): "
            f"about {swa_held_tokens(a):,.0f} tokens a request there, its locked prompt chunks and its window")


def server_flags(a: ServeArgs, dp: int, ep_flags: tuple[str, ...] = (), mixed: bool = True) -> list[str]:
    """One SGLang server's flags. `mixed`: the server runs prompts and decodes together, so it
    gets --enable-mixed-chunk (mixed_chunk_flag); a disaggregated role's server does not."""
    flags = ["--model-path", a.model, "--tp-size", str(a.tp)]
    if a.pp > 1:
        flags += ["--pp-size", str(a.pp)]
    if dp > 1:
        flags += ["--dp-size", str(dp)]
    flags += [*ep_flags, "--mem-fraction-static", f"{mem_fraction_static(a):g}",
              "--context-length", str(a.max_model_len), "--max-running-requests", str(max_running_requests(a))]
    if a.max_num_batched_tokens is not None:
        flags += ["--chunked-prefill-size", str(a.max_num_batched_tokens)]
    ratio = swa_full_tokens_ratio(a)
    if ratio is not None and ratio != DEFAULT_SWA_FULL_TOKENS_RATIO:
        # the window layers' pool sized to what the plan's sequences hold there (ServerArgs / fields/schedule.py)
        flags += ["--swa-full-tokens-ratio", f"{ratio:g}"]
    if a.trust_remote_code:
        flags.append("--trust-remote-code")  # ServerArgs.trust_remote_code
    if a.quantization and QUANTIZATION.get(a.quantization):
        flags += ["--quantization", QUANTIZATION[a.quantization]]
    if KV_CACHE_DTYPE[a.kv_cache_dtype]:
        flags += ["--kv-cache-dtype", KV_CACHE_DTYPE[a.kv_cache_dtype]]
    if a.tokenizer_workers > 1:
        # tokenizer_worker_num (sglang/srt/arg_groups/fields/serving.py, 0.5.23): that many
        # TokenizerManager processes
        flags += ["--tokenizer-worker-num", str(a.tokenizer_workers)]
    if a.async_scheduling is False:
        # SGLang's overlap scheduler is its async scheduling (Scheduler.event_loop_overlap
        # schedules the next batch while this one runs); on unless disabled
        flags.append("--disable-overlap-schedule")
    return flags + mixed_chunk_flag(a, mixed) + moe_runner_flags(a) + speculative_flags(a)


def mixed_chunk_flag(a: ServeArgs, mixed: bool = True) -> list[str]:
    """--enable-mixed-chunk: the plan prices continuous batching's mixed steps (each decode step
    carries prompt chunks up to the token budget, vLLM's schedule), which SGLang runs only when
    asked (ServerArgs.enable_mixed_chunk, default False; the scheduler's is_mixed_chunk mixes a
    prefill batch into the running decodes), else it alternates prefill-only and decode-only
    batches. Not with speculative decoding: SGLang turns mixing off there ("Mixed chunked prefill
    is disabled because of using eagle speculative decoding"), and the plan says so
    (serve_cli.all_launch_notes)."""
    return ["--enable-mixed-chunk"] if mixed and a.speculation is None else []


SPECULATIVE_ALGORITHMS = {"mtp": "NEXTN", "eagle": "EAGLE", "eagle3": "EAGLE3", "ngram": "NGRAM"}
"""The planner's --speculative-method -> SGLang's --speculative-algorithm (Spec.speculative_algorithm,
sglang/srt/arg_groups/fields/spec.py at 0.5.23; NEXTN is its alias of EAGLE for a model's own
MTP layers, speculative_hook._resolve_speculative_algorithm_alias)."""


def speculative_flags(a: ServeArgs) -> list[str]:
    """A chain of k drafts, as the plan prices it: k draft steps, top-1 each, k + 1 tokens
    verified (--speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens);
    the draft head's checkpoint for EAGLE/EAGLE3; NGRAM the verified count and a breadth of 1
    (its default searches up to 10 branches: a tree, not the chain priced)."""
    spec = a.speculation
    if spec is None:
        return []
    flags = ["--speculative-algorithm", SPECULATIVE_ALGORITHMS[spec.method]]
    if spec.draft is not None:
        flags += ["--speculative-draft-model-path", spec.served_draft]
    if spec.method == "ngram":
        flags += ["--speculative-ngram-max-bfs-breadth", "1"]
    else:
        flags += ["--speculative-num-steps", str(spec.num_tokens), "--speculative-eagle-topk", "1"]
    return flags + ["--speculative-num-draft-tokens", str(spec.num_tokens + 1)]


def moe_runner_flags(a: ServeArgs) -> list[str]:
    """The planner's --moe-backend as SGLang flags. marlin: `--moe-runner-backend marlin` where
    the release has that choice. flashinfer_mxfp8: `--moe-runner-backend flashinfer_mxfp4
    --flashinfer-mxfp4-moe-precision default`, whose default precision quantizes the MoE input to
    MXFP8 before FlashInfer's TRT-LLM kernel (sglang/srt/layers/quantization/mxfp4.py at
    0.5.10.post1; mxfp4_flashinfer_trtllm_moe.py at 0.5.23; bf16 is the 16-bit alternative)."""
    if a.moe_backend == "auto":
        return []
    if a.moe_backend == "flashinfer_mxfp8":
        return ["--moe-runner-backend", "flashinfer_mxfp4", "--flashinfer-mxfp4-moe-precision", "default"]
    release = a.engine_versions.sglang_release
    if not release.moe_runner_marlin:
        raise SpecError(f"--moe-backend {a.moe_backend}: SGLang {release.version} has no "
                        f"--moe-runner-backend {a.moe_backend} (0.5.23 has)")
    return ["--moe-runner-backend", a.moe_backend]


DEEPEP_FLAGS = {
    "deepep_low_latency": ("--moe-a2a-backend", "deepep", "--deepep-mode", "low_latency"),
    "deepep_high_throughput": ("--moe-a2a-backend", "deepep", "--deepep-mode", "normal"),
}
"""The planner's --all2all-backend as SGLang flags, for an EP group of DP-attention ranks:
moe_a2a_backend "deepep" and deepep_mode low_latency or normal (DeepEP's high-throughput
kernels), both Literal choices in sglang/srt/arg_groups/fields/exec_.py at 0.5.23 (and flags of
0.5.10.post1's server_args.py); vLLM's default all-gather + reduce-scatter is SGLang's own
default (moe_a2a_backend none)."""


def low_latency_tokens_per_rank(a: ServeArgs) -> int | None:
    """Under the low-latency DeepEP backend with EP over DP ranks, the plan's token budget per
    rank (vLLM's BATCHED_DP_MOE_MAX_NUM_BATCHED_TOKENS unless --max-num-batched-tokens): SGLang
    must dispatch that many per rank per call and chunk prompts to it; None otherwise."""
    if a.all2all_backend != "deepep_low_latency" or a.ep <= 1 or a.layout.dp_per_ep_group <= 1:
        return None
    return a.max_num_batched_tokens or BATCHED_DP_MOE_MAX_NUM_BATCHED_TOKENS


def server_env(a: ServeArgs) -> dict[str, str]:
    """The environment a server starts with:
    - SGLang's low-latency DeepEP takes at most SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK
      tokens per rank per call, 128 by default (sglang/srt/environ.py at 0.5.23; DeepEPDispatcher
      asserts it is at most 1,024): raised to the plan's budget per rank, which ep_server also
      passes as --chunked-prefill-size (times d: SGLang divides it over the DP-attention ranks),
      when low_latency_tokens_per_rank applies;
    - speculative decoding over pipeline stages (EAGLE / NEXTN only) needs SGLANG_ENABLE_PP_SPEC=1
      (environ.py, "Experimental: allow pipeline parallelism x speculative decoding";
      validation_hook.check_pipeline_parallel_compat at 0.5.23)."""
    env = {}
    tokens = low_latency_tokens_per_rank(a)
    if tokens is not None:
        env["SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"] = str(tokens)
    if a.pp > 1 and a.speculation is not None:
        env["SGLANG_ENABLE_PP_SPEC"] = "1"
    return env


PP_SPECULATIVE_METHODS = ("mtp", "eagle")
"""The --speculative-method values SGLang 0.5.23 runs over pipeline stages (EAGLE, NEXTN its
alias; not EAGLE3, not NGRAM), and only without attention DP."""


def refusal(layout: Layout, speculation: Speculation | None) -> str | None:
    """Why SGLang would not start this layout as planned, or None."""
    if speculation is None or layout.pp <= 1:
        return None
    if speculation.method not in PP_SPECULATIVE_METHODS:
        return (f"SGLang runs speculative decoding over pipeline stages for EAGLE / NEXTN only, not "
                f"{speculation.method} (validation_hook.check_pipeline_parallel_compat at 0.5.23)")
    if layout.dp_per_ep_group > 1:
        return "SGLang's pipeline-parallel speculative decoding refuses attention DP"
    return None


def ep_server(a: ServeArgs) -> tuple[ServeArgs, tuple[str, ...]]:
    """SGLang's view of the layout and its EP flags. Without EP: the layout, no flags. EP inside
    each replica's TP group (dp_per_ep_group d = 1): `--ep-size tp`. An EP group of d > 1 DP
    ranks is one server, `--tp-size tp*d --dp-size d --enable-dp-attention --ep-size tp*d`
    (`--attn-dp-size d` for the pair from 0.5.2x, which deprecates it):
    SGLang's tp_size counts the whole group, DP attention gives each of its d ranks attention
    TP tp*d // d = tp (python/sglang/srt/layers/dp_attention.py: attn_tp_size = tp_size //
    dp_size) and the experts go over all tp*d GPUs (moe_tp_size = tp_size // ep_size = 1);
    ServerArgs._handle_data_parallelism requires tp_size % dp_size == 0. The returned
    args describe one server per EP group (tp*d GPUs per stage, dp = the number of groups),
    its --max-running-requests and --chunked-prefill-size times d: with DP attention SGLang
    divides both by dp_size to get each DP rank's (the plan's numbers are per DP rank)."""
    if a.ep == 1:
        return a, ()
    d = a.layout.dp_per_ep_group
    if d == 1:
        return a, ("--ep-size", str(a.tp))
    # SGLang divides its chunked-prefill size by the DP ranks: give it d times the priced budget
    per_rank = low_latency_tokens_per_rank(a) or a.max_num_batched_tokens or a.priced_batched_tokens
    budget = None if per_rank is None else per_rank * d
    server = replace(a, tp=a.tp * d, dp=a.layout.num_ep_groups, ep=1, max_num_seqs=a.max_num_seqs * d,
                     max_num_batched_tokens=budget, ranks_per_server=d)
    a2a = (*DEEPEP_FLAGS.get(a.all2all_backend, ()), *(("--enable-two-batch-overlap",) if a.enable_dbo else ()))
    if a.engine_versions.sglang_release.attn_dp_size_flag:
        return server, (ATTN_DP_SIZE, str(d), "--ep-size", str(a.tp * d), *a2a)
    return server, ("--dp-size", str(d), DP_ATTENTION, "--ep-size", str(a.tp * d), *a2a)


def sglang_steps(a: ServeArgs) -> tuple[LaunchStep, ...]:
    launcher = (*env_prefix(**server_env(a)), *a.engine_versions.sglang_release.launcher)
    a, ep_flags = ep_server(a)
    nodes_per_replica = math.ceil(a.tp * a.pp / a.gpus_per_node)
    if nodes_per_replica > 1:
        return _wide_replica_steps(a, launcher, nodes_per_replica, ep_flags)
    if (DP_ATTENTION in ep_flags or ATTN_DP_SIZE in ep_flags) and a.dp > 1 and a.tp * a.pp < a.gpus_per_node:
        return _shared_node_steps(a, launcher, ep_flags)
    per_node = a.gpus_per_node // (a.tp * a.pp)
    num_nodes = math.ceil(a.dp / per_node)
    if num_nodes == 1:
        return (LaunchStep(ALL_NODES, NodeSet(0), (*launcher, *server_flags(a, a.dp, ep_flags))),)
    served = ("--host", "0.0.0.0", "--port", str(SERVER_PORT))
    last_dp = a.dp - (num_nodes - 1) * per_node
    full = NodeSet(0, num_nodes - (last_dp < per_node))
    steps = [LaunchStep("server", full, (*launcher, *server_flags(a, per_node, ep_flags), *served))]
    if last_dp < per_node:
        steps.append(LaunchStep("server", NodeSet(num_nodes - 1),
                                (*launcher, *server_flags(a, last_dp, ep_flags), *served)))
    return (*steps, router_step(a))


def _shared_node_steps(a: ServeArgs, launcher: tuple[str, ...], ep_flags: tuple[str, ...]) -> tuple[LaunchStep, ...]:
    """Several DP-attention servers (EP groups of `a.tp * a.pp` GPUs) to a node: server s of a
    node on GPUs from s * size (--base-gpu-id), port SERVER_PORT + PORT_STRIDE * s (a one-node
    server takes its other ports from --port); one step per place on the node, then the router. SGLang's
    --dp-size cannot hold them: with DP attention it is the group's own DP degree."""
    size = a.tp * a.pp
    per_node = a.gpus_per_node // size
    steps = []
    for slot in range(min(per_node, a.dp)):
        argv = (*launcher, *server_flags(a, 1, ep_flags), "--base-gpu-id", str(slot * size),
                "--host", "0.0.0.0", "--port", str(SERVER_PORT + PORT_STRIDE * slot))
        steps.append(LaunchStep("server", NodeSet(0, math.ceil((a.dp - slot) / per_node)), argv))
    return (*steps, router_step(a))


def _wide_replica_steps(a: ServeArgs, launcher: tuple[str, ...], k: int,
                        ep_flags: tuple[str, ...] = ()) -> tuple[LaunchStep, ...]:
    """One server per replica (or EP group) on k nodes: its first node has node rank 0."""
    if a.dp == 1:
        heads, workers, address = NodeSet(0), NodeSet(1, k - 1), HEAD_ADDRESS_PLACEHOLDER
        roles, served = ("head", "worker"), ()
    else:
        heads, workers = NodeSet(0, 1, k, a.dp), NodeSet(1, k - 1, k, a.dp)
        address = PerNode(f"${REPLICA_HEAD_ADDRESS}")
        roles, served = ("replica head", "replica worker"), ("--host", "0.0.0.0", "--port", str(SERVER_PORT))

    def argv(node_rank: str) -> tuple[str, ...]:
        return (*launcher, *server_flags(a, 1, ep_flags), *served, "--nnodes", str(k), "--node-rank", node_rank,
                "--dist-init-addr", PerNode(f"{address}:{DIST_INIT_PORT}") if a.dp > 1 else f"{address}:{DIST_INIT_PORT}")

    in_replica = node_rank_value(workers, modulo=k) if a.dp > 1 else node_rank_value(workers)
    steps = (LaunchStep(roles[0], heads, argv("0")), LaunchStep(roles[1], workers, argv(in_replica)))
    return steps if a.dp == 1 else (*steps, router_step(a))


def wide_server_steps(a: ServeArgs, copies: int, offset: int, extra: tuple[str, ...],
                      role: str, mixed: bool = True) -> tuple[LaunchStep, ...]:
    """`copies` servers of one worker `a` wider than a node (a replica of tp * pp GPUs, or an EP
    group's DP-attention server of tp * d), server c on the k nodes from offset + c * k, each
    with `--nnodes k --node-rank r --dist-init-addr` its first node (NODE<offset>_IP for one,
    else $REPLICA_HEAD_IP; offset is a multiple of k, so $((NODE_RANK % k)) is r), and a
    disaggregated role's `extra` flags (planner/emit/disagg.py, `mixed` False: server_flags')."""
    launcher = (*env_prefix(**server_env(a)), *a.engine_versions.sglang_release.launcher)
    server, ep_flags = ep_server(a)
    k = math.ceil(server.tp * server.pp / a.gpus_per_node)
    assert k > 1 and offset % k == 0, "a multi-node server starts at a multiple of its width"
    if copies == 1:
        heads, workers = NodeSet(offset), NodeSet(offset + 1, k - 1)
        dist = f"NODE{offset}_IP:{DIST_INIT_PORT}"
    else:
        heads, workers = NodeSet(offset, 1, k, copies), NodeSet(offset + 1, k - 1, k, copies)
        dist = PerNode(f"${REPLICA_HEAD_ADDRESS}:{DIST_INIT_PORT}")

    def argv(node_rank: str) -> tuple[str, ...]:
        return (*launcher, *server_flags(server, 1, ep_flags, mixed), *extra, "--nnodes", str(k), "--node-rank", node_rank,
                "--dist-init-addr", dist)

    return (LaunchStep(f"{role} head", heads, argv("0")),
            LaunchStep(f"{role} worker", workers, argv(node_rank_value(workers, modulo=k))))


def router_step(a: ServeArgs) -> LaunchStep:
    """sglang_router on node 0, after the servers: one address for the whole deployment."""
    release = a.engine_versions.sglang_release
    return LaunchStep("router", NodeSet(0), (*release.router_launcher, "--worker-urls", PerNode(f"${SERVER_URLS}"),
                                              "--host", "0.0.0.0", "--port", str(ROUTER_PORT)))
