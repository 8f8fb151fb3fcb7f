"""A build's accuracy report as the CLI prints it and the console shows it: each kind of
report has its own figures, none falls through to "skipped"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import pytest

import kiln_console
from kiln_platform.cli.models import accuracy_line

pytestmark = pytest.mark.unit

REPORTS: list[tuple[dict[str, Any], str, str]] = [
    ({"type": "generate", "equal_prefix": 30, "tokens": 32, "top1_agreement": 0.97,
      "max_abs_logit_diff": 0.25}, "greedy equal for 30/32", "30/32"),
    ({"type": "embeddings", "min_cosine": 0.9999912}, "min cosine 0.999991", "0.999991"),
    ({"type": "score", "max_abs_diff": 3e-8}, "max |score diff| 3e-08", "3e-08"),
    ({"type": "classify", "max_abs_diff": 6e-8, "top1_agreement": 0.75},
     "max |probability diff| 6e-08, top label agreement 0.750", "0.750"),
    ({"type": "skipped", "reason": "no GPU"}, "skipped (no GPU)", "no GPU"),
]  # fmt: skip


@pytest.mark.parametrize(("report", "line", "shown"), REPORTS)
def test_each_report_kind_has_its_figures(report: dict[str, Any], line: str, shown: str) -> None:
    assert line in accuracy_line(report)
    folder = Path(kiln_console.__file__).parent / "templates"
    macros: Any = jinja2.Environment(loader=jinja2.FileSystemLoader(folder), autoescape=True)
    html = str(macros.get_template("_accuracy.html.j2").module.accuracy(report))
    assert f'data-type="{report["type"]}"' in html
    assert shown in html
