"""Situations: what one conversation of the main job, the evaluation, the promote gate or training starts from.

The one reader of situation files (:func:`load_situations`). The format follows the path:

* ``*.jsonl``: our records, one JSON object a line. Support mode: ``id``, ``emotion`` (one of the 32
  EmpatheticDialogues labels), ``situation``, ``first_utterance``. Meeting mode: ``id``, ``domain`` (Academic,
  Committee or Product), ``turns`` (``[{speaker, content}]``), ``query``.
* ``*.csv``: an EmpatheticDialogues split as released (``train.csv``, ``valid.csv``, ``test.csv`` of
  ``empatheticdialogues.tar.gz``, Rashkin et al. 2019), support mode. One situation per conversation (``conv_id``):
  ``id`` = conv_id, ``emotion`` = the ``context`` field, ``situation`` = ``prompt``, ``first_utterance`` = the
  ``utterance`` of the conversation's first row (``utterance_idx`` 1, the speaker who wrote the prompt), with the
  dataset's ``_comma_`` placeholder decoded to ``,``: the same record as our JSONL. The files quote nothing (a comma in
  a text is written ``_comma_``), so rows are split at every comma (``csv`` with ``QUOTE_NONE``: a ``"`` is text);
  a row needs the 8 header fields, and fields past them (the test and valid splits carry a 9th, the inline
  candidates, and a stray comma in ``selfeval`` or ``tags`` adds more) are ignored: only the first six are read.
* ``*.json``: one QMSum meeting as released (``data/ALL/<split>/<meeting>.json``, Zhong et al. 2021), meeting mode; a
  directory: every ``*.json`` meeting directly in it, by file name. One situation per entry of
  ``specific_query_list``: ``query`` = the query, ``turns`` = :data:`MEETING_EXCERPT_TURNS` turns of
  ``meeting_transcripts`` from the first turn of its ``relevant_text_span`` (the size of our JSONL excerpts; a longer
  span is covered in part, as there), ``id`` = ``qmsum-<split>-<meeting>-q<k>`` (``<split>`` the folder name when it
  is train, val or test; k counts from 1). ``domain`` is the folder name when one of the path's folders is
  Academic, Committee or Product (the per-domain folders of the release), else follows the meeting id: ICSI meetings
  (``Bmr006``) are Academic, AMI meetings (``ES2004b``) Product, the others (``covid_4``) Committee.
  ``general_query_list`` (whole-meeting questions an excerpt cannot answer) and ``topic_list`` (no question) are not
  used.

Every record then passes the same checks (:func:`load_situations`): each field of the right JSON type, no control
character (other than tab, newline and carriage return: the gateway refuses them) or unpaired surrogate in its texts,
and an opening with visible text.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.core.dialogue import CONTROL_CHARS, has_visible_text
from mascot.core.enums import enum_names
from mascot.core.files import MAX_JSON_DEPTH, iter_jsonl_records, json_depth_over, json_type

#: ED emotion label → valence bucket (MIME grouping as coded in Sahandfer/CEM, with a neutral bucket carved out).
VALENCE: dict[str, str] = {
    **{e: "positive" for e in ("confident", "joyful", "grateful", "impressed", "proud", "excited", "trusting",
                               "hopeful", "faithful", "content", "caring")},
    **{e: "neutral" for e in ("surprised", "anticipating", "prepared", "nostalgic", "sentimental")},
    **{e: "negative" for e in ("afraid", "angry", "annoyed", "anxious", "apprehensive", "ashamed", "devastated",
                               "disappointed", "disgusted", "embarrassed", "furious", "guilty", "jealous", "lonely",
                               "sad", "terrified")},
}
SUPPORT_SPLITS = ("positive", "neutral", "negative")
MEETING_SPLITS = ("academic", "committee", "product")
MODES = enum_names(cpb.Mode)
#: Turns of a QMSum meeting one excerpt holds (our JSONL excerpts hold the first 40 turns of a meeting).
MEETING_EXCERPT_TURNS = 40
#: What the simulated user of a meeting situation is told about themselves.
MEETING_SITUATION = "You attended this meeting and want to know: {query}"

ED_HEADER = ("conv_id", "utterance_idx", "context", "prompt", "speaker_idx", "utterance", "selfeval", "tags")
_ICSI_ID = re.compile(r"^B[a-z]{2}\d{3}$")
_AMI_ID = re.compile(r"^(ES|IS|TS|EN|IB|IN)\d{4}[a-z]?$")
_QMSUM_SPLITS = ("train", "val", "test")
#: Unpaired surrogates (a JSON ``\\ud800`` escape without its pair): text that cannot be sent as UTF-8.
_SURROGATES = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Situation:
    """One situation.

    Attributes:
        id: The record id (stable across runs; used for overlap checks and as the conversation's ``source_id``).
        split: Valence bucket (support) or lower-case domain (meeting); "" when the record has no known label and
            labels were not required.
        opening: The user's first message (ED first utterance, or the QMSum query).
        situation: What the simulated user is told about themselves.
        emotion: ED emotion label ('' in meeting mode).
        context: Seed context ``(speaker, content)`` (the meeting excerpt; empty in support mode).
    """

    id: str
    split: str
    opening: str
    situation: str
    emotion: str = ""
    context: tuple[tuple[str, str], ...] = field(default_factory=tuple)


def meeting_situation(query: str) -> str:
    """The simulated user's situation for a meeting question (:data:`MEETING_SITUATION`)."""
    return MEETING_SITUATION.format(query=query)


def load_situations(path: str | Path, mode: str, limit: int | None = None, *, require_labels: bool = True,
                    verbatim: bool = False) -> list[Situation]:
    """Read the first ``limit`` situations of ``path`` (format by suffix: see the module docstring), in file order.

    Args:
        mode: ``support`` or ``meeting``.
        limit: At most this many (>= 1); None for all.
        require_labels: Refuse a record without a known label (an ED emotion, a QMSum domain): the evaluation splits
            by them. False (the main job, the promote gate) takes any record and leaves ``split`` "" when the label
            is missing or unknown.
        verbatim: Keep the texts exactly as the file has them (what the main job and the promote gate send);
            False strips surrounding whitespace from the texts and lower-cases the emotion (the evaluation and
            training).

    Raises:
        FileNotFoundError: no such file or directory.
        ValueError: an unknown format, a format of the other mode, or bad input: a line or row that does not parse
            (not UTF-8, not JSON, arrays and objects nested too deeply, not an object), lacks a field, has a field
            of the wrong type, a text with a control character (other than tab, newline, carriage return) or an
            unpaired surrogate, a blank opening or situation, a label outside the known ones (with
            ``require_labels``), a repeated id, a limit below 1, or no situation at all. The message names the file,
            the line or row (1-based) and the first bad field, in the record's documented field order.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be support or meeting, got {mode!r}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 (or None for all), got {limit}")
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"situations file {p} does not exist")
    out: list[Situation] = []
    for _rec, sit in _checked(p, mode, require_labels, verbatim):
        out.append(sit)
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise ValueError(f"{p}: no records")
    return out


def _checked(p: Path, mode: str, labels: bool, verbatim: bool) -> Iterator[tuple[dict, Situation]]:
    """``(record, situation)`` of every record of ``p`` in file order, each checked (:func:`_situation`, ids unique).

    Raises:
        ValueError: as :func:`load_situations` says (text that is not UTF-8 included).
    """
    seen: set[str] = set()
    try:
        for where, rec in _records(p, mode, labels):
            sit = _situation(rec, where, mode, labels, verbatim)
            if sit.id in seen:
                raise ValueError(f"{where}: duplicate id {sit.id!r}")
            seen.add(sit.id)
            yield rec, sit
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _records(p: Path, mode: str, labels: bool) -> Iterator[tuple[str, dict]]:
    """``(where, record)`` in our JSONL record shape, from any of the formats."""
    if p.is_dir():
        files = sorted(f for f in p.glob("*.json") if f.is_file())
        if not files:
            raise ValueError(f"{p}: no QMSum .json meeting file in this directory (pass a split folder such as "
                             "data/ALL/test)")
        _mode_of(p, "meeting", mode)
        for f in files:
            yield from _qmsum_meeting(f)
        return
    suffix = p.suffix.lower()
    if suffix == ".jsonl":
        label = ("emotion",) if mode == "support" else ("domain",)
        fields = ("situation", "first_utterance") if mode == "support" else ("turns", "query")
        need = ("id", *label, *fields) if labels else ("id", *fields)
        for n, rec in iter_jsonl_records(p, need, f"--mode {mode}"):
            yield f"{p}:{n}", rec
    elif suffix == ".csv":
        _mode_of(p, "support", mode)
        yield from _ed_conversations(p)
    elif suffix == ".json":
        _mode_of(p, "meeting", mode)
        yield from _qmsum_meeting(p)
    else:
        raise ValueError(f"{p}: unknown situations format {p.suffix or '(no suffix)'!r}; use .jsonl (our records), "
                         ".csv (EmpatheticDialogues), or .json or a directory of .json files (QMSum)")


def _mode_of(p: Path, fmt_mode: str, mode: str) -> None:
    if mode != fmt_mode:
        what = "an EmpatheticDialogues .csv holds" if fmt_mode == "support" else "QMSum meetings hold"
        raise ValueError(f"{p}: {what} {fmt_mode} situations, not {mode} ones (use --mode {fmt_mode})")


def _ed_text(s: str) -> str:
    return s.replace("_comma_", ",")


def _ed_conversations(p: Path) -> Iterator[tuple[str, dict]]:
    """One record per conversation of an EmpatheticDialogues CSV (rows of a conversation are consecutive)."""
    with open(p, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, quoting=csv.QUOTE_NONE)
        rows = _csv_rows(reader, p)
        header = next(rows, None)
        if header is None:
            raise ValueError(f"{p}: empty file: an EmpatheticDialogues CSV starts with the header "
                             f"{','.join(ED_HEADER)}")
        if tuple(h.strip() for h in header[:len(ED_HEADER)]) != ED_HEADER:
            raise ValueError(f"{p}:1: not an EmpatheticDialogues CSV: the header is {','.join(header)[:200]!r}; "
                             f"it must be {','.join(ED_HEADER)}")
        conv: tuple[str, dict] | None = None  # (where, record) of the conversation being read
        for row in rows:
            n = reader.line_num
            if not row or not "".join(row).strip():
                continue
            if len(row) < len(ED_HEADER):
                raise ValueError(f"{p}:{n}: {len(row)} comma-separated fields; an EmpatheticDialogues row has "
                                 f"{len(ED_HEADER)} ({', '.join(ED_HEADER)})")
            conv_id, idx = row[0].strip(), row[1].strip()
            if not conv_id:
                raise ValueError(f"{p}:{n}: conv_id is empty")
            if not idx.isdigit():
                raise ValueError(f"{p}:{n}: utterance_idx {idx!r} is not a number")
            if conv is not None and conv[1]["id"] == conv_id:
                if int(idx) < conv[1]["_idx"]:  # the opening is the conversation's lowest utterance_idx (1)
                    conv[1].update(first_utterance=_ed_text(row[5]), _idx=int(idx))
                continue
            if conv is not None:
                yield conv[0], _without_idx(conv[1])
            conv = (f"{p}:{n}", {"id": conv_id, "emotion": row[2], "situation": _ed_text(row[3]),
                                 "first_utterance": _ed_text(row[5]), "_idx": int(idx)})
        if conv is not None:
            yield conv[0], _without_idx(conv[1])


def _csv_rows(reader: Any, p: Path) -> Iterator[list[str]]:
    """The rows of ``reader``; a row the csv module cannot read (a field over its size limit) is a ValueError naming
    the file and line."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise ValueError(f"{p}:{reader.line_num}: not a readable CSV row ({e})") from None
        yield row


def _without_idx(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k != "_idx"}


def _qmsum_domain(p: Path, meeting_id: str) -> str:
    for part in reversed(p.parent.parts):
        if part.lower() in MEETING_SPLITS:
            return part.lower()
    if _ICSI_ID.match(meeting_id):
        return "academic"
    if _AMI_ID.match(meeting_id):
        return "product"
    return "committee"


def _qmsum_meeting(p: Path) -> Iterator[tuple[str, dict]]:
    """One record per specific query of a QMSum meeting file (the module docstring says how)."""
    too_deep = f"{p}: arrays and objects nested more than {MAX_JSON_DEPTH} levels deep"
    text = p.read_text(encoding="utf-8")  # UnicodeDecodeError: _checked names the file
    try:
        meeting = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}:{e.lineno}: not valid JSON ({e.msg})") from None
    except RecursionError:  # the decoder recurses once per level
        raise ValueError(too_deep) from None
    except ValueError:  # an integer of more digits than Python converts (4300)
        raise ValueError(f"{p}: not valid JSON (a number too long to read)") from None
    if json_depth_over(meeting, MAX_JSON_DEPTH):
        raise ValueError(too_deep)
    if not isinstance(meeting, dict) or not isinstance(meeting.get("meeting_transcripts"), list):
        raise ValueError(f"{p}: not a QMSum meeting (no meeting_transcripts list)")
    turns = meeting["meeting_transcripts"]
    for i, t in enumerate(turns):
        if not (isinstance(t, dict) and isinstance(t.get("speaker"), str) and isinstance(t.get("content"), str)):
            raise ValueError(f"{p}: meeting_transcripts[{i}] is not a {{speaker, content}} object of strings")
    queries = meeting.get("specific_query_list", [])
    if not isinstance(queries, list):
        raise ValueError(f"{p}: specific_query_list is not a list")
    split = p.parent.name.lower() if p.parent.name.lower() in _QMSUM_SPLITS else ""
    prefix = "-".join(x for x in ("qmsum", split, p.stem) if x)
    domain = _qmsum_domain(p, p.stem)
    for k, q in enumerate(queries):
        where = f"{p}: specific_query_list[{k}]"
        if not isinstance(q, dict) or not isinstance(q.get("query"), str):
            raise ValueError(f"{where}: not an object with a query string")
        start = _span_start(q.get("relevant_text_span"), len(turns), where)
        yield where, {"id": f"{prefix}-q{k + 1}", "domain": domain, "query": q["query"],
                      "turns": turns[start:start + MEETING_EXCERPT_TURNS]}


