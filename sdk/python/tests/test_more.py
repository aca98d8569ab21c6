"""The rest of the API against the real daemon: health, metrics, the
document, tokens, Git reads, sites, export's refusal, language servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import corral
from conftest import Daemon

DOC = Path(__file__).resolve().parents[3] / "docs" / "openapi.json"


def test_daemon_endpoints(client: corral.Corral) -> None:
    assert client.health()["status"] == "ok"
    assert "corral_commands_total" in client.metrics()
    assert client.openapi()["paths"].keys() == json.loads(DOC.read_text())["paths"].keys()
    me = client.whoami()
    tok = client.create_token(me["name"], "second")
    assert tok["name"] == "second" and tok["token"].startswith("corral_")


def test_a_token_made_over_http_works(daemon: Daemon, client: corral.Corral) -> None:
    tok = client.create_token(client.whoami()["name"], "third")["token"]
    with corral.Corral(daemon.url, tok) as c:
        assert c.whoami() == client.whoami()
    with pytest.raises(corral.Forbidden):
        client.create_account("not-an-admin")


def test_git_reads(project: corral.Project) -> None:
    assert project.git_status() == {"isRepo": False}
    project.run(["sh", "-c", "git init -q && echo a > f && git add f && "
                 "git -c user.email=a@b.c -c user.name=n commit -qm first && echo b > f"])
    assert project.git_status()["isRepo"]
    log = project.git_log(limit=5)
    assert [c["subject"] for c in log["commits"]] == ["first"]
    assert "+b" in project.git_diff()["patch"]
    assert project.git_show(ref="HEAD", path="f")["content"] == "a\n"
    with pytest.raises(corral.Invalid):
        project.git_show(ref="HEAD")


def test_sites_and_export(project: corral.Project) -> None:
    site = project.publish_site("sdkpy-web", 8080)
    assert (site["name"], site["port"]) == ("sdkpy-web", 8080)
    assert [s["name"] for s in project.sites()] == ["sdkpy-web"]
    with pytest.raises(corral.Unavailable):  # signed URLs need --sites-domain
        project.site_url("sdkpy-web")
    project.unpublish_site("sdkpy-web")
    assert project.sites() == []
    with pytest.raises(corral.Forbidden, match="export"):  # no --export-remote
        project.export("https://example.com/r.git", "main", "0" * 40)


def test_language_server_by_name(project: corral.Project) -> None:
    with pytest.raises(corral.NotFound, match="no language server"):
        project.lsp("no-such-server")
