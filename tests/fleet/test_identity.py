"""A replica is admitted only with the fleet's fingerprint; the refusal names each differing field."""
import pytest

from samebits.fleet.identity import IdentityError, check_identity
from samebits.runtime.fingerprint import with_fields


def test_equal_fingerprints_pass_and_a_differing_field_is_named():
    fp = with_fields({"mode": "deterministic", "weights": "a", "cpu_threads": 1, "vendor_gemm": {}})
    check_identity(fp, dict(fp), "replica 1")
    check_identity(fp, with_fields(fp, vendor_gemm={"x": 1}), "replica 1")  # unhashed: a verdict, not numerics
    with pytest.raises(IdentityError, match=r"replica 2 .*mode: fleet 'deterministic', replica 'fast'") as e:
        check_identity(fp, with_fields(fp, mode="fast", weights="b"), "replica 2")
    assert e.value.fields == ["mode", "weights"]
