"""Settings of the RolloutService."""

from __future__ import annotations

from typing import ClassVar

from pydantic_settings import SettingsConfigDict

from polar_core.settings import ServiceSettings

__all__ = ["RolloutSettings"]


class RolloutSettings(ServiceSettings):
    """Settings of the RolloutService; environment prefix ``POLAR_ROLLOUT_``, TOML table ``[rollout]``."""

    model_config = SettingsConfigDict(env_prefix="POLAR_ROLLOUT_", frozen=True, extra="forbid")
    toml_table: ClassVar[str] = "rollout"
