"""The offline extractor: first-person statements found by patterns, rewritten in the third
person. No model, no network, deterministic: the same turns always give the same memories.

What it catches, one memory per sentence (two statements in one sentence stay together),
from user turns and from assistant turns that carry a sender name (a conversation between two
people stored as user/assistant; an unnamed assistant is the agent itself, whose "I'll
check" is not a memory):

- facts about the speaker: "I'm a nurse", "I'm from Sweden", "I work at/as/for …",
  "I live in …", "I grew up in …", "I have two kids", "I've got a dog", "my sister is …",
  "my name is …";
- preferences: "I love/like/enjoy/prefer/hate/don't like …", "I'm a big fan of …",
  "I'm into …", "my favourite X is …";
- plans: "I'm going to/planning to/thinking of …", "I plan/want/hope to …", "I will/I'll …",
  "I'd love to …": `event` with the future date when the sentence has one, else
  `project_state`; ongoing work ("I'm working on/learning/training for …") is `project_state`;
- decisions: "I/we decided/chose/agreed/settled on …", "let's go with/use …", "we're going
  with …": `decision`;
- past events: "I went to/visited/started/finished/got/joined/adopted …", "we went …",
  "my husband and I went …", "I've just finished …": `event`, dated by the time expression of
  the sentence ("yesterday", "last week", "two days ago", "on Monday", "in May 2022", "8 May
  2023") resolved against the turn's timestamp, and less confident when undated.

The memory names the speaker ("Caroline went to a support group (on 7 May 2023).", "The user
prefers tea."); "we" becomes "Caroline and others". Hedges ("maybe", "I think", "probably")
lower the confidence.

What it misses: anything not said in the first person by the speaker (what the speaker says
about the other person, "you said you moved"), facts spread over two turns (a question and its
answer: "Where do you work?" / "At the hospital."), statements without one of the patterns
above ("Painting is my therapy", "Nothing beats a morning run"), pronouns it cannot resolve
("she", "it", "that place"), implied facts, sarcasm and irony, conditionals, and any
judgement of what matters: it keeps small talk that fits a pattern ("I'm going to make
coffee"). It skips questions, greetings, sentences of fewer than four words, and statements
with nothing past the pattern ("I love it", "I went there").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from pipeline.memory.extraction import dates
from pipeline.memory.extraction.model import Proposal, Turn
from pipeline.providers.chat import clip

MAX_CONTENT_CHARS = 300
MIN_WORDS = 4
HEDGE_PENALTY = 0.15
MIN_CONFIDENCE = 0.3
UNDATED_EVENT_CONFIDENCE = 0.55

Kind = Literal["fact", "preference", "plan", "ongoing", "decision", "event"]
# The memory type each kind would be; a plan with a date becomes an `event` instead.
NATURAL_TYPE: dict[Kind, str] = {
    "fact": "fact", "preference": "preference", "plan": "project_state",
    "ongoing": "project_state", "decision": "decision", "event": "event",
}


@dataclass(frozen=True)
class _Pattern:
    kind: Kind
    confidence: float
    regex: re.Pattern[str]


# Words that may sit between the subject and its verb without changing what is said.
_ADV = (r"(?:(?:really|also|just|actually|absolutely|totally|still|now|finally|recently|"
        r"already|usually|always|definitely|truly|currently|even|honestly|seriously|"
        r"personally|mostly|often|never|officially|probably|maybe|perhaps|kind of|sort of|do|does)"
        r"\s+)*")
_I_AM = r"i(?:'m|\s+am)\s+" + _ADV
_I_HAVE = r"i(?:'ve|\s+have)\s+" + _ADV
_I = r"i\s+" + _ADV
_WE = r"(?:i|we|(?:my\s+)?[\w'-]+(?:\s+[\w'-]+)?\s+and\s+i)"
_NEG = r"(?:(?:don't|do not|didn't|did not|no longer|never)\s+)?"
_PAST = (
    r"(?:went|visited|started|began|finished|completed|got|attended|joined|moved|bought|met|"
    r"ran|took|graduated|adopted|signed up|won|lost|quit|left|made|painted|received|"
    r"traveled|travelled|celebrated|gave|saw|watched|wrote|built|launched|shipped|released|"
    r"booked|hosted|organized|organised|volunteered|competed|climbed|hiked|camped|baked|"
    r"cooked|learned|learnt|passed|failed|broke|found|tried|created|published|presented|"
    r"performed|returned|came back|got back|flew|drove|picked up|enrolled|applied|"
    r"registered|married|retired|switched|upgraded|migrated|deployed|fixed|signed|read|"
    r"spent|had|held|opened|closed|sold|donated|ordered|planted|recorded)"
)
_PARTICIPLE = (
    r"(?:finished|started|begun|completed|visited|been to|joined|moved|bought|met|adopted|"
    r"signed up|won|quit|made|gotten|taken|seen|read|written|built|launched|shipped|booked|"
    r"graduated|enrolled|applied|registered|switched|migrated|deployed|fixed|published|"
    r"released|returned|sold|opened|painted|lost|left)"
)


def _p(kind: Kind, confidence: float, *patterns: str) -> list[_Pattern]:
    return [_Pattern(kind, confidence, re.compile(p + r"\b", re.IGNORECASE)) for p in patterns]


# Tried in this order at each clause start: the first that matches decides the kind.
PATTERNS: tuple[_Pattern, ...] = (
    *_p("decision", 0.75,
        rf"(?:i|we)(?:'ve|\s+have)?\s+{_ADV}(?:decided|chose|agreed|settled on|opted for|"
        r"committed to)",
        r"let's\s+(?:go with|use|stick with|pick|choose|switch to|move to)",
        rf"(?:i|we)(?:'m|'re|\s+am|\s+are)\s+{_ADV}going with",
        r"(?:i|we)\s+went with"),
    *_p("plan", 0.6,
        rf"{_I_AM}(?:going to|gonna|planning to|planning on|hoping to|about to|thinking of|"
        r"thinking about|considering|aiming to|intending to)",
        rf"{_I}(?:plan to|plan on|intend to|hope to|want to|aim to|will)",
        r"i'll", r"my plan is to"),
    *_p("plan", 0.55, r"i(?:'d|\s+would)\s+(?:really\s+)?(?:like|love) to"),
    *_p("ongoing", 0.65,
        rf"{_I_AM}(?:working on|working towards|learning|studying|building|writing|"
        r"training for|saving (?:up )?for|preparing for|in the (?:middle|process) of)",
        rf"{_I_HAVE}been\s+{_ADV}(?:working on|learning|studying|building|writing|"
        r"training for|saving (?:up )?for)"),
    *_p("preference", 0.75,
        r"my\s+(?:absolute\s+|all-time\s+)?favou?rite\s+",
        rf"{_I_AM}(?:not\s+)?(?:a\s+)?(?:big\s+|huge\s+)?fan of",
        rf"{_I_AM}(?:not\s+)?(?:really\s+)?(?:into|obsessed with|passionate about|crazy about)",
        rf"i\s+{_ADV}{_NEG}{_ADV}(?:love|loved|like|liked|enjoy|enjoyed|prefer|preferred|hate|"
        r"hated|dislike|adore|can't stand|cannot stand|detest)"),
    *_p("event", 0.7,
        rf"{_WE}\s+{_ADV}{_PAST}",
        rf"(?:i|we)(?:'ve|\s+have)\s+{_ADV}{_PARTICIPLE}"),
    *_p("fact", 0.7,
        r"my name is",
        rf"{_I_AM}(?:a|an)\s+(?!bit\b|little\b|lot\b|mess\b)",
        rf"{_I_AM}(?:from|originally from|based in|married|engaged|divorced|single|pregnant|"
        r"retired|vegan|vegetarian|allergic to|a member of|part of|transgender|trans|gay|"
        r"lesbian|bisexual|queer|non-?binary|\d+ years old|\d+)",
        rf"{_I}(?:work|worked)\s+(?:at|for|as|in|on|with)",
        rf"{_I}(?:live|lived)\s+(?:in|at|near|with|on)",
        rf"{_I}(?:grew up|was born|was raised|studied|study|majored in|teach|taught|speak|"
        r"own|drive|play|volunteer|practice|practise)",
        rf"{_I_HAVE}been\s+(?:a|an)\s+",
        r"i(?:'ve got|\s+have got|\s+have)\s+(?!to\b|no idea\b|been\b|had\b|a question\b|"
        r"a feeling\b|fun\b|time\b|no clue\b)",
        r"my\s+(?!god\b|bad\b|goodness\b|pleasure\b)(?:[\w'-]+\s+){0,3}?[\w'-]+\s+(?:is|are|"
        r"was|were|has|have|had|lives|lived|works|worked|loves|love|likes|like|enjoys|enjoy|"
        r"turned|got|moved)"),
)

# What follows "I'll" or "I'm going to" in chat that is not a plan worth remembering.
_CHATTER = re.compile(
    r"\s*(?:let you know|keep you posted|get back to you|talk to you|see you|think about it|"
    r"check|look into it|try|have a look|be right back|go now|head out|do that|do it|"
    r"say|tell you|send you|ask)\b", re.IGNORECASE)
# What follows "I had" or "we went" in chat that is not an event worth remembering.
_SMALL_TALK = re.compile(
    r"\s*(?:(?:a|an)\s+)?(?:(?:really|very|so|pretty)\s+)?(?:great|good|nice|wonderful|lovely|"
    r"amazing|fun|busy|rough|long|hard|bad|crazy)\s+(?:time|day|night|week|weekend|one)\b"
    r"|\s*(?:fun|a blast|home|to bed|to sleep)\s*[.!]*$", re.IGNORECASE)
_LEAD_IN = re.compile(
    r"^(?:(?:oh|ah|aw+|wow|well|yeah|yes|yep|so|and|but|actually|honestly|haha+|lol|omg|hey|"
    r"hi|hello|btw|by the way|anyway|also|plus|ok|okay|um+|uh+|hmm+|totally|absolutely|"
    r"true|right|nice|great|cool|awesome|amazing|thanks|thank you|i think(?: that)?|"
    r"i guess|i believe|i suppose|i feel like|maybe|perhaps|probably|to be honest|tbh|"
    r"fun fact|guess what|you know what)\b[\s,!.:;-]*)+",
    re.IGNORECASE)
_CLAUSE_BREAK = re.compile(r"(?:[,;:–—]\s+|\s+(?:and|but|so|because|since|as|then|now)\s+)",
                           re.IGNORECASE)
_HEDGE = re.compile(
    r"\b(?:maybe|perhaps|probably|possibly|i think|i guess|i suppose|i believe|not sure|"
    r"might|kind of|sort of|i feel like)\b", re.IGNORECASE)
_QUESTION_START = re.compile(
    r"^(?:what|why|how|when|where|who|which|do|does|did|is|are|was|were|can|could|would|"
    r"should|have|has|will|shall|may)\s+(?:you|your|we|they|he|she|it|i)\b", re.IGNORECASE)
# A remark on what was just said ("…, and it was great"): not part of the memory.
_AFTERTHOUGHT = re.compile(
    r"(?:,|\s+and|\s+but|\s+so)\s+(?:it|that|this|which)(?:'s|\s+(?:is|was|has|had|felt|made|"
    r"looks|looked|sounds|sounded))\b.*$", re.IGNORECASE)
_CONDITIONAL = re.compile(r"^(?:if|unless|when|whenever|once)\b", re.IGNORECASE)
_SENTENCES = re.compile(r"(?<=[.!?…])[\"')\]]*\s+|\n+")
_EMPTY_OBJECT = frozenset({
    "it", "that", "this", "them", "those", "these", "you", "him", "her", "so", "too", "very",
    "much", "a", "an", "the", "to", "of", "and", "or", "there", "here", "one", "some", "lot",
    "lots", "thing", "things", "stuff", "well", "all", "more", "now", "then", "again", "as",
    "just", "out", "up", "back", "yet", "though", "anyway", "either", "is", "was",
    "be", "do", "go", "what", "yours", "yourself", "idea", "sure", "yes", "no", "not",
    "with", "for", "in", "on", "at", "from", "by", "about", "into", "over", "through",
    "around", "like", "because", "really", "also", "ever", "always", "us", "we", "me",
})


class RuleExtractor:
    """Proposes memories from first-person statements; see the module docstring."""

    name = "rules"

    async def extract(self, turns: Sequence[Turn], *, types: Sequence[str]) -> list[Proposal]:
        return extract(turns, types=types)


def extract(turns: Iterable[Turn], *, types: Sequence[str]) -> list[Proposal]:
    """Every turn's proposals, the same statement made twice kept once with both sources."""
    merged: dict[str, Proposal] = {}
    for turn in turns:
        for proposal in extract_turn(turn, types=types):
            key = _normal(proposal.content)
            seen = merged.get(key)
            if seen is None:
                merged[key] = proposal
            else:
                merged[key] = Proposal(
                    type=seen.type, content=seen.content,
                    confidence=max(seen.confidence, proposal.confidence),
                    observed_at=seen.observed_at,
                    source_events=seen.source_events + tuple(
                        e for e in proposal.source_events if e not in seen.source_events),
                    hints=seen.hints,
                )
    return list(merged.values())


