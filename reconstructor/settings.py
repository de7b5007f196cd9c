"""Settings of the reconstructor (environment prefix ``POLAR_RECONSTRUCTOR_``, TOML table ``[reconstructor]``)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from polar_core.records import ReconstructionStrategy
from polar_core.settings import ServiceSettings
from reconstructor.trace_weights import WeightingMode

__all__ = ["ReconstructorSettings"]


class ReconstructorSettings(ServiceSettings):
    """Settings of the reconstructor service.

    Attributes:
        default_strategy: Strategy used when a request leaves it unspecified.
        end_of_turn_ids: End-of-turn token IDs used when a request gives none.
        tokenizer_dir: A Hugging Face tokenizer directory naming the end-of-turn tokens, used when neither
            the request nor ``end_of_turn_ids`` gives them. Without either, they are detected from the
            session's completions.
        default_weighting: Weighting used when a request leaves it unspecified.
        split_on_policy_version: Keep calls sampled by different policy versions in different traces (default
            on; ``false`` opts out and merges across versions).
        prefer_exact_context: (prefix-merge) prefer context-exact merges when several chains qualify; off by
            default (Polar's order: parent, longest prefix, most recent).
        proxy_page_size: Completions fetched per ``ListCompletions`` page when reading from a proxy.
        proxy_timeout_s: Limit on each ``ListCompletions`` call.
    """

    model_config = SettingsConfigDict(env_prefix="POLAR_RECONSTRUCTOR_", frozen=True, extra="forbid")
    toml_table: ClassVar[str] = "reconstructor"

    default_strategy: ReconstructionStrategy = ReconstructionStrategy.PREFIX_MERGE
    end_of_turn_ids: tuple[int, ...] = ()
    tokenizer_dir: Path | None = None
    default_weighting: WeightingMode = WeightingMode.SESSION
    split_on_policy_version: bool = True
    prefer_exact_context: bool = False
    proxy_page_size: int = Field(default=500, ge=1, le=10_000)
    proxy_timeout_s: float = Field(default=60.0, gt=0)
