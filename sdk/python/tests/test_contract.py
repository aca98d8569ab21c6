"""docs/openapi.json stays the contract: every operation and every error
kind it names is covered by the SDK, and both faces have the same surface.
No daemon needed."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any, Set

import pytest

import corral
from corral import _client, _errors, _operations, _sync

DOC = json.loads((Path(__file__).resolve().parents[3] / "docs" / "openapi.json").read_text())


def operation_ids() -> Set[str]:
    return {o["operationId"] for ops in DOC["paths"].values() for m, o in ops.items()
            if isinstance(o, dict) and "operationId" in o}


def error_kinds() -> Set[str]:
    """The kinds the document names: the enum of the error body's kind (which
    the daemon's tests hold to the API's types), or, in a document without
    one, every "kind K" in the descriptions of error answers."""
    kind = DOC["components"]["schemas"]["ErrorBody"]["properties"]["error"]["properties"]["kind"]
    if kind.get("enum"):
        return set(kind["enum"])
    kinds: Set[str] = set()

    def walk(o: Any) -> None:
        if isinstance(o, dict):
            for k, v in o.items():
                if k == "description" and isinstance(v, str):
                    kinds.update(re.findall(r"\(kinds? ([a-z][A-Za-z]+)", v))
                else:
                    walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    for ops in DOC["paths"].values():
        for o in ops.values():
            if isinstance(o, dict):
                for status, answer in o.get("responses", {}).items():
                    if status[0] in "45":
                        walk(answer)
    return kinds


def test_every_operation_is_covered() -> None:
    ops = operation_ids()
    assert len(ops) > 40
    missing = sorted(ops - set(corral.OPERATIONS))
    assert not missing, f"operations of docs/openapi.json the SDK does not cover: {missing}"
    stale = sorted(set(corral.OPERATIONS) - ops)
    assert not stale, f"operations the SDK names that docs/openapi.json lacks: {stale}"
    for op, target in corral.OPERATIONS.items():
        if target is None:
            assert _operations.NOT_COVERED[op]
            continue
        cls_name, method = target.split(".")
        async_cls = getattr(_client, cls_name)
        assert callable(getattr(async_cls, method, None)), f"{op}: {target} does not exist"
        sync_cls = _sync._TWINS[async_cls]
        assert callable(getattr(sync_cls, method, None)), f"{op}: {sync_cls.__name__}.{method} does not exist"


def test_every_error_kind_has_its_class() -> None:
    kinds = error_kinds()
    assert {"timeout", "overflow", "abort", "transport", "unavailable", "notFound", "forbidden", "busy"} <= kinds
    missing = sorted(kinds - set(corral.KINDS))
    assert not missing, f"error kinds of docs/openapi.json without an exception class: {missing}"
    for kind, cls in corral.KINDS.items():
        assert cls.kind == kind and issubclass(cls, corral.CorralError)


@pytest.mark.parametrize("kind", sorted(corral.KINDS))
def test_each_kind_is_raised_as_its_class_with_partial_output(kind: str) -> None:
    body = json.dumps({"error": {"kind": kind, "message": "m", "stdout": "out", "stderr": "err"}}).encode()
    e = _errors.from_answer(400, body, {})
    assert type(e) is corral.KINDS[kind] and (e.kind, e.message, e.status) == (kind, "m", 400)
    assert (e.stdout, e.stderr_bytes) == ("out", b"err")
    b64 = json.dumps({"error": {"kind": kind, "message": "m", "stdout": "/w==", "stderr": ""}}).encode()
    assert _errors.from_answer(504, b64, {}, base64_output=True).stdout_bytes == b"\xff"


def test_429_is_rate_limited_whatever_its_kind() -> None:
    for kind in ("busy", "prepare"):
        body = json.dumps({"error": {"kind": kind, "message": "budget", "stdout": "", "stderr": ""}}).encode()
        e = _errors.from_answer(429, body, {"retry-after": "3"})
        assert isinstance(e, corral.RateLimited) and e.kind == kind and e.retry_after == 3.0


def test_an_answer_without_the_error_body() -> None:
    e = _errors.from_answer(502, b"<html>bad gateway</html>", {})
    assert isinstance(e, corral.BadGateway) and "bad gateway" in e.message


def public_methods(cls: type) -> Set[str]:
    return {n for n, v in vars(cls).items() if not n.startswith("_") and callable(v)}


@pytest.mark.parametrize("async_cls", sorted(_sync._TWINS, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_the_synchronous_twin_has_every_method(async_cls: type) -> None:
    twin = _sync._TWINS[async_cls]
    assert twin.__name__ == async_cls.__name__[len("Async"):]
    for name in public_methods(async_cls):
        want = "close" if name == "aclose" else name
        assert callable(getattr(twin, want, None)), f"{twin.__name__} lacks {want}"
        fn = getattr(twin, want)
        wrapped = getattr(fn, "__wrapped__", None)
        if wrapped is not None:
            assert wrapped is vars(async_cls)[name], f"{twin.__name__}.{want} wraps another method"
    if hasattr(async_cls, "__anext__"):
        assert issubclass(twin, _sync._Iterator)


def test_every_class_is_exported() -> None:
    for async_cls, twin in _sync._TWINS.items():
        assert getattr(corral, async_cls.__name__) is async_cls
        assert getattr(corral, twin.__name__) is twin
    assert set(corral.__all__) <= set(dir(corral))


def test_configuration_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_URL", raising=False)
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    with pytest.raises(corral.Invalid, match="CORRAL_URL"):
        corral.Corral()
    monkeypatch.setenv("CORRAL_URL", "ftp://x")
    monkeypatch.setenv("CORRAL_TOKEN", "t")
    with pytest.raises(corral.Invalid, match="bad daemon URL"):
        corral.Corral()
    monkeypatch.setenv("CORRAL_URL", "unix:///nonexistent/corral.sock")
    with corral.Corral() as c:
        with pytest.raises(corral.Transport) as e:
            c.whoami()
        assert e.value.status is None and not isinstance(e.value, corral.DeadlineExceeded)
    with pytest.raises(corral.Invalid):
        corral.Corral("http://127.0.0.1:1", "t", deadline=0)


def test_versioned_with_corral() -> None:
    """One version: the package's, its pyproject's and the TypeScript SDK's."""
    root = Path(__file__).resolve().parents[3]
    pyproject = (root / "sdk" / "python" / "pyproject.toml").read_text()
    m = re.search(r'^version = "([^"]+)"', pyproject, re.M)
    assert m is not None and m.group(1) == corral.__version__
    ts = root / "sdk" / "typescript" / "package.json"
    if ts.exists():
        assert json.loads(ts.read_text())["version"] == corral.__version__