def extract_turn(turn: Turn, *, types: Sequence[str]) -> list[Proposal]:
    """The proposals of one turn: at most one a sentence."""
    speaker = _speaker(turn)
    if speaker is None:
        return []
    proposals = []
    for sentence in split_sentences(turn.content):
        proposal = _from_sentence(sentence, turn, speaker, types)
        if proposal is not None:
            proposals.append(proposal)
    return proposals


def split_sentences(text: str) -> list[str]:
    text = text.replace("\u2019", "'").replace("\u2018", "'")
    return [s.strip() for s in _SENTENCES.split(text) if s and s.strip()]


def _speaker(turn: Turn) -> str | None:
    """Whom the first person names; None when the turn is not a person speaking."""
    name = (turn.sender_name or "").strip()
    if turn.role == "user":
        return name or "The user"
    if turn.role == "assistant" and name:
        return name
    return None


@dataclass(frozen=True)
class _Found:
    pattern: _Pattern
    start: int  # of the clause
    end: int  # of the pattern's match


def _find(sentence: str, date_spans: Sequence[tuple[int, int]]) -> _Found | None:
    """The earliest clause that opens with a pattern: the sentence's start, the start after a
    leading time expression or lead-in, or the start after a comma or a conjunction."""
    starts = {0}
    starts.update(m.end() for m in _CLAUSE_BREAK.finditer(sentence))
    for _, end in date_spans:
        rest = sentence[end:]
        starts.add(end + len(rest) - len(rest.lstrip(" ,")))
    for start in sorted(starts):
        lead = _LEAD_IN.match(sentence, start)
        at = lead.end() if lead else start
        for pattern in PATTERNS:
            m = pattern.regex.match(sentence, at)
            if m:
                return _Found(pattern, at, m.end())
    return None


