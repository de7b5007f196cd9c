"""Red team, end to end: a hostile ``command``-harness agent next to an honest one on a real gateway stack.

The stack (:mod:`integration_tests.support.gateway_stack`: gateway, model proxy with a scripted backend,
reconstructor, evaluator) runs two sessions at once in the local runtime with the gateway's default ``proxy``
network. The hostile agent makes one model call through the tunnel (the only thing it may reach), then tries:
every loopback port of the stack's services (gRPC and HTTP), listeners on the host's own interface address (on
every address, and bound to that address only: the way out of this host, standing for the Internet);
the other session's directory, the proxy's records and the gateway's state directory, ``/etc/shadow`` and a
host file (read and write); the host process's credentials in its environment and ``/proc``. If any of these
works it exits 3 (the session would end ``unresolved``); otherwise it fills its workspace past its disk quota.
Expected: the hostile session ends ``invalid_patch`` with the quota as its reason, the honest session ends
``resolved`` with its two calls recorded, the host file and listeners untouched, and the gateway still answers
GetCapacity and runs a further session to ``resolved``.

Attacks run directly in a runtime (as root, as an unprivileged user, in Docker) are in
``test_redteam_sandbox.py``; the evaluator-side attacks (pytest configuration files, ``conftest.py``, killing
pytest at import, non-finite rewards) are in ``test_redteam_evaluator.py``; control-plane credentials by role
are in ``test_roles.py``.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
from pathlib import Path

import pytest
from polar.common.v1 import session_pb2, status_pb2, task_pb2
from polar.gateway.v1 import gateway_service_pb2 as pb

from integration_tests.support.egress import accepted, host_address, listener
from integration_tests.support.gateway_stack import gateway_stack, until_stage
from integration_tests.support.sandbox_attacks import CANARY_NAME

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for the workspace"),
    pytest.mark.skipif(shutil.which("python3") is None, reason="the agent script needs python3 on PATH"),
    pytest.mark.slow,
]

# argv: TARGETS (host:port,...), READ (files, ...), LIST (dir=allowed+names,...), WRITE (files, ...).
HOSTILE = """
import json, os, sys, socket, urllib.request
found = []
# Built here, so that this script's own command line does not hold the needle.
needle = ("CANARY_NAME".split("_CANARY")[0] + "_" + "CANARY=").encode()
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps({"model": os.environ["POLAR_MODEL"], "messages": [{"role": "user", "content": "hi"}]}).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
)
json.loads(urllib.request.urlopen(request, timeout=60).read())
for target in sys.argv[1].split(","):
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        found.append("connected " + target)
    except OSError:
        pass
for path in sys.argv[2].split(","):
    try:
        found.append("read %s: %r" % (path, open(path, "rb").read(100)))
    except OSError:
        pass
for item in sys.argv[3].split(","):
    # A directory and the names it may hold here: the parents of the sandbox's own bind mounts exist (empty)
    # in its private /tmp, so seeing them is no escape; any other entry is.
    path, _, allowed = item.partition("=")
    try:
        extra = sorted(set(os.listdir(path)) - set(allowed.split("+")))
    except OSError:
        continue
    if extra:
        found.append("listed %s: %s" % (path, extra))
for path in sys.argv[4].split(","):
    try:
        open(path, "w").write("pwned")  # the host checks whether this arrived anywhere
    except OSError:
        pass
for name in os.listdir("/proc"):
    for part in ("environ", "cmdline"):
        try:
            data = open(f"/proc/{name}/{part}", "rb").read()
        except OSError:
            continue
        if needle in data:
            found.append(f"credential in /proc/{name}/{part}")
if any(key == "CANARY_NAME" for key in os.environ):
    found.append("credential in the environment")
if found:
    sys.exit("escaped: " + "; ".join(found))
print("every attack failed; filling the disk", flush=True)
for i in range(1000):
    with open(f"fill{i}.bin", "wb") as fh:
        for _ in range(60):
            fh.write(b"\\0" * 2**20)
sys.exit(4)
""".replace("CANARY_NAME", CANARY_NAME)

HONEST = """
import json, os, time, urllib.request
messages = []
for i in range(2):
    messages.append({"role": "user", "content": f"step {i}"})
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": os.environ["POLAR_MODEL"], "messages": messages}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
    )
    messages.append(json.loads(urllib.request.urlopen(request, timeout=60).read())["choices"][0]["message"])
