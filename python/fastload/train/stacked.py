"""Stacked steps (``fit_many(..., stack=True)``): trainers whose models share an architecture
(:func:`stack_key`) take their forward and backward passes as one model vmapped over the runs
(``torch.func``), so one kernel launch serves them all; each keeps its own optimizer step."""

from __future__ import annotations

import copy
import itertools
from typing import List, Optional, Sequence

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from fastload.train.task import loss
from fastload.train.trainer import Trainer


def stack_key(trainer: Trainer) -> Optional[tuple]:
    """What trainers must share to be stacked (None: never stacked): a named backbone, its
    width, the lattice, full precision. Learning rates, schedules, weight decays and seeds may
    differ: each trainer keeps its own optimizer."""
    o = trainer.options
    if not isinstance(o.backbone, str) or o.amp != "off":
        return None
    return (o.backbone, o.num_features, o.lattice_size)


def step_units(trainers: Sequence[Trainer], stack: bool) -> list:
    """The trainers as they step: alone, or (with ``stack``) stacked by architecture where two
    or more share one."""
    if not stack:
        return list(trainers)
    groups: dict = {}
    for t in trainers:
        key = stack_key(t)
        groups.setdefault(id(t) if key is None else key, []).append(t)
    return [StackedStep(group) if len(group) > 1 else group[0] for group in groups.values()]


class StackedStep:
    """The forward and backward passes of trainers whose models share an architecture, as one
    model vmapped over runs (``torch.func``): each parameter and buffer of the runs is one
    stacked tensor, and each run's model holds views of its slice, so its optimizer, checkpoint
    and evaluation work unchanged. Gradients agree with the models' own within float rounding
    (vmapped kernels may sum in another order), not bitwise."""

    def __init__(self, trainers: List[Trainer]):
        self.trainers: List[Trainer] = []
        self.task = trainers[0].task  # the group's
        self._stack(trainers)

    def _stack(self, trainers: List[Trainer]) -> None:
        self.unstack()
        self.trainers = list(trainers)
        models = [t.model for t in trainers]
        self.params = _stack_into(models, "named_parameters")
        self.buffers = _stack_into(models, "named_buffers")
        self.base = copy.deepcopy(models[0]).to("meta")  # the module structure functional_call runs

    def unstack(self) -> None:
        """Gives each model its own storage again."""
        for t in self.trainers:
            for tensor in itertools.chain(t.model.parameters(), t.model.buffers()):
                tensor.data = tensor.data.clone()

    def _loss(self, params: dict, buffers: dict, x, y, m) -> torch.Tensor:
        return loss(self.task, functional_call(self.base, (params, buffers), (x, m)), y)

    def step(self, x, y, m) -> None:
        """One step of every running trainer of the stack. A failure (a diverged model's
        lattice lookup) stops the trainers whose parameters are no longer finite, and the
        others take the step again without them."""
        while True:
            members = [t for t in self.trainers if t.running]
            if not members:
                return
            if members != self.trainers:
                self._stack(members)
            before = {name: b.clone() for name, b in self.buffers.items()}  # BatchNorm updates them
            try:
                grads, losses = vmap(grad_and_value(self._loss), in_dims=(0, 0, None, None, None))(
                    self.params, self.buffers, x, y, m
                )
            except (IndexError, RuntimeError):
                for name, b in before.items():
                    self.buffers[name].copy_(b)
                for t in members:
                    t.guarded(t.check_finite, t.step + 1)
                if all(t.running for t in members):
                    raise
                continue
            break
        for i, t in enumerate(members):
            for name, p in t.model.named_parameters():
                p.grad = grads[name][i]
            t.apply_gradients(losses[i], len(y))


def _stack_into(models: List[nn.Module], which: str) -> dict:
    """name -> one tensor stacking ``which`` (named_parameters or named_buffers) of ``models``;
    each model's tensor becomes a view of its slice."""
    named = [dict(getattr(model, which)()) for model in models]
    stacked = {name: torch.stack([n[name].detach() for n in named]) for name in named[0]}
    for i, n in enumerate(named):
        for name, tensor in n.items():
            tensor.data = stacked[name][i]
    return stacked
