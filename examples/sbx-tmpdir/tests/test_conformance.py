"""The Sandboxer conformance kit, run against this backend."""

import shutil

import pytest
from sbx_tmpdir import TmpdirAdapter

from sandboxer.adapters.base import CreateRequest
from sandboxer.adapters.testing import AdapterConformance


@pytest.fixture
def adapter(tmp_path, monkeypatch):
    monkeypatch.setenv("SBX_TMPDIR_ROOT", str(tmp_path / "sandboxes"))
    return TmpdirAdapter()


class TestTmpdirConformance(AdapterConformance):
    @pytest.fixture
    def create_request(self):  # a local process has the host's network: say so
        return lambda sandbox_id, labels: CreateRequest(sandbox_id, labels, network="full")

    @pytest.fixture
    def lose(self, tmp_path):  # the folder is removed behind sbx's back
        return lambda ref: shutil.rmtree(tmp_path / "sandboxes" / ref)
