"""``RoutingOptions``: how a patched model routes, every option declared once.

Each field is one option, with its default, help, allowed values and check in its metadata
(``help``; ``type``: a ``probmoe._validate.Number`` check; ``choices``; ``none``: the command-line
word for None; ``training``: an option only training uses). Everything else derives from these
fields: ``patch_model``'s keywords, the flags and config-file keys of ``probmoe-train`` (and the
routing flags of ``probmoe-eval`` / ``probmoe-analyze``), the ``config.yaml`` a run writes, the
resume fingerprint and the settings file saved beside a checkpoint. A new option is one field here
plus the code that uses it.

The values are checked once, here, when the options are made (the checks that need the model, such
as k <= the number of experts, are ``transformers.methods.make_plan``'s). None means "the default":
the model's top-k for k and kmax, 1 for kmin, the config's ``router_aux_loss_coef`` /
``router_z_loss_coef`` for aux_loss / z_loss (0 turns them off), the method's own default for the
rest (``Method.options``). Which method takes which option is the method's declaration
(``probmoe.methods``): the checks ask the registered method object, never its name.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from probmoe._validate import Number, one_of
from probmoe.config import BACKENDS, GRADS
from probmoe.methods import get_method, methods
from probmoe.methods.balance import BALANCES
from probmoe.methods.remoe import L1_LAYERS


class _Registered:
    """The registered methods' names, read when asked (a method registered later is a choice too)."""

    def __iter__(self):
        return iter(methods())

    def __contains__(self, name) -> bool:
        return name in methods()

    def __len__(self) -> int:
        return len(methods())


def _takers(predicate) -> list[str]:
    return [name for name in methods() if predicate(get_method(name))]


def option(default, help: str, **cli):
    """A field with its command-line description (see the module docstring)."""
    return field(default=default, metadata={"help": help, **cli})


def _experts(help: str):
    return option(None, help, type=Number(int, 1))


