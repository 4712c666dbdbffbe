"""`trainer.staging.fetch`, a node fetching a remote [data] source itself: a moto S3 server and a local HTTPS
server with a private CA, both on loopback; resumes, skips, refetches what changed."""

from __future__ import annotations

import json
import os
import socket

import pytest
from dataservers import https_server, s3_server

from fatpipe.ops.reach.cluster import Cluster
from fatpipe.trainer.staging import fetch as fetch_mod
from fatpipe.trainer.staging.fetch import fetch
from fatpipe.trainer.staging.fetch_types import FetchError
from fatpipe.trainer.staging.manifest import first_difference

CHUNK = 1 << 16
OBJECTS = {"sets/v1/train.bin": os.urandom(3 * CHUNK + 5), "sets/v1/meta/vocab.txt": b"abc",
           "sets/v1/empty.bin": b"", "sets/v10/other.bin": b"not under the prefix"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def bucket():
    port = free_port()
    server = s3_server("127.0.0.1", port, "corpus", OBJECTS)
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def node_env(monkeypatch, tmp_path):
    """A node's own environment: credentials of its own, nothing from elsewhere on this machine."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setattr(fetch_mod, "RETRY_PAUSE_S", 0.01)
    return monkeypatch


def s3_spec(endpoint: str, **extra) -> dict:
    return {"source": "s3://corpus/sets/v1", "path": "data/set", "chunk_size": CHUNK, "endpoint_url": endpoint,
            "region": "us-east-1", **extra}


def test_an_s3_prefix_lands_with_its_manifest_and_a_second_fetch_moves_nothing(bucket, node_env, tmp_path):
    node_env.setenv("AWS_ACCESS_KEY_ID", "node-own")
    node_env.setenv("AWS_SECRET_ACCESS_KEY", "node-own")
    manifest = fetch(s3_spec(bucket), tmp_path)
    names = {f["name"]: f for f in manifest["files"]}
    assert sorted(names) == ["empty.bin", "meta/vocab.txt", "train.bin"]  # v10/ is not under v1/
    assert (tmp_path / "data/set/train.bin").read_bytes() == OBJECTS["sets/v1/train.bin"]
    assert names["train.bin"]["etag"].startswith('"') and len(names["train.bin"]["chunks"]) == 4
    assert manifest["fetched_bytes"] == manifest["total_bytes"] == 3 * CHUNK + 8
    assert first_difference(manifest, tmp_path) is None
    assert json.loads((tmp_path / "data/set/.fatpipe-manifest.json").read_text())["fingerprint"] == \
        manifest["fingerprint"]

    again = fetch(s3_spec(bucket), tmp_path)
    assert again["fetched_bytes"] == 0 and again["fingerprint"] == manifest["fingerprint"]
    with open(tmp_path / "data/set/train.bin", "r+b") as f:  # corrupted: fetched again, alone
        f.seek(CHUNK + 1)
        f.write(b"\0\0")
    fixed = fetch(s3_spec(bucket), tmp_path)
    assert fixed["fetched_bytes"] == len(OBJECTS["sets/v1/train.bin"])
    assert first_difference(fixed, tmp_path) is None


def test_one_s3_object_and_a_partial_copy_resumed_by_a_ranged_get(bucket, node_env, tmp_path):
    spec = s3_spec(bucket, source="s3://corpus/sets/v1/train.bin", path="data/train.bin", anonymous=True)
    data = OBJECTS["sets/v1/train.bin"]
    first = fetch(spec, tmp_path)  # no credentials at all: anonymous = true signs nothing
    assert first["kind"] == "file" and (tmp_path / "data/train.bin").read_bytes() == data
    etag = first["files"][0]["etag"]
    (tmp_path / "data/train.bin").unlink()
    (tmp_path / "data/train.bin.fatpipe-partial").write_bytes(data[:CHUNK])
    (tmp_path / "data/train.bin.fatpipe-partial.etag").write_text(etag)
    resumed = fetch(spec, tmp_path)
    assert resumed["fetched_bytes"] == len(data) - CHUNK
    assert (tmp_path / "data/train.bin").read_bytes() == data
    assert not list((tmp_path / "data").glob("*.fatpipe-partial*"))


def test_a_node_without_credentials_says_so(bucket, node_env, tmp_path):
    with pytest.raises(FetchError, match="no AWS credentials on this node .*set anonymous = true"):
        fetch(s3_spec(bucket), tmp_path)
    node_env.setenv("AWS_ACCESS_KEY_ID", "node-own")
    node_env.setenv("AWS_SECRET_ACCESS_KEY", "node-own")
    with pytest.raises(FetchError, match="s3://corpus/nothing-here: no objects there"):
        fetch(s3_spec(bucket, source="s3://corpus/nothing-here"), tmp_path)
    with pytest.raises(FetchError, match="NoSuchBucket"):
        fetch(s3_spec(bucket, source="s3://no-such-bucket/x"), tmp_path)


@pytest.fixture
def web(tmp_path):
    data = os.urandom(5 * CHUNK + 11)
    server, ca = https_server(tmp_path, "127.0.0.1", free_port(), {"/d/train.bin": data}, cuts=1)
    yield server, ca, data
    server.stop()


def https_spec(server, ca, root) -> dict:
    (root / "ca.pem").write_bytes(ca.read_bytes())
    return {"source": f"https://127.0.0.1:{server.server_address[1]}/d/train.bin", "path": "data/train.bin",
            "chunk_size": CHUNK, "ca_bundle": "ca.pem"}


def test_an_https_fetch_cut_half_way_resumes_with_a_range_request(web, node_env, tmp_path):
    server, ca, data = web
    root = tmp_path / "node"
    root.mkdir()
    manifest = fetch(https_spec(server, ca, root), root)
    assert (root / "data/train.bin").read_bytes() == data
    gets = [r for r in server.requests if r[0] == "GET"]
    assert gets == [("GET", "/d/train.bin", None), ("GET", "/d/train.bin", f"bytes={len(data) // 2}-")], gets
    assert manifest["fetched_bytes"] == len(data) and first_difference(manifest, root) is None


def test_https_without_the_ca_is_refused_and_a_changed_file_is_read_whole(web, node_env, tmp_path):
    server, ca, data = web
    root = tmp_path / "node"
    root.mkdir()
    spec = https_spec(server, ca, root)
    with pytest.raises(FetchError, match="TLS failed .*set ca_bundle"):
        fetch({**spec, "ca_bundle": None}, root)
    (root / "data").mkdir()
    (root / "data/train.bin.fatpipe-partial").write_bytes(b"x" * CHUNK)  # from a file since replaced
    (root / "data/train.bin.fatpipe-partial.etag").write_text('"an older version"')
    server.cuts = 0
    fetch(spec, root)
    assert (root / "data/train.bin").read_bytes() == data
    assert [r[2] for r in server.requests if r[0] == "GET"] == [None]


def test_the_entry_point_prints_one_error_line(node_env, tmp_path, capsys):
    spec = tmp_path / "fetch.json"
    spec.write_text(json.dumps({"source": "https://127.0.0.1:1/x.bin", "path": "x.bin", "chunk_size": CHUNK}))
    assert fetch_mod.main([str(spec), str(tmp_path)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("FETCH_ERROR URLError: <urlopen error [Errno 111]"), out


def node_manifest(files: dict[str, str], fetched: int = 0) -> dict:
    from fatpipe.trainer.staging.manifest import manifest_of

    entries = [{"name": n, "size": 3, "sha256": sha, "chunks": [sha], "etag": '"e"'} for n, sha in files.items()]
    return {**manifest_of("folder", "data/set", CHUNK, entries), "source": "s3://b/p", "fetched_bytes": fetched}


def test_the_nodes_must_agree_and_the_odd_one_is_named():
    from fatpipe.ops.data.fetch import agree

    good = node_manifest({"a.bin": "1" * 64, "b.bin": "2" * 64}, fetched=6)
    odd = node_manifest({"a.bin": "1" * 64, "b.bin": "9" * 64})
    short = node_manifest({"a.bin": "1" * 64})
    reference, problems = agree(["n0", "n1", "n2"], [odd, good, good])
    assert reference["fingerprint"] == good["fingerprint"] and "fetched_bytes" not in reference
    assert problems == ["node n0: data/set/b.bin: its sha256 differs from 2 other node(s)"]
    assert agree(["n0", "n1"], [good, short])[1] == ["node n1: data/set/b.bin: missing"]  # a tie: node 0's
    assert agree(["n0", "n1"], [good, good])[1] == []


def test_a_node_without_boto3_is_told_how_to_get_it(node_env, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 raises ImportError
    with pytest.raises(FetchError, match=r'boto3 is not installed for .*: add "boto3" to \[node\] packages'):
        fetch(s3_spec("http://127.0.0.1:1"), tmp_path)


def test_nodes_sharing_this_machines_files_fetch_once_and_check_clean(bucket, node_env, project_dir):
    import sys

    from fatpipe.infra.outputs import parse_outputs
    from fatpipe.infra.project import load_project
    from fatpipe.ops.data.check import check_data, read_local_manifest
    from fatpipe.ops.data.stage import push_data

    node_env.setenv("AWS_ACCESS_KEY_ID", "node-own")
    node_env.setenv("AWS_SECRET_ACCESS_KEY", "node-own")
    (project_dir / "fatpipe.toml").write_text(
        '[clusters.demo]\nprovider = "sim"\nnodes = 2\n[data]\nsource = "s3://corpus/sets/v1/"\npath = "data/set"\n'
        f'chunk_mib = 1\nendpoint_url = "{bucket}"\ninsecure_http = true\n')
    project = load_project()
    outputs = parse_outputs({"name": "demo", "provider": "sim", "tier_gbps": 1, "private_cidr": "10.42.0.0/24",
                             "nodes": [{"name": f"demo-{i}", "private_ip": f"127.42.0.{10 + i}",
                                        "transport": "local"} for i in range(2)]})
    seen = []
    cluster = Cluster.resolve(project, "demo", outputs)
    result = push_data(cluster, remote_python=sys.executable,
                       node_progress=lambda *args: seen.append(args))
    assert result.fetched == {"demo-0": result.manifest["total_bytes"], "demo-1": 0}
    assert seen[-1] == ("demo-0", result.manifest["total_bytes"], result.manifest["total_bytes"],
                        result.manifest["total_bytes"])
    assert read_local_manifest(cluster)["fingerprint"] == result.manifest["fingerprint"]
    assert (project_dir / "data/set/train.bin").read_bytes() == OBJECTS["sets/v1/train.bin"]
    assert [v.problem for v in check_data(cluster, result.manifest)] == [None, None]
    spec = json.loads((project_dir / ".fatpipe/demo/data/fetch.json").read_text())
    assert spec["source"] == "s3://corpus/sets/v1/" and not any("node-own" in str(v) for v in spec.values())


def test_a_fetch_into_a_folder_of_the_users_removes_only_what_it_staged(bucket, node_env, tmp_path):
    """A folder that held the user's files before the first fetch (or any folder on nodes sharing
    this machine's files): they stay; a key the source dropped goes; a key whose place holds a
    file of the user's stops the fetch with nothing written."""
    import boto3

    from fatpipe.trainer.staging.record import InTheWay

    s3 = boto3.client("s3", endpoint_url=bucket, region_name="us-east-1", aws_access_key_id="t",
                      aws_secret_access_key="t")
    s3.create_bucket(Bucket="users-folder")
    for key in ("set/a.bin", "set/sub/b.bin"):
        s3.put_object(Bucket="users-folder", Key=key, Body=key.encode() * 100, ACL="public-read")
    data = tmp_path / "data" / "set"
    (data / "sub").mkdir(parents=True)
    (data / "notes.txt").write_text("the user's")
    spec = s3_spec(bucket, source="s3://users-folder/set", anonymous=True)
    for own in (False, True):  # the user's folder, here or in a node's own project folder
        assert fetch(spec, tmp_path, own=own)["removed"] == []
        assert (data / "sub" / "b.bin").read_bytes() == b"set/sub/b.bin" * 100

    s3.delete_object(Bucket="users-folder", Key="set/sub/b.bin")
    assert fetch(spec, tmp_path, own=True)["removed"] == ["sub/b.bin"]
    assert sorted(p.relative_to(data).as_posix() for p in data.rglob("*") if ".fatpipe-" not in p.name) == \
        ["a.bin", "notes.txt", "sub"]  # the user's folder `sub` stays, emptied

    s3.put_object(Bucket="users-folder", Key="set/notes.txt", Body=b"the source's notes", ACL="public-read")
    with pytest.raises(InTheWay, match="data/set holds 1 file.* fatpipe did not stage where the data goes: notes.txt"):
        fetch(spec, tmp_path)
    assert (data / "notes.txt").read_text() == "the user's" and not (data / "notes.txt.fatpipe-partial").exists()
