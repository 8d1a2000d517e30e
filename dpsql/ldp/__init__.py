"""Local differential privacy: client-side randomisers and server-side estimators.

    from dpsql import ldp
    m = ldp.mechanism("oue", epsilon=2.0, domain=range(1085))
    reports = m.perturb(values)          # on the client
    estimate = m.estimate(reports)       # on the server: unbiased counts per domain value
    m.variance(n)                        # closed-form variance per count for n reports

`estimate` is `estimate_from_counts(aggregate(reports), n)`; `aggregate` is the
counting step a database can do (see each mechanism's docstring).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from dpsql.ldp.base import Domain, FrequencyOracle, max_privacy_ratio, secure_generator
from dpsql.ldp.direct import DirectEncoding
from dpsql.ldp.distance import DistanceSensitiveEncoding
from dpsql.ldp.hadamard import HadamardMechanism, HadamardResponse, fwht
from dpsql.ldp.hashing import LocalHashing
from dpsql.ldp.hierarchy import LocalHierarchy
from dpsql.ldp.histogram import HistogramEncoding
from dpsql.ldp.postprocess import METHODS, consistent_tree, postprocess
from dpsql.ldp.projection import RandomMatrix
from dpsql.ldp.rappor import Rappor
from dpsql.ldp.unary import UnaryEncoding
from dpsql.policy import LOCAL_MECHANISMS

_FACTORIES: dict[str, Callable[..., FrequencyOracle]] = {
    "grr": DirectEncoding,
    "sue": lambda eps, dom, **kw: UnaryEncoding(eps, dom, kind="sue", **kw),
    "oue": lambda eps, dom, **kw: UnaryEncoding(eps, dom, kind="oue", **kw),
    "olh": LocalHashing,
    "hr": HadamardResponse,
    "hm": HadamardMechanism,
    "rappor": Rappor,
    "she": lambda eps, dom, **kw: HistogramEncoding(eps, dom, kind="she", **kw),
    "the": lambda eps, dom, **kw: HistogramEncoding(eps, dom, kind="the", **kw),
    "hh": LocalHierarchy,
    "dse": DistanceSensitiveEncoding,
    "rm": RandomMatrix,
}
_ALIASES = {"rr": "grr", "de": "grr", "krr": "grr", "ue": "oue", "lh": "olh", "hadamard": "hr"}

# The names, in this order, are the policy's (which may not import this package);
# tests/test_layout.py checks that each has its factory here.
MECHANISMS = LOCAL_MECHANISMS


def mechanism(
    name: str, epsilon: float, domain: Iterable[Any] | int, **options: Any
) -> FrequencyOracle:
    """A local-DP frequency oracle by name (one of MECHANISMS; a few aliases accepted)."""
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in _FACTORIES:
        raise ValueError(f"unknown mechanism {name!r}; choose one of {', '.join(MECHANISMS)}")
    return _FACTORIES[key](epsilon, domain, **options)


__all__ = [
    "MECHANISMS",
    "METHODS",
    "DirectEncoding",
    "DistanceSensitiveEncoding",
    "Domain",
    "FrequencyOracle",
    "HadamardMechanism",
    "HadamardResponse",
    "HistogramEncoding",
    "LocalHashing",
    "LocalHierarchy",
    "RandomMatrix",
    "Rappor",
    "UnaryEncoding",
    "consistent_tree",
    "fwht",
    "max_privacy_ratio",
    "mechanism",
    "postprocess",
    "secure_generator",
]
