"""Remote data sources for the tests: an HTTP(S) file server that honours Range and can cut a reply
half way, a private CA for its certificate, and a moto S3 server with a bucket of files."""

from __future__ import annotations

import datetime
import hashlib
import http.server
import ipaddress
import re
import ssl
import threading
from pathlib import Path


class FileServer(http.server.ThreadingHTTPServer):
    """Serves `files` (URL path -> bytes) with ETag and Range; the first `cuts` GETs stop half way."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], files: dict[str, bytes], cuts: int = 0):
        super().__init__(address, RangeHandler)
        self.files, self.cuts, self.requests = files, cuts, []
        self.lock = threading.Lock()

    def start(self) -> FileServer:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class RangeHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_HEAD(self) -> None:
        self.reply(body=False)

    def do_GET(self) -> None:
        self.reply(body=True)

    def reply(self, body: bool) -> None:
        data = self.server.files.get(self.path)
        with self.server.lock:
            self.server.requests.append((self.command, self.path, self.headers.get("Range")))
            cut = body and self.server.cuts > 0
            self.server.cuts -= 1 if cut else 0
        if data is None:
            self.send_error(404)
            return
        etag = '"' + hashlib.sha256(data).hexdigest()[:16] + '"'
        start, asked = 0, re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
        if asked and self.headers.get("If-Range", etag) == etag and int(asked[1]) < len(data):
            start = int(asked[1])
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data) - start))
        self.send_header("ETag", etag)
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if body:
            end = start + (len(data) - start) // 2 if cut else len(data)
            self.wfile.write(data[start:end])
            if cut:
                self.close_connection = True


def private_ca(folder: Path, ip: str) -> tuple[Path, ssl.SSLContext]:
    """A CA (written to folder/ca.pem) and a server context whose certificate it signed for `ip`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    span = (now - datetime.timedelta(days=1), now + datetime.timedelta(days=2))

    def cert(subject, issuer, key, signer, extensions):
        builder = x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(
            key.public_key()).serial_number(x509.random_serial_number()).not_valid_before(span[0]) \
            .not_valid_after(span[1])
        for ext, critical in extensions:
            builder = builder.add_extension(ext, critical=critical)
        return builder.sign(signer, hashes.SHA256())

    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fatpipe test CA")])
    ca = cert(ca_name, ca_name, ca_key, ca_key, [
        (x509.BasicConstraints(ca=True, path_length=None), True),
        (x509.KeyUsage(False, False, False, False, False, True, True, False, False), True),
        (x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)])
    leaf = cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ip)]), ca_name, leaf_key, ca_key, [
        (x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), False),
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), False),
        (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False)])
    pem = serialization.Encoding.PEM
    (folder / "ca.pem").write_bytes(ca.public_bytes(pem))
    (folder / "server.pem").write_bytes(leaf.public_bytes(pem) + leaf_key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "server.pem")
    return folder / "ca.pem", context


def https_server(folder: Path, ip: str, port: int, files: dict[str, bytes], cuts: int = 0):
    """(a started FileServer over TLS on ip:port, the CA bundle that verifies it)."""
    ca, context = private_ca(folder, ip)
    server = FileServer((ip, port), files, cuts)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    return server.start(), ca


def s3_server(ip: str, port: int, bucket: str, objects: dict[str, bytes]):
    """A started moto S3 server on ip:port holding `objects` (public-read) in `bucket`; .stop() it."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address=ip, port=port, verbose=False)
    server.start()
    s3 = boto3.client("s3", endpoint_url=f"http://{ip}:{port}", region_name="us-east-1",
                      aws_access_key_id="test-operator", aws_secret_access_key="test-operator")
    s3.create_bucket(Bucket=bucket)
    for key, data in objects.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data, ACL="public-read")  # anonymous reads work too
    return server


def write_node_python(folder: Path, python: str) -> Path:
    """`node-python` in `folder`: `python` with a node's own AWS credentials (as an instance role or
    its environment would give them) and no metadata service; the nodes' remote_python."""
    path = folder / "node-python"
    path.write_text(f"""#!/bin/sh
export AWS_ACCESS_KEY_ID=node-own AWS_SECRET_ACCESS_KEY=node-own AWS_EC2_METADATA_DISABLED=true
exec {python} "$@"
""")
    path.chmod(0o755)
    return path
