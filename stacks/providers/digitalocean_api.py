"""The DigitalOcean API v2 over plain HTTPS: the preflight before a deploy.

Preflight, in order: the size is offered and available in the region; the private range
overlaps no other VPC of the account; the region has a default VPC (else a warning); the SSH
key is settled (one already on the account is used by fingerprint, not added again).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import http.client
import ipaddress
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from fatpipe.infra.catalog import load_catalog
from fatpipe.infra.errors import FatpipeError

API_URL_ENV = "DIGITALOCEAN_API_URL"
DEFAULT_API_URL = "https://api.digitalocean.com"
TOKEN_ENVS = ("DIGITALOCEAN_TOKEN", "DIGITALOCEAN_ACCESS_TOKEN")  # what the Terraform provider reads
PER_PAGE = 200  # the most DigitalOcean returns in one page
MAX_PAGES = 100  # a guard against a `next` link that never ends
TIMEOUT_S = 30

Log = Callable[[str], None]


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class DigitalOceanApi:
    """GET requests against one API base URL with one token; every failure is a FatpipeError."""

    def __init__(self, base_url: str, token: str):
        self.base_url = base_url.rstrip("/")
        self.token = token

    @classmethod
    def from_env(cls) -> DigitalOceanApi:
        token = next((os.environ[name] for name in TOKEN_ENVS if os.environ.get(name)), None)
        if not token:
            raise FatpipeError("no DigitalOcean token: set DIGITALOCEAN_TOKEN (or DIGITALOCEAN_ACCESS_TOKEN) "
                               "to an API token (cloud.digitalocean.com/account/api/tokens)")
        return cls(os.environ.get(API_URL_ENV) or DEFAULT_API_URL, token)

    def get_all(self, path: str, key: str) -> list[dict]:
        """Every item of a paged collection (`path` such as /v2/sizes, `key` such as "sizes")."""
        items: list[dict] = []
        query = urllib.parse.urlencode({"per_page": PER_PAGE})
        for _ in range(MAX_PAGES):
            page = self.get(path, query)
            items.extend(page.get(key) or [])
            following = ((page.get("links") or {}).get("pages") or {}).get("next")
            if not following:
                return items
            # Only the next page's query is taken: the token goes nowhere but to our base URL,
            # and a proxy in DIGITALOCEAN_API_URL stays in the path of every page.
            query = urllib.parse.urlsplit(following).query
        raise FatpipeError(f"DigitalOcean API: GET {path} still had more pages after {MAX_PAGES}")

    def get(self, path: str, query: str = "") -> dict:
        url = f"{self.base_url}{path}" + (f"?{query}" if query else "")
        request = urllib.request.Request(url, headers={
            "Authorization": f"Bearer {self.token}", "Accept": "application/json",
            "User-Agent": "fatpipe-preflight"})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as reply:
                body = reply.read()
        except urllib.error.HTTPError as e:
            raise FatpipeError(f"DigitalOcean API refused GET {path}: HTTP {e.code} {_message(e)}") from None
        except urllib.error.URLError as e:
            raise FatpipeError(f"cannot reach the DigitalOcean API at {self.base_url}: "
                               f"{_one_line(e.reason)}") from None
        except (OSError, ValueError, http.client.HTTPException) as e:  # a timeout, a cut reply, a bad URL
            raise FatpipeError(f"cannot reach the DigitalOcean API at {self.base_url}: {_one_line(e)}") from None
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise FatpipeError(f"DigitalOcean API: GET {path} answered with something that is not a JSON object")
        return doc


def _message(error: urllib.error.HTTPError) -> str:
    """DigitalOcean's own `message` from an error reply, else the HTTP reason."""
    try:
        message = json.loads(error.read()).get("message")
    except (OSError, ValueError, AttributeError, http.client.HTTPException):
        message = None
    return _one_line(message or error.reason or "")


def preflight(cluster, project, size: str, log: Log | None = None, api: DigitalOceanApi | None = None):
    """Raise FatpipeError (one line) if `cluster` cannot be deployed as declared; return it settled.

    `size` is the machine the cluster gets; `project` gives the catalog's folder and the id in
    the names the stack gives its VPC and key. The returned cluster names an SSH key already on
    the account by fingerprint, since DigitalOcean refuses to add the same key twice.
    """
    api = api or DigitalOceanApi.from_env()
    own_name = f"fatpipe-{cluster.name}-{project.project_id}"  # the stack's `unique_name`
    _check_size(api, cluster, size, project.root)
    vpcs = api.get_all("/v2/vpcs", "vpcs")
    _check_private_range(cluster, vpcs, own_name)
    if log is not None:
        for warning in _default_vpc_warnings(cluster, vpcs, own_name):
            log(warning)
    return _settle_ssh_key(api, cluster, own_name, log)


