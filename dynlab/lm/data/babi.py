"""bAbI-style questions in filler (:class:`BabiTask`), one of the long-context tasks of
:mod:`dynlab.lm.data.tasks` (whose docstring gives the shared conventions: the loss mask,
the filler stream, subword tokenizers, the accuracies).

**babi** (dynlab's own bAbI-style generator, BABILong-like): ``n_facts`` fact sentences
from a small simulated world (people move between rooms, pick up and drop objects),
each followed by a space and scattered at uniformly random, sorted offsets in the filler;
then ``␣Q: <question> A: <answer>.``. Kinds (bAbI numbering):

- ``qa1`` single supporting fact: ``Where is Mary?`` → a room;
- ``qa2`` two supporting facts: ``Where is the apple?`` → the room of its carrier;
- ``qa3`` three supporting facts: ``Where was the apple before the office?`` → the room
  the object was in before its current room;

For qa2 and qa3 the supporting facts (a person goes to a room, picks the object up, and
for qa3 — for qa2 with probability 1/2 — goes to another room) are planted in order at
random fact slots; the other facts are random events of the other people and objects
(qa3 needs ``n_facts`` ≥ 4, so that at least one fact is not supporting).
- ``qa6`` yes/no: ``Is Mary in the kitchen?`` → ``yes``/``no`` (balanced);
- ``qa7`` counting: ``How many objects is Mary carrying?`` → ``none``/``one``/``two``/``three``.

``length`` is the whole sample in tokens. Scored: the answer's bytes.

Two options (both off by default, the format above):

- ``tokens="words"``: every word and punctuation mark of the bAbI sentences, questions
  and answers (:data:`BABI_WORDS`, 39 of them; ``Q:`` and ``A:`` are words) is one token,
  id ``128 + index`` — what a subword tokenizer gives these common words — with no spaces
  between them; the filler stays bytes (its rare bytes ≥ 128 become spaces, so no filler
  byte reads as a word). A fact is then 5–6 tokens instead of 20–30 bytes, and the
  answer (a room, ``yes``/``no`` or a count) is one token.
- ``questions="all"`` (training samples, :meth:`BabiTask.sample`): the story is followed
  by every question of its kind that it answers, in random order, each with its answer
  scored — qa1: the room of each person present; qa6: for each person present, a yes/no
  question (balanced); qa7: the count of each person named; qa2, qa3: the one planted
  question — as many as fit in ``length`` (at least one). Test samples
  (:meth:`BabiTask.sample_kind`) always end with one question. The native bAbI format
  likewise asks several questions of one story; it multiplies the answers each sample
  trains on.
"""

from __future__ import annotations

import re

import numpy as np
import torch

from dynlab.errors import DynlabInputError
from dynlab.lm.data.task_text import TaskBatch, TaskText, draw_index, filler_window, task_batch, utf8_ids
from dynlab.lm.data.tokenizer import Tokenizer
from dynlab.names import BABI_KINDS

__all__ = ["BABI_KINDS", "BABI_QUESTIONS", "BABI_TOKENS", "BABI_WORDS", "COUNTS", "MIN_FACTS", "OBJECTS", "PEOPLE", "ROOMS",
           "BabiTask", "babi_chance", "babi_decode", "babi_encode"]

#: Fewest facts per kind: qa2 plants 2 supporting facts; qa3 plants 3 and needs one more,
#: else every fact supports the answer and it is always the room of the first fact.
MIN_FACTS = {"qa2": 2, "qa3": 4}
PEOPLE = ("Mary", "John", "Sandra", "Daniel")
ROOMS = ("kitchen", "garden", "office", "bathroom", "hallway", "bedroom")
OBJECTS = ("apple", "football", "milk")
COUNTS = ("none", "one", "two", "three")
BABI_TOKENS = ("bytes", "words")
BABI_QUESTIONS = ("one", "all")
#: The words of ``tokens="words"`` (token id ``128 + index``): names, rooms, objects, counts,
#: the words of the facts and questions, and the punctuation.
BABI_WORDS = PEOPLE + ROOMS + OBJECTS + COUNTS + (
    "went", "to", "the", "picked", "up", "dropped", "Q:", "A:", "Where", "is", "was", "before",
    "Is", "in", "How", "many", "objects", "carrying", "yes", "no", ".", "?")
