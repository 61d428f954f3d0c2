"""The prompt check with a 100,000-term list: per request, the build, the memory.

The list is made up here (seeded, so every run checks the same terms): Chinese
terms of 3-6 characters and Latin ones of 5-12 letters, like an operator's real
list. The prompts are 10,000 made-up ones of 20-400 characters, mixed Chinese
and Latin with spaces and punctuation, a few of them containing a term.

Measured, in this process (the check runs inside the request handler, so its
time is what a submit pays on top of everything else):
- the check per prompt (normalise + one automaton pass), p50 and p99 in µs,
  with the 100,000-term list and, as the baseline, the packaged 9-term example
  list: their ratio shows the pass hardly depends on the list's length;
- `naive`: the same normalised prompt against every term with `in` (what a
  list check without an automaton costs), on a sample of 200 prompts;
- the build: seconds to normalise and add the terms and make the automaton,
  and the resident memory it adds (RSS before and after, the terms included).
And through the real command: `python -m service serve` starts (until /healthz
answers) with the 100,000-term list in its content directory against the
packaged list, the start-up time the build adds.
Usage: python bench/moderation.py [--terms 100000] [--prompts 10000]
"""

from __future__ import annotations

import argparse
import gc
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness import server

from service.content import CONTENT_DIR
from service.moderation.normalise import normalise
from service.moderation.wordlist import WordList, list_path, read_terms
from service.store.embedded import RedisServer

CJK = [chr(point) for point in range(0x4E00, 0x4E00 + 3000)]
LATIN = "abcdefghijklmnopqrstuvwxyz"


def make_terms(count: int, rng: random.Random) -> list[str]:
    """Half Chinese, half Latin, all distinct."""
    terms: set[str] = set()
    while len(terms) < count:
        if rng.random() < 0.5:
            terms.add("".join(rng.choices(CJK, k=rng.randint(3, 6))))
        else:
            terms.add("".join(rng.choices(LATIN, k=rng.randint(5, 12))))
    return sorted(terms)


def make_prompts(count: int, terms: list[str], rng: random.Random) -> list[str]:
    """Mixed prompts; one in fifty carries a listed term."""
    words = [*("".join(rng.choices(LATIN, k=rng.randint(2, 9))) for _ in range(500))]
    prompts = []
    for index in range(count):
        parts: list[str] = []
        length = rng.randint(20, 400)
        while sum(map(len, parts)) < length:
            if rng.random() < 0.5:
                parts.append("".join(rng.choices(CJK, k=rng.randint(1, 4))))
            else:
                parts.append(rng.choice(words))
            parts.append(rng.choice([" ", ", ", "，", "。", " - "]))
        if index % 50 == 0:
            parts.insert(rng.randrange(len(parts)), rng.choice(terms))
        prompts.append("".join(parts))
    return prompts


def rss_mib() -> float:
    """Return this process's resident set size now, in MiB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def timings(words: WordList, prompts: list[str]) -> tuple[float, float]:
    """Return the p50 and p99 of one check, in µs (no collection in between)."""
    samples = []
    gc.collect()
    gc.disable()
    try:
        for prompt in prompts:
            started = time.perf_counter_ns()
            words.match(prompt)
            samples.append((time.perf_counter_ns() - started) / 1000)
    finally:
        gc.enable()
    cuts = statistics.quantiles(samples, n=100)
    return cuts[49], cuts[98]


def naive(terms: list[str], prompts: list[str]) -> float:
    """Return the median µs of checking each normalised term with `in`."""
    keys = [normalise(term) for term in terms]
    samples = []
    for prompt in prompts:
        started = time.perf_counter_ns()
        text = normalise(prompt)
        any(key in text for key in keys)
        samples.append((time.perf_counter_ns() - started) / 1000)
    return statistics.median(samples)


def startup_seconds(redis_url: str, content: Path | None) -> float:
    """Start `serve` and return how long until /healthz answered."""
    variables = {"STUDIO_CONTENT_DIR": str(content)} if content else {}
    started = time.monotonic()
    with server("serve", redis_url, variables=variables):
        return time.monotonic() - started


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--terms", type=int, default=100_000)
    parser.add_argument("--prompts", type=int, default=10_000)
    args = parser.parse_args()
    rng = random.Random(27)
    terms = make_terms(args.terms, rng)
    prompts = make_prompts(args.prompts, terms, rng)
    before = rss_mib()
    started = time.perf_counter()
    big = WordList(terms)
    build = time.perf_counter() - started
    grown = rss_mib() - before
    small = WordList(read_terms(list_path(CONTENT_DIR)))
    timings(big, prompts[:500])  # warm up both
    big_p50, big_p99 = timings(big, prompts)
    small_p50, small_p99 = timings(small, prompts)
    slow = naive(terms, prompts[:200])
    hits = sum(big.match(prompt) is not None for prompt in prompts)
    print(f"list: {big.size} terms; {len(prompts)} prompts, {hits} refused")
    print(f"build: {build:.2f} s, +{grown:.0f} MiB resident (terms included)")
    print(
        f"check, {big.size} terms: p50 {big_p50:.0f} µs, p99 {big_p99:.0f} µs"
        f" | packaged {small.size} terms: p50 {small_p50:.0f} µs,"
        f" p99 {small_p99:.0f} µs | ratio p50 {big_p50 / small_p50:.2f},"
        f" p99 {big_p99 / small_p99:.2f}"
    )
    print(
        f"naive `in` per term, {big.size} terms: median {slow:.0f} µs"
        f" ({slow / big_p50:.0f}x the automaton)"
    )
    with tempfile.TemporaryDirectory() as temporary, RedisServer() as redis:
        content = Path(temporary) / "content"
        shutil.copytree(CONTENT_DIR, content)
        list_path(content).write_text("\n".join(terms) + "\n", encoding="utf-8")
        pairs = [
            (startup_seconds(redis.url, content), startup_seconds(redis.url, None))
            for _ in range(5)
        ]
        listed = statistics.median(first for first, _ in pairs)
        packaged = statistics.median(second for _, second in pairs)
    print(
        f"serve start-up: {listed:.2f} s with {big.size} terms, {packaged:.2f} s"
        f" with the packaged list (+{listed - packaged:.2f} s)"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
