"""GET /en through deploy/nginx.conf's document cache against nginx's static files.

The shipped `serve` (default settings) runs behind Debian's real nginx with
deploy/nginx.conf as it is (its cache, maps and workers). The baseline is
the same nginx serving the very bytes of /en, HTML and Markdown, as static
files from a second `server` block with nginx's defaults; so the ratio is what
the cache costs over nginx's own static path (target: at least 0.8). Also
against static files held open (open_file_cache, as the document cache's
location has), and, for scale, against `serve` alone.
nginx runs on CPU 0 (with `serve`), wrk on CPU 1; cpu = requests per nginx
CPU-second (master and workers).
Usage: python bench/proxy.py [--pairs 9] [--seconds 2] [--connections 32]
"""

from __future__ import annotations

import os
import tempfile
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from harness import TICKS, Server, arguments, compare, pinned, report, server

from service.store.embedded import RedisServer, free_port
from tests.nginx import nginx_in_front


@dataclass(frozen=True)
class Nginx(Server):
    """nginx's port, counting the CPU of its master and all its workers."""

    def cpu_seconds(self) -> float:
        """Return user + system CPU time of the master and its children."""
        children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text()
        total = 0
        for pid in [self.pid, *map(int, children.split())]:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        return total / TICKS


def _static_server(directory: Path, port: int, extra: str = "") -> str:
    """Return a `server` block serving /en.html and /en.md as files."""
    locations = extra + "".join(
        f"        location = /en.{suffix} {{\n"
        f"            types {{}}\n"
        f'            default_type "{media}; charset=utf-8";\n'
        f"            alias {directory / f'en.{suffix}'};\n"
        f"        }}\n"
        for suffix, media in (("html", "text/html"), ("md", "text/markdown"))
    )
    return f"    server {{\n        listen 127.0.0.1:{port};\n{locations}    }}\n"


def _fetch(port: int, accept: str) -> bytes:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/en", headers={"Accept": accept}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        body: bytes = response.read()
        return body


def main() -> None:
    """Measure and print the ratios."""
    args = arguments(__doc__)
    md = "text/markdown"
    with RedisServer() as redis, ExitStack() as stack:
        app = stack.enter_context(server("serve", redis.url))
        files = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        files.chmod(0o755)  # nginx's workers run as another user when we are root
        for suffix, accept in (("html", "text/html"), ("md", md)):
            (files / f"en.{suffix}").write_bytes(_fetch(app.port, accept))
            (files / f"en.{suffix}").chmod(0o644)
        static_port, held_port = free_port(), free_port()
        held = "        open_file_cache max=1000 inactive=60s;\n"
        proxy = stack.enter_context(
            nginx_in_front(
                f"127.0.0.1:{app.port}",
                servers=_static_server(files, static_port)
                + _static_server(files, held_port, held),
                prefix=pinned(0, []),
            )
        )
        cache = Nginx(proxy.port, proxy.pid)
        static = Nginx(static_port, proxy.pid)
        static_held = Nginx(held_port, proxy.pid)
        for accept in ("*/*", md):
            if _fetch(cache.port, accept) != _fetch(app.port, accept):
                raise RuntimeError(f"the cache's bytes differ for {accept}")
        rows = {
            "html: cache vs static": compare(
                (cache, "/en", None), (static, "/en.html", None), args
            ),
            "md: cache vs static": compare(
                (cache, "/en", md), (static, "/en.md", None), args
            ),
            "html: cache vs held open": compare(
                (cache, "/en", None), (static_held, "/en.html", None), args
            ),
            "html: cache vs serve": compare(
                (cache, "/en", None), (app, "/en", None), args
            ),
        }
    report(
        f"GET /en; wrk -t1 -c{args.connections}; {args.pairs} alternating pairs of"
        f" {args.seconds}s; medians; nginx workers {os.cpu_count()} (auto) on CPU 0;"
        f" load average {Path('/proc/loadavg').read_text().split()[:3]}",
        rows,
    )


if __name__ == "__main__":
    main()
