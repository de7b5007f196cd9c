"""The rollout server's per-gateway token settings: the verifier they build, and the combinations refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar_core.errors import InvalidArgument
from polar_core.gateway_tokens import issue_gateway_token
from rollout_server.settings import RolloutSettings


def _key(tmp_path: Path, text: str = "k" * 64) -> Path:
    path = tmp_path / "gateway.key"
    path.write_text(text + "\n")
    return path


def test_no_key_file_means_no_verifier() -> None:
    assert RolloutSettings().gateway_token_verifier() is None


def test_the_key_file_builds_a_verifier_of_tokens_signed_with_it(tmp_path: Path) -> None:
    settings = RolloutSettings(gateway_token_key_file=_key(tmp_path), trainer_token="t", require_gateway_tokens=True)
    verifier = settings.gateway_token_verifier()
    assert verifier is not None
    assert verifier.required
    token = issue_gateway_token(b"k" * 64, "gw-1", ttl_s=60)  # the file's text, stripped, is the key
    assert verifier.verify(token).gateway_id == "gw-1"


def test_requiring_gateway_tokens_needs_a_key_and_an_authenticated_server(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="needs gateway_token_key_file"):
        RolloutSettings(require_gateway_tokens=True).gateway_token_verifier()
    with pytest.raises(InvalidArgument, match="needs a control-plane token"):
        RolloutSettings(require_gateway_tokens=True, gateway_token_key_file=_key(tmp_path)).gateway_token_verifier()


def test_a_short_or_missing_key_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="at least 32"):
        RolloutSettings(gateway_token_key_file=_key(tmp_path, "short")).gateway_token_verifier()
    with pytest.raises(InvalidArgument, match="cannot read"):
        RolloutSettings(gateway_token_key_file=tmp_path / "missing").gateway_token_verifier()
