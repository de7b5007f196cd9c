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
    directory: Path, stem: str, subject: str, issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None, *, ca: bool
) -> tuple[Path, Path, x509.Name, ec.EllipticCurvePrivateKey]:
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
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
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
