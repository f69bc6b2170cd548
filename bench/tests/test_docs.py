"""The repository's Markdown: the README stays a front page (at most 10 KB, the two set-up commands first, its curl
request the one the container test sends), and every relative link in the README, docs/, CONTRIBUTING, CHANGELOG
and examples/ resolves to a file of this repository and, with a #fragment, to one of its headings. Reads files
only: no server, a few seconds."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_LIMIT_BYTES = 10 * 1024
# What CI and users run on a fresh machine (`.ci/run` runs the second): the README's first block, word for word.
FIRST_COMMANDS = [
    "make run    # sets everything up, then serves the embedded default model (SmolLM2-135M-Instruct) on port 3000 "
    "(PORT=… to change)",
    "make test   # sets everything up, then runs every test suite (Rust, Python shard, whole-stack integration)",
]
LINKED_FILES = [
    README,
    ROOT / "CONTRIBUTING.md",
    ROOT / "CHANGELOG.md",
    ROOT / "examples/README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a `# comment` in a bash block is no heading, a [x](y) there no link)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def anchors(path: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped (hyphens and underscores kept), spaces as hyphens, and
    -1, -2 … after a repeated one."""
    seen: dict[str, int] = {}
    ids = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        ids.add(slug if count == 0 else f"{slug}-{count}")
    return ids


def relative_links(path: Path) -> list[str]:
    links = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        # Inline code is no link either: `[x](y)` in backticks is text.
        links += LINK.findall(re.sub(r"`[^`]*`", "", line))
    return [link for link in links if not re.match(r"^[a-z][a-z0-9+.-]*:", link)]


def test_the_readme_is_a_front_page_of_at_most_10_kb() -> None:
    size = len(README.read_bytes())
    assert size <= README_LIMIT_BYTES, (
        f"README.md is {size} bytes, over {README_LIMIT_BYTES}: move detail into docs/ and link it"
    )


def test_the_readme_starts_with_the_two_set_up_commands_unchanged() -> None:
    text = README.read_text(encoding="utf-8")
    first_block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first_block is not None and text.index("```") < text.index("\n## ")
    assert first_block.group(1).splitlines() == FIRST_COMMANDS


def test_the_readme_request_is_the_one_the_container_test_sends() -> None:
    # integration-tests/test_container.py sends README_BODY to the image; the README shows that request.
    text = README.read_text(encoding="utf-8")
    curl = re.search(r"curl -s localhost:3000/v1/systemone .*? -d '(.*?)'\n", text, re.S)
    assert curl is not None, "the README's curl request to /v1/systemone"
    module = ast.parse((ROOT / "integration-tests/test_container.py").read_text(encoding="utf-8"))
    sent = next(
        ast.literal_eval(node.value)
        for node in module.body
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and node.target.id == "README_BODY"
        and node.value is not None
    )
    assert json.loads(curl.group(1)) == sent


@pytest.mark.parametrize("path", LINKED_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(path: Path) -> None:
    broken = []
    for link in relative_links(path):
        target, _, fragment = link.partition("#")
        resolved = (path.parent / target).resolve() if target else path
        if resolved != ROOT and ROOT not in resolved.parents:
            broken.append(f"{link}: outside the repository")
        elif not resolved.exists():
            broken.append(f"{link}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{link}: no heading #{fragment} in {resolved.relative_to(ROOT)}")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_checker_sees_links_and_headings() -> None:
    # The README links into docs/ with fragments; a checker that found none would pass anything.
    links = relative_links(README)
    assert any(link.startswith("docs/") and "#" in link for link in links), links
    assert "on-a-gpu" in anchors(ROOT / "docs/speed.md")
    assert "the-contract-protodecisionproto" in anchors(ROOT / "docs/architecture.md")


def nginx_directives(text: str) -> set[str]:
    """An nginx configuration's directives, comments and blank space dropped, the servers' ports too (8080 in
    Kubernetes, the image's 80 in the fleet test), blocks' openings and closings left out."""
    out = set()
    for line in text.splitlines():
        directive = " ".join(line.split("#", 1)[0].split())
        directive = re.sub(r"^(server \S+?):\d+", r"\1", directive)
        if directive and directive != "}" and not directive.endswith("{"):
            out.add(directive)
    return out


def test_the_nginx_recipe_is_the_configuration_the_fleet_test_runs() -> None:
    """docs/deploy.md's nginx recipe, directive for directive, is in integration-tests/fleet/nginx.conf, which
    integration-tests/test_fleet_containers.py runs in front of three replicas: the documented recipe is tested."""
    recipe = re.search(r"```nginx\n(.*?)```", (ROOT / "docs/deploy.md").read_text(encoding="utf-8"), re.S)
    assert recipe, "docs/deploy.md has no nginx block"
    tested = nginx_directives((ROOT / "integration-tests/fleet/nginx.conf").read_text(encoding="utf-8"))
    # Where it listens and what it proxies to are the deployment's own.
    documented = {d for d in nginx_directives(recipe.group(1)) if not d.startswith(("listen ", "proxy_pass "))}
    assert documented - tested == set()
