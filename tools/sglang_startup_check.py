"""Parse every `sglang serve` command of the serving sweep with SGLang's own parser and build
its ServerArgs, on CPU, and report which fail.

    PYTHONPATH=/tmp/sgl/unz python tools/sglang_startup_check.py

Run by hand with a Python that imports the planner and `sglang.srt.server_args` (the unpacked
0.5.23 wheel on PYTHONPATH and its parser's few dependencies; docs/engine-checks.md lists
them); the CI gate stays the static flag check (tests/test_engine_flags.py). For each command:
ServerArgs.add_cli_args on a fresh parser, parse_args on the arguments after `sglang serve`
(argparse exits on an unknown flag or a value outside its choices), then
ServerArgs.from_cli_args. In 0.5.23 ServerArgs.__post_init__ does nothing: the startup checks
(check_server_args, the memory settings) run in ServerArgs.resolve_once, which loads the
model's HF config and imports the runtime (sgl-kernel, tvm_ffi, transformers); this tool
stops before it (docs/engine-checks.md says why).

The sweep is the one tests/test_engine_flags.py checks statically: every shipped model on
every shipped cluster, every launchable layout, `--emit sglang`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path


def sweep_commands() -> list[tuple[str, tuple[str, ...]]]:
    from planner.catalog import resolve_cluster, resolve_model, shipped_clusters, shipped_models
    from planner.requests import ServeRequest
    from planner.serve_cli import launch_steps, launchable
    from planner.serve_search import plan_serving

    commands, seen = [], set()
    for model_name in shipped_models():
        for cluster_name in shipped_clusters():
            plan = launchable(plan_serving(resolve_model(model_name), resolve_cluster(cluster_name), ServeRequest()))
            for result in plan.layouts:
                for step in launch_steps(plan, result, "sglang", "MODEL"):
                    if step.argv[:2] == ("sglang", "serve") and step.argv not in seen:
                        seen.add(step.argv)
                        commands.append((f"{model_name} {cluster_name} {result.layout}", step.argv))
    return commands


def check(argv: tuple[str, ...]) -> str | None:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    # per-node placeholders ($NODE_RANK, $REPLICA_HEAD_IP) as the values a node would have
    args = [a.replace("$NODE_RANK", "1").replace("$REPLICA_HEAD_IP", "10.0.0.1") for a in argv[2:]]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            namespace = parser.parse_args(args)
        ServerArgs.from_cli_args(namespace)
    except SystemExit:
        return "argparse: " + (err.getvalue().strip().splitlines() or ["exit"])[-1]
    except Exception as exc:  # noqa: BLE001 - any failure is the report
        return f"{type(exc).__name__}: {exc}"
    deprecated = [line for line in err.getvalue().splitlines() if "deprecated" in line.lower()]
    return f"deprecated: {deprecated[0]}" if deprecated else None


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from sglang.version import __version__

    commands = sweep_commands()
    failures = [(label, argv, error) for label, argv in commands if (error := check(argv))]
    print(f"SGLang {__version__}: {len(commands)} distinct `sglang serve` commands, {len(failures)} fail")
    for label, argv, error in failures[:20]:
        print(f"  {label}: {error}\n    {' '.join(argv)}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
