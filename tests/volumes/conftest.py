"""Volumes' tests remove what they made: the `sbx` fixture removes the test's containers;
`volumes_cleanup` then removes, by name, the Docker volumes labelled with the test's own
installation id (and any helper container left labelled with one of them), and the
checkpoint images labelled with it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import install_id_of


def remove_test_volumes(home: Path) -> None:
    import docker

    install = install_id_of(home)
    if install is None:
        return
    api = docker.APIClient(version="auto")
    try:
        found = api.volumes(filters={"label": [f"sbx.install={install}"]}) or {}
        for volume in found.get("Volumes") or []:
            volume_id = (volume.get("Labels") or {}).get("sbx.volume")
            for helper in api.containers(all=True,
                                         filters={"label": [f"sbx.volume={volume_id}"]}):
                api.remove_container(helper["Id"], force=True)
            api.remove_volume(volume["Name"], force=True)
        for image in api.images(filters={"label": [f"sbx.install={install}"]}):  # checkpoints
            api.remove_image(image["Id"], force=True)
    finally:
        api.close()


@pytest.fixture
def volumes_cleanup(sbx) -> Iterator[None]:
    yield
    from support import remove_test_containers

    remove_test_containers(sbx.home)  # the sandboxes first: a volume in use stays
    remove_test_volumes(sbx.home)
