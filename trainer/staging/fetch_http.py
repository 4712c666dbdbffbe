"""An https:// source for `trainer.staging.fetch`: one file, its size and ETag from a HEAD request, read
from an offset with a Range request (`If-Range`: a file changed on the server is read whole again).

Standard library only. TLS is verified against the system's CAs, `SSL_CERT_FILE` or
`REQUESTS_CA_BUNDLE`, or the `ca_bundle` shipped with the spec; a redirect never downgrades to
http:// unless the spec allows http.
"""

from __future__ import annotations

import os
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from .fetch_types import READ_SIZE, FetchError, Remote

TIMEOUT_S = 60


class NoDowngrade(urllib.request.HTTPRedirectHandler):
    def __init__(self, allow_http: bool):
        self.allow_http = allow_http

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urlsplit(newurl).scheme != "https" and not self.allow_http:
            raise FetchError(f"{req.full_url} redirects to {newurl}, which is not https://")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class HttpSource:
    def __init__(self, spec: dict, root: Path):
        self.url, self.spec = spec["source"], spec
        cafile = spec.get("ca_bundle")
        cafile = str(root / cafile) if cafile else os.environ.get("SSL_CERT_FILE") or \
            os.environ.get("REQUESTS_CA_BUNDLE") or None
        handlers = [NoDowngrade(spec.get("insecure_http", False))]
        if self.url.startswith("https://"):
            handlers.append(urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=cafile)))
        self.opener = urllib.request.build_opener(*handlers)

    def _open(self, request: urllib.request.Request):
        try:
            return self.opener.open(request, timeout=TIMEOUT_S)
        except urllib.error.HTTPError as e:
            if e.code >= 500:
                raise  # the server may recover: the caller tries again
            raise FetchError(f"{self.url}: HTTP {e.code} {e.reason}") from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, ssl.SSLError):
                raise FetchError(f"{self.url}: TLS failed ({e.reason}); a private CA: set ca_bundle") from None
            raise

    def listing(self) -> tuple[str, list[Remote]]:
        with self._open(urllib.request.Request(self.url, method="HEAD")) as reply:
            length = reply.headers.get("Content-Length")
            tag = reply.headers.get("ETag") or reply.headers.get("Last-Modified") or ""
        if length is None or not length.isdigit():
            raise FetchError(f"{self.url}: the server sends no Content-Length, so a fetch cannot be checked "
                             "or resumed")
        name = Path(urlsplit(self.url).path).name
        return "file", [Remote(name, self.url, int(length), tag)]

    def read(self, remote: Remote, offset: int):
        """(where the bytes start, an iterator of blocks): `offset`, or 0 when the server sends it whole."""
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        if offset and remote.etag and not remote.etag.startswith("W/"):
            headers["If-Range"] = remote.etag
        reply = self._open(urllib.request.Request(remote.key, headers=headers))
        start = 0
        if reply.status == 206:
            content_range = reply.headers.get("Content-Range", "")
            if not content_range.startswith(f"bytes {offset}-"):
                reply.close()
                raise FetchError(f"{self.url}: asked from byte {offset}, the server sent {content_range!r}")
            start = offset

        def blocks():
            with reply:
                while block := reply.read(READ_SIZE):
                    yield block
        return start, blocks()
