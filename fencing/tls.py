"""Transport security for servers and clients: one small config, credentials from PEM files.

The same three settings mean the same on both sides: ``cert`` and ``key`` are this
process's own certificate chain and private key, ``ca`` the authority that signs the
*peer's* certificate::

    TLSConfig(cert="server.pem", key="server.key")               # server: TLS
    TLSConfig(cert="server.pem", key="server.key", ca="ca.pem")  # server: mTLS
    TLSConfig(ca="ca.pem")                                       # client: verify the server
    TLSConfig(ca="ca.pem", cert="me.pem", key="me.key")          # client: and present a cert (mTLS)

Each may be a path or the PEM bytes themselves. ``server_name`` (clients only)
overrides the name the server's certificate must carry, for targets given by IP
address or through a proxy. Servers refuse plaintext on anything but loopback
unless told ``insecure`` (see :func:`check_transport`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

import grpc

PEM = str | Path | bytes


def _read_pem(value: PEM, what: str, marker: bytes) -> bytes:
    if isinstance(value, bytes):
        data = value
    else:
        try:
            data = Path(value).read_bytes()
        except OSError as exc:
            raise ValueError(f"{what} {value}: cannot read: {exc.strerror or exc}") from exc
    if b"-----BEGIN" not in data or marker not in data:
        source = "given bytes" if isinstance(value, bytes) else str(value)
        raise ValueError(f"{what} {source}: not a PEM {marker.decode()}")
    return data


@dataclass(frozen=True)
class TLSConfig:
    """Certificates for one side of a connection (see the module docstring)."""

    cert: PEM | None = None
    key: PEM | None = None
    ca: PEM | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("tls: give both a certificate and its key, or neither")

    @property
    def mutual(self) -> bool:
        """On a server: clients must present a certificate signed by ``ca``."""
        return self.ca is not None

    def _pems(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        cert = _read_pem(self.cert, "tls certificate", b"CERTIFICATE") if self.cert else None
        key = _read_pem(self.key, "tls key", b"PRIVATE KEY") if self.key else None
        ca = _read_pem(self.ca, "tls ca", b"CERTIFICATE") if self.ca else None
        return cert, key, ca

    def check(self, *, server: bool) -> None:
        """Read and sanity-check every file now, so a bad path fails at startup."""
        if server and self.cert is None:
            raise ValueError("tls: a server needs its own certificate and key (tls_cert, tls_key)")
        self._pems()

    def server_credentials(self) -> grpc.ServerCredentials:
        """Credentials for ``server.add_secure_port``; client certs required iff ``ca``."""
        cert, key, ca = self._pems()
        if cert is None or key is None:
            raise ValueError("tls: a server needs its own certificate and key (tls_cert, tls_key)")
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Credentials for a client channel (system roots when ``ca`` is not given)."""
        cert, key, ca = self._pems()
        return grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=key, certificate_chain=cert
        )

    def channel_options(self) -> list[tuple[str, str]]:
        if self.server_name:
            return [("grpc.ssl_target_name_override", self.server_name)]
        return []


def split_address(address: str) -> tuple[str, str]:
    """``127.0.0.1:50051`` -> ``("127.0.0.1", "50051")``; ``[::1]:1`` -> ``("::1", "1")``."""
    host, sep, port = address.rpartition(":")
    if not sep:
        return address.strip("[]"), ""
    return host.strip("[]"), port


def is_loopback(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ::1; False for wildcards and other names."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: gRPC target prefixes of a Unix socket.
UNIX_SCHEMES = ("unix:", "unix-abstract:")


def is_local_target(target: str) -> bool:
    """True for a target only this host can reach: a loopback address, or a Unix socket
    (``unix:PATH``, guarded by the file system's permissions)."""
    if target.startswith(UNIX_SCHEMES):
        return True
    return is_loopback(split_address(target)[0])


def check_transport(address: str, tls: TLSConfig | None, insecure: bool) -> None:
    """Refuse plaintext on a non-loopback ``address`` unless ``insecure`` was asked for.

    A lease server or guard reachable from other hosts without TLS would hand tokens
    (and bearer credentials) to anyone on the path: that must be a conscious choice.
    """
    if tls is None and not insecure and not is_loopback(split_address(address)[0]):
        raise ValueError(
            f"refusing to serve plaintext on {address}: give tls_cert and tls_key "
            f"(--tls-cert/--tls-key or FENCING_TLS_CERT/FENCING_TLS_KEY), or --insecure "
            f"to accept an unencrypted, unauthenticated listener on a non-loopback address"
        )


__all__ = [
    "UNIX_SCHEMES",
    "TLSConfig",
    "check_transport",
    "is_local_target",
    "is_loopback",
    "split_address",
]
