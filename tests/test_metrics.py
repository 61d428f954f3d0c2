"""Prometheus metrics: counted in the app, exposed on their own listener only."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.store.embedded import MailCatcher

from .conftest import SettingsFactory
from .ports import free_port
from .workbench import sign_in


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_metrics_count_requests_limits_and_credits_on_their_own_port(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    mail_server: MailCatcher,
    redis: Redis,
) -> None:
    """Requests by route and status, limiter outcomes, credits debited and refunded."""
    port = free_port()
    settings = make_settings(STUDIO_METRICS_PORT=str(port), STUDIO_DEMO_UPSTREAM="1")
    client = await aiohttp_client(create_app(settings))
    await sign_in(client, mail_server)
    generation = await (
        await client.post(
            "/api/generations", json={"model": "seedream-4", "prompt": "count me"}
        )
    ).json()
    await client.post(f"/api/generations/{generation['id']}/cancel")
    await client.get("/api/square")
    assert (await client.get("/metrics")).status == 404  # not on the public port
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        samples = _samples(await response.text())
    requests = "studio_http_requests_total"
    assert (
        samples[(requests, (("route", "generations_submit"), ("status", "202")))] == 1
    )
    assert samples[(requests, (("route", "auth_verify"), ("status", "200")))] == 1
    assert samples[("studio_limiter_decisions_total", (("outcome", "allowed"),))] >= 3
    assert samples[("studio_credits_total", (("movement", "debited"),))] == 6
    assert samples[("studio_credits_total", (("movement", "refunded"),))] == 6
    assert ("studio_queue_depth", ()) in samples
