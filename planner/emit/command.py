"""Launch steps: which role runs which argv on which nodes, once per role, at any scale.

A plan for N nodes carries each distinct command once -- the head, the workers, the
replica heads -- with the set of nodes that run it (`NodeSet`, a range or a range
repeated every `period` nodes, never a list), so a step costs the same at 2 nodes and at
2,048. Argv is a tuple of str, never a shell string; `LaunchStep.shell()` is the one place
it becomes a line, and that line is copy-pasteable.

Placeholders, two kinds:

- **Text to replace once**, the same on every node: `MODEL` (the checkpoint path or
  Hugging Face id; `--served-model` sets it) and `HEAD_IP` (the head node's address,
  reachable from every node). Shown as they are, quoted like any other argument.
- **Per-node values**, shell parameter expansions that each node's shell expands; set the
  variables on each node (`export NODE_RANK=3`) and paste the same line everywhere:

  - `$NODE_RANK`: this node's index in the plan, 0 to N-1 (node 0 is the head; with data
    parallel replicas of k nodes, replica r holds nodes r*k to r*k+k-1).
  - `$((NODE_RANK * k))`, `$((NODE_RANK % k))`: shell arithmetic on it (the DP start
    rank of a node holding k DP ranks; a node's rank inside its replica of k nodes).
  - `$REPLICA_HEAD_IP`: the address of the first node of this node's replica, node
    k * (NODE_RANK / k); only where replicas span several nodes, each its own server
    (with expert parallelism, a replica is one EP group of k nodes: its own deployment).
  - `$SERVER_URLS`: on the router's node only, `http://ADDRESS:PORT` of every server
    (space-separated), where one router fronts several servers (SGLang).
  - `$NODE_IP`: this node's own address, reachable from the other nodes (a disaggregated
    server's KV side channel, which it both listens on and hands to its peers).

  Such an argv element is a `PerNode` (a str subclass, written to JSON as the plain
  string): `shell()` leaves it unquoted so the shell expands it, and quotes every other
  element with shlex.quote. A value that is the same on every node of a step (a role
  with one node) is written as the literal instead, so small plans need no variables.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from planner.engines import EngineVersions
from planner.requests import DEFAULT_ALL2ALL_BACKEND, ServeRequest, Speculation

if TYPE_CHECKING:
    from planner.cost.serving_memory import StageMemory
    from planner.layout import Layout
    from planner.specs import ClusterSpec, ModelSpec

MODEL_PLACEHOLDER = "MODEL"
"""Replace with the checkpoint path or Hugging Face id (`--served-model` sets it)."""
HEAD_ADDRESS_PLACEHOLDER = "HEAD_IP"
"""Replace with the head node's address reachable from every node."""

NODE_RANK = "NODE_RANK"
REPLICA_HEAD_ADDRESS = "REPLICA_HEAD_IP"
SERVER_URLS = "SERVER_URLS"
NODE_ADDRESS = "NODE_IP"
PER_NODE_VARIABLES = {
    NODE_RANK: "this node's index in the plan, 0 to N-1 as in the node lists above",
    REPLICA_HEAD_ADDRESS: "the address of the first node of this node's replica (or EP group)",
    SERVER_URLS: "on the router's node: http://ADDRESS:PORT of each server's first node, space-separated",
    NODE_ADDRESS: "this node's own address, reachable from the other nodes",
}
"""Every shell variable a PerNode element may name, with what to set it to on each node."""

ALL_NODES = "all"
"""The role of a step that every node of the plan runs alike."""


class PerNode(str):
    """An argv element the shell on each node expands ($NODE_RANK, $((NODE_RANK * 4)),
    --address=$REPLICA_HEAD_IP:6379); its other characters need no quoting."""

    def variables(self) -> list[str]:
        return [name for name in PER_NODE_VARIABLES if name in self]


@dataclass(frozen=True)
class NodeSet:
    """Nodes {first + p * period + i : 0 <= p < num_periods, 0 <= i < length}: a range
    (num_periods = 1) or the same range in each of num_periods blocks of period nodes."""

    first: int
    length: int = 1
    period: int = 0
    num_periods: int = 1

    @property
    def count(self) -> int:
        return self.length * self.num_periods

    def __iter__(self) -> Iterator[int]:
        for p in range(self.num_periods):
            yield from range(self.first + p * self.period, self.first + p * self.period + self.length)

    def _block(self, p: int) -> str:
        start = self.first + p * self.period
        return str(start) if self.length == 1 else f"{start}-{start + self.length - 1}"

    def __str__(self) -> str:
        if self.count == 1:
            return f"node {self.first}"
        if self.num_periods <= 3:
            return "nodes " + ", ".join(self._block(p) for p in range(self.num_periods))
        return f"nodes {self._block(0)}, {self._block(1)}, ..., {self._block(self.num_periods - 1)}"


