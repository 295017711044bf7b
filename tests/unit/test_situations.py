"""The one situation reader (mascot.core.situations): our JSONL, EmpatheticDialogues CSV and QMSum JSON as released,
on small fixtures written for these tests (tests/fixtures/situations), and the shared JSONL read exactly as before."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from mascot.app.runjob import selfplay_request, start_request
from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.core.situations import (ED_HEADER, MEETING_EXCERPT_TURNS, Situation, load_situations,
                                    meeting_situation)

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "situations"
ED_CSV = FIX / "empathetic_dialogues_sample.csv"
QMSUM = FIX / "qmsum" / "test"


def write_jsonl(path: Path, *records: object) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------ EmpatheticDialogues CSV

def test_ed_csv_gives_one_situation_per_conversation_with_commas_decoded():
    sits = load_situations(ED_CSV, "support")
    assert [s.id for s in sits] == ["hit:901_conv:1802", "hit:902_conv:1804", "hit:903_conv:1806"]
    first = sits[0]
    # three rows of one conversation: the opening is utterance 1 (the speaker's), not a listener's reply
    assert first.opening == "I was clearing the attic, and found a box of my class photos!"
    assert first.situation == "I found my old school photos in the attic, and they made me smile."
    assert (first.emotion, first.split, first.context) == ("sentimental", "neutral", ())


def test_ed_csv_quotes_are_text_and_trailing_extra_fields_are_ignored():
    spider = load_situations(ED_CSV, "support")[1]
    # the row opens its utterance with a quote (a quoting CSV reader would swallow the following commas), and both
    # rows of the conversation carry more than the 8 header fields
    assert spider.opening == '"Ouch" was all I said when a huge spider ran over my face.'
    assert (spider.emotion, spider.split) == ("terrified", "negative")


def test_ed_csv_texts_are_stripped_unless_verbatim():
    assert load_situations(ED_CSV, "support")[2].opening == "She rode all the way to the park today!"
    raw = load_situations(ED_CSV, "support", require_labels=False, verbatim=True)[2]
    assert raw.opening == "  She rode all the way to the park today!  "
    assert raw.situation == "  My daughter learned to ride a bike without help.  "


def test_ed_csv_limit_stops_after_n_conversations():
    assert [s.id for s in load_situations(ED_CSV, "support", 2)] == ["hit:901_conv:1802", "hit:902_conv:1804"]


def test_ed_csv_malformed_row_names_file_and_line():
    with pytest.raises(ValueError, match=r"empathetic_dialogues_malformed\.csv:3: 5 comma-separated fields"):
        load_situations(FIX / "empathetic_dialogues_malformed.csv", "support")


@pytest.mark.parametrize(("text", "message"), [
    ("id,text\n1,hello\n", r"bad\.csv:1: not an EmpatheticDialogues CSV: the header is 'id,text'; it must be conv_id,"),
    ("", r"bad\.csv: empty file: an EmpatheticDialogues CSV starts with the header conv_id,utterance_idx,"),
    ("conv_id,utterance_idx,context,prompt,speaker_idx,utterance,selfeval,tags\n"
     "hit:1_conv:2,first,sad,It rained.,1,My picnic was rained out.,,\n", r"bad\.csv:2: utterance_idx 'first'"),
    ("conv_id,utterance_idx,context,prompt,speaker_idx,utterance,selfeval,tags\n"
     "hit:1_conv:2,1,soggy,It rained.,1,My picnic was rained out.,,\n", r"bad\.csv:2: emotion 'soggy' is not one of"),
    ("conv_id,utterance_idx,context,prompt,speaker_idx,utterance,selfeval,tags\n"
     "a,1,sad,It rained.,1,Rain.,,\nb,1,sad,It snowed.,1,Snow.,,\na,2,sad,It rained.,2,Oh.,,\n",
     r"bad\.csv:4: duplicate id 'a'"),
])
def test_ed_csv_bad_input_is_refused_with_its_place(tmp_path, text, message):
    (tmp_path / "bad.csv").write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        load_situations(tmp_path / "bad.csv", "support")


def test_ed_csv_unknown_emotion_is_kept_when_labels_are_not_required(tmp_path):
    p = tmp_path / "own.csv"
    p.write_text("conv_id,utterance_idx,context,prompt,speaker_idx,utterance,selfeval,tags\n"
                 "c1,1,soggy,It rained.,1,My picnic was rained out.,,\n", encoding="utf-8")
    (s,) = load_situations(p, "support", require_labels=False)
    assert (s.emotion, s.split) == ("soggy", "")


# ------------------------------------------------------------------------------------------ QMSum JSON

def test_qmsum_meeting_gives_one_excerpt_per_specific_query():
    sits = load_situations(QMSUM / "Bxy901.json", "meeting")
    assert [s.id for s in sits] == ["qmsum-test-Bxy901-q1", "qmsum-test-Bxy901-q2", "qmsum-test-Bxy901-q3"]
    q1, q2, q3 = sits
    assert q1.opening == "What did the group decide about the microphone budget?"
    assert q1.situation == meeting_situation(q1.opening) == (
        "You attended this meeting and want to know: What did the group decide about the microphone budget?")
    # the excerpt starts at the query's first relevant turn and holds at most MEETING_EXCERPT_TURNS turns
    assert len(q1.context) == MEETING_EXCERPT_TURNS
    assert q1.context[0] == ("PhD C", "Turn 2 , about the microphone budget {vocalsound} .")
    assert q1.context[-1][1].startswith("Turn 41 ")
    assert [c[1].split(" ")[1] for c in q2.context] == [str(i) for i in range(30, 45)]  # spans [35, 44], [30, 33]
    assert q3.opening == "Summarize the discussion about everything said."  # stripped
    assert {s.split for s in sits} == {"academic"} and {s.emotion for s in sits} == {""}


def test_qmsum_directory_reads_every_meeting_by_name_and_infers_the_domain():
    sits = load_situations(QMSUM, "meeting")
    assert [s.id for s in sits] == ["qmsum-test-Bxy901-q1", "qmsum-test-Bxy901-q2", "qmsum-test-Bxy901-q3",
                                    "qmsum-test-covid_901-q1"]
    assert sits[-1].split == "committee"
    assert sits[-1].context == (("Ms. Example", "I present a petition about rural broadband."),
                                ("Mr. Sample", "I present a petition about ferry services."))
    assert [s.id for s in load_situations(QMSUM, "meeting", 2)] == ["qmsum-test-Bxy901-q1", "qmsum-test-Bxy901-q2"]


def test_qmsum_domain_folder_wins_and_split_folder_names_the_id(tmp_path):
    d = tmp_path / "Product" / "val"
    d.mkdir(parents=True)
    shutil.copy(QMSUM / "covid_901.json", d / "ES9001a.json")
    shutil.copy(QMSUM / "covid_901.json", tmp_path / "IS9002b.json")
    (s,) = load_situations(d / "ES9001a.json", "meeting")
    assert (s.id, s.split) == ("qmsum-val-ES9001a-q1", "product")
    (s,) = load_situations(tmp_path / "IS9002b.json", "meeting")  # no split folder; an AMI id is Product
    assert (s.id, s.split) == ("qmsum-IS9002b-q1", "product")


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: m["specific_query_list"][0].update(relevant_text_span=[["7", "9"]]),
     r"specific_query_list\[0\]\.relevant_text_span: .* outside the meeting's 3 turns"),
    (lambda m: m["specific_query_list"][0].update(relevant_text_span=[["one", "2"]]),
     r"specific_query_list\[0\]\.relevant_text_span: not a list of \[start, end\] turn indices"),
    (lambda m: m["specific_query_list"][0].pop("query"), r"specific_query_list\[0\]: not an object with a query"),
    (lambda m: m["meeting_transcripts"][1].pop("content"), r"meeting_transcripts\[1\] is not a \{speaker, content\}"),
    (lambda m: m.pop("meeting_transcripts"), r"not a QMSum meeting"),
])
def test_qmsum_bad_input_names_the_field(tmp_path, change, message):
    meeting = json.loads((QMSUM / "covid_901.json").read_text(encoding="utf-8"))
    change(meeting)
    (tmp_path / "covid_902.json").write_text(json.dumps(meeting), encoding="utf-8")
    with pytest.raises(ValueError, match=r"covid_902\.json: " + message):
        load_situations(tmp_path / "covid_902.json", "meeting")


def test_qmsum_json_that_does_not_parse_names_its_line(tmp_path):
    (tmp_path / "broken.json").write_text('{\n  "meeting_transcripts": [\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken\.json:3: not valid JSON"):
        load_situations(tmp_path / "broken.json", "meeting")


# ------------------------------------------------------------------------------------------ formats and modes

def test_each_original_format_belongs_to_its_mode(tmp_path):
    with pytest.raises(ValueError, match="EmpatheticDialogues .csv holds support situations, not meeting ones"):
        load_situations(ED_CSV, "meeting")
    with pytest.raises(ValueError, match="QMSum meetings hold meeting situations, not support ones"):
        load_situations(QMSUM, "support")
    with pytest.raises(ValueError, match=r"unknown situations format '\.txt'"):
        load_situations(write_jsonl(tmp_path / "s.txt", {}), "support")
    with pytest.raises(ValueError, match="no QMSum .json meeting file"):
        load_situations(tmp_path, "meeting")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_situations(tmp_path / "missing.jsonl", "support")
    with pytest.raises(ValueError, match="mode must be support or meeting"):
        load_situations(ED_CSV, "chat")
    with pytest.raises(ValueError, match="limit must be >= 1"):
        load_situations(ED_CSV, "support", 0)


def test_jsonl_support_records_labels_and_verbatim(tmp_path):
    p = write_jsonl(tmp_path / "s.jsonl",
                    {"id": "a", "emotion": " Joyful", "situation": " I won. ", "first_utterance": "Guess what! "},
                    {"id": 7, "situation": "My cat is lost.", "first_utterance": "I can't find my cat."})
    with pytest.raises(ValueError, match=r"s\.jsonl:2: record lacks emotion needed by --mode support"):
        load_situations(p, "support")
    a, b = load_situations(p, "support", require_labels=False)
    assert a == Situation("a", "positive", "Guess what!", "I won.", "joyful")
    assert b == Situation("7", "", "I can't find my cat.", "My cat is lost.", "")
    a, _ = load_situations(p, "support", require_labels=False, verbatim=True)
    assert (a.opening, a.situation, a.emotion, a.split) == ("Guess what! ", " I won. ", " Joyful", "positive")


@pytest.mark.parametrize(("records", "message"), [
    ([{"id": "a", "situation": "x", "first_utterance": "y"}] * 2, r"s\.jsonl:2: duplicate id 'a'"),
    (["just text"], r"s\.jsonl:1: not a JSON object"),
    ([{"id": "a", "situation": "x", "first_utterance": "   "}], r"s\.jsonl:1: the opening \(first_utterance\)"),
    ([{"id": "a", "situation": ["x"], "first_utterance": "y"}], r"s\.jsonl:1: situation must be a string"),
    ([{"id": "", "situation": "x", "first_utterance": "y"}], r"s\.jsonl:1: id must be a non-empty"),
    ([], r"s\.jsonl: no records"),
])
def test_jsonl_bad_support_records_are_refused(tmp_path, records, message):
    with pytest.raises(ValueError, match=message):
        load_situations(write_jsonl(tmp_path / "s.jsonl", *records), "support", require_labels=False)


def test_jsonl_meeting_records(tmp_path):
    turn = {"speaker": "Chair", "content": "Welcome."}
    p = write_jsonl(tmp_path / "m.jsonl", {"id": "m1", "domain": "Product", "turns": [turn, {}], "query": " Why? "},
                    {"id": "m2", "domain": "Garden", "turns": [], "query": "When?"})
    with pytest.raises(ValueError, match=r"m\.jsonl:2: domain 'Garden' is not Academic, Committee or Product"):
        load_situations(p, "meeting")
    m1, m2 = load_situations(p, "meeting", require_labels=False)
    assert m1 == Situation("m1", "product", "Why?", meeting_situation("Why?"), "", (("Chair", "Welcome."),
                                                                                   ("Speaker", "")))
    assert m2.split == ""
    bad = write_jsonl(tmp_path / "b.jsonl", {"id": "m1", "domain": "Product", "turns": "Chair: hi", "query": "Why?"})
    with pytest.raises(ValueError, match=r"b\.jsonl:1: turns must be a list"):
        load_situations(bad, "meeting")


GOOD = {"id": "a", "emotion": "sad", "situation": "It rained.", "first_utterance": "My picnic was rained out."}
MEETING = {"id": "m", "domain": "Product", "turns": [{"speaker": "Chair", "content": "Welcome."}], "query": "Why?"}
DEEP = "[" * 100_000 + "]" * 100_000


def _bad_line(mode: str, **change: object) -> str:
    rec = {**(GOOD if mode == "support" else MEETING), **change}
    return json.dumps({k: v for k, v in rec.items() if v is not ...})


#: (mode, the third line of the file, the message after "FILE:3: "): a good record on line 1, a blank line 2.
BAD_LINES = {
    # nested too deeply: never a RecursionError
    "deep-array": ("support", DEEP, "arrays and objects nested more than 64 levels deep"),
    "deep-inside-a-field": ("support", _bad_line("support")[:-1] + ', "extra": ' + DEEP + "}",
                            "arrays and objects nested more than 64 levels deep"),
    "deep-65-levels": ("meeting", _bad_line("meeting", query=json.loads("[" * 65 + "]" * 65)),
                       "arrays and objects nested more than 64 levels deep"),
    # not an object
    "array": ("support", '["a", "sad", "It rained."]', "not a JSON object (a record is {...}), got an array"),
    "string": ("support", '"It rained."', "not a JSON object (a record is {...}), got a string"),
    "number": ("meeting", "42", "not a JSON object (a record is {...}), got a number"),
    # a field of the wrong type
    "id-boolean": ("support", _bad_line("support", id=True), "id must be a non-empty string or number, got a boolean"),
    "id-object": ("meeting", _bad_line("meeting", id={"n": 1}),
                  "id must be a non-empty string or number, got an object"),
    "emotion-number": ("support", _bad_line("support", emotion=5), "emotion must be a string, got a number"),
    "situation-array": ("support", _bad_line("support", situation=["It rained."]),
                        "situation must be a string, got an array"),
    "first-utterance-null": ("support", _bad_line("support", first_utterance=None),
                             "first_utterance must be a string, got null"),
    "domain-array": ("meeting", _bad_line("meeting", domain=["Product"]), "domain must be a string, got an array"),
    "turns-string": ("meeting", _bad_line("meeting", turns="Chair: Welcome."),
                     "turns must be a list of {speaker, content} objects, got a string"),
    "turn-string": ("meeting", _bad_line("meeting", turns=[{"speaker": "A", "content": "x"}, "B: y"]),
                    "turns[1] must be a {speaker, content} object, got a string"),
    "turn-speaker-number": ("meeting", _bad_line("meeting", turns=[{"speaker": 7, "content": "x"}]),
                            "turns[0].speaker must be a string, got a number"),
    "turn-content-null": ("meeting", _bad_line("meeting", turns=[{"speaker": "A", "content": None}]),
                          "turns[0].content must be a string, got null"),
    "query-object": ("meeting", _bad_line("meeting", query={"text": "Why?"}), "query must be a string, got an object"),
    # the first bad field in the documented order (support: id, emotion, situation, first_utterance)
    "first-bad-field": ("support", _bad_line("support", first_utterance=3, situation="a\x00b", emotion=None),
                        "situation contains the control character U+0000"),
    # control characters (the gateway refuses them) and unpaired surrogates (not text)
    "control-escape-in-opening": ("support", _bad_line("support", first_utterance="hi\x1b[2J"),
                                  "first_utterance contains the control character U+001B; only tab, newline and "
                                  "carriage return are allowed"),
    "control-c1-in-emotion": ("support", _bad_line("support", emotion="sad\x85"),
                              "emotion contains the control character U+0085"),
    "control-in-id": ("support", _bad_line("support", id="a\x07"), "id contains the control character U+0007"),
    "control-in-turn": ("meeting", _bad_line("meeting", turns=[{"speaker": "A", "content": "ok"},
                                                               {"speaker": "B\x08", "content": "x"}]),
                        "turns[1].speaker contains the control character U+0008"),
    "control-del-in-query": ("meeting", _bad_line("meeting", query="Why?\x7f"),
                             "query contains the control character U+007F"),
    "surrogate": ("support", _bad_line("support", situation="x\ud800"),
                  "situation contains the unpaired surrogate U+D800"),
    # nothing visible where the gateway needs text
    "invisible-opening": ("support", _bad_line("support", first_utterance="\u200b\uffff "),
                          "the opening (first_utterance) is blank (no visible text)"),
    "blank-situation": ("support", _bad_line("support", situation=" \n"), "the situation is blank (no visible text)"),
    # a number Python does not convert
    "huge-number": ("support", _bad_line("support", id=...)[:-1] + ', "id": ' + "9" * 5000 + "}",
                    "not valid JSON (a number too long to read)"),
}


@pytest.mark.parametrize("case", list(BAD_LINES.values()), ids=list(BAD_LINES))
@pytest.mark.parametrize("verbatim", [True, False], ids=["main-job", "evaluation"])
def test_a_jsonl_record_that_cannot_be_used_names_file_line_and_first_bad_field(tmp_path, case, verbatim):
    mode, line, message = case
    p = tmp_path / "bad.jsonl"
    p.write_text(_bad_line(mode) + "\n\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError) as e:
        load_situations(p, mode, require_labels=False, verbatim=verbatim)
    assert type(e.value) is ValueError
    assert str(e.value).startswith(f"{p}:3: {message}"), str(e.value)


def test_a_line_that_is_not_utf8_names_its_line(tmp_path):
    p = tmp_path / "latin1.jsonl"
    escaped = json.dumps({**GOOD, "id": "b", "situation": "caf\u00e9"})  # ASCII, the accent as a \u escape: fine
    p.write_bytes(json.dumps(GOOD).encode() + b"\n" + escaped.encode() + b"\n"
                  + b'{"id": "c", "situation": "caf\xe9", "first_utterance": "Hi."}\n')  # Latin-1
    with pytest.raises(ValueError, match=rf"^{p}:3: not UTF-8 text \(invalid continuation byte at byte 29 of the "):
        load_situations(p, "support", require_labels=False)


def test_tab_newline_and_an_absent_or_null_label_are_accepted(tmp_path):
    p = write_jsonl(tmp_path / "s.jsonl", {**GOOD, "first_utterance": "one\ttwo\r\nthree", "emotion": None})
    (s,) = load_situations(p, "support", require_labels=False, verbatim=True)
    assert (s.opening, s.emotion, s.split) == ("one\ttwo\r\nthree", "", "")
    p = write_jsonl(tmp_path / "m.jsonl", {**MEETING, "domain": None, "turns": [{"speaker": "A", "content": "a\nb"},
                                                                               {}]})
    (m,) = load_situations(p, "meeting", require_labels=False)
    assert m.split == "" and m.context == (("A", "a\nb"), ("Speaker", ""))


def test_a_qmsum_file_nested_too_deeply_is_refused(tmp_path):
    (tmp_path / "deep.json").write_text(DEEP, encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'deep.json'}: arrays and objects nested more than 64 levels"):
        load_situations(tmp_path / "deep.json", "meeting")


def test_a_csv_field_over_the_csv_limit_names_its_line(tmp_path):
    p = tmp_path / "big.csv"
    p.write_text(",".join(ED_HEADER) + "\n" + "a,1,sad," + "x" * 200_000 + ",1,Hello.,,\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{p}:2: not a readable CSV row \(field larger than field limit"):
        load_situations(p, "support")



def test_main_job_requests_carry_the_situation():
    sit = load_situations(QMSUM / "covid_901.json", "meeting")[0]
    start = start_request(Situation("x" * 300, "", sit.opening, sit.situation, "", sit.context), "meeting")
    assert start.mode == cpb.MODE_MEETING and start.source_id == "x" * 256
    assert [(c.speaker, c.content) for c in start.context] == list(sit.context)
    sp = selfplay_request("conv-1", load_situations(ED_CSV, "support")[1], agent_turns=4, seed=9)
    assert (sp.conversation_id, sp.agent_turns, sp.seed) == ("conv-1", 4, 9)
    assert sp.opening_text.startswith('"Ouch"') and (sp.user.situation, sp.user.emotion) == (
        "A spider ran across my pillow last night.", "terrified")


# ------------------------------------------------------------------------------------------ the shared data

def _digest(rows: list) -> str:
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode("utf-8")).hexdigest()


#: SHA-256 of the shared JSONL files as the evaluation read them before the reader moved to core (mascot.eval.data),
#: and of the main job's requests built from them (mascot.app.runjob.read_records): the same records must come back.
EVAL_VIEW = {"support": (312, "fbcdf91d0dd5bceda30226a5f88a9ee02d56e5080e3a42334d288ddb09c1f9b5"),
             "meeting": (21, "fd93eb49e24b6ed70f2a62230250da102031e8f05fc02858fa05546237793708")}
MAIN_JOB_VIEW = {"support": "3609634b2e716a0cb878848701fd2f636c7d1c918f1ff0fd7dd03812877be7e6",
                 "meeting": "6dc21bf0e2a741c0b93e1d79b64422ecd22e2ac11737dcfbc674013120ea478a"}
SHARED_FILES = {"support": "empathetic_dialogues/test_situations.jsonl", "meeting": "qmsum/meeting_excerpts.jsonl"}


@pytest.mark.parametrize("mode", ["support", "meeting"])
def test_shared_jsonl_loads_the_same_records_as_before(shared_data, mode):
    path = shared_data / SHARED_FILES[mode]
    sits = load_situations(path, mode)
    rows = [[s.id, s.split, s.opening, s.situation, s.emotion, [list(c) for c in s.context]] for s in sits]
    assert (len(sits), _digest(rows)) == EVAL_VIEW[mode]
    first = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    assert sits[0].id == first["id"]
    requests = []
    for s in load_situations(path, mode, require_labels=False, verbatim=True):
        a, b = start_request(s, mode), selfplay_request("c", s, 3, 0)
        requests.append([a.source_id, a.mode, [[c.speaker, c.content] for c in a.context], b.opening_text,
                         b.user.situation, b.user.emotion])
    assert _digest(requests) == MAIN_JOB_VIEW[mode]
    assert requests[0][3] == first["first_utterance" if mode == "support" else "query"]  # as written


# ------------------------------------------------------------------------------------------ splits

def test_split_writes_three_disjoint_parts_in_file_order(tmp_path):
    from mascot.core.situations import split_situations

    recs = [{"id": f"s{i}", "emotion": "sad", "situation": f"situation {i}", "first_utterance": f"opening {i}",
             "extra": i} for i in range(10)]
    src = write_jsonl(tmp_path / "all.jsonl", *recs)
    assert split_situations(src, "support", tmp_path / "out", eval_n=4, gate_n=2) == {"eval": 4, "gate": 2,
                                                                                        "train": 4}
    parts = {n: [json.loads(x) for x in (tmp_path / "out" / f"{n}.jsonl").read_text().splitlines()]
             for n in ("eval", "gate", "train")}
    assert [r["id"] for r in parts["eval"]] == ["s0", "s1", "s2", "s3"]
    assert [r["id"] for r in parts["gate"]] == ["s4", "s5"]
    assert [r["id"] for r in parts["train"]] == ["s6", "s7", "s8", "s9"]
    assert parts["eval"][0] == recs[0]  # records kept as written, extra fields included
    # the evaluation part reads as the first N of the whole file do
    assert load_situations(tmp_path / "out" / "eval.jsonl", "support") == load_situations(src, "support", 4)


def test_split_converts_the_original_formats_to_jsonl(tmp_path):
    from mascot.core.situations import split_situations

    assert split_situations(ED_CSV, "support", tmp_path / "ed", eval_n=1, gate_n=1) == {"eval": 1, "gate": 1,
                                                                                        "train": 1}
    assert load_situations(tmp_path / "ed" / "train.jsonl", "support") == load_situations(ED_CSV, "support")[2:]
    n = len(load_situations(QMSUM, "meeting"))
    counts = split_situations(QMSUM, "meeting", tmp_path / "qm", eval_n=1, gate_n=0)
    assert counts == {"eval": 1, "gate": 0, "train": n - 1}
    assert (tmp_path / "qm" / "gate.jsonl").read_text() == ""
    assert load_situations(tmp_path / "qm" / "eval.jsonl", "meeting") == load_situations(QMSUM, "meeting", 1)


@pytest.mark.parametrize("eval_n, gate_n, message", [
    (3, 0, "has 3 records: nothing is left for training after 3 for evaluation and 0 for the gate"),
    (2, 1, "nothing is left for training after 2 for evaluation and 1 for the gate"),
    (0, 1, "the evaluation part needs at least 1 record"),
    (1, -1, "the gate part 0 or more"),
])
def test_split_refuses_sizes_that_leave_no_training_part_and_writes_nothing(tmp_path, eval_n, gate_n, message):
    from mascot.core.situations import split_situations

    with pytest.raises(ValueError, match=message):
        split_situations(ED_CSV, "support", tmp_path / "out", eval_n=eval_n, gate_n=gate_n)
    assert not (tmp_path / "out").exists()


def test_split_refuses_a_bad_record_before_writing(tmp_path):
    from mascot.core.situations import split_situations

    good = {"id": "a", "emotion": "sad", "situation": "s", "first_utterance": "o"}
    src = write_jsonl(tmp_path / "bad.jsonl", good, {**good, "id": "b", "first_utterance": "  "}, {**good, "id": "c"})
    with pytest.raises(ValueError, match=r"bad.jsonl:2: the opening \(first_utterance\) is blank"):
        split_situations(src, "support", tmp_path / "out", eval_n=1, gate_n=0)
    src = write_jsonl(tmp_path / "dup.jsonl", good, {**good, "id": "b"}, good)
    with pytest.raises(ValueError, match="dup.jsonl:3: duplicate id 'a'"):
        split_situations(src, "support", tmp_path / "out", eval_n=1, gate_n=0)
    assert not (tmp_path / "out").exists()


def test_data_split_command_prints_the_parts_and_refuses_with_one_line(tmp_path):
    from typer.testing import CliRunner

    from mascot.cli import app

    r = CliRunner().invoke(app, ["data", "split", str(ED_CSV), "--out", str(tmp_path / "o"), "--eval", "1",
                                 "--gate", "1"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert {k: v["records"] for k, v in got.items()} == {"eval": 1, "gate": 1, "train": 1}
    assert got["train"]["file"] == str(tmp_path / "o" / "train.jsonl")
    r = CliRunner().invoke(app, ["data", "split", str(ED_CSV), "--out", str(tmp_path / "p"), "--eval", "3"])
    assert r.exit_code == 1 and "cannot split:" in r.output and "nothing is left for training" in r.output
    r = CliRunner().invoke(app, ["data", "split", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "p")])
    assert r.exit_code == 1 and "does not exist" in r.output
    r = CliRunner().invoke(app, ["data", "split", str(ED_CSV), "--out", str(tmp_path / "p"), "--mode", "chat"])
    assert r.exit_code == 2 and "is not one of" in r.output and "support" in r.output
    r = CliRunner().invoke(app, ["data", "split", str(ED_CSV), "--out", ""])
    assert r.exit_code == 2 and "--out must name a folder" in r.output
    (tmp_path / "afile").write_text("x")
    r = CliRunner().invoke(app, ["data", "split", str(ED_CSV), "--out", str(tmp_path / "afile" / "sub"), "--eval",
                                 "1", "--gate", "0"])
    assert r.exit_code == 1 and f"cannot write to {tmp_path / 'afile' / 'sub'}" in r.output.replace("\n", "")
