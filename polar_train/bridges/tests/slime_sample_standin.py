"""A STAND-IN for slime's ``Sample`` (``slime/utils/types.py``) and its data source, for tests only.

slime is not on the package index, so the bridge is tested against slime's interface, not the package. The
fields below mirror ``Sample`` exactly, in order, at THUDM/slime commit
``624b824a898ab0ec1fcb4d373004c7f3852bf515``; tensor-typed fields are typed ``Any`` (no torch needed) and the
SGLang-specific helpers (``append_response_tokens``, top-p replay) are left out: the bridge does not call them.
``to_dict``/``from_dict`` follow slime's code. :func:`check_train_contract` repeats the checks slime's
``RolloutManager._convert_samples_to_train_data`` and ``_post_process_rewards`` make on what a rollout function
returns, and :class:`StandInDataSource` behaves like slime's ``RolloutDataSource`` for a list of prompts
(``get_samples``, ``save``/``load`` of its position).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


@dataclass
class Sample:
    """The sample generated (a stand-in of slime's ``slime.utils.types.Sample``)."""

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: Any = None
    rollout_top_p_token_offsets: Any = None
    rollout_routed_experts: Any = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING

    metadata: dict[str, Any] = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict[str, Any] | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0

    @dataclass
    class SpecInfo:
        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

        def to_dict(self) -> dict[str, int]:
            return {
                "spec_accept_token_num": self.spec_accept_token_num,
                "spec_draft_token_num": self.spec_draft_token_num,
                "spec_verify_ct": self.spec_verify_ct,
                "completion_token_num": self.completion_token_num,
            }

        @staticmethod
        def from_dict(data: dict[str, int]) -> Sample.SpecInfo:
            return Sample.SpecInfo(**data)

    spec_info: SpecInfo = field(default_factory=SpecInfo)

    @dataclass
    class PrefixCacheInfo:
        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        def to_dict(self) -> dict[str, int]:
            return {"cached_tokens": self.cached_tokens, "total_prompt_tokens": self.total_prompt_tokens}

        @staticmethod
        def from_dict(data: dict[str, int]) -> Sample.PrefixCacheInfo:
            return Sample.PrefixCacheInfo(**data)

    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    def to_dict(self) -> dict[str, Any]:
        value = self.__dict__.copy()
        value["status"] = self.status.value
        value["spec_info"] = self.spec_info.to_dict()
        value["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        return value

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Sample:
        data = dict(data)
        data["status"] = Sample.Status(data["status"])
        data["spec_info"] = Sample.SpecInfo.from_dict(data.get("spec_info", {}))
        data["prefix_cache_info"] = Sample.PrefixCacheInfo.from_dict(data.get("prefix_cache_info", {}))
        names = set(Sample.__dataclass_fields__)
        sample = Sample(**{k: v for k, v in data.items() if k in names})
        for key, value in data.items():
            if key not in names:
                setattr(sample, key, value)
        return sample

    @property
    def effective_response_length(self) -> int:
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length


class StandInDataSource:
    """slime's ``RolloutDataSource`` over a list of prompts (no shuffle), with ``save``/``load`` of its position."""

    def __init__(self, prompts: list[str], n_samples_per_prompt: int) -> None:
        self.prompts = prompts
        self.n = n_samples_per_prompt
        self.sample_offset = 0
        self.epoch_id = 0
        self.sample_group_index = 0
        self.sample_index = 0

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        groups = []
        for _ in range(num_samples):
            if self.sample_offset == len(self.prompts):
                self.sample_offset, self.epoch_id = 0, self.epoch_id + 1
            prompt = Sample(prompt=self.prompts[self.sample_offset], label=f"label-{self.sample_offset}")
            self.sample_offset += 1
            group = []
            for _ in range(self.n):
                sample = copy.deepcopy(prompt)
                sample.group_index, sample.index = self.sample_group_index, self.sample_index
                self.sample_index += 1
                group.append(sample)
            self.sample_group_index += 1
            groups.append(group)
        return groups

    def save(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in ("sample_offset", "epoch_id", "sample_group_index", "sample_index")}

    def load(self, state: dict[str, int]) -> None:
        for key, value in state.items():
            setattr(self, key, value)


def check_train_contract(groups: Any, *, rollout_batch_size: int, n_samples_per_prompt: int) -> list[Sample]:
    """The checks slime makes on a rollout function's training output; returns the flattened samples."""
    samples = getattr(groups, "samples", groups)
    assert len(samples) == rollout_batch_size, f"Got {len(samples)} groups, expected {rollout_batch_size}"
    flat: list[Sample] = []
    for group in samples:
        assert len(group) == n_samples_per_prompt
        flat.extend(group)
    # _post_process_rewards reshapes the rewards to n_samples_per_prompt columns only with this many samples.
    assert len(flat) == rollout_batch_size * n_samples_per_prompt
    for sample in flat:
        assert isinstance(sample.status, Sample.Status)
        assert sample.status is not Sample.Status.PENDING
        assert isinstance(sample.reward, float)
        assert sample.tokens
        assert 0 < sample.response_length <= len(sample.tokens)
        assert sample.loss_mask is not None
        assert len(sample.loss_mask) == sample.response_length, "loss mask length != response length"
        assert sample.rollout_log_probs is not None
        assert len(sample.rollout_log_probs) == sample.response_length
    return flat
