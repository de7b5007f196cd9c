"""``polar token key | issue | show``: the operator's commands for per-gateway tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar_core.gateway_tokens import GatewayTokenVerifier, load_signing_key
from polar_run.cli import main


def _polar(*argv: str) -> int:
    with pytest.raises(SystemExit) as done:
        main(list(argv))
    return int(done.value.code or 0)


def test_key_issue_and_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "gateway.key"
    assert _polar("token", "key", "--out", str(key)) == 0
    assert key.stat().st_mode & 0o777 == 0o600
    assert _polar("token", "key", "--out", str(key)) == 2  # never overwritten by accident
    assert "exists; pass --force" in capsys.readouterr().err
    # The key file from the rollout server's settings, in a TOML file's [rollout] table.
    config = tmp_path / "polar.toml"
    config.write_text(f'[rollout]\ngateway_token_key_file = "{key}"\n')
    token_file = tmp_path / "gw-3.token"
    assert (
        _polar(
            "token", "issue", "--gateway-id", "gw-3", "--ttl", "2h", "--config", str(config), "--out", str(token_file)
        )
        == 0
    )
    assert token_file.stat().st_mode & 0o777 == 0o600
    claims = GatewayTokenVerifier(load_signing_key(key)).verify(token_file.read_text().strip())
    assert claims.gateway_id == "gw-3"
    assert claims.expires_at - claims.issued_at == 7200
    capsys.readouterr()
    assert _polar("token", "show", str(token_file), "--key-file", str(key)) == 0
    out = capsys.readouterr().out
    assert "gateway gw-3, issued" in out
    assert "valid" in out
    other = tmp_path / "other.key"
    assert _polar("token", "key", "--out", str(other)) == 0
    assert _polar("token", "show", str(token_file), "--key-file", str(other)) == 1
    assert "refused: gateway token signature does not match" in capsys.readouterr().out


def test_issue_without_a_key_says_where_to_give_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POLAR_ROLLOUT_GATEWAY_TOKEN_KEY_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    assert _polar("token", "issue", "--gateway-id", "gw-3") == 2
    assert "pass --key-file, or set POLAR_ROLLOUT_GATEWAY_TOKEN_KEY_FILE" in capsys.readouterr().err
