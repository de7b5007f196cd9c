"""Gateways on a running Ray cluster: :func:`start_fleet` places them, :class:`RayFleet` keeps their count.

The caller (a trainer's driver) has already called ``ray.init``. Each gateway is a :class:`.actor.GatewayActor`
pinned to one node (``NodeAffinitySchedulingStrategy``, hard) by the spread rule of :mod:`.placement`; it runs
the real GatewayService bound to the node's address and registers with the rollout server by itself.
:func:`start_fleet` returns once every gateway has registered, or raises naming the one that did not.

A supervisor thread checks the fleet every ``check_interval_s``: a gateway whose node is gone, or whose actor
Ray reports dead, is killed for good and replaced under a new gateway id on a surviving node, so the count is
kept. The rollout server re-dispatches the sessions the lost gateway held once its lease lapses (as an outage:
no attempt used up). :meth:`RayFleet.stop` drains every gateway, stops it and removes its actor.

Given the operator's signing key (``gateway_token_key_file``), the driver issues each gateway a token for its own
id (``identity_token``, :mod:`polar_core.gateway_tokens`), replacements included; the driver then holds the key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import tempfile
import threading
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from gateway.settings import GatewaySettings
from polar_core.errors import FailedPrecondition, InvalidArgument, Unavailable
from polar_core.gateway_tokens import issue_gateway_token, load_signing_key
from polar_run.ray_fleet.actor import GatewayActor, GatewayStarted
from polar_run.ray_fleet.placement import NodeView, Sizing, place

__all__ = ["FleetMember", "RayFleet", "alive_nodes", "start_fleet"]

_log = logging.getLogger(__name__)
_PING_TIMEOUT_S = 10.0
_WILDCARDS = ("", "0.0.0.0", "::", "[::]")


@dataclasses.dataclass(frozen=True, slots=True)
class FleetMember:
    """One gateway of the fleet.

    Attributes:
        gateway_id: Its id with the rollout server.
        node_id: The Ray node it runs on.
        address: ``host:port`` of its GatewayService (what it registered).
        pid: Its worker process on that node.
        handle: Its Ray actor handle.
    """

    gateway_id: str
    node_id: str
    address: str
    pid: int
    handle: Any = dataclasses.field(repr=False, compare=False)


def alive_nodes() -> list[NodeView]:
    """The Ray cluster's alive nodes, by node id."""
    views = [
        NodeView(n["NodeID"], str(n["NodeManagerAddress"]), float(n.get("Resources", {}).get("CPU", 0.0)))
        for n in ray.nodes()  # type: ignore[no-untyped-call]
        if n.get("Alive")
    ]
    return sorted(views, key=lambda v: v.node_id)


