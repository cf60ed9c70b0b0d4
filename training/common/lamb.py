"""LAMB: layer-wise adaptive moments for large-batch training (You et al., 2019, arXiv:1904.00962, Alg. 2).

Per parameter tensor w with gradient g at step t:

    m = b1*m + (1-b1)*g            v = b2*v + (1-b2)*g^2
    r = (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
    u = r + weight_decay * w
    w = w - lr * trust * u,        trust = ||w|| / ||u||  (1 when either norm is 0, or adapt=False)

Parameter groups may set `adapt=False` (biases, normalisation) to skip the trust ratio.
"""

from __future__ import annotations

import torch


class Lamb(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.0):
        if lr <= 0:
            raise ValueError(f"lr must be positive (got {lr})")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "adapt": True}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["step"] += 1
                t = float(state["step"])
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                grad = param.grad.float()
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                update = (exp_avg / (1 - beta1**t)) / ((exp_avg_sq / (1 - beta2**t)).sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(param, alpha=group["weight_decay"])
                trust = 1.0
                if group["adapt"]:
                    weight_norm, update_norm = param.norm(), update.norm()
                    if weight_norm > 0 and update_norm > 0:
                        trust = weight_norm / update_norm
                param.sub_(update * (group["lr"] * trust))
        return loss
