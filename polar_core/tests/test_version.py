"""check_same_version: versions that differ are refused with both named; what is not a version is not compared."""

from __future__ import annotations

import pytest

from polar_core.errors import FailedPrecondition
from polar_core.version import check_same_version


def test_the_same_release_passes_and_another_is_refused_naming_both() -> None:
    check_same_version("gateway g", "0.1.0", "0.1.0")
    check_same_version("gateway g", "0.1", "0.1.0")  # the same version, spelled differently
    with pytest.raises(FailedPrecondition) as refused:
        check_same_version("gateway g", "0.2.0", "0.1.0")
    assert "gateway g runs Polar 0.2.0 but this rollout server runs Polar 0.1.0" in str(refused.value)
    assert refused.value.details == {"role": "gateway g", "version": "0.2.0", "server_version": "0.1.0"}


@pytest.mark.parametrize(("theirs", "ours"), [("", "0.1.0"), ("0.1.0", ""), ("fake", "0.1.0"), ("bench", "")])
def test_what_is_not_a_version_is_not_compared(theirs: str, ours: str) -> None:
    check_same_version("proxy p", theirs, ours)
