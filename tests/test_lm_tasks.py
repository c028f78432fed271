"""Long-context task generators: token formats and loss masks checked by parsing, oracle scores, bad input."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

from dynlab.lm.corpus import decode, encode
from dynlab.lm.task_run import _scores, score_batch
from dynlab.lm.tasks import BABI_KINDS, BabiTask, CopyingTask, PasskeyTask, make_task

FILLER = encode("~" * 5000)  # a filler no fact or key can be confused with


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _scored_text(batch, b: int) -> str:
    idx = torch.nonzero(batch.mask[b])[:, 0] + 1  # target i is token i + 1
    return decode(batch.tokens[b, idx])


def test_copying_format_and_mask():
    batch = CopyingTask().sample(_g(), 6, 12)
    assert batch.tokens.shape == (6, 2 * 12 + 3) and batch.mask.shape == (6, 2 * 12 + 2)
    for b in range(6):
        text = decode(batch.tokens[b])
        m = re.fullmatch(r"\$([a-z]{12})\|([a-z]{12})\.", text)
        assert m and m.group(1) == m.group(2)
        assert _scored_text(batch, b) == m.group(2)  # loss exactly on the copied half
    assert int(batch.mask.sum()) == 6 * 12


def test_generators_are_seeded():
    a, b = PasskeyTask(encode("abc " * 400)).sample(_g(3), 4, 200), PasskeyTask(encode("abc " * 400)).sample(_g(3), 4, 200)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.mask, b.mask)
    assert not torch.equal(a.tokens, PasskeyTask(encode("abc " * 400)).sample(_g(4), 4, 200).tokens)


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_passkey_format_depth_and_mask(depth):
    task = PasskeyTask(FILLER)
    length = 300
    batch = task.sample(_g(1), 5, length, depth)
    assert batch.tokens.shape == (5, length)
    n_filler = length - task.min_length()
    for b in range(5):
        text = decode(batch.tokens[b])
        m = re.fullmatch(r"(~*)The pass key is (\d{5})\. Remember it\. \2 is the pass key\. (~*) What is the pass key\? "
                         r"The pass key is (\d{5})\.", text)
        assert m, text
        assert m.group(2) == m.group(4) and 10000 <= int(m.group(2)) <= 99999
        assert len(m.group(1)) == round(depth * n_filler) and len(m.group(1)) + len(m.group(3)) == n_filler
        assert _scored_text(batch, b) == m.group(2)  # loss only on the key, not on the period


def _answer_from_text(text: str) -> tuple[str, str]:
    """Re-simulate the story from its sentences (independent of the generator) and answer its question."""
    where, holder, lying, hist = {}, {}, {}, {}
    for s in re.findall(r"(\w+ (?:went to|picked up|dropped) the \w+)\.", text.split(" Q: ")[0]):
        who, verb, what = re.fullmatch(r"(\w+) (went to|picked up|dropped) the (\w+)", s).groups()
        if verb == "went to":
            where[who] = what
            for o, h in holder.items():
                if h == who and hist[o][-1:] != [what]:
                    hist[o].append(what)
        elif verb == "picked up":
            holder[what] = who
            lying.pop(what, None)
            if hist.setdefault(what, [])[-1:] != [where[who]]:
                hist[what].append(where[who])
        else:
            del holder[what]
            lying[what] = where[who]
    question, answer = re.fullmatch(r".* Q: (.*\?) A: (\w+)\.", text, re.S).groups()
    if m := re.fullmatch(r"Where is (\w+)\?", question):
        name = m.group(1)
        return (where[name] if name in where else where[holder[name]]), answer
    if m := re.fullmatch(r"Where is the (\w+)\?", question):
        o = m.group(1)
        return (where[holder[o]] if o in holder else lying[o]), answer
    if m := re.fullmatch(r"Where was the (\w+) before the (\w+)\?", question):
        assert hist[m.group(1)][-1] == m.group(2)
        return hist[m.group(1)][-2], answer
    if m := re.fullmatch(r"Is (\w+) in the (\w+)\?", question):
        return ("yes" if where[m.group(1)] == m.group(2) else "no"), answer
    m = re.fullmatch(r"How many objects is (\w+) carrying\?", question)
    n = sum(1 for h in holder.values() if h == m.group(1))
    return ("none", "one", "two", "three")[n], answer


@pytest.mark.parametrize("kind", BABI_KINDS)
def test_babi_answers_follow_from_the_facts(kind):
    task = BabiTask(FILLER, (kind,), n_facts=6)
    length = task.min_length() + 50
    batch = task.sample_kind(_g(2), 24, length, kind)
    assert batch.tokens.shape == (24, length)
    answers = set()
    for b in range(24):
        text = decode(batch.tokens[b])
        expected, answer = _answer_from_text(text)
        assert answer == expected, text
        assert _scored_text(batch, b) == answer  # loss exactly on the answer word
        assert text.count("~") == length - len(text.replace("~", ""))  # the rest is filler
        answers.add(answer)
    if kind == "qa6":
        assert answers == {"yes", "no"}


def test_babi_mixture_draws_every_kind():
    task = BabiTask(FILLER, BABI_KINDS, n_facts=4)
    batch = task.sample(_g(0), 60, task.min_length())
    questions = {re.search(r"Q: (\w+ \w+)", decode(t)).group(1) for t in batch.tokens}
    assert {"Where is", "Where was", "How many"} <= questions and any(q.startswith("Is ") for q in questions)


class OracleLM(nn.Module):
    """Predicts the true next token (one-hot logits) of a fixed batch, except at ``wrong`` (b, i) targets."""

    def __init__(self, tokens: torch.Tensor, wrong: list[tuple[int, int]] = ()) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.zeros(1))
        self.targets = torch.cat([tokens[:, 1:], torch.zeros_like(tokens[:, :1])], dim=1)  # [B, L]
        for b, i in wrong:
            self.targets[b, i] = (self.targets[b, i] + 1) % 256

    def forward(self, tokens, states=None):
        offset = 0 if states is None else int(states[0])
        t = tokens.shape[1]
        logits = nn.functional.one_hot(self.targets[:, offset:offset + t], 256).float()
        return logits, [torch.tensor(offset + t)]


def test_oracle_scores_one_and_errors_are_counted_exactly():
    batch = CopyingTask().sample(_g(), 4, 10)
    hits, mask = score_batch(OracleLM(batch.tokens), batch, chunk_len=7)  # chunks carry the position
    assert hits[mask].all()
    assert _scores(OracleLM(batch.tokens), batch, 5) == (1.0, 1.0)
    first_scored = int(torch.nonzero(batch.mask[0])[0, 0])
    wrong = [(0, first_scored), (2, first_scored + 3), (2, first_scored + 4), (3, 0)]  # (3, 0) is not scored
    token, exact = _scores(OracleLM(batch.tokens, wrong), batch, 5)
    assert token == pytest.approx(1 - 3 / 40) and exact == pytest.approx(2 / 4)


@pytest.mark.parametrize("make, length, match", [
    (lambda: PasskeyTask(FILLER), 50, "too short to hold the key and the question"),
    (lambda: BabiTask(FILLER, ("qa1",), 4), 60, "too short to hold 4 facts and the question"),
    (lambda: CopyingTask(), 0, "allowed: a string length >= 1"),
])
def test_too_short_lengths_are_refused(make, length, match):
    with pytest.raises(ValueError, match=match):
        make().sample(_g(), 2, length)


def test_bad_depth_and_kind_are_refused():
    with pytest.raises(ValueError, match=r"depth 1.5 is outside \[0, 1\]"):
        PasskeyTask(FILLER).sample(_g(), 2, 300, 1.5)
    with pytest.raises(ValueError, match="unknown bAbI task kind 'qa9'; allowed: qa1, qa2, qa3, qa6, qa7"):
        BabiTask(FILLER, ("qa9",))
    with pytest.raises(ValueError, match="unknown task kind 'sorting'"):
        make_task("sorting", FILLER)


def test_min_length_is_tight_for_passkey():
    task = PasskeyTask(FILLER)
    batch = task.sample(_g(), 2, task.min_length(), 0.5)
    assert not np.any([c == "~" for c in decode(batch.tokens[0])])


def test_babi_two_and_three_fact_kinds_with_few_facts_always_generate():
    task = BabiTask(FILLER, ("qa2", "qa3"), n_facts=4)
    batch = task.sample(_g(7), 40, task.min_length())
    for b in range(40):
        expected, answer = _answer_from_text(decode(batch.tokens[b]))
        assert answer == expected
    with pytest.raises(ValueError, match=r"n_facts 3 is too few for kinds qa3 \(.*\); allowed: >= 4"):
        BabiTask(FILLER, ("qa3",), n_facts=3)
    with pytest.raises(ValueError, match="n_facts 1 is too few for kinds qa1, qa2 .*allowed: >= 2"):
        BabiTask(FILLER, ("qa1", "qa2"), n_facts=1)


def test_babi_qa3_always_has_a_distractor_fact():
    """With n_facts = 4 the answer is not always the room of the first fact (it would be with 3)."""
    task = BabiTask(FILLER, ("qa3",), n_facts=4)
    batch = task.sample(_g(11), 60, task.min_length())
    first_room = []
    for b in range(60):
        text = decode(batch.tokens[b])
        expected, answer = _answer_from_text(text)
        assert answer == expected
        first = text.split(" went to the ")[1].split(".")[0]
        first_room.append(first == expected)
    assert 0 < sum(first_room) < 60
