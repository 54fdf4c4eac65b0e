"""Deployment files: the systemd unit (systemd-analyze verify and security),
its sysusers.d / tmpfiles.d pair applied to a scratch root, the Kubernetes
manifests (kinds, the wiring between them, the PrometheusRule equal to the
rules file, the ConfigMap accepted by the agent), the Alertmanager route
(amtool), and the Dockerfile (validated as text and against `ldd` of the
built agent; built only where a container engine answers)."""

import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT
from operations_support import RULES, agent_binary

PACKAGING = ROOT / "agent" / "packaging"
KUBE = ROOT / "deploy" / "kubernetes"
UNIT = PACKAGING / "gaugewatch-agent.service"
DOCKERFILE = PACKAGING / "Dockerfile"

KINDS = {
    "namespace.yaml": "Namespace",
    "configmap.yaml": "ConfigMap",
    "daemonset.yaml": "DaemonSet",
    "service.yaml": "Service",
    "servicemonitor.yaml": "ServiceMonitor",
    "podmonitor.yaml": "PodMonitor",
    "prometheus-rule.yaml": "PrometheusRule",
    "alertmanager-config.yaml": "AlertmanagerConfig",
    "kustomization.yaml": "Kustomization",
    "examples/trainer-job.yaml": "Job",
}


def manifest(name):
    return yaml.safe_load((KUBE / name).read_text())


def need(tool):
    if not shutil.which(tool):
        pytest.skip(f"{tool} not installed")


def unit_settings():
    settings = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    return settings


def unit_for_analysis(tmp_path):
    """The unit with ExecStart pointing at the built agent (verify checks it exists)."""
    text = UNIT.read_text().replace("/usr/local/bin/gaugewatch-agent", str(agent_binary()))
    path = tmp_path / UNIT.name
    path.write_text(text)
    return path


# --- systemd ------------------------------------------------------------------------------

def test_systemd_unit_verifies(tmp_path):
    need("systemd-analyze")
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit_for_analysis(tmp_path))],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert UNIT.name not in result.stderr, result.stderr


def test_systemd_unit_hardening_scores_ok(tmp_path):
    need("systemd-analyze")
    result = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager",
                             str(unit_for_analysis(tmp_path))], capture_output=True, text=True, timeout=60)
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)", result.stdout)
    assert match, result.stdout[-2000:] + result.stderr
    assert float(match.group(1)) <= 2.0, f"exposure {match.group(1)} {match.group(2)}"


def test_sysusers_and_tmpfiles_create_user_and_directories(tmp_path):
    need("systemd-sysusers")
    need("systemd-tmpfiles")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    for kind in ("sysusers", "tmpfiles"):
        target = root / "usr" / "lib" / f"{kind}.d"
        target.mkdir(parents=True)
        shutil.copy(PACKAGING / f"gaugewatch-agent.{kind}", target / "gaugewatch-agent.conf")
    subprocess.run(["systemd-sysusers", f"--root={root}"], check=True, capture_output=True, timeout=60)
    subprocess.run(["systemd-tmpfiles", "--create", f"--root={root}"], check=True, capture_output=True,
                   timeout=60)
    passwd = {line.split(":")[0]: line.split(":") for line in (root / "etc/passwd").read_text().splitlines()}
    assert "gaugewatch" in passwd and passwd["gaugewatch"][6] == "/usr/sbin/nologin"
    uid, gid = int(passwd["gaugewatch"][2]), int(passwd["gaugewatch"][3])
    for directory in ("run/gaugewatch", "var/lib/gaugewatch"):
        st = (root / directory).stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (uid, gid, 0o750), directory


def test_unit_user_and_directories_match_their_companions():
    settings = unit_settings()
    assert settings["User"] == ["gaugewatch"] and settings["Group"] == ["gaugewatch"]
    assert "u gaugewatch" in (PACKAGING / "gaugewatch-agent.sysusers").read_text()
    tmpfiles = (PACKAGING / "gaugewatch-agent.tmpfiles").read_text()
    assert f"/run/{settings['RuntimeDirectory'][0]} " in tmpfiles
    assert f"/var/lib/{settings['StateDirectory'][0]} " in tmpfiles
    example = yaml.safe_load((PACKAGING / "agent.example.yaml").read_text())
    assert example["grpc_socket"].startswith(f"/run/{settings['RuntimeDirectory'][0]}/")
    assert example["database"].startswith(f"/var/lib/{settings['StateDirectory'][0]}/")


# --- Kubernetes -----------------------------------------------------------------------------