def node_rank_value(nodes: NodeSet, times: int = 1, modulo: int | None = None) -> str:
    """NODE_RANK * times, or (NODE_RANK % modulo) * times, on each node of `nodes`: the literal
    when it is the same on all of them, else the PerNode shell arithmetic (`%` and `*` bind
    alike, left to right, in shell arithmetic)."""
    if modulo is not None and nodes.length == 1:
        return str(nodes.first % modulo * times)
    if modulo is None and nodes.count == 1:
        return str(nodes.first * times)
    if modulo is not None:
        return PerNode(f"$(({NODE_RANK} % {modulo}))" if times == 1 else f"$(({NODE_RANK} % {modulo} * {times}))")
    return PerNode(f"${NODE_RANK}" if times == 1 else f"$(({NODE_RANK} * {times}))")


_FIND_UNSAFE = re.compile(r"[^\w@%+=:,./-]", re.ASCII).search
"""shlex.quote's test: an argument with none of these characters (and not empty) is left as is."""


def shell_join(argv: tuple[str, ...] | list[str]) -> str:
    """The argv as one shell line: PerNode elements bare (expanded by the node's shell),
    everything else shlex-quoted. Most launch commands have nothing to quote: then every
    shlex.quote would return its argument, and one test of the whole argv says so."""
    if all(argv) and _FIND_UNSAFE("".join(argv)) is None:
        return " ".join(argv)
    return " ".join(arg if isinstance(arg, PerNode) else shlex.quote(arg) for arg in argv)


@dataclass(frozen=True)
class ConfigFile:
    """A file the command reads (torchtitan's job config), to be written on every node of the
    step before it runs: `path` relative to the directory the command runs in."""

    path: str
    text: str


@dataclass(frozen=True)
class LaunchStep:
    """One command, run on every node of `nodes`, in the order the steps are listed."""

    role: str
    """all (every node alike), head, worker, replica head or replica worker."""
    nodes: NodeSet
    argv: tuple[str, ...]
    files: tuple[ConfigFile, ...] = ()
    """Files the argv names that the plan writes (none for flag-only launchers)."""

    @property
    def where(self) -> str:
        return str(self.nodes) if self.role == ALL_NODES else f"{self.nodes} ({self.role})"

    def variables(self) -> list[str]:
        """The per-node shell variables this step's argv uses, in PER_NODE_VARIABLES order."""
        used = {name for arg in self.argv if isinstance(arg, PerNode) for name in arg.variables()}
        return [name for name in PER_NODE_VARIABLES if name in used]

    def shell(self) -> str:
        return shell_join(self.argv)