def _span_start(spans: object, n_turns: int, where: str) -> int:
    """The first turn of ``relevant_text_span`` (``[[start, end], ...]``, turn indices as ints or digit strings)."""
    try:
        pairs = [(int(a), int(b)) for a, b in spans]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise ValueError(f"{where}.relevant_text_span: not a list of [start, end] turn indices") from None
    if not pairs:
        raise ValueError(f"{where}.relevant_text_span: empty")
    start = min(a for a, _ in pairs)
    if not 0 <= start < n_turns or any(b < a for a, b in pairs):
        raise ValueError(f"{where}.relevant_text_span: {spans} is outside the meeting's {n_turns} turns")
    return start


def _text(rec: dict, key: str, where: str, verbatim: bool, default: object = None) -> str:
    v = rec.get(key, default)
    if not isinstance(v, str):
        raise ValueError(f"{where}: {key} must be a string, got {json_type(v)}")
    return v if verbatim else v.strip()


def _check_chars(v: str, field: str, where: str) -> None:
    """Refuse text the gateway would refuse or cannot send: a control character (:data:`CONTROL_CHARS`) or an
    unpaired surrogate."""
    m = CONTROL_CHARS.search(v)
    if m:
        raise ValueError(f"{where}: {field} contains the control character U+{ord(m.group()):04X}; only tab, newline "
                         "and carriage return are allowed")
    m = _SURROGATES.search(v)
    if m:
        raise ValueError(f"{where}: {field} contains the unpaired surrogate U+{ord(m.group()):04X} (a \\u escape "
                         "without its pair); it is not text")