def _from_sentence(sentence: str, turn: Turn, speaker: str,
                   types: Sequence[str]) -> Proposal | None:
    if (len(sentence.split()) < MIN_WORDS or sentence.rstrip(" \"')").endswith("?")
            or _QUESTION_START.match(sentence)
            or _CONDITIONAL.match(_LEAD_IN.sub("", sentence))):
        return None
    spans = [(r.start, r.end) for r in dates.find_dates(sentence, turn.created_at)]
    found = _find(sentence, spans)
    if found is None:
        return None
    kind = found.pattern.kind
    tense: dates.Tense = "future" if kind == "plan" else "past"
    when = next((r for r in dates.find_dates(sentence, turn.created_at, tense=tense)
                 if r.start >= found.end or _leads(sentence, r, found)), None)
    rest = sentence[found.end:]
    if when is not None and when.start >= found.end:
        rest = sentence[found.end:when.start] + sentence[when.end:]
    rest = _AFTERTHOUGHT.sub("", rest)
    if (not _has_content(rest) or (kind == "plan" and _CHATTER.match(rest))
            or (kind == "event" and _SMALL_TALK.match(rest))):
        return None
    if kind == "preference" and re.match(r"\s*(?:you|your)\b", rest, re.IGNORECASE):
        return None  # "I love your painting": about the other person, and of the moment
    memory_type = _choose_type(kind, when, types)
    if memory_type is None:
        return None
    return Proposal(
        type=memory_type,
        content=_content(sentence, found, when, speaker),
        confidence=_confidence(found.pattern, sentence, kind, when),
        observed_at=_observed_at(kind, when, turn.created_at),
        source_events=((turn.session_id, turn.event_id),),
        hints=(when.day.isoformat(),) if when else (),
    )


