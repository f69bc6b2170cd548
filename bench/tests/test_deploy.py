"""deploy/ rendered and validated offline: every overlay's objects pass Kubernetes' schemas (strict), the Deployment
keeps the contract the router and launcher define (probes, port, drain timing), and a broken manifest fails."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from decision_bench.deploy import RenderError, render, validate

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = ["overlays/cpu", "overlays/gpu", "inference-pool"]
SERIES_TABLE = ROOT / "router" / "src" / "series.rs"


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def router_series() -> set[str]:
    return set(re.findall(r'name: "(decision_[a-z_]+)"', SERIES_TABLE.read_text()))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_renders_and_every_object_validates(overlay: str) -> None:
    objects = render(DEPLOY / overlay)
    kinds = sorted(o["kind"] for o in objects)
    expected = ["Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service", "ServiceMonitor"]
    if overlay == "inference-pool":
        expected = sorted([*expected, "InferencePool"])
    assert kinds == expected
    for obj in objects:
        validate(obj)
    # Real Kustomize, where this machine has it (kubectl's built-in kustomize), renders the same objects.
    kubectl = shutil.which("kubectl")
    if kubectl is not None:
        printed = subprocess.run(
            [kubectl, "kustomize", str(DEPLOY / overlay)], capture_output=True, text=True, timeout=60, check=True
        ).stdout
        theirs = sorted(yaml.safe_load_all(printed), key=lambda o: (o["kind"], o["metadata"]["name"]))
        ours = sorted(objects, key=lambda o: (o["kind"], o["metadata"]["name"]))
        assert theirs == ours


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_deployment_keeps_the_servers_contract(overlay: str) -> None:
    objects = render(DEPLOY / overlay)
    deployment = by_kind(objects, "Deployment")
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    variables = env(container)
    port = int(variables["PORT"])
    assert [p["containerPort"] for p in container["ports"] if p["name"] == "http"] == [port]
    # The three probes on the router's routes: liveness and startup on /health, readiness on /ready.
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    # The drain fits the grace: preStop, then the launcher's SHUTDOWN_GRACE_SECS, then its SIGKILL bound (5 s).
    sleep = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    grace = int(variables["SHUTDOWN_GRACE_SECS"])
    assert pod["spec"]["terminationGracePeriodSeconds"] >= sleep + grace + 5
    # Liveness cannot kill a replica within the drain (it stays 200 while draining; this is the second guard).
    liveness = container["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= sleep + grace
    assert 1 <= int(variables["QUEUE_HIGH_WATER_PERCENT"]) <= 100
    assert container["resources"]["requests"]["cpu"]
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = by_kind(objects, "Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {"http"}
    monitor = by_kind(objects, "ServiceMonitor")
    assert [(e["port"], e["path"]) for e in monitor["spec"]["endpoints"]] == [("http", "/metrics")]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    hpa = by_kind(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "decision_requests_queued"
    assert metric["pods"]["metric"]["name"] in router_series()
    if overlay != "overlays/cpu":
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    if overlay == "inference-pool":
        pool = by_kind(objects, "InferencePool")
        assert pool["spec"]["targetPorts"] == [{"number": port}]
        assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_a_manifest_that_does_not_validate_fails() -> None:
    objects = render(DEPLOY / "overlays/cpu")
    deployment = by_kind(objects, "Deployment")
    broken = copy.deepcopy(deployment)
    broken["spec"]["replica"] = 2  # a typo: strict schemas know no such field
    with pytest.raises(kubernetes_validate.ValidationError, match="replica"):
        validate(broken)
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSeconds"] = "5s"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(broken)
    monitor = copy.deepcopy(by_kind(objects, "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["interval"] = "fifteen seconds"
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor)
    pool = copy.deepcopy(by_kind(render(DEPLOY / "inference-pool"), "InferencePool"))
    pool["spec"]["targetPorts"] = [{"number": 70000}]
    with pytest.raises(jsonschema.ValidationError):
        validate(pool)
    del pool["spec"]["endpointPickerRef"]
    with pytest.raises(jsonschema.ValidationError):
        validate(pool)


def test_a_kustomization_the_renderer_cannot_render_faithfully_is_refused(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: [../x]\nnamePrefix: a-\n")
    with pytest.raises(RenderError, match="namePrefix"):
        render(tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{DEPLOY / 'base'}]\npatches:\n- target: {{kind: Deployment, name: decision-inference}}\n"
        "  patch: '[{op: replace, path: /spec/nothing/here, value: 1}]'\n"
    )
    with pytest.raises(RenderError, match="nothing"):
        render(tmp_path)


def test_the_dashboard_queries_only_series_the_router_exports() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "decision-inference.json").read_text())
    exported = router_series()
    seen: set[str] = set()
    for panel in dashboard["panels"]:
        assert panel["title"] and panel["targets"], panel
        for target in panel["targets"]:
            for name in re.findall(r"\b(decision_[a-z_]+)", target["expr"]):
                base = re.sub(r"_(bucket|sum|count)$", "", name)
                assert name in exported or base in exported, f"{panel['title']}: {name}"
                seen.add(base if base in exported else name)
    assert {"decision_requests_queued", "decision_requests_running", "decision_prefix_cache_usage_ratio"} <= seen
