"""Disaggregated prefill/decode launch commands, one step per role (prefill servers, decode
servers, the proxy that pairs them), for the releases in planner/engines.py.

Every node that holds prefill workers runs one prefill server (its workers as data-parallel
ranks of it, `CUDA_VISIBLE_DEVICES` naming its GPUs), likewise for decode; the proxy on node 0
sends each request to a prefill server, then to a decode server that pulls the prompt's KV.

- vLLM 0.33.0: `--kv-transfer-config` with NixlConnector, NixlPushConnector where the prefill
  worker pipelines (nixl_connector) (vllm/config/kv_transfer.py: kv_role
  kv_producer | kv_consumer | kv_both); two servers on one node need distinct NIXL side-channel
  ports (envs.py VLLM_NIXL_SIDE_CHANNEL_PORT, default 5600). The proxy is vLLM's
  tests/v1/kv_connector/nixl_integration/toy_proxy_server.py from the release's source tree
  (--host --port --prefiller-hosts --prefiller-ports --decoder-hosts --decoder-ports).
- SGLang 0.5.10.post1: `--disaggregation-mode prefill|decode`, `--disaggregation-transfer-backend
  nixl`, the prefill's `--disaggregation-bootstrap-port` (server_args.py); the router
  (sglang_router.launch_router) with `--pd-disaggregation --prefill URL BOOTSTRAP_PORT --decode URL`.
An expert-parallel worker (tp * d GPUs, d DP ranks sharing the experts) is one server of its
own: vLLM `--data-parallel-size d --enable-expert-parallel`, SGLang `--tp-size tp*d
--attn-dp-size d --ep-size tp*d` at 0.5.23 (`--dp-size d --enable-dp-attention` at
0.5.10.post1; emit/sglang.ep_server). Several on one node run side by side: server s on its
own GPUs (CUDA_VISIBLE_DEVICES), at the role's port + s (vLLM; SGLang + 20 s, its prefill and
decode ports interleaved) with its own NIXL side-channel range (vLLM: base + s * d) or
bootstrap port (SGLang prefill: 8998 + s); the proxy or router names each server.

Servers on different nodes (vLLM): each node's servers set VLLM_NIXL_SIDE_CHANNEL_HOST to the
node's own address. The NIXL scheduler listens for the KV handshake on that host (default
localhost) at VLLM_NIXL_SIDE_CHANNEL_PORT + its DP index, and hands the same host to the peer
that pulls the KV (vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py and
pull_scheduler.py, vllm/envs.py, 0.33.0): left at localhost, a decode server on another node
would look for the prompt's KV on its own node.

Workers wider than a node (vLLM): each is a deployment of its own on whole nodes, launched as an
aggregated one of that shape is (emit/vllm.py: `--nnodes/--node-rank/--master-addr` for a
replica wider than a node, `--data-parallel-size-local ... --headless` for an EP group's DP
ranks over several nodes), every node with the role's connector flags; the role with the
widest workers takes the first nodes, so every deployment starts at a multiple of its width.
SGLang likewise: a worker wider than a node is one server over k nodes (`--nnodes k --node-rank
r --dist-init-addr` its first node, emit/sglang.wide_server_steps), with the role's flags.
Not emitted (None; the CLI says so): a worker that does not split evenly over whole nodes, or
widths that do not align.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from planner.emit.command import NODE_ADDRESS, LaunchStep, NodeSet, PerNode, ServeArgs, env_prefix
from planner.emit.sglang import PORT_STRIDE, ep_server, server_env, server_flags, wide_server_steps
from planner.emit.vllm import Extras, deployment_steps_from, engine_flags

VLLM_PREFILL_PORT, VLLM_DECODE_PORT, PROXY_PORT = 8100, 8200, 8000
NIXL_SIDE_CHANNEL_PORTS = {"prefill": 5600, "decode": 5800}
SGLANG_PREFILL_PORT, SGLANG_DECODE_PORT, SGLANG_BOOTSTRAP_PORT = 30000, 30000 + PORT_STRIDE, 8998
VLLM_PROXY = ("python3", "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py")
KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
COPY_PORT_SHIFT = 1000
"""What every port of copy k of a deployment on a node moves by, times k: more than any role's
ports span within one copy (a role's servers take base + slot, vLLM's side channels base + s*d,
SGLang's base + PORT_STRIDE), and 8000 + 100 + slot of one copy never meets another copy's
proxy, servers or side channels (a shift of 100 had put copy 1's proxy on copy 0's prefill port,
a CLI read). tests/disagg/test_copy_ports.py checks it on the emitted commands."""


@dataclass(frozen=True)
class RoleServers:
    """The servers of one role: the nodes running the same command, their local workers, GPUs."""

    nodes: NodeSet
    workers_per_node: int
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class DisaggDeployment:
    """Where each role runs: from the plan's DisaggEstimate (disagg_search.py)."""

    prefill: ServeArgs
    decode: ServeArgs
    num_prefill: int
    num_decode: int
    same_node_groups: int
    """m > 0: m identical nodes each holding both roles; 0: prefill nodes first, then decode."""


def _role_servers(first_node: int, workers: int, gpus_per_worker: int, gpn: int,
                  first_gpu: int = 0) -> list[RoleServers]:
    per_node = max(1, gpn // gpus_per_worker)
    full, rest = divmod(workers, per_node)
    out = []
    if full:
        out.append(RoleServers(NodeSet(first_node, full), per_node,
                               tuple(range(first_gpu, first_gpu + per_node * gpus_per_worker))))
    if rest:
        out.append(RoleServers(NodeSet(first_node + full), rest,
                               tuple(range(first_gpu, first_gpu + rest * gpus_per_worker))))
    return out


def worker_gpus(args: ServeArgs) -> int:
    """GPUs of one worker: tp * pp, times its DP ranks when it is an EP worker."""
    return args.tp * args.pp * args.layout.dp_per_ep_group


@dataclass(frozen=True)
class WideRole:
    """A role whose workers are wider than a node: worker w is a deployment of its own on
    nodes first_node + w * nodes_per_worker onwards."""

    first_node: int
    workers: int
    nodes_per_worker: int

    @property
    def heads(self) -> list[int]:
        """Each worker's first node, where its API server runs."""
        return [self.first_node + w * self.nodes_per_worker for w in range(self.workers)]


Where = dict[str, "list[RoleServers] | WideRole"]


def placements(d: DisaggDeployment) -> Where | None:
    """Each role's servers; None when they cannot be laid out on whole nodes (the module's doc)."""
    gpn = d.prefill.gpus_per_node
    p_gpus, d_gpus = worker_gpus(d.prefill), worker_gpus(d.decode)
    m = d.same_node_groups
    if m:
        p_local = d.num_prefill // m
        return {"prefill": [RoleServers(NodeSet(0, m), p_local, tuple(range(p_local * p_gpus)))],
                "decode": [RoleServers(NodeSet(0, m), d.num_decode // m,
                                       tuple(range(p_local * p_gpus, p_local * p_gpus + d.num_decode // m * d_gpus)))]}
    sizes = {"prefill": (d.num_prefill, p_gpus), "decode": (d.num_decode, d_gpus)}
    if any(gpus > gpn and gpus % gpn for _, gpus in sizes.values()):
        return None
    width = {role: -(-gpus // gpn) for role, (_, gpus) in sizes.items()}
    where: Where = {}
    first = 0
    for role in sorted(sizes, key=lambda r: -width[r]):  # stable: prefill first at equal widths
        workers, gpus = sizes[role]
        if gpus > gpn:
            if first % width[role]:
                return None
            where[role] = WideRole(first, workers, width[role])
            first += workers * width[role]
        else:
            servers = _role_servers(first, workers, gpus, gpn)
            where[role] = servers
            first = max(s.nodes.first + s.nodes.length for s in servers)
    return where


@dataclass(frozen=True)
class Server:
    """One API server of a role that fits a node, run alike on every node of `nodes`."""

    nodes: NodeSet
    gpus: tuple[int, ...]
    slot: int
    """Its place on the node among the role's servers there: its ports are the role's + slot."""
    ranks: int
    """Its DP ranks: the node's workers of the role, or an EP worker's own DP ranks."""


def _servers(args: ServeArgs, role_servers: list[RoleServers], moe_apart: bool = False) -> list[Server]:
    """One server per node for workers without EP (its workers as DP ranks behind one address);
    an EP worker is a server of its own, several to a node side by side (CUDA_VISIBLE_DEVICES,
    ports); `moe_apart` (vLLM): an MoE model's workers without EP too, since one vLLM server's
    DP ranks would split its experts between them."""
    if args.ep == 1 and not (moe_apart and args.is_moe):
        return [Server(s.nodes, s.gpus, 0, s.workers_per_node) for s in role_servers]
    size = worker_gpus(args)
    return [Server(s.nodes, s.gpus[k * size:(k + 1) * size], k, args.dp)
            for s in role_servers for k in range(s.workers_per_node)]


def _single_node(where: Where) -> bool:
    """Every server on node 0: the side channels and the proxy stay on localhost."""
    return all(not isinstance(ss, WideRole) and all(s.nodes.count == 1 and s.nodes.first == 0 for s in ss)
               for ss in where.values())


def _endpoints(args: ServeArgs, servers: list[RoleServers] | WideRole, single_node: bool,
               moe_apart: bool = False) -> list[tuple[str, int]]:
    """(address, slot) of each of the role's API servers, as the proxy or router names them."""
    if isinstance(servers, WideRole):
        return [(f"NODE{n}_IP", 0) for n in servers.heads]
    return [("localhost" if single_node else f"NODE{n}_IP", server.slot)
            for server in _servers(args, servers, moe_apart) for n in server.nodes]


def _side_channel_host(nodes: NodeSet | None) -> str:
    """VLLM_NIXL_SIDE_CHANNEL_HOST for a step's nodes: the one node's placeholder, else each
    node's own address (None: several nodes' steps)."""
    if nodes is not None and nodes.count == 1:
        return f"NODE{nodes.first}_IP"
    return PerNode(f"${NODE_ADDRESS}")


def _visible(gpus: tuple[int, ...]) -> str:
    return ",".join(str(g) for g in gpus)


def nixl_connector(prefill: ServeArgs) -> str:
    """The NIXL connector both roles name (they must agree: the handshake's compatibility hash
    holds the transfer mode, nixl/metadata.py at 0.33.0). NixlConnector is the pull (READ)
    connector, whose decode side reads from the prefill's stage 0 only; a prefill worker with
    pipeline stages needs the push (WRITE) connector, where each stage writes its layers into
    the pp = 1 decode worker (nixl/base_worker.py: "PP>1 (push mode)", nixl/connector.py)."""
    return "NixlPushConnector" if prefill.pp > 1 else "NixlConnector"


def vllm_disagg_steps(d: DisaggDeployment) -> tuple[LaunchStep, ...] | None:
    where = placements(d)
    if where is None:
        return None
    single = _single_node(where)
    steps = []
    ports = {"prefill": VLLM_PREFILL_PORT, "decode": VLLM_DECODE_PORT}
    for role in where:  # the order of the nodes: the widest workers first
        args = d.prefill if role == "prefill" else d.decode
        config = json.dumps({"kv_connector": nixl_connector(d.prefill), "kv_role": KV_ROLE[role]},
                            separators=(",", ":"))
        servers = where[role]
        if isinstance(servers, WideRole):
            env = env_prefix(VLLM_NIXL_SIDE_CHANNEL_HOST=_side_channel_host(None),
                             VLLM_NIXL_SIDE_CHANNEL_PORT=str(NIXL_SIDE_CHANNEL_PORTS[role]))
            flags = ("--port", str(ports[role]), "--kv-transfer-config", config)
            for step in deployment_steps_from(args, servers.workers, servers.first_node, Extras(env, flags)):
                steps.append(LaunchStep(f"{role} {step.role}", step.nodes, step.argv))
            continue
        for server in _servers(args, servers, moe_apart=True):
            dp = ("--data-parallel-size", str(server.ranks)) if server.ranks > 1 else ()
            host = {} if single else {"VLLM_NIXL_SIDE_CHANNEL_HOST": _side_channel_host(server.nodes)}
            # each DP rank listens on the base + its DP index: side-by-side servers take
            # consecutive ranges
            side_port = NIXL_SIDE_CHANNEL_PORTS[role] + server.slot * server.ranks
            env = env_prefix(CUDA_VISIBLE_DEVICES=_visible(server.gpus), **host,
                             VLLM_NIXL_SIDE_CHANNEL_PORT=str(side_port))
            steps.append(LaunchStep(role, server.nodes, (
                *env, "vllm", "serve", args.model, *engine_flags(args), *dp,
                "--port", str(ports[role] + server.slot), "--kv-transfer-config", config)))
    prefill = _endpoints(d.prefill, where["prefill"], single, moe_apart=True)
    decode = _endpoints(d.decode, where["decode"], single, moe_apart=True)
    steps.append(LaunchStep("proxy", NodeSet(0), (
        *VLLM_PROXY, "--host", "0.0.0.0", "--port", str(PROXY_PORT),
        "--prefiller-hosts", *[h for h, _ in prefill],
        "--prefiller-ports", *[str(VLLM_PREFILL_PORT + slot) for _, slot in prefill],
        "--decoder-hosts", *[h for h, _ in decode],
        "--decoder-ports", *[str(VLLM_DECODE_PORT + slot) for _, slot in decode])))
    return tuple(steps)


def sglang_port(role_port: int, slot: int) -> int:
    """The server's --port: the role's (prefill 30000, decode 30010), then every
    2 * PORT_STRIDE: prefill and decode servers side by side on one node, their ZMQ blocks
    (--port + 233 to + 239 with attention DP, emit/sglang.PORT_STRIDE) included, never meet."""
    return role_port + 2 * PORT_STRIDE * slot


def sglang_pp_speculation(d: DisaggDeployment) -> bool:
    """A worker over pipeline stages with speculative decoding: SGLang 0.5.23 runs that on
    prefill nodes only without SGLANG_ENABLE_PP_SPEC, and with it only without disaggregation
    (validation_hook.check_pipeline_parallel_compat), so a decode worker cannot have it and the
    env would break the prefill one: not emitted."""
    return d.prefill.speculation is not None and (d.prefill.pp > 1 or d.decode.pp > 1)


def sglang_disagg_steps(d: DisaggDeployment) -> tuple[LaunchStep, ...] | None:
    where = placements(d)
    if where is None or sglang_pp_speculation(d):
        return None
    launcher = d.prefill.engine_versions.sglang_release.launcher
    steps = []
    ports = {"prefill": SGLANG_PREFILL_PORT, "decode": SGLANG_DECODE_PORT}
    for role in where:  # the order of the nodes: the widest workers first
        args = d.prefill if role == "prefill" else d.decode

        def role_flags(slot: int, role: str = role) -> tuple[str, ...]:
            bootstrap = ("--disaggregation-bootstrap-port", str(SGLANG_BOOTSTRAP_PORT + slot)) \
                if role == "prefill" else ()
            return ("--disaggregation-mode", role, "--disaggregation-transfer-backend", "nixl", *bootstrap,
                    "--host", "0.0.0.0", "--port", str(sglang_port(ports[role], slot)))

        servers = where[role]
        if isinstance(servers, WideRole):
            steps += wide_server_steps(args, servers.workers, servers.first_node, role_flags(0), role,
                                       mixed=False)
            continue
        for server in _servers(args, servers):
            engine_args, ep_flags = ep_server(args) if args.ep > 1 else (args, ())
            steps.append(LaunchStep(role, server.nodes, (
                *env_prefix(CUDA_VISIBLE_DEVICES=_visible(server.gpus), **server_env(args)), *launcher,
                *server_flags(engine_args, 1 if args.ep > 1 else server.ranks, ep_flags, mixed=False),
                *role_flags(server.slot))))
    single = _single_node(where)
    router = [*d.prefill.engine_versions.sglang_release.router_launcher, "--pd-disaggregation"]
    for host, slot in _endpoints(d.prefill, where["prefill"], single):
        router += ["--prefill", f"http://{host}:{sglang_port(SGLANG_PREFILL_PORT, slot)}",
                   str(SGLANG_BOOTSTRAP_PORT + slot)]
    for host, slot in _endpoints(d.decode, where["decode"], single):
        router += ["--decode", f"http://{host}:{sglang_port(SGLANG_DECODE_PORT, slot)}"]
    steps.append(LaunchStep("router", NodeSet(0), (*router, "--host", "0.0.0.0", "--port", str(PROXY_PORT))))
    return tuple(steps)


def not_emitted_reason(d: DisaggDeployment, engine: str) -> str:
    """Why DISAGG_EMITTERS[engine](d) is None, as a clause."""
    if engine == "sglang" and sglang_pp_speculation(d):
        return ("SGLang 0.5.23 runs speculative decoding over pipeline stages only on prefill nodes or without "
                "disaggregation, and this deployment has a worker over pipeline stages")
    gpn = d.prefill.gpus_per_node
    for role, args in (("prefill", d.prefill), ("decode", d.decode)):
        gpus = worker_gpus(args)
        if gpus > gpn and gpus % gpn:
            return f"a {role} worker of {gpus} GPUs does not fill whole nodes of {gpn} GPUs"
    assert placements(d) is None, f"{engine} emits this deployment"
    return "the prefill and decode workers' widths in nodes do not align (each deployment starts at a multiple " \
           "of its width)"


DISAGG_EMITTERS = {"vllm": vllm_disagg_steps, "vllm-ray": vllm_disagg_steps, "sglang": sglang_disagg_steps}
