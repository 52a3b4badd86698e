"""`bsrctl fleet render`: a ConfigMap with the spec and one Job per node of a nodes file.

Each Job runs the image's ``bsrctl COMMAND /spec/spec.yaml --stack KIND --out
/results/RUN_ID/NODE --json``, pinned to its node, with the GPUs the spec's TP needs and the
smallest privileges its stack needs (``privileges``). The manifests are plain dicts in the
Kubernetes API's JSON shape, written as YAML; tests load them into the ``kubernetes``
package's models."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bsrctl.errors import BadInput
from bsrctl.fleet.nodes import DNS_LABEL, Node, NodesFile
from bsrctl.specs import StackSpec, load_stack_section

STACKS = ("serving", "storage", "attach")
SPEC_DIR, RESULTS_DIR, WORKDIR = "/spec", "/results", "/opt/bsrctl"  # the image's layout
LABEL = "bsrctl.io"


@dataclass(frozen=True)
class Privileges:
    security_context: dict[str, Any]
    why: str  # the annotation bsrctl.io/privileges: what the stack does that needs them


def privileges(stack: StackSpec) -> Privileges:
    """The least a stack kind needs. Attach and storage only talk HTTP/ZMQ or read files: no
    capability at all. A launched stack with Mooncake puts its parts in a private network
    namespace (bsrctl/stack/launch/netns.py): ``unshare -n`` and ``nsenter -n``/setns(2) need
    CAP_SYS_ADMIN, ``ip link set lo up`` in it (and two-hosts' veth pair,
    bsrctl/stack/launch/twohost.py) CAP_NET_ADMIN; nothing mounts, so not privileged. RDMA pins
    memory (CAP_IPC_LOCK). A launched stack without Mooncake starts processes, no namespace."""
    base: dict[str, Any] = {"allowPrivilegeEscalation": False, "privileged": False}
    if stack.kind in ("attach", "storage"):
        return Privileges(
            {**base, "capabilities": {"drop": ["ALL"]}}, f"{stack.kind}: no capability"
        )
    if not stack.mooncake.enabled:
        return Privileges(base, "serving without Mooncake: no network namespace")
    add = ["NET_ADMIN", "SYS_ADMIN"]
    why = (
        f"serving with Mooncake ({stack.mooncake.topology}): a private network namespace "
        "(unshare -n, setns: SYS_ADMIN; lo up, veth: NET_ADMIN)"
    )
    if stack.mooncake.protocol == "rdma":
        add.append("IPC_LOCK")
        why += "; RDMA pins memory (IPC_LOCK)"
    return Privileges({**base, "capabilities": {"add": add}}, why)


def gpus(stack: StackSpec) -> int:
    """nvidia.com/gpu per Job: TP where bsrctl launches vLLM on CUDA, else none (storage runs
    in-process on the CPU, attach drives a deployment that holds its own GPUs)."""
    launched_cuda = stack.kind == "serving" and stack.device == "cuda"
    return stack.vllm.tensor_parallel_size if launched_cuda else 0


def new_run_id() -> str:
    return f"fl-{secrets.token_hex(4)}"


def _labels(nodes: NodesFile, run_id: str, node: str | None = None) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/name": "bsrctl",
        "app.kubernetes.io/component": "qualification",
        f"{LABEL}/fleet": nodes.fleet,
        f"{LABEL}/run-id": run_id,
    }
    return {**labels, f"{LABEL}/node": node} if node else labels


def config_map(nodes: NodesFile, run_id: str, spec_text: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"bsrctl-spec-{run_id}",
            "namespace": nodes.namespace,
            "labels": _labels(nodes, run_id),
        },
        "data": {"spec.yaml": spec_text},
    }


def _volumes(nodes: NodesFile, run_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    results: dict[str, Any] = (
        {"persistentVolumeClaim": {"claimName": nodes.results.pvc}}
        if nodes.results.pvc
        else {"hostPath": {"path": str(nodes.results.host_path), "type": "DirectoryOrCreate"}}
    )
    volumes = [
        {"name": "spec", "configMap": {"name": f"bsrctl-spec-{run_id}"}},
        {"name": "results", **results},
        # LMCache's L1 and vLLM's workers live in /dev/shm: the runtime's 64 MiB is too small
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    mounts = [
        {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
        {"name": "results", "mountPath": RESULTS_DIR},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    if nodes.models_host_path is not None:
        path = str(nodes.models_host_path)
        volumes.append({"name": "models", "hostPath": {"path": path, "type": "Directory"}})
        mounts.append({"name": "models", "mountPath": path, "readOnly": True})
    return volumes, mounts


def job(nodes: NodesFile, node: Node, run_id: str, stack: StackSpec) -> dict[str, Any]:
    name = f"bsrctl-{run_id}-{node.name}"
    if len(name) > 63 or not re.match(DNS_LABEL, name):
        raise BadInput(f"Job name {name!r}: a DNS label of <= 63 characters; shorten --run-id")
    labels = _labels(nodes, run_id, node.name)
    priv = privileges(stack)
    volumes, mounts = _volumes(nodes, run_id)
    container: dict[str, Any] = {
        "name": "bsrctl",
        "image": nodes.image,
        "imagePullPolicy": nodes.image_pull_policy,
        "workingDir": WORKDIR,  # the image's copy of ladders/: relative spec paths resolve
        "args": [
            nodes.command,
            f"{SPEC_DIR}/spec.yaml",
            "--stack",
            stack.kind,
            "--out",
            f"{RESULTS_DIR}/{run_id}/{node.name}",
            "--json",
        ],
        "securityContext": priv.security_context,
        "volumeMounts": mounts,
    }
    n_gpus = gpus(stack)
    if n_gpus:  # an extended resource: requests default to the limit
        container["resources"] = {"limits": {"nvidia.com/gpu": str(n_gpus)}}  # a Quantity
    pod: dict[str, Any] = {"restartPolicy": "Never", "containers": [container], "volumes": volumes}
    if node.node_name is not None:
        pod["nodeName"] = node.node_name
    else:
        pod["nodeSelector"] = dict(node.node_selector or {})
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": nodes.namespace,
            "labels": dict(labels),  # copies: YAML writes no anchors
            "annotations": {f"{LABEL}/privileges": priv.why},
        },
        "spec": {
            "backoffLimit": 0,  # a failed qualification is evidence, never retried
            "activeDeadlineSeconds": nodes.active_deadline_s,
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
        },
    }


def stack_of(spec: Path, stack: str | None) -> StackSpec:
    section, _ = load_stack_section(spec)
    kind = stack or section.kind
    if kind not in STACKS:
        raise BadInput(f"{'--stack' if stack else 'stack.kind'}: {kind!r}: one of {STACKS}")
    return section.model_copy(update={"kind": kind})


def render(
    spec: Path, nodes: NodesFile, out: Path, run_id: str | None = None, stack: str | None = None
) -> list[Path]:
    """Write configmap.yaml and job-NODE.yaml into ``out``; the paths written."""
    section = stack_of(spec, stack)
    run_id = run_id or new_run_id()
    docs = [("configmap.yaml", config_map(nodes, run_id, Path(spec).read_text()))]
    docs += [(f"job-{n.name}.yaml", job(nodes, n, run_id, section)) for n in nodes.nodes]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, doc in docs:
        (out / name).write_text(yaml.safe_dump(doc, sort_keys=False))
        written.append(out / name)
    return written


def matrix(nodes: NodesFile) -> dict[str, Any]:
    """The nightly's strategy.matrix: one entry per node (its runner labels, spec, command)."""
    include = []
    for n in nodes.nodes:
        spec = n.spec or nodes.spec
        if spec is None:
            raise BadInput(f"node {n.name}: no spec; set `spec:` in the nodes file or the node")
        include.append(
            {"node": n.name, "runs_on": n.runs_on, "spec": str(spec), "command": nodes.command}
        )
    return {"include": include}
