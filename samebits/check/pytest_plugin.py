"""pytest -p samebits.check.pytest_plugin --samebits-url URL [--samebits-args "--model M ..."]

Adds one test item, `samebits-check[URL]`, that runs the whole check and fails on variance (or when the endpoint
could not be tested), so a CI job that already runs pytest gates on batch invariance with one more flag.
"""
from __future__ import annotations

import shlex

import pytest


def pytest_addoption(parser) -> None:
    group = parser.getgroup("samebits-check", "batch-invariance check of an OpenAI-compatible endpoint")
    group.addoption("--samebits-url", default=None, help="run `samebits check` against this endpoint as a test")
    group.addoption("--samebits-args", default="", help="further `samebits check` flags, as one quoted string")


class CheckFailed(Exception):
    pass


class CheckItem(pytest.Item):
    def __init__(self, *, url: str, args: str, **kw):
        super().__init__(**kw)
        self.url = url
        self.args = args

    def runtest(self) -> None:
        from samebits.check.__main__ import main

        code = main([self.url, *shlex.split(self.args), "--quiet"])
        if code == 1:
            raise CheckFailed(f"{self.url} is batch-variant (samebits check exit 1); the table above says where")
        if code != 0:
            raise CheckFailed(f"{self.url} could not be tested (samebits check exit {code}); see the error above")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CheckFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, self.name


def pytest_collection_modifyitems(session, config, items) -> None:
    url = config.getoption("samebits_url")
    if url:
        items.append(CheckItem.from_parent(session, name=f"samebits-check[{url}]", url=url,
                                           args=config.getoption("samebits_args")))
