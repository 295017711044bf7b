"""Speaker and simulated-user prompt assembly, and the visible-text filter.

Prompt: persona card (system), then the history with speaker tags, then the directive (Action and Tone)
as the final instruction. A speaker sees only its own turns as ``assistant``; everyone else appears as
tagged user-side messages (guard against role flipping). Replies are cut at
the first foreign speaker tag; a leading ``<think>...</think>`` block is split off and never shown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from mascot.core.dialogue import HistoryTurn
from mascot.core.formatting import meeting_transcript
from mascot.core.personas import PersonaCard

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

PERSONA_TEMPLATE = ("You are {name}, the {role}, one of a small group of helpers talking with a person. {goal} "
                    "You {allowed}. You avoid {forbidden}. Your style: {style}. Speak directly to the person in two "
                    "or three short sentences, at most {max_words} words, as {name} only.")

#: The director's instruction, appended to the speaker's system prompt.
DIRECTIVE_TEMPLATE = "Your task now: {action} Tone: {tone}."

USER_SIM_TEMPLATE = ("You are chatting with a few supportive helpers about something that happened to you. "
                     "What happened: {situation}\n{emotion_line}{personality}"
                     "Reply as yourself in one or two short sentences, in the first person (I, me, my). Talk about "
                     "your own situation and feelings; do not give advice, do not comfort the helpers, and do not "
                     "write a letter.")

GENERIC_AGENT_PROMPT = ("You are {name}, one of a small group of helpers talking with a person. Speak directly to "
                        "the person in two or three short sentences, at most {max_words} words, as {name} only.")


def generic_system_prompt(card: PersonaCard) -> str:
    """A persona-free system prompt (name and length only): the MASCOT-P ablation."""
    return GENERIC_AGENT_PROMPT.format(name=card.name, max_words=card.max_answer_words)


def persona_system_prompt(card: PersonaCard) -> str:
    """The persona card as a system prompt: name, role, goal, allowed and forbidden moves, style, length."""
    def join(xs: Sequence[str], last: str = "and") -> str:
        xs = [x.strip().rstrip(".") for x in xs if x.strip()]
        if not xs:
            return "-"
        return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + f" {last} " + xs[-1]
    goal = card.goal.strip()
    return PERSONA_TEMPLATE.format(name=card.name, role=card.role, goal=goal if goal.endswith(".") else goal + ".",
                                   allowed=join(card.allowed_moves), forbidden=join(card.forbidden_moves, "or"),
                                   style=join(card.style), max_words=card.max_answer_words)


def directive_text(name: str, action: str, tone: str) -> str:
    """The directive as the speaker reads it (:data:`DIRECTIVE_TEMPLATE`)."""
    action = action.strip()
    if action and action[-1] not in ".!?":
        action += "."
    return DIRECTIVE_TEMPLATE.format(name=name, action=action, tone=tone.strip().rstrip("."))


def _tag(turn: HistoryTurn, names: dict[str, str]) -> str:
    return "User" if turn.role == "user" else names.get(turn.persona_id, turn.persona_id)


def context_message(context: Sequence[tuple[str, str]]) -> dict[str, str]:
    """The seed context (meeting excerpt) as one user-side message."""
    return {"role": "user", "content": meeting_transcript(context)}


def _append_user(msgs: list[dict[str, str]], text: str) -> None:
    """Add user-side text, joining it to the previous message when that is user-side too (one block per gap
    between the speaker's own turns, which keeps a small model from answering each line separately)."""
    if msgs and msgs[-1]["role"] == "user":
        msgs[-1] = {"role": "user", "content": msgs[-1]["content"] + "\n\n" + text}
    else:
        msgs.append({"role": "user", "content": text})


def build_persona_messages(card: PersonaCard, history: Sequence[HistoryTurn], context: Sequence[tuple[str, str]],
                           action: str, tone: str, names: dict[str, str],
                           persona_prompt: bool = True) -> list[dict[str, str]]:
    """Chat messages for one persona reply.

    Layout: the persona card and then the director's instruction (:func:`directive_text`) as the system message;
    the seed context as a user message; then the history as a plain chat, the person's turns as ``user`` and every
    agent turn as ``assistant``, without speaker tags. Small chat models continue whatever format the last message
    shows: tagged lines or an instruction as the last user message are copied into the reply ("The Anchor: ...",
    "(The Beacon, it is your turn.)"); a plain chat with the instruction in the system text is answered as a chat.

    Args:
        card: The speaking persona.
        history: Visible history, oldest first.
        context: Seed context ``(speaker, content)``.
        action: Directive action.
        tone: Directive tone.
        names: ``{persona_id: display name}`` of the roster (kept for callers; tags are not shown).
        persona_prompt: False replaces the card with :func:`generic_system_prompt` (MASCOT-P).
    """
    system = persona_system_prompt(card) if persona_prompt else generic_system_prompt(card)
    msgs = [{"role": "system", "content": system + "\n\n" + directive_text(card.name, action, tone)}]
    if context:
        msgs.append(context_message(context))
    for t in history:
        msgs.append({"role": "user" if t.role == "user" else "assistant", "content": t.text})
    return msgs


def build_user_sim_messages(situation: str, emotion: str, personality: str, history: Sequence[HistoryTurn],
                            context: Sequence[tuple[str, str]], names: dict[str, str]) -> list[dict[str, str]]:
    """Chat messages for the simulated user's next turn: the person's own turns as
    ``assistant``, the helpers' turns as ``user`` messages (untagged, consecutive ones joined), so the model
    answers the helpers as the person."""
    system = USER_SIM_TEMPLATE.format(situation=situation.strip(),
                                      emotion_line=f"You feel {emotion}.\n" if emotion else "",
                                      personality=personality + "\n" if personality else "")
    msgs = [{"role": "system", "content": system}]
    if context:
        msgs.append(context_message(context))
    for t in history:
        if t.role == "user":
            msgs.append({"role": "assistant", "content": t.text})
        else:
            _append_user(msgs, t.text)
    if not history or history[-1].role == "user":
        _append_user(msgs, "Tell me a little more about what happened and how you feel.")
    return msgs


def stop_strings(own_name: str, roster_names: Sequence[str], user_tag: str = "User") -> tuple[str, ...]:
    """Stop sequences: a new line opening with another speaker's tag."""
    tags = [user_tag, "Director"] + [n for n in roster_names if n != own_name]
    return tuple(f"\n{t}:" for t in tags)


@dataclass
class VisibleTextFilter:
    """Split a streamed reply into thinking text and visible text, incrementally.

    Feed raw engine deltas to :meth:`feed`; it returns the visible deltas to forward. Rules:
    a reply that opens with ``<think>`` is thinking until ``</think>``; later in the reply, text between a
    ``<think>`` and its ``</think>`` (or the end, when it is never closed: e.g. cut by ``max_tokens``) is thinking
    too, and a stray ``</think>`` is dropped, so no tag and no thinking text is ever visible; the visible part loses
    a leading tag of its own speaker (``"The Anchor: "``) and is cut entirely when it opens with a foreign tag;
    leading and trailing whitespace never reach the client, so the joined deltas equal :attr:`visible`.

    Args:
        own_tag: The speaker's display name (its own tag is stripped).
        foreign_tags: Other speaker names (``User`` included) whose tag at the start cuts the reply.
    """

    own_tag: str
    foreign_tags: Sequence[str]
    think: str = ""
    visible: str = ""
    truncated: bool = False
    _buf: str = ""
    _state: str = "start"  # start -> (think ->) head -> body (<-> think_mid) | cut
    _pending_ws: str = ""
    _skip_ws: bool = False
    _head_len: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self._head_len = max([len(t) for t in (self.own_tag, *self.foreign_tags)] + [0]) + 2

    def feed(self, delta: str, final: bool = False) -> str:
        """Consume a raw delta; return the visible text to send now ('' when none)."""
        self._buf += delta
        out = ""
        while True:
            if self._state == "start":
                s = self._buf.lstrip()
                if s.startswith(THINK_OPEN):
                    self._buf = s[len(THINK_OPEN):]
                    self._state = "think"
                    continue
                if THINK_OPEN.startswith(s) and not final and s:
                    return out
                if not s and not final:
                    return out
                self._state = "head"
                continue
            if self._state == "think":
                k = self._buf.find(THINK_CLOSE)
                if k == -1:
                    if final:
                        self.think += self._buf
                        self._buf = ""
                        self._state = "body"
                    return out
                self.think += self._buf[:k]
                self._buf = self._buf[k + len(THINK_CLOSE):]
                self.think = self.think.strip()
                self._state = "head"
                continue
            if self._state == "head":
                s = self._buf.lstrip()
                if len(s) < self._head_len and not final and "\n" not in s:
                    return out
                low = s.lower()
                if any(low.startswith(t.lower() + ":") for t in self.foreign_tags):
                    self._state, self._buf, self.truncated = "cut", "", True
                    return out
                if low.startswith(self.own_tag.lower() + ":"):
                    s = s[len(self.own_tag) + 1:].lstrip()
                self._buf = s
                self._state = "body"
                continue
            if self._state == "body":
                if self._skip_ws:
                    self._buf = self._buf.lstrip()
                    self._skip_ws = not self._buf
                text, hold = self._pending_ws + self._buf, ""
                cut = min((k for k in (text.find(THINK_OPEN), text.find(THINK_CLOSE)) if k != -1), default=-1)
                if cut != -1:  # visible text up to a tag; then thinking (an opening tag) or more body (a stray close)
                    opening = text.startswith(THINK_OPEN, cut)
                    self._buf = text[cut + len(THINK_OPEN if opening else THINK_CLOSE):]
                    text = text[:cut]
                    self._state = "think_mid" if opening else "body"
                elif not final:  # hold back what may be the start of a tag split across deltas
                    hold = next((text[-n:] for n in range(len(THINK_CLOSE) - 1, 0, -1)
                                 if THINK_OPEN.startswith(text[-n:]) or THINK_CLOSE.startswith(text[-n:])), "")
                    text, self._buf = text[:len(text) - len(hold)], hold
                else:
                    self._buf = ""
                stripped = text.rstrip()
                self._pending_ws = text[len(stripped):]
                if not self.visible:
                    stripped = stripped.lstrip()
                self.visible += stripped
                out += stripped
                if cut == -1:
                    if final and self._buf:
                        continue
                    return out
                continue  # the whitespace before a thinking block is kept (pending) for the text after it
            if self._state == "think_mid":
                k = self._buf.find(THINK_CLOSE)
                if k == -1:
                    if final:
                        self.think = (self.think + "\n" + self._buf).strip()
                        self._buf, self._state = "", "body"
                    return out
                self.think = (self.think + "\n" + self._buf[:k]).strip()
                self._buf = self._buf[k + len(THINK_CLOSE):]
                self._skip_ws = bool(self._pending_ws)  # "a <think>..</think> b" reads "a b", not "a  b"
                self._state = "body"
                continue
            return out  # cut
