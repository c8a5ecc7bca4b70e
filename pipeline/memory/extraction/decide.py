"""The offline decider: what a proposal does to the memories it resembles, from similarity
and a few word tests, with no model. It errs towards ADD: a wrong ADD leaves two memories a
person can merge; a wrong SUPERSEDE hides a true one.

Order of the tests, on the similar memories sorted by similarity:
1. the same text (ignoring case and punctuation), or a similarity of at least
   `dedup_similarity`: NOOP_DUPLICATE;
2. the most similar memory of the same type, from `related_similarity` on:
   - SUPERSEDE when the proposal contradicts it: one says "not/n't/no longer/never/stopped/
     quit" and the other does not; or a one-valued relation ("lives in", "works at", "is
     from", "favourite X is", "prefers") with the same subject and another value; or a
     project state observed later; or an event on another date than a planned one
     (rescheduled). Two past events on two dates are two events: ADD.
   - UPDATE when the proposal says all the memory says and more (its words are a superset);
   - NOOP_DUPLICATE when the memory already says all the proposal says;
3. otherwise ADD.
A contradiction older than the memory it contradicts does not supersede it (a late
re-extraction of an old session must not undo what was learned since): ADD, with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.memory.extraction.model import Action, Decision, Proposal, Similar

_NEGATION = re.compile(r"\b(?:not|no longer|never|stopped|quit|anymore)\b|n't\b",
                       re.IGNORECASE)
# Relations a person has one value of at a time: a new value replaces the old one.
_ONE_VALUED = re.compile(
    r"\b(?:lives? (?:in|at|near)|lived in|works? (?:at|for|as)|is from|moved to|"
    r"favou?rite (?:[\w'-]+ ){1,3}?(?:is|are)|name is|prefers|is married to|is dating|"
    r"studies at|is based in|birthday is|uses)\b")
_PLANNED = re.compile(
    r"\b(?:is going to|will|plans? to|is planning|is thinking of|intends? to|hopes? to|"
    r"wants? to|would (?:like|love) to)\b", re.IGNORECASE)
_DATE_NOTE = re.compile(r"\([^)]*\)")


@dataclass(frozen=True)
class _Text:
    """A memory's words, as the tests compare them."""

    words: tuple[str, ...]
    negated: bool

    @classmethod
    def of(cls, content: str) -> _Text:
        return cls(tuple(re.findall(r"[a-z0-9]+(?:'[a-z]+)?", content.lower())),
                   bool(_NEGATION.search(content)))

    @property
    def normal(self) -> str:
        return " ".join(self.words)


class RuleDecider:
    """Chooses ADD, UPDATE, SUPERSEDE or NOOP_DUPLICATE; see the module docstring."""

    name = "rules"

    def __init__(self, *, dedup_similarity: float, related_similarity: float) -> None:
        self.dedup_similarity = dedup_similarity
        self.related_similarity = related_similarity

    async def decide(self, proposal: Proposal, similar: Sequence[Similar]) -> Decision:
        return decide(proposal, similar, dedup_similarity=self.dedup_similarity,
                      related_similarity=self.related_similarity)


def decide(proposal: Proposal, similar: Sequence[Similar], *, dedup_similarity: float,
           related_similarity: float) -> Decision:
    """The decision for one proposal; pure, so the tests can table it."""
    ranked = sorted(similar, key=lambda s: -s.similarity)  # stable: ties keep their order
    if not ranked:
        return _add(proposal, "no similar memory")
    new = _Text.of(proposal.content)
    for s in ranked:
        if _Text.of(s.content).normal == new.normal:
            return _decision("NOOP_DUPLICATE", s, proposal,
                             f"same text as memory {s.index} (similarity {s.similarity:.2f})")
    best = ranked[0]
    if best.similarity >= dedup_similarity:
        return _decision("NOOP_DUPLICATE", best, proposal,
                         f"same content as memory {best.index} "
                         f"(similarity {best.similarity:.2f})")
    related = next((s for s in ranked if s.similarity >= related_similarity
                    and s.type == proposal.type), None)
    if related is None:
        if best.similarity >= related_similarity:
            return _add(proposal, f"memory {best.index} is related (similarity "
                                  f"{best.similarity:.2f}) but a {best.type}, not a "
                                  f"{proposal.type}")
        return _add(proposal, f"no memory is similar enough (best: memory {best.index}, "
                              f"similarity {best.similarity:.2f} < {related_similarity:.2f})")
    return _against(proposal, new, related)


def _against(proposal: Proposal, new: _Text, memory: Similar) -> Decision:
    """The decision against one memory of the same type and about the same thing."""
    old = _Text.of(memory.content)
    which = f"memory {memory.index} (similarity {memory.similarity:.2f})"
    conflict = _contradiction(proposal, new, memory, old)
    if conflict is not None:
        if (proposal.observed_at is not None and memory.observed_at is not None
                and proposal.observed_at < memory.observed_at):
            return _add(proposal, f"contradicts {which} ({conflict}) but was observed "
                                  "before it, so it does not replace it")
        return _decision("SUPERSEDE", memory, proposal, f"contradicts {which}: {conflict}")
    old_words, new_words = set(old.words), set(new.words)
    if old_words < new_words:
        return _decision("UPDATE", memory, proposal, f"adds detail to {which}")
    if new_words <= old_words:
        return _decision("NOOP_DUPLICATE", memory, proposal, f"{which} already says this")
    return _add(proposal, f"related to {which} but neither contradicts nor extends it")


def _contradiction(proposal: Proposal, new: _Text, memory: Similar, old: _Text) -> str | None:
    """Why the proposal contradicts the memory, or None when it does not."""
    if new.negated != old.negated:
        return "one of them is negated" if new.negated else "it is no longer negated"
    changed = _changed_value(_DATE_NOTE.sub("", proposal.content),
                             _DATE_NOTE.sub("", memory.content))
    if changed is not None:
        return changed
    newer = (proposal.observed_at is not None and memory.observed_at is not None
             and proposal.observed_at > memory.observed_at)
    if newer and proposal.type == "project_state":
        return "a later state of the same work"
    if (proposal.observed_at is not None and memory.observed_at is not None
            and proposal.observed_at != memory.observed_at and proposal.type == "event"
            and _PLANNED.search(memory.content)):
        return "the planned event has another date"
    return None


def _changed_value(new: str, old: str) -> str | None:
    """ "lives in Denver" against "lives in Boston": the same subject and one-valued relation
    with another value."""
    new_parts, old_parts = _relation(new), _relation(old)
    if new_parts is None or old_parts is None or new_parts[:2] != old_parts[:2]:
        return None
    new_value, old_value = set(new_parts[2].split()), set(old_parts[2].split())
    if not new_value or not old_value or new_value <= old_value or old_value <= new_value:
        return None
    return f'"{new_parts[1]}" changed from "{old_parts[2]}" to "{new_parts[2]}"'


def _relation(content: str) -> tuple[str, str, str] | None:
    """(subject, relation, value) of a one-valued relation in the text, lower case."""
    text = " ".join(re.findall(r"[a-z0-9]+(?:'[a-z]+)?", content.lower()))
    m = _ONE_VALUED.search(text)
    if m is None:
        return None
    return text[:m.start()].strip(), m.group(), text[m.end():].strip()


def _decision(action: Action, memory: Similar, proposal: Proposal, reason: str) -> Decision:
    return Decision(action=action, target=memory.index, reason=reason, content=proposal.content)


def _add(proposal: Proposal, reason: str) -> Decision:
    return Decision(action="ADD", target=None, reason=reason, content=proposal.content)
