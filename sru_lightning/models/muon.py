"""Muon for a network's hidden matrices, AdamW for the rest, as one optimizer.

Muon (``torch.optim.Muon``) orthogonalises the momentum of a 2-D weight before applying it,
which suits the matrices inside a network (an SRU layer's projection, SRU++'s attention
projections, an LSTM's gate matrices) but not embeddings, the output layer, biases, SRU's
per-channel `weight_c` or norms. :class:`MuonAdamW` puts each parameter under the rule that
suits it and is still one ``torch.optim.Optimizer``: Lightning steps it, a learning-rate
scheduler scales both parts (each group keeps its own peak rate), and its ``state_dict`` holds
both, so a resumed run continues exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.optim import AdamW, Muon, Optimizer

__all__ = ["MuonAdamW", "is_hidden_matrix", "refuse_sharded_engine", "OUTPUT_PARAMETER_PREFIXES"]

#: Parameter names (prefixes) of a language network's input and output layers, which Muon
#: leaves to AdamW whatever their shape: the token embedding and the output layer.
OUTPUT_PARAMETER_PREFIXES = ("embedding.", "decoder.")

#: The group key saying which rule steps a group.
RULE_KEY = "rule"


def is_hidden_matrix(name: str, parameter: torch.Tensor, *, outer: Sequence[str] = OUTPUT_PARAMETER_PREFIXES) -> bool:
    """True for a 2-D weight inside the network (Muon's), False for everything else (AdamW's)."""
    return parameter.ndim == 2 and not any(name.startswith(prefix) for prefix in outer)


def _named(params: Any) -> list[tuple[str, torch.Tensor]]:
    if isinstance(params, nn.Module):
        return list(params.named_parameters())
    named = list(params)
    if not all(isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) for item in named):
        raise TypeError(
            "MuonAdamW: `named_params` must be a module or (name, parameter) pairs (model.named_parameters()), "
            f"got {type(named[0]).__name__ if named else 'an empty sequence'}"
        )
    return named


class MuonAdamW(Optimizer):
    """One optimizer: ``torch.optim.Muon`` for hidden matrices, ``torch.optim.AdamW`` for the rest.

    Args:
        named_params: ``module.named_parameters()`` (or the module); only parameters that
            require a gradient are stepped.
        lr: peak learning rate of both parts. Muon's update is rescaled to AdamW's size
            (``adjust_lr_fn="match_rms_adamw"`` by default), so one rate fits both.
        weight_decay: decoupled weight decay of both parts.
        betas, eps: AdamW's.
        momentum, nesterov, ns_steps, adjust_lr_fn: Muon's.
        muon_lr, muon_weight_decay: Muon's own rate and decay, when they differ from `lr` and
            `weight_decay`.
        hidden_matrix: ``(name, parameter) -> bool`` choosing Muon's parameters; the default
            (:func:`is_hidden_matrix`) takes every 2-D parameter but the embedding and the
            output layer.

    Each group records its rule under ``"rule"`` ("muon" or "adamw"); a group left empty is
    not created (a network without hidden matrices is stepped by AdamW alone).
    """

    def __init__(
        self,
        named_params: Iterable[tuple[str, torch.Tensor]] | nn.Module,
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = "match_rms_adamw",
        muon_lr: float | None = None,
        muon_weight_decay: float | None = None,
        hidden_matrix: Callable[[str, torch.Tensor], bool] = is_hidden_matrix,
    ) -> None:
        named = [(name, param) for name, param in _named(named_params) if param.requires_grad]
        if not named:
            raise ValueError("MuonAdamW: `named_params` holds no parameter that requires a gradient")
        matrices = [param for name, param in named if hidden_matrix(name, param)]
        chosen = {id(param) for param in matrices}
        others = [param for _, param in named if id(param) not in chosen]
        self.muon_names = [name for name, param in named if id(param) in chosen]
        self._parts: dict[str, Optimizer] = {}
        if matrices:
            self._parts["muon"] = Muon(
                [{"params": matrices, RULE_KEY: "muon"}],
                lr=lr if muon_lr is None else muon_lr,
                weight_decay=weight_decay if muon_weight_decay is None else muon_weight_decay,
                momentum=momentum,
                nesterov=nesterov,
                ns_steps=ns_steps,
                adjust_lr_fn=adjust_lr_fn,
            )
        if others:
            self._parts["adamw"] = AdamW(
                [{"params": others, RULE_KEY: "adamw"}], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay
            )
        groups = [group for part in self._parts.values() for group in part.param_groups]
        # The parts' own group dicts become this optimizer's groups (the same objects), so a
        # scheduler or Lightning changing a group's lr changes the part that steps it.
        super().__init__(groups, {"lr": lr})
        self._share_state()

    def _share_state(self) -> None:
        for rule, part in self._parts.items():
            part.param_groups = [group for group in self.param_groups if group[RULE_KEY] == rule]
            part.state = self.state

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for part in self._parts.values():
            part.step()
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        rules = [group.get(RULE_KEY) for group in state_dict.get("param_groups", [])]
        mine = [group[RULE_KEY] for group in self.param_groups]
        if rules != mine:
            raise ValueError(
                f"MuonAdamW: the saved optimizer's groups are {rules}, this one's {mine} (a different model "
                "or a different choice of Muon's parameters)"
            )
        super().load_state_dict(state_dict)
        # Optimizer.load_state_dict replaces the group dicts and the state mapping.
        self._share_state()

    @staticmethod
    def refuse_strategy(strategy: Any) -> None:
        """Raise a one-line error under an engine that splits weight matrices (see
        :func:`refuse_sharded_engine`)."""
        refuse_sharded_engine(strategy)


def refuse_sharded_engine(strategy: Any) -> None:
    """Raise a one-line error when `strategy` cannot run Muon's whole-matrix update.

    Muon orthogonalises each weight matrix as a whole. DeepSpeed builds its own optimizer
    around flat parameter partitions, and FSDP / FSDP2 shard each matrix across ranks, so
    every rank would orthogonalise a slice: the update would not be Muon's. DDP and a single
    process keep whole matrices on every rank.
    """
    names = {cls.__name__ for cls in type(strategy).__mro__}
    for engine in ("DeepSpeedStrategy", "FSDPStrategy", "ModelParallelStrategy"):
        if engine in names:
            raise ValueError(
                f"model/optimizer=muon: the {type(strategy).__name__} engine shards or repartitions each weight "
                "matrix, and Muon's update needs whole matrices; use a single process or trainer=ddp/ddp_cpu, "
                "or another optimizer with this engine"
            )
