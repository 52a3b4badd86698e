"""`bsrctl fleet render`: every manifest loads into the kubernetes package's models (the
ApiClient's own deserialiser, as a response body would), one Job per node, exact
expectations for the shipped GPU and CPU nodes files, and the least privileges per stack."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from bsrctl.cli import app
from bsrctl.fleet.manifests import matrix, privileges
from bsrctl.fleet.nodes import load_nodes
from bsrctl.specs import StackSpec

kubernetes = pytest.importorskip("kubernetes")  # the dev extra
ROOT = Path(__file__).resolve().parents[3]
LABELS = {"app.kubernetes.io/name": "bsrctl", "app.kubernetes.io/component": "qualification"}


def model(doc: dict, kind: str):
    """The manifest as the API client reads a response body: unknown fields are dropped, so
    a round trip back to JSON equal to the input proves every field is a known one."""
    client = kubernetes.client.ApiClient()
    obj = client._ApiClient__deserialize(doc, kind)
    assert client.sanitize_for_serialization(obj) == doc, f"{kind}: a field the model lacks"
    return obj


def render(tmp_path: Path, spec: str, nodes: str, *extra: str) -> dict[str, dict]:
    out = tmp_path / "manifests"
    res = CliRunner().invoke(
        app, ["fleet", "render", str(ROOT / spec), "--nodes", str(ROOT / nodes),
              "--out", str(out), "--run-id", "fl-0a1b2c3d", *extra],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    written = {Path(line).name for line in res.output.split()}
    assert written == {p.name for p in out.iterdir()}
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(out.iterdir())}


def test_gpu_nodes_one_pinned_job_per_node_with_tp_gpus(tmp_path: Path) -> None:
    docs = render(tmp_path, "ladders/gpu-1x.yaml", "ladders/gpu-nodes.yaml")
    assert sorted(docs) == ["configmap.yaml", "job-h200-a.yaml", "job-h200-b.yaml"]
    cm = model(docs["configmap.yaml"], "V1ConfigMap")
    assert cm.metadata.name == "bsrctl-spec-fl-0a1b2c3d" and cm.metadata.namespace == "bsrctl"
    assert cm.data == {"spec.yaml": (ROOT / "ladders/gpu-1x.yaml").read_text()}
    jobs = {n: model(docs[f"job-{n}.yaml"], "V1Job") for n in ("h200-a", "h200-b")}
    for node, job in jobs.items():
        want = {**LABELS, "bsrctl.io/fleet": "gpu-nightly", "bsrctl.io/run-id": "fl-0a1b2c3d",
                "bsrctl.io/node": node}  # fmt: skip
        assert job.metadata.name == f"bsrctl-fl-0a1b2c3d-{node}"
        assert job.metadata.labels == want and job.spec.template.metadata.labels == want
        assert job.spec.backoff_limit == 0 and job.spec.active_deadline_seconds == 21600
        pod = job.spec.template.spec
        assert pod.restart_policy == "Never"
        (c,) = pod.containers
        assert (c.image, c.image_pull_policy) == ("ghcr.io/example/bsrctl:0.1.0", "IfNotPresent")
        assert c.args == ["sweep", "/spec/spec.yaml", "--stack", "serving",
                          "--out", f"/results/fl-0a1b2c3d/{node}", "--json"]  # fmt: skip
        assert c.resources.limits == {"nvidia.com/gpu": "1"}  # gpu-1x: TP 1
        assert c.security_context.to_dict()["capabilities"] is None  # no Mooncake: no netns
        assert c.security_context.privileged is False
        assert [(m.name, m.mount_path, m.read_only) for m in c.volume_mounts] == [
            ("spec", "/spec", True), ("results", "/results", None),
            ("dshm", "/dev/shm", None), ("models", "/models", True)]  # fmt: skip
        vols = {v.name: v for v in pod.volumes}
        assert vols["results"].persistent_volume_claim.claim_name == "bsrctl-results"
        assert vols["spec"].config_map.name == "bsrctl-spec-fl-0a1b2c3d"
        assert vols["dshm"].empty_dir.medium == "Memory"
        assert vols["models"].host_path.path == "/models"
    assert jobs["h200-a"].spec.template.spec.node_name == "gpu-node-a"
    assert jobs["h200-b"].spec.template.spec.node_selector == {
        "kubernetes.io/hostname": "gpu-node-b"
    }


def test_tp2_with_mooncake_asks_two_gpus_and_the_namespace_capabilities(tmp_path) -> None:
    docs = render(tmp_path, "ladders/dsv4-flash-tp2.yaml", "ladders/gpu-nodes.yaml")
    (c,) = model(docs["job-h200-a.yaml"], "V1Job").spec.template.spec.containers
    assert c.resources.limits == {"nvidia.com/gpu": "2"}
    assert c.security_context.capabilities.add == ["NET_ADMIN", "SYS_ADMIN", "IPC_LOCK"]  # rdma
    assert c.security_context.privileged is False
    why = docs["job-h200-a.yaml"]["metadata"]["annotations"]["bsrctl.io/privileges"]
    assert "network namespace" in why and "IPC_LOCK" in why


def test_cpu_nodes_storage_stack_no_gpu_no_capability_host_path(tmp_path: Path) -> None:
    docs = render(tmp_path, "ladders/cpu-e1.yaml", "ladders/cpu-nodes.yaml", "--stack", "storage")
    assert sorted(docs) == ["configmap.yaml", *(f"job-cpu-{x}.yaml" for x in "abc")]
    model(docs["configmap.yaml"], "V1ConfigMap")
    for x in "abc":
        job = model(docs[f"job-cpu-{x}.yaml"], "V1Job")
        assert job.metadata.namespace == "default"
        pod = job.spec.template.spec
        (c,) = pod.containers
        assert c.image_pull_policy == "Always"
        assert c.args[2:4] == ["--stack", "storage"]
        assert c.resources is None  # no nvidia.com/gpu
        assert c.security_context.capabilities.drop == ["ALL"]
        assert c.security_context.allow_privilege_escalation is False
        results = {v.name: v for v in pod.volumes}["results"]
        assert results.host_path.to_dict() == {
            "path": "/var/lib/bsrctl/results", "type": "DirectoryOrCreate"}  # fmt: skip
        assert [m.name for m in c.volume_mounts] == ["spec", "results", "dshm"]  # no models
    pods = {x: model(docs[f"job-cpu-{x}.yaml"], "V1Job").spec.template.spec for x in "abc"}
    assert (pods["a"].node_name, pods["b"].node_name) == ("cpu-node-a", "cpu-node-b")
    assert pods["c"].node_name is None and pods["c"].node_selector == {"bsrctl.io/pool": "storage"}


@pytest.mark.parametrize(
    ("stack", "caps"),
    [
        ({"kind": "attach", "attach": {"vllm_url": "http://h:1", "lmcache_url": "tcp://h:2",
                                       "lmcache_http_port": 3}}, {"drop": ["ALL"]}),
        ({"kind": "serving"}, None),
        ({"kind": "serving", "mooncake": {"enabled": True}}, {"add": ["NET_ADMIN", "SYS_ADMIN"]}),
        ({"kind": "serving", "mooncake": {"enabled": True, "topology": "two-hosts"}},
         {"add": ["NET_ADMIN", "SYS_ADMIN"]}),
    ],
)  # fmt: skip
def test_least_privileges_per_stack(stack: dict, caps) -> None:
    ctx = privileges(StackSpec.model_validate(stack)).security_context
    assert ctx.get("capabilities") == caps and ctx["privileged"] is False
    model({"securityContext": ctx, "name": "c"}, "V1Container")


def test_matrix_names_each_node_its_runner_spec_and_command() -> None:
    m = matrix(load_nodes(ROOT / "ladders" / "gpu-nodes.yaml"))
    assert m == {"include": [
        {"node": "h200-a", "runs_on": ["self-hosted", "linux", "gpu", "h200-a"],
         "spec": "ladders/gpu-1x.yaml", "command": "sweep"},
        {"node": "h200-b", "runs_on": ["self-hosted", "linux", "gpu", "h200-b"],
         "spec": "ladders/gpu-1x.yaml", "command": "sweep"},
    ]}  # fmt: skip


def test_a_bad_nodes_file_is_bad_input(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "ladders" / "cpu-nodes.yaml").read_text())
    doc["nodes"][0]["node_selector"] = {"a": "b"}  # and node_name: pinned twice
    bad = tmp_path / "nodes.yaml"
    bad.write_text(yaml.safe_dump(doc))
    res = CliRunner().invoke(app, ["fleet", "render", str(ROOT / "ladders" / "cpu-e1.yaml"),
                                   "--nodes", str(bad), "--out", str(tmp_path / "o")])  # fmt: skip
    assert res.exit_code == 2
    assert "name exactly one of node_name, node_selector" in res.output
