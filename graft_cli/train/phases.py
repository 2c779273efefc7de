"""Seconds and peak accelerator memory per phase of a training step, kept out of the step's logic:
one context manager, ``with phases("score", times): ...``, times the block into ``times[name]`` (the
step's own dict by default) and, on CUDA, records the peak memory allocated since the previous phase
ended as ``memory/<name>_peak_gib`` (rollout, score, update); nothing on CPU."""

from __future__ import annotations

import contextlib
import time

import torch


class Phases:
    def __init__(self, model):
        self.dev = next(model.parameters()).device
        self.on = self.dev.type == "cuda"
        self.peaks: dict[str, float] = {}
        self.seconds: dict[str, float] = {}
        if self.on:
            torch.cuda.reset_peak_memory_stats(self.dev)

    @contextlib.contextmanager
    def __call__(self, name: str, times: dict | None = None, memory: bool = True):
        """Time the block into ``times[name]`` (default: :attr:`seconds`); with ``memory``, mark the
        peak memory of the phase when the block ends (policy threads share one device: their phases'
        peaks are maxed)."""
        t0 = time.perf_counter()
        yield
        if memory and self.on:
            gib = torch.cuda.max_memory_allocated(self.dev) / 2**30
            self.peaks[name] = max(self.peaks.get(name, 0.0), gib)
            torch.cuda.reset_peak_memory_stats(self.dev)
        (self.seconds if times is None else times)[name] = time.perf_counter() - t0

    def metrics(self) -> dict:
        return {f"memory/{k}_peak_gib": v for k, v in self.peaks.items()}
