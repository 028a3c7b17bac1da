"""Optimizers on one flat tensor: the `Updater` protocol every server and strategy steps,
`FlatSGD` (SGD with momentum and weight decay, the fast path) and `TorchUpdater` (any
elementwise torch.optim class), with the run's step lr decay.

`optimizer` below is the run's [optimizer] settings (lr, momentum, weight_decay, ...).

An updater's state is flat: every per-element tensor (a momentum buffer, Adam's moments) is
one 1-D tensor as long as its weights, every other entry (Adam's step count) is per updater.
So `joined` and `cut` carry any optimizer's state onto other slices of the same flat model: a
Strategy-Switch handover, or a resume onto another number of servers.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from polyrhythm.errors import ConfigError

# An optimizer's flat state's keys: its per-element entries, then its scalars (a step count).
StateKeys = tuple[tuple[str, ...], tuple[str, ...]]


class Updater(Protocol):
    """An optimizer stepping `weights` (a flat tensor it updates in place) by an update."""

    weights: torch.Tensor
    # The state it keeps, as its flat state holds it: (per-element keys, scalar keys); what a
    # Strategy-Switch's handover packs (state_pieces).
    state_keys: StateKeys
    # Its step is linear in the gradient (SGD): a gradient weighted by a batch share makes a
    # step of that share. Adam, RMSprop and Adagrad normalise a gradient's scale away, so a
    # server hands them the mean gradient and scales the learning rate instead.
    linear: bool

    def step(self, grad: torch.Tensor, lr: float) -> None: ...

    def state_dict(self) -> dict:
        """Its state as a checkpoint keeps it: copies, not views of its own tensors (ours:
        the flat state; a user's optimizer: torch's own form, runtime/worker/user_optimizer.py)."""
        ...

    def load_state_dict(self, state: dict) -> None: ...

    def flat_state(self) -> dict:
        """Its flat state (module docstring), as a Strategy-Switch's handover carries it."""
        ...


def effective_momentum(optimizer, concurrency: float = 1.0) -> float:
    """The explicit momentum an optimizer should use.

    Asynchrony itself acts as momentum of about 1 - 1/C with C updates in flight (C = N
    workers for asynchronous servers; Mitliagkas et al.,
    "Asynchrony begets momentum, with an application to deep learning", 2016), so stacking the
    full explicit momentum on top makes asynchronous SGD unstable (mnist5k, 4 ASP workers,
    momentum 0.9: diverged in some runs). With `async_momentum_correction`, asynchronous
    servers subtract the implicit part.
    """
    if not optimizer.async_momentum_correction:
        return optimizer.momentum
    return max(0.0, optimizer.momentum - (1.0 - 1.0 / concurrency))


