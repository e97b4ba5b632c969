"""Measure a cluster's links with torchrun and write a hardware profile.

This sub-package is the only place in the project that imports torch, and
only ``measure.py`` and ``worker.py`` do so (they run inside torchrun).
``sweep.py``, ``fit.py``, ``profile.py`` and ``launcher.py`` are torch-free
so that ``plan probe`` can give a clean error when torch is missing and the
fit can be tested without torch.
"""
