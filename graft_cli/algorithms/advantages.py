"""Group-relative advantage estimators (registry ``ADVANTAGES``).

Every estimator maps binary/scalar rewards of shape ``(G, n)`` (G prompt groups of n responses) to
one scalar advantage per response, shape ``(G, n)``. """

from __future__ import annotations

import torch

from graft_cli.registry import Registry

ADVANTAGES: Registry = Registry("advantage estimator")


@ADVANTAGES.register("grpo")
def grpo_advantages(rewards: torch.Tensor, eps: float = 1e-6, norm_by_std: bool = True,
                    unbiased: bool = True) -> torch.Tensor:
    """GRPO (graft.md §1): â_i = (r_i − mean(R)) / (std(R) + ε), ε = 1e-6, std unbiased (Bessel, as
    verl's ``torch.std``). Zero-variance groups get 0 (the numerator is 0). With
    ``norm_by_std=False`` it is Dr. GRPO's r_i − mean(R). Groups of one response get 0."""
    r = rewards.to(torch.float64)
    if r.shape[-1] < 2:
        return torch.zeros_like(rewards, dtype=torch.float32)
    centred = r - r.mean(-1, keepdim=True)
    if norm_by_std:
        centred = centred / (r.std(-1, unbiased=unbiased, keepdim=True) + eps)
    return centred.to(torch.float32)


@ADVANTAGES.register("dr_grpo")
def dr_grpo_advantages(rewards: torch.Tensor, eps: float = 1e-6, **_) -> torch.Tensor:
    """Dr. GRPO: r_i − mean(R), no std normalisation."""
    return grpo_advantages(rewards, eps=eps, norm_by_std=False)