def _leads(sentence: str, when: dates.ResolvedDate, found: _Found) -> bool:
    """Whether the time expression opens the clause ("Yesterday I went"), rather than sitting
    in an earlier clause of its own ("Last year was hard, but now I'm a nurse")."""
    between = sentence[when.end:found.start].strip(" ,")
    return when.end <= found.start and not _LEAD_IN.sub("", between).strip(" ,")


def _has_content(rest: str) -> bool:
    words = re.findall(r"[a-z0-9][\w'-]*", rest.lower())
    return any((w not in _EMPTY_OBJECT and len(w) > 1) or w.isdigit() for w in words)


def _choose_type(kind: Kind, when: dates.ResolvedDate | None,
                 types: Sequence[str]) -> str | None:
    natural = "event" if kind == "plan" and when is not None else NATURAL_TYPE[kind]
    if natural in types:
        return natural
    return "fact" if "fact" in types else None


def _confidence(pattern: _Pattern, sentence: str, kind: Kind,
                when: dates.ResolvedDate | None) -> float:
    base = pattern.confidence
    if kind == "event" and when is None:
        base = UNDATED_EVENT_CONFIDENCE
    hedges = min(len(_HEDGE.findall(sentence)), 2)
    return round(max(MIN_CONFIDENCE, base - HEDGE_PENALTY * hedges), 2)


