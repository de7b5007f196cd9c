"""Harbor task directories in Harbor's documented layout, for tests (a tiny Terminal-Bench-style task).

The task: "create /app/hello.txt containing Hello, world!". Its environment is a Dockerfile on the offline test
image (``FROM polar-test-python:bookworm``, ``WORKDIR /app``, one seeded file); its verifier is ``tests/test.sh``,
which runs pytest on ``tests/test_outputs.py`` and writes ``1`` or ``0`` to ``/logs/verifier/reward.txt``, the way
Terminal-Bench 2 tasks do (without installing pytest at test time: nothing can be downloaded here). With
``docker_image`` the task is shaped as Terminal-Bench 2.0 publishes its tasks: ``[environment] docker_image`` names a
prebuilt registry image, and the Dockerfile it was built from sits next to it.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["HELLO", "SOLVE", "TEST_SH", "write_harbor_task"]

HELLO = "Hello, world!"
SOLVE = f"echo '{HELLO}' > /app/hello.txt\n"
TASK_TOML = """\
version = "1.0"

[metadata]
author_name = "Polar tests"
difficulty = "easy"
category = "file-operations"
tags = ["file-operations"]

[verifier]
timeout_sec = {verifier_timeout}

[agent]
timeout_sec = 120.0

[environment]
build_timeout_sec = 300.0
cpus = 1
memory_mb = 1024
storage_mb = 1024
"""
DOCKERFILE = """\
FROM {base}

WORKDIR /app
COPY seed.txt /app/seed.txt
RUN mkdir -p /app/notes && echo "the file goes in /app" > /app/notes/README
"""
TEST_SH = """\
#!/bin/bash
# Terminal-Bench style: run the pytest checks, write the reward for Harbor's verifier.
python3 -m pytest -p no:cacheprovider -rA /tests/test_outputs.py
if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
TEST_OUTPUTS = f"""\
from pathlib import Path


def test_hello_file_exists():
    assert Path("/app/hello.txt").is_file()


def test_hello_file_content():
    assert Path("/app/hello.txt").read_text().strip() == {HELLO!r}


def test_seed_file_untouched():
    assert Path("/app/seed.txt").read_text() == "seed\\n"
"""


def write_harbor_task(
    root: Path,
    name: str = "hello-world",
    *,
    base: str = "polar-test-python:bookworm",
    test_sh: str = TEST_SH,
    verifier_timeout: float = 120.0,
    extra_toml: str = "",
    docker_image: str = "",
) -> Path:
    """Write a Harbor task directory ``root/name`` and return it (``docker_image``: named in ``[environment]``)."""
    task = root / name
    (task / "environment").mkdir(parents=True, exist_ok=True)
    (task / "tests").mkdir(exist_ok=True)
    (task / "solution").mkdir(exist_ok=True)
    toml = TASK_TOML.format(verifier_timeout=verifier_timeout)
    if docker_image:
        toml = toml.replace("[environment]\n", f"[environment]\ndocker_image = {json.dumps(docker_image)}\n", 1)
    (task / "task.toml").write_text(toml + extra_toml)
    (task / "instruction.md").write_text(f'Create a file called hello.txt in /app containing "{HELLO}".\n')
    (task / "environment" / "Dockerfile").write_text(DOCKERFILE.format(base=base))
    (task / "environment" / "seed.txt").write_text("seed\n")
    (task / "tests" / "test.sh").write_text(test_sh)
    (task / "tests" / "test_outputs.py").write_text(TEST_OUTPUTS)
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\n" + SOLVE)
    return task
