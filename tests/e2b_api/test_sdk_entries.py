"""What the unmodified `e2b` SDK reads of a file through `sbx serve` (docs/e2b-api.md, "What
maps to what"): type, size, mode, permissions, modified time, and a symbolic link's target,
made absolute as envd makes it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from support import RUN_LABEL

pytestmark = pytest.mark.docker

LABEL_KEY, LABEL_VALUE = RUN_LABEL.split("=")


def test_entry_info_carries_type_size_mode_time_and_link_targets(e2b_env):
    from e2b import FileType, Sandbox

    box = Sandbox.create("default", timeout=120, metadata={LABEL_KEY: LABEL_VALUE})
    try:
        box.files.write("/tmp/l/a.txt", "four")
        box.commands.run("chmod 640 a.txt; ln -s a.txt link; ln -s link chain; "
                         "ln -s gone dangling; mkdir d; ln -s ../l/d dirlink", cwd="/tmp/l")
        info = box.files.get_info("/tmp/l/a.txt")
        assert (info.type, info.size, info.mode, info.permissions) == (
            FileType.FILE, 4, 0o640, "-rw-r-----")
        assert abs(info.modified_time - datetime.now(UTC)) < timedelta(minutes=5)
        link = box.files.get_info("/tmp/l/link")
        assert (link.type, link.symlink_target) == (FileType.SYMLINK, "/tmp/l/a.txt")
        listed = {e.name: e for e in box.files.list("/tmp/l")}
        assert listed["chain"].symlink_target == "/tmp/l/a.txt"  # followed to its end
        assert listed["dangling"].symlink_target == "/tmp/l/gone"
        assert listed["dirlink"].symlink_target == "/tmp/l/d"
        assert listed["d"].type == FileType.DIR and listed["d"].permissions.startswith("d")
        assert listed["a.txt"].size == 4 and listed["a.txt"].symlink_target is None
    finally:
        box.kill()
