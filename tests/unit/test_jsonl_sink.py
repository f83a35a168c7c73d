"""The JSON Lines sink appends whole lines, private to the user, and rotates by size."""

import stat

from sandboxer.core.observe.delivery import JsonlSink


def test_rotates_past_max_bytes_keeping_n_backups(tmp_path):
    path = tmp_path / "events.jsonl"
    sink = JsonlSink(path, max_bytes=1000, backups=2)
    lines = [(f'{{"n":{i},"pad":"' + "x" * 200 + '"}').encode() for i in range(30)]
    for line in lines:
        assert sink.send([line]) == 1
    files = [path, path.with_name("events.jsonl.1"), path.with_name("events.jsonl.2")]
    assert all(f.exists() for f in files)
    assert not path.with_name("events.jsonl.3").exists()  # only `backups` are kept
    kept = b"".join(f.read_bytes() for f in reversed(files)).splitlines()
    assert kept == lines[-len(kept):]  # the newest lines, whole and in order
    assert all(f.stat().st_size <= 1000 + 250 for f in files)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_link_planted_in_its_place_is_refused_not_written_through(tmp_path):
    """Events name sandboxes, owners and tasks: a link at the sink's path must not send
    them into a file of whoever planted it."""
    import pytest

    from sandboxer.core.observe.delivery import SinkRefused

    victim = tmp_path / "victim"
    victim.write_bytes(b"")
    path = tmp_path / "events.jsonl"
    path.symlink_to(victim)
    with pytest.raises(SinkRefused, match="symbolic link"):
        JsonlSink(path).send([b'{"n":1}'])
    assert victim.read_bytes() == b""
