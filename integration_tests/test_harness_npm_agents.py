"""opencode, Cline and the Continue CLI, real and pinned, against the real model proxy (scripted backend), offline.

Each runs in a local runtime (bubblewrap, loopback only) that reaches the proxy only through the Unix-socket
tunnel: (a) a plain prompt prints the scripted answer with one completion recorded; (b) a tool loop: the
script calls the harness's shell tool to write ``out.txt``, then answers; the file is in the patch and the
prefix-merged trace masks the tool output. Skipped when the CLIs (``scripts/setup_harnesses.sh``) or
bubblewrap are missing. (c) The Continue CLI contacts nothing but the proxy (a Node preload records every socket
connection and name look-up its process makes) and leaves no session token in the logs the gateway keeps.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from integration_tests.support.harnesses import (
    BIN_DIR,
    MODEL,
    SANDBOX_PORT,
    SANDBOX_ROOT,
    assert_tool_loop_mask,
    run_harness,
    tool_call_turn,
)
from polar_core.model_fixtures import build_tiny_tokenizer
from polar_core.records import ReconstructionStrategy
from reconstructor import ReconstructionOptions, reconstruct_session

ANSWER = "The answer is 42."
HARNESSES = {"opencode": "opencode", "cline": "cline", "continue": "cn"}  # harness name -> bin
# opencode needs ~20-40 s on two busy cores before its first request (a 185 MB Bun binary, a git snapshot).
CASES = [pytest.param("opencode", marks=pytest.mark.slow), "cline", "continue"]

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or not all((BIN_DIR / b).exists() for b in HARNESSES.values()),
    reason="opencode/cline/cn (setup_harnesses.sh) or bubblewrap not installed",
)


def _exists(path: object) -> bool:
    return Path(str(path)).exists()


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tiny_tokenizer()


@pytest.mark.parametrize("harness", CASES)
async def test_plain_prompt(tmp_path: Path, tokenizer: Any, harness: str) -> None:
    result = await run_harness(harness, [{"text": ANSWER}], tmp=tmp_path, tokenizer=tokenizer)
    assert result.exit_code == 0, result.describe()
    assert ANSWER in result.stdout, result.describe()
    assert len(result.completions) == 1, result.describe()  # no title/summary side calls
    assert result.completions[0].model == MODEL
    assert "api.openai.com" not in result.stderr
    assert "ENOTFOUND" not in result.stderr


@pytest.mark.parametrize("harness", CASES)
async def test_tool_call_loop(tmp_path: Path, tokenizer: Any, harness: str) -> None:
    turns = [tool_call_turn(harness, "echo polar-was-here > out.txt"), {"text": "Done: wrote out.txt."}]
    result = await run_harness(harness, turns, tmp=tmp_path, tokenizer=tokenizer)
    assert result.exit_code == 0, result.describe()
    assert (result.workspace / "out.txt").read_text().strip() == "polar-was-here", result.describe()
    assert "+polar-was-here" in result.patch
    assert len(result.completions) == 2, result.describe()
    assert "Done: wrote out.txt." in result.stdout, result.describe()
    assert any(map(_exists, result.host_log_paths)), result.launch.log_paths

    built = reconstruct_session(result.completions, ReconstructionOptions(strategy=ReconstructionStrategy.PREFIX_MERGE))
    assert len(built.traces) == 1, built.stats
    masked = assert_tool_loop_mask(built.traces[0], *result.completions)
    assert masked


# Loaded into the CLI's Node process (NODE_OPTIONS): records every socket connection and name look-up it starts.
_NET_AUDIT = """\
const fs = require("fs"), net = require("net"), dns = require("dns"), path = require("path");
const log = path.join(process.env.HOME, "net-audit.jsonl");
const write = (record) => fs.appendFileSync(log, JSON.stringify(record) + "\\n");
write({ event: "loaded" });
const connect = net.Socket.prototype.connect;
net.Socket.prototype.connect = function (...args) {
  let o = Array.isArray(args[0]) ? args[0][0] : args[0];
  if (o === null || typeof o !== "object") o = { port: args[0], host: args[1] };
  write({ event: "connect", host: o.host ?? null, port: o.port ?? null, path: o.path ?? null });
  return connect.apply(this, args);
};
for (const api of [dns, dns.promises]) {
  const lookup = api.lookup;
  api.lookup = function (host, ...rest) {
    write({ event: "lookup", host });
    return lookup.call(this, host, ...rest);
  };
}
"""


def _kept_files(log_paths: Any) -> list[Path]:
    """The files under the harness's log paths: what the gateway collects as artifacts."""
    return [p for log in log_paths for p in Path(str(log)).rglob("*") if p.is_file()]


async def test_continue_contacts_only_the_proxy_and_logs_no_token(tmp_path: Path, tokenizer: Any) -> None:
    home = (tmp_path / "sessions" / "s1").absolute() / "home"
    options = {"env": {"NODE_OPTIONS": f"--require={SANDBOX_ROOT}/home/.audit/net-audit.cjs"}}
    turns = [tool_call_turn("continue", "echo polar-was-here > out.txt"), {"text": ANSWER}]
    result = await run_harness(
        "continue", turns, tmp=tmp_path, tokenizer=tokenizer, options=options,
        home_files={".audit/net-audit.cjs": _NET_AUDIT},
    )  # fmt: skip
    assert result.exit_code == 0, result.describe()
    assert len(result.completions) == 2, result.describe()
    events = [json.loads(line) for line in (home / "net-audit.jsonl").read_text().splitlines()]
    assert events[0] == {"event": "loaded"}, events
    connects = [e for e in events if e["event"] == "connect"]
    assert len(connects) >= 2, events  # the two model calls: the audit saw them
    # Nothing but the proxy's tunnel port on the loopback: no version probe of api.continue.dev, no look-up at all.
    assert all((e["host"], e["port"]) == ("127.0.0.1", SANDBOX_PORT) for e in connects), events
    assert all(e["host"] in ("127.0.0.1", "localhost") for e in events if e["event"] == "lookup"), events

    config = json.loads(str(result.launch.files[".continue/config.yaml"]))
    token = config["models"][0]["apiKey"]
    assert len(token) >= 16
    kept = _kept_files(result.host_log_paths)
    assert "cn.log" in [p.name for p in kept], kept
    assert [p for p in kept if token in p.read_text(errors="replace")] == []
