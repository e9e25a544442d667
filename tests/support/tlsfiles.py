"""A throwaway PKI for TLS tests, made with the `openssl` command: a CA, server and client certificates signed
by it, and a second CA that signed nothing the servers use. EC P-256 keys: the whole set takes a fraction of a
second. Servers' contexts for FaultServer come from here too."""

from __future__ import annotations

import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    """Paths of the generated files."""

    dir: Path
    ca: Path  # signed every certificate below
    other_ca: Path  # a CA that signed none of them
    server_cert: Path  # for 127.0.0.1 and localhost
    server_key: Path
    named_cert: Path  # for vllm.internal only: reachable at 127.0.0.1 with server_name
    named_key: Path
    client_cert: Path  # a client certificate for mTLS
    client_key: Path
    client_key_encrypted: Path  # the same key under a passphrase

    def server_context(self, *, named: bool = False, require_client_cert: bool = False) -> ssl.SSLContext:
        """A server-side context; with require_client_cert it refuses clients without a certificate of our CA."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        if named:
            ctx.load_cert_chain(self.named_cert, self.named_key)
        else:
            ctx.load_cert_chain(self.server_cert, self.server_key)
        if require_client_cert:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(self.ca)
        return ctx


def _openssl(*args: str | Path, cwd: Path) -> None:
    subprocess.run(["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True, timeout=30)


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.pem"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip
    return cert, key


def _leaf(directory: Path, name: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    key, csr, cert = directory / f"{name}.key", directory / f"{name}.csr", directory / f"{name}.pem"
    ext = directory / f"{name}.ext"
    ext.write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        "authorityKeyIdentifier=keyid,issuer\nsubjectKeyIdentifier=hash\n" + extensions
    )
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", key, "-out", csr, "-subj", f"/CN={name}", cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
        "-out", cert, "-days", "2", "-extfile", ext, cwd=directory,
    )  # fmt: skip
    return cert, key


def make_pki(directory: Path) -> Pki:
    """Generate the whole set under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca(directory, "test-ca")
    other, _ = _ca(directory, "other-ca")
    server = _leaf(
        directory, "server", ca, "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    )
    named = _leaf(directory, "named", ca, "subjectAltName=DNS:vllm.internal\nextendedKeyUsage=serverAuth\n")
    client = _leaf(directory, "client", ca, "extendedKeyUsage=clientAuth\n")
    encrypted = directory / "client-encrypted.key"
    _openssl(
        "ec",
        "-in",
        client[1],
        "-aes256",
        "-passout",
        "pass:test-passphrase",
        "-out",
        encrypted,
        cwd=directory,
    )
    return Pki(
        directory, ca[0], other, server[0], server[1], named[0], named[1], client[0], client[1], encrypted
    )
