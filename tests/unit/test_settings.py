"""The operator's settings (controller/settings.py), read from its environment."""
from __future__ import annotations

import pytest

from ddpjob.controller.settings import load_settings

pytestmark = pytest.mark.unit


def test_settings_come_from_the_environment():
    s = load_settings({"DDPJOB_OPERATOR_CREATE_WORKERS": "64", "DDPJOB_OPERATOR_COALESCE_SECONDS": "0.2"})
    assert (s.create_workers, s.coalesce_seconds) == (64, 0.2)
    with pytest.raises(ValueError, match="DDPJOB_OPERATOR_CREATE_WORKERS"):
        load_settings({"DDPJOB_OPERATOR_CREATE_WORKERS": "many"})
