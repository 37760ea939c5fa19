"""Reading the report shows every figure kind, each an image a shipped study has, after a
box on how to read a verdict."""

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGE = (DOCS / "reading-the-report.md").read_text()
KINDS = (
    "Regime atlas",
    "β histogram",
    "Determinant",
    "Probe consistency",
    "Crossover",
    "Width",
    "Gates at query tokens",
    "Compare",
    "Verdicts",
)


def test_a_verdict_box_comes_before_the_figures_and_the_rules():
    box = PAGE.index('!!! tip "How to read a verdict"')
    assert box < PAGE.index("## The figures") < PAGE.index("## The rules")


def test_every_figure_kind_has_a_shipped_image_and_a_reading():
    sections = dict(re.findall(r"^### (.+?)\n(.*?)(?=^##)", PAGE, re.S | re.M))
    for kind in KINDS:
        images = re.findall(r"!\[[^\]]+\]\((studies/[^)]+\.png)\)", sections[kind])
        assert len(images) == 1 and (DOCS / images[0]).is_file(), kind
        reading = sections[kind].split(")\n", 1)[1]
        assert 2 <= reading.count(". ") + 1 <= 6, kind  # a few sentences, not a rule list