def _observed_at(kind: Kind, when: dates.ResolvedDate | None,
                 said_at: datetime) -> datetime | None:
    """The date the sentence gives; else, for what is true as it is said, when it was said. A
    past event without a date happened at some unknown time before: None."""
    if when is not None:
        return when.when
    if kind == "event":
        return None
    if said_at.tzinfo is None:
        return said_at.replace(tzinfo=UTC)
    return said_at.astimezone(UTC)


def _content(sentence: str, found: _Found, when: dates.ResolvedDate | None,
             speaker: str) -> str:
    """The clause from its pattern on, in the third person, with its date said in full."""
    text = sentence[found.start:]
    if when is not None and when.start >= found.start:
        cut_start, cut_end = when.start - found.start, when.end - found.start
        text = text[:cut_start].rstrip(" ,") + " " + text[cut_end:].lstrip(" ,")
    text = _AFTERTHOUGHT.sub("", text)
    text = third_person(text, speaker)
    text = re.sub(r"\s+([,.!;:])", r"\1", " ".join(text.split()))
    text = text.rstrip(" .!,;:-–—")
    if when is not None:
        text = f"{text} ({when.label})"
    text = text[:1].upper() + text[1:]
    clipped = clip(text, MAX_CONTENT_CHARS - 1)
    return clipped if clipped.endswith("…") else clipped + "."