@dataclass(frozen=True)
class RoutingOptions:
    """The routing options of ``patch_model`` (the same names as its keywords and, with ``-``, as
    the commands' flags); checked when made, ValueError naming the option and the allowed values."""

    method: str | None = option("probmoe", "routing method (see docs/transformers.md)", choices=_Registered())
    k: int | None = _experts("experts per token of the exactly-k ProbMoE methods (default: the model's top-k)")
    kmin: int | None = _experts("fewest experts per token (probmoe-dynamic; default 1)")
    kmax: int | None = _experts("most experts per token (probmoe-dynamic; default: the model's top-k)")
    backend: str = option(BACKENDS[0], "exact backend of the ProbMoE methods", choices=BACKENDS)
    grad: str = option(
        GRADS[0], "gradient of the marginals: exact Cov(z), or the paper's Cov(z) diag(1 - p)", choices=GRADS
    )
    aux_loss: float | None = option(
        None,
        "load-balancing loss coefficient (default: the model config's router_aux_loss_coef; 0 for remoe; 0: off)",
        type=Number(float, 0),
        training=True,
    )
    z_loss: float | None = option(
        None,
        "router z-loss coefficient (default: the config's router_z_loss_coef, or 0; 0: off)",
        type=Number(float, 0),
        training=True,
    )
    l1_coef: float | None = option(
        None,
        "remoe: initial L1 coefficient λ0 of the ReLU gates (default 1e-8, the paper's)",
        type=Number(float, 0, inclusive=False),
        training=True,
    )
    l1_rate: float | None = option(
        None,
        "remoe: factor (> 1) λ is multiplied or divided by after each step to steer "
        "the mean number of active experts to the model's top-k (default 1.2)",
        type=Number(float, 1, inclusive=False),
        training=True,
    )
    l1_layers: str | None = option(
        None,
        "remoe: the penalty over the layers, sum (λ per layer, the official code; "
        "default) or mean (λ/L, the paper's formula)",
        choices=L1_LAYERS,
        training=True,
    )
    jitter_eps: float | None = option(
        None,
        "sparsemixer: the band half-width ε (default 0.01, GRIN-MoE's)",
        type=Number(float, 0, inclusive=False),
        training=True,
    )
    balance: str | None = option(
        None,
        "aux-free: DeepSeek-V3's auxiliary-loss-free balancing, a per-expert bias on "
        "the selection scores updated after each step (not for sparsemixer, remoe; default "
        "none)",
        choices=BALANCES,
        none="none",
        training=True,
    )
    balance_rate: float | None = option(
        None, "aux-free: the bias step γ (default 1e-3)", type=Number(float, 0, inclusive=False), training=True
    )

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.metadata.get("type") is not None:
                object.__setattr__(self, f.name, f.metadata["type"].check(f.name, value))
            elif f.metadata.get("choices") is not None:
                one_of(f.name, value, f.metadata["choices"])
        self._check_methods()

    def _check_methods(self) -> None:
        """Each option given only to the methods that take it (the method's declaration)."""
        if self.method is None:  # no method chosen (probmoe-eval: the saved routing); make_plan refuses it
            return
        method = get_method(self.method)
        name = method.name
        own = {option for taker in methods() for option in get_method(taker).options}  # the methods' own options
        unknown = sorted(own - {f.name for f in fields(self)})
        if unknown:
            raise ValueError(
                f"a registered method declares the option {unknown[0]!r}, which RoutingOptions has no field "
                "for (a method's own option is a field of RoutingOptions too: docs/methods.md)"
            )
        given = [option for option in sorted(own) if getattr(self, option) is not None and option not in method.options]
        if given:
            takers = _takers(lambda m: given[0] in m.options)
            named = list(get_method(takers[0]).options)  # the options of the method that takes it
            raise ValueError(
                f"{', '.join(named[:-1]) + ' and ' + named[-1] if len(named) > 1 else named[0]} "
                f"appl{'y' if len(named) > 1 else 'ies'} only to method{'s' if len(takers) > 1 else ''} "
                f"{', '.join(repr(t) for t in takers)}, not to {name!r}"
            )
        if self.balance is None and self.balance_rate is not None:
            raise ValueError("balance_rate applies only with balance='aux-free'")
        if self.balance is not None and not method.balances:
            raise ValueError(
                f"balance: method {name!r} has no top-k selection to bias (ReMoE balances by its L1 "
                "penalty); it applies to the other methods"
            )
        if method.sizes == "top-k":
            for option, sizes in (("k", "exact-k"), ("kmin", "range"), ("kmax", "range")):
                if getattr(self, option) is not None:
                    takers = _takers(lambda m, sizes=sizes: m.sizes == sizes)
                    raise ValueError(
                        f"{option} applies only to the method{'s' if len(takers) > 1 else ''} "
                        f"{', '.join(takers)}; method {name!r} routes to the model's own top-k"
                    )
            if (self.backend, self.grad) != (BACKENDS[0], GRADS[0]):
                raise ValueError(f"backend and grad apply only to the ProbMoE methods, not to {name!r}")
        elif method.sizes == "range":
            if self.k is not None:
                raise ValueError(f"k: method {name!r} takes kmin and kmax (use method 'probmoe' for exactly k)")
        elif self.kmin is not None or self.kmax is not None:
            raise ValueError(
                f"kmin/kmax: method {name!r} routes exactly k experts (give k); "
                "use method 'probmoe-dynamic' for a range"
            )

    @classmethod
    def given(cls, options: RoutingOptions | None = None, **values) -> RoutingOptions:
        """``options``, or the options ``values`` name (keywords as the fields'); ValueError for both,
        or for a name that is no option."""
        if options is not None:
            if not isinstance(options, cls):
                raise ValueError(f"options must be a RoutingOptions or None, got {type(options).__name__}")
            if values:
                raise ValueError(f"pass either options or its fields ({', '.join(sorted(values))}), not both")
            return options
        unknown = sorted(set(values) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown routing options {unknown}; the options are {[f.name for f in fields(cls)]}")
        return cls(**values)

    def to_dict(self) -> dict:
        """{option: value}, JSON-able; ``from_dict`` reads it back."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data) -> RoutingOptions:
        """The options a ``to_dict`` dict (or a part of one: the rest default) names; ValueError for
        anything else."""
        known = [f.name for f in fields(cls)]
        if not isinstance(data, dict) or not set(data) <= set(known):
            raise ValueError(f"options must be an object with keys among {known}; got {data!r}")
        return cls(**data)
