"""`[data]` in fatpipe.toml: project-wide or per cluster, and one line for each mistake."""

from __future__ import annotations

import pytest

from fatpipe.infra.dataspec import cluster_data
from fatpipe.infra.errors import ConfigError
from fatpipe.infra.project import load_project
from fatpipe.ops.reach.cluster import Cluster

SIM = '[clusters.lab]\nprovider = "sim"\nnodes = 2\n'
OTHER = '[clusters.far]\nprovider = "sim"\nnodes = 2\nprivate_cidr = "10.43.0.0/24"\n'


def load(project_dir, text: str):
    (project_dir / "fatpipe.toml").write_text(text)
    return load_project()


def test_project_wide_data_defaults_to_the_same_relative_path(project_dir):
    project = load(project_dir, SIM + '[data]\nsource = "./data//shakespeare/"\n')
    data = cluster_data(project.spec, "lab")
    assert (data.path, data.chunk_size) == ("data/shakespeare", 64 << 20)
    assert data.source_path(project.root) == (project_dir / "data" / "shakespeare").resolve()


def test_a_clusters_own_data_wins(project_dir):
    project = load(project_dir, SIM + '[clusters.lab.data]\nsource = "/srv/corpus"\npath = "data/corpus"\n'
                   + OTHER + '[data]\nsource = "data/small"\n')
    assert cluster_data(project.spec, "lab").path == "data/corpus"
    assert cluster_data(project.spec, "far").path == "data/small"


def test_remote_sources_and_their_keys(project_dir):
    project = load(project_dir, SIM + '[data]\nsource = "s3://my-bucket/corpus/v1"\npath = "data/corpus"\n'
                   'endpoint_url = "http://10.0.0.1:9000"\nregion = "eu-west-1"\ninsecure_http = true\n'
                   'anonymous = true\n')
    data = cluster_data(project.spec, "lab")
    assert data.remote and (data.path, data.region, data.anonymous) == ("data/corpus", "eu-west-1", True)
    web = load(project_dir, SIM + '[data]\nsource = "https://example.com/d/train.bin"\npath = "data/t.bin"\n'
               'ca_bundle = "certs/ca.pem"\n')
    data = cluster_data(web.spec, "lab")
    assert data.remote and data.ca_bundle_path(web.root) == (project_dir / "certs" / "ca.pem").resolve()
    plain = load(project_dir, SIM + '[data]\nsource = "http://10.0.0.1/t.bin"\npath = "t.bin"\n'
                 'insecure_http = true\n')
    assert cluster_data(plain.spec, "lab").remote
    assert not cluster_data(load(project_dir, SIM + '[data]\nsource = "data/x"\n').spec, "lab").remote


def test_no_data_declared(project_dir):
    assert cluster_data(load(project_dir, SIM).spec, "lab") is None


