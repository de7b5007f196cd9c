"""The qwen-code adapter's shell settings and its Node preload (which runs here with the machine's ``node``)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from gateway.harnesses import HarnessContext, HarnessLaunch, ProxyEndpoints, get_adapter
from gateway.harnesses.qwen_shell_drain import PRELOAD_NAME, PRELOAD_SOURCE


def _launch(**options: Any) -> HarnessLaunch:
    ctx = HarnessContext(
        home=PurePosixPath("/s/home"),
        workspace=PurePosixPath("/s/workspace"),
        tmp=PurePosixPath("/s/tmp"),
        instruction="fix the bug",
        endpoints=ProxyEndpoints(token="tok", openai_base_url="http://127.0.0.1:18080/v1"),
        model="m",
        options=options,
    )
    return get_adapter("qwen-code").prepare(ctx)


def test_shell_runs_without_a_pty_with_the_preload() -> None:
    launch = _launch()
    settings = json.loads(str(launch.files[".qwen/settings.json"]))
    # node-pty on Linux drops unread output when the command exits; the plain path is waited on by the preload.
    assert settings["tools"]["shell"]["enableInteractiveShell"] is False
    assert launch.files[f".polar/{PRELOAD_NAME}"] == PRELOAD_SOURCE
    assert launch.env["NODE_OPTIONS"] == f'--require="/s/home/.polar/{PRELOAD_NAME}"'


def test_a_tasks_node_options_are_kept_after_the_preload() -> None:
    launch = _launch(env={"NODE_OPTIONS": "--max-old-space-size=512"})
    assert launch.env["NODE_OPTIONS"] == f'--require="/s/home/.polar/{PRELOAD_NAME}" --max-old-space-size=512'


# A Node program that settles each `bash -c` result at 'exit', as headless Qwen Code does
# (ShellExecutionService.childProcessFallback), with its event loop kept busy; it prints how many results held the
# whole output, were cut, or were empty.
_SETTLE_AT_EXIT = r"""
const { spawn } = require('node:child_process');
const [file, size, runs] = process.argv.slice(-3).map((a, i) => (i ? Number(a) : a));
function one() {
  return new Promise((resolve) => {
    const child = spawn('bash', ['-c', `cat ${file}`], { stdio: ['ignore', 'pipe', 'pipe'], detached: true });
    let out = '';
    child.stdout.on('data', (d) => { out += d; });
    child.on('exit', () => resolve(out.length === size ? 'whole' : out.length ? 'cut' : 'empty'));
  });
}
(async () => {
  const busy = setInterval(() => { const t = Date.now(); while (Date.now() - t < 3); }, 1);
  const counts = { whole: 0, cut: 0, empty: 0 };
  for (let i = 0; i < runs; i += 8) {
    for (const r of await Promise.all(Array.from({ length: 8 }, one))) counts[r]++;
  }
  clearInterval(busy);
  console.log(JSON.stringify(counts));
})();
"""


@pytest.fixture
def preload(tmp_path: Path) -> Path:
    """The preload saved as a file, as the adapter has it written below HOME."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    path = tmp_path / PRELOAD_NAME
    path.write_text(PRELOAD_SOURCE)
    return path


def _node(preload: Path, program: str, *args: str, node_options: str = "") -> str:
    """Run ``program`` with ``node -e`` and the preload; its stdout."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "NODE_OPTIONS": f'--require="{preload}" {node_options}'.strip()}
    done = subprocess.run(["node", "-e", program, *args], env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("size", [10, 20_480, 1_048_576])
def test_preload_holds_exit_until_the_output_is_read(preload: Path, size: int) -> None:
    data = preload.parent / "data.txt"
    data.write_text("x" * size)
    # Without the preload most of these come back empty or cut (40 of 48 empty at 20 KB when written).
    assert json.loads(_node(preload, _SETTLE_AT_EXIT, str(data), str(size), "48")) == {
        "whole": 48,
        "cut": 0,
        "empty": 0,
    }


_ENVIRONMENTS = r"""
const { spawn } = require('node:child_process');
const seen = (file, args) => new Promise((resolve) => {
  let out = '';
  const child = spawn(file, args, { stdio: ['ignore', 'pipe', 'inherit'] });
  child.stdout.on('data', (d) => { out += d; });
  child.on('close', () => resolve(out.trim()));
});
(async () => console.log(JSON.stringify({
  bash: await seen('bash', ['-c', 'echo "${NODE_OPTIONS-unset}"']),
  bashByPath: await seen('/bin/bash', ['-c', 'echo "${NODE_OPTIONS-unset}"']),
  node: await seen(process.execPath, ['-e', 'console.log(process.env.NODE_OPTIONS)']),
})))();
"""


def test_shell_commands_see_the_tasks_node_options_only(preload: Path) -> None:
    # Qwen Code's own relaunches (Node children) keep the preload; its shell commands do not see it.
    seen = json.loads(_node(preload, _ENVIRONMENTS))
    assert seen == {"bash": "unset", "bashByPath": "unset", "node": f'--require="{preload}"'}
    seen = json.loads(_node(preload, _ENVIRONMENTS, node_options='--max-old-space-size=256 "--title=a b"'))
    assert seen["bash"] == '--max-old-space-size=256 "--title=a b"'


_EXITS = r"""
const { spawn } = require('node:child_process');
const run = (command) => new Promise((resolve) => {
  const child = spawn('bash', ['-c', command], { stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  let out = '';
  child.stdout.on('data', (d) => { out += d; });
  child.on('exit', (code, signal) => {
    try { process.kill(-child.pid, 'SIGKILL'); } catch {}
    resolve([code, signal, out]);
  });
});
(async () => {
  const results = [await run('exit 3'), await run('kill -9 $$'), await run('(sleep 60; echo late) & echo early')];
  console.log(JSON.stringify(results));
  process.exit(0);
})();
"""


def test_preload_keeps_exit_code_and_signal(preload: Path) -> None:
    results = json.loads(_node(preload, _EXITS))
    # A background process holding the pipe open does not hold the result back (`sleep 60` was still running).
    assert results == [[3, None, ""], [None, "SIGKILL", ""], [0, None, "early\n"]]
