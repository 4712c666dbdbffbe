"""The DigitalOcean preflight against a fake DO API v2 on a loopback port (paged, token-checked)."""

from __future__ import annotations

import json
import socket
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fatpipe.infra.catalog import load_catalog
from fatpipe.infra.clusters import DigitalOceanCluster
from fatpipe.infra.errors import FatpipeError
from fatpipe.infra.project import load_project
from fatpipe.stacks.providers import DIGITALOCEAN
from fatpipe.stacks.providers.digitalocean_api import md5_fingerprint, preflight

TOKEN = "dop_v1_test"
# Real ed25519 keys, with the MD5 fingerprints `ssh-keygen -l -E md5` shows for them.
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKUPMq1MBSgnMg/WBrmBqrcViA6UoQJiPBGYT01EdQUy sea@test"
FINGERPRINT = "a2:65:0a:3d:b4:cc:fd:30:70:c4:6a:b4:5b:9b:38:bd"
OTHER_FINGERPRINT = "1d:43:de:f5:50:e6:11:a7:cd:69:2e:3e:f2:46:a0:b2"
PAGE_SIZE = 2  # the fake pages every collection this small, so each one spans pages


class FakeDigitalOcean(ThreadingHTTPServer):
    """GET /v2/sizes, /v2/vpcs, /v2/account/keys as DigitalOcean pages them; 401 without the token."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), FakeHandler)
        regions = ["nyc3", "fra1"]
        self.data = {
            "sizes": [{"slug": name, "available": True, "regions": list(regions)}
                      for name in load_catalog("digitalocean").types],
            "vpcs": [{"id": "v1", "name": "default-nyc3", "region": "nyc3", "ip_range": "10.116.0.0/20", "default": True},
                     {"id": "v2", "name": "default-fra1", "region": "fra1", "ip_range": "10.114.0.0/20", "default": True},
                     {"id": "v3", "name": "staging", "region": "ams3", "ip_range": "10.99.0.0/24", "default": False}],
            "ssh_keys": [{"id": 1, "name": "ci", "fingerprint": OTHER_FINGERPRINT}],
        }
        self.failure: tuple[int, str] | None = None  # (status, body) every request gets instead
        self.seen: list[tuple[str, str]] = []  # (path?query, Authorization) of each request

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class FakeHandler(BaseHTTPRequestHandler):
    server: FakeDigitalOcean
    collections = {"/v2/sizes": "sizes", "/v2/vpcs": "vpcs", "/v2/account/keys": "ssh_keys"}

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        auth = self.headers.get("Authorization", "")
        self.server.seen.append((self.path, auth))
        if auth != f"Bearer {TOKEN}":
            return self.reply(401, json.dumps({"id": "unauthorized", "message": "Unable to authenticate you"}))
        if self.server.failure:
            return self.reply(*self.server.failure)
        key = self.collections.get(url.path)
        if key is None:
            return self.reply(404, json.dumps({"id": "not_found", "message": "The resource you requested could not be found."}))
        query = dict(urllib.parse.parse_qsl(url.query))
        page, per_page = int(query.get("page", 1)), min(int(query.get("per_page", 20)), PAGE_SIZE)
        items = self.server.data[key]
        body = {key: items[(page - 1) * per_page:page * per_page], "links": {}, "meta": {"total": len(items)}}
        if page * per_page < len(items):
            # DigitalOcean's own host, as the real API writes it: the client must stay on its base URL.
            body["links"] = {"pages": {"next": f"https://api.digitalocean.com{url.path}?page={page + 1}&per_page={per_page}"}}
        self.reply(200, json.dumps(body))

    def reply(self, status: int, body: str):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # quiet: pytest shows failures, not access logs
        pass


@pytest.fixture
def do_api(monkeypatch):
    server = FakeDigitalOcean()
    # A short poll: shutdown() waits up to one poll interval, 0.5 s by default.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    monkeypatch.setenv("DIGITALOCEAN_API_URL", server.url)
    monkeypatch.setenv("DIGITALOCEAN_TOKEN", TOKEN)
    monkeypatch.delenv("DIGITALOCEAN_ACCESS_TOKEN", raising=False)
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture
def key(project_dir):
    path = project_dir / "id.pub"
    path.write_text(PUBLIC_KEY + "\n")
    return str(path)


@pytest.fixture
def project(project_dir, key):
    (project_dir / "fatpipe.toml").write_text(f"""