def _check_size(api: DigitalOceanApi, cluster, size: str, root: Path | None) -> None:
    sizes = {s.get("slug"): s for s in api.get_all("/v2/sizes", "sizes")}

    def usable(slug: str) -> bool:
        found = sizes.get(slug) or {}
        return bool(found.get("available")) and cluster.region in (found.get("regions") or [])

    if usable(size):
        return
    found = sizes.get(size)
    if found is None:
        why = f"DigitalOcean offers no size {size}"
    elif cluster.region not in (found.get("regions") or []):
        why = f"size {size} is not offered in {cluster.region}"
    else:
        why = f"size {size} is not available now in {cluster.region}"
    catalog = load_catalog("digitalocean", cluster.region, root)
    candidates = [t for t in catalog.qualifying(cluster.tier_gbps, cluster.gpus_per_node)
                  if t.name != size and usable(t.name)]
    if not candidates:
        raise FatpipeError(f"{cluster.name}: {why}, and no other size that reaches tier {cluster.tier} is "
                           "available there; choose another region")
    best = candidates[0]
    raise FatpipeError(f"{cluster.name}: {why}; {best.name} reaches tier {cluster.tier} "
                       f"({best.bandwidth_text()}, {best.price_text()}) and is available there: "
                       f"set clusters.{cluster.name}.size = \"{best.name}\"")


def _check_private_range(cluster, vpcs: list[dict], own_name: str) -> None:
    # DigitalOcean refuses a VPC whose range overlaps any other VPC of the account, in any region.
    wanted = ipaddress.IPv4Network(cluster.private_cidr)
    for vpc in vpcs:
        if vpc.get("name") == own_name:  # this cluster's own VPC: a re-deploy keeps it
            continue
        try:
            theirs = ipaddress.ip_network(vpc.get("ip_range") or "", strict=False)
        except ValueError:
            continue
        if theirs.version == 4 and theirs.overlaps(wanted):
            raise FatpipeError(
                f"{cluster.name}: private_cidr {cluster.private_cidr} overlaps VPC {vpc.get('name')!r} "
                f"({theirs}, {vpc.get('region')}) and DigitalOcean refuses overlapping VPC ranges in one "
                f"account; set clusters.{cluster.name}.private_cidr to a free range")


def _default_vpc_warnings(cluster, vpcs: list[dict], own_name: str) -> list[str]:
    """DigitalOcean never deletes a region's default VPC, and the first VPC made there becomes it."""
    default = next((v for v in vpcs if v.get("region") == cluster.region and v.get("default")), None)
    if default is not None and default.get("name") != own_name:
        return []
    if default is None:
        what = (f"{cluster.region} has no default VPC yet, so this cluster's VPC would become it and "
                "DigitalOcean refuses to delete a default VPC")
    else:
        what = f"this cluster's VPC {own_name} is {cluster.region}'s default VPC, which DigitalOcean refuses to delete"
    return [f"{cluster.name}: {what}: `fatpipe down {cluster.name}` would fail on it. To avoid that, create "
            f"a default VPC in {cluster.region} first (control panel: Networking > VPC > Create VPC Network)"]


def _settle_ssh_key(api: DigitalOceanApi, cluster, own_name: str, log: Log | None):
    keys = api.get_all("/v2/account/keys", "ssh_keys")
    on_account = {k.get("fingerprint"): k for k in keys}
    if cluster.ssh_key_fingerprint:
        if cluster.ssh_key_fingerprint not in on_account:
            raise FatpipeError(f"{cluster.name}: ssh_key_fingerprint {cluster.ssh_key_fingerprint} is not a key "
                               "of this DigitalOcean account (see `doctl compute ssh-key list`)")
        return cluster
    fingerprint = md5_fingerprint(cluster.public_key, cluster.ssh_public_key)
    found = on_account.get(fingerprint)
    if found is None or found.get("name") == own_name:  # absent, or the stack's own key
        return cluster
    if log is not None:
        log(f"{cluster.name}: the public key {cluster.ssh_public_key} is already on the DigitalOcean account "
            f"as {found.get('name')!r}; the droplets use it by fingerprint {fingerprint}")
    return cluster.model_copy(update={"ssh_key_fingerprint": fingerprint})


def md5_fingerprint(public_key: str, label: str = "the public key") -> str:
    """The MD5 fingerprint (aa:bb:...) of an OpenSSH public key line, as DigitalOcean shows it."""
    fields = public_key.split()
    try:
        blob = base64.b64decode(fields[1], validate=True)
    except (IndexError, binascii.Error):
        raise FatpipeError(f"{label} is not an OpenSSH public key line (type, base64 key, comment)") from None
    digest = hashlib.md5(blob, usedforsecurity=False).hexdigest()  # the fingerprint format, not security
    return ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))
