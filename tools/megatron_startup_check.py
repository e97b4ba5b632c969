"""Run Megatron-LM's own startup checks (megatron.training.arguments: parse_args, then
validate_args) on every Megatron command of a training sweep, on CPU, and report which fail.

    python tools/megatron_startup_check.py /tmp/megatron-019 --version core_v0.19.0
    python tools/megatron_startup_check.py /tmp/megatron-014 --version core_v0.14.0 --quick

REPO is an unpacked Megatron-LM tree (`git archive core_v0.19.0 | tar -x -C REPO`). Run by hand
with a Python that has torch (CPU is enough) and the planner importable; the CI gate stays the
static flag check (tests/test_engine_flags.py). For each command:

- the environment of its `env` prefix is set (CUDA_DEVICE_MAX_CONNECTIONS), WORLD_SIZE = the
  command's GPU count (nnodes x nproc-per-node), RANK = 0, LOCAL_RANK = 0;
- parse_args(ignore_unknown_args=False) on the arguments after pretrain_gpt.py plus USER_ARGS
  (the data, tokenizer and optimizer settings the emitter leaves to the user: mock data, a
  null tokenizer of the model's vocabulary, a train length and a learning rate);
- validate_args(args), then core_transformer_config_from_args(args) (the model provider's first
  step: TransformerConfig.__post_init__ checks TP against the query groups, the pipeline split).

What cannot run on CPU is replaced, and only that (see `shim`): Transformer Engine and Apex
are absent, so `is_te_min_version` answers True and `get_te_version` TE_VERSION (a current TE
is assumed, as on the clusters planned for), in every loaded megatron module that binds them
(megatron.core.utils, megatron.core.transformer.transformer_config, ...); the GPU queries `get_device_arch_version` answer 9 and
`torch.cuda.get_device_capability` (9, 0) (H100), as imported by megatron.core.utils and
megatron.training.arguments; TE's fused RoPE kernel (rope_utils.fused_apply_rotary_pos_emb,
checked for by TransformerConfig.__post_init__) is a placeholder; on Python 3.11 `typing.override` (3.12) is an identity decorator.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

MODELS = ("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "mixtral-8x7b", "qwen2.5-72b", "deepseek-v3",
          "gpt3-175b")
CLUSTERS = ("1x8xH100", "4x8xH100", "16x8xA100", "128x8xH100")
TOP = 3
"""Commands per plan: its top configurations."""
GLOBAL_BATCH, SEQ_LEN = 512, 4096
TE_VERSION = "2.10.0"
"""What get_te_version answers: the Transformer Engine assumed on the cluster."""


def user_args(vocab_size: int) -> list[str]:
    """What a user adds to the printed command before it trains (not the planner's part)."""
    return ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(vocab_size),
            "--train-iters", "10", "--lr", "1e-4"]


def shim(repo: Path) -> list[str]:
    """Make megatron importable and its GPU / Transformer Engine queries answer on CPU; returns
    what was replaced, for the report."""
    sys.path.insert(0, str(repo))
    import typing

    import torch

    done = []
    if not hasattr(typing, "override"):  # Python 3.12's decorator, used by core_v0.19.0's training/models
        typing.override = lambda f: f
        done.append("typing.override (Python < 3.12) -> identity")
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    done.append("torch.cuda.get_device_capability -> (9, 0)")
    import megatron.training.arguments  # noqa: F401 - loads the modules whose bindings are replaced
    from packaging.version import Version

    fakes = {"is_te_min_version": lambda *a, **k: True, "get_device_arch_version": lambda: 9,
             "get_te_version": lambda: Version(TE_VERSION)}
    # each module binds its own name (`from megatron.core.utils import is_te_min_version`)
    for name, module in sorted(sys.modules.items()):
        for fake_name, fake in fakes.items():
            if name.startswith("megatron") and hasattr(module, fake_name):
                setattr(module, fake_name, fake)
                done.append(f"{name}.{fake_name}")
    import megatron.core.models.common.embeddings.rope_utils as rope_utils

    if rope_utils.fused_apply_rotary_pos_emb is None:  # TE's fused RoPE kernel (--apply-rope-fusion default)
        rope_utils.fused_apply_rotary_pos_emb = lambda *a, **k: None
        done.append("rope_utils.fused_apply_rotary_pos_emb (TE kernel) -> placeholder")
    return done


@dataclass
class Outcome:
    label: str
    argv: tuple[str, ...]
    error: str | None