[clusters.sea]
provider = "digitalocean"
region = "nyc3"
nodes = 2
ssh_public_key = "{key}"
ssh_cidr = "203.0.113.7/32"
""")
    return load_project()


def do(key, **kw):
    fields = dict(provider="digitalocean", name="sea", region="nyc3", nodes=2, tier="1g",
                  ssh_public_key=key, ssh_cidr="203.0.113.7/32")
    return DigitalOceanCluster(**{**fields, **kw})


def own_name(project) -> str:
    return f"fatpipe-sea-{project.project_id}"  # what the stack names its VPC and key


def refused(cluster, project, size="s-2vcpu-4gb") -> str:
    with pytest.raises(FatpipeError) as error:
        preflight(cluster, project, size=size)
    message = str(error.value)
    assert "\n" not in message
    return message


# -- passing -------------------------------------------------------------------------------------

def test_a_good_cluster_passes_unchanged_over_every_page(do_api, project, key):
    logged: list[str] = []
    cluster = do(key)
    assert DIGITALOCEAN.preflight(cluster, project, logged.append) == cluster
    assert logged == []
    assert {auth for _, auth in do_api.seen} == {f"Bearer {TOKEN}"}
    paths = [path for path, _ in do_api.seen]
    assert paths[0] == "/v2/sizes?per_page=200"  # the most DigitalOcean gives a page
    sizes = len(load_catalog("digitalocean").types)
    assert sum(p.startswith("/v2/sizes") for p in paths) == -(-sizes // PAGE_SIZE)
    assert sum(p.startswith("/v2/vpcs") for p in paths) == 2
    assert "/v2/vpcs?page=2&per_page=2" in paths


def test_the_md5_fingerprint_is_the_one_ssh_keygen_shows():
    assert md5_fingerprint(PUBLIC_KEY) == FINGERPRINT
    with pytest.raises(FatpipeError, match="id.pub is not an OpenSSH public key line"):
        md5_fingerprint("ssh-ed25519 not-base64!", "id.pub")


# -- the SSH key ---------------------------------------------------------------------------------

def test_a_key_already_on_the_account_is_used_by_its_fingerprint(do_api, project, key):
    # Third on the list: on the second page of keys.
    do_api.data["ssh_keys"] += [{"id": 2, "name": "spare", "fingerprint": "00" + OTHER_FINGERPRINT[2:]},
                                {"id": 3, "name": "laptop", "fingerprint": FINGERPRINT}]
    logged: list[str] = []
    cluster = do(key)
    settled = DIGITALOCEAN.preflight(cluster, project, logged.append)
    assert settled.ssh_key_fingerprint == FINGERPRINT and cluster.ssh_key_fingerprint is None
    assert settled.model_copy(update={"ssh_key_fingerprint": None}) == cluster
    assert len(logged) == 1 and "'laptop'" in logged[0] and FINGERPRINT in logged[0]


def test_the_clusters_own_key_is_left_to_the_stack(do_api, project, key):
    do_api.data["ssh_keys"].append({"id": 3, "name": own_name(project), "fingerprint": FINGERPRINT})
    assert preflight(do(key), project, size="s-2vcpu-4gb").ssh_key_fingerprint is None


def test_a_named_fingerprint_must_be_on_the_account(do_api, project, key):
    message = refused(do(key, ssh_key_fingerprint=FINGERPRINT), project)
    assert message == (f"sea: ssh_key_fingerprint {FINGERPRINT} is not a key of this DigitalOcean account "
                       "(see `doctl compute ssh-key list`)")
    named = do(key, ssh_key_fingerprint=OTHER_FINGERPRINT)
    assert preflight(named, project, size="s-2vcpu-4gb") == named


# -- the private range and the default VPC ---------------------------------------------------------

def test_an_overlapping_vpc_is_refused_by_name_but_the_clusters_own_is_not(do_api, project, key):
    do_api.data["vpcs"].append({"id": "v4", "name": "prod", "region": "sfo3", "ip_range": "10.42.0.0/16",
                                "default": False})
    message = refused(do(key), project)
    assert message.startswith("sea: private_cidr 10.42.0.0/24 overlaps VPC 'prod' (10.42.0.0/16, sfo3)")
    assert "clusters.sea.private_cidr" in message
    do_api.data["vpcs"][-1]["name"] = own_name(project)  # a re-deploy finds its own VPC
    preflight(do(key), project, size="s-2vcpu-4gb")


def test_a_region_without_a_default_vpc_gives_a_warning(do_api, project, key):
    do_api.data["vpcs"][0]["default"] = False
    logged: list[str] = []
    preflight(do(key), project, size="s-2vcpu-4gb", log=logged.append)
    (warning,) = logged
    assert warning.startswith("sea: nyc3 has no default VPC yet")
    assert "`fatpipe down sea` would fail" in warning and "create a default VPC in nyc3 first" in warning
    preflight(do(key), project, size="s-2vcpu-4gb", log=None)  # no log: nothing to tell
    preflight(do(key, region="fra1"), project, size="s-2vcpu-4gb", log=pytest.fail)  # fra1 has one


def test_the_clusters_own_vpc_as_the_default_gives_a_warning(do_api, project, key):
    do_api.data["vpcs"][0].update(name=own_name(project), ip_range="10.42.0.0/24")
    logged: list[str] = []
    preflight(do(key), project, size="s-2vcpu-4gb", log=logged.append)
    assert len(logged) == 1 and f"VPC {own_name(project)} is nyc3's default VPC" in logged[0]


# -- the size ------------------------------------------------------------------------------------

def test_a_size_not_offered_in_the_region_is_refused_naming_one_that_is(do_api, project, key):
    sizes = {s["slug"]: s for s in do_api.data["sizes"]}
    sizes["s-2vcpu-4gb"]["regions"] = ["fra1"]
    message = refused(do(key), project)
    assert message.startswith("sea: size s-2vcpu-4gb is not offered in nyc3; s-2vcpu-4gb-amd reaches tier 1g")
    assert message.endswith('set clusters.sea.size = "s-2vcpu-4gb-amd"')
    sizes["s-2vcpu-4gb-amd"]["available"] = False  # sold out: the next cheapest
    assert "; c-2 reaches tier 1g" in refused(do(key), project)
    assert refused(do(key), project, size="s-9vcpu-xl").startswith("sea: DigitalOcean offers no size s-9vcpu-xl;")
    for size in sizes.values():
        size["regions"] = ["fra1"]
    assert refused(do(key), project).endswith("and no other size that reaches tier 1g is available there; "
                                              "choose another region")


def test_a_size_offered_but_unavailable_says_so(do_api, project, key):
    next(s for s in do_api.data["sizes"] if s["slug"] == "s-2vcpu-4gb")["available"] = False
    assert refused(do(key), project).startswith("sea: size s-2vcpu-4gb is not available now in nyc3;")


# -- token and transport failures ----------------------------------------------------------------

def test_no_token_is_refused_before_any_request(do_api, project, key, monkeypatch):
    monkeypatch.delenv("DIGITALOCEAN_TOKEN")
    assert refused(do(key), project).startswith("no DigitalOcean token: set DIGITALOCEAN_TOKEN")
    assert do_api.seen == []
    monkeypatch.setenv("DIGITALOCEAN_ACCESS_TOKEN", TOKEN)  # the other name the provider reads
    preflight(do(key), project, size="s-2vcpu-4gb")


def test_http_errors_are_one_line_with_status_and_message(do_api, project, key, monkeypatch):
    monkeypatch.setenv("DIGITALOCEAN_TOKEN", "dop_v1_wrong")
    assert refused(do(key), project) == "DigitalOcean API refused GET /v2/sizes: HTTP 401 Unable to authenticate you"
    monkeypatch.setenv("DIGITALOCEAN_TOKEN", TOKEN)
    do_api.failure = (500, json.dumps({"id": "server_error", "message": "Server Error.\nTry again later."}))
    assert refused(do(key), project) == "DigitalOcean API refused GET /v2/sizes: HTTP 500 Server Error. Try again later."
    do_api.failure = (502, "<html>\n<body>bad gateway</body>\n</html>")
    assert refused(do(key), project) == "DigitalOcean API refused GET /v2/sizes: HTTP 502 Bad Gateway"
    do_api.failure = (200, "[]")
    assert "GET /v2/sizes answered with something that is not a JSON object" in refused(do(key), project)


def test_an_unreachable_api_is_one_line(project, key, monkeypatch):
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("DIGITALOCEAN_API_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("DIGITALOCEAN_TOKEN", TOKEN)
    message = refused(do(key), project)
    assert message.startswith(f"cannot reach the DigitalOcean API at http://127.0.0.1:{port}: ")
    assert "refused" in message.lower()