@pytest.mark.parametrize("name,kind", KINDS.items())
def test_manifest_parses_to_its_kind(name, kind):
    docs = list(yaml.safe_load_all((KUBE / name).read_text()))
    assert [d["kind"] for d in docs] == [kind]
    if kind != "Kustomization":
        assert docs[0]["metadata"]["name"]


def test_kustomization_lists_the_manifests_once():
    resources = manifest("kustomization.yaml")["resources"]
    assert len(resources) == len(set(resources))
    assert set(resources) == set(KINDS) - {"kustomization.yaml", "podmonitor.yaml", "examples/trainer-job.yaml"}


def test_kustomize_builds():
    need("kubectl")
    result = subprocess.run(["kubectl", "kustomize", str(KUBE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    kinds = sorted(d["kind"] for d in yaml.load_all(result.stdout, Loader=yaml.BaseLoader))
    assert kinds == sorted(["Namespace", "ConfigMap", "DaemonSet", "Service", "ServiceMonitor",
                            "PrometheusRule", "AlertmanagerConfig"])


def test_prometheus_rule_spec_is_the_rules_file():
    assert manifest("prometheus-rule.yaml")["spec"] == yaml.safe_load(RULES.read_text())
    text = (KUBE / "prometheus-rule.yaml").read_text()
    spec = text.split("\nspec:\n", 1)[1]
    assert "".join(line[2:] if line.strip() else line for line in spec.splitlines(keepends=True)) \
        == RULES.read_text()
    result = subprocess.run([sys.executable, str(KUBE / "generate_prometheus_rule.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_daemonset_wiring():
    ds = manifest("daemonset.yaml")
    pod = ds["spec"]["template"]["spec"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    agent = next(c for c in pod["containers"] if c["name"] == "agent")
    config = yaml.safe_load(manifest("configmap.yaml")["data"]["agent.yaml"])
    socket_dir = str(pathlib.PurePosixPath(config["grpc_socket"]).parent)
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    socket_volume = next(n for n, p in mounts.items() if p == socket_dir)
    assert volumes[socket_volume]["hostPath"]["path"] == socket_dir
    assert mounts[next(n for n, v in volumes.items() if "configMap" in v)] == "/etc/gaugewatch"
    port = next(p for p in agent["ports"] if p["name"] == "metrics")
    assert config["http_listen"].endswith(f":{port['containerPort']}")
    assert agent["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert agent["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True

    service = manifest("service.yaml")
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    # The job label the rules and dashboards use ("gaugewatch-agent").
    assert 'up{job="gaugewatch-agent"}' in RULES.read_text()
    for name, endpoints, owner in (("servicemonitor.yaml", "endpoints", service["metadata"]["labels"]),
                                   ("podmonitor.yaml", "podMetricsEndpoints", labels)):
        monitor = manifest(name)["spec"]
        assert owner[monitor["jobLabel"]] == "gaugewatch-agent", name
        assert monitor["selector"]["matchLabels"].items() <= owner.items(), name
        assert monitor[endpoints][0]["port"] == "metrics", name


def test_trainer_job_reaches_the_agent_socket():
    ds_pod = manifest("daemonset.yaml")["spec"]["template"]["spec"]
    config = yaml.safe_load(manifest("configmap.yaml")["data"]["agent.yaml"])
    job_pod = manifest("examples/trainer-job.yaml")["spec"]["template"]["spec"]
    trainer = job_pod["containers"][0]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env["GAUGEWATCH_SOCKET"] == config["grpc_socket"]
    socket_dir = str(pathlib.PurePosixPath(config["grpc_socket"]).parent)
    assert any(v["hostPath"]["path"] == socket_dir for v in job_pod["volumes"] if "hostPath" in v)
    assert ds_pod["securityContext"]["runAsGroup"] in job_pod["securityContext"]["supplementalGroups"]
    assert config["socket_mode"] == "0660"


def test_configmap_config_passes_the_agents_check(tmp_path):
    config = tmp_path / "agent.yaml"
    config.write_text(manifest("configmap.yaml")["data"]["agent.yaml"])
    result = subprocess.run([str(agent_binary()), "--check-config", "--config", str(config)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr


def test_alertmanager_route_checks_and_matches_the_operator_form():
    plain = ROOT / "deploy" / "alertmanager" / "gaugewatch-route.yml"
    if shutil.which("amtool"):
        result = subprocess.run(["amtool", "check-config", str(plain)], capture_output=True, text=True,
                                timeout=30)
        assert result.returncode == 0, result.stdout + result.stderr
    route = yaml.safe_load(plain.read_text())["route"]["routes"][0]
    operator = manifest("alertmanager-config.yaml")["spec"]["route"]
    assert route["matchers"] == ['alertname =~ "Gaugewatch.*"']
    assert operator["matchers"] == [{"name": "alertname", "matchType": "=~", "value": "Gaugewatch.*"}]
    assert route["routes"][0]["matchers"] == ['severity = "critical"']
    assert operator["routes"][0]["matchers"][0]["value"] == "critical"
    severities = {a["labels"]["severity"] for g in yaml.safe_load(RULES.read_text())["groups"]
                  for a in g["rules"] if "alert" in a}
    assert "critical" in severities


# --- Dockerfile ---------------------------------------------------------------------------------

def dockerfile_stages():
    stages, current = [], None
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        if instruction == "FROM":
            current = {"from": rest, "lines": []}
            stages.append(current)
        else:
            current["lines"].append((instruction, rest))
    return stages


def apt_packages(stage):
    packages = []
    for instruction, rest in stage["lines"]:
        if instruction == "RUN" and "apt-get install" in rest:
            words = rest.split("apt-get install", 1)[1].split("&&")[0].split()
            packages += [w for w in words if not w.startswith("-")]
    return packages


def test_dockerfile_structure():
    build, runtime = dockerfile_stages()
    assert build["from"].startswith("debian:12") and runtime["from"].startswith("debian:12")
    instructions = dict(runtime["lines"])
    assert instructions["USER"] == "46000:46000"
    ds_pod = manifest("daemonset.yaml")["spec"]["template"]["spec"]
    assert ds_pod["securityContext"]["runAsUser"] == 46000
    port = next(p for p in ds_pod["containers"][0]["ports"] if p["name"] == "metrics")
    assert instructions["EXPOSE"] == str(port["containerPort"])
    assert instructions["ENTRYPOINT"] == '["/usr/local/bin/gaugewatch-agent"]'
    assert any("--target gaugewatch-agent gaugewatchctl" in r for i, r in build["lines"] if i == "RUN")
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    for package in apt_packages(build):
        assert re.search(rf"\b{re.escape(package)}\b", setup), f"{package} not in scripts/setup.sh"


def test_dockerfile_packages_exist_and_cover_the_agents_libraries():
    need("apt-cache")
    need("dpkg")
    build, runtime = dockerfile_stages()
    runtime_packages = set(apt_packages(runtime))
    named = apt_packages(build) + sorted(runtime_packages)
    shown = subprocess.run(["apt-cache", "show", "--no-all-versions", *named], capture_output=True, text=True)
    known = set(re.findall(r"^Package: (\S+)$", shown.stdout, re.M))
    if not known:
        pytest.skip("apt-cache has no package lists here (apt-get update)")
    assert set(named) <= known, f"not Debian 12 packages: {sorted(set(named) - known)}"
    essential = {"libc6", "libstdc++6", "libgcc-s1"}  # in debian:12-slim
    ldd = subprocess.run(["ldd", str(agent_binary())], capture_output=True, text=True, check=True).stdout
    libraries = {path: str(pathlib.Path(path).resolve()) for path in re.findall(r"=> (/\S+)", ldd)}
    # Debian 12 lists most libraries under /lib (merged /usr): ask for both spellings at once.
    spellings = {v for real in libraries.values()
                 for v in (real, real.replace("/usr/lib/", "/lib/", 1), real.replace("/lib/", "/usr/lib/", 1))}
    owners = {}
    found = subprocess.run(["dpkg", "-S", *sorted(spellings)], capture_output=True, text=True)
    for line in found.stdout.splitlines():
        package, _, path = line.partition(": ")
        owners[path.strip()] = package.split(":")[0]
    missing = []
    for path, real in libraries.items():
        owner = next((owners[v] for v in (real, real.replace("/usr/lib/", "/lib/", 1),
                                          real.replace("/lib/", "/usr/lib/", 1)) if v in owners), None)
        assert owner, f"no Debian package owns {path}"
        if owner not in runtime_packages | essential:
            missing.append(f"{owner} ({path})")
    assert not missing, "runtime stage lacks: " + ", ".join(missing)


def test_dockerfile_builds_where_a_container_engine_runs():
    engine = next((t for t in ("docker", "podman") if shutil.which(t) and subprocess.run(
        [t, "info"], capture_output=True, timeout=30).returncode == 0), None)
    if engine is None:
        pytest.skip("no container engine answers (docker/podman info): the Dockerfile is validated as text")
    result = subprocess.run([engine, "build", "-f", str(DOCKERFILE), "-t", "gaugewatch/agent:test", str(ROOT)],
                            capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
