from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from polar_core.records import TerminalStatus
from polar_core.tls import TlsFiles
from rollout_server.app import _outgoing_tokens
from rollout_server.clients import CallbackSenders
from rollout_server.errors import DeliveryFailed
from rollout_server.models import CallbackTarget, ResultRecord
from rollout_server.settings import RolloutSettings


def test_callbacks_never_get_the_internal_token() -> None:
    digest = "sha256:" + hashlib.sha256(b"t").hexdigest()
    assert _outgoing_tokens(RolloutSettings(auth_token="all")) == ("all", "all")
    assert _outgoing_tokens(RolloutSettings(auth_token="all", gateway_auth_token="gw")) == ("gw", "gw")
    roles = RolloutSettings(auth_token="all", trainer_token="t", internal_token="i")
    assert _outgoing_tokens(roles) == ("i", "t")
    assert _outgoing_tokens(RolloutSettings(internal_token="i")) == ("i", "")
    assert _outgoing_tokens(RolloutSettings(internal_token="i", trainer_token=digest)) == ("i", "")


async def test_a_tls_fleet_refuses_plain_http_callbacks_for_good(tmp_path: Path) -> None:
    files = TlsFiles(tmp_path / "c.crt", tmp_path / "c.key", tmp_path / "ca.crt")
    sender = CallbackSenders(tls=files)
    result = ResultRecord("s", "t", 0, TerminalStatus.RESOLVED, 1.0, 1, "g", "k")
    try:
        with pytest.raises(DeliveryFailed, match="must be https") as info:
            await sender.deliver(CallbackTarget("http", "http://trainer:8000/results", 0), result, 1)
        assert not info.value.retryable
    finally:
        await sender.close()
