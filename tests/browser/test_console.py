"""The operator console in a real browser (Chromium via Playwright) against a real gate."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, expect

from shardgate.api.http import HttpServer
from shardgate.gate import Gate
from shardgate.topo.local import open_topo

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"


def _cluster(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "default_keyspace: ks\n"
        "keyspaces:\n"
        "  ks:\n"
        "    shards: {'-80': sqlite:///ks-80.db, '80-': 'sqlite:///ks80-.db'}\n"
        "    vschema:\n"
        "      sharded: true\n"
        "      vindexes: {hash: {type: hash}}\n"
        "      tables: {t: {column_vindexes: [{column: id, name: hash}]}}\n"
        "  lookup:\n"
        "    shards: {'0': sqlite:///lookup.db}\n"
        "    vschema: {sharded: false, tables: {}}\n"
    )
    return path


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[tuple[Gate, str]]:
    gate = await Gate.from_topo(await open_topo(_cluster(tmp_path)))
    server = HttpServer(gate, "127.0.0.1", 0)
    port = await server.start()
    try:
        yield gate, f"http://127.0.0.1:{port}"
    finally:
        await server.stop()
        await gate.close()


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
    s = gate.session("ks")
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