open("answer.txt", "w").write("42\\n")
time.sleep(float(os.environ.get("HONEST_PAUSE", "0")))
"""

_QUOTA = "128m"


def _session(session_id: str, argv: list[str], options: dict[str, str] | None = None) -> session_pb2.SessionSpec:
    task = task_pb2.Task(
        task_id="redteam",
        instruction="Answer.",
        timeout_seconds=90,
        harness=task_pb2.HarnessSpec(name="command"),
        runtime=task_pb2.RuntimeSpec(kind=task_pb2.RUNTIME_KIND_LOCAL),
        evaluator=task_pb2.EvaluatorSpec(strategy="session_completed"),
    )
    task.harness.options.update({"argv": argv})
    if options:
        task.runtime.options.update(options)
    return session_pb2.SessionSpec(session_id=session_id, task_id="redteam", task=task, attempt=1)


async def test_a_hostile_agent_next_to_an_honest_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    canary = secrets.token_hex(16)
    monkeypatch.setenv(CANARY_NAME, canary)  # the gateway's own environment (this process)
    host_file = tmp_path / "host-secret.txt"
    host_file.write_text("original\n")
    lan = host_address()
    # The way out of this host is through its own interface: a listener bound there stands for every address
    # beyond it (the tests contact no address outside this machine).
    loopback, anywhere, on_lan = listener("127.0.0.1"), listener("0.0.0.0"), listener(lan)
    async with gateway_stack(tmp_path) as stack:
        runtimes = stack.runtimes_dir
        ports = [*stack.host_ports, loopback.getsockname()[1]]
        targets = [f"{host}:{port}" for port in ports for host in ("127.0.0.1", lan)]
        targets += [f"{lan}:{anywhere.getsockname()[1]}", f"{lan}:{on_lan.getsockname()[1]}"]
        reads = [str(host_file), "/etc/shadow", str(tmp_path / "proxy" / "session.json")]
        lists = [f"{runtimes / 'honest'}=", f"{runtimes / 'honest' / 'workspace'}=", f"{tmp_path / 'proxy'}=",
                 f"{tmp_path / 'r'}=", f"{tmp_path / 'gateway'}=runtimes", f"{runtimes}=hostile",
                 f"{tmp_path}=gateway"]  # fmt: skip
        writes = [str(host_file), str(runtimes / "honest" / "workspace" / "answer.txt"), str(tmp_path / "pwned")]
        hostile_argv = ["python3", "-c", HOSTILE, *(",".join(x) for x in (targets, reads, lists, writes))]
        honest = _session("honest", ["env", "HONEST_PAUSE=6", "python3", "-c", HONEST])
        hostile = _session("hostile", hostile_argv, {"disk_limit": _QUOTA, "file_size_limit": "64m"})
        await stack.stub.StartSession(pb.StartSessionRequest(spec=honest))
        await until_stage(stack.stub, "honest", status_pb2.SESSION_STAGE_RUNNING)
        await stack.stub.StartSession(pb.StartSessionRequest(spec=hostile))
        results = await asyncio.gather(
            until_stage(stack.stub, "hostile", status_pb2.SESSION_STAGE_DONE, limit_s=110),
            until_stage(stack.stub, "honest", status_pb2.SESSION_STAGE_DONE, limit_s=110),
        )
        bad, good = (reply.result for reply in results)
        # The hostile agent got nowhere, filled its disk, and its session says so (a scored status, not infra).
        assert bad.status == "invalid_patch", bad.error_message
        assert bad.terminal_status == status_pb2.TERMINAL_STATUS_INVALID_PATCH
        assert "disk quota" in bad.error_message
        assert bad.reward == 0.0
        assert bad.statistics.completions == 1
        # The honest session, which ran alongside, is unaffected.
        assert good.status == "resolved", good.error_message
        assert good.statistics.completions == 2
        assert sum(len(t.call_ids) for t in good.traces) == 2
        # The host is untouched and both sandboxes are gone.
        assert host_file.read_text() == "original\n"
        assert not (tmp_path / "pwned").exists()
        assert accepted(loopback) + accepted(anywhere) + accepted(on_lan) == 0
        assert not (runtimes / "hostile").exists()
        assert not (runtimes / "honest").exists()
        # The gateway still serves.
        capacity = await stack.stub.GetCapacity(pb.GetCapacityRequest())
        assert capacity.active_sessions == 0
        assert capacity.available > 0
        await stack.stub.StartSession(pb.StartSessionRequest(spec=_session("after", ["python3", "-c", HONEST])))
        after = await until_stage(stack.stub, "after", status_pb2.SESSION_STAGE_DONE)
        assert after.result.status == "resolved", after.result.error_message
    for sock in (loopback, anywhere, on_lan):
        sock.close()
