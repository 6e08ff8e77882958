"""The export folders the transformers tests share (helpers/hf_folders.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.hf_folders import write_folders


@pytest.fixture(scope="session")
def folders(tmp_path_factory) -> dict[str, Path]:
    """An export folder of each network, by name."""
    return write_folders(tmp_path_factory.mktemp("hf-folders"))
