"""The product speaks of the product: no trace of how it was developed in its files.

Every tracked text file (documentation, sources, tests, configuration, build files) is
searched for phrases that only a development process writes: issue numbers, work sessions
and waves, other agents and their jobs, the development machines' own tools outside the
repository, a design file that is not in the repository, throwaway scripts. The
patterns are narrow on purpose, so that product text (a browser session, the entry helper,
an ``issue`` of a log) cannot match them; each is shown with the text it must catch.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

WORKSPACE = Path(__file__).resolve().parents[1]
#: Pattern -> an example of what it catches (checked below, so the pattern stays alive).
PROCESS_WORDS = {
    r'\bissues? ?#?\d+': 'the targets of issue 20',
    r'\bissue-\d+': 'meets every issue-5 target',
    r'\(issue\b': 'in closed loop (issue 17)',
    r'\b(?:a later|an earlier|this|that|the next|the previous) issue\b':
        'the target of a later issue',
    r'\b(?:this|that|an? earlier|earlier|previous|a later|later|within the) session\b':
        'measured in an earlier session',
    r'\b(?:this|that|previous|next|earlier|later) wave\b': 'earlier in this wave',
    r"\bother agents\b|\bagents' jobs\b|\bdeployment agent\b": "while other agents' jobs ran",
    r'\.\./shared/tools\b': 'build it with ../shared/tools/ros2',
    r'\bfarm-(?:bench|studio)\b': 'timed with farm-bench',
    r'\bdevice tool\b': 'the device tool answers',
    r'(?-i:\bDESIGN\.md\b)': "DESIGN.md's reason",
    r'\bHELPER_BRIEF\b|\banother helper\b': 'another helper adds it',
    r'\bros2-launch-kit\b': 'source /tmp/ros2-launch-kit/bin/activate',
    r'\bthrow-?away (?:script|check|copy)\b': 'measured with a throwaway script',
    r'\bmachine is lent\b|\blent to this\b': 'no GPU was lent to this task',
}
#: Product text the patterns must leave alone.
PRODUCT_TEXT = [
    'a real headless Chromium session', 'the node entry helper', 'see docs/design.md',
    'issue a warning', 'a session cookie', 'shared autonomy', 'the shared memory segment',
    'uq_common is shared infrastructure', 'an issue of the camera driver',
]
TEXT_SUFFIXES = {'.py', '.md', '.msg', '.srv', '.xml', '.yaml', '.yml', '.txt', '.in', '.cfg',
                 '.toml', '.sh', '.rviz', '.sdf', '.json', '.html', '.js', '.css', ''}


def _tracked_text_files() -> list[Path]:
    names = subprocess.run(['git', 'ls-files', '-z'], cwd=WORKSPACE, capture_output=True,
                           check=True).stdout.decode().split('\0')
    files = []
    for name in filter(None, names):
        path = WORKSPACE / name
        if path.suffix in TEXT_SUFFIXES and path.is_file() and path != Path(__file__).resolve():
            files.append(path)
    return files


@pytest.mark.parametrize('pattern', PROCESS_WORDS)
def test_each_pattern_catches_its_example_and_no_product_text(pattern):
    compiled = re.compile(pattern, re.IGNORECASE)
    assert compiled.search(PROCESS_WORDS[pattern])
    assert not [text for text in PRODUCT_TEXT if compiled.search(text)]


def test_no_development_process_words_in_the_repository():
    if not (WORKSPACE / '.git').exists():
        pytest.skip('not a git checkout: the tracked files are unknown')
    patterns = [re.compile(p, re.IGNORECASE) for p in PROCESS_WORDS]
    found = []
    for path in _tracked_text_files():
        try:
            text = path.read_text(encoding='utf-8')
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for pattern in patterns:
                if match := pattern.search(line):
                    found.append(f'{path.relative_to(WORKSPACE)}:{number}: {match.group(0)!r} '
                                 f'in {line.strip()[:100]!r}')
    assert not found, 'development-process words:\n' + '\n'.join(found)


#: Folders beside the workspace are no part of the product: its code and documentation never
#: name them (build glue such as the Makefile may look for them).
BESIDE_THE_WORKSPACE = re.compile(r'\.\./shared\b')
PRODUCT_TREES = ('README.md', 'docs', 'src')


def test_the_product_names_no_folder_beside_the_workspace():
    if not (WORKSPACE / '.git').exists():
        pytest.skip('not a git checkout: the tracked files are unknown')
    assert BESIDE_THE_WORKSPACE.search('read from <workspace>/../shared/data')
    assert not BESIDE_THE_WORKSPACE.search('read from <workspace>/data (shared autonomy)')
    found = []
    for path in _tracked_text_files():
        if path.relative_to(WORKSPACE).parts[0] not in PRODUCT_TREES:
            continue
        text = path.read_text(encoding='utf-8', errors='replace')
        for number, line in enumerate(text.splitlines(), 1):
            if BESIDE_THE_WORKSPACE.search(line):
                found.append(f'{path.relative_to(WORKSPACE)}:{number}: {line.strip()[:100]!r}')
    assert not found, 'names a folder outside the workspace:\n' + '\n'.join(found)


#: Wording that is true only on the day it is written: the task a change was made for, and
#: "this" or "the previous" commit, which name another commit once later ones land. A
#: document names the commit by its hash or the run by its date instead. Pattern -> an
#: example it catches (checked below).
DATED_WORDING = {
    r'(?<![A-Za-z0-9])the[ _]issue(?![A-Za-z0-9])': 'the arguments the issue asks for',
    r"\bissue's\b": "against the issue's targets",
    r'\bthis commit\b': 'measured with this commit',
    r'\bprevious commit\b': 'alternately with the previous commit',
}
#: Product text the dated-wording patterns must leave alone.
UNDATED_TEXT = [
    "frames stamped after the label's commit", 'at commit 17823f4', 'the launch file of commit '
    'b14c1ba', 'issue a warning', 'an issue of the camera driver', 'reissue the request',
    'the commit of the transaction', 'tissue sample',
]
#: An absolute temporary path: a run's scratch folder, meaningless on any other machine.
TEMPORARY_PATH = re.compile(r'(?<![\w.~-])/(?:var/)?tmp/')
#: Where dated wording is looked for: the documents, the committed reports, the product code.
DATED_WORDING_TREES = ('README.md', 'docs', 'models', 'src', 'scripts', 'launch', 'config',
                       'docker')


def is_committed_report(relative: Path) -> bool:
    """A committed output of a run: JSON under models/ or docs/, markdown under models/ or
    docs/benchmarks/."""
    parts = relative.parts
    if relative.suffix == '.json':
        return parts[0] in ('models', 'docs')
    if relative.suffix == '.md':
        return parts[0] == 'models' or parts[:2] == ('docs', 'benchmarks')
    return False


def dated_wording(root: Path, relative_paths: list[Path]) -> list[str]:
    """``file:line: match`` for each dated phrase in the product trees and each absolute
    temporary path in a committed report, among ``relative_paths`` under ``root``."""
    patterns = [re.compile(p, re.IGNORECASE) for p in DATED_WORDING]
    found = []
    for relative in relative_paths:
        if relative.parts[0] not in DATED_WORDING_TREES:
            continue
        checks = patterns + ([TEMPORARY_PATH] if is_committed_report(relative) else [])
        text = (root / relative).read_text(encoding='utf-8', errors='replace')
        for number, line in enumerate(text.splitlines(), 1):
            for pattern in checks:
                if match := pattern.search(line):
                    found.append(f'{relative.as_posix()}:{number}: {match.group(0)!r} '
                                 f'in {line.strip()[:100]!r}')
                    break
    return found


@pytest.mark.parametrize('pattern', DATED_WORDING)
def test_each_dated_pattern_catches_its_example_and_no_product_text(pattern):
    compiled = re.compile(pattern, re.IGNORECASE)
    assert compiled.search(DATED_WORDING[pattern])
    assert not [text for text in UNDATED_TEXT if compiled.search(text)]


def test_the_dated_wording_check_finds_planted_examples(tmp_path):
    planted = {
        'README.md': 'Speed-up against the previous commit.\n',
        'docs/guide.md': 'Fine.\nThe NTK-GP meets the issue\'s target.\n',
        'src/pkg/pkg/report.py': '# Mark where this commit reaches the target.\n',
        'test/test_x.py': 'def test_the_arguments_of_the_issue(): ...\n',  # not a product tree
        'models/third/fit.json': '{"out": "/tmp/final/gp.npz", "data": "DATA/train.json"}\n',
        'docs/benchmarks/run.md': 'written to /var/tmp/run\n',
        'docs/howto.md': 'uq sim dataset --out /tmp/data   # a command, not a report\n',
        'models/clean.json': '{"out": "models/gp.npz", "note": "build/tmp/x"}\n',
    }
    for name, text in planted.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding='utf-8')
    found = dated_wording(tmp_path, [Path(name) for name in planted])
    assert [line.split(': ', 1)[0] for line in found] == [
        'README.md:1', 'docs/guide.md:2', 'src/pkg/pkg/report.py:1', 'models/third/fit.json:1',
        'docs/benchmarks/run.md:1'], found
    assert TEMPORARY_PATH.search('"file:///tmp/x"')
    assert not TEMPORARY_PATH.search('out/tmp/x, ~/tmp/x, ./tmp/x')


def test_no_dated_wording_or_temporary_paths_in_the_product():
    if not (WORKSPACE / '.git').exists():
        pytest.skip('not a git checkout: the tracked files are unknown')
    relative = [path.relative_to(WORKSPACE) for path in _tracked_text_files()]
    assert [p for p in relative if is_committed_report(p) and p.suffix == '.json'], \
        'no committed report found: the check would pass vacuously'
    found = dated_wording(WORKSPACE, relative)
    assert not found, ('dated wording or an absolute temporary path (name the commit by its '
                       'hash, the run by its date, a path relative to the repository):\n'
                       + '\n'.join(found))
