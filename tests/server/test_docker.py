"""docker/: the compose file parses, names files that exist, and publishes only dpsql."""

from __future__ import annotations

from pathlib import Path

import yaml

from dpsql.policy import load_policy

DOCKER = Path(__file__).resolve().parents[2] / "docker"


def test_compose_file_names_existing_paths() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "dpsql"}
    assert "ports" not in services["postgres"]  # analysts reach PostgreSQL only through dpsql
    build = services["dpsql"]["build"]
    assert (DOCKER / build["context"] / build["dockerfile"]).is_file()
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DOCKER / source).exists(), source
    command = services["dpsql"]["command"]
    assert command[command.index("--database") + 1].startswith("postgresql://")


def test_dockerfile_serves_and_policy_loads() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["dpsql", "serve"' in text and "USER dpsql" in text
    for line in text.splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (DOCKER.parent / source).exists(), source
    policy = load_policy(DOCKER / "policy.yaml")
    assert "census" in policy.tables
