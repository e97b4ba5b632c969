"""`plan probe`: start torchrun on this node (or print the command for every node).

Torch is never imported at module import time: the package must load, and
say how to install torch, on machines without it. ``run_probe(options)`` is
the typer-independent entry; ``planner.probe.command.register(app)`` puts it
on a typer app. This module never imports the command module.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

from planner.emit.torchrun import torchrun_flags
from planner.probe.checks import (
    check_gpu_count,
    check_rendezvous_host,
    check_sweep,
    check_targets,
    validate,
)
from planner.probe.hang import flight_recorder_env
from planner.probe.lifeline import watched_argv
from planner.probe.options import (
    CPU_NPROC_PER_NODE,
    CPU_SWEEP,
    GPU_SWEEP,
    ProbeOptions,
    SweepDefaults,
)
from planner.probe.runner import (
    ProbeError,
    StopRequest,
    deferred_stop_signals,
    run_with_progress,
)

INSTALL_HINT = "pip install 'parallel-planner[probe]'"
WORKER_MODULE = "planner.probe.worker"
RESULT_FILE = "result.json"
TORCHRUN_LOG_DIR = "torchrun-logs"


def require_torch() -> None:
    if importlib.util.find_spec("torch") is None:
        raise ProbeError(f"needs torch, which is not installed: {INSTALL_HINT}")


def visible_gpu_count() -> int:
    import warnings

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    try:
        import torch  # deferred: only when the user asked to run and gave no --nproc-per-node
    except Exception as error:  # noqa: BLE001 - a broken install fails in many ways; one line says which
        raise ProbeError(f"torch is installed but does not import ({type(error).__name__}: "
                         f"{error}); reinstall it: {INSTALL_HINT}") from None
    return torch.cuda.device_count()


def torchrun_argv(
    options: ProbeOptions, nproc_per_node: int, sweep: SweepDefaults, work_dir: str
) -> list[str]:
    """The exact torchrun command line for this node (an argv list, shown with shlex.join).

    work_dir (a temp dir) receives rank 0's results and torchrun's own log dir, which
    torchrun would otherwise leave in the system temp dir after every run.
    """
    worker_args = [
        "--result-path",
        os.path.join(work_dir, RESULT_FILE),
        "--backend",
        options.backend,
        "--min-bytes",
        str(sweep.min_bytes),
        "--max-bytes",
        str(sweep.max_bytes),
        "--step-factor",
        str(options.step_factor),
        "--warmup",
        str(sweep.warmup),
        "--iterations",
        str(sweep.iterations),
        "--repeats",
        str(sweep.repeats),
        "--timeout-s",
        str(options.timeout_s),
        "--node-id-from",
        options.node_id_from,
    ]
    if options.collectives is not None:
        worker_args += ["--collectives", options.collectives]
    if options.skip_compute:
        worker_args.append("--skip-compute")

    rendezvous = torchrun_flags(
        nproc_per_node,
        options.nnodes,
        rdzv_endpoint=options.rdzv_endpoint,
        rdzv_id=options.rdzv_id,
        master_addr=options.master_addr,
        master_port=options.master_port,
        node_rank=options.node_rank,
        rdzv_conf=options.rdzv_conf,
        local_addr=options.local_addr,
    )
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *rendezvous,
        "--log-dir",
        os.path.join(work_dir, TORCHRUN_LOG_DIR),
        "--max-restarts",
        "0",
        "-m",
        WORKER_MODULE,
        *worker_args,
    ]


def resolved_sweep(options: ProbeOptions, on_gpu: bool) -> SweepDefaults:
    base = GPU_SWEEP if on_gpu else CPU_SWEEP
    chosen = {f.name: getattr(options, f.name) for f in dataclasses.fields(SweepDefaults)}
    return dataclasses.replace(base, **{k: v for k, v in chosen.items() if v is not None})


CLI_FLAG_OVERRIDES = {"json_output": "--json", "timeout_s": "--timeout"}


def plan_probe_argv(options: ProbeOptions, node_rank: int | None) -> list[str]:
    """`plan probe ... --run` as one node should type it: the non-default options only."""
    argv = ["plan", "probe"]
    defaults = ProbeOptions()
    for field in dataclasses.fields(ProbeOptions):
        value = node_rank if field.name == "node_rank" else getattr(options, field.name)
        if field.name == "run" or value == getattr(defaults, field.name):
            continue
        flag = CLI_FLAG_OVERRIDES.get(field.name, "--" + field.name.replace("_", "-"))
        argv += [flag] if value is True else [flag, str(value)]
    return [*argv, "--run"]


def print_node_commands(options: ProbeOptions) -> None:
    static = options.master_addr is not None
    print(
        f"Run on each of the {options.nnodes} nodes ({'static rendezvous' if static else 'c10d: node order follows arrival'}):"
    )
    for node_rank in range(options.nnodes):
        print(
            f"  node {node_rank}: {shlex.join(plan_probe_argv(options, node_rank if static else None))}"
        )
    sweep = resolved_sweep(options, on_gpu=options.backend != "gloo")
    nproc = options.nproc_per_node or "<GPUs on the node>"
    if static and options.node_rank is None:  # each node's own (it printed "--node-rank None"; a CLI sweep)
        options = dataclasses.replace(options, node_rank="<its node rank>")  # type: ignore[arg-type]
    example = torchrun_argv(options, nproc, sweep, "<temp dir>")  # type: ignore[arg-type]
    print(f"Each runs: {shlex.join(['python', *example[1:]])}")
    print(
        "The node that gets rank 0 writes --out / --merge-into; set NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME if the "
        "hostname resolves to the wrong interface (docs/probe.md)."
    )


def run_probe(options: ProbeOptions) -> int:
    """Run `plan probe`; user-caused failures print one line on stderr and return 2."""
    try:
        return _run_probe(options)
    except ProbeError as error:
        print(f"plan probe: {error}".replace("\n", " "), file=sys.stderr)
        return 2


def _run_probe(options: ProbeOptions) -> int:
    validate(options)
    if options.nnodes > 1 and not options.run:
        print_node_commands(options)
        return 0
    check_rendezvous_host(options)
    check_targets(options)
    require_torch()
    skip_detection = options.backend == "gloo" and options.nproc_per_node is not None
    num_gpus = 0 if skip_detection else visible_gpu_count()
    on_gpu = num_gpus > 0 and options.backend != "gloo"
    if options.backend == "nccl" and num_gpus == 0:
        raise ProbeError("--backend nccl needs CUDA GPUs and none are visible")
    check_gpu_count(options.nproc_per_node, num_gpus, on_gpu)
    nproc_per_node = options.nproc_per_node or num_gpus or CPU_NPROC_PER_NODE
    sweep = resolved_sweep(options, on_gpu)
    check_sweep(options, sweep, on_gpu, nproc_per_node)
    declared = _read_declared(options)
    raw = _measure(options, nproc_per_node, sweep, on_gpu)
    if raw is None:
        print("plan probe: this node's ranks finished; the node that got rank 0 writes the results")
        return 0
    return _report(raw, options, declared)


def _measure(
    options: ProbeOptions, nproc_per_node: int, sweep: SweepDefaults, on_gpu: bool
) -> dict | None:
    """Rank 0's raw results (None on a node without rank 0), from torchrun run in a temp dir.

    SIGINT, SIGTERM and SIGHUP are deferred meanwhile: the run loop stops torchrun and
    its workers and raises ProbeError, and the temp dir goes as the error passes.
    """
    with deferred_stop_signals() as stop:
        with tempfile.TemporaryDirectory(prefix="plan-probe-") as directory:
            argv = torchrun_argv(options, nproc_per_node, sweep, directory)
            if options.verbose:
                print(f"plan probe: running {shlex.join(argv)}", file=sys.stderr)
            _execute(argv, options, stop, on_gpu)
            stop.raise_if_requested()
            result_path = os.path.join(directory, RESULT_FILE)
            raw = None
            if os.path.exists(result_path):
                with open(result_path, encoding="utf-8") as handle:
                    raw = json.load(handle)
        stop.raise_if_requested()
    return raw


def _read_declared(options: ProbeOptions) -> dict | None:
    from planner.probe.profile import read_profile

    if options.merge_into is None:
        return None
    try:
        return read_profile(options.merge_into)
    except ValueError as error:
        raise ProbeError(str(error)) from None


def flight_recorder_directory(options: ProbeOptions) -> str:
    """Where NCCL's flight-recorder dumps go: beside --out / --merge-into (the temp dir is
    removed as the error passes), else the working directory."""
    target = options.out or options.merge_into
    return os.path.dirname(os.path.abspath(target)) if target else os.getcwd()


def _execute(argv: list[str], options: ProbeOptions, stop: StopRequest, on_gpu: bool) -> None:
    from planner.probe.report import progress_display

    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONWARNINGS", "ignore::UserWarning")
    env.setdefault("OMP_NUM_THREADS", "1")
    if on_gpu:  # NCCL: a timed-out collective dumps every rank's recent collectives
        for name, value in flight_recorder_env(flight_recorder_directory(options)).items():
            env.setdefault(name, value)
    echo = (lambda line: print(line, end="", file=sys.stderr)) if options.verbose else None
    with progress_display() as on_progress:
        run_with_progress(watched_argv(argv), env, options.timeout_s, on_progress, echo, stop)


def load_problem(target: Path, document: dict) -> str | None:
    """Why `plan --cluster` would refuse the profile (None: it loads)."""
    from planner.catalog import resolve_gpu
    from planner.specs import ClusterSpec, SpecError, validate

    try:
        validate(ClusterSpec, document, str(target), {"resolve_gpu": resolve_gpu})
    except SpecError as error:
        return str(error)
    return None


def check_loads(target: Path, document: dict) -> None:
    """The profile as `plan --cluster` would load it; a measurement outside the schema's ranges
    (a gloo sweep of tiny messages on a CPU measures well under 0.01 GB/s) stops the probe
    before anything is written."""
    problem = load_problem(target, document)
    if problem is not None:
        raise ProbeError(f"{problem} (not written: the planner could not load it; measure larger messages "
                         f"with --max-bytes, or on the GPUs with --backend nccl)")


def _report(raw: dict, options: ProbeOptions, declared: dict | None) -> int:
    from planner.probe import profile, report, results

    rows = results.summarize_rows(raw)
    fits = results.fit_all(rows)
    choices = profile.ProfileChoices(
        options.name, options.gpu, options.intra_kind, options.inter_kind
    )
    document = profile.build_profile(raw, rows, fits, choices, declared)
    merged = None
    if options.merge_into is not None:
        merged, _ = profile.merge_profile(declared or {}, document)
        merged["measured"]["flags"].append(
            "merged by plan probe: YAML comments of the original are not kept"
        )
        if raw["backend"] == "gloo":
            merged["measured"]["flags"].append(
                "measured with gloo on the hosts' CPUs: the merged link numbers are the host path's, "
                "not the GPUs' fabric"
            )
    # write nothing the planner would refuse to read back; a refusal or a failed write still
    # prints what was measured (the table, or the JSON) before its one-line error, so a sweep's
    # minutes are not lost with the file (a critical read)
    problem = None
    try:
        for target, content in ((options.out, document), (options.merge_into, merged)):
            if target is not None:
                check_loads(target, content)
        if options.out is None and options.merge_into is None:
            problem_text = load_problem(Path("(printed profile)"), document)
            if problem_text is not None:
                print(f"plan probe: warning: the printed profile would not load: {problem_text}; measure larger "
                      f"messages with --max-bytes, or on the GPUs with --backend nccl", file=sys.stderr)
        for flag, target, content in (("--out", options.out, document),
                                      ("--merge-into", options.merge_into, merged)):
            if target is not None:
                try:
                    profile.atomic_write_text(target, profile.dump_yaml(content))
                except OSError as exc:  # a full disk, a directory gone: the file is left as it was
                    raise ProbeError(f"{flag} {target}: cannot write: {exc.strerror or exc}") from None
                print(f"plan probe: wrote {target}", file=sys.stderr)
    except ProbeError as error:
        problem = error
    if problem is None and merged is not None and raw["backend"] == "gloo":
        kept = (merged.get("intra_node") or {}).get("kind")
        print(f"plan probe: warning: --merge-into {options.merge_into}: its links now carry figures measured with "
              f"gloo on the hosts' CPUs (the host path, not the GPUs' fabric), under the profile's own link kind "
              f"({kept}); plans on it price that path (measure on the GPUs with --backend nccl)", file=sys.stderr)
    if options.json_output:
        print(
            json.dumps(
                {"raw": raw, "fits": results.fits_section(fits), "profile": document}, indent=1
            )
        )
    else:
        # with --merge-into, the links as written there (the profile's own kinds keep; the run's
        # own document printed "pcie" above a file that says nvlink; found by a CLI sweep)
        report.print_report(rows, fits, merged if merged is not None else document)
    if problem is not None:
        raise problem
    return 0
