"""The feeling reply check on planted replies: what cheers or minimises bad news, condoles without a death or
sympathises with good news is refused; fitting replies pass (the servers: tests/integration/test_reply_guard.py)."""

import pytest

from mascot.core.feeling import feeling_mismatch, valence
from mascot.core.guard import GuardSettings, ReplyContext, check_reply

MISMATCHED = [
    # replies read by blind readers of held-out dialogues, and their kind
    ("My grandmother died of cancer last month.", "That's wonderful. I'll see you later.", "celebrates bad news"),
    ("I lost my swim trunks at the pool today, so embarrassing.", "I'm so sorry for your loss.",
     "condolences without a death"),
    ("I failed my exam and I feel terrible.", "Look on the bright side, there will be other exams.",
     "minimises bad news"),
    ("I failed my exam.", "That's wonderful news!", "celebrates bad news"),
    ("Our dog was put to sleep this morning.", "Congratulations on taking such a big step!", "celebrates bad news"),
    ("My husband left me last night and I can't stop crying.", "At least you have more free time now.",
     "minimises bad news"),
    ("I got the job I wanted!", "I'm so sorry to hear that.", "sympathy for good news"),
    ("We had a baby girl yesterday, we are over the moon!", "That must have been so painful for you.",
     "sympathy for good news"),
    # the demo's miss: a frightening event read as news to celebrate
    ("Me and my mom were at this grocery store recently and this guy started following us outside the store and "
     "then again inside the store it was so scary!", "It sounds like you have great news.", "celebrates bad news"),
    ("My car was stolen last night.", "That sounds exciting!", "celebrates bad news"),
    # a blind reader's marks on a 32-situation run with the check off
    ("my husband lost a job but i'm hoping he can find a full time job soon", "That's great news about finding a "
     "new job.", "celebrates bad news"),
    ("the real price of the tv was 399 usd. what a bummer", "That's wonderful!", "celebrates bad news"),
    # a second blind reader's marks on the same run with the check on (written for this test, same kinds)
    ("I was so disappointed, the restaurant lost our booking and we went home hungry.", "That's a great story.",
     "celebrates bad news"),
    ("She died before I could say goodbye, and I keep thinking about it.", "That's a great way to end the story.",
     "celebrates bad news"),
    ("Our car broke down on the motorway and we were stuck for hours, it was awful.",
     "This could be a great opportunity to slow down.", "minimises bad news"),
]
FITTING = [
    ("My dog died yesterday.", "I'm so sorry for your loss."),
    ("My grandmother passed away in her sleep.", "My condolences; she sounds like she was loved."),
    ("I failed my exam and I feel terrible.", "That must have been hard."),
    ("I failed my exam and I feel terrible.", "I'm glad you told me."),
    ("I got promoted today!", "Congratulations!"),
    ("I'm so excited, my sister is getting married next week!", "That's wonderful!"),
    ("I'm nervous about the wedding but happy.", "I'm sorry to hear you're nervous."),  # mixed: sympathy fits
    ("I finally finished my marathon!", "That must have been hard, but you did it."),
    ("I lost my keys again.", "That's frustrating. Where did you last see them?"),
    ("I got into the college I wanted!", "It sounds like you have great news."),
    ("I was so scared on the rollercoaster but I loved it.", "I'm so sorry to hear that, that sounds scary."),
    ("", "That's wonderful!"),  # nothing to fit: not checked
    ("My grandad told us how he met my gran at a dance in 1962.", "That's a lovely story."),
    ("I am moving to Spain for a new job next month, so excited!", "This could be a great opportunity for you."),
]


@pytest.mark.parametrize("user,reply,why", MISMATCHED)
def test_mismatched_feelings_are_refused(user, reply, why):
    assert feeling_mismatch(reply, user) == why
    assert check_reply(reply, ReplyContext(answers=user), GuardSettings()) == "feeling"


@pytest.mark.parametrize("user,reply", FITTING)
def test_fitting_replies_pass(user, reply):
    assert feeling_mismatch(reply, user) is None
    assert check_reply(reply, ReplyContext(answers=user), GuardSettings()) is None


def test_the_check_can_be_turned_off_and_valence_is_vader_compound():
    user, reply = MISMATCHED[0][:2]
    assert check_reply(reply, ReplyContext(answers=user), GuardSettings(feeling=False)) is None
    assert valence("I feel terrible and hopeless.") < -0.5 < 0.5 < valence("This is a wonderful, happy day!")
    assert valence("") == 0.0
