"""The run page's pieces: artifact keys Prefect accepts, the reward-curve image, the metrics
table, and silence outside a flow run."""

from __future__ import annotations

import base64
import math
import re
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.types.names import raise_on_name_alphanumeric_dashes_only

from rl_train.flows.reward_chart import (
    HEIGHT,
    TOP,
    render_svg,
    reward_series,
    step_ticks,
    svg_data_uri,
    value_axis,
)
from rl_train.flows.ui import (
    MAX_KEY_STEM,
    artifact_key,
    metrics_table,
    publish_run_end,
    publish_step,
    reward_curve_markdown,
)

SVG = "{http://www.w3.org/2000/svg}"


def _polylines(svg: str) -> dict[str, list[tuple[float, float]]]:
    root = ET.fromstring(svg)
    return {
        line.get("data-label", ""): [tuple(map(float, p.split(","))) for p in line.get("points", "").split()]
        for line in root.iter(f"{SVG}polyline")
    }


def test_artifact_keys_are_lowercase_dashed_and_stable() -> None:
    assert artifact_key("Arith_Tiny v2.1", "metrics") == "arith-tiny-v2-1-metrics"
    assert artifact_key("sync-crimson-hyena-1a2b3c4d", "progress") == "sync-crimson-hyena-1a2b3c4d-progress"
    assert artifact_key("///", "reward-curve") == "run-reward-curve"  # nothing usable left: a fixed stem
    assert artifact_key("x" * 200, "metrics") == "x" * MAX_KEY_STEM + "-metrics"
    assert artifact_key("a" * (MAX_KEY_STEM - 1) + "-b", "metrics") == "a" * (MAX_KEY_STEM - 1) + "-metrics"


@given(st.text(max_size=80))
def test_every_run_name_gives_a_key_prefect_accepts(name: str) -> None:
    key = artifact_key(name, "metrics")
    assert raise_on_name_alphanumeric_dashes_only(key) == key
    assert "--" not in key and not key.startswith("-")


def test_reward_curve_image_is_svg_with_one_line_per_metric() -> None:
    # Training reward rises 0.1 -> 0.5 over steps 1..5; validation at steps 2 and 5 only; step 3's
    # reward was non-finite (metrics.jsonl stores None) and must leave a gap, not a zero.
    rows = [
        {"step": 1, "reward/mean": 0.1},
        {"step": 2, "reward/mean": 0.2, "val/reward_mean": 0.15},
        {"step": 3, "reward/mean": None},
        {"step": 4, "reward/mean": float("nan")},
        {"step": 5, "reward/mean": 0.5, "val/reward_mean": 0.45},
    ]
    svg = render_svg(reward_series(rows), "it: reward")
    lines = _polylines(svg)
    train, val = lines["reward/mean"], lines["val/reward_mean"]
    assert len(train) == 3 and len(val) == 2
    assert [x for x, _ in train] == sorted(x for x, _ in train)  # steps left to right
    assert train[0][1] > train[1][1] > train[2][1]  # a higher reward is drawn higher (smaller y)
    # The extremes of all values sit on the padded plot's edges: 0.1 lowest, 0.5 highest.
    ys = [y for _, y in train + val]
    assert min(ys) == train[2][1] and max(ys) == train[0][1]
    assert min(ys) >= TOP and max(ys) <= HEIGHT
    dashes = {p.get("data-label"): p.get("stroke-dasharray") for p in ET.fromstring(svg).iter(f"{SVG}polyline")}
    assert dashes == {"reward/mean": None, "val/reward_mean": "6 4"}  # equal values never hide a line
    uri = svg_data_uri(svg)
    assert uri.startswith("data:image/svg+xml;base64,")
    assert base64.b64decode(uri.split(",", 1)[1]).decode() == svg


def test_a_flat_or_empty_series_still_draws() -> None:
    flat = _polylines(render_svg(reward_series([{"step": s, "reward/mean": 0.25} for s in (1, 2)]), "t"))
    (y1, y2) = (p[1] for p in flat["reward/mean"])
    assert y1 == y2 and TOP < y1 < HEIGHT  # mid-chart, not on an edge
    single = _polylines(render_svg(reward_series([{"step": 1, "reward/mean": 0.5}]), "t"))
    assert len(single["reward/mean"]) == 1
    assert _polylines(render_svg(reward_series([]), "t")) == {}


def test_axes_have_round_ticks() -> None:
    # Rewards 0.043..0.105: span 0.062, a fifth of it 0.0124 -> the next of 1, 2, 5 x 0.01 is 0.02;
    # the axis widens to the ticks around the data, 0.04 and 0.12.
    low, high, ticks = value_axis([0.043, 0.105, 0.07])
    assert (low, high) == pytest.approx((0.04, 0.12))
    assert ticks == pytest.approx([0.04, 0.06, 0.08, 0.10, 0.12])
    # A flat line at 0: a unit span (-0.5..0.5) in steps of 0.2, widened to -0.6..0.6.
    assert value_axis([0.0, 0.0])[2] == pytest.approx([-0.6, -0.4, -0.2, 0.0, 0.2, 0.4, 0.6])
    assert step_ticks(1, 24) == [5, 10, 15, 20]  # 23 steps / 5 = 4.6 -> every 5
    assert step_ticks(1, 3) == [1, 2, 3]  # never finer than one step
    assert step_ticks(1, 1) == [1]


def test_titles_are_escaped() -> None:
    svg = render_svg(reward_series([{"step": 1, "reward/mean": 0.5}]), "a<b & c")
    assert ET.fromstring(svg).find(f"{SVG}text").text == "a<b & c"


def test_markdown_embeds_the_image_and_its_figures() -> None:
    rows = [{"step": 1, "reward/mean": 0.1}, {"step": 2, "reward/mean": 0.3, "val/reward_mean": 0.2}]
    text = reward_curve_markdown("it", rows)
    uri = re.search(r"!\[[^\]]*\]\((data:[^)\s]+)\)", text).group(1)
    ET.fromstring(base64.b64decode(uri.split(",", 1)[1]))  # a well-formed image
    assert "| reward/mean | 2 | 0.1000 | 0.3000 | 0.3000 |" in text
    assert "| val/reward_mean | 1 | 0.2000 | 0.2000 | 0.2000 |" in text


def test_metrics_table_rounds_and_spells_out_non_finite_values() -> None:
    table = metrics_table({"step": 3, "b": 1 / 3, "a": float("inf"), "c": math.nan, "d": True})
    assert table == [
        {"metric": "a", "value": "inf"},
        {"metric": "b", "value": 0.333333},
        {"metric": "c", "value": "nan"},
        {"metric": "d", "value": True},
        {"metric": "step", "value": 3},
    ]


def test_outside_a_flow_run_nothing_is_published(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """No flow run: no API call (the URL below refuses every connection, and a failed call
    would be reported on stderr) and no read of the run directory (it does not exist)."""
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        publish_step("it", 2, "step 1/2", {"step": 1, "reward/mean": 0.5})
        publish_run_end("it", str(tmp_path / "missing"))
    assert capsys.readouterr().err == ""
