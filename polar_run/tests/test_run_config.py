"""Task preparation for ``polar run``/``generate``: path resolution, overrides, defaults (no ports)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from polar_checks.harnesses import HARNESS_OPTIONS
from polar_client import task_from_mapping
from polar_core.errors import FailedPrecondition, InvalidArgument
from polar_run.run import default_out_dir, prepare_out_dir
from polar_run.run_config import (
    DEFAULT_HARNESS,
    IN_PROCESS_MAX_TOKENS,
    RunOverrides,
    find_harness_root,
    harness_name,
    parse_backend_options,
    prepare_task,
)


def _harness_root(tmp: Path, *binaries: str) -> Path:
    root = tmp / ".harnesses"
    bin_dir = root / "node_modules" / ".bin"
    bin_dir.mkdir(parents=True)
    for name in binaries:
        (bin_dir / name).write_text("#!/bin/sh\n")
    return root


def _task_file(tmp: Path, **fields: object) -> Path:
    task_dir = tmp / "task"
    (task_dir / "repo").mkdir(parents=True)
    (task_dir / "script.jsonl").write_text('{"text": "hi"}\n')
    data: dict[str, object] = {
        "task_id": "t1",
        "instruction": "Fix it.",
        "num_samples": 4,
        "evaluator": {"strategy": "swe", "repo": "repo", "fail_to_pass": ["tests/test_x.py::test_y"]},
        "metadata": {"repo": "repo", "language": "python"},
    }
    data.update(fields)
    path = task_dir / "task.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_paths_resolve_relative_to_the_task_file(tmp_path: Path) -> None:
    path = _task_file(tmp_path, harness={"name": "command", "argv": ["true"]})
    prepared = prepare_task(path)
    assert prepared.task["evaluator"]["repo"] == str((tmp_path / "task" / "repo").resolve())
    assert prepared.task["metadata"]["repo"] == str((tmp_path / "task" / "repo").resolve())
    assert prepared.task_dir == (tmp_path / "task").resolve()
    task_from_mapping(prepared.task)  # the prepared mapping is a valid task


def test_default_harness_is_pi_with_a_token_cap(tmp_path: Path) -> None:
    root = _harness_root(tmp_path, "pi")
    prepared = prepare_task(_task_file(tmp_path), RunOverrides(harness_root=root))
    assert prepared.harness == DEFAULT_HARNESS == "pi"
    assert prepared.task["harness"] == {"name": "pi", "max_tokens": IN_PROCESS_MAX_TOKENS}
    assert prepared.harness_bin_dir == root.resolve() / "node_modules" / ".bin"
    assert str(root.resolve()) in prepared.task["runtime"]["read_only_paths"]


def test_harness_override_drops_the_old_options_and_accepts_underscores(tmp_path: Path) -> None:
    root = _harness_root(tmp_path, "claude", "pi")
    path = _task_file(tmp_path, harness={"name": "claude_code", "bare": True})
    same = prepare_task(path, RunOverrides(harness_root=root))
    assert same.task["harness"] == {"name": "claude-code", "bare": True}
    other = prepare_task(path, RunOverrides(harness="pi", max_tokens=64, harness_root=root))
    assert other.task["harness"] == {"name": "pi", "max_tokens": 64}


def test_every_registered_harness_is_read_with_underscores_for_hyphens() -> None:
    # The rule that replaced polar run's alias table: it covers every harness, a new one included.
    for name in HARNESS_OPTIONS:
        assert harness_name(name) == harness_name(name.replace("-", "_")) == name
    assert harness_name("no_such_harness") == "no-such-harness"  # refused later, under the registered spelling


def test_the_token_cap_applies_to_the_in_process_model_only(tmp_path: Path) -> None:
    root = _harness_root(tmp_path, "pi")
    path = _task_file(tmp_path, harness={"name": "pi"})
    remote = prepare_task(path, RunOverrides(backend="vllm", harness_root=root))
    assert remote.task["harness"] == {"name": "pi"}
    capped = prepare_task(path, RunOverrides(backend="vllm", max_tokens=32, harness_root=root))
    assert capped.task["harness"] == {"name": "pi", "max_tokens": 32}
    own = prepare_task(
        _task_file(tmp_path / "b", harness={"name": "pi", "max_tokens": 1000}), RunOverrides(harness_root=root)
    )
    assert own.task["harness"]["max_tokens"] == 1000


def test_a_missing_cli_is_a_clear_precondition(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition, match=r"setup\.sh"):
        prepare_task(_task_file(tmp_path), RunOverrides(harness="codex", harness_root=None))


def test_a_python_agent_runs_from_its_venv(tmp_path: Path) -> None:
    root = _harness_root(tmp_path)
    with pytest.raises(FailedPrecondition, match=r"py/aider/bin/python"):
        prepare_task(_task_file(tmp_path / "a"), RunOverrides(harness="aider", harness_root=root))
    (root / "py" / "aider" / "bin").mkdir(parents=True)
    (root / "py" / "aider" / "bin" / "python").write_text("")
    prepared = prepare_task(_task_file(tmp_path / "b"), RunOverrides(harness="aider", harness_root=root))
    assert prepared.harness == "aider"
    # The adapter finds the venv from the CLIs' bin dir; the local runtime sees the whole harness tree.
    assert prepared.harness_bin_dir == root / "node_modules" / ".bin"
    assert str(root) in prepared.task["runtime"]["read_only_paths"]


def test_backend_from_the_task_or_the_command_line(tmp_path: Path) -> None:
    path = _task_file(
        tmp_path,
        harness={"name": "command", "argv": ["true"]},
        backend={"name": "scripted", "script": "script.jsonl", "model_name": "m"},
    )
    from_task = prepare_task(path)
    assert from_task.backend == "scripted"
    assert from_task.backend_options == {"script": str((tmp_path / "task" / "script.jsonl").resolve())}
    assert from_task.model_name == "m"
    assert from_task.task["backend"] == {"name": "scripted", "model_name": "m"}
    replaced = prepare_task(path, RunOverrides(backend="vllm", backend_options={"url": "127.0.0.1:1"}))
    assert (replaced.backend, replaced.backend_options, replaced.model_name) == (
        "vllm",
        {"url": "127.0.0.1:1"},
        "policy",
    )
    merged = prepare_task(path, RunOverrides(backend="scripted", backend_options={"chunk_size": 2}))
    assert merged.backend_options["chunk_size"] == 2
    assert "script" in merged.backend_options


def test_samples_and_timeout_overrides(tmp_path: Path) -> None:
    path = _task_file(tmp_path, harness={"name": "command", "argv": ["true"]})
    prepared = prepare_task(path, RunOverrides(samples=2, timeout_s=30))
    assert prepared.task["num_samples"] == 2
    assert prepared.task["timeout_seconds"] == 30
    with pytest.raises(InvalidArgument):
        prepare_task(path, RunOverrides(samples=0))


def test_malformed_task_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(InvalidArgument, match="mapping"):
        prepare_task(bad)
    with pytest.raises(InvalidArgument, match="cannot read"):
        prepare_task(tmp_path / "missing.yaml")
    no_instruction = _task_file(tmp_path, instruction="")
    with pytest.raises(InvalidArgument, match="instruction"):
        prepare_task(no_instruction)


def test_parse_backend_options() -> None:
    assert parse_backend_options(["a=1", "b=true", "c=x=y", "d="]) == {"a": 1, "b": True, "c": "x=y", "d": ""}
    assert parse_backend_options(["s={x: 1}"]) == {"s": {"x": 1}}
    with pytest.raises(InvalidArgument):
        parse_backend_options(["novalue"])


def test_find_harness_root(tmp_path: Path) -> None:
    root = _harness_root(tmp_path)
    assert find_harness_root([tmp_path / "nope", root]) == root.resolve()
    assert find_harness_root([tmp_path / "nope"]) is None


def test_out_dir_is_never_mixed(tmp_path: Path) -> None:
    out = tmp_path / "run"
    prepare_out_dir(out, overwrite=False)
    (out / "sessions.jsonl").write_text("{}\n")
    with pytest.raises(InvalidArgument, match="overwrite"):
        prepare_out_dir(out, overwrite=False)
    prepare_out_dir(out, overwrite=True)
    assert list(out.iterdir()) == []
    assert default_out_dir(Path("examples/tasks/paginate/task.yaml"), 0.0).parent == Path("runs")
    assert default_out_dir(Path("examples/tasks/paginate/task.yaml"), 0.0).name.startswith("paginate-")


class _Tokenizer:
    def __init__(self, vocab: dict[str, int], template: str | None, eos: int | None) -> None:
        self._vocab, self.chat_template, self.eos_token_id = vocab, template, eos

    def get_vocab(self) -> dict[str, int]:
        return self._vocab


def test_end_of_turn_ids_for_the_reconstructor() -> None:
    from polar_run.embedded import end_of_turn_ids

    chatml = _Tokenizer({"<|im_end|>": 2, "<|endoftext|>": 0, "<|eot_id|>": 9}, "...<|im_end|>...", 0)
    assert end_of_turn_ids(chatml) == (2,)
    assert end_of_turn_ids(_Tokenizer({"<|eot_id|>": 9}, None, 1)) == (9,)
    assert end_of_turn_ids(_Tokenizer({"a": 1}, "{{ x }}", 5)) == (5,)
    assert end_of_turn_ids(_Tokenizer({}, None, None)) == ()


def test_harness_options_are_checked_before_anything_starts(tmp_path: Path) -> None:
    path = _task_file(tmp_path, harness={"name": "pi"})
    with pytest.raises(InvalidArgument, match="argv"):
        prepare_task(path, RunOverrides(harness="command"))  # another harness: the task's options are dropped
    with pytest.raises(InvalidArgument, match="unknown harness"):
        prepare_task(path, RunOverrides(harness="nope"))
    with pytest.raises(InvalidArgument):
        prepare_task(_task_file(tmp_path / "b", harness={"name": "command", "argv": ["true"], "bogus": 1}))


def test_bad_staleness_fields_fail_polar_run_before_anything_starts(tmp_path: Path) -> None:
    from polar_run.cli import main

    harness = {"name": "command", "argv": ["true"]}
    for name, value in (("max_policy_lag", -1), ("stale_policy", "sometimes")):
        (tmp_path / name).mkdir()
        path = _task_file(tmp_path / name, harness=harness, **{name: value})
        out = tmp_path / "out"
        with pytest.raises(InvalidArgument, match=name):
            prepare_task(path)
        with pytest.raises(SystemExit) as exit_info:
            main(["run", str(path), "--out", str(out)])
        assert exit_info.value.code == 2
        assert not out.exists()  # nothing was started or written


def test_a_task_that_widens_the_sandbox_fails_polar_run_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from polar_run.cli import main

    path = _task_file(tmp_path, harness={"name": "command", "argv": ["true"]}, runtime={"network": "host"})
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(path), "--out", str(out)])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert "runtime.network = 'host' widens the sandbox" in lines[0]
    assert not out.exists()


def test_a_repository_outside_the_task_directory_fails_polar_run(tmp_path: Path) -> None:
    from polar_run.cli import main

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    for i, repo in enumerate((str(outside), "link")):
        (tmp_path / str(i) / "task").mkdir(parents=True)
        (tmp_path / str(i) / "task" / "link").symlink_to(outside)
        harness = {"name": "command", "argv": ["true"]}
        path = _task_file(tmp_path / str(i), harness=harness, metadata={"repo": repo})
        with pytest.raises(SystemExit) as exit_info:
            main(["run", str(path), "--out", str(tmp_path / "out")])
        assert exit_info.value.code == 2
        assert not (tmp_path / "out").exists()


def test_a_dataset_line_that_widens_the_sandbox_fails_polar_generate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from polar_run.cli import main

    dataset = tmp_path / "data" / "tasks.jsonl"
    dataset.parent.mkdir()
    (tmp_path / "data" / "repo").mkdir()
    line = {"task_id": "t", "instruction": "x", "harness": {"name": "command", "argv": ["true"]}}
    good = {**line, "metadata": {"repo": "repo"}}
    wide = {**line, "runtime": {"kind": "local", "isolation": "none", "network": "host"}}
    outside = {**line, "metadata": {"repo": "/"}}
    for i, (bad, why) in enumerate(((wide, "widens the sandbox"), (outside, "not under the operator's task roots"))):
        dataset.write_text(json.dumps(good) + "\n" + json.dumps({**bad, "task_id": f"bad{i}"}) + "\n")
        out = tmp_path / f"out{i}"
        with pytest.raises(SystemExit) as exit_info:
            main(["generate", str(dataset), "--out", str(out)])
        assert exit_info.value.code == 2
        (error,) = capsys.readouterr().err.strip().splitlines()
        assert f"task 'bad{i}'" in error
        assert why in error
        assert not out.exists()
