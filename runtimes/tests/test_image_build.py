"""The pure parts of building Harbor environments: Dockerfile bases, content hashes and tags."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar_core.errors import InvalidArgument
from runtimes.image_build import context_hash, dockerfile_bases, image_tags


def test_bases_skip_scratch_and_build_stages() -> None:
    text = (
        "# syntax=docker/dockerfile:1\n"
        "FROM --platform=linux/amd64 python:3.13-slim AS build\n"
        "RUN echo hi \\\n  && echo there\n"
        "FROM scratch AS empty\n"
        "FROM build\n"
        "from ubuntu:24.04\n"
    )
    assert dockerfile_bases(text) == ["python:3.13-slim", "ubuntu:24.04"]


@pytest.mark.parametrize("text", ["ARG BASE=python\nFROM $BASE\n", "RUN true\n", "FROM a b c d\n"])
def test_unreadable_from_lines_are_refused(text: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        dockerfile_bases(text)
    assert info.value.details["field"] == "environment/Dockerfile"


def test_the_hash_covers_every_file_and_its_mode(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "f").write_text("1")
    first = context_hash(tmp_path)
    assert context_hash(tmp_path) == first
    (tmp_path / "data" / "f").chmod(0o755)
    second = context_hash(tmp_path)
    assert second != first
    (tmp_path / "data" / "f").write_text("2")
    assert context_hash(tmp_path) != second
    assert context_hash(tmp_path, docker_image="img") != context_hash(tmp_path)
    base, tag = image_tags("Org/Hello World!", first)
    assert tag == f"polar-harbor/org-hello-world:{first[:16]}"
    assert base == f"polar-harbor-base/org-hello-world:{first[:16]}"
