"""GET /en as HTML and as Markdown: the shipped `serve` against a bare aiohttp app.

`serve` is started as a deployment starts it: `python -m service serve` with its
default settings (uvloop, the access log on). Baselines, each a plain aiohttp app
answering from constants:
- `bare` sends the byte-identical response (same body, same headers), so its ratio
  is the cost of our machinery: routing, negotiation, conditional GET, variants;
- `bare-body` sends the same body with only a Content-Type, so its ratio also
  counts the headers the contract requires.
Also: the access log's own cost (serve against serve with STUDIO_ACCESS_LOG=off),
and our app on uvloop against our app on asyncio.
Usage: python bench/documents.py [--pairs 9] [--seconds 2] [--connections 32]
"""

from __future__ import annotations

from contextlib import ExitStack

from harness import arguments, compare, report, server

from service.store.embedded import RedisServer


def main() -> None:
    """Measure and print the ratios."""
    args = arguments(__doc__)
    md = "text/markdown"
    with RedisServer() as redis, ExitStack() as stack:
        ours = stack.enter_context(server("serve", redis.url))
        quiet = stack.enter_context(
            server("serve", redis.url, variables={"STUDIO_ACCESS_LOG": "off"})
        )
        fast = stack.enter_context(server("ours", redis.url))
        bare = stack.enter_context(server("bare", redis.url))
        body = stack.enter_context(server("bare-body", redis.url))
        plain = stack.enter_context(server("ours", redis.url, loop="asyncio"))
        rows = {
            "html vs bare": compare((ours, "/en", None), (bare, "/en", None), args),
            "markdown vs bare": compare(
                (ours, "/en", md), (bare, "/en.md", None), args
            ),
            "html vs bare-body": compare(
                (ours, "/en", None), (body, "/en", None), args
            ),
            "md vs bare-body": compare((ours, "/en", md), (body, "/en.md", None), args),
            "log on vs off (serve)": compare(
                (ours, "/en", None), (quiet, "/en", None), args
            ),
            "uvloop vs asyncio": compare(
                (fast, "/en", None), (plain, "/en", None), args
            ),
        }
    report(
        f"GET /en; wrk -t1 -c{args.connections}; {args.pairs} alternating pairs of"
        f" {args.seconds}s; medians; cpu = requests per server CPU-second",
        rows,
    )


if __name__ == "__main__":
    main()
