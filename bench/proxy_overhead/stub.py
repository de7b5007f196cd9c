"""A minimal HTTP/1.1 keep-alive stub backend: canned answers, no JSON parsing, about 0.1 ms a call.

``POST …/completions`` answers like vLLM's token-in/token-out ``/v1/completions`` (``token_ids`` and
``logprobs.token_logprobs``; what the proxy's ``vllm`` backend reads); ``POST …/responses`` answers like an
OpenAI Responses object (LiteLLM sends Anthropic Messages calls for ``openai/`` models there); every other
``POST`` answers like an OpenAI Chat Completion; ``GET`` answers ``/v1/models``.

Run as ``python -m bench.proxy_overhead.stub IDS_JSON``; it prints its port and serves until its standard
input closes.
"""

from __future__ import annotations

import asyncio
import json
import sys

__all__ = ["CANNED", "serve_stub"]

CANNED = "The answer is 42."


def _response(body: bytes) -> bytes:
    head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode() + body


class _StubProtocol(asyncio.Protocol):
    def __init__(self, chat: bytes, completions: bytes, responses: bytes, models: bytes) -> None:
        self._answers = (chat, completions, responses, models)
        self._buf = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while True:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = self._buf[:end].split(b"\r\n")
            length = 0
            for header in lines[1:]:
                name, _, value = header.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self._buf) < end + 4 + length:
                return
            line = lines[0].lower()
            self._buf = self._buf[end + 4 + length :]
            chat, completions, responses, models = self._answers
            if line.startswith(b"get"):
                answer = models
            elif b"/responses" in line:
                answer = responses
            elif b"/completions" in line and b"/chat/completions" not in line:
                answer = completions
            else:
                answer = chat
            assert self._transport is not None
            self._transport.write(answer)


async def serve_stub(token_ids: list[int], host: str = "127.0.0.1") -> asyncio.Server:
    """Start the stub on a free port."""
    chat = json.dumps(
        {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "created": 0,
            "model": "policy",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": CANNED}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": len(token_ids), "total_tokens": 1 + len(token_ids)},
        }
    ).encode()
    completions = json.dumps(
        {
            "id": "cmpl-stub",
            "object": "text_completion",
            "model": "policy",
            "choices": [
                {
                    "index": 0,
                    "text": CANNED,
                    "token_ids": token_ids,
                    "logprobs": {"token_logprobs": [-0.1] * len(token_ids)},
                    "finish_reason": "stop",
                }
            ],
        }
    ).encode()
    responses = json.dumps(
        {
            "id": "resp_stub",
            "object": "response",
            "created_at": 0,
            "status": "completed",
            "model": "policy",
            "output": [
                {
                    "type": "message",
                    "id": "msg_stub",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": CANNED, "annotations": []}],
                }
            ],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {"input_tokens": 1, "output_tokens": len(token_ids), "total_tokens": 1 + len(token_ids)},
        }
    ).encode()
    models = json.dumps({"object": "list", "data": [{"id": "policy", "object": "model"}]}).encode()
    answers = (_response(chat), _response(completions), _response(responses), _response(models))
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: _StubProtocol(*answers), host, 0, backlog=2048)


async def _main(token_ids: list[int]) -> None:
    server = await serve_stub(token_ids)
    print(json.dumps({"port": server.sockets[0].getsockname()[1]}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    server.close()


if __name__ == "__main__":
    asyncio.run(_main(json.loads(sys.argv[1])))
