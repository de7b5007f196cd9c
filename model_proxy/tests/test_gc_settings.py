"""The process-wide garbage-collector tuning the proxy applies once started (``gc_freeze``)."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

from model_proxy.app import ProxyApp
from model_proxy.settings import ProxySettings
from model_proxy.tests.conftest import FakeBackend


async def test_started_proxy_freezes_and_raises_the_young_threshold(tmp_path: Path, tokenizer: Any) -> None:
    before = gc.get_threshold()
    settings = ProxySettings(state_dir=tmp_path, fsync=False, gc_freeze=True, gc_young_threshold=12_345)
    app = ProxyApp(settings, FakeBackend(tokenizer), tokenizer)
    try:
        await app.start()
        assert gc.get_threshold() == (12_345, *before[1:])
        assert gc.get_freeze_count() > 0
    finally:
        await app.close()
        gc.set_threshold(*before)
        gc.unfreeze()


async def test_gc_tuning_off_leaves_the_thresholds(tmp_path: Path, tokenizer: Any) -> None:
    before = gc.get_threshold()
    app = ProxyApp(ProxySettings(state_dir=tmp_path, fsync=False, gc_freeze=False), FakeBackend(tokenizer), tokenizer)
    try:
        await app.start()
        assert gc.get_threshold() == before
    finally:
        await app.close()