# ----------------------------------------------------------------------------- third person

_UNCHANGED = frozenset({
    "can", "could", "will", "would", "shall", "should", "may", "might", "must", "was", "were",
    "wasn't", "didn't", "can't", "cannot", "won't", "couldn't", "wouldn't", "shouldn't",
    "went", "got", "saw", "had", "did", "made", "took", "came", "found", "bought", "met",
    "began", "ran", "left", "felt", "thought", "told", "said", "gave", "knew", "wrote", "won",
    "lost", "ate", "drank", "spent", "kept", "brought", "built", "taught", "caught", "sold",
    "sent", "heard", "paid", "became", "chose", "flew", "drove", "grew", "fell", "broke",
    "read", "put", "quit", "hit", "set", "cut", "let", "held", "learnt", "used", "mean",
})
_CONJUGATED = {"am": "is", "have": "has", "do": "does", "don't": "doesn't", "go": "goes",
               "haven't": "hasn't", "'m": "is", "be": "is"}


def conjugate(verb: str) -> str:
    """The third person singular of a verb after "I": "love" -> "loves", "went" -> "went"."""
    lower = verb.lower()
    if lower in _UNCHANGED or lower.endswith("ed") or lower.endswith("n't"):
        return _CONJUGATED.get(lower, verb)
    if lower in _CONJUGATED:
        return _CONJUGATED[lower]
    if re.search(r"(?:s|sh|ch|x|z|o)$", lower):
        return verb + "es"
    if re.search(r"[^aeiou]y$", lower):
        return verb[:-1] + "ies"
    return verb + "s"


_ADVERB_WORDS = frozenset(re.findall(r"[a-z]+", _ADV)) - {"do", "does", "of", "sort", "kind"}
_FIRST_PERSON = re.compile(
    r"\b(?:(?P<i_contr>i'm|i've|i'd|i'll)|(?P<we_contr>we're|we've|we'll|we'd)|(?P<i>i)"
    r"(?P<advs>(?:\s+(?:" + "|".join(sorted(_ADVERB_WORDS)) + r"))*)\s+(?P<verb>[a-z][\w']*)"
    r"|(?P<word>me|my|mine|myself|we|our|ours|let's))\b", re.IGNORECASE)
_CONTRACTIONS = {"i'm": "is", "i've": "has", "i'd": "would", "i'll": "will",
                 "we're": "are", "we've": "have", "we'll": "will", "we'd": "would"}


def third_person(text: str, name: str) -> str:
    """The text with the speaker named: "I love my dog" -> "Caroline loves Caroline's dog".
    Without a name the speaker is "the user" ("The user" at the start)."""
    def sub(m: re.Match[str]) -> str:
        who = name if m.start() == 0 or name != "The user" else "the user"
        if m["i_contr"]:
            return f"{who} {_CONTRACTIONS[m['i_contr'].lower()]}"
        if m["we_contr"]:
            return f"{who} and others {_CONTRACTIONS[m['we_contr'].lower()]}"
        if m["i"]:
            plural = re.search(r"\b(?:and|or)\s+$", text[:m.start()], re.IGNORECASE)
            verb = m["verb"] if plural else conjugate(m["verb"])
            return f"{who}{m['advs']} {verb}"
        word = m["word"].lower()
        return {
            "me": who, "my": f"{who}'s", "mine": f"{who}'s", "myself": "themself",
            "we": f"{who} and others", "our": "their", "ours": "theirs",
            "let's": f"{who} decided to",
        }[word]

    text = re.sub(r"(?<![\w'])us\b", "them", text)  # lower case only: "US" is a country
    return _FIRST_PERSON.sub(sub, text)


def _normal(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9']+", text.lower()))
