"""Throwaway PKI for the test control plane: a CA, the API server's serving certificate,
an admin client certificate and the service-account signing key.

Written with `cryptography` so the tests need no openssl binary. Keys are EC P-256 (fast to
generate; the API server and etcd accept them) except the service-account key, which is
RSA because that is what every Kubernetes version accepts for token signing.
"""
from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The first address of --service-cluster-ip-range: the `kubernetes` Service's ClusterIP.
FIRST_SERVICE_IP = "10.0.0.1"
APISERVER_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
APISERVER_IPS = ("127.0.0.1", FIRST_SERVICE_IP)


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files one control plane uses."""

    ca_cert: Path
    ca_key: Path
    apiserver_cert: Path
    apiserver_key: Path
    admin_cert: Path
    admin_key: Path
    service_account_key: Path  # private: the controller-manager and the API server sign with it
    service_account_pub: Path  # public: the API server verifies tokens with it


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _write_key(path: Path, key) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _issue(
    subject: x509.Name,
    public_key,
    issuer: x509.Name,
    issuer_key,
    *,
    is_ca: bool = False,
    server_names: tuple[str, ...] = (),
    server_ips: tuple[str, ...] = (),
    client: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        # Backdated: the components compare against their own clocks right away.
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if is_ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        builder = builder.add_extension(
            x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False
        )
    else:
        usages = []
        if server_names or server_ips:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if server_names or server_ips:
        alt_names = [x509.DNSName(n) for n in server_names]
        alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def generate_pki(directory: Path) -> Pki:
    """Create every key and certificate the control plane needs under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        apiserver_cert=directory / "apiserver.crt",
        apiserver_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        service_account_key=directory / "sa.key",
        service_account_pub=directory / "sa.pub",
    )
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("ddpjob-testbed-ca")
    ca_cert = _issue(ca_name, ca_key.public_key(), ca_name, ca_key, is_ca=True)
    _write_key(pki.ca_key, ca_key)
    _write_cert(pki.ca_cert, ca_cert)

    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = _issue(
        _name("kube-apiserver"), server_key.public_key(), ca_name, ca_key,
        server_names=APISERVER_DNS_NAMES, server_ips=APISERVER_IPS,
    )
    _write_key(pki.apiserver_key, server_key)
    _write_cert(pki.apiserver_cert, server_cert)

    # O=system:masters: the group every API server authorizes for everything, before RBAC.
    admin_key = ec.generate_private_key(ec.SECP256R1())
    admin_cert = _issue(
        _name("ddpjob-testbed-admin", "system:masters"), admin_key.public_key(), ca_name,
        ca_key, client=True,
    )
    _write_key(pki.admin_key, admin_key)
    _write_cert(pki.admin_cert, admin_cert)

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.service_account_key, sa_key)
    pki.service_account_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki
