"""Deterministic prompt batches: a seeded permutation per epoch, drop-last, with a resumable
cursor."""

from __future__ import annotations

import numpy as np


class PromptSampler:
    """Yields batches of problem indices. Epoch ``e`` uses ``permutation(seed + e)``; batches that
    would run past the end of an epoch are dropped (drop-last). ``step`` is the data cursor: the
    number of batches already served, so ``state_dict()``/``load_state_dict()`` resume exactly."""

    def __init__(self, num_problems: int, batch_size: int, seed: int, shuffle: bool = True):
        if batch_size > num_problems:
            raise ValueError(f"batch of {batch_size} prompts but only {num_problems} problems")
        self.n, self.bs, self.seed, self.shuffle = num_problems, batch_size, seed, shuffle
        self.steps_per_epoch = num_problems // batch_size
        self.step = 0

    def _perm(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.n)
        return np.random.default_rng(self.seed + epoch).permutation(self.n)

    def batch_at(self, step: int) -> list[int]:
        epoch, j = divmod(step, self.steps_per_epoch)
        return self._perm(epoch)[j * self.bs : (j + 1) * self.bs].tolist()

    def next(self) -> list[int]:
        idx = self.batch_at(self.step)
        self.step += 1
        return idx

    def state_dict(self) -> dict:
        return {"step": self.step, "seed": self.seed, "n": self.n, "batch_size": self.bs}

    def load_state_dict(self, st: dict) -> None:
        if (st["seed"], st["n"], st["batch_size"]) != (self.seed, self.n, self.bs):
            raise ValueError("data cursor was saved for a different seed, dataset size or batch size")
        self.step = int(st["step"])
