"""Client-side settings: where the rollout server is and the control-plane token (environment ``POLAR_...``)."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["ClientSettings"]


class ClientSettings(BaseSettings):
    """Defaults for ``polar submit`` / ``polar status`` and scripts.

    Attributes:
        server: ``host:port`` of the RolloutService (``POLAR_SERVER``).
        token: Control-plane token (``POLAR_TOKEN``); flags override it.
    """

    model_config = SettingsConfigDict(env_prefix="POLAR_", frozen=True, extra="ignore")

    server: str = "127.0.0.1:50051"
    token: str = ""
