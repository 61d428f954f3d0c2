"""Rendering in a child: the same bytes as in-process, its refusals, its cache."""

from __future__ import annotations

import sys
import uuid
from typing import Any

import pytest

from service.app import create_app
from service.content import content_for
from service.settings import Settings
from service.web.html_markdown import html_to_markdown
from service.web.keys import TEMPLATE_CONTEXT
from service.web.rendering import Page, render_pages
from service.web.templates import environment


@pytest.fixture
def context(settings: Settings) -> dict[str, Any]:
    """The template context of a real app."""
    return create_app(settings)[TEMPLATE_CONTEXT]


def robots(context: dict[str, Any]) -> Page:
    """A page no earlier render has asked for (its base URL is new)."""
    return Page("robots.txt", {**context, "base": f"https://{uuid.uuid4().hex}.cn"})


def test_a_page_and_its_markdown_are_what_rendering_here_would_give(
    settings: Settings, context: dict[str, Any]
) -> None:
    """The child renders with the same templates and converts with the same code."""
    base = f"https://{uuid.uuid4().hex}.cn"  # a page no earlier render asked for
    terms = content_for(settings).documents["terms"]
    page = Page(
        "terms.html",
        {**context, "base": base, "doc": terms, "zh": True},
        markdown_url=base + terms.path,
    )
    [(html, markdown)] = render_pages([page])
    here = environment().get_template("terms.html").render(**page.context)
    assert html == here
    assert markdown == html_to_markdown(here, base + terms.path)
    assert base + "/privacy" in markdown  # links made absolute against it


def test_a_document_that_breaks_a_rule_fails_with_the_childs_reason(
    context: dict[str, Any],
) -> None:
    """robots.txt asked as a document has no <main>: the reason, as ValueError."""
    page = Page("robots.txt", robots(context).context, markdown_url="https://x.cn/r")
    with pytest.raises(ValueError, match=r"^https://x\.cn/r: a document needs"):
        render_pages([page])


def test_a_page_rendered_once_is_not_rendered_again(
    monkeypatch: pytest.MonkeyPatch, context: dict[str, Any]
) -> None:
    """With no interpreter to start, a known page is answered; a new one is not."""
    page = robots(context)
    [first] = render_pages([page])
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    assert render_pages([page, page]) == [first, first]
    with pytest.raises(FileNotFoundError):
        render_pages([page, robots(context)])


def test_a_renderer_that_fails_is_an_error_that_says_so(
    monkeypatch: pytest.MonkeyPatch, context: dict[str, Any]
) -> None:
    """A child that exits non-zero (here `false`) raises RuntimeError, not a page."""
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with pytest.raises(RuntimeError, match="the page renderer exited 1"):
        render_pages([robots(context)])


def test_a_template_error_in_the_child_stops_with_its_traceback(
    context: dict[str, Any],
) -> None:
    """A context the template cannot render (StrictUndefined) fails the render."""
    bare = {key: value for key, value in context.items() if key != "base"}
    with pytest.raises(RuntimeError, match="UndefinedError: 'base' is undefined"):
        render_pages([Page("robots.txt", bare)])


def test_a_known_page_is_answered_even_when_its_batch_pushes_it_out(
    context: dict[str, Any],
) -> None:
    """A batch larger than the cache still answers its pages rendered before."""
    known = robots(context)
    [first] = render_pages([known])
    batch = [robots(context) for _ in range(70)]
    answered = render_pages([known, *batch])
    assert answered[0] == first
    assert [text for text, _ in answered[1:]] == [
        environment().get_template("robots.txt").render(**page.context)
        for page in batch
    ]
