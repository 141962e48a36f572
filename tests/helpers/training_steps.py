"""A few AdamW steps on a fixed batch, checking the routers' gradients at each (shared by the
transformers tests of every family)."""

import torch


def train_steps(model, routers, x, frozen: bool, steps: int = 4):
    """(losses per step, router weights before, router weights after). Every step asserts the routers
    got no gradient (``frozen``) or a non-zero one."""
    model.train()
    before = [g.weight.detach().clone() for g in routers]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        out = model(x, labels=x, output_router_logits=True)
        out.loss.backward()
        grads = [g.weight.grad for g in routers]
        if frozen:
            assert all(g is None for g in grads)
        else:
            assert all(g is not None and g.abs().sum() > 0 for g in grads)
        opt.step()
        losses.append(out.loss.item())
    return losses, before, [g.weight.detach() for g in routers]
