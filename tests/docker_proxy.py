"""The local Docker engine behind a TCP port of 127.0.0.1, for the tests of `tcp://` engines.

`EngineProxy(folder, tls=True)` makes a certificate authority, a server certificate for
127.0.0.1 and a client certificate (with `cryptography`), and listens on a free port of
127.0.0.1 with TLS that requires the client's certificate; `tls=False` listens in clear text.
Each connection is forwarded, byte for byte, to the engine's unix socket. What a test gets:

- `url` ("tcp://127.0.0.1:PORT"), `cert_path` (a folder holding ca.pem, cert.pem and key.pem,
  what DOCKER_CERT_PATH names), `env()` (the DOCKER_* variables that reach it);
- `served`: how many connections were forwarded (with TLS: only those that presented the
  client certificate), so a test sees its traffic went through the proxy.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import selectors
import socket
import ssl
import threading
from pathlib import Path

ENGINE_SOCKET = "/var/run/docker.sock"


def _write_pki(folder: Path) -> tuple[Path, Path]:
    """ca.pem, cert.pem, key.pem (the client's) in `folder`; the server's cert and key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(text: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    def pem_key(key) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    def issue(subject: str, key, issuer_name, issuer_key, *extensions) -> x509.Certificate:
        builder = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(issuer_name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1)))
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = issue("sbx test CA", ca_key, name("sbx test CA"), ca_key,
               (x509.BasicConstraints(ca=True, path_length=None), True))
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = issue("127.0.0.1", server_key, ca.subject, ca_key,
                   (x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                    False),
                   (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False))
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = issue("sbx test client", client_key, ca.subject, ca_key,
                   (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False))

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (folder / "cert.pem").write_bytes(client.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(pem_key(client_key))
    (folder / "key.pem").chmod(0o600)
    server_cert, server_key_file = folder.parent / "server.pem", folder.parent / "server-key.pem"
    server_cert.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    server_key_file.write_bytes(pem_key(server_key))
    return server_cert, server_key_file


class EngineProxy:
    def __init__(self, folder: Path, *, tls: bool) -> None:
        self.cert_path = folder / "certs"
        self.context: ssl.SSLContext | None = None
        if tls:
            server_cert, server_key = _write_pki(self.cert_path)
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.load_cert_chain(server_cert, server_key)
            self.context.load_verify_locations(self.cert_path / "ca.pem")
            self.context.verify_mode = ssl.CERT_REQUIRED
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"tcp://127.0.0.1:{self.port}"
        self.served = 0
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def env(self) -> dict[str, str]:
        if self.context is None:
            return {"DOCKER_HOST": self.url}
        return {"DOCKER_HOST": self.url, "DOCKER_TLS_VERIFY": "1",
                "DOCKER_CERT_PATH": str(self.cert_path)}

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self.context is not None:
                conn.settimeout(10)
                conn = self.context.wrap_socket(conn, server_side=True)  # needs the client cert
                conn.settimeout(None)
        except (OSError, ssl.SSLError):
            conn.close()
            return
        self.served += 1
        engine = socket.socket(socket.AF_UNIX)
        try:
            engine.connect(ENGINE_SOCKET)
            self._pump(conn, engine)
        except OSError:
            pass
        finally:
            for sock in (conn, engine):
                with contextlib.suppress(OSError):
                    sock.close()

    @staticmethod
    def _pump(client: socket.socket, engine: socket.socket) -> None:
        """Both ways until either side closes (TLS has no half-close; neither needs it here)."""
        selector = selectors.DefaultSelector()
        selector.register(client, selectors.EVENT_READ, engine)
        selector.register(engine, selectors.EVENT_READ, client)
        try:
            while True:
                for key, _ in selector.select():
                    source, target = key.fileobj, key.data
                    data = source.recv(65536)
                    if not data:
                        return
                    target.sendall(data)
                    # a TLS socket may hold decrypted bytes the selector cannot see
                    while isinstance(source, ssl.SSLSocket) and source.pending():
                        target.sendall(source.recv(source.pending()))
        finally:
            selector.close()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        with contextlib.suppress(OSError):
            self.listener.close()
        self._thread.join(timeout=5)
