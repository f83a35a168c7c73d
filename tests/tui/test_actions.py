"""Every dashboard action, driven by its key in the real app (Textual's pilot, headless), on
the stub backend through the library, as the CLI; each checks what a user would see and
what the database and the backend then hold."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from rich.text import Text
from textual.widgets import Button, Input, OptionList, RichLog

from sandboxer.adapters.base import AdapterError
from sandboxer.core.rules.clock import to_iso
from sandboxer_tui.dashboard.model import MUTATING
from sandboxer_tui.dashboard.screens.exec import ExecScreen
from sandboxer_tui.dashboard.screens.modals import (
    CommandLogScreen,
    ConfirmScreen,
    DurationScreen,
    HelpScreen,
)
from sandboxer_tui.dashboard.screens.pickers import CheckpointPicker, ProfilePicker

from .helpers import FullStub, opened, screen_text, select, told, wait_for


def state(mgr, sandbox_id: str) -> str:
    return mgr.resolve(sandbox_id)["state"]


def events_of(mgr, sandbox_id: str) -> list[str]:
    return [e["type"] for e in mgr.events(sandbox_id)]


# -- the main view ---------------------------------------------------------------------------


def test_main_view_shows_state_countdowns_metrics_and_health(dashboard, seeded):
    async def scenario():
        async with opened(dashboard) as (app, pilot):
            table = app.main.table
            assert len(table.shown_ids) == 6
            cell = table.cell_text
            assert cell(seeded["paused"]["id"], "state") == "paused"
            assert cell(seeded["broken"]["id"], "state") == "failed"
            assert cell(seeded["api"]["id"], "ttl") == "1h10m"
            assert cell(seeded["ci"]["id"], "ttl") == "45s"          # critical: red
            assert cell(seeded["evil"]["id"], "ttl") == "3m00s"      # warning: yellow
            assert cell(seeded["paused"]["id"], "ttl") == "expired"  # the reaper is late
            assert cell(seeded["broken"]["id"], "ttl") == "-"
            styles = {k: str(table.get_cell(seeded[k]["id"], "ttl").style)
                      for k in ("api", "ci", "evil", "paused")}
            assert styles == {"api": "", "ci": "bold red", "evil": "yellow",
                              "paused": "bold white on red"}
            assert cell(seeded["api"]["id"], "cpu").endswith(" 5%")  # the last stored sample
            assert cell(seeded["api"]["id"], "mem").endswith(" 64.0MB")  # absolute, not %
            assert cell(seeded["api"]["id"], "age") == "50m"
            header = screen_text(app).splitlines()[0]
            assert "6 sandboxes · 4 running · 1 paused · 1 failed" in header
            assert "stub ● up" in header

    asyncio.run(scenario())


def test_user_data_written_as_markup_shows_literally(dashboard, seeded):
    async def scenario():
        async with opened(dashboard) as (app, pilot):
            evil = seeded["evil"]["id"]
            assert app.main.table.cell_text(evil, "owner") == "[red]mallory[…"
            await select(pilot, evil)
            await pilot.pause(0.2)
            text = screen_text(app)
            assert "[red]mallory[/red]" in text           # owner, in full, in the overview
            assert "[bold]not bold[/bold]" in text        # the task
            assert "note=[link=x]y" in text               # a label value
            await pilot.press("d")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("n")

    asyncio.run(scenario())


# -- new ---------------------------------------------------------------------------------------


def test_new_sandbox_from_the_picker(dashboard, seeded, mgr):
    async def scenario():
        async with opened(dashboard) as (app, pilot):
            await pilot.press("n")
            await wait_for(pilot, lambda: isinstance(app.screen, ProfilePicker), what="picker")
            picker = app.screen
            names = [c.name for c in picker.choices]
            assert "stub" in names and "default" in names
            options = picker.query_one("#profile-list", OptionList)
            options.highlighted = names.index("stub")
            await pilot.pause()
            summary = screen_text(app)
            assert "an in-process test double" in summary and "default 30m, max 4h" in summary
            # a bad TTL is refused in the picker, naming the field; nothing is created
            picker.query_one("#new-ttl", Input).value = "soon"
            picker.query_one("#new-name", Input).value = "made-here"
            await pilot.pause()
            await pilot.click("#create")
            await pilot.pause()
            assert isinstance(app.screen, ProfilePicker)
            assert "bad ttl 'soon'" in screen_text(app)
            before = len(mgr.list(include_all=True))
            picker.query_one("#new-ttl", Input).value = "45m"
            picker.query_one("#new-labels", Input).value = "purpose=demo"
            await pilot.pause()
            assert "sbx create --profile stub --ttl 45m --name made-here --label " \
                   "purpose=demo" in screen_text(app)
            options.focus()
            await pilot.press("enter")
            await wait_for(pilot, lambda: any(
                app.main.table.sandboxes[s].name == "made-here" for s in app.main.table.shown_ids),
                what="the new row")
            new = mgr.resolve("made-here")
            assert len(mgr.list(include_all=True)) == before + 1
            assert new["state"] == "running" and new["owner"] == "alice"
            assert '"purpose": "demo"' in new["labels_json"]
            assert new["deadline"] == to_iso(app.main.dashboard.now() + timedelta(minutes=45))
            await wait_for(pilot, lambda: app.main.table.selected_id == new["id"],
                           what="the new sandbox selected")
            assert any(m.startswith(f"created {new['id']} (made-here)") for m in told(app))

    asyncio.run(scenario())


# -- destroy -----------------------------------------------------------------------------------


def test_destroy_asks_first_and_cancel_is_the_default(dashboard, seeded, mgr):
    async def scenario():
        async with opened(dashboard) as (app, pilot):
            target = seeded["ci"]["id"]
            await select(pilot, target)
            await pilot.press("d")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            modal = app.screen
            assert modal.focused is modal.query_one("#cancel", Button)
            text = screen_text(app)
            assert f"Destroy {target} (ci-runner-42)?" in text
            assert f"sbx destroy {target}" in text
            await pilot.press("enter")  # Enter on the focused Cancel: nothing happens
            await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
            await pilot.pause(0.3)
            assert state(mgr, target) == "running"
            await pilot.press("d")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("y")
            await wait_for(pilot, lambda: not app.main.table.is_shown(target), what="row gone")
            assert state(mgr, target) == "destroyed"
            assert ("destroy", f"stub-{target}") in FullStub.calls
            assert f"destroyed {target}" in told(app)

    asyncio.run(scenario())


def test_bulk_destroy_of_marked_rows_names_every_target(dashboard, seeded, mgr):
    async def scenario():
        async with opened(dashboard) as (app, pilot):
            table = app.main.table
            first, second = seeded["api"]["id"], seeded["fork"]["id"]
            await select(pilot, first)
            await pilot.press("space")
            await select(pilot, second)
            await pilot.press("space")
            assert table.marked == {first, second}
            assert table.cell_text(first, "id").startswith("●")
            await select(pilot, seeded["ci"]["id"])  # the cursor elsewhere: marks still win
            await pilot.press("d")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            text = screen_text(app)
            assert "Destroy these 2 sandboxes?" in text
            assert f"sbx destroy {first} {second}" in text
            await pilot.press("y")
            await wait_for(pilot, lambda: not table.is_shown(first) and not table.is_shown(second))
            assert state(mgr, first) == state(mgr, second) == "destroyed"
            assert state(mgr, seeded["ci"]["id"]) == "running"
            assert table.marked == set()

    asyncio.run(scenario())


# -- deadlines ---------------------------------------------------------------------------------


def test_extend_adds_the_step_and_shift_t_asks_for_a_duration(dashboard, seeded, mgr):
    async def scenario():
        async with opened(dashboard) as (app, pilot):
            target = seeded["ci"]["id"]
            before = mgr.resolve(target)["deadline"]
            await select(pilot, target)
            await pilot.press("t")
            await wait_for(pilot, lambda: app.main.table.cell_text(target, "ttl") == "30m45s",
                           what="the countdown to move 30m")
            assert str(app.main.table.get_cell(target, "ttl").style) == ""  # no longer red
            after = mgr.resolve(target)["deadline"]
            assert after > before and "sandbox.extended" in events_of(mgr, target)
            await pilot.press("T")
            await wait_for(pilot, lambda: isinstance(app.screen, DurationScreen))
            field = app.screen.query_one("#duration", Input)
            assert field.value == "30m"
            field.value = "soon"
            await pilot.press("enter")
            await pilot.pause()
            assert isinstance(app.screen, DurationScreen)
            assert "bad duration 'soon'" in screen_text(app)
            field.value = "1h"
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.main.table.cell_text(target, "ttl") == "1h30m")

    asyncio.run(scenario())


def test_touch_records_activity_now(dashboard, seeded, mgr, clock):
    async def scenario():
        async with opened(dashboard) as (app, pilot):
            target = seeded["api"]["id"]
            clock.advance(timedelta(minutes=3))
            await select(pilot, target)
            await pilot.press("k")
            await wait_for(pilot, lambda: "sandbox.touched" in events_of(mgr, target))
            assert mgr.resolve(target)["last_activity_at"] == to_iso(clock.now())

    asyncio.run(scenario())


# -- pause, snapshot, restore ------------------------------------------------------------------


def test_pause_then_resume(dashboard, seeded, mgr):
    async def scenario():
        async with opened(dashboard) as (app, pilot):
            target = seeded["api"]["id"]
            await select(pilot, target)
            await pilot.press("p")
            await wait_for(pilot, lambda: app.main.table.cell_text(target, "state") == "paused")
            assert state(mgr, target) == "paused" and ("pause", f"stub-{target}") in FullStub.calls
            await pilot.press("p")
            await wait_for(pilot, lambda: app.main.table.cell_text(target, "state") == "running")
            assert state(mgr, target) == "running"
            assert [m.split()[0] for m in told(app)][-2:] == ["paused", "resumed"]

    asyncio.run(scenario())


def test_snapshot_then_restore_a_fork_with_lineage(dashboard, seeded, mgr):
    async def scenario():
        async with opened(dashboard) as (app, pilot):
            target = seeded["fork"]["id"]  # itself restored from the seeded checkpoint
            await select(pilot, target)
            await pilot.press("s")
            await wait_for(pilot, lambda: any(m.startswith("snapshot of") for m in told(app)))
            from sandboxer.core.lifecycle.checkpoints import Checkpoints

            mine = Checkpoints(mgr).list(target)
            assert len(mine) == 1 and mine[0]["state"] == "ready"
            assert mine[0]["parent_id"] == seeded["checkpoint"]["id"]
            await pilot.press("5")  # the checkpoints tab: the lineage tree
            await wait_for(pilot, lambda: mine[0]["id"] in screen_text(app), what="tree")
            text = screen_text(app)
            assert text.index(seeded["checkpoint"]["id"]) < text.index(mine[0]["id"])
            await pilot.press("r")
            await wait_for(pilot, lambda: isinstance(app.screen, CheckpointPicker))
            await pilot.press("enter")
            await wait_for(pilot, lambda: any(m.startswith("restored") for m in told(app)))
            restored = [r for r in mgr.list() if r["restored_from"] == mine[0]["id"]]
            assert len(restored) == 1 and restored[0]["state"] == "running"
            await wait_for(pilot, lambda: app.main.table.selected_id == restored[0]["id"])

    asyncio.run(scenario())


def test_a_long_action_shows_progress_in_its_row_and_never_blocks(dashboard, seeded, mgr):
    async def scenario():
        async with opened(dashboard) as (app, pilot):
            table = app.main.table
            target = seeded["api"]["id"]
            await select(pilot, target)
            FullStub.snapshot_delay = 4.0
            await pilot.press("s")
            await wait_for(pilot, lambda: table.cell_text(target, "state").endswith(" snapshot"),
                           within=1, what="the spinner")
            first = table.cell_text(target, "state")
            await wait_for(pilot, lambda: table.cell_text(target, "state") != first, within=1,
                           what="the spinner to turn")
            await pilot.press("down")  # the UI answers while the backend works
            assert table.selected_id == seeded["ci"]["id"]
            await pilot.press("slash", *"batch", "enter")
            assert table.shown_ids == [seeded["paused"]["id"]]
            assert not any(m.startswith("snapshot of") for m in told(app))  # still running
            await wait_for(pilot, lambda: any(m.startswith("snapshot of") for m in told(app)),
                           within=60, what="the notification")
            await pilot.press("slash", "escape")
            await wait_for(pilot, lambda: table.is_shown(target))
            assert table.cell_text(target, "state") == "running"

    asyncio.run(scenario())


def test_restore_without_a_checkpoint_says_how_to_make_one(dashboard, seeded):
    async def scenario():
        async with opened(dashboard) as (app, pilot):
            await select(pilot, seeded["ci"]["id"])
            await pilot.press("r")
            await wait_for(pilot, lambda: told(app, "warning"))
            assert "has no checkpoint yet: s takes one" in told(app, "warning")[-1]
            assert app.screen is app.main

    asyncio.run(scenario())


# -- exec, shell, logs, events -----------------------------------------------------------------


def test_exec_runs_commands_and_shows_their_output(dashboard, seeded, mgr):
    async def scenario():
        async with opened(dashboard) as (app, pilot):
            target = seeded["api"]["id"]
            await select(pilot, target)
            await pilot.press("x")
            await wait_for(pilot, lambda: isinstance(app.screen, ExecScreen))
            screen = app.screen
            log = screen.query_one("#exec-output", RichLog)

            async def run(command: str, expect: str) -> None:
                screen.query_one("#exec-command", Input).value = command
                await pilot.press("enter")
                await wait_for(pilot, lambda: any(expect in str(line.text) for line in log.lines),
                               what=f"{expect!r} after {command!r}")

            await run("echo hello   'big world'", "exit 0")
            lines = [line.text for line in log.lines]
            assert "hello big world" in lines
            await run("false", "exit 1")
            await run("nosuch --flag", "exit 127")
            assert any("stub: nosuch: not found" in line.text for line in log.lines)
            await run("echo 'unbalanced", "bad command")
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is app.main)
            execs = [e for e in mgr.events(target) if e["type"] == "sandbox.exec"]
            assert len(execs) == 3  # the bad command line ran nothing

    asyncio.run(scenario())


def test_shell_is_offered_only_where_the_backend_has_one(dashboard, seeded):
    async def scenario():
        async with opened(dashboard) as (app, pilot):
            await select(pilot, seeded["api"]["id"])
            assert not app.main.applies("shell")  # the stub has no interactive shell
            assert app.main.applies("exec")
            await pilot.press("e")
            await pilot.pause()
            assert app.screen is app.main
            footer = screen_text(app).splitlines()[-1]
            assert "Exec" in footer and "Shell" not in footer

    asyncio.run(scenario())


def test_logs_tab_filters_and_highlights(dashboard, seeded):
    async def scenario():
        async with opened(dashboard) as (app, pilot):
            target = seeded["api"]["id"]
            await select(pilot, target)
            await pilot.press("l")
            log = app.main.query_one("#log-view", RichLog)
            await wait_for(pilot, lambda: len(log.lines) == 1, what="the log line")
            assert f"stub sandbox stub-{target} started" in log.lines[0].text
            app.main.query_one("#log-filter", Input).value = "SANDBOX"
            await pilot.pause()
            assert len(log.lines) == 1
            highlighted = [s for s in log.lines[0] if "on yellow" in str(s.style)]
            assert [s.text for s in highlighted] == ["sandbox"]
            app.main.query_one("#log-filter", Input).value = "nothing-like-this"
            await pilot.pause()
            assert len(log.lines) == 0
            await select(pilot, seeded["paused"]["id"])  # paused: logs still readable
            app.main.query_one("#log-filter", Input).value = ""
            await wait_for(pilot, lambda: len(log.lines) == 1 and "started" in log.lines[0].text)

    asyncio.run(scenario())


def test_events_tab_follows_new_events(dashboard, seeded, mgr):
    async def scenario():
        async with opened(dashboard) as (app, pilot):
            target = seeded["api"]["id"]
            await select(pilot, target)
            await pilot.press("3")
            from textual.widgets import DataTable

            events = app.main.query_one("#events-table", DataTable)
            await wait_for(pilot, lambda: events.row_count == len(mgr.events(target)))
            shown = [events.get_row_at(i)[1].plain for i in range(events.row_count)]
            assert shown[:2] == ["sandbox.creating", "sandbox.created"]
            await asyncio.to_thread(mgr.touch, target)  # another writer
            await wait_for(pilot, lambda: events.row_count == len(shown) + 1, within=30)
            assert events.get_row_at(events.row_count - 1)[1].plain == "sandbox.touched"

    asyncio.run(scenario())


# -- filter, sort, marks, all ------------------------------------------------------------------


def test_filter_and_sort_on_raw_values(dashboard, seeded):
    async def scenario():
        async with opened(dashboard) as (app, pilot):
            table = app.main.table
            await pilot.press("slash")
            await pilot.press(*"state:running")
            await pilot.pause(0.2)
            assert sorted(table.shown_ids) == sorted(
                seeded[k]["id"] for k in ("api", "ci", "evil", "fork"))
            assert "4 of 6 match 'state:running'" in screen_text(app)
            await pilot.press("enter")  # keeps the filter, back to the table
            assert app.focused is table
            await pilot.press("slash", "escape")  # clears it
            await pilot.pause()
            assert len(table.shown_ids) == 6
            await pilot.press("o")  # created -> name
            assert [table.sandboxes[s].name for s in table.shown_ids] == [
                "api-dev", "api-fork", "batch-7", "broken", "ci-runner-42", "markup-owner"]
            table.set_sort("ttl")
            await pilot.pause()
            assert table.shown_ids == [seeded[k]["id"] for k in
                                       ("paused", "ci", "evil", "api", "fork", "broken")]
            await pilot.press("O")
            assert table.shown_ids[0] == seeded["broken"]["id"]
            await pilot.click("#sandboxes", offset=(20, 1))  # the NAME header
            await pilot.pause()
            assert table.sort_column == "name" and not table.sort_reverse

    asyncio.run(scenario())


def test_show_destroyed_toggles(dashboard, seeded, mgr):
    async def scenario():
        await mgr.destroy(seeded["ci"]["id"])
        async with opened(dashboard) as (app, pilot):
            table = app.main.table
            assert seeded["ci"]["id"] not in table.shown_ids
            await pilot.press("a")
            await wait_for(pilot, lambda: seeded["ci"]["id"] in table.shown_ids)
            assert table.cell_text(seeded["ci"]["id"], "state") == "destroyed"
            assert not app.main.applies("destroy") or table.selected_id != seeded["ci"]["id"]

    asyncio.run(scenario())


# -- read-only, palette, help, command log, errors ---------------------------------------------


def test_read_only_hides_every_action_that_changes_anything(dashboard, seeded, mgr):
    async def scenario():
        async with opened(dashboard, read_only=True) as (app, pilot):
            main = app.main
            await select(pilot, seeded["api"]["id"])
            for action in MUTATING:
                assert not main.applies(action), action
            text = screen_text(app)
            assert "read-only" in text.splitlines()[0]
            footer = text.splitlines()[-1]
            for word in ("New", "Destroy", "Extend", "Snapshot", "Pause", "Exec"):
                assert word not in footer
            assert "Filter" in footer and "Quit" in footer
            palette = [c.title for c in app.get_system_commands(main)]
            assert not any(t.startswith(("Destroy", "Extend", "New")) for t in palette)
            before = mgr.resolve(seeded["api"]["id"])
            await pilot.press("d", "t", "p", "s", "n", "x", "k")
            await pilot.pause(0.3)
            assert app.screen is main
            assert mgr.resolve(seeded["api"]["id"]) == before

    asyncio.run(scenario())


def test_palette_offers_the_actions_that_apply_and_runs_them(dashboard, seeded, mgr):
    async def scenario():
        async with opened(dashboard) as (app, pilot):
            target = seeded["ci"]["id"]
            await select(pilot, target)
            commands = {c.title: c for c in app.get_system_commands(app.main)}
            for title in ("New (n)", "Destroy (d)", "Extend (t)", "Extend by… (T)",
                          "Snapshot (s)", "Restore (r)", "Pause (p)", "Exec (x)",
                          "Touch (k)", "Logs (l)", "Filter (/)", "Help (?)"):
                assert title in commands, title
            assert "Shell (e)" not in commands
            before = mgr.resolve(target)["deadline"]
            await commands["Extend (t)"].callback()
            await wait_for(pilot, lambda: mgr.resolve(target)["deadline"] > before)
            await select(pilot, seeded["broken"]["id"])  # failed: only destroy applies
            titles = {c.title for c in app.get_system_commands(app.main)}
            assert "Destroy (d)" in titles and "Extend (t)" not in titles
            await pilot.press("ctrl+p")
            await pilot.pause(0.3)
            await pilot.press(*"destroy")
            await pilot.pause(0.5)
            assert "Destroy (d)" in screen_text(app)

    asyncio.run(scenario())


def test_help_lists_every_key_and_what_applies_now(dashboard, seeded):
    async def scenario():
        async with opened(dashboard) as (app, pilot):
            await select(pilot, seeded["broken"]["id"])
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
            rows = {key: applies for key, _, applies in app.screen.rows}
            assert rows["d"] is True and rows["t"] is False and rows["p"] is False
            assert {"n", "s", "r", "x", "e", "k", "l", "/", "space", "?", "q", "ctrl+p"} <= set(rows)
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is app.main)

    asyncio.run(scenario())


def test_a_failed_action_is_a_notification_and_in_the_command_log(dashboard, seeded, mgr):
    async def scenario():
        async with opened(dashboard) as (app, pilot):
            target = seeded["api"]["id"]
            await select(pilot, target)
            FullStub.fail_next["pause"] = AdapterError("the engine refused: out of memory")
            await pilot.press("p")
            await wait_for(pilot, lambda: told(app, "error"))
            assert told(app, "error")[-1] == f"{target}: the engine refused: out of memory"
            assert state(mgr, target) == "running"
            assert app.main.table.cell_text(target, "state") == "running"  # spinner gone
            await pilot.press("c")
            await wait_for(pilot, lambda: isinstance(app.screen, CommandLogScreen))
            await pilot.pause(0.2)
            text = screen_text(app)
            assert f"sbx pause {target}" in text and "out of memory" in text

    asyncio.run(scenario())


def test_an_unexpected_error_in_a_worker_is_a_notification_not_a_traceback(
        dashboard, seeded, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("checkpoint store\nexploded")

    monkeypatch.setattr(dashboard, "checkpoints", broken)

    async def scenario():
        async with opened(dashboard) as (app, pilot):
            await select(pilot, seeded["api"]["id"])
            await pilot.press("r")
            await wait_for(pilot, lambda: told(app, "error"))
            assert told(app, "error")[-1] == "checkpoint store exploded"  # one line
            assert app.is_running and app.screen is app.main
            await pilot.press("t")  # still answering
            await wait_for(pilot, lambda: any(m.startswith("extended") for m in told(app)))

    asyncio.run(scenario())


def test_markup_in_an_error_message_is_shown_literally(dashboard, seeded):
    async def scenario():
        async with opened(dashboard) as (app, pilot):
            FullStub.fail_next["snapshot"] = AdapterError("disk [red]full[/red]")
            await select(pilot, seeded["api"]["id"])
            await pilot.press("s")
            await wait_for(pilot, lambda: told(app, "error"))
            await pilot.pause(0.2)
            assert "disk [red]full[/red]" in screen_text(app)  # the toast, not parsed

    asyncio.run(scenario())


def test_cell_values_are_text_never_markup(dashboard, seeded):
    async def scenario():
        async with opened(dashboard) as (app, pilot):
            table = app.main.table
            for sid in table.shown_ids:
                for column in ("id", "name", "owner", "state", "ttl"):
                    assert isinstance(table.get_cell(sid, column), Text)

    asyncio.run(scenario())


def test_a_name_written_as_markup_shows_literally(dashboard, mgr):
    from sandboxer.core.rules.profiles import ProfileLoader

    from .helpers import run

    box = run(mgr.create(ProfileLoader().load("stub"), name="box-[red]alert"))

    async def scenario():
        async with opened(dashboard) as (app, pilot):
            await wait_for(pilot, lambda: box["id"] in app.main.table.sandboxes)
            assert app.main.table.cell_text(box["id"], "name") == "box-[red]alert"
            await select(pilot, box["id"])
            await pilot.pause(0.2)
            assert "box-[red]alert" in screen_text(app)  # in the overview too, not parsed

    asyncio.run(scenario())
