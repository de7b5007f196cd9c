"""Client-side settings: where the rollout server is and the control-plane token (environment ``POLAR_...``)."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["ClientSettings"]


class ClientSettings(BaseSettings):
    """Defaults for ``polar submit`` / ``polar status`` and scripts.

    Attributes:
        server: ``host:port`` of the RolloutService (``POLAR_SERVER``).
        token: Control-plane token (``POLAR_TOKEN``); flags override it.
        build_missing_images: Build a Harbor task's ``environment/Dockerfile`` when the ``environment.docker_image``
            it names is not on the Docker host (``POLAR_BUILD_MISSING_IMAGES``; ``--build-missing-images``).
    """

    model_config = SettingsConfigDict(env_prefix="POLAR_", frozen=True, extra="ignore")

    server: str = "127.0.0.1:50051"
    token: str = ""
    build_missing_images: bool = False