@dataclass(frozen=True)
class ServeArgs:
    """What every serving emitter needs: one layout and the engine settings that fit it."""

    model: str
    tp: int
    pp: int
    dp: int
    gpus_per_node: int
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    quantization: str | None
    kv_cache_dtype: str
    dtype: str
    engine_versions: EngineVersions
    max_num_batched_tokens: int | None
    """The plan's token budget per step when it is not the engine's default, else None."""
    gpu_memory_bytes: int
    weights_and_kv_bytes_per_gpu: float
    """The plan's weights + KV cache on its fullest GPU (what SGLang's --mem-fraction-static covers)."""
    load_free_bytes: float = 0.0
    """What the GPU has free before the weights load (serving_memory.pre_load_free_bytes): the
    total SGLang's --mem-fraction-static is a fraction of (emit/sglang.kv_pool_bytes); 0: taken
    as gpu_memory_bytes."""
    kv_cache_bytes_per_gpu: float = 0.0
    """Of which the KV cache; with kv_bytes_per_sequence, what SGLang's pool holds when its
    reserve caps --mem-fraction-static below the plan's share (0: not known, not checked)."""
    kv_bytes_per_sequence: float = 0.0
    """One running sequence's mean KV footprint on that GPU (serving_memory.kv_tokens_per_running_sequence)."""
    kv_window_bytes_per_token: float = 0.0
    """Of that GPU's KV bytes per token, its sliding-window (or chunked) layers' (0: none): what
    SGLang keeps in a pool of its own for the architectures it lists (emit/sglang.hybrid_swa)."""
    kv_full_bytes_per_token: float = 0.0
    """Its other attention layers' (set with kv_window_bytes_per_token)."""
    kv_window_tokens: int = 0
    """The window those layers keep (ModelSpec.kv_window_tokens)."""
    prompt_tokens: float = 0.0
    output_tokens: float = 0.0
    """The request's mean prompt and output lengths (with the window fields)."""
    context_tokens: float = 0.0
    """A running sequence's mean context, prompt + half the output (a length mix's own)."""
    architecture: str | None = None
    """ModelSpec.architecture; Llama 4's where a spec with chunked attention does not name it."""
    ranks_per_server: int = 1
    """DP-attention ranks one SGLang server counts its sequences over (emit/sglang.ep_server)."""
    radix_cache: bool = True
    """SGLang's prefix cache is on (False: a disaggregated decode server, where SGLang disables it
    by default: pd_disaggregation_hook.py at 0.5.23), which decides what window-layer KV a
    request holds (emit/sglang.swa_held_tokens)."""
    ep: int = 1
    """Expert-parallel degree (Layout.ep, tp times the DP ranks of one EP group); 1 = none."""
    moe_backend: str = "auto"
    """The routed experts' kernel backend (ServeRequest.moe_backend); auto = the engine's pick."""
    all2all_backend: str = DEFAULT_ALL2ALL_BACKEND
    """How an EP group spanning DP ranks exchanges tokens (ServeRequest.all2all_backend)."""
    enable_dbo: bool = False
    """Dual-batch overlap of that exchange (ServeRequest.enable_dbo)."""
    async_scheduling: bool | None = None
    """--async-scheduling / --no-async-scheduling as asked (ServeRequest.async_scheduling);
    None = the engine's default."""
    tokenizer_workers: int = 1
    """Tokenizer threads per API server (ServeRequest.tokenizer_workers); 1 = the default."""
    speculation: Speculation | None = None
    """Speculative decoding (ServeRequest.speculation); None = off."""
    priced_batched_tokens: int | None = None
    """The token budget per step the plan priced (--max-num-batched-tokens or the release's
    default for the layout): what an engine with another default must be told to run."""
    trust_remote_code: bool = False
    """The checkpoint's own code must run (ModelSpec.trust_remote_code): --trust-remote-code."""
    is_moe: bool = False
    """The model has routed experts: vLLM shards a deployment's MoE layers over all of its
    TP x DP ranks, so replicas planned apart (ep = 1) must be deployments apart."""
    enable_chunked_prefill: bool = False
    """vLLM's V0 engine (0.6.6.post1) chunks the prompts as planned only when told to
    (`--enable-chunked-prefill`; serving_memory.v0_chunked_prefill); V1 always chunks."""

    @property
    def layout(self) -> Layout:
        from planner.layout import Layout  # planner.layout loads the specs; `plan --help` need not

        return Layout(self.tp, self.pp, self.dp, self.ep)

    @property
    def gpus_per_ep_group(self) -> int:
        """The GPUs of one EP group, all its pipeline stages: one engine deployment."""
        return self.layout.dp_per_ep_group * self.tp * self.pp


def env_prefix(**variables: str) -> tuple[str, ...]:
    """`env NAME=VALUE ...` before a command: the variables its process must start with (a
    PerNode value keeps NAME=VALUE a PerNode, so each node's shell expands it)."""
    if not variables:
        return ()
    return ("env", *(PerNode(f"{name}={value}") if isinstance(value, PerNode) else f"{name}={value}"
                     for name, value in variables.items()))