_WORD_BASE = 128
_WORD_ID = {w: _WORD_BASE + i for i, w in enumerate(BABI_WORDS)}
_WORD_RE = re.compile(r"[A-Za-z]+:|[A-Za-z]+|[.?]")


def babi_encode(text: str, tokens: str = "bytes") -> list[int]:
    """Token ids of bAbI text (facts, question, answer): its UTF-8 bytes, or for
    ``tokens="words"`` one id ``128 + index`` per word of :data:`BABI_WORDS` (spaces dropped).

    Raises :class:`~dynlab.errors.DynlabInputError` for a word outside the vocabulary."""
    if tokens == "bytes":
        return utf8_ids(text)
    ids = []
    for word in _WORD_RE.findall(text):
        if word not in _WORD_ID:
            raise DynlabInputError(f"{word!r} is not a bAbI word; allowed: {', '.join(BABI_WORDS)}")
        ids.append(_WORD_ID[word])
    return ids


def babi_decode(ids: list[int] | torch.Tensor) -> str:
    """Readable text of a bAbI sample: word tokens as ``⟨word⟩``, other ids as their bytes."""
    out = []
    for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids):
        k = int(i) - _WORD_BASE
        out.append(f"⟨{BABI_WORDS[k]}⟩" if 0 <= k < len(BABI_WORDS) else bytes([int(i)]).decode("latin-1"))
    return "".join(out)


class _World:
    """A tiny bAbI world: people in rooms, objects carried or lying in rooms."""

    def __init__(self) -> None:
        self.where: dict[str, str] = {}  # person -> room
        self.holder: dict[str, str] = {}  # object -> person
        self.lying: dict[str, str] = {}  # object -> room
        self.history: dict[str, list[str]] = {o: [] for o in OBJECTS}  # rooms an object has been in, in order

    def object_room(self, obj: str) -> str | None:
        if obj in self.holder:
            return self.where.get(self.holder[obj])
        return self.lying.get(obj)

    def _visit(self, obj: str) -> None:
        room = self.object_room(obj)
        if room is not None and (not self.history[obj] or self.history[obj][-1] != room):
            self.history[obj].append(room)

    def step(self, generator: torch.Generator, moves_only: bool, people: tuple[str, ...] = PEOPLE,
             objects: tuple[str, ...] = OBJECTS) -> str:
        """Apply one random event among ``people`` and ``objects`` and return its sentence."""
        choices = ["move"] if moves_only else ["move", "move", "pick", "drop"]
        event = choices[draw_index(generator, len(choices))]
        person = people[draw_index(generator, len(people))]
        if event == "pick" and person in self.where:
            free = [o for o in objects if o not in self.holder]
            if free:
                obj = free[draw_index(generator, len(free))]
                self.holder[obj] = person
                self.lying.pop(obj, None)
                self._visit(obj)
                return f"{person} picked up the {obj}."
        if event == "drop":
            held = [o for o in OBJECTS if self.holder.get(o) == person]
            if held and person in self.where:
                obj = held[draw_index(generator, len(held))]
                del self.holder[obj]
                self.lying[obj] = self.where[person]
                return f"{person} dropped the {obj}."
        room = ROOMS[draw_index(generator, len(ROOMS))]
        self.where[person] = room
        for obj, who in self.holder.items():
            if who == person:
                self._visit(obj)
        return f"{person} went to the {room}."


def _askable(kind: str, world: _World, facts: list[str]) -> list[str]:
    """The people a qa1/qa6/qa7 question can be about: those in a room (qa1, qa6), those named (qa7)."""
    if kind == "qa7":
        return [p for p in PEOPLE if any(p in f for f in facts)]
    return [p for p in PEOPLE if p in world.where]


def _question(kind: str, world: _World, person: str, generator: torch.Generator) -> tuple[str, str]:
    """(question, answer) of kind qa1, qa6 (yes or no, drawn with probability 1/2) or qa7 about ``person``."""
    if kind == "qa7":
        return f"How many objects is {person} carrying?", COUNTS[sum(1 for o in OBJECTS if world.holder.get(o) == person)]
    room = world.where[person]
    if kind == "qa1":
        return f"Where is {person}?", room
    if draw_index(generator, 2):
        return f"Is {person} in the {room}?", "yes"
    others = [r for r in ROOMS if r != room]
    return f"Is {person} in the {others[draw_index(generator, len(others))]}?", "no"


