"""Literal text handed to a stack: every string fatpipe writes into Terraform JSON passes here.

In Terraform JSON every string is a template: `${...}` interpolates and `%{...}` is a
directive, so a shell script's `${found% *}` stops `terraform validate` ("Invalid
expression"). Doubled (`$${`, `%%{`), they stand for themselves and reach the node unchanged.
References fatpipe means (`${aws_instance.nodes[...]}`, cdktf tokens) are built separately and
never pass through here.
"""

from __future__ import annotations


def literal(text: str) -> str:
    """`text` escaped so that Terraform reads it as exactly these characters."""
    return text.replace("${", "$${").replace("%{", "%%{")


def literal_map(values: dict) -> dict:
    """A map of literals (tags, a terraform_data input): keys and string values escaped."""
    return {literal(key): literal(value) if isinstance(value, str) else value for key, value in values.items()}
