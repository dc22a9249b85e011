"""The admin's Queues page, through Django's test client: the list, the actions, a queue's page."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.db.models.functions import Now
from django.test import Client

from switchboard_todos import queue_settings
from switchboard_todos.admin.queues import SETTINGS_FIELDS
from switchboard_todos.models import BLOCKED_UNTIL, Queue, State
from switchboard_todos.queue_settings import Rate
from tests.helpers import MakeTodo
from tests.test_admin import messages_of

QUEUES = "/admin/switchboard_todos/queue/"


def page_of(name: str) -> str:
    return f"{QUEUES}{name}/change/"


def act(client: Client, action: str, *names: str) -> Any:
    return client.post(
        QUEUES, {"action": action, "_selected_action": list(names), "index": "0"}, follow=True
    )


def form(**changes: str) -> dict[str, str]:
    """A queue page's form as a browser posts it: every field, empty unless given."""
    data = dict.fromkeys([*SETTINGS_FIELDS, "resume_at_0", "resume_at_1"], "")
    return {**data, **changes}


# The list


def test_the_list_shows_every_queue_with_its_numbers_and_settings(
    admin_client: Client, make_todo: MakeTodo, django_assert_max_num_queries: Any
) -> None:
    """Queues with settings and queues with only todos, in one table; the number of queries
    does not grow with the number of queues."""
    for _ in range(3):
        make_todo(queue="mail")
    make_todo(queue="mail", next_retry_in=timedelta(minutes=5))
    make_todo(queue="mail", state=State.CLAIMED)
    make_todo(queue="mail", state=State.FAILED)
    queue_settings.configure(
        "billing",
        description="Invoices to the payment provider",
        rate=Rate(50, timedelta(seconds=10)),
        concurrency_limit=3,
        visibility_timeout=300,
        max_attempts=8,
        retention=timedelta(days=30),
    )
    queue_settings.pause("billing")
    for number in range(5):
        queue_settings.configure(f"extra{number}", max_attempts=2)
    with django_assert_max_num_queries(8):
        response = admin_client.get(QUEUES)
    assert response.status_code == 200
    page = response.content.decode()
    names = [row.view.name for row in response.context["rows"]]
    assert names == ["billing", *[f"extra{n}" for n in range(5)], "mail"]
    mail = response.context["rows"][-1].view
    assert (mail.configured, mail.depth, mail.health.claimed, mail.health.dead) == (
        False,
        4,
        1,
        1,
    )
    for text in [
        "Invoices to the payment provider",
        "<strong>paused</strong>",
        "50 per 10s",
        "5m",
        "30d",
        "30s (default)",
        "5 (default)",
        "kept (none)",
        "(defaults)",
        f'href="{page_of("mail")}"',
        "?queue=mail&amp;attention=dead",
    ]:
        assert text in page, text
    assert [row.fair_keys for row in response.context["rows"]] == [0] * 7


def test_the_list_counts_the_fair_keys_waiting(admin_client: Client, make_todo: MakeTodo) -> None:
    """Each queue's tenants with pending todos, linked to them on the Queue health page."""
    for key in ("a", "a", "b", "c"):
        make_todo(queue="imports", fair_key=key)
    make_todo(queue="imports", fair_key="d", state=State.CLAIMED)
    make_todo(queue="mail")
    response = admin_client.get(QUEUES)
    assert {row.view.name: row.fair_keys for row in response.context["rows"]} == {
        "imports": 3,
        "mail": 0,
    }
    assert '<a href="/admin/switchboard_todos/todo/health/#tenants">3</a>' in (
        response.content.decode()
    )


