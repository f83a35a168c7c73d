"""The files and exec-options suites (test_files.py, test_exec_options.py) over the other
transport: the same test functions, collected here with a `client` of a live `sbx serve` on
127.0.0.1 over the test's SBX_HOME (an admin key whose owner is the actor they expect), so
every operation they check in process is checked through the service too. What runs only
in process (the sync API on a home, a subprocess measuring its own memory) stays there;
the service's memory is measured in tests/service/test_files_service.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from support import remove_test_containers

import sandboxer
from tests.api.test_exec_options import (
    test_a_missing_cwd_is_not_found,
    test_bad_options_are_refused_before_anything_runs,
    test_env_cwd_and_stdin_reach_the_command_and_the_event_keeps_names_only,
    test_exec_stream_takes_the_same_options,
    test_stdin_as_text_and_as_a_file_object,
    test_user_on_a_backend_without_run_as_user_is_refused_naming_it,
    test_user_runs_the_command_as_that_user,
)
from tests.api.test_files import (
    box,
    test_a_backend_without_files_is_refused_naming_it,
    test_an_agents_round_trip_code_in_run_with_env_and_cwd_artefact_out,
    test_bad_paths_are_refused_and_change_nothing,
    test_events_record_size_and_digest_never_the_bytes,
    test_list_stat_exists_mkdir_rename_remove,
    test_trees_up_and_down,
)

pytestmark = pytest.mark.docker

COLLECTED = (box, test_a_missing_cwd_is_not_found,
             test_bad_options_are_refused_before_anything_runs,
             test_env_cwd_and_stdin_reach_the_command_and_the_event_keeps_names_only,
             test_exec_stream_takes_the_same_options, test_stdin_as_text_and_as_a_file_object,
             test_user_on_a_backend_without_run_as_user_is_refused_naming_it,
             test_user_runs_the_command_as_that_user,
             test_a_backend_without_files_is_refused_naming_it,
             test_an_agents_round_trip_code_in_run_with_env_and_cwd_artefact_out,
             test_bad_paths_are_refused_and_change_nothing,
             test_events_record_size_and_digest_never_the_bytes,
             test_list_stat_exists_mkdir_rename_remove, test_trees_up_and_down)


@pytest.fixture
def remote_service(sbx_home: Path):
    from tests.service.live import LiveService

    live = LiveService(sbx_home).start()
    yield live
    live.stop()


@pytest_asyncio.fixture
async def client(remote_service, sbx_home: Path) -> AsyncIterator[sandboxer.AsyncSandboxer]:
    """A client of the live service (the suites' own `client` is in process)."""
    sbx = sandboxer.AsyncSandboxer(url=remote_service.url, token=remote_service.key())
    yield sbx
    await sbx.close()
    remove_test_containers(sbx_home)
