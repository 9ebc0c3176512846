"""The image build as the deploy tests read it: Dockerfile instructions, base images, .dockerignore."""

from __future__ import annotations

import fnmatch
import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"


def dockerfile_instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    instructions, pending = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        word, _, rest = (pending + line).partition(" ")
        instructions.append((word.upper(), rest.strip()))
        pending = ""
    assert not pending, "Dockerfile ends in a continuation line"
    return instructions


# .dockerignore: the subset of Docker's rules it uses (globs per path segment, a leading **/,
# ! to re-include, last match wins, a match on a parent counts)

def dockerignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def _segments_match(path: str, pattern: str) -> bool:
    if pattern.startswith("**/"):
        parts = path.split("/")
        return any(_segments_match("/".join(parts[i:]), pattern[3:]) for i in range(len(parts)))
    names, globs = path.split("/"), pattern.split("/")
    return len(names) == len(globs) and all(fnmatch.fnmatchcase(n, g) for n, g in zip(names, globs))


def docker_context_excludes(path: str) -> bool:
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    excluded = False
    for pattern in dockerignore_patterns():
        negate = pattern.startswith("!")
        glob = pattern.lstrip("!").strip("/")
        if any(_segments_match(prefix, glob) for prefix in prefixes):
            excluded = not negate
    return excluded


def base_images() -> list[str]:
    """The image of each FROM, with the ARGs declared before the first FROM filled in."""
    instructions = dockerfile_instructions()
    args = {}
    for word, rest in instructions:
        if word == "FROM":
            break
        if word == "ARG":
            key, _, value = rest.partition("=")
            args[key] = value
    return [re.sub(r"\$\{?(\w+)\}?", lambda m: args[m[1]], rest.split()[0])
            for word, rest in instructions if word == "FROM"]


def final_stage(instructions) -> list[tuple[str, str]]:
    starts = [i for i, (word, _) in enumerate(instructions) if word == "FROM"]
    return instructions[starts[-1]:]


def image_env() -> dict[str, str]:
    """The ENV of the final image (what every container started from it sees)."""
    env = {}
    for word, rest in final_stage(dockerfile_instructions()):
        if word == "ENV":
            for token in shlex.split(rest):
                key, _, value = token.partition("=")
                env[key] = value
    return env


def image_user() -> tuple[int, int]:
    users = [rest for word, rest in final_stage(dockerfile_instructions()) if word == "USER"]
    assert users, "the image must not run as root: no USER in the final stage"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and (not gid or gid.isdigit()), \
        f"USER {users[-1]}: use a numeric uid[:gid] so Kubernetes' runAsNonRoot can verify it"
    return int(uid), int(gid or uid)
