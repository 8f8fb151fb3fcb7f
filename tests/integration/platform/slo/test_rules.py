"""`kiln slo rules`' output passes `promtool check rules`, and `promtool test rules` shows its
burn-rate alerts firing on a model burning its budget and quiet on one that is not."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from kiln_platform.slo.policy import Objective
from kiln_platform.slo.rules import ALERT, NamedObjective, rules

pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool missing: `make promtool` installs it"
)
SLOS = [
    NamedObjective("hot", Objective("hot", availability=0.999, latency=0.99, latency_ms=300.0)),
    NamedObjective("calm", Objective("calm", availability=0.999, latency=None, latency_ms=1e3)),
]
PAGE = {"slo": "hot", "sli": "availability", "model": "hot", "severity": "page"}
TICKET = {**PAGE, "severity": "ticket"}
SUMMARY = {"summary": "SLO hot: the availability error budget is burning too fast"}


def _series(model: str, name: str, values: str, **labels: str) -> dict[str, str]:
    extra = "".join(f',{k}="{v}"' for k, v in labels.items())
    return {"series": f'{name}{{model="{model}",plan="standard"{extra}}}', "values": values}


FIXTURES = {
    "rule_files": ["rules.yml"],
    "evaluation_interval": "1m",
    "tests": [{
        "interval": "1m",
        "input_series": [
            # hot: 100 good requests a minute; from minute 31, 10 server errors a minute too
            _series("hot", "kiln_sli_requests_total", "0+100x120", code="2xx"),
            _series("hot", "kiln_sli_requests_total", "0+0x30 0+10x90", code="5xx"),
            # ... and 0.5% of them slower than 300 ms: half the latency budget's pace, quiet
            _series("hot", "kiln_sli_latency_seconds_bucket", "0+99.5x120", le="0.3"),
            _series("hot", "kiln_sli_latency_seconds_count", "0+100x120"),
            # calm: 0.05% errors all along (burn 0.5): never alerts
            _series("calm", "kiln_sli_requests_total", "0+2000x120", code="2xx"),
            _series("calm", "kiln_sli_requests_total", "0+1x120", code="5xx"),
        ],
        "alert_rule_test": [
            {"eval_time": "25m", "alertname": ALERT, "exp_alerts": []},
            {"eval_time": "45m", "alertname": ALERT, "exp_alerts": [
                {"exp_labels": PAGE, "exp_annotations": SUMMARY},
                {"exp_labels": TICKET, "exp_annotations": SUMMARY},
            ]},
        ],
        "promql_expr_test": [{
            "expr": 'kiln_slo:sli_error:ratio_rate5m{slo="hot",sli="availability"}',
            "eval_time": "45m",
            "exp_samples": [
                {"labels": 'kiln_slo:sli_error:ratio_rate5m{slo="hot",sli="availability"}',
                 "value": 10 / 110},
            ],
        }],
    }],
}  # fmt: skip


def _promtool(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        ["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_generated_rules_check_and_fire_only_when_burning(tmp_path: Path) -> None:
    (tmp_path / "rules.yml").write_text(rules(SLOS))
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(FIXTURES, sort_keys=False))
    assert "SUCCESS" in _promtool("check", "rules", "rules.yml", cwd=tmp_path)
    assert "SUCCESS" in _promtool("test", "rules", "tests.yml", cwd=tmp_path)
