"""Static checks of what kproxy installs: pinned versions, a pinned base image, one source of each.

``constraints.txt`` pins every package ``make test``, ``make demo``, CI and the
image install (``make constraints`` regenerates it); the Dockerfile's base image
is named by digest, not by a tag that moves.
"""

from __future__ import annotations

import re
import shlex
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deploy.image import REPO, base_images, docker_context_excludes, dockerfile_instructions

CONSTRAINTS = REPO / "constraints.txt"
_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;]+)\s*(;.*)?$")


def pins() -> dict[str, str]:
    """{canonical name: version} of constraints.txt; every line is a comment or an exact pin."""
    found = {}
    for raw in CONSTRAINTS.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _PIN.match(line)
        assert match, f"constraints.txt: not an exact pin: {raw!r}"
        name = canonicalize_name(match["name"])
        assert name not in found or found[name] == match["version"], f"{name} pinned twice"
        found[name] = match["version"]
    return found


def declared() -> list[Requirement]:
    """Runtime dependencies and every extra (test, demo, analysis), as pyproject.toml states them."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [Requirement(r) for r in (*project["dependencies"], *(r for extra in extras.values() for r in extra))]


def test_constraints_pin_every_declared_dependency_within_its_range():
    pinned = pins()
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement} is not pinned in constraints.txt: run make constraints"
        assert requirement.specifier.contains(pinned[name], prereleases=True), \
            f"constraints.txt pins {name}=={pinned[name]}, outside pyproject's {requirement}"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["name"]
    assert canonicalize_name(project) not in pinned    # the project itself is installed from the checkout


def test_constraints_say_how_to_refresh_them():
    header = CONSTRAINTS.read_text().splitlines()[:3]
    assert any("make constraints" in line for line in header), header
    assert "constraints:" in (REPO / "Makefile").read_text()


def test_setup_installs_with_the_constraints():
    setup = (REPO / "scripts" / "setup.sh").read_text()
    installs = [line for line in setup.splitlines() if re.search(r"pip\"? install\b.*-e ", line)]
    assert installs and all("-c constraints.txt" in line for line in installs), installs
    assert "constraints.txt -nt" in setup, "a changed constraints.txt must reinstall"


def test_dockerfile_base_image_is_pinned_by_digest():
    images = base_images()
    assert images
    for image in images:
        assert re.fullmatch(r"[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}", image), \
            f"FROM {image}: pin the base image by digest"


def test_dockerfile_builds_wheels_within_the_constraints():
    instructions = dockerfile_instructions()
    copied = [source for word, rest in instructions if word == "COPY" and "--from" not in rest
              for source in shlex.split(rest)[:-1]]
    assert "constraints.txt" in copied
    assert not docker_context_excludes("constraints.txt"), ".dockerignore excludes constraints.txt"
    installs = [rest for word, rest in instructions
                if word == "RUN" and re.search(r"pip (wheel|install)\b", rest)]
    # Dependencies are resolved once, in the wheel build; the runtime stage installs those wheels only.
    assert any("pip wheel" in run and "-c constraints.txt" in run for run in installs), installs
    assert all("pip wheel" in run or "--no-index" in run for run in installs), installs