def _check_string(rec: dict, key: str, where: str, optional: bool = False) -> None:
    """``rec[key]`` is a string without bad characters (:func:`_check_chars`); ``optional``: or absent, or null."""
    v = rec.get(key)
    if optional and v is None:
        return
    if not isinstance(v, str):
        raise ValueError(f"{where}: {key} must be a string, got {json_type(v)}")
    _check_chars(v, key, where)


def _check_record(rec: dict, where: str, mode: str) -> None:
    """The types and characters of a record in our JSONL shape, field by field in the documented order (support:
    ``id``, ``emotion``, ``situation``, ``first_utterance``; meeting: ``id``, ``domain``, ``turns``, ``query``);
    raises ValueError naming the first bad field."""
    rid = rec.get("id")
    if not isinstance(rid, (str, int)) or isinstance(rid, bool) or not str(rid).strip():
        got = "" if isinstance(rid, str) else f", got {json_type(rid)}"
        raise ValueError(f"{where}: id must be a non-empty string or number{got}")
    _check_chars(str(rid), "id", where)
    if mode == "support":
        _check_string(rec, "emotion", where, optional=True)
        _check_string(rec, "situation", where)
        _check_string(rec, "first_utterance", where)
        return
    _check_string(rec, "domain", where, optional=True)
    turns = rec.get("turns")
    if not isinstance(turns, list):
        raise ValueError(f"{where}: turns must be a list of {{speaker, content}} objects, got {json_type(turns)}")
    for i, t in enumerate(turns):
        if not isinstance(t, dict):
            raise ValueError(f"{where}: turns[{i}] must be a {{speaker, content}} object, got {json_type(t)}")
        for key in ("speaker", "content"):
            v = t.get(key, "")
            if not isinstance(v, str):
                raise ValueError(f"{where}: turns[{i}].{key} must be a string, got {json_type(v)}")
            _check_chars(v, f"turns[{i}].{key}", where)
    _check_string(rec, "query", where)


