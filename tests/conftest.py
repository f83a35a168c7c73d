"""The fixtures every test may use; they and the helpers tests import live in tests/support."""

from support import (  # noqa: F401 (fixtures pytest finds here)
    docker_api,
    sbx,
    sbx_home,
    tmux,
)
