"""Seconds ↔ protobuf ``Duration``/``Timestamp``: the one conversion every service uses."""

from __future__ import annotations

from google.protobuf import duration_pb2, timestamp_pb2

__all__ = ["duration", "seconds", "timestamp", "timestamp_seconds"]


def duration(value_s: float) -> duration_pb2.Duration:
    """A ``Duration`` of ``value_s`` seconds (nanosecond precision)."""
    out = duration_pb2.Duration()
    out.FromNanoseconds(int(value_s * 1e9))
    return out


def seconds(value: duration_pb2.Duration) -> float:
    """The length of a ``Duration`` in seconds (computed as every service always has, so hashes stay stable)."""
    return value.seconds + value.nanos / 1e9


def timestamp(unix_s: float) -> timestamp_pb2.Timestamp:
    """A ``Timestamp`` at ``unix_s`` seconds since the epoch."""
    out = timestamp_pb2.Timestamp()
    out.FromNanoseconds(int(unix_s * 1e9))
    return out


def timestamp_seconds(value: timestamp_pb2.Timestamp) -> float:
    """A ``Timestamp`` as Unix seconds."""
    return value.seconds + value.nanos / 1e9
