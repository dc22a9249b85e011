"""End to end in a real headless Chromium: an operator finds dead letters and requeues them, and
the todo list fits a laptop's screen."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import Select, WebDriverWait

from switchboard_todos.models import BLOCKED_UNTIL, State, Todo

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian's chromium and chromium-driver (apt-get install -y chromium "
    "chromium-driver); .ci/run installs them, so CI always runs this test",
)

#: The machine has no network: nothing in the browser may try to reach out.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,1024",
]


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[WebDriver]:
    """Chromium driven through Debian's chromedriver; never Selenium Manager's downloads."""
    monkeypatch.setenv("SE_OFFLINE", "true")
    options = Options()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def log_in(browser: WebDriver, live_server: Any) -> None:
    """Make the operator "ops", who may view and requeue todos, and log in as them."""
    operator = User.objects.create_user(username="ops", password="a-long-passphrase", is_staff=True)
    operator.user_permissions.set(
        Permission.objects.filter(codename__in=["view_todo", "requeue_todo"])
    )
    browser.get(f"{live_server.url}/admin/switchboard_todos/todo/")
    browser.find_element(By.NAME, "username").send_keys("ops")
    browser.find_element(By.NAME, "password").send_keys("a-long-passphrase")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()


@pytest.mark.django_db(transaction=True)
def test_an_operator_requeues_dead_letters(live_server: Any, browser: WebDriver) -> None:
    """Log in, filter the dead letters, select them all, requeue, and read the success message."""
    dead = [
        Todo.objects.create(
            kind="mail.send",
            title=f"Send receipt {n}",
            state=State.FAILED,
            attempt=5,
            result={"type": "SMTPError", "message": "mailbox full"},
        )
        for n in range(2)
    ]
    waiting = Todo.objects.create(kind="mail.send", title="Send newsletter")
    wait = WebDriverWait(browser, 20)
    log_in(browser, live_server)

    wait.until(expected_conditions.element_to_be_clickable((By.LINK_TEXT, "Dead-lettered"))).click()
    wait.until(expected_conditions.url_contains("attention=dead"))
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 2
    assert waiting.title not in browser.find_element(By.ID, "result_list").text

    browser.find_element(By.ID, "action-toggle").click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("requeue_selected")
    browser.find_element(By.CSS_SELECTOR, "button[name=index]").click()

    message = wait.until(
        expected_conditions.visibility_of_element_located(
            (By.CSS_SELECTOR, ".messagelist .success")
        )
    )
    assert message.text == "2 todos requeued."
    assert {Todo.objects.get(pk=todo.pk).state for todo in dead} == {State.PENDING}


#: The todo list's geometry, read in the page: the window, the viewport (less a scrollbar), the
#: sidebar, the table and the box it scrolls in, and each header cell's right edge.
GEOMETRY = """
const table = document.getElementById("result_list");
const sidebar = document.getElementById("nav-sidebar");
return {
    window: window.innerWidth,
    viewport: document.documentElement.clientWidth,
    page: document.documentElement.scrollWidth,
    sidebar: sidebar ? sidebar.getBoundingClientRect().width : 0,
    table: table.scrollWidth,
    box: table.parentElement.clientWidth,
    headers: Array.from(table.querySelectorAll("thead th")).map(
        (th) => [th.textContent.trim(), th.getBoundingClientRect().right]),
};
"""


@pytest.mark.django_db(transaction=True)
def test_the_todo_list_fits_a_laptop_with_the_sidebar_open(
    live_server: Any, browser: WebDriver
) -> None:
    """At 1366 px, the navigation sidebar and the filters open, no column of the todo list is
    cut off or behind a scrollbar, whatever the lengths of titles, kinds, owners and notes."""
    long = "reconcile_the_monthly_invoices_of_every_tenant_with_the_payment_provider"
    Todo.objects.create(
        queue="billing-reconciliation",
        kind=f"billing.tasks.{long}",
        title="",
        state=State.CLAIMED,
        owner="worker-on-a-rather-long-host-name.eu-west-1.compute.internal:48213",
        attempt=2,
        progress="Reconciled 41,207 of 98,113 invoices; waiting on the provider's rate limit",
    )
    Todo.objects.create(kind="mail.send", title="Send " + "the monthly digest " * 8)
    Todo.objects.create(kind="report.build", next_retry_at=BLOCKED_UNTIL, waiting_for=2)
    Todo.objects.create(kind="mail.send", title="Bounced", state=State.FAILED, attempt=5)
    browser.set_window_size(1366, 1000)
    log_in(browser, live_server)
    WebDriverWait(browser, 20).until(
        expected_conditions.presence_of_element_located((By.ID, "result_list"))
    )

    geometry = browser.execute_script(GEOMETRY)
    assert geometry["window"] == 1366
    assert geometry["sidebar"] > 200, "the navigation sidebar is open"
    assert browser.find_element(By.ID, "changelist-filter").is_displayed()
    assert geometry["table"] <= geometry["box"], geometry
    assert geometry["page"] <= geometry["viewport"], geometry
    assert [title for title, _right in geometry["headers"]][1:] == [
        "Todo",
        "State",
        "Lease or next run / created",
        "Progress",
    ]
    for title, right in geometry["headers"]:
        assert right <= geometry["viewport"], (title, geometry)
    text = browser.find_element(By.ID, "result_list").text
    assert "worker-on-a-rather-long-host-name" in text and "blocked: waits for 2 todos" in text
