"""Shared test set-up: integration tests (marked `root`) need root, Open vSwitch and Mininet, and every
test session ends with a check that no fabric was left behind."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="integration test: needs root for namespaces and Open vSwitch (run: sudo make test)")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _leftover_baseline():
    """Record what was on the machine before any test, so leftover checks report only our own."""
    if os.geteuid() == 0:
        from tests.emulator_helpers import baseline

        baseline()
    yield
