"""A launch step: where it runs and its argv (shown with shlex.join, never spliced)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

MODEL_PLACEHOLDER = "MODEL"
"""Replace with the checkpoint path or Hugging Face id (`--served-model` sets it)."""
HEAD_ADDRESS_PLACEHOLDER = "HEAD_IP"
"""Replace with the head node's address reachable from every node."""


@dataclass(frozen=True)
class Step:
    where: str
    argv: tuple[str, ...]

    def shell(self) -> str:
        return shlex.join(self.argv)