def lr_at(optimizer, epoch: int) -> float:
    """Step decay: lr x lr_decay^(epoch // lr_decay_every)."""
    if optimizer.lr_decay_every <= 0:
        return optimizer.lr
    return optimizer.lr * optimizer.lr_decay ** (epoch // optimizer.lr_decay_every)


class FlatSGD:
    """torch.optim.SGD's update (momentum, weight decay, no dampening or Nesterov) on one flat
    tensor, without the per-call overhead of an Optimizer: servers step many small buckets."""

    linear = True
    # torch's SGD's key; without momentum the buffer travels as zeros, which it never reads.
    state_keys: StateKeys = (("momentum_buffer",), ())

    def __init__(self, weights: torch.Tensor, optimizer, concurrency: float = 1.0) -> None:
        self.weights = weights
        self.momentum = effective_momentum(optimizer, concurrency)
        self.weight_decay = optimizer.weight_decay
        self.buffer = torch.zeros_like(weights) if self.momentum else None
        # grad + decay * weights, made in place of its own every step: a server steps every
        # bucket every push, and a fresh tensor of the bucket's size each time is an
        # allocation (and page faults) per update.
        self._decayed = torch.empty_like(weights) if self.weight_decay else None

    @torch.no_grad()
    def step(self, grad: torch.Tensor, lr: float) -> None:
        d = (torch.add(grad, self.weights, alpha=self.weight_decay, out=self._decayed)
             if self.weight_decay else grad)
        if self.buffer is not None:
            # torch starts the buffer as a copy of d; 0 * momentum + d is exactly that.
            d = self.buffer.mul_(self.momentum).add_(d)
        self.weights.add_(d, alpha=-lr)

    def state_dict(self) -> dict:
        """A copy of the momentum buffer (the weights belong to whoever owns them); None
        without momentum."""
        return {"momentum_buffer": None if self.buffer is None else self.buffer.clone()}

    def load_state_dict(self, state: dict) -> None:
        """A buffer saved without momentum (None) starts from zero, as torch's SGD does."""
        saved = state["momentum_buffer"]
        if self.buffer is None:
            return
        if saved is None:
            self.buffer.zero_()
        else:
            self.buffer.copy_(saved)

    def flat_state(self) -> dict:
        return self.state_dict()  # flat already


# Classes whose update of an element reads only that element's gradient, weight and state
# (and per-parameter scalars such as a step count): a slice of the flat model stepped alone
# equals the same elements of the whole model stepped at once. Anything with a per-tensor
# norm (LAMB, LARS, torch's Adafactor, Muon's orthogonalisation) or a closure (LBFGS) is not.
# TODO(issue 23): run those per whole parameter (bucket boundaries on parameters) instead of
# refusing them.
ELEMENTWISE = {cls.__name__: cls for cls in (
    torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop,
    torch.optim.Adagrad, torch.optim.Adamax, torch.optim.NAdam, torch.optim.RAdam,
    torch.optim.Adadelta)}


class TorchUpdater:
    """A torch.optim class with its hyperparameters on one flat slice. Each of its param
    groups is a Parameter sharing the weights' storage ([a, b) of the slice; by default one,
    the whole slice), its .grad that part of the update, its lr set each step.

    `groups`: (a, b, overrides) spans covering the slice in order, with the hyperparameters
    that differ from `hyper` (a user's group without weight decay on biases); slice_groups
    cuts a whole model's groups for one slice. `owners`: each span's param group in the
    user's optimizer, whose settings `follow` sets from a push (Hyperparameters' layout
    `riding`); a span without them steps at the lr `step` is given."""

    def __init__(self, weights: torch.Tensor, cls: type,
                 groups: list[tuple[int, int, dict]] | None = None,
                 owners: list[int] | None = None, riding: Riding = (), **hyper) -> None:
        if ELEMENTWISE.get(cls.__name__) is not cls:
            raise ConfigError(f"optimizer {cls.__name__} is not elementwise, so it cannot "
                              f"step slices of the model; use one of "
                              f"{', '.join(ELEMENTWISE)}")
        groups = groups or [(0, len(weights), {})]
        if [a for a, _, _ in groups] != [0, *(b for _, b, _ in groups[:-1])] \
                or groups[-1][1] != len(weights):
            raise ValueError(f"groups {[(a, b) for a, b, _ in groups]} do not cover the "
                             f"{len(weights)} weights in order")
        self.weights = weights
        self.linear = cls is torch.optim.SGD
        self.ranges = [(a, b) for a, b, _ in groups]
        self.params = [torch.nn.Parameter(weights[a:b], requires_grad=True)
                       for a, b in self.ranges]
        self.optimizer = cls([{"params": [p], **over}
                              for p, (_, _, over) in zip(self.params, groups, strict=True)],
                             **hyper)
        self.optimizer.polyrhythm_internal = True  # not a user's: stepping it is ours
        self.hyper = hyper
        self.owners, self.riding = owners or [0] * len(groups), riding
        self.followed = False  # the groups' settings are a push's (follow): step keeps them

    @property
    def state_keys(self) -> StateKeys:
        return kept_state(type(self.optimizer), self.hyper)

    def follow(self, values: list[float], scale: float = 1.0) -> None:
        """Every group's settings as a push carried them (Hyperparameters.values: each user
        group's riding settings in turn), its lr times `scale`; the next step keeps them."""
        width = sum(w for _, w in self.riding)
        for group, owner in zip(self.optimizer.param_groups, self.owners, strict=True):
            at = owner * width
            for key, w in self.riding:
                group[key] = values[at] if w == 1 else tuple(values[at:at + w])
                at += w
            group["lr"] *= scale
        self.followed = True

    @torch.no_grad()
    def step(self, grad: torch.Tensor, lr: float | None) -> None:
        """One step by `grad`, every group at `lr` (None: at the settings `follow` set)."""
        for group, p, (a, b) in zip(self.optimizer.param_groups, self.params, self.ranges,
                                    strict=True):
            if lr is not None:
                group["lr"] = lr
            p.grad = grad[a:b]
        self.optimizer.step()
        for p in self.params:
            p.grad = None

    def state_dict(self) -> dict:
        """The groups' states joined (copies: torch counts steps in place)."""
        states = [self.optimizer.state[p] for p in self.params]
        return joined(states) if states[0] else {}  # {}: no step yet

    def load_state_dict(self, state: dict) -> None:
        """A state saved before any step (empty) starts afresh, as torch does."""
        for p, (a, b) in zip(self.params, self.ranges, strict=True):
            self.optimizer.state[p] = cut(state, a, b)

    def flat_state(self) -> dict:
        return self.state_dict()  # flat already


# The settings of a param group that ride on each push (runtime/worker/user_optimizer.py
# Hyperparameters): (key, how many numbers), in order.
Riding = tuple[tuple[str, int], ...]


class OptimizerSpec(NamedTuple):
    """A user's torch.optim optimizer as servers rebuild it on their slices of the flat
    model: its class's name (an ELEMENTWISE one), its defaults, its param groups as
    (a, b, overrides) spans of the whole flat model with each span's group (`owners`), and
    the settings every push carries for each group (`riding`; runtime/worker/user_optimizer.py)."""

    name: str
    hyper: dict
    groups: list[tuple[int, int, dict]]
    owners: list[int] = []
    riding: Riding = ()
    group_count: int = 1

    @property
    def push_words(self) -> int:
        """The float32 words the settings take in each push (a float64 each)."""
        return 2 * self.group_count * sum(w for _, w in self.riding)

    def updater(self, weights: torch.Tensor, start: int, stop: int) -> TorchUpdater:
        """The optimizer on `weights`, elements [start, stop) of the flat model."""
        owners = self.owners or [0] * len(self.groups)
        mine = [(span, o) for span, o in zip(self.groups, owners, strict=True)
                if span[0] < stop and start < span[1]]
        return TorchUpdater(weights, ELEMENTWISE[self.name],
                            slice_groups([span for span, _ in mine], start, stop),
                            [o for _, o in mine], self.riding, **self.hyper)

    def state_keys(self) -> StateKeys:
        """The keys of its flat state (a handover's, for the servers it describes)."""
        return kept_state(ELEMENTWISE[self.name], self.hyper)


def slice_groups(groups: list[tuple[int, int, dict]], start: int,
                 stop: int) -> list[tuple[int, int, dict]]:
    """A whole flat model's (a, b, overrides) groups as those of its slice [start, stop),
    relative to the slice (for TorchUpdater)."""
    return [(max(a, start) - start, min(b, stop) - start, over)
            for a, b, over in groups if a < stop and start < b]


# The run's `optimizer` names (config/declared.py OPTIMIZERS) besides sgd, which is FlatSGD.
TORCH_OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
                    "rmsprop": torch.optim.RMSprop, "adagrad": torch.optim.Adagrad}