#: Every fact, question and answer a bAbI story can hold (:meth:`BabiTask.min_length`).
_ALL_FACTS = tuple([f"{p} went to the {r}." for p in PEOPLE for r in ROOMS]
                   + [f"{p} {verb} the {o}." for p in PEOPLE for o in OBJECTS for verb in ("picked up", "dropped")])
_ALL_QUESTIONS = tuple([f"Where is {p}?" for p in PEOPLE] + [f"Where is the {o}?" for o in OBJECTS]
                       + [f"Where was the {o} before the {r}?" for o in OBJECTS for r in ROOMS]
                       + [f"Is {p} in the {r}?" for p in PEOPLE for r in ROOMS]
                       + [f"How many objects is {p} carrying?" for p in PEOPLE])
_ALL_ANSWERS = (*ROOMS, *COUNTS, "yes", "no")


class BabiTask:
    """bAbI-style question kinds ``kinds`` (each sample draws one uniformly) in ``length`` tokens of filler."""

    kind = "babi"
    max_tries = 200

    def __init__(self, stream: torch.Tensor | np.ndarray, kinds: tuple[str, ...] = BABI_KINDS, n_facts: int = 4,
                 tokens: str = "bytes", questions: str = "one", tokenizer: Tokenizer | None = None) -> None:
        if tokens not in BABI_TOKENS:
            raise DynlabInputError(f"unknown bAbI tokens {tokens!r}; allowed: {', '.join(BABI_TOKENS)}")
        if questions not in BABI_QUESTIONS:
            raise DynlabInputError(f"unknown bAbI questions {questions!r}; allowed: {', '.join(BABI_QUESTIONS)}")
        for k in kinds:
            if k not in BABI_KINDS:
                raise DynlabInputError(f"unknown bAbI task kind {k!r}; allowed: {', '.join(BABI_KINDS)}")
        if not kinds:
            raise DynlabInputError(f"bAbI kinds must not be empty; allowed: {', '.join(BABI_KINDS)}")
        if not 1 <= n_facts <= 64:
            raise DynlabInputError(f"n_facts {n_facts} is outside [1, 64]")
        need = max(MIN_FACTS.get(k, 1) for k in kinds)
        if n_facts < need:
            raise DynlabInputError(f"n_facts {n_facts} is too few for kinds {', '.join(kinds)} (a qa3 story needs a fact "
                                   f"beside its 3 supporting ones); allowed: >= {need}")
        self.text = TaskText(tokenizer)
        if tokens == "words" and self.text.subword:
            raise DynlabInputError("bAbI tokens 'words' is a byte-level format; allowed with a subword tokenizer: "
                                   "babi_tokens = 'bytes' (the text through the tokenizer)")
        self.text.check("babi", [*(" " + f for f in _ALL_FACTS), *(f" Q: {q} A:" for q in _ALL_QUESTIONS),
                                 *(" " + a for a in _ALL_ANSWERS), "."])
        self.stream, self.kinds, self.n_facts = stream, tuple(kinds), n_facts
        self.tokens, self.questions = tokens, questions

    def _encode(self, text: str) -> list[int]:
        return self.text(text) if self.text.subword else babi_encode(text, self.tokens)

    def _fill(self, n: int, generator: torch.Generator) -> list[int]:
        """``n`` filler tokens (:func:`~dynlab.lm.data.task_text.filler_window`); with word tokens a filler byte >= 128 reads
        as a space, so that no filler byte reads as a word (mapped window by window: a
        token folder is never read whole)."""
        window = filler_window(self.stream, n, generator)
        return [ord(" ") if b >= _WORD_BASE else b for b in window] if self.tokens == "words" else window

    def _fact(self, fact: str) -> list[int]:
        """A fact sentence as it sits in the filler (bytes: followed by a space; a subword
        tokenizer: after a space)."""
        if self.text.subword:
            return self._encode(" " + fact)
        return self._encode(fact + " ") if self.tokens == "bytes" else self._encode(fact)

    def _ask(self, question: str) -> list[int]:
        if self.text.subword:
            return self._encode(f" Q: {question} A:")
        return self._encode(f" Q: {question} A: ") if self.tokens == "bytes" else self._encode(f"Q: {question} A:")

    def _answer(self, answer: str) -> tuple[list[int], int]:
        """The answer's ids, its period included, and how many of them are scored (all but the period)."""
        scored = self._encode(" " + answer) if self.text.subword else self._encode(answer)
        return scored + self._encode("."), len(scored)

    def min_length(self) -> int:
        """The longest possible facts, question and answer with zero filler tokens (every
        fact and question form of every kind, each in the task's tokens)."""
        fact = max(len(self._fact(f)) for f in _ALL_FACTS)
        question = max(len(self._ask(q)) for q in _ALL_QUESTIONS)
        answer = max(len(self._answer(a)[0]) for a in _ALL_ANSWERS)
        return self.n_facts * fact + question + answer

    def check_length(self, length: int) -> None:
        if length < self.min_length():
            raise DynlabInputError(f"babi length {length} is too short to hold {self.n_facts} facts and the question; "
                             f"allowed: >= {self.min_length()} tokens")

    def _story(self, kind: str, generator: torch.Generator) -> tuple[list[str], str, str]:
        """(fact sentences, question, answer) of one answerable sample of ``kind``."""
        for _ in range(self.max_tries):
            world = _World()
            facts = [world.step(generator, moves_only=kind in ("qa1", "qa6")) for _ in range(self.n_facts)]
            if kind in ("qa1", "qa6", "qa7"):
                people = _askable(kind, world, facts)
                return facts, *_question(kind, world, people[draw_index(generator, len(people))], generator)
            if kind in ("qa2", "qa3"):
                return self._planted(kind, generator)
        raise ValueError(f"could not generate an answerable {kind} story with {self.n_facts} facts; use more facts")

    def _story_all(self, kind: str, generator: torch.Generator) -> tuple[list[str], list[tuple[str, str]]]:
        """(fact sentences, every (question, answer) of ``kind`` the story answers, in random order)."""
        if kind in ("qa2", "qa3"):
            facts, question, answer = self._planted(kind, generator)
            return facts, [(question, answer)]
        world = _World()
        facts = [world.step(generator, moves_only=kind in ("qa1", "qa6")) for _ in range(self.n_facts)]
        qa = [_question(kind, world, person, generator) for person in _askable(kind, world, facts)]
        order = torch.randperm(len(qa), generator=generator).tolist()
        return facts, [qa[i] for i in order]

    def _planted(self, kind: str, generator: torch.Generator) -> tuple[list[str], str, str]:
        """qa2/qa3: the supporting facts (a person goes to r1, picks up an object, [goes to r2]) in order at
        random slots; the other facts are random events of the other people and objects (they cannot
        change the answer)."""
        person = PEOPLE[draw_index(generator, len(PEOPLE))]
        obj = OBJECTS[draw_index(generator, len(OBJECTS))]
        r1 = ROOMS[draw_index(generator, len(ROOMS))]
        others = [r for r in ROOMS if r != r1]
        r2 = others[draw_index(generator, len(others))]
        moves_on = kind == "qa3" or (self.n_facts >= 3 and bool(draw_index(generator, 2)))
        support = [f"{person} went to the {r1}.", f"{person} picked up the {obj}."]
        support += [f"{person} went to the {r2}."] if moves_on else []
        slots = sorted(torch.randperm(self.n_facts, generator=generator)[:len(support)].tolist())
        world = _World()
        rest_people = tuple(p for p in PEOPLE if p != person)
        rest_objects = tuple(o for o in OBJECTS if o != obj)
        facts = []
        for i in range(self.n_facts):
            facts.append(support.pop(0) if i in slots else world.step(generator, False, rest_people, rest_objects))
        if kind == "qa2":
            return facts, f"Where is the {obj}?", r2 if moves_on else r1
        return facts, f"Where was the {obj} before the {r2}?", r1

    def probe_samples(self, generator: torch.Generator, n: int, d: int) -> tuple[TaskBatch, int, np.ndarray]:
        """``n`` probe samples of the state geometry at distance ``d``
        (:mod:`dynlab.lm.analysis.state_geometry`): the task's ``n_facts`` random moves side by side, ``d``
        filler tokens, "Where is <person>?" about the person who moved last, and the answer
        (scored).  Returns the batch, the read position (after the last filler token, the
        same in every row: the facts are padded on the left with filler to one length) and
        each row's room index into :data:`ROOMS`."""
        rows, scored, labels, stories = [], [], [], []
        for _ in range(n):
            world = _World()
            facts = [world.step(generator, moves_only=True) for _ in range(self.n_facts)]
            person = facts[-1].split(" ", 1)[0]
            stories.append((sum((self._fact(f) for f in facts), []), person, world.where[person]))
        width = max(len(s[0]) for s in stories)
        for story, person, room in stories:
            row = self._fill(width - len(story), generator) + story + self._fill(d, generator)
            row += self._ask(f"Where is {person}?")
            answer, n_scored = self._answer(room)
            scored.append(list(range(len(row), len(row) + n_scored)))
            rows.append(row + answer)
            labels.append(ROOMS.index(room))
        longest = max(map(len, rows))  # names and rooms differ in length: filler after the answer, never scored
        rows = [r + self._fill(longest - len(r), generator) for r in rows]
        return task_batch(rows, scored), width + d, np.asarray(labels)

    def sample_kind(self, generator: torch.Generator, batch_size: int, length: int, kind: str) -> TaskBatch:
        """``batch_size`` samples of one ``kind``."""
        return self._sample(generator, batch_size, length, [kind] * batch_size)

    def sample(self, generator: torch.Generator, batch_size: int, length: int, depth: float | None = None) -> TaskBatch:
        """``batch_size`` training samples, each of a kind drawn uniformly from ``kinds``
        (``questions="all"``: each asks every question of its story that fits)."""
        kinds = [self.kinds[draw_index(generator, len(self.kinds))] for _ in range(batch_size)]
        return self._sample(generator, batch_size, length, kinds, every=self.questions == "all")

    def _sample(self, generator: torch.Generator, batch_size: int, length: int, kinds: list[str],
                every: bool = False) -> TaskBatch:
        self.check_length(length)
        for k in kinds:
            if k not in BABI_KINDS:
                raise DynlabInputError(f"unknown bAbI task kind {k!r}; allowed: {', '.join(BABI_KINDS)}")
        rows, scored = [], []
        for kind in kinds:
            if every:
                facts, qa = self._story_all(kind, generator)
            else:
                facts, question, answer = self._story(kind, generator)
                qa = [(question, answer)]
            pieces = [self._fact(f) for f in facts]
            tails = [(self._ask(q), *self._answer(a)) for q, a in qa]
            room = length - sum(map(len, pieces))
            while len(tails) > 1 and sum(len(q) + len(a) for q, a, _ in tails) > room:
                tails.pop()
            n_filler = room - sum(len(q) + len(a) for q, a, _ in tails)
            filler = self._fill(n_filler, generator)
            cuts = sorted(draw_index(generator, n_filler + 1) for _ in pieces)
            row: list[int] = []
            prev = 0
            for cut, piece in zip(cuts, pieces):
                row += filler[prev:cut] + piece
                prev = cut
            row += filler[prev:]
            targets: list[int] = []
            for q, a, n_scored in tails:
                row += q
                targets += range(len(row), len(row) + n_scored)
                row += a
            rows.append(row)
            scored.append(targets)
        return task_batch(rows, scored)


def babi_chance(kind: str, n_facts: int, samples: int = 4000, seed: int = 0) -> float:
    """Chance level of bAbI ``kind`` with ``n_facts`` facts: the share of its most common
    answer over ``samples`` generated stories (seeded with ``seed``), which a model that
    always gives that answer scores. qa1: about 1/6 (a room); qa6: about 1/2; qa7 with few
    facts: high, since most people carry nothing ("none")."""
    task = BabiTask(torch.full((1,), ord(" ")), kinds=(kind,), n_facts=n_facts)
    generator = torch.Generator().manual_seed(seed)
    counts: dict[str, int] = {}
    for _ in range(samples):
        answer = task._story(kind, generator)[2]
        counts[answer] = counts.get(answer, 0) + 1
    return max(counts.values()) / samples
