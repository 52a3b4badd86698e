"""NODES.yaml: the nodes of a fleet, where its results go and which image runs there
(``ladders/*nodes.yaml``). Unknown fields are errors, as in every spec."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, model_validator

from bsrctl.errors import BadInput
from bsrctl.spec_io import Strict, describe_error, read_yaml

# A Kubernetes object name and label value: DNS-1123 label, at most 63 characters.
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
COMMANDS = ("sweep", "law", "ladder", "failmatrix")


class Results(Strict):
    """Where each Job writes its run folder: a PersistentVolumeClaim or a host path."""

    pvc: str | None = Field(None, pattern=DNS_LABEL, description="claim name (ReadWriteMany)")
    host_path: Path | None = Field(None, description="a folder on each node")

    @model_validator(mode="after")
    def _one(self) -> Results:
        if (self.pvc is None) == (self.host_path is None):
            raise ValueError("results: name exactly one of pvc, host_path")
        return self


class Node(Strict):
    name: str = Field(pattern=DNS_LABEL, max_length=30, description="the node's name in reports")
    node_name: str | None = Field(None, description="pin the Job to this Kubernetes node")
    node_selector: dict[str, str] | None = Field(None, description="or to nodes with labels")
    runner: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None, description="the nightly's runs-on labels; None: [self-hosted, linux, NAME]"
    )
    spec: Path | None = Field(None, description="this node's spec (default: the file's)")

    @model_validator(mode="after")
    def _pinned(self) -> Node:
        if (self.node_name is None) == (self.node_selector is None):
            raise ValueError(f"node {self.name}: name exactly one of node_name, node_selector")
        return self

    @property
    def runs_on(self) -> list[str]:
        return self.runner or ["self-hosted", "linux", self.name]


class NodesFile(Strict):
    fleet: str = Field(pattern=DNS_LABEL, max_length=20, description="labels bsrctl.io/fleet")
    namespace: str = Field("default", pattern=DNS_LABEL)
    image: str = Field(min_length=1, description="the Dockerfile's image, as pushed")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    spec: Path | None = Field(None, description="the spec the nightly runs on every node")
    command: Literal["sweep", "law", "ladder", "failmatrix"] = "sweep"
    results: Results
    models_host_path: Path | None = Field(
        None, description="a node folder of model weights, mounted read-only at the same path"
    )
    active_deadline_s: int = Field(21600, gt=0, description="a Job running longer is failed")
    nodes: list[Node] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> NodesFile:
        names = [n.name for n in self.nodes]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"nodes: names {twice} appear more than once")
        return self


def load_nodes(path: Path) -> NodesFile:
    try:
        return NodesFile.model_validate(read_yaml(path))
    except ValidationError as exc:
        raise BadInput(f"{path}: {describe_error(NodesFile, exc)}") from None