def optimizer_name(optimizer) -> str:
    """The run's optimizer's name (sgd where none is given)."""
    return optimizer.optimizer or "sgd"


def updater(weights: torch.Tensor, optimizer, concurrency: float = 1.0) -> Updater:
    """The run's optimizer on `weights`: FlatSGD for sgd (the default), else the torch.optim
    class with the run's weight decay and, where given, betas and eps (torch's defaults
    otherwise). `concurrency` corrects SGD's momentum only (effective_momentum)."""
    name = optimizer_name(optimizer)
    if name == "sgd":
        return FlatSGD(weights, optimizer, concurrency)
    return TorchUpdater(weights, TORCH_OPTIMIZERS[name], **_torch_hyper(optimizer))


def _torch_hyper(optimizer) -> dict:
    hyper = {"lr": optimizer.lr, "weight_decay": optimizer.weight_decay}
    if optimizer.betas is not None:
        hyper["betas"] = tuple(optimizer.betas)
    if optimizer.eps is not None:
        hyper["eps"] = optimizer.eps
    return hyper


def state_keys(optimizer) -> StateKeys:
    """The run's optimizer's flat state's keys (those its updater keeps)."""
    name = optimizer_name(optimizer)
    if name == "sgd":
        return FlatSGD.state_keys
    return kept_state(TORCH_OPTIMIZERS[name], _torch_hyper(optimizer))


