"""The rollout server's live dashboard: one HTTP port showing how a run is doing, updated by server-sent events.

Off unless ``dashboard_address`` is set (``polar run`` sets it). See ``docs/observability.md``, "Dashboard".
"""

from __future__ import annotations

from rollout_server.dashboard.auth import DashboardAuth
from rollout_server.dashboard.data import DashboardData, DataConfig, jaeger_trace_url
from rollout_server.dashboard.hub import SnapshotHub
from rollout_server.dashboard.proxy_metrics import ProxyMetricsSource
from rollout_server.dashboard.server import Dashboard, parse_address

__all__ = [
    "Dashboard",
    "DashboardAuth",
    "DashboardData",
    "DataConfig",
    "ProxyMetricsSource",
    "SnapshotHub",
    "jaeger_trace_url",
    "parse_address",
]
