"""A throwaway PKI made with ``cryptography``: CAs, leaf certificates for 127.0.0.1 or for cluster DNS names only,
written as ``tls.crt`` / ``tls.key`` (PEM) the way a Kubernetes TLS Secret holds them."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass
class Pair:
    """A certificate file and its private key file."""

    cert: Path
    key: Path


@dataclass
class PKI:
    """Our CA with a server and a client certificate, and another CA with its own client and server."""

    ca: Path
    server: Pair
    client: Pair
    other_ca: Path
    other_client: Pair
    other_server: Pair


def name(cn: str) -> x509.Name:
    """An X.509 name with only a common name."""
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def write_pair(path: Path, key, cert) -> Pair:
    """Write ``key`` (PKCS8, unencrypted) and ``cert`` as PEM to ``path``/tls.key and tls.crt."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption()))
    (path / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Pair(path / "tls.crt", path / "tls.key")


def make_ca(path: Path, cn: str):
    """A self-signed P-256 CA valid for a day, written to ``path``; returns (private key, certificate)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(name(cn)).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    write_pair(path, key, cert)
    return key, cert


def make_leaf(path: Path, cn: str, ca_key, ca_cert) -> Pair:
    """A certificate valid for 127.0.0.1 / localhost, for both server and client authentication."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    return write_pair(path, key, cert)


def make_cluster_leaf(path: Path, names: list[str], ca_key, ca_cert) -> Pair:
    """A certificate valid only for cluster DNS names (no 127.0.0.1, no localhost), like a Secret made for the
    chart's Services; for server and client authentication."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name(names[0])).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    return write_pair(path, key, cert)


def make_pki(d: Path):
    """The test PKI under ``d``: "mascot test CA" with a server ("mascot") and a client ("alice") certificate, and
    "someone else's CA" with a client ("mallory") and a server ("mascot"). Returns (PKI, our CA's key, its
    certificate)."""
    ca_key, ca = make_ca(d / "ca", "mascot test CA")
    other_key, other = make_ca(d / "other-ca", "someone else's CA")
    pki = PKI(ca=d / "ca" / "tls.crt", server=make_leaf(d / "server", "mascot", ca_key, ca),
              client=make_leaf(d / "client", "alice", ca_key, ca), other_ca=d / "other-ca" / "tls.crt",
              other_client=make_leaf(d / "other-client", "mallory", other_key, other),
              other_server=make_leaf(d / "other-server", "mascot", other_key, other))
    return pki, ca_key, ca
