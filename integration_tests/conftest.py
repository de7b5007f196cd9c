from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from integration_tests.otlp import OtlpReceiver


@pytest.fixture
async def otlp_receiver() -> AsyncIterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    await receiver.start()
    try:
        yield receiver
    finally:
        await receiver.stop()
