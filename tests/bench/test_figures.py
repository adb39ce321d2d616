"""The realistic-provider bench's arithmetic and report text (bench.figures, bench.report): pure,
no services. The bench itself is checked by running it (`python -m bench --smoke`)."""

import pytest

from bench.figures import (
    ClaimsVerdict,
    cdf_points,
    ceiling_per_s,
    drain_rate,
    floor_line,
    rate_limit_floor,
    ratio_to_floor,
    requests_needed,
)
from bench.report import BEGIN, END, fill_readme, markdown_table, speed_of

EDGES = "begin_restriction,complete_restriction,expire_grace"


def test_requests_needed_leaves_out_the_429s_which_execute_nothing():
    assert requests_needed({"read": 1050, "rate_limited_read": 50, "write": 3}) == 1000
    assert requests_needed({"read": 10, "rate_limited_read": 0, "write": 3, "rate_limited_write": 1}, "write") == 2
    assert requests_needed({"error": "no simulator"}) is None


def test_the_floor_is_the_requests_at_the_limit_and_the_ratio_is_taken_against_it():
    floor = rate_limit_floor(100_000, 100.0)
    assert floor == 1000.0
    assert ratio_to_floor(1150.0, floor) == pytest.approx(1.15)
    assert ratio_to_floor(5.0, 0.0) is None
    with pytest.raises(ValueError):
        rate_limit_floor(10, 0.0)


def test_claims_are_the_same_as_sequential_only_with_one_pattern_on_every_cycle():
    same = ClaimsVerdict(cycles=3, restricted=3, duplicates=0, refused=0, patterns={EDGES: 3}, reference={EDGES: 1})
    assert same.same_as_sequential and same.as_dict()["same_as_sequential"] is True
    twice = ClaimsVerdict(cycles=3, restricted=3, duplicates=0, refused=0,
                          patterns={EDGES: 2, "begin_restriction,complete_restriction,expire_grace,expire_grace": 1},
                          reference={EDGES: 1})
    missing = ClaimsVerdict(cycles=3, restricted=2, duplicates=0, refused=0, patterns={EDGES: 2}, reference={EDGES: 1})
    refused = ClaimsVerdict(cycles=3, restricted=3, duplicates=0, refused=1, patterns={EDGES: 3}, reference={EDGES: 1})
    duplicated = ClaimsVerdict(cycles=3, restricted=3, duplicates=1, refused=0, patterns={EDGES: 3},
                               reference={EDGES: 1})
    ambiguous = ClaimsVerdict(cycles=3, restricted=3, duplicates=0, refused=0, patterns={EDGES: 3},
                              reference={EDGES: 1, "expire_grace": 1})
    assert not any(v.same_as_sequential for v in (twice, missing, refused, duplicated, ambiguous))


def test_drain_rate_and_the_ceiling_one_provider_read_per_event_allows():
    assert drain_rate(1000, 100.0, 111.0) == pytest.approx(90.909, rel=1e-3)
    assert drain_rate(0, 100.0, 111.0) is None
    assert drain_rate(5, 100.0, 100.0) is None
    assert ceiling_per_s(100.0, 1.0) == 100.0
    assert ceiling_per_s(100.0, 2.0) == 50.0
    assert ceiling_per_s(100.0, None) == 100.0


def test_cdf_points_and_floor_lines():
    assert cdf_points([3.0, 1.0, 2.0, 4.0]) == ([1.0, 2.0, 3.0, 4.0], [0.25, 0.5, 0.75, 1.0])
    assert floor_line(100, 10.0, 1.15) == ([0.0, pytest.approx(11.5)], [0.0, 100.0])


def test_the_report_fills_the_marked_block_and_shows_the_speed_beside_each_figure():
    results = {"command": "python -m bench", "started_at": "2026-12-03T15:00:00", "cpus": 2, "loadavg_start": [1, 1, 1],
               "table": [{"figure": "a|b", "value": "1", "target": "2", "verdict": "PASS", "speed": "0.30 s"}]}
    block = markdown_table(results)
    assert "| a\\|b | 1 | 2 | PASS | 0.30 s |" in block
    readme = f"# Last run\n\n{BEGIN}\nold table\n{END}\n\n## What bounds\n"
    filled = fill_readme(readme, block)
    assert "old table" not in filled and block in filled and filled.endswith("## What bounds\n")
    assert fill_readme(filled, block) == filled
    assert BEGIN in fill_readme("# no markers yet\n", block)
    assert speed_of({"machine_loop_s": [0.31, 0.42]}) == "0.31-0.42 s"
    assert speed_of({"machine_loop_s": [0.3]}) == "0.30 s"
    assert speed_of(None) == "-"
