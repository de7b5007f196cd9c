"""``polar serve``'s wiring of several services in one process: the proxy joins the rollout server's fleet."""

from __future__ import annotations

from polar_core.settings import ServiceSettings
from polar_run.serve import _START_ORDER, SERVE_PROXY_ID, _wiring, service_spec


def _proxy_settings(**values: object) -> ServiceSettings:
    return service_spec("proxy").settings_cls.load(None, **values)


def test_the_rollout_server_starts_before_the_proxy_and_the_gateway_last() -> None:
    assert _START_ORDER.index("rollout") < _START_ORDER.index("proxy")
    assert _START_ORDER[-1] == "gateway"


def test_the_proxy_registers_with_the_rollout_server_of_the_process_under_a_stable_id() -> None:
    wiring = _wiring("proxy", _proxy_settings(), {"rollout": "127.0.0.1:5001"}, "tok")
    assert wiring == {"auth_token": "tok", "rollout_address": "127.0.0.1:5001", "proxy_id": SERVE_PROXY_ID}


def test_what_the_operator_configured_is_kept() -> None:
    settings = _proxy_settings(rollout_address="rollout.example:50051", proxy_id="gpu-3", auth_token="mine")
    assert _wiring("proxy", settings, {"rollout": "127.0.0.1:5001"}, "tok") == {}
    own_id = _proxy_settings(proxy_id="gpu-3")
    assert _wiring("proxy", own_id, {"rollout": "127.0.0.1:5001"}, "")["rollout_address"] == "127.0.0.1:5001"
    assert "proxy_id" not in _wiring("proxy", own_id, {"rollout": "127.0.0.1:5001"}, "")


def test_a_proxy_served_alone_joins_no_fleet() -> None:
    assert _wiring("proxy", _proxy_settings(), {}, "") == {}