def _situation(rec: dict, where: str, mode: str, labels: bool, verbatim: bool) -> Situation:
    """A :class:`Situation` from one record in our JSONL shape (checks as :func:`load_situations` says)."""
    _check_record(rec, where, mode)
    sid = str(rec["id"])
    if mode == "support":
        situation = _text(rec, "situation", where, verbatim)
        if not has_visible_text(situation):
            raise ValueError(f"{where}: the situation is blank (no visible text)")
        opening = _text(rec, "first_utterance", where, verbatim)
        emotion = rec.get("emotion") or ""
        key = emotion.strip().lower()
        if labels and key not in VALENCE:
            raise ValueError(f"{where}: emotion {rec.get('emotion')!r} is not one of the 32 EmpatheticDialogues "
                             "labels")
        split = VALENCE.get(key, "")
        emotion = emotion if verbatim else key
        context: tuple[tuple[str, str], ...] = ()
    else:
        raw_domain = rec.get("domain")
        key = raw_domain.strip().lower() if isinstance(raw_domain, str) else ""
        if labels and key not in MEETING_SPLITS:
            raise ValueError(f"{where}: domain {raw_domain!r} is not Academic, Committee or Product")
        split = key if key in MEETING_SPLITS else ""
        context = tuple((t.get("speaker", "Speaker"), t.get("content", "")) for t in rec["turns"])
        opening = _text(rec, "query", where, verbatim)
        situation = meeting_situation(opening)
        emotion = ""
    if not has_visible_text(opening):
        raise ValueError(f"{where}: the opening ({'first_utterance' if mode == 'support' else 'query'}) is blank "
                         "(no visible text)")
    return Situation(sid, split, opening, situation, emotion, context)


