"""A privacy auditor: statistically valid lower bounds on the epsilon a release really spends.

It runs a mechanism, or a whole query through a Session's plan, many times
on neighbouring inputs, picks the event that best tells them apart on one
half of the runs, and bounds epsilon from that event's frequencies on the
other half with Clopper-Pearson intervals. A bound above the claimed epsilon
proves, at the stated confidence, that the claim is false. `python -m
dpsql.audit --help` runs it from the command line; docs/audit.md explains it.
"""

from dpsql.audit.events import Event, Finding, audit_outputs, low_bits
from dpsql.audit.mechanisms import (
    HalfNoiseLaplace,
    MechanismTarget,
    NumpyLaplace,
    audit_mechanism,
    catalog,
    claim,
    gaussian_rho,
)
from dpsql.audit.queries import QUERIES, audit_query

__all__ = [
    "QUERIES", "Event", "Finding", "HalfNoiseLaplace", "MechanismTarget", "NumpyLaplace",
    "audit_mechanism", "audit_outputs", "audit_query", "catalog", "claim", "gaussian_rho",
    "low_bits",
]  # fmt: skip
