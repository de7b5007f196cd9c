"""The proxy's domain, protocol-independent: the call engine and what it runs on.

:class:`ProxyEngine` (``engine.py``) is the entry: it renders a request (``render.py``, ``template.py``), waits at
the generation gate (``gate.py``), calls the backend, parses the output (``parsing.py``) and records the
completion in its session (``sessions.py`` over the durable ``store.py``). Nothing here imports grpc.
"""

from __future__ import annotations

from model_proxy.core.engine import Call, ProxyEngine
from model_proxy.core.events import CallResult, OutputEvent
from model_proxy.core.gate import GenerationGate
from model_proxy.core.normalize import NormalizationRule, build_rules
from model_proxy.core.parsing import OutputParser, create_parser
from model_proxy.core.render import ChatRenderer
from model_proxy.core.sessions import Session, SessionRegistry
from model_proxy.core.store import SessionMeta, SessionStore

__all__ = [
    "Call",
    "CallResult",
    "ChatRenderer",
    "GenerationGate",
    "NormalizationRule",
    "OutputEvent",
    "OutputParser",
    "ProxyEngine",
    "Session",
    "SessionMeta",
    "SessionRegistry",
    "SessionStore",
    "build_rules",
    "create_parser",
]
