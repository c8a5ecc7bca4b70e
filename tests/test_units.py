"""Pure logic from tables of cases: the retry policy, splitting, summarizing."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pipeline.jobs import KINDS, RetryPolicy
from pipeline.settings import JOB_KINDS, JobLimits, Settings
from pipeline.stages.analyze import split_text
from pipeline.stages.summarize import summarize


@pytest.mark.parametrize(
    ("attempt", "ceiling_s"),
    [(1, 30), (2, 60), (3, 120), (5, 480), (8, 3600), (30, 3600)],
)
def test_backoff_ceiling_doubles_up_to_the_cap(attempt: int, ceiling_s: float) -> None:
    assert RetryPolicy(base_s=30, max_s=3600).ceiling_s(attempt) == ceiling_s


@pytest.mark.parametrize(("rand", "expected_s"), [(0.0, 0.0), (0.5, 60.0), (0.999, 119.88)])
def test_backoff_has_full_jitter(rand: float, expected_s: float) -> None:
    delay = RetryPolicy(base_s=30, max_s=3600).delay_s(3, rand=lambda: rand)
    assert delay == pytest.approx(expected_s)


def test_settings_know_every_job_kind() -> None:
    assert JOB_KINDS == KINDS


def test_job_limits_take_per_kind_overrides_over_the_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MEMMILL_JOB_TIMEOUT_S", "100")
    monkeypatch.setenv("MEMMILL_MAX_ATTEMPTS", "4")
    monkeypatch.setenv("MEMMILL_JOB_OVERRIDES", '{"ocr": {"timeout_s": 900, "max_attempts": 2}}')
    settings = Settings()
    assert settings.job_limits("ocr") == JobLimits(
        timeout_s=900, lease_s=60, max_attempts=2, retry_base_s=30, retry_max_s=3600)
    # The environment replaced the default overrides whole: analyze is back to the defaults.
    assert settings.job_limits("analyze") == JobLimits(
        timeout_s=100, lease_s=60, max_attempts=4, retry_base_s=30, retry_max_s=3600)
    assert settings.max_attempts_for("embed") == 4


def test_default_overrides_give_ocr_and_analyze_more_time() -> None:
    settings = Settings()
    assert settings.job_limits("ocr").timeout_s > settings.job_timeout_s
    assert settings.job_limits("analyze").timeout_s > settings.job_timeout_s
    assert settings.job_limits("embed").timeout_s == settings.job_timeout_s


@pytest.mark.parametrize(
    ("overrides", "complaint"),
    [
        ('{"ocrr": {"timeout_s": 5}}', "unknown job kinds ['ocrr']"),
        ('{"ocr": {"timeout": 5}}', "Extra inputs are not permitted"),
        ('{"ocr": {"max_attempts": 0}}', "greater than or equal to 1"),
    ],
)
def test_bad_job_overrides_are_refused_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, overrides: str, complaint: str
) -> None:
    monkeypatch.setenv("MEMMILL_JOB_OVERRIDES", overrides)
    with pytest.raises(ValidationError, match=complaint.replace("[", r"\[")):
        Settings()


@pytest.mark.parametrize(("value", "complaint"), [
    ("8", "greater than or equal to 16"), ("lots", "valid integer")])
def test_a_bad_embedded_buffer_size_is_refused_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, value: str, complaint: str
) -> None:
    monkeypatch.setenv("MEMMILL_EMBEDDED_PG_BUFFERS_MB", value)
    with pytest.raises(ValidationError, match=complaint):
        Settings()


def test_short_text_is_one_part() -> None:
    parts = split_text("One paragraph.\n\nAnother one.", max_words=50, overlap_words=5)
    assert [p.text for p in parts] == ["One paragraph.\n\nAnother one."]


def test_paragraphs_are_packed_within_the_budget() -> None:
    paragraphs = [" ".join(f"p{i}w{j}" for j in range(30)) for i in range(5)]
    parts = split_text("\n\n".join(paragraphs), max_words=70, overlap_words=5)
    assert [len(p.text.split()) for p in parts] == [60, 60, 30]
    assert [p.position for p in parts] == [0, 1, 2]
    # Whole paragraphs: no paragraph is cut when it fits on its own.
    assert parts[0].text == "\n\n".join(paragraphs[:2])


def test_long_paragraph_is_cut_at_sentences_with_overlap() -> None:
    sentences = [" ".join(f"s{i}w{j}" for j in range(9)) + "." for i in range(10)]
    parts = split_text(" ".join(sentences), max_words=30, overlap_words=5)
    assert all(len(p.text.split()) <= 30 for p in parts)
    words = [w for p in parts for w in p.text.split()]
    assert set(words) == set(" ".join(sentences).split())  # nothing lost
    assert parts[1].text.split()[0] in parts[0].text.split()  # overlap carried over


def test_one_huge_sentence_becomes_overlapping_windows() -> None:
    text = " ".join(f"w{i}" for i in range(100))
    parts = split_text(text, max_words=40, overlap_words=10)
    assert [p.text.split()[0] for p in parts] == ["w0", "w30", "w60"]
    assert parts[-1].text.split()[-1] == "w99"


def test_blank_text_has_no_parts() -> None:
    assert split_text(" \n\n \t", max_words=10, overlap_words=2) == []


def test_summary_of_short_text_is_the_text() -> None:
    assert summarize("  A short note.  ", max_chars=100) == "A short note."


def test_summary_keeps_central_sentences_within_the_limit() -> None:
    text = (
        "Glaciers store most of the fresh water on Earth. "
        "My cat likes sleeping in the sun. "
        "As glaciers melt, fresh water flows into the oceans and sea levels rise. "
        "Melting glaciers also change ocean salinity and currents. "
        "The weather was nice on Tuesday."
    )
    summary = summarize(text, max_chars=160)
    assert len(summary) <= 160
    assert "glaciers" in summary.lower()
    assert "cat" not in summary and "Tuesday" not in summary


def test_summary_of_text_without_sentences_is_truncated() -> None:
    summary = summarize("x" * 500, max_chars=100)
    assert len(summary) <= 100 and summary.endswith("…")


SEARCH_FILTER_CASES = [
    (["topic=baking"], [], [], {}, False, {"tags": {"topic": "baking"}}),
    (["lang=en", "lang=fr", "team=core"], [], [], {}, False,
     {"tags": {"lang": ["en", "fr"], "team": "core"}}),
    (["note=a=b"], ["note"], ["x/1", "x/2"], {"created_after": "2026-01-01T00:00:00Z",
                                              "updated_before": None}, True,
     {"tags": {"note": "a=b"}, "kinds": ["note"], "item_ids": ["x/1", "x/2"],
      "created_after": "2026-01-01T00:00:00Z", "valid_only": True}),
    ([], [], [], {}, False, {}),
]


@pytest.mark.parametrize(("tags", "kinds", "items", "dates", "valid_only", "expected"),
                         SEARCH_FILTER_CASES)
def test_cli_search_filters_match_the_api(
    tags: list[str], kinds: list[str], items: list[str], dates: dict[str, str | None],
    valid_only: bool, expected: dict[str, object],
) -> None:
    from api.schemas import SearchRequest
    from memmill.cli import _search_filters

    filters = _search_filters(tags, kinds, items, dates, valid_only)
    assert filters == expected
    SearchRequest.model_validate({"query": "x", "filters": filters})  # the API takes it


@pytest.mark.parametrize("tag", ["novalue", "=x"])
def test_cli_search_refuses_a_tag_without_key_and_value(tag: str) -> None:
    import typer

    from memmill.cli import _search_filters

    with pytest.raises(typer.Exit):
        _search_filters([tag], [], [], {}, False)