@pytest.mark.parametrize(("table", "expected"), [
    ('source = "/srv/corpus"', "data: source '/srv/corpus' lies outside the project folder: give path"),
    ('source = "~/corpus"', "lies outside the project folder"),
    ('source = "../corpus"', "lies outside the project folder"),
    ('source = "s3://bucket/corpus"', "source 's3://bucket/corpus' is remote: give path"),
    ('source = "s3://Bad_Bucket/x"\npath = "d"', "'Bad_Bucket' is not an S3 bucket name"),
    ('source = "s3://key:secret@bucket/x"\npath = "d"', "holds credentials; a node uses its own"),
    ('source = "https://u:p@example.com/a.bin"\npath = "d"', "holds credentials"),
    ('source = "http://example.com/a.bin"\npath = "d"', "is plain http: anyone on the path can alter"),
    ('source = "https://example.com/"\npath = "d"', "an http(s) source names one file"),
    ('source = "ftp://example.com/a.bin"\npath = "d"', "only s3://, https://"),
    ('source = "https://example.com/a b"\npath = "d"', "holds spaces or control characters"),
    ('source = "https://example.com/a.bin"\npath = "d"\nanonymous = true', "apply to s3:// sources only"),
    ('source = "s3://bkt/x"\npath = "d"\nendpoint_url = "http://10.0.0.1:9000"', "endpoint_url "
     "'http://10.0.0.1:9000' is plain http"),
    ('source = "s3://bkt/x"\npath = "d"\nendpoint_url = "localhost:9000"', "give a URL such as"),
    ('source = "s3://bkt/x"\npath = "d"\nregion = "us east"', "region 'us east' is not a region name"),
    ('source = "data/x"\nregion = "us-east-1"', "region applies to an s3:// or https:// source only"),
    ('source = "s3://bkt/x"\npath = "d"\ninsecure_http = "yes"', "data.insecure_http: Input should be"),
    ('source = "data/x"\npath = "/abs/x"', "path '/abs/x' must be relative"),
    ('source = "data/x"\npath = "a/../../x"', "leaves the project folder"),
    ('source = "data/x"\npath = "."', "names no file"),
    ('source = "data/x"\npath = ".fatpipe/x"', "lies in .fatpipe/"),
    ('source = "data/x"\npath = "data/*"', "holds '*'"),
    ('source = ""', "data.source: String should have at least 1 character"),
    ('source = "data/x"\nchunk_mib = 0', "data.chunk_mib: Input should be greater than or equal to 1"),
    ('source = "data/x"\nchunk = 1', "data.chunk: unknown key; did you mean chunk_mib?"),
])
def test_bad_data_is_one_line_naming_the_key(project_dir, table, expected):
    with pytest.raises(ConfigError) as caught:
        load(project_dir, SIM + "[data]\n" + table + "\n")
    message = str(caught.value)
    assert expected in message and len(message.splitlines()) == 1, message


def test_a_misspelt_key_in_a_clusters_data_names_the_allowed_ones(project_dir):
    with pytest.raises(ConfigError, match=r"clusters\.lab\.data\.paht: unknown key; did you mean path\?"):
        load(project_dir, SIM + '[clusters.lab.data]\nsource = "d"\npaht = "x"\n')


def test_a_misspelt_top_level_table_suggests_data(project_dir):
    with pytest.raises(ConfigError, match="datta: unknown key; did you mean data"):
        load(project_dir, SIM + '[datta]\nsource = "d"\n')


def test_a_run_exports_the_data_path_and_the_project_sync_leaves_it_alone(project_dir):
    import subprocess

    from fatpipe.infra.outputs import parse_outputs
    from fatpipe.infra.runs import new_run
    from fatpipe.ops.data.check import data_excludes
    from fatpipe.ops.rdzv.rendezvous import new_rendezvous

    project = load(project_dir, '[clusters.demo]\nprovider = "sim"\nnodes = 2\n'
                   '[data]\nsource = "/srv/my corpus"\npath = "data/my corpus"\n')
    outputs = parse_outputs({"name": "demo", "provider": "sim", "tier_gbps": 1, "private_cidr": "10.42.0.0/24",
                             "nodes": [{"name": f"demo-{i}", "private_ip": f"127.42.0.{10 + i}",
                                        "transport": "local"} for i in range(2)]})
    run_id, run_dir = new_run(project, "demo")
    rdzv = new_rendezvous(Cluster(project, outputs=outputs), run_id, run_dir)
    assert rdzv.data_path == "data/my corpus"
    script = (run_dir / "node-1.sh").read_text()
    line = next(line for line in script.splitlines() if "FATPIPE_DATA" in line)
    shown = subprocess.run(["bash", "-c", f'cd /tmp && {line} && echo "$FATPIPE_DATA"'], capture_output=True,
                           text=True).stdout
    assert shown == "/tmp/data/my corpus\n"  # absolute, the space kept, nothing run
    assert data_excludes(Cluster.resolve(project, "demo").data) == ("/data/my corpus", "/data/my corpus.fatpipe-*", "/.fatpipe/data")
