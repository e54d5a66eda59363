"""A small PKI for TLS tests, made with cryptography: a CA, a server certificate for 127.0.0.1 and
localhost, a client certificate the CA signed, and a self-signed "stranger" client certificate.
P-256 keys, so making one takes milliseconds."""

from __future__ import annotations

import datetime
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Pki", "client_context", "make_pki", "write_certificate"]


@dataclass(frozen=True)
class Pki:
    folder: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path  # signed by the CA, SAN DNS:prometheus.monitoring
    client_key: Path
    stranger_cert: Path  # self-signed, SAN DNS:stranger
    stranger_key: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def write_certificate(
    folder: Path,
    stem: str,
    common_name: str,
    *,
    sans: list[x509.GeneralName],
    usage,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None = None,
    serial: int | None = None,
) -> tuple[Path, Path, x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    signer_cert, signer_key = issuer or (None, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(signer_cert.subject if signer_cert else _name(common_name))
        .public_key(key.public_key())
        .serial_number(serial or x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        # RFC 5280's key identifiers, which Python 3.13's default context (VERIFY_X509_STRICT) requires
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer_key.public_key()), critical=False
        )
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(signer_key, hashes.SHA256())
    cert_path, key_path = folder / f"{stem}.pem", folder / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path, cert, key


def make_pki(folder: Path) -> Pki:
    import ipaddress

    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("gpumeter test CA"))
        .issuer_name(_name("gpumeter test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    (folder / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    server_cert, server_key, *_ = write_certificate(
        folder,
        "server",
        "127.0.0.1",
        sans=[x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")],
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        issuer=(ca, ca_key),
    )
    client_cert, client_key, *_ = write_certificate(
        folder,
        "client",
        "prometheus",
        sans=[x509.DNSName("prometheus.monitoring")],
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        issuer=(ca, ca_key),
    )
    stranger_cert, stranger_key, *_ = write_certificate(
        folder, "stranger", "stranger", sans=[x509.DNSName("stranger")], usage=ExtendedKeyUsageOID.CLIENT_AUTH
    )
    return Pki(
        folder,
        folder / "ca.pem",
        server_cert,
        server_key,
        client_cert,
        client_key,
        stranger_cert,
        stranger_key,
    )


def client_context(pki: Pki, identity: str | None = None) -> ssl.SSLContext:
    """A client that trusts the test CA and presents ``identity`` ("client", "stranger" or None)."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    if identity is not None:
        context.load_cert_chain(getattr(pki, f"{identity}_cert"), getattr(pki, f"{identity}_key"))
    return context
