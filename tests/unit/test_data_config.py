"""`[data]` in fatpipe.toml: project-wide or per cluster, and one line for each mistake."""

from __future__ import annotations

import pytest

from fatpipe.infra.dataspec import cluster_data
from fatpipe.infra.errors import ConfigError
from fatpipe.infra.project import load_project

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


def test_no_data_declared(project_dir):
    assert cluster_data(load(project_dir, SIM).spec, "lab") is None


@pytest.mark.parametrize(("table", "expected"), [
    ('source = "/srv/corpus"', "data: source '/srv/corpus' lies outside the project folder: give path"),
    ('source = "~/corpus"', "lies outside the project folder"),
    ('source = "../corpus"', "lies outside the project folder"),
    ('source = "s3://bucket/corpus"', "only a local file or folder is supported so far"),
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
