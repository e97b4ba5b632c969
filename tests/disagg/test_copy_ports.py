"""Several copies of a disaggregated deployment on one node: the note moves every port of copy k
by COPY_PORT_SHIFT * k. No port of one copy may meet another copy's (a shift of 100 had put copy
1's proxy on copy 0's prefill port 8100 and its prefill on copy 0's decode port 8200: a CLI read).

Each port is taken with what its server derives from it: vLLM's NIXL side channels base + rank
(up to the node's 8 GPUs), an SGLang server's port + PORT_STRIDE (the stride its emitter leaves
between servers); a proxy's, a vLLM server's and a bootstrap port are one port each (a role's
servers on one node are listed each with its own port)."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.emit.disagg import COPY_PORT_SHIFT
from planner.emit.sglang import PORT_STRIDE

SIDE_CHANNEL_SPAN = 8
CASES = [
    ["--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--max-e2e-ms", "2500"],
    ["--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--max-e2e-ms", "2500", "--emit", "sglang"],
]


def ports_of(argv: list[str]) -> set[int]:
    """Every port an argv names or derives: the value(s) after a flag with "port" in its name,
    and environment assignments whose name has PORT, each with its span (module docstring)."""
    ports: set[int] = set()
    sglang_server = "sglang" in argv and "serve" in argv
    for i, arg in enumerate(argv):
        env = re.fullmatch(r"[A-Z_]*PORT[A-Z_]*=(\d+)", arg)
        if env:
            ports |= set(range(int(env[1]), int(env[1]) + SIDE_CHANNEL_SPAN))
        if arg.startswith("--") and "port" in arg:
            span = PORT_STRIDE if sglang_server and arg == "--port" else 1
            for value in argv[i + 1:]:
                if not value.isdigit():
                    break
                ports |= set(range(int(value), int(value) + span))
    return ports


@pytest.mark.parametrize("args", CASES, ids=lambda a: " ".join(a[-2:]))
def test_copies_on_one_node_never_share_a_port(args: list[str]) -> None:
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    best = json.loads(result.output)["recommended"]
    assert best["copies"] >= 2 and best["same_node"]
    ports = set().union(*(ports_of(step["argv"]) for step in best["launch"]))
    assert len(ports) >= 3  # proxy, prefill, decode at least
    text = CliRunner().invoke(app, args).output
    per_node = int(re.search(r"up to (\d+) copies a node", " ".join(text.split()))[1])
    assert f"moved by {COPY_PORT_SHIFT}k" in " ".join(text.split())
    taken = [{p + COPY_PORT_SHIFT * k for p in ports} for k in range(per_node)]
    for j in range(per_node):
        for k in range(j + 1, per_node):
            assert not taken[j] & taken[k], (j, k, sorted(ports))


def test_a_shift_of_100_would_collide() -> None:
    """The check can fail: copy 1 at +100 takes 8100, copy 0's prefill port."""
    ports = ports_of(["python3", "proxy.py", "--port", "8000", "--prefiller-ports", "8100", "--decoder-ports", "8200"])
    assert ports == {8000, 8100, 8200} and {p + 100 for p in ports} & ports