def split_env(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    env = {}
    if argv[0] == "env":
        argv = argv[1:]
        while "=" in argv[0] and not argv[0].startswith("-"):
            name, _, value = argv.pop(0).partition("=")
            env[name] = value
    return env, argv


def world_size(torchrun: list[str]) -> int:
    def value(flag: str) -> int:
        return int(torchrun[torchrun.index(flag) + 1]) if flag in torchrun else 1
    return value("--nnodes") * value("--nproc-per-node")


def check(argv: tuple[str, ...], vocab_size: int) -> str | None:
    """None if parse_args and validate_args accept the command, else the first error line."""
    import megatron.training.arguments as arguments

    env, rest = split_env(list(argv))
    script = rest.index("pretrain_gpt.py")
    saved_env, saved_argv = dict(os.environ), sys.argv
    os.environ.update(env, WORLD_SIZE=str(world_size(rest[:script])), RANK="0", LOCAL_RANK="0")
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None) if "CUDA_DEVICE_MAX_CONNECTIONS" not in env else None
    sys.argv = ["pretrain_gpt.py", *rest[script + 1:], *user_args(vocab_size)]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = arguments.parse_args(ignore_unknown_args=False)
            arguments.validate_args(args)
            # what pretrain_gpt.py's model provider builds first: TransformerConfig.__post_init__
            arguments.core_transformer_config_from_args(args)
        return None
    except SystemExit:
        return "parse_args: " + (err.getvalue().strip().splitlines() or ["exit"])[-1]
    except Exception as exc:  # noqa: BLE001 - any startup failure is the report
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        return f"{type(exc).__name__} at {Path(frame.filename).name}:{frame.lineno}: {str(exc).strip()[:300]}"
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv


def requests(cluster_name: str, version: str):
    from planner.engines import EngineVersions
    from planner.requests import TrainRequest

    versions = EngineVersions(megatron=version)
    # recompute None: the search's own level, full recompute of only some layers included (block)
    for zero, recompute, schedule in itertools.product((0, 1, 2, 3), ("none", "selective", "full", None),
                                                       ("1f1b", "interleaved")):
        yield f"zero={zero} recompute={recompute} schedule={schedule}", TrainRequest(
            global_batch=GLOBAL_BATCH, seq_len=SEQ_LEN, zero_stage=zero, recompute=recompute, schedule=schedule,
            engine_versions=versions)
    yield "grad-reduce=bf16", TrainRequest(global_batch=GLOBAL_BATCH, seq_len=SEQ_LEN, grad_reduce="bf16",
                                           engine_versions=versions)
    if "H100" in cluster_name:
        yield "precision=fp8", TrainRequest(global_batch=GLOBAL_BATCH, seq_len=SEQ_LEN, precision="fp8",
                                            engine_versions=versions)


def sweep(version: str, models: tuple[str, ...], clusters: tuple[str, ...]) -> list[Outcome]:
    from planner.catalog import resolve_cluster, resolve_model
    from planner.emit.megatron import megatron_steps
    from planner.train_cli import launchable
    from planner.train_search import search

    outcomes, seen = [], set()
    for model_name, cluster_name in itertools.product(models, clusters):
        model, cluster = resolve_model(model_name), resolve_cluster(cluster_name)
        for label, request in requests(cluster_name, version):
            plan = launchable(model, search(model, cluster, request))
            for estimate in plan.layouts[:TOP]:
                for step in megatron_steps(model, cluster, estimate.config, GLOBAL_BATCH, SEQ_LEN,
                                           request.engine_versions.megatron_release):
                    if step.argv in seen:
                        continue
                    seen.add(step.argv)
                    outcomes.append(Outcome(f"{model_name} {cluster_name} {label}: {estimate.config}", step.argv,
                                            check(step.argv, model.vocab_size)))
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", type=Path, help="unpacked Megatron-LM tree at the release")
    parser.add_argument("--version", required=True, help="the planner's release name, e.g. core_v0.19.0")
    parser.add_argument("--quick", action="store_true", help="one model on one cluster")
    parser.add_argument("--show", type=int, default=3, help="commands shown per distinct error")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    replaced = shim(args.repo)
    models, clusters = (MODELS[:1], CLUSTERS[:1]) if args.quick else (MODELS, CLUSTERS)
    outcomes = sweep(args.version, models, clusters)
    failed = [o for o in outcomes if o.error]
    print(f"Megatron-LM {args.version} ({args.repo}): {len(outcomes)} distinct commands, {len(failed)} fail")
    print("replaced on CPU: " + "; ".join(replaced))
    by_error: dict[str, list[Outcome]] = {}
    for outcome in failed:
        by_error.setdefault(outcome.error, []).append(outcome)
    for error, group in sorted(by_error.items(), key=lambda kv: -len(kv[1])):
        print(f"\n{len(group)} x {error}")
        for outcome in group[:args.show]:
            print(f"  {outcome.label}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
