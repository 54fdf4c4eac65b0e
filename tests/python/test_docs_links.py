"""The documentation stands on its own: every relative link in README.md and
docs/*.md names a file of the repository, and every #anchor a heading of the
page it points to (GitHub's heading slugs)."""

import re

import pytest

from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)}


def links(page):
    text = FENCE.sub("", page.read_text())
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        yield target


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_slug_follows_github():
    assert slug("Taking over SDPA's autograd") == "taking-over-sdpas-autograd"
    assert slug("torch.compile") == "torchcompile"
    assert slug("Debian 12 packages and build pitfalls") == "debian-12-packages-and-build-pitfalls"
    assert slug("The CUDA kernels on the H200 (tests/python/test_gpu_bf16_backward.py, 2026-11-29)") == \
        "the-cuda-kernels-on-the-h200-testspythontest_gpu_bf16_backwardpy-2026-11-29"


def test_no_reference_points_outside_the_repository():
    """Code and docs cite docs/numerics.md and docs/findings.md, never the
    planning documents the project started from."""
    import subprocess
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if files.returncode != 0:
        pytest.skip("not a git checkout")
    # The names are assembled so that this test's own source does not match.
    names = "|".join(n + "S" for n in ("NUMERIC", "FINDING")) + "|ARCHITECTURE"
    outside = re.compile(rf"\b({names})\.md\b|shared" + "/spec")
    hits = []
    for name in files.stdout.split():
        path = ROOT / name
        if path.suffix in {".png", ".json", ".safetensors"} or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        hits += [f"{name}:{i}" for i, line in enumerate(text.splitlines(), 1) if outside.search(line)]
    assert not hits, "references outside the repository: " + ", ".join(hits)
