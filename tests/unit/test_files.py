"""JSON lines written whole or not at all (mascot.core.files.write_jsonl), and read back as written."""

from __future__ import annotations

import datetime
import json
import stat

import pytest

from mascot.core.files import jsonl_text, read_jsonl, write_jsonl


def test_records_round_trip_one_per_line_with_text_kept_readable(tmp_path):
    recs = [{"id": "a", "text": "Ça va? 😊 — 你好"}, {"id": "b", "n": [1, 2.5, None], "nested": {"k": True}}]
    path = write_jsonl(tmp_path / "x.jsonl", recs)
    raw = path.read_text(encoding="utf-8")
    assert raw.endswith("\n") and raw.count("\n") == 2 and "你好" in raw  # not \u-escaped
    assert read_jsonl(path) == recs
    assert jsonl_text([]) == "" and read_jsonl(write_jsonl(tmp_path / "empty.jsonl", [])) == []
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_a_record_json_cannot_hold_leaves_the_old_file_and_no_temporary(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [{"id": "old"}])
    when = datetime.date(2026, 12, 3)
    with pytest.raises(TypeError):
        write_jsonl(path, [{"id": "new"}, {"when": when}])
    assert read_jsonl(path) == [{"id": "old"}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.jsonl"]
    write_jsonl(path, [{"when": when}], default=str)  # a converter the caller chooses
    assert json.loads(path.read_text()) == {"when": "2026-12-03"}


def test_generators_are_written_in_order(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", ({"i": i} for i in range(5)))
    assert [r["i"] for r in read_jsonl(path)] == [0, 1, 2, 3, 4]