def test_the_depth_says_how_many_of_it_are_blocked(
    admin_client: Client, make_todo: MakeTodo
) -> None:
    """The depth counts every pending todo, the blocked too; the cell says how many are, and
    links to them; a queue without blocked todos says nothing of them."""
    make_todo(queue="reports")
    for _ in range(2):
        make_todo(queue="reports", next_retry_at=BLOCKED_UNTIL, waiting_for=1)
    make_todo(queue="mail")
    page = admin_client.get(QUEUES).content.decode()
    assert "depth (pending)" in page
    assert (
        '<a href="/admin/switchboard_todos/todo/?queue=reports&amp;attention=blocked" '
        'class="quiet">incl. 2 blocked</a>'
    ) in page
    assert page.count("blocked</a>") == 1


def test_the_list_is_for_who_may_see_todos_or_queues(
    operator: Callable[..., Client], db: None
) -> None:
    queue_settings.configure("mail", max_attempts=3)
    assert operator().get(QUEUES).status_code == 403
    for codename in ("view_todo", "view_queue"):
        page = operator(codename).get(QUEUES)
        assert page.status_code == 200
        assert 'name="action"' not in page.content.decode()  # nothing they may do
    assert (
        'value="pause_selected"'
        in operator("view_queue", "pause_queue").get(QUEUES).content.decode()
    )


def test_the_app_page_and_the_health_page_link_to_it(admin_client: Client) -> None:
    assert QUEUES in admin_client.get("/admin/switchboard_todos/").content.decode()
    assert QUEUES in admin_client.get("/admin/switchboard_todos/todo/health/").content.decode()
    assert QUEUES in admin_client.get("/admin/switchboard_todos/todo/").content.decode()


# Pause and Resume


def test_pause_and_resume_selected_queues_on_the_record(
    operator: Callable[..., Client], make_todo: MakeTodo
) -> None:
    """A queue with only todos is paused too (which makes its row); each change is in the
    queue's History; a queue already so is named, not changed."""
    make_todo(queue="mail")
    queue_settings.configure("billing", max_attempts=3)
    client = operator("view_queue", "pause_queue")
    response = act(client, "pause_selected", "mail", "billing")
    assert messages_of(response) == ["Paused 2 queues."]
    assert set(Queue.objects.filter(paused=True).values_list("name", flat=True)) == {
        "mail",
        "billing",
    }
    assert Queue.objects.get(pk="billing").max_attempts == 3
    logged = LogEntry.objects.filter(action_flag=CHANGE).order_by("object_id")
    assert [(e.object_id, e.change_message) for e in logged] == [
        ("billing", "Paused."),
        ("mail", "Paused."),
    ]
    assert messages_of(act(client, "pause_selected", "mail")) == [
        "Paused 0 queues.",
        "Already paused: mail.",
    ]
    assert messages_of(act(client, "resume_selected", "mail", "other")) == [
        "Resumed 1 queue.",
        "Not paused: other.",
    ]
    assert not Queue.objects.get(pk="mail").paused
    assert not Queue.objects.filter(pk="other").exists()
    assert LogEntry.objects.filter(object_id="mail", change_message="Resumed.").count() == 1


def test_pausing_needs_its_permission(operator: Callable[..., Client], db: None) -> None:
    client = operator("view_queue", "change_queue")
    response = act(client, "pause_selected", "mail")
    assert messages_of(response) == ["No action selected."]
    assert not Queue.objects.exists()


def test_an_action_needs_queues_ticked_and_valid_names(admin_client: Client) -> None:
    assert messages_of(act(admin_client, "pause_selected")) == [
        "Tick the queues to act on first; nothing was changed."
    ]
    assert "is not a valid queue name" in messages_of(act(admin_client, "pause_selected", "a b"))[0]
    assert not Queue.objects.exists()


# A queue's page


