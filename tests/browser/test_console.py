"""The operator console in a real browser (Chromium via Playwright) against a real gate.

One served cluster for the module: ``shardgate up``'s embedded default (commerce on
two SQLite shards, lookup) opened by the function ``shardgate up`` uses, plus a
keyspace ``orders`` for the workflow test, behind HTTP Basic with a table ACL
(``dba`` is admin, ``rita`` reads). Layout checks run at 1400x1000 and 1000x800.
Screenshots in docs/console/ are rewritten only with ``SHARDGATE_SCREENSHOTS=1``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Dialog, Page, expect

from shardgate.api.http import HttpServer
from shardgate.auth.acl import TableACL
from shardgate.auth.guard import Guard
from shardgate.auth.identity import TRUSTED
from shardgate.auth.users import StaticUsers
from shardgate.cli.common import CLUSTER_FILE_NAME
from shardgate.cli.serve import _open_embedded
from shardgate.errors import ShardgateError
from shardgate.gate import Gate
from shardgate.topo.embedded import embedded_topology
from shardgate.topo.file import write_cluster_file
from shardgate.topo.model import Topology
from shardgate.workflows.reshard import ReshardSpec, ReshardWorkflow
from tests.browser.conftest import screenshots_wanted

pytestmark = pytest.mark.asyncio(loop_scope="module")

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"
VIEWPORTS = [pytest.param((1400, 1000), id="1400x1000"), pytest.param((1000, 800), id="1000x800")]
ADMIN, READER = ("dba", "d-pw"), ("rita", "r-pw")
#: a table name longer than the form's name column
LONG = "customer_loyalty_points_ledger_entries_by_region_and_quarter"


@dataclass
class Served:
    gate: Gate
    base: str
    data: Path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    data = tmp_path_factory.mktemp("console")
    doc = embedded_topology(data, shards=2).to_dict()
    doc["keyspaces"]["orders"] = {
        "shards": {"-80": f"sqlite:///{data / 'orders-80.db'}",
                   "80-": f"sqlite:///{data / 'orders80-.db'}"},
        "vschema": {"sharded": True, "vindexes": {"hash": {"type": "hash"}},
                    "tables": {"item": {"column_vindexes": [{"column": "id", "name": "hash"}]}}},
    }
    write_cluster_file(Topology.from_dict(doc), data / CLUSTER_FILE_NAME)
    users = StaticUsers.from_mapping({"rita": [{"Password": "r-pw"}],
                                      "dba": [{"Password": "d-pw"}]})
    acl = TableACL.from_mapping({"table_groups": [{
        "name": "all", "table_names_or_prefixes": ["%"], "readers": ["rita"],
        "writers": [], "admins": ["dba"]}]})
    gate = await _open_embedded(data, guard=Guard(acl))  # what `shardgate up` opens
    gate.compete_for_leases()  # as `shardgate up` does before it listens
    server = HttpServer(gate, "127.0.0.1", 0, users=users)
    try:
        yield Served(gate, f"http://127.0.0.1:{await server.start()}", data)
    finally:
        await server.stop()
        await gate.close()


@contextlib.asynccontextmanager
async def _page(browser: Browser, viewport: tuple[int, int] = (1400, 1000),
                user: tuple[str, str] = ADMIN) -> AsyncIterator[Page]:
    ctx = await browser.new_context(viewport={"width": viewport[0], "height": viewport[1]},
                                    http_credentials={"username": user[0],
                                                      "password": user[1]})
    try:
        page = await ctx.new_page()
        page.set_default_timeout(10_000)
        yield page
    finally:
        await ctx.close()


async def _shot(page: Page, name: str) -> None:
    if screenshots_wanted():
        SHOTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(SHOTS / name), full_page=True)


async def _no_horizontal_scroll(page: Page, width: int) -> None:
    assert await page.evaluate("document.documentElement.scrollWidth") <= width


async def test_cluster_page_names_the_lease_holder_and_the_log_positions(
    browser: Browser, served: Served
) -> None:
    gate = served.gate
    # no queue exists: the shard lease is held all the same (it is the shard's)
    await _until(lambda: all(t.describe().get("lease_holder") for t in gate.tablets.values()))
    async with _page(browser) as page:
        await page.goto(f"{served.base}/")
        rows = page.locator("#shards tbody tr")
        await expect(rows).to_have_count(5)
        for i in range(5):
            await expect(rows.nth(i).locator("td").nth(7)).to_contain_text(
                "in-process (")
        commerce = rows.filter(has_text="commerce")
        await expect(commerce).to_have_count(2)
        # SQLite keeps a change log from the first change stream on: until then, why not
        await expect(commerce.first.locator(".log-note")).to_contain_text(
            "from the first change stream on")

        got = asyncio.Event()

        async def consume() -> None:
            async for _ in gate.update_stream("commerce", heartbeat_s=0.1, identity=TRUSTED):
                got.set()

        task = asyncio.create_task(consume())
        try:
            await asyncio.wait_for(got.wait(), 20)
            s = gate.session("commerce", identity=TRUSTED)
            await gate.execute(s, "INSERT INTO customer (email, name) VALUES ('a@x', 'a')")
            await page.reload()
            for i in range(2):
                await expect(commerce.nth(i).locator("code.log-end")).to_have_text(
                    re.compile(r"^\d+$"))
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@pytest.mark.parametrize("viewport", VIEWPORTS)
async def test_charts_show_traffic_per_keyspace_and_shard(
    browser: Browser, served: Served, viewport: tuple[int, int]
) -> None:
    gate = served.gate
    s = gate.session("commerce", identity=TRUSTED)
    for i in range(50):
        await gate.execute(s, "SELECT name FROM customer WHERE customer_id = :i", {"i": i})
    order = 900_000 + viewport[0]  # a statement the shard refuses: an error in the charts
    insert = f"INSERT INTO corder (order_id, customer_id, sku) VALUES ({order}, 1, 'x')"
    await gate.execute(s, insert)
    with pytest.raises(ShardgateError):
        await gate.execute(s, insert)
    async with _page(browser, viewport) as page:
        await page.goto(f"{served.base}/")
        row = page.locator('#charts .chart-row[data-keyspace="commerce"][data-shard=""]')
        await expect(row).to_be_visible()
        for name in ("qps", "errors", "latency"):
            fig = row.locator(f'figure[data-chart="{name}"]')
            await expect(fig.locator("svg circle").first).to_be_visible()
            assert float(await fig.get_attribute("data-max") or 0) > 0, name
            box = await fig.bounding_box()
            assert box is not None and box["width"] > 150 and box["height"] > 50, (name, box)
        shards = page.locator('#charts .chart-row[data-keyspace="commerce"]:not([data-shard=""])')
        await expect(shards).to_have_count(2)
        for i in range(2):
            qps = shards.nth(i).locator('figure[data-chart="qps"]')
            assert float(await qps.get_attribute("data-max") or 0) > 0
        await _no_horizontal_scroll(page, viewport[0])
        await _shot(page, f"cluster-{viewport[0]}x{viewport[1]}.png")


async def _set_tables(gate: Gate, keyspace: str, **tables: Any) -> None:
    """Add VSchema tables of ``keyspace`` straight in the topo store; the gate applies it."""

    def change(doc: dict[str, Any]) -> dict[str, Any]:
        doc.setdefault("tables", {}).update(tables)
        return doc

    await gate.topo.update_vschema(keyspace, change)
    gate.apply_topology(await gate.topo.load_topology())


@pytest.mark.parametrize("viewport", VIEWPORTS)
async def test_vschema_form_keeps_labels_beside_inputs_and_shows_auto_increment(
    browser: Browser, served: Served, viewport: tuple[int, int]
) -> None:
    gate = served.gate
    await _set_tables(gate, "commerce", **{LONG: {
        "column_vindexes": [{"column": "customer_id", "name": "hash"}],
        "auto_increment": {"column": "entry_id", "sequence": "order_seq"}}})
    async with _page(browser, viewport) as page:
        await page.goto(f"{served.base}/vschema?keyspace=commerce")
        ai = '[data-path="tables.customer.auto_increment.{}"]'
        await expect(page.locator(ai.format("column"))).to_have_value("customer_id")
        await expect(page.locator(ai.format("sequence"))).to_have_value("customer_seq")
        await expect(page.locator("#relations")).to_contain_text(
            "customer.customer_id ← sequence customer_seq")
        labels = page.locator("#form label.field")
        count = await labels.count()
        assert count >= 15
        for i in range(count):
            text = await labels.nth(i).locator("span").bounding_box()
            field = await labels.nth(i).locator("input, select").bounding_box()
            assert text is not None and field is not None
            middle = abs((text["y"] + text["height"] / 2) - (field["y"] + field["height"] / 2))
            assert middle < 4, (i, await labels.nth(i).inner_text(), text, field)
            assert text["x"] + text["width"] <= field["x"] + 1, (i, text, field)
        # long names and values are shown whole: wrapped, not cut
        name = page.locator(f'#form .row[data-name="{LONG}"] .name')
        await expect(name).to_have_text(LONG)
        assert await name.evaluate("e => e.scrollWidth <= e.clientWidth + 1")
        for path in ('vindexes.customer_email_idx.params.table',
                     f"tables.{LONG}.auto_increment.column"):
            field_el = page.locator(f'[data-path="{path}"]')
            assert await field_el.evaluate("e => e.scrollWidth <= e.clientWidth + 1"), path
        await _no_horizontal_scroll(page, viewport[0])
        await _shot(page, f"vschema-editor-{viewport[0]}x{viewport[1]}.png")


async def test_auto_increment_is_edited_in_the_form_and_saved(
    browser: Browser, served: Served
) -> None:
    gate = served.gate
    async with _page(browser) as page:
        await page.goto(f"{served.base}/vschema?keyspace=commerce")
        seq = page.locator('[data-path="tables.corder.auto_increment.sequence"]')
        await expect(seq).to_have_value("order_seq")
        await seq.fill("customer_seq")
        await expect(page.locator("#diff")).to_contain_text('"sequence": "customer_seq"')
        await expect(page.locator("#save")).to_be_enabled()
        await page.locator("#save").click()
        await expect(page.locator("#status")).to_contain_text("saved")
    doc, _ = await gate.topo.keyspace_vschema("commerce")
    assert doc["tables"]["corder"]["auto_increment"] == {"column": "order_id",
                                                         "sequence": "customer_seq"}


async def test_vschema_editor_red_yellow_diff_save(browser: Browser, served: Served) -> None:
    gate = served.gate
    async with _page(browser) as page:
        await page.goto(f"{served.base}/vschema?keyspace=commerce")
        name = page.locator('[data-path="tables.corder.column_vindexes[0].name"]')
        await expect(name).to_have_value("hash")

        # an error: the field turns red, with the reason in its tooltip; save is off
        await name.fill("nosuch")
        await expect(name).to_have_class(re.compile("field-error"))
        assert "nosuch" in (await name.get_attribute("title") or "")
        await expect(page.locator("#save")).to_be_disabled()
        await name.fill("hash")
        await expect(name).not_to_have_class(re.compile("field-error"))

        # a vindex no table uses compiles but looks wrong: yellow
        await page.locator("#mode-json").click()
        doc = await page.locator("#json").input_value()
        doc = doc.replace('"vindexes": {', '"vindexes": {"spare": {"type": "hash"}, ', 1)
        await page.locator("#json").fill(doc)
        await expect(page.locator("#findings li.warning")).to_contain_text("no table uses")
        await page.locator("#mode-form").click()
        spare = page.locator('[data-path="vindexes.spare.type"]')
        await expect(spare).to_have_class(re.compile("field-warning"))
        await expect(page.locator("#diff")).to_contain_text('"spare"')
        await _shot(page, "vschema-editor.png")

        await expect(page.locator("#save")).to_be_enabled()
        await page.locator("#save").click()
        await expect(page.locator("#status")).to_contain_text("saved")
    assert "spare" in gate.vschema.keyspace("commerce").vindexes


async def test_queue_page_depth_moves_charts_draw_and_retry_refires_a_failed_event(
    browser: Browser, served: Served
) -> None:
    gate = served.gate
    s = gate.session("commerce", identity=TRUSTED)
    await gate.execute(s, "CREATE QUEUE jobs (user_id BIGINT NOT NULL, body VARCHAR(50)) "
                          "SHARD BY user_id WITH (ack_wait = 1, max_attempts = 1, "
                          "min_backoff = 0, max_backoff = 0)")
    async with _page(browser) as page:
        await page.goto(f"{served.base}/queues")
        box = page.locator('section.queue[data-queue="jobs"]')
        await expect(box).to_be_visible()

        async def depth(state: str) -> int:
            texts = await box.locator(f'td[data-k="{state}"]').all_inner_texts()
            return sum(int(t or 0) for t in texts)

        for i in range(3):
            await gate.execute(s, f"INSERT INTO jobs (user_id, body) VALUES ({i}, 'job {i}')")
        await _poll(lambda: depth("pending"), 3, 10)
        pending = box.locator('figure[data-chart="pending"]')
        await expect(pending.locator("svg circle")).to_be_visible()
        await expect(box.locator('figure[data-chart="throughput"]')).to_be_visible()

        fired: list[tuple[str, int, str]] = []

        async def receive() -> None:
            async for batch in gate.queue_receive("commerce", "jobs"):
                for ev in batch.events:
                    fired.append((ev.shard, ev.id, str(ev.values[-1])))

        receiver = asyncio.create_task(receive())
        try:
            await asyncio.wait_for(_until(lambda: len(fired) >= 3), 10)
            by_body = {body: (shard, eid) for shard, eid, body in fired}
            for body in ("job 0", "job 1"):  # ack two, leave "job 2" to fail
                shard, eid = by_body[body]
                await gate.queue_ack("commerce", "jobs", shard, [eid])
            await _poll(lambda: depth("acked"), 2, 10)
            await _poll(lambda: depth("failed"), 1, 15)
            await _shot(page, "queues.png")
            shard, eid = by_body["job 2"]
            fired.clear()
            await box.locator(f'table.failed tr[data-id="{eid}"] button.retry').click()
            await asyncio.wait_for(_until(lambda: any(e == eid for _, e, _ in fired)), 10)
            await _poll(lambda: depth("failed"), 0, 10)
        finally:
            receiver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await receiver


async def test_queue_page_shows_segmented_queues_and_inbox_stores(
    browser: Browser, served: Served
) -> None:
    from shardgate.queues.inbox.store import InboxStore

    gate = served.gate
    s = gate.session("commerce", identity=TRUSTED)
    await gate.execute(s, "CREATE QUEUE sjobs (user_id BIGINT NOT NULL, body VARCHAR(50)) "
                          "SHARD BY user_id WITH (storage = segmented)")
    await gate.queue_enqueue("commerce", "sjobs", [(str(i), f"job {i}") for i in range(4)])
    inbox = InboxStore(gate, "commerce", "notes")
    await inbox.create()
    await inbox.append(7, "hello")
    await inbox.append(8, "world")
    async with _page(browser) as page:
        await page.goto(f"{served.base}/queues")
        seg = page.locator('section.queue[data-queue="sjobs"] table.segmented-shards')
        await expect(seg.locator("tr[data-shard]")).to_have_count(2)
        await expect(seg).to_contain_text("pending")
        row = page.locator('table.inbox-stores tr[data-inbox="notes"]')
        await expect(row).to_be_visible()
        await row.locator("button.count").click()
        await expect(row.locator('td[data-k="counts"]')).to_contain_text('"messages":2')
        await _shot(page, "queues-segmented-inbox.png")


async def test_workflow_actions_need_a_confirmation_and_the_admin_role(
    browser: Browser, served: Served
) -> None:
    gate, data = served.gate, served.data
    s = gate.session("orders", identity=TRUSTED)
    await gate.execute(s, "CREATE TABLE item (id BIGINT PRIMARY KEY, v TEXT)")
    for i in range(20):
        await gate.execute(s, f"INSERT INTO item (id, v) VALUES ({i}, 'v{i}')")
    spec = ReshardSpec(keyspace="orders", sources=("-80",), targets=("-40", "40-80"),
                       target_urls=(("-40", f"sqlite:///{data / 'orders-40.db'}"),
                                    ("40-80", f"sqlite:///{data / 'orders40-80.db'}")),
                       workflow="split")
    flow = ReshardWorkflow(gate.topo, spec)
    try:
        await flow.create()
    finally:
        await flow.close()
    name = "reshard:orders.split"

    async def record() -> dict[str, Any]:
        found = await gate.topo.get_workflow(name)
        return (found.doc or {}) if found is not None else {}

    def answer(accept: bool) -> Any:
        async def handle(dialog: Dialog) -> None:
            await (dialog.accept() if accept else dialog.dismiss())
        return handle

    # a reader sees the workflow; its actions are refused (admin only)
    async with _page(browser, user=READER) as page:
        await page.goto(f"{served.base}/workflows")
        box = page.locator(f'section.workflow[data-workflow="{name}"]')
        await expect(box.locator('[data-k="state"]')).to_have_text("running")
        await expect(box.locator("progress")).to_have_attribute("value", "100")
        page.once("dialog", answer(True))
        await box.locator('button[data-action="switch_reads"]').click()
        await expect(page.locator("#wf-status")).to_contain_text("refused")
        assert not (await record()).get("reads_switched")

    async with _page(browser) as page:
        await page.goto(f"{served.base}/workflows")
        box = page.locator(f'section.workflow[data-workflow="{name}"]')
        status = page.locator("#wf-status")
        # VDiff reads only: it runs without a question, its result is shown
        await box.locator('button[data-action="vdiff"]').click()
        await expect(box.locator('table.vdiff tr[data-table="item"]')).to_contain_text("clean")
        # dismissing the confirmation does nothing
        page.once("dialog", answer(False))
        await box.locator('button[data-action="switch_reads"]').click()
        await expect(status).to_contain_text("not confirmed")
        assert not (await record()).get("reads_switched")
        # accepting runs it
        page.once("dialog", answer(True))
        await box.locator('button[data-action="switch_reads"]').click()
        await expect(status).to_contain_text("switch_reads of reshard:orders.split: done")
        assert (await record())["reads_switched"]
        page.once("dialog", answer(True))
        await box.locator('button[data-action="switch_writes"]').click()
        await expect(box.locator('[data-k="state"]')).to_have_text("switched")
        await _shot(page, "workflows.png")
        page.once("dialog", answer(True))
        await box.locator('button[data-action="complete"]').click()
        await expect(page.locator("#workflows")).to_contain_text("no workflows")
    assert await record() == {}
    topo = await gate.topo.load_topology()
    assert [sh.name for sh in topo.keyspace("orders").shards] == ["-40", "40-80", "80-"]


async def _poll(read: Any, want: int, timeout: float) -> None:
    """Wait until ``await read()`` is ``want`` (what the page shows), or fail saying what it was."""
    deadline = asyncio.get_running_loop().time() + timeout
    while (got := await read()) != want:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"the page shows {got}, expected {want}, after {timeout} s")
        await asyncio.sleep(0.1)


async def _until(cond: Any, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)
