"""The user documentation holds what a newcomer relies on: every setting in the reference,
links and anchors that lead somewhere, images that render off the repository, and product
words only (history and issue numbers belong in docs/ for contributors)."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest

from kproxy.config import Config

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))

# Config fields that are no setting of their own: the parsed form of `upstream`, and the
# token, which only KPROXY_ADMIN_TOKEN or admin_token_file may carry.
NOT_SETTINGS = {"upstreams": "upstream", "admin_token": None, "policy": None}   # policy: read from policy_file

LINK = re.compile(r"(!?)\[[^\]]*\]\(([^)\s]+)\)")


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(text: str) -> set[str]:
    in_code = False
    anchors = set()
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            anchors.add(_slug(line.lstrip("#")))
    return anchors


def test_every_setting_is_in_the_reference():
    reference = _section(README.read_text(), "Settings reference")
    documented = set(re.findall(r"^\| `([a-z_]+)`", reference, re.M))
    documented |= {name for row in re.findall(r"^\| (`[a-z_]+`(?:, `[a-z_]+`)+) \|", reference, re.M)
                   for name in re.findall(r"`([a-z_]+)`", row)}
    settings = {NOT_SETTINGS.get(f.name, f.name) for f in dataclasses.fields(Config)} - {None}
    assert settings - documented == set(), "settings missing from README's Settings reference"


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.name)
def test_links_lead_somewhere(path):
    text = path.read_text()
    anchors = _anchors(text)
    broken = []
    for _, target in LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file_part, _, anchor = target.partition("#")
        if file_part:
            if not (path.parent / file_part).exists():
                broken.append(target)
        elif anchor not in anchors:
            broken.append(target)
    assert broken == []


def test_readme_images_render_off_the_repository():
    """The package index shows README without the repository beside it: a relative image
    path would be a broken picture there. Images are the repository's own files, served
    from its home (pyproject's Repository URL), so they exist wherever README is read."""
    repository = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
    owner_repo = repository.removeprefix("https://github.com/")
    raw = f"https://raw.githubusercontent.com/{owner_repo}/main/"
    images = [target for bang, target in LINK.findall(README.read_text()) if bang]
    assert images, "README shows the live page and the report"
    for target in images:
        assert target.startswith(raw), target
        assert (ROOT / target.removeprefix(raw)).is_file(), target


def test_readme_speaks_of_the_product_only():
    text = README.read_text()
    assert not re.search(r"\bissue \d+|\bsession \d+|(?<![\w&])#\d+\b", text, re.I)
    commit_id = r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b"
    assert not re.search(commit_id, text)
    assert not re.search(r"\(was[: ]", text), "before/after figures belong in docs/reliability.md"


def test_first_screen_has_a_quick_start_against_ones_own_cluster():
    first_screen = "\n".join(README.read_text().splitlines()[:40])
    assert "## Quick start" in first_screen
    assert "kproxy run --upstream" in first_screen and "--advertised-host" in first_screen


def test_every_metric_is_in_the_readme():
    """An operator looks a metric up in README: every family kproxy exports (a process's,
    capture's and the workers' supervisor's) is named there, bar the client library's own."""
    from kproxy.observers.metrics import Metrics, SupervisorMetrics
    text = README.read_text()
    names = {family.name for registry in (Metrics(principal_label=True, client_id_label=True,
                                                  topic_label=True, group_label=True).registry,
                                          SupervisorMetrics(2).registry)
             for family in registry.collect()}
    kproxy_names = {name for name in names if name.startswith("kproxy_")}
    # prometheus-client names counters without _total; README names them as scraped.
    missing = {name for name in kproxy_names if name not in text and f"{name}_total" not in text}
    assert missing == set()
