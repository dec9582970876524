"""The operator console in a real browser (Chromium via Playwright) against a real gate."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, Page, expect

from shardgate.auth.identity import TRUSTED
from shardgate.gate import Gate

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"


@pytest.fixture
def site(console_site: tuple[Gate, str]) -> tuple[Gate, str]:
    return console_site


async def _page(browser: Browser) -> Page:
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(10_000)
    return page


async def test_cluster_page_lists_the_shards(browser: Browser, site: tuple[Gate, str]) -> None:
    _, base = site
    page = await _page(browser)
    await page.goto(f"{base}/")
    rows = page.locator("#shards tbody tr")
    await expect(rows).to_have_count(3)
    await expect(rows.nth(0)).to_contain_text("-80")
    await expect(rows.nth(1)).to_contain_text("80-")
    await expect(rows.nth(2)).to_contain_text("lookup")
    SHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SHOTS / "cluster.png"), full_page=True)


async def test_vschema_editor_red_yellow_diff_save(
    browser: Browser, site: tuple[Gate, str]
) -> None:
    gate, base = site
    s = gate.session("ks", identity=TRUSTED)
    await gate.execute(s, "CREATE TABLE IF NOT EXISTS t (id BIGINT PRIMARY KEY, v TEXT)")
    await gate.execute(s, "INSERT INTO t (id, v) VALUES (5, 'five')")
    page = await _page(browser)
    await page.goto(f"{base}/vschema?keyspace=ks")
    name = page.locator('[data-path="tables.t.column_vindexes[0].name"]')
    await expect(name).to_have_value("hash")
    await expect(page.locator("#findings")).to_contain_text("no problems found")

    # an error: the field turns red, with the reason in its tooltip; save is off
    await name.fill("nosuch")
    await expect(name).to_have_class("field-error")
    assert "nosuch" in (await name.get_attribute("title") or "")
    await expect(page.locator("#save")).to_be_disabled()

    # fixed with a vindex that compiles but looks wrong: a yellow warning
    await page.locator('[data-path="vindexes.hash.type"]').select_option("xxhash")
    await name.fill("hash")
    await expect(name).not_to_have_class("field-error")
    await expect(page.locator("#diff")).to_contain_text('"type": "xxhash"')
    # the primary vindex of t is fine; an unused lookup vindex would be yellow: make one
    await page.locator("#mode-json").click()
    doc = await page.locator("#json").input_value()
    doc = doc.replace('"vindexes": {', '"vindexes": {"spare": {"type": "hash"}, ', 1)
    await page.locator("#json").fill(doc)
    await expect(page.locator("#findings li.warning")).to_contain_text("no table uses")
    await page.locator("#mode-form").click()
    spare = page.locator('[data-path="vindexes.spare.type"]')
    await expect(spare).to_have_class("field-warning")
    await page.screenshot(path=str(SHOTS / "vschema-editor.png"), full_page=True)

    await expect(page.locator("#save")).to_be_enabled()
    await page.locator("#save").click()
    await expect(page.locator("#status")).to_contain_text("saved")
    # the gate routes by the saved VSchema: xxhash puts id 5 on a known shard
    assert gate.vschema.keyspace("ks").vindexes["hash"].__class__.__name__ == "XXHash"
    result = await gate.execute(s, "SELECT v FROM t WHERE id = 5")
    plan = gate.explain("SELECT v FROM t WHERE id = 5", "ks")
    assert plan["Instructions"]["Variant"] == "EqualUnique"
    assert plan["Instructions"]["Vindex"] == "hash"
    assert result.rows in ([("five",)], [])  # the row may now live on the other shard


async def test_queue_page_depth_moves_and_retry_refires_a_failed_event(
    browser: Browser, site: tuple[Gate, str]
) -> None:
    gate, base = site
    s = gate.session("ks", identity=TRUSTED)
    await gate.execute(s, "CREATE QUEUE jobs (user_id BIGINT NOT NULL, body VARCHAR(50)) "
                          "SHARD BY user_id WITH (ack_wait = 1, max_attempts = 1, "
                          "min_backoff = 0, max_backoff = 0)")
    page = await _page(browser)
    await page.goto(f"{base}/queues")
    box = page.locator('section.queue[data-queue="jobs"]')
    await expect(box).to_be_visible()

    async def depth(state: str) -> int:
        texts = await box.locator(f'td[data-k="{state}"]').all_inner_texts()
        return sum(int(t or 0) for t in texts)

    for i in range(3):
        await gate.execute(s, f"INSERT INTO jobs (user_id, body) VALUES ({i}, 'job {i}')")
    await _poll(lambda: depth("pending"), 3, 10)

    fired: list[tuple[str, int, str]] = []
    got = asyncio.Event()

    async def receive() -> None:
        async for batch in gate.queue_receive("ks", "jobs"):
            for ev in batch.events:
                fired.append((ev.shard, ev.id, str(ev.values[-1])))
                got.set()

    receiver = asyncio.create_task(receive())
    try:
        await asyncio.wait_for(_until(lambda: len(fired) >= 3), 10)
        by_body = {body: (shard, eid) for shard, eid, body in fired}
        for body in ("job 0", "job 1"):  # ack two, leave "job 2" to fail
            shard, eid = by_body[body]
            await gate.queue_ack("ks", "jobs", shard, [eid])
        await _poll(lambda: depth("acked"), 2, 10)
        await _poll(lambda: depth("failed"), 1, 15)
        await page.screenshot(path=str(SHOTS / "queues.png"), full_page=True)
        shard, eid = by_body["job 2"]
        fired.clear()
        await box.locator(f'table.failed tr[data-id="{eid}"] button.retry').click()
        await asyncio.wait_for(_until(lambda: any(e == eid for _, e, _ in fired)), 10)
        await _poll(lambda: depth("failed"), 0, 10)
    finally:
        receiver.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await receiver


async def _poll(read: Any, want: int, timeout: float) -> None:
    """Wait until ``await read()`` is ``want`` (what the page shows), or fail saying what it was."""
    deadline = asyncio.get_running_loop().time() + timeout
    while (got := await read()) != want:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"the page shows {got}, expected {want}, after {timeout} s")
        await asyncio.sleep(0.1)


async def _until(cond: Any) -> None:
    while not cond():
        await asyncio.sleep(0.02)


async def test_queue_page_shows_segmented_queues_and_inbox_stores(
    browser: Browser, site: tuple[Gate, str]
) -> None:
    from shardgate.queues.inbox.store import InboxStore

    gate, base = site
    s = gate.session("ks", identity=TRUSTED)
    await gate.execute(s, "CREATE QUEUE sjobs (user_id BIGINT NOT NULL, body VARCHAR(50)) "
                          "SHARD BY user_id WITH (storage = segmented)")
    await gate.queue_enqueue("ks", "sjobs", [(str(i), f"job {i}") for i in range(4)])
    inbox = InboxStore(gate, "ks", "notes")
    await inbox.create()
    await inbox.append(7, "hello")
    await inbox.append(8, "world")
    page = await _page(browser)
    await page.goto(f"{base}/queues")
    seg = page.locator('section.queue[data-queue="sjobs"] table.segmented-shards')
    await expect(seg.locator("tr[data-shard]")).to_have_count(2)
    await expect(seg).to_contain_text("pending")
    row = page.locator('table.inbox-stores tr[data-inbox="notes"]')
    await expect(row).to_be_visible()
    await row.locator("button.count").click()
    await expect(row.locator('td[data-k="counts"]')).to_contain_text('"messages":2')
    await page.screenshot(path=str(SHOTS / "queues-segmented-inbox.png"), full_page=True)
