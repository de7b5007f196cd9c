"""The one message limit: every server and channel takes ``max_message_bytes``; pages stop at a byte budget."""

from __future__ import annotations

import grpc
import pytest
from polar.common.v1 import trace_pb2

from polar_core.channels import open_channel
from polar_core.limits import DEFAULT_MAX_MESSAGE_BYTES, message_options, within_budget
from polar_core.server import ServiceRegistration, start_grpc_server
from polar_core.settings import ServiceSettings

_MIB = 1024 * 1024


def _trace(tokens: int) -> trace_pb2.Trace:
    return trace_pb2.Trace(prompt_token_ids=[1] * tokens)


def test_a_page_stops_before_the_budget_but_always_holds_one() -> None:
    traces = [_trace(100), _trace(100), _trace(100)]
    size = traces[0].ByteSize()
    assert list(within_budget(traces, 2 * size)) == traces[:2]
    assert list(within_budget(traces, 2 * size - 1)) == traces[:1]
    assert list(within_budget(traces, 1)) == traces[:1]  # one, however large: paging always advances
    assert list(within_budget([], 1)) == []


def test_settings_carry_one_generous_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ServiceSettings().max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES == 256 * _MIB
    monkeypatch.setenv("POLAR_MAX_MESSAGE_BYTES", str(64 * _MIB))
    assert ServiceSettings().max_message_bytes == 64 * _MIB
    assert message_options(5) == [("grpc.max_receive_message_length", 5), ("grpc.max_send_message_length", 5)]


def _big_reply_server() -> ServiceRegistration:
    async def reply(request: bytes, context: grpc.aio.ServicerContext) -> bytes:  # type: ignore[type-arg]
        return b"x" * int(request.decode())

    handler = grpc.method_handlers_generic_handler("test.Big", {"Get": grpc.unary_unary_rpc_method_handler(reply)})
    return ServiceRegistration("test.Big", lambda server: server.add_generic_rpc_handlers((handler,)))


def _get(channel: grpc.aio.Channel) -> grpc.aio.UnaryUnaryMultiCallable:  # type: ignore[type-arg]
    return channel.unary_unary("/test.Big/Get", request_serializer=None, response_deserializer=None)


async def test_servers_and_channels_pass_messages_past_grpcs_default_limit() -> None:
    server, port = await start_grpc_server([_big_reply_server()], host="127.0.0.1", port=0)
    try:
        async with open_channel(f"127.0.0.1:{port}") as channel:
            got = await _get(channel)(str(12 * _MIB).encode(), timeout=30)
            assert len(got) == 12 * _MIB
        async with open_channel(f"127.0.0.1:{port}", max_message_bytes=4 * _MIB) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _get(channel)(str(5 * _MIB).encode(), timeout=30)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        await server.stop(None)
    small, port = await start_grpc_server([_big_reply_server()], host="127.0.0.1", port=0, max_message_bytes=_MIB)
    try:
        async with open_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _get(channel)(str(2 * _MIB).encode(), timeout=30)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        await small.stop(None)