def kept_state(cls: type, hyper: dict) -> StateKeys:
    """The keys of the state an elementwise torch.optim class keeps per parameter with these
    hyperparameters: those shaped like the parameter, then the rest (Adam's step count).
    Read off one step of a two-element probe rather than listed, so what a setting adds
    (AMSGrad's max_exp_avg_sq, RMSprop's momentum_buffer) or a torch release renames is
    carried too."""
    probe = torch.nn.Parameter(torch.zeros(2))
    optimizer = cls([probe], **hyper)
    optimizer.polyrhythm_internal = True  # ours, not a user's (runtime/worker/job_optimizer.py)
    probe.grad = torch.ones(2)
    optimizer.step()
    state = optimizer.state[probe]
    elementwise = tuple(k for k, v in state.items()
                        if isinstance(v, torch.Tensor) and v.shape == probe.shape)
    return elementwise, tuple(k for k in state if k not in elementwise)


def state_pieces(state: dict, keys: StateKeys,
                 length: int) -> tuple[list[torch.Tensor], list[float]]:
    """A flat state of `length` elements as a Strategy-Switch's handover carries it: its
    per-element tensors and its scalars in the order of `keys`; zeros (and 0) for what it
    does not hold yet (FlatSGD without momentum holds None), which is what a fresh optimizer
    starts from."""
    elementwise, scalars = keys
    tensors = [state[k] if state.get(k) is not None else torch.zeros(length)
               for k in elementwise]
    return tensors, [float(state.get(k, 0)) for k in scalars]


def state_of(pieces: list[torch.Tensor], values: list[float], keys: StateKeys) -> dict:
    """The flat state whose pieces `state_pieces` gave (a step count as torch keeps it)."""
    elementwise, scalars = keys
    return {**dict(zip(elementwise, pieces, strict=True)),
            **{k: torch.tensor(v) for k, v in zip(scalars, values, strict=True)}}


def joined(states: list[dict]) -> dict:
    """The flat states of consecutive slices as the state of their union: per-element
    tensors concatenated, the rest (a step count) copied from the first slice, as the slices
    that step together have the same. Copies throughout: torch counts steps in place."""
    first = states[0]
    if any(s.keys() != first.keys() for s in states):
        raise ValueError("slices with different optimizer states cannot be joined")
    return {k: torch.cat([s[k] for s in states]) if _per_element(v) else _copy(v)
            for k, v in first.items()}


def cut(state: dict, start: int, stop: int) -> dict:
    """The flat state of elements [start, stop) of a flat state's slice (copies)."""
    return {k: v[start:stop].clone() if _per_element(v) else _copy(v)
            for k, v in state.items()}


def _copy(value):
    return value.clone() if isinstance(value, torch.Tensor) else value


def _per_element(value) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 1
