"""Renders and validates deploy/ offline: the Kustomize subset its kustomizations use, then every object against
Kubernetes' own schemas (kubernetes-validate's bundled copies, strict: unknown fields fail) or, for the custom
resources, the schemas in deploy/schemas/.

Why a renderer here: the PyPI bindings of Kustomize (pykustomize) need Python 3.14 and this project runs 3.11. So
this renders only what deploy/ uses (`resources`, `images`, JSON 6902 `patches` with a kind/name target) and refuses
any other kustomization field, and test_deploy.py checks that real Kustomize (`kubectl kustomize`), where a machine
has it, renders the same objects.

    python -m decision_bench.deploy deploy/overlays/cpu     # prints the rendered YAML, or the first error
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

# The Kubernetes minor whose schemas the objects must pass (kubernetes-validate bundles 1.25 .. its own version).
KUBERNETES_VERSION = "1.30"
SUPPORTED_FIELDS = {"apiVersion", "kind", "resources", "images", "patches"}
SCHEMAS = Path(__file__).resolve().parents[2] / "deploy" / "schemas"


class RenderError(Exception):
    """A kustomization this renderer cannot render faithfully, or a patch that does not apply."""


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize directory` would print, in resource order."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED_FIELDS
    if unknown:
        raise RenderError(f"{directory}: kustomization fields this renderer does not implement: {sorted(unknown)}")
    objects: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        if path.is_dir():
            objects.extend(render(path))
        else:
            objects.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None)
    for patch in kustomization.get("patches", []):
        if set(patch) != {"target", "patch"}:
            raise RenderError(f"{directory}: only inline JSON 6902 patches with a target are rendered: {sorted(patch)}")
        operations = yaml.safe_load(patch["patch"])
        matched = [o for o in objects if _targets(patch["target"], o)]
        if not matched:
            raise RenderError(f"{directory}: a patch's target {patch['target']} matches no object")
        for obj in matched:
            for operation in operations:
                _apply(obj, operation)
    for image in kustomization.get("images", []):
        for obj in objects:
            _set_image(obj, image)
    return objects


def _targets(target: dict[str, str], obj: dict[str, Any]) -> bool:
    unknown = set(target) - {"kind", "name"}
    if unknown:
        raise RenderError(f"patch targets by {sorted(unknown)} are not rendered")
    return all(
        (obj["kind"] if key == "kind" else obj["metadata"]["name"]) == value for key, value in target.items()
    )


def _apply(obj: dict[str, Any], operation: dict[str, Any]) -> None:
    """One JSON patch operation (RFC 6902: add, replace, remove)."""
    op, path = operation["op"], operation["path"]
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]
    parent: Any = obj
    for part in parts[:-1]:
        try:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        except (KeyError, IndexError, ValueError) as e:
            raise RenderError(f"{op} {path}: no {part!r} ({e})") from e
    last = parts[-1]
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if op == "add":
            parent.insert(index, copy.deepcopy(operation["value"]))
        elif op == "replace" and index < len(parent):
            parent[index] = copy.deepcopy(operation["value"])
        elif op == "remove" and index < len(parent):
            del parent[index]
        else:
            raise RenderError(f"{op} {path}: no element {index}")
    elif op == "add":
        parent[last] = copy.deepcopy(operation["value"])
    elif op in ("replace", "remove") and last in parent:
        if op == "replace":
            parent[last] = copy.deepcopy(operation["value"])
        else:
            del parent[last]
    elif op in ("replace", "remove"):
        raise RenderError(f"{op} {path}: no {last!r} to {op}")
    else:
        raise RenderError(f"{op} {path}: only add, replace and remove are rendered")


def _set_image(obj: dict[str, Any], image: dict[str, str]) -> None:
    spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        name, _, tag = container["image"].partition(":")
        if name == image["name"]:
            container["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"


def validate(obj: dict[str, Any]) -> None:
    """Raises jsonschema.ValidationError (or kubernetes_validate's errors) when `obj` is not a valid object."""
    custom = SCHEMAS / f"{obj['kind'].lower()}-{obj['apiVersion'].replace('/', '-')}.json"
    if custom.exists():
        jsonschema.Draft202012Validator(json.loads(custom.read_text())).validate(obj)
    else:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def main() -> int:
    objects = render(Path(sys.argv[1]))
    for obj in objects:
        validate(obj)
    yaml.safe_dump_all(objects, sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