class RayFleet:
    """Gateways on a Ray cluster, kept at :attr:`target` by a supervisor thread (see the module docstring).

    Made by :func:`start_fleet`; usable as a context manager that stops it.

    Attributes:
        target: The number of gateways kept.
        replaced: Gateways the supervisor started since :func:`start_fleet` returned (replacements).
    """

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        name: str,
        sizing: Sizing,
        target: int,
        num_cpus: float,
        start_timeout_s: float,
        register_timeout_s: float,
        check_interval_s: float,
        token_key: bytes | None = None,
        token_ttl_s: int = 7 * 86400,
    ) -> None:
        self._settings = settings
        self._token_key = token_key
        self._token_ttl_s = token_ttl_s
        self._name = name
        self._sizing = sizing
        self.target = target
        self._num_cpus = num_cpus
        self._start_timeout_s = start_timeout_s
        self._register_timeout_s = register_timeout_s
        self._check_interval_s = check_interval_s
        self._remote: Any = ray.remote(GatewayActor)
        self._ids = itertools.count()
        self._members: list[FleetMember] = []
        self._turn = threading.Lock()  # one supervision turn (which may wait for starts) or stop at a time
        self._lock = threading.Lock()  # guards _members only, so members() never waits for a turn
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.replaced = 0

    def members(self) -> list[FleetMember]:
        """The gateways now in the fleet (started and registered)."""
        with self._lock:
            return list(self._members)

    def check(self) -> int:
        """One supervision turn: replace the gateways whose node or actor died; return how many were started."""
        with self._turn:
            if self._stopping.is_set():
                return 0
            nodes = alive_nodes()
            alive = {n.node_id for n in nodes}
            dead = [m for m in self.members() if m.node_id not in alive or not _answers(m)]
            for member in dead:
                _log.warning("gateway %s on node %s is gone; replacing it", member.gateway_id, member.node_id)
                with contextlib.suppress(RayError):
                    ray.kill(member.handle, no_restart=True)
                with self._lock:
                    self._members.remove(member)
            # A node whose gateway just died may be dying itself (Ray declares it dead only after missed health
            # checks): place the replacements elsewhere while another node is alive.
            suspect = {m.node_id for m in dead}
            started, _ = self._grow([n for n in nodes if n.node_id not in suspect] or nodes)
            self.replaced += len(started)
            return len(started)

    def start_supervisor(self) -> None:
        """Start checking the fleet every ``check_interval_s`` in a daemon thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._supervise, name=f"{self._name}-supervisor", daemon=True)
            self._thread.start()

    def stop(self, grace_s: float = 30.0) -> None:
        """Drain every gateway (held sessions get up to ``grace_s`` to finish), stop it and remove its actor.

        Sessions still running after the grace are handed back: the rollout server runs them again on other
        gateways without using up an attempt (or ends them with the task). Idempotent.
        """
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        with self._turn, self._lock:
            members, self._members = self._members, []
        drains = [m.handle.drain.remote(grace_s) for m in members]
        _settle(drains, grace_s + _PING_TIMEOUT_S)
        _settle([m.handle.stop.remote(min(grace_s, 10.0)) for m in members], grace_s + _PING_TIMEOUT_S)
        for member in members:
            with contextlib.suppress(RayError):
                ray.kill(member.handle, no_restart=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    # Internals ----------------------------------------------------------------------------------------------
    def _fill(self, nodes: list[NodeView]) -> list[str]:
        """Start the first gateways; return why each missing one did not start or register."""
        with self._turn:
            return self._grow(nodes)[1]

    def _supervise(self) -> None:
        while not self._stopping.wait(self._check_interval_s):
            try:
                self.check()
            except Exception:  # the supervisor must outlive one bad turn (the cluster may be changing under it)
                _log.exception("supervising the Ray fleet %s failed; retrying", self._name)

    def _grow(self, nodes: list[NodeView]) -> tuple[list[FleetMember], list[str]]:
        """Start gateways until the fleet has :attr:`target`; return them, and why the others did not start
        (each failure is logged; the supervisor's next turn retries)."""
        members = self.members()
        missing = self.target - len(members)
        if missing <= 0 or not nodes:
            return [], []
        by_id = {n.node_id: n for n in nodes}
        held = Counter(m.node_id for m in members)
        launched = [self._launch(by_id[node_id]) for node_id in place(nodes, held, missing, self._sizing)]
        started, failures = [], []
        for gateway_id, node, handle, ref in launched:
            try:
                member = self._ready(gateway_id, node, handle, ref)
            except (RayError, Unavailable) as exc:
                _log.warning("gateway %s on node %s did not start: %s", gateway_id, node.node_id, exc)
                failures.append(f"{gateway_id}: {exc}")
                with contextlib.suppress(RayError):
                    ray.kill(handle, no_restart=True)
                continue
            with self._lock:
                self._members.append(member)
            started.append(member)
        return started, failures

    def _launch(self, node: NodeView) -> tuple[str, NodeView, Any, Any]:
        gateway_id = f"{self._name}-{next(self._ids)}"
        handle = self._remote.options(
            num_cpus=self._num_cpus,
            max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
        ).remote()
        return gateway_id, node, handle, handle.start.remote(self._member_settings(gateway_id, node))

    def _ready(self, gateway_id: str, node: NodeView, handle: Any, ref: Any) -> FleetMember:
        try:
            started: GatewayStarted = ray.get(ref, timeout=self._start_timeout_s)
            waited = handle.wait_registered.remote(self._register_timeout_s)
            registered = ray.get(waited, timeout=self._register_timeout_s + _PING_TIMEOUT_S)
        except GetTimeoutError:
            raise Unavailable(f"gateway {gateway_id} did not start within {self._start_timeout_s:.0f} s") from None
        if not registered:
            raise Unavailable(
                f"gateway {gateway_id} on {node.ip} did not register with the rollout server at "
                f"{self._settings.rollout_address} within {self._register_timeout_s:.0f} s (see its Ray worker log)"
            )
        host = self._settings.host if "host" in self._settings.model_fields_set else node.ip
        if host in _WILDCARDS:
            host = node.ip
        return FleetMember(started.gateway_id, node.node_id, f"{host}:{started.port}", started.pid, handle)

    def _member_settings(self, gateway_id: str, node: NodeView) -> dict[str, Any]:
        """A gateway's settings as data: the fleet's, with its own id, state directory, and the node's address."""
        base = self._settings
        state_dir = base.state_dir if base.state_dir.is_absolute() else Path(tempfile.gettempdir()) / "polar-ray"
        update: dict[str, Any] = {"gateway_id": gateway_id, "port": 0, "state_dir": state_dir / gateway_id}
        if self._token_key is not None:
            update["identity_token"] = issue_gateway_token(self._token_key, gateway_id, ttl_s=self._token_ttl_s)
        if "host" not in base.model_fields_set:
            update["host"] = node.ip
        return base.model_copy(update=update).model_dump(mode="json")


def start_fleet(
    rollout_address: str,
    *,
    settings: GatewaySettings | Mapping[str, Any] | None = None,
    per_node: int = 1,
    cores_per_gateway: float | None = None,
    count: int | None = None,
    num_cpus: float = 0.0,
    name: str = "ray-gateway",
    start_timeout_s: float = 120.0,
    register_timeout_s: float = 60.0,
    check_interval_s: float = 2.0,
    gateway_token_key_file: Path | None = None,
    gateway_token_ttl_s: int = 7 * 86400,
) -> RayFleet:
    """Place gateways on the nodes of the Ray cluster this process is connected to, and keep them there.

    Args:
        rollout_address: The rollout server every gateway registers with and reports to.
        settings: The gateways' settings (a ``GatewaySettings``, or a mapping of its fields validated as data,
            without the environment): proxy, reconstructor and evaluator addresses, tokens, TLS files, limits.
            The fleet sets each gateway's id, port (0), host (the node's address, unless ``host`` is given)
            and state directory (``state_dir/<gateway id>``; a relative ``state_dir`` means the temporary
            directory). They travel to the actors as Ray task arguments, never on a command line.
        per_node: Gateways per node.
        cores_per_gateway: Instead: one gateway per this many CPUs of each node (at least one per node).
        count: The number of gateways to keep; default: what the alive nodes hold by the rule above.
        num_cpus: Ray CPUs each gateway actor reserves (0: it takes none of the trainer's).
        name: Gateway ids are ``<name>-<n>``, ``n`` counting every gateway this fleet started.
        start_timeout_s: How long a gateway actor may take to start its GatewayService.
        register_timeout_s: How long a started gateway may then take to register with the rollout server.
        check_interval_s: Seconds between the supervisor's checks.
        gateway_token_key_file: The signing key of per-gateway tokens (the rollout server's
            ``gateway_token_key_file``): each gateway gets a token for its own id, valid ``gateway_token_ttl_s``
            from its start. ``None``: the gateways present the settings' shared ``gateway_token``.
        gateway_token_ttl_s: Lifetime of each gateway's token; make it longer than the run.

    Raises:
        FailedPrecondition: This process is not connected to a Ray cluster (call ``ray.init`` first).
        InvalidArgument: Bad sizing, an empty ``rollout_address``, or no alive node.
        Unavailable: A gateway did not start or register (the ones started are stopped again).
    """
    if not ray.is_initialized():
        raise FailedPrecondition("not connected to a Ray cluster: call ray.init(address=...) before start_fleet")
    if not rollout_address:
        raise InvalidArgument("start_fleet needs the rollout server's address")
    sizing = Sizing(per_node, cores_per_gateway)
    token_key = load_signing_key(gateway_token_key_file) if gateway_token_key_file is not None else None
    given = settings if isinstance(settings, GatewaySettings) else GatewaySettings.model_validate(dict(settings or {}))
    base = given.model_copy(update={"rollout_address": rollout_address})
    nodes = alive_nodes()
    target = sizing.total(nodes) if count is None else count
    if target < 1:
        raise InvalidArgument(f"a fleet needs at least one gateway, not {target}")
    fleet = RayFleet(
        base,
        name=name,
        sizing=sizing,
        target=target,
        num_cpus=num_cpus,
        start_timeout_s=start_timeout_s,
        register_timeout_s=register_timeout_s,
        check_interval_s=check_interval_s,
        token_key=token_key,
        token_ttl_s=gateway_token_ttl_s,
    )
    failures = fleet._fill(nodes)
    if failures:
        fleet.stop(grace_s=0.0)
        raise Unavailable(f"{len(failures)} of {target} gateways did not start or register: {'; '.join(failures)}")
    fleet.start_supervisor()
    return fleet


def _answers(member: FleetMember) -> bool:
    """Whether ``member``'s actor answers, or Ray has not decided yet; ``False`` once Ray reports it dead."""
    try:
        ray.get(member.handle.ping.remote(), timeout=_PING_TIMEOUT_S)
    except ActorUnavailableError:
        return True  # unreachable for now: Ray decides whether it died
    except RayActorError:
        return False
    except GetTimeoutError:
        return True
    return True


def _settle(refs: list[Any], timeout_s: float) -> None:
    """Wait for ``refs`` up to ``timeout_s``; a gateway that died meanwhile has nothing left to stop."""
    for ref in refs:
        with contextlib.suppress(RayError):
            ray.get(ref, timeout=timeout_s)
