"""The policy registry: adding a policy is one file in construct/ (a `Policy`, see policy.py) and
one entry here."""

from __future__ import annotations

from workbench.construct.markov import MarkovPolicy
from workbench.construct.policy import Policy
from workbench.construct.roller import RollerPolicy
from workbench.errors import UserError

POLICIES: dict[str, type[Policy]] = {p.name: p for p in (RollerPolicy, MarkovPolicy)}


def policy_class(name: str) -> type[Policy]:
    """The registered policy called `name`; UserError naming the known ones otherwise."""
    if name not in POLICIES:
        raise UserError(f"unknown policy '{name}' (known: {', '.join(sorted(POLICIES))})")
    return POLICIES[name]
