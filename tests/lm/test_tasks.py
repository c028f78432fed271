"""Long-context task generators: token formats and loss masks checked by parsing, oracle scores, bad input."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

from dynlab.lm.data.corpus import decode, encode
from dynlab.lm.run.task import _scores, score_batch
from dynlab.errors import DynlabInputError
from dynlab.lm.data.babi import BABI_KINDS, BABI_WORDS, BabiTask, babi_decode, babi_encode
from dynlab.lm.data.tasks import CopyingTask, PasskeyTask, make_task

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


# --- bAbI word tokens and every-question training samples -----------------------------------

def _words_text(tokens) -> str:
    """A words-token sample as the bytes format would write it (an independent rendering)."""
    out = []
    for t in tokens.tolist():
        if t >= 128:
            word = BABI_WORDS[t - 128]
            out.append(word if word in ".?" else " " + word)
        else:
            out.append(chr(t))
    return "".join(out)


def _qa_pairs(text: str) -> tuple[str, list[tuple[str, str]]]:
    story, *rest = text.split(" Q: ")
    return story, [re.fullmatch(r"(.*\?) A: (\w+)\.", r.strip(), re.S).groups() for r in rest]


@pytest.mark.parametrize("kind", BABI_KINDS)
@pytest.mark.parametrize("questions", ["one", "all"])
def test_babi_words_answers_follow_from_the_facts(kind, questions):
    task = BabiTask(FILLER, (kind,), n_facts=4, tokens="words", questions=questions)
    length = task.min_length() + 80
    batch = task.sample(_g(3), 24, length)
    assert batch.tokens.shape == (24, length)
    n_asked = []
    for b in range(24):
        story, pairs = _qa_pairs(_words_text(batch.tokens[b]))
        for question, answer in pairs:
            expected, _ = _answer_from_text(f"{story} Q: {question} A: {answer}.")
            assert answer == expected, (story, question, answer)
        scored = [BABI_WORDS[t - 128] for t in batch.tokens[b, 1:][batch.mask[b]].tolist()]
        assert scored == [a for _, a in pairs]  # one token per answer, only the answers scored
        assert len({q for q, _ in pairs}) == len(pairs)
        if questions == "all" and kind in ("qa1", "qa6"):  # every person of the story is asked about
            assert {re.search(r"(Mary|John|Sandra|Daniel)", q).group(1) for q, _ in pairs} == \
                set(re.findall(r"(Mary|John|Sandra|Daniel) went", story))
        n_asked.append(len(pairs))
    assert max(n_asked) == 1 if questions == "one" or kind in ("qa2", "qa3") else max(n_asked) > 1


def test_babi_words_tokens_are_one_per_word_and_filler_bytes_never_read_as_words():
    assert babi_encode("Mary went to the kitchen.", "words") == [128 + BABI_WORDS.index(w) for w in
                                                                 ("Mary", "went", "to", "the", "kitchen", ".")]
    assert babi_encode("Q: Where is Mary? A:", "words")[0] == 128 + BABI_WORDS.index("Q:")
    assert babi_decode(babi_encode("John dropped the milk.", "words")) == "⟨John⟩⟨dropped⟩⟨the⟩⟨milk⟩⟨.⟩"
    with pytest.raises(DynlabInputError, match="not a bAbI word"):
        babi_encode("Mary flew to the kitchen.", "words")
    high = torch.tensor([128 + BABI_WORDS.index("kitchen")] * 4000, dtype=torch.uint8)  # filler of word ids
    task = BabiTask(high, ("qa1",), n_facts=2, tokens="words")
    batch = task.sample(_g(), 8, 200)
    n_words = (batch.tokens >= 128).sum(1)
    assert (n_words == 2 * 6 + 6 + 2).all()  # 2 facts, the question, the answer and its period: no filler


def test_babi_words_min_length_is_tight_and_every_question_fits_or_is_dropped():
    task = BabiTask(FILLER, ("qa1", "qa7"), n_facts=3, tokens="words", questions="all")
    assert task.min_length() == 3 * 6 + len("Q: Where was the football before the bathroom ? A:".split()) + 1 + 1
    batch = task.sample(_g(), 32, task.min_length())  # room for exactly one question of the longest kind
    assert (batch.mask.sum(1) >= 1).all()
    with pytest.raises(DynlabInputError, match="too short"):
        task.sample(_g(), 1, task.min_length() - 1)
    with pytest.raises(DynlabInputError, match="allowed: bytes, words"):
        BabiTask(FILLER, tokens="bpe")
    with pytest.raises(DynlabInputError, match="allowed: one, all"):
        BabiTask(FILLER, questions="some")


def test_babi_options_stay_out_of_the_run_id_at_their_defaults():
    from dynlab.lm.spec import LMTaskSpec

    plain = LMTaskSpec(kind="babi", train_min=200, train_max=200, eval_lengths=(200,))
    assert "babi_tokens" not in plain.hashed_fields() and "babi_questions" not in plain.hashed_fields()
    words = plain.model_copy(update={"babi_tokens": "words"})
    assert words.hashed_fields()["babi_tokens"] == "words"
    with pytest.raises(ValueError, match="babi_tokens"):
        LMTaskSpec(kind="babi", babi_tokens="bpe", train_min=200, train_max=200, eval_lengths=(200,))


@pytest.mark.slow
def test_babi_chance_is_the_share_of_the_most_common_answer_in_the_samples():
    """babi_chance (from the generated stories) against the answers read back from sampled
    word-token samples (the scored tokens, decoded): the same distribution, and qa6's is 1/2."""
    from collections import Counter

    from dynlab.lm.data.babi import babi_chance

    stream = torch.tensor(list(b"lorem ipsum dolor sit amet " * 40))
    task = BabiTask(stream, kinds=("qa1", "qa6", "qa7"), n_facts=3, tokens="words")
    g = torch.Generator().manual_seed(5)
    for kind in ("qa1", "qa6", "qa7"):
        batch = task.sample_kind(g, 2000, 64, kind)
        answers = Counter(babi_decode([int(batch.tokens[i, j + 1]) for j in batch.mask[i].nonzero().flatten()])
                          for i in range(len(batch.tokens)))
        share = max(answers.values()) / 2000
        assert abs(babi_chance(kind, 3) - share) < 0.04, (kind, share)  # two samples of one distribution
    assert abs(babi_chance("qa6", 3) - 0.5) < 0.03 and babi_chance("qa7", 3) > 0.8 > 0.3 > babi_chance("qa1", 3)