#: The parts :func:`split_situations` writes, in the order they take records from the file.
SPLIT_PARTS = ("eval", "gate", "train")


def split_situations(path: str | Path, mode: str, out_dir: str | Path, *, eval_n: int, gate_n: int) -> dict[str, int]:
    """Write three disjoint situation files in our JSONL from any readable file: ``eval.jsonl`` (the first
    ``eval_n`` records, in file order), ``gate.jsonl`` (the next ``gate_n``, for the PromoteAdapter gate) and
    ``train.jsonl`` (every later record, for training). By position, so the evaluation part is the "first N
    situations" that ``--limit N`` on the whole file reads, and a table measured that way before training compares
    with one measured after. Each record is checked as :func:`load_situations` checks it (labels not required) and
    written in our JSONL shape (an EmpatheticDialogues CSV or QMSum JSON comes out as JSONL). Files are replaced
    atomically; nothing is written when any check fails.

    Returns:
        ``{"eval": n, "gate": n, "train": n}``: records written to each part.

    Raises:
        FileNotFoundError: no such input file.
        ValueError: a bad record (as :func:`load_situations`), a negative size, or a file with no record left for
            training after the evaluation and gate parts (the message gives the count).
        OSError: ``out_dir`` cannot be made or written (the message names it).
    """
    from mascot.core.files import write_jsonl

    if eval_n < 1 or gate_n < 0:
        raise ValueError(f"the evaluation part needs at least 1 record and the gate part 0 or more, got "
                         f"eval {eval_n}, gate {gate_n}")
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"situations file {p} does not exist")
    records = [rec for rec, _sit in _checked(p, mode, False, True)]
    if len(records) <= eval_n + gate_n:
        raise ValueError(f"{p} has {len(records)} records: nothing is left for training after {eval_n} for "
                         f"evaluation and {gate_n} for the gate (lower --eval or --gate)")
    parts = {"eval": records[:eval_n], "gate": records[eval_n:eval_n + gate_n], "train": records[eval_n + gate_n:]}
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name in SPLIT_PARTS:
            write_jsonl(out / f"{name}.jsonl", parts[name])
    except OSError as e:  # a plain OSError: not to be read as a missing input file
        raise OSError(f"cannot write to {out}: {e.strerror or e}") from None
    return {name: len(parts[name]) for name in SPLIT_PARTS}