def placement_reasons(tp: int, pp: int, dp: int, gpus_per_node: int, ep: int = 1) -> list[str]:
    """Why vLLM and SGLang cannot launch this layout as planned (rank order DP x PP x TP,
    consecutive GPUs): a replica wider than a node runs on `--nnodes k` nodes with the same
    number of GPUs on each (vLLM EngineArgs.create_engine_config and SGLang
    check_server_args both require nnodes to divide tp*pp), and replicas never share a node
    unless they pack into it whole. With several EP groups each is its own deployment, so
    the same holds for a group's GPUs: whole nodes each, or packed whole into a node."""
    from planner.layout import Layout  # as in ServeArgs.layout

    layout = Layout(tp, pp, dp, ep)
    group_gpus = layout.dp_per_ep_group * tp * pp
    if ep > 1 and layout.num_ep_groups > 1 and (group_gpus % gpus_per_node and gpus_per_node % group_gpus):
        return [f"EP groups of {group_gpus} GPUs would share nodes of {gpus_per_node}"]
    size = tp * pp
    nodes_per_replica = -(-size // gpus_per_node)
    if nodes_per_replica > 1 and size % nodes_per_replica:
        return [f"a replica of {size} GPUs does not split evenly over {nodes_per_replica} nodes"]
    per_node = size // nodes_per_replica if nodes_per_replica > 1 else size
    if nodes_per_replica > 1 and per_node % tp and tp % per_node:
        # the engines put tp*pp/nnodes ranks on each node, TP innermost: a TP group would cross
        # a node boundary (TP is priced over NVLink)
        return [f"a replica of {size} GPUs over {nodes_per_replica} nodes has {per_node} on each, "
                f"which splits its TP groups of {tp}"]
    if nodes_per_replica > 1 and dp > 1 and size % gpus_per_node:
        return [f"replicas of {size} GPUs would share nodes of {gpus_per_node}"]
    if nodes_per_replica == 1 and size * dp > gpus_per_node and gpus_per_node % size:
        return [f"replicas of {size} GPUs straddle nodes of {gpus_per_node}"]
    return []


def kv_window_fields(model: ModelSpec, stage: StageMemory, request: ServeRequest) -> dict:
    """ServeArgs' window-layer fields for one stage's GPU (what SGLang pools apart:
    emit/sglang.pool_sequences) and the request's lengths."""
    return {
        "kv_window_bytes_per_token": stage.window_kv_bytes_per_token,
        "kv_full_bytes_per_token": stage.kv_bytes_per_token - stage.window_kv_bytes_per_token,
        "kv_window_tokens": model.kv_window_tokens or 0,
        "prompt_tokens": request.input_len,
        "output_tokens": request.output_len,
        "context_tokens": request.decode_context_tokens,
        "architecture": model.architecture or ("Llama4ForConditionalGeneration" if model.attention_chunk_size else None),
    }


def serve_launch_args(model: ModelSpec, cluster: ClusterSpec, request: ServeRequest, layout: Layout,
                      stages: Sequence[StageMemory], max_model_len: int, max_num_seqs: int,
                      model_arg: str) -> ServeArgs:
    """The serving launch arguments of a layout as planned: its stages' memory (the fullest
    stage's weights and KV), max_num_seqs sequences per replica; the token budget left implicit
    where it is the engine's own default for the layout (256 under batched DP MoE)."""
    from planner.cost.serving_memory import (
        kv_bytes_per_sequence,
        max_num_batched_tokens,
        pre_load_free_bytes,
        v0_chunked_prefill,
    )

    budget = request.max_num_batched_tokens
    default_budget = max_num_batched_tokens(cluster, replace(request, max_num_batched_tokens=None), layout, model)
    fullest = max(stages, key=lambda s: s.weights_bytes + s.kv_cache_bytes)
    return ServeArgs(
        model=model_arg,
        tp=layout.tp,
        pp=layout.pp,
        dp=layout.dp,
        ep=layout.ep,
        gpus_per_node=cluster.gpus_per_node,
        gpu_memory_utilization=request.gpu_memory_utilization,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        quantization=request.quantization_override,
        kv_cache_dtype=request.kv_cache_dtype,
        moe_backend=request.moe_backend,
        all2all_backend=request.all2all_backend,
        enable_dbo=request.enable_dbo,
        async_scheduling=request.async_scheduling,
        tokenizer_workers=request.tokenizer_workers,
        speculation=request.speculation,
        dtype=model.dtype,
        trust_remote_code=model.trust_remote_code,
        engine_versions=request.engine_versions,
        max_num_batched_tokens=budget if budget not in (None, default_budget) else None,
        gpu_memory_bytes=cluster.gpu.memory_bytes,
        load_free_bytes=pre_load_free_bytes(cluster.gpu.cuda_visible_memory_bytes, layout),
        weights_and_kv_bytes_per_gpu=fullest.weights_bytes + fullest.kv_cache_bytes,
        kv_cache_bytes_per_gpu=fullest.kv_cache_bytes,
        kv_bytes_per_sequence=kv_bytes_per_sequence(fullest, request.input_len, request.output_len,
                                                    request.decode_context_tokens),
        **kv_window_fields(model, fullest, request),
        is_moe=model.is_moe,
        priced_batched_tokens=max_num_batched_tokens(cluster, request, layout, model),
        enable_chunked_prefill=(not request.engine_versions.vllm_release.v1_engine
                                and v0_chunked_prefill(model, request)),
    )
