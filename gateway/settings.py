"""Settings of the GatewayService."""

from __future__ import annotations

from typing import ClassVar

from pydantic_settings import SettingsConfigDict

from polar_core.settings import ServiceSettings

__all__ = ["GatewaySettings"]


class GatewaySettings(ServiceSettings):
    """Settings of the GatewayService; environment prefix ``POLAR_GATEWAY_``, TOML table ``[gateway]``."""

    model_config = SettingsConfigDict(env_prefix="POLAR_GATEWAY_", frozen=True, extra="forbid")
    toml_table: ClassVar[str] = "gateway"
