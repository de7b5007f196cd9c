"""Mutual TLS: a client without a certificate signed by the configured CA never reaches a servicer."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from polar.rollout.v1 import rollout_service_pb2 as pb
from polar.rollout.v1 import rollout_service_pb2_grpc as pb_grpc

from polar_core.channels import open_channel
from polar_core.tls import TlsFiles
from rollout_server.server import create_server
from rollout_server.settings import RolloutSettings


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _issue(
    directory: Path,
    stem: str,
    subject: str,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool,
    uris: tuple[str, ...] = (),
) -> tuple[Path, Path, x509.Name, ec.EllipticCurvePrivateKey]:
    """A certificate (and key) for ``subject``; ``uris`` become URI SANs (``polar:role:trainer``, ...)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer if issuer else (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    *(x509.UniformResourceIdentifier(u) for u in uris),
                ]
            ),
            critical=False,
        )
    cert = builder.sign(issuer_key, hashes.SHA256())
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path, _name(subject), key


async def test_mtls_admits_only_clients_with_a_certificate_from_the_ca(tmp_path: Path) -> None:
    ca_crt, _, ca_name, ca_key = _issue(tmp_path, "ca", "polar-ca", None, ca=True)
    srv_crt, srv_key, _, _ = _issue(tmp_path, "server", "rollout", (ca_name, ca_key), ca=False)
    cli_crt, cli_key, _, _ = _issue(tmp_path, "client", "trainer", (ca_name, ca_key), ca=False)
    rogue_ca, _, rogue_name, rogue_key = _issue(tmp_path, "rogue-ca", "rogue", None, ca=True)
    bad_crt, bad_key, _, _ = _issue(tmp_path, "rogue-client", "mallory", (rogue_name, rogue_key), ca=False)

    settings = RolloutSettings(
        state_dir=tmp_path / "state", tls_cert_file=srv_crt, tls_key_file=srv_key, tls_ca_file=ca_crt
    )
    server, port = await create_server(settings)
    target = f"127.0.0.1:{port}"
    try:
        good = TlsFiles(cli_crt, cli_key, ca_crt)
        async with open_channel(target, tls=good) as channel:
            listed = await pb_grpc.RolloutServiceStub(channel).ListTasks(pb.ListTasksRequest(), timeout=10)
            assert list(listed.tasks) == []

        for files in (TlsFiles(bad_crt, bad_key, ca_crt), TlsFiles(bad_crt, bad_key, rogue_ca)):
            async with open_channel(target, tls=files) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await pb_grpc.RolloutServiceStub(channel).ListTasks(pb.ListTasksRequest(), timeout=5)
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE

        async with open_channel(target) as channel:  # plaintext
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await pb_grpc.RolloutServiceStub(channel).ListTasks(pb.ListTasksRequest(), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(None)


def test_partial_tls_settings_are_refused(tmp_path: Path) -> None:
    from polar_core.errors import InvalidArgument

    settings = RolloutSettings(tls_cert_file=tmp_path / "a.crt")
    with pytest.raises(InvalidArgument, match="together"):
        settings.tls()


async def test_trainer_client_and_gateway_reach_an_mtls_rollout_server(tmp_path: Path) -> None:
    from gateway.clients import GrpcRolloutRegistrar
    from polar_client import RolloutClient

    ca_crt, _, ca_name, ca_key = _issue(tmp_path, "ca", "polar-ca", None, ca=True)
    srv_crt, srv_key, _, _ = _issue(tmp_path, "server", "rollout", (ca_name, ca_key), ca=False)
    gw_crt, gw_key, _, _ = _issue(tmp_path, "gateway", "gateway", (ca_name, ca_key), ca=False)
    settings = RolloutSettings(
        state_dir=tmp_path / "state", tls_cert_file=srv_crt, tls_key_file=srv_key, tls_ca_file=ca_crt
    )
    server, port = await create_server(settings)
    target = f"127.0.0.1:{port}"
    files = TlsFiles(gw_crt, gw_key, ca_crt)
    try:
        client = RolloutClient(target, tls=files)
        try:
            listed = await client.list()
            assert list(listed.tasks) == []
        finally:
            await client.close()
        registrar = GrpcRolloutRegistrar(target, tls=files)
        try:
            lease = await registrar.register("gw-mtls", "127.0.0.1:1", 4, {}, "test")
            assert lease.heartbeat_interval_s > 0
        finally:
            await registrar.close()
    finally:
        await server.stop(None)


async def test_certificate_roles_and_gateway_ids_bound_what_a_caller_may_do(tmp_path: Path) -> None:
    """``polar:`` names narrow a certificate: a gateway's may not submit tasks nor act for another gateway."""
    from gateway.clients import GrpcRolloutRegistrar
    from polar_client import RolloutClient

    ca_crt, _, ca_name, ca_key = _issue(tmp_path, "ca", "polar-ca", None, ca=True)
    issuer = (ca_name, ca_key)
    srv_crt, srv_key, _, _ = _issue(tmp_path, "server", "rollout", issuer, ca=False, uris=("polar:role:internal",))

    def files(stem: str, *uris: str) -> TlsFiles:
        crt, key, _, _ = _issue(tmp_path, stem, stem, issuer, ca=False, uris=uris)
        return TlsFiles(crt, key, ca_crt)

    trainer = files("trainer", "polar:role:trainer")
    gw1 = files("gw1", "polar:gateway:gw-1")
    unnamed = files("unnamed-gateway", "polar:role:gateway")
    admin = files("operator", "polar:role:admin")
    # The legacy all-roles token too: the certificate still narrows what its holder may do.
    settings = RolloutSettings(
        state_dir=tmp_path / "state",
        tls_cert_file=srv_crt,
        tls_key_file=srv_key,
        tls_ca_file=ca_crt,
        auth_token="fleet-token",
    )
    server, port = await create_server(settings)
    target = f"127.0.0.1:{port}"

    async def code_of(tls: TlsFiles, call: str, request: object) -> grpc.StatusCode:
        async with open_channel(target, tls=tls, auth_token="fleet-token") as channel:
            try:
                await getattr(pb_grpc.RolloutServiceStub(channel), call)(request, timeout=10)
            except grpc.aio.AioRpcError as exc:
                details = exc.details() or ""
                code = exc.code()
            else:
                return grpc.StatusCode.OK
        assert code != grpc.StatusCode.PERMISSION_DENIED or call in details, details
        return code

    try:
        async with RolloutClient(target, tls=trainer, token="fleet-token") as client:
            assert list((await client.list()).tasks) == []
        registrar = GrpcRolloutRegistrar(target, tls=gw1, auth_token="fleet-token")
        try:
            lease = await registrar.register("gw-1", "127.0.0.1:1", 4, {}, "test")
            assert lease.heartbeat_interval_s > 0
        finally:
            await registrar.close()
        denied = grpc.StatusCode.PERMISSION_DENIED
        # Role: a gateway certificate is no trainer, a trainer certificate no gateway.
        assert await code_of(gw1, "ListTasks", pb.ListTasksRequest()) == denied
        assert await code_of(trainer, "Heartbeat", pb.HeartbeatRequest(gateway_id="gw-1")) == denied
        # Identity: gw-1 may heartbeat as itself only, and report only its own results.
        assert await code_of(gw1, "Heartbeat", pb.HeartbeatRequest(gateway_id="gw-1")) == grpc.StatusCode.OK
        assert await code_of(gw1, "Heartbeat", pb.HeartbeatRequest(gateway_id="gw-2")) == denied
        forged = pb.ReportSessionResultRequest()
        forged.result.session_id, forged.result.gateway_id = "s-1", "gw-2"
        assert await code_of(gw1, "ReportSessionResult", forged) == denied
        assert await code_of(gw1, "DrainGateway", pb.DrainGatewayRequest(gateway_id="gw-2")) == denied
        register = pb.RegisterGatewayRequest(gateway_id="gw-2", address="127.0.0.1:2", capacity=1)
        assert await code_of(gw1, "RegisterGateway", register) == denied
        # A gateway certificate that names no id is bound to none.
        assert await code_of(unnamed, "Heartbeat", pb.HeartbeatRequest(gateway_id="gw-1")) == denied
        # The operator may drain any gateway.
        assert await code_of(admin, "DrainGateway", pb.DrainGatewayRequest(gateway_id="gw-1")) == grpc.StatusCode.OK
        # The certificate narrows the token, never the other way round: no token, no call.
        async with open_channel(target, tls=admin) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await pb_grpc.RolloutServiceStub(channel).ListTasks(pb.ListTasksRequest(), timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await server.stop(None)


async def test_result_callbacks_use_mtls_when_the_fleet_does(tmp_path: Path) -> None:
    """A TLS fleet's gRPC callbacks reach a trainer that requires the fleet's client certificates."""
    from polar.rollout.v1 import trainer_callback_service_pb2, trainer_callback_service_pb2_grpc

    from polar_core.records import TerminalStatus
    from polar_core.server import ServiceRegistration, start_grpc_server
    from rollout_server.clients import CallbackSenders
    from rollout_server.errors import DeliveryFailed
    from rollout_server.models import CallbackTarget, ResultRecord

    ca_crt, _, ca_name, ca_key = _issue(tmp_path, "ca", "polar-ca", None, ca=True)
    issuer = (ca_name, ca_key)
    trainer_crt, trainer_key, _, _ = _issue(tmp_path, "trainer", "trainer", issuer, ca=False)
    internal = ("polar:role:internal",)
    rollout_crt, rollout_key, _, _ = _issue(tmp_path, "rollout", "rollout", issuer, ca=False, uris=internal)
    keys: list[str] = []

    class Trainer(trainer_callback_service_pb2_grpc.TrainerCallbackServiceServicer):
        async def DeliverSessionResult(
            self, request: trainer_callback_service_pb2.DeliverSessionResultRequest, context: object
        ) -> trainer_callback_service_pb2.DeliverSessionResultResponse:
            keys.append(request.idempotency_key)
            return trainer_callback_service_pb2.DeliverSessionResultResponse()

    name = trainer_callback_service_pb2.DESCRIPTOR.services_by_name["TrainerCallbackService"].full_name
    registration = ServiceRegistration(
        name, lambda s: trainer_callback_service_pb2_grpc.add_TrainerCallbackServiceServicer_to_server(Trainer(), s)
    )
    server, port = await start_grpc_server(
        [registration], host="127.0.0.1", port=0, tls=TlsFiles(trainer_crt, trainer_key, ca_crt)
    )
    target = CallbackTarget("grpc", f"127.0.0.1:{port}", 0)
    result = ResultRecord("s-1", "t", 0, TerminalStatus.RESOLVED, 1.0, 1, "gw", "key-1")
    fleet = CallbackSenders(tls=TlsFiles(rollout_crt, rollout_key, ca_crt), timeout_s=10)
    plain = CallbackSenders(timeout_s=5)
    try:
        assert await fleet.deliver(target, result, 1) is False
        assert keys == ["key-1"]
        with pytest.raises(DeliveryFailed, match="UNAVAILABLE"):
            await plain.deliver(target, result, 1)
    finally:
        await fleet.close()
        await plain.close()
        await server.stop(None)