def test_a_queue_without_settings_has_a_page_with_the_defaults_and_saving_makes_its_row(
    admin_client: Client, make_todo: MakeTodo
) -> None:
    make_todo(queue="mail")
    page = admin_client.get(page_of("mail"))
    assert page.status_code == 200
    text = page.content.decode()
    assert "1 pending (1 ready, 0 waiting)" in text  # its todos now
    assert "Delete" not in text  # nothing to delete yet
    response = admin_client.post(
        page_of("mail"),
        form(
            visibility_timeout="5m",
            max_attempts="3",
            rate_limit="50",
            rate_period="10",
            concurrency_limit="4",
            retention="30",
            description="Outgoing mail",
        ),
        follow=True,
    )
    assert response.status_code == 200, response.context.get("errors")
    stored = Queue.objects.values().get(pk="mail")
    assert (stored["visibility_timeout"], stored["max_attempts"]) == (timedelta(minutes=5), 3)
    assert (stored["rate_limit"], stored["rate_period"]) == (50, timedelta(seconds=10))
    assert (stored["concurrency_limit"], stored["retention"]) == (4, timedelta(days=30))
    assert (stored["description"], stored["paused"]) == ("Outgoing mail", False)
    entry = LogEntry.objects.get(object_id="mail")
    assert entry.action_flag == CHANGE and "Retention" in entry.get_change_message()


def test_a_page_shows_durations_as_typed_and_saves_only_what_changed(
    admin_client: Client,
) -> None:
    """The form shows 5m, not 0:05:00; an unchanged save writes nothing, and an edit leaves
    the claims' rate counters alone."""
    queue_settings.configure(
        "mail", visibility_timeout=300, rate=Rate(50, timedelta(seconds=10)), retention=86400
    )
    Queue.objects.filter(pk="mail").update(rate_window=Now(), rate_count=9)
    text = admin_client.get(page_of("mail")).content.decode()
    for shown in ('value="5m"', 'value="10s"', 'value="1d"'):
        assert shown in text, shown
    unchanged = form(visibility_timeout="5m", rate_limit="50", rate_period="10s", retention="1d")
    admin_client.post(page_of("mail"), unchanged)
    admin_client.post(page_of("mail"), {**unchanged, "rate_limit": "20"})
    stored = Queue.objects.values().get(pk="mail")
    assert (stored["rate_limit"], stored["rate_count"]) == (20, 9)
    assert stored["rate_window"] is not None


@pytest.mark.parametrize(
    ("changes", "field", "error"),
    [
        ({"rate_limit": "50"}, "rate_period", "A rate limit needs both a number and a period."),
        ({"rate_period": "10"}, "rate_limit", "A rate limit needs both a number and a period."),
        ({"rate_limit": "5", "rate_period": "40d"}, "rate_limit", "rate period must be at most"),
        ({"max_attempts": "0"}, "max_attempts", "max_attempts must be between 1 and 1000"),
        ({"concurrency_limit": "0"}, "concurrency_limit", "must be between 1"),
        ({"visibility_timeout": "13h"}, "visibility_timeout", "must be at most 12:00:00"),
        ({"visibility_timeout": "soon"}, "visibility_timeout", "Invalid duration 'soon'"),
        ({"retention": "0"}, "retention", "must be more than zero"),
        (
            {"resume_at_0": "2999-01-01", "resume_at_1": "08:00"},
            "resume_at",
            "Tick “paused” to pause until then",
        ),
        (
            {"paused": "on", "resume_at_0": "2000-01-01", "resume_at_1": "08:00"},
            "resume_at",
            "This time has passed.",
        ),
    ],
)
def test_a_page_refuses_bad_settings_and_says_why(
    admin_client: Client, changes: dict[str, str], field: str, error: str
) -> None:
    response = admin_client.post(page_of("mail"), form(**changes))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert error in " ".join(errors[field]), errors
    assert not Queue.objects.exists()


@pytest.mark.parametrize(
    ("typed", "value"),
    [
        ("90", timedelta(seconds=90)),
        ("2h", timedelta(hours=2)),
        ("1 02:00:00", timedelta(hours=26)),
    ],
)
def test_durations_take_the_commands_forms_and_djangos(
    admin_client: Client, typed: str, value: timedelta
) -> None:
    admin_client.post(page_of("mail"), form(rate_limit="5", rate_period=typed))
    assert Queue.objects.get(pk="mail").rate_period == value


