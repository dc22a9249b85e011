"""End to end in a real headless Chromium: an operator finds dead letters and requeues them."""

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

from switchboard_todos.models import State, Todo

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


@pytest.mark.django_db(transaction=True)
def test_an_operator_requeues_dead_letters(live_server: Any, browser: WebDriver) -> None:
    """Log in, filter the dead letters, select them all, requeue, and read the success message."""
    operator = User.objects.create_user(username="ops", password="a-long-passphrase", is_staff=True)
    operator.user_permissions.set(
        Permission.objects.filter(codename__in=["view_todo", "requeue_todo"])
    )
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

    browser.get(f"{live_server.url}/admin/switchboard_todos/todo/")
    browser.find_element(By.NAME, "username").send_keys("ops")
    browser.find_element(By.NAME, "password").send_keys("a-long-passphrase")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()

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
