"""`world info` on a mistyped namespace writes no key (Redis keys exist only once written)."""

from __future__ import annotations

import secrets
from pathlib import Path

from redis import Redis

from world_conformance.connect_errors import world_info


def test_cli_info_on_a_mistyped_namespace_writes_no_key(single_url: str, tmp_path: Path) -> None:
    namespace = f"typo_{secrets.token_hex(6)}"
    result = world_info(
        "redis", "--namespace", namespace, cwd=tmp_path, WORKFLOW_REDIS_URL=single_url
    )
    assert result.returncode == 0, result.stderr
    with Redis.from_url(single_url) as client:
        assert client.keys(f"world:{namespace}:*") == []
