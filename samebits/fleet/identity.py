"""One numerics identity per fleet: a replica serves only if its fingerprint equals the fleet's, field for field."""
from __future__ import annotations

from samebits.runtime.fingerprint import diff_fingerprints


class IdentityError(ValueError):
    """A replica's fingerprint differs from the fleet's; the message names every differing field."""

    def __init__(self, who: str, fields: list[tuple[str, object, object]]):
        self.fields = [name for name, _, _ in fields]
        shown = "; ".join(f"{name}: fleet {ours!r}, replica {theirs!r}" for name, ours, theirs in fields)
        super().__init__(f"{who} has another numerics identity than the fleet, so it could answer with other bits; "
                         f"differing fields: {shown}")


def check_identity(fleet: dict, replica: dict, who: str) -> None:
    """Raise IdentityError unless `replica`'s fingerprint has the fleet's every hashed field (runtime, kernels,
    mode, model, weights version)."""
    fields = diff_fingerprints(fleet, replica)
    if fields:
        raise IdentityError(who, fields)
    if fleet.get("hash") != replica.get("hash"):  # every hashed field agrees, so only a changed hash function
        raise IdentityError(who, [("hash", fleet.get("hash"), replica.get("hash"))])