def test_pausing_from_the_page_until_a_time(admin_client: Client) -> None:
    admin_client.post(
        page_of("mail"), form(paused="on", resume_at_0="2999-01-01", resume_at_1="08:00")
    )
    queue = Queue.objects.get(pk="mail")
    assert queue.paused and queue.resume_at is not None and queue.resume_at.year == 2999
    admin_client.post(page_of("mail"), form())  # unticked: resumed, its time cleared
    queue = Queue.objects.get(pk="mail")
    assert (queue.paused, queue.resume_at) == (False, None)


def test_the_pause_button_of_a_queues_page(operator: Callable[..., Client], db: None) -> None:
    client = operator("view_queue", "pause_queue")
    text = client.get(page_of("mail")).content.decode()
    assert 'value="Pause now"' in text
    response = client.post(
        QUEUES,
        {"action": "pause_selected", "_selected_action": "mail", "next": page_of("mail")},
    )
    assert response.status_code == 302 and response["Location"] == page_of("mail")
    assert Queue.objects.get(pk="mail").paused
    assert 'value="Resume now"' in client.get(page_of("mail")).content.decode()
    elsewhere = {"action": "resume_selected", "_selected_action": "mail"}
    response = client.post(QUEUES, {**elsewhere, "next": "https://example.com/"})
    assert response["Location"] == QUEUES  # only back to this site


def test_who_may_pause_but_not_change_edits_only_the_pause(
    operator: Callable[..., Client], db: None
) -> None:
    client = operator("view_queue", "pause_queue")
    client.post(page_of("mail"), form(paused="on", max_attempts="3"))
    queue = Queue.objects.get(pk="mail")
    assert (queue.paused, queue.max_attempts) == (True, None)


def test_who_may_change_but_not_pause_edits_the_rest(
    operator: Callable[..., Client], db: None
) -> None:
    client = operator("view_queue", "change_queue")
    assert 'value="Pause now"' not in client.get(page_of("mail")).content.decode()
    client.post(page_of("mail"), form(paused="on", max_attempts="3"))
    queue = Queue.objects.get(pk="mail")
    assert (queue.paused, queue.max_attempts) == (False, 3)


def test_a_viewer_sees_a_page_and_changes_nothing(
    operator: Callable[..., Client], db: None
) -> None:
    client = operator("view_queue")
    assert client.get(page_of("mail")).status_code == 200
    assert client.post(page_of("mail"), form(max_attempts="3")).status_code == 403
    assert not Queue.objects.exists()


def test_configure_a_new_queue_from_the_add_page(admin_client: Client) -> None:
    assert admin_client.get(f"{QUEUES}add/?name=reports").status_code == 200
    response = admin_client.post(
        f"{QUEUES}add/", {**form(concurrency_limit="2"), "name": "reports"}, follow=True
    )
    assert response.status_code == 200
    assert Queue.objects.get(pk="reports").concurrency_limit == 2
    again = admin_client.post(f"{QUEUES}add/", {**form(), "name": "reports"})
    assert "already exists" in str(again.context["adminform"].form.errors["name"])
    bad = admin_client.post(f"{QUEUES}add/", {**form(), "name": "no spaces"})
    assert bad.context["adminform"].form.errors["name"]


def test_deleting_a_queues_settings_gives_it_the_defaults_again(admin_client: Client) -> None:
    queue_settings.configure("mail", max_attempts=3)
    response = admin_client.post(f"{QUEUES}mail/delete/", {"post": "yes"}, follow=True)
    assert response.status_code == 200
    assert not Queue.objects.exists()


def test_a_bad_name_has_no_page(admin_client: Client) -> None:
    response = admin_client.get(page_of("no%20spaces"), follow=True)
    assert "doesn’t exist" in " ".join(messages_of(response))
    assert admin_client.get(page_of("a%00b"), follow=True).status_code == 200
