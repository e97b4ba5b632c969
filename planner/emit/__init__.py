"""Launch commands, one module per engine: layout + specs -> LaunchSteps (argv tuples, one per
role; planner/emit/command.py), and the registry the CLI dispatches through.

One signature per workload:
- serving, `ServeEmitter`: (ServeArgs) -> steps;
- training, `TrainEmitter`: (model, cluster, config, global_batch, seq_len) -> steps; Megatron's
  takes the release (engines.MegatronRelease) as a sixth, optional argument.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from planner.emit.command import LaunchStep, ServeArgs
from planner.emit.sglang import sglang_steps
from planner.emit.vllm import vllm_ray_steps, vllm_steps

ServeEmitter = Callable[[ServeArgs], tuple[LaunchStep, ...]]
if TYPE_CHECKING:
    from planner.engines import MegatronRelease
    from planner.layout import TrainConfig
    from planner.specs import ClusterSpec, ModelSpec

    TrainEmitter = Callable[[ModelSpec, ClusterSpec, TrainConfig, int, int], tuple[LaunchStep, ...]]

SERVE_EMITTERS: dict[str, ServeEmitter] = {
    "vllm": vllm_steps,
    "vllm-ray": vllm_ray_steps,
    "sglang": sglang_steps,
}


def megatron_steps(model: ModelSpec, cluster: ClusterSpec, config: TrainConfig, global_batch: int,
                   seq_len: int, release: MegatronRelease | None = None) -> tuple[LaunchStep, ...]:
    """emit/megatron.py's, loaded when a training command is emitted (a serving plan never
    loads the training emitters and the cost model they read); `release` the Megatron-LM
    release the command is for (default engines.DEFAULT_MEGATRON)."""
    from planner.emit.megatron import megatron_steps as steps

    return steps(model, cluster, config, global_batch, seq_len, release)


def torchtitan_steps(model: ModelSpec, cluster: ClusterSpec, config: TrainConfig, global_batch: int,
                     seq_len: int) -> tuple[LaunchStep, ...]:
    """emit/torchtitan.py's, loaded as megatron_steps is."""
    from planner.emit.torchtitan import torchtitan_steps as steps

    return steps(model, cluster, config, global_batch, seq_len)


TRAIN_EMITTERS: dict[str, TrainEmitter] = {
    "megatron": megatron_steps,
    "torchtitan": torchtitan_steps,
}
