"""The generated protobuf contracts: every module imports, services carry their RPCs, and the messages
carry the field names promised in ``docs/contracts.md``."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import polar
import pytest
from google.protobuf import json_format, struct_pb2
from google.protobuf.descriptor import FieldDescriptor
from polar.common.v1 import completion_pb2, status_pb2, trace_pb2
from polar.evaluator.v1 import evaluator_service_pb2
from polar.gateway.v1 import gateway_service_pb2
from polar.proxy.v1 import model_proxy_service_pb2
from polar.reconstructor.v1 import reconstructor_service_pb2
from polar.rollout.v1 import rollout_service_pb2, trainer_callback_service_pb2

_COMPLETION_FIELDS = {
    "session_id",
    "call_id",
    "parent_call_id",
    "seq",
    "protocol",
    "model",
    "policy_version",
    "prompt_token_ids",
    "response_token_ids",
    "response_logprobs",
    "finish_reason",
    "request",
    "response",
    "started_at",
    "ended_at",
}

_TRACE_FIELDS = {
    "session_id",
    "task_id",
    "trace_index",
    "call_ids",
    "prompt_token_ids",
    "response_token_ids",
    "loss_mask",
    "response_logprobs",
    "reward",
    "weight",
    "status",
    "exact_context",
    "policy_versions",
}

_SERVICES: list[tuple[ModuleType, str, set[str]]] = [
    (
        rollout_service_pb2,
        "RolloutService",
        {
            "SubmitTask",
            "GetTask",
            "ListTasks",
            "WatchTask",
            "CancelTask",
            "RegisterGateway",
            "Heartbeat",
            "DrainGateway",
            "ListGateways",
            "ReportSessionResult",
            "ReportSessionResultStream",
            "UpdatePolicy",
            "GetPolicy",
            "RegisterProxy",
        },
    ),
    (trainer_callback_service_pb2, "TrainerCallbackService", {"DeliverSessionResult"}),
    (
        gateway_service_pb2,
        "GatewayService",
        {"StartSession", "GetSession", "CancelSession", "WatchSessions", "GetCapacity"},
    ),
    (
        model_proxy_service_pb2,
        "ModelProxyService",
        {
            "OpenSession",
            "CloseSession",
            "ListCompletions",
            "WatchCompletions",
            "SetPolicyVersion",
            "PauseGeneration",
            "ResumeGeneration",
            "CheckWeights",
            "LoadWeights",
            "GetPolicy",
        },
    ),
    (reconstructor_service_pb2, "ReconstructorService", {"Reconstruct", "ReconstructStream"}),
    (evaluator_service_pb2, "EvaluatorService", {"Prepare", "Evaluate", "Release"}),
]

_SERVER_STREAMING = {
    ("RolloutService", "WatchTask"),
    ("GatewayService", "WatchSessions"),
    ("ModelProxyService", "WatchCompletions"),
    ("ReconstructorService", "ReconstructStream"),
}
_CLIENT_STREAMING = {
    ("RolloutService", "ReportSessionResultStream"),
    ("ReconstructorService", "ReconstructStream"),
}


def _generated_module_names() -> list[str]:
    return sorted(info.name for info in pkgutil.walk_packages(polar.__path__, prefix="polar."))


def test_generated_package_is_not_empty() -> None:
    names = _generated_module_names()
    assert any(name.endswith("_pb2") for name in names)
    assert any(name.endswith("_pb2_grpc") for name in names)


@pytest.mark.parametrize("name", _generated_module_names())
def test_every_generated_module_imports(name: str) -> None:
    importlib.import_module(name)


@pytest.mark.parametrize(("module", "service", "rpcs"), _SERVICES, ids=[s for _, s, _ in _SERVICES])
def test_service_has_rpcs(module: ModuleType, service: str, rpcs: set[str]) -> None:
    descriptor = module.DESCRIPTOR.services_by_name[service]
    methods = {m.name: m for m in descriptor.methods}
    assert set(methods) == rpcs
    for name, method in methods.items():
        # Every RPC has its own request and response message named after it.
        assert method.input_type.name == f"{name}Request"
        assert method.output_type.name == f"{name}Response"
        assert method.server_streaming == ((service, name) in _SERVER_STREAMING)
        assert method.client_streaming == ((service, name) in _CLIENT_STREAMING)


def test_completion_carries_contract_fields() -> None:
    fields = completion_pb2.Completion.DESCRIPTOR.fields_by_name
    assert set(fields) >= _COMPLETION_FIELDS
    assert fields["parent_call_id"].has_presence
    assert fields["response_logprobs"].type == FieldDescriptor.TYPE_DOUBLE
    assert fields["started_at"].type == FieldDescriptor.TYPE_DOUBLE


def test_trace_carries_contract_fields() -> None:
    fields = trace_pb2.Trace.DESCRIPTOR.fields_by_name
    assert set(fields) >= _TRACE_FIELDS
    assert fields["status"].type == FieldDescriptor.TYPE_STRING
    assert fields["loss_mask"].type == FieldDescriptor.TYPE_INT32


def test_terminal_status_names_match_contract() -> None:
    names = {
        v.name.removeprefix("TERMINAL_STATUS_").lower()
        for v in status_pb2.TerminalStatus.DESCRIPTOR.values
        if v.number != 0
    }
    assert names == {
        "resolved",
        "unresolved",
        "agent_timeout",
        "eval_timeout",
        "invalid_patch",
        "infra_error",
        "cancelled",
    }


def test_completion_round_trip() -> None:
    request = struct_pb2.Struct()
    request.update({"messages": [{"role": "user", "content": "hi"}], "tools": []})
    response = struct_pb2.Struct()
    response.update({"text": "hello", "tool_calls": []})
    original = completion_pb2.Completion(
        session_id="s-1",
        call_id="c-2",
        parent_call_id="c-1",
        seq=1,
        protocol="openai_chat",
        model="qwen",
        policy_version="v7",
        prompt_token_ids=[1, 2, 3],
        response_token_ids=[4, 5, 151645],
        response_logprobs=[-0.5, -0.25, -0.125],
        finish_reason="stop",
        request=request,
        response=response,
        started_at=1_700_000_000.5,
        ended_at=1_700_000_001.25,
        normalization_rules_fired=["strip_cache_control"],
        backend="scripted",
    )
    decoded = completion_pb2.Completion.FromString(original.SerializeToString())
    assert decoded == original
    assert decoded.HasField("parent_call_id")
    assert list(decoded.response_logprobs) == [-0.5, -0.25, -0.125]
    assert json_format.MessageToDict(decoded.request) == {
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [],
    }

    root = completion_pb2.Completion.FromString(
        completion_pb2.Completion(session_id="s-1", call_id="c-1").SerializeToString()
    )
    assert not root.HasField("parent_call_id")
